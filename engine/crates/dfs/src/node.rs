//! What the API passes around: [`Node`] (a named entry as last read) and
//! the attribute types [`Stat`], [`SetAttr`] and [`StatFs`].

use crate::Entry;
use peregrine::ObjectId;

/// A named entry: where it lives (parent directory object + name) and what
/// it was when last read. Cheap to clone; the FUSE daemon keeps one per
/// inode and updates it on rename.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub parent: ObjectId,
    pub name: Vec<u8>,
    pub entry: Entry,
}

impl Node {
    pub fn oid(&self) -> ObjectId {
        self.entry.oid
    }
    pub fn is_dir(&self) -> bool {
        self.entry.is_dir()
    }
}

/// Attributes as `stat` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub blocks: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub oid: ObjectId,
    pub chunk_size: u64,
    /// Link count: 1 for a non-directory (0 is the caller's to report for
    /// a file removed while open), 2 + subdirectories for a directory
    /// whose subdirectories are counted, 1 for one made before counts.
    pub nlink: u32,
    /// Device number of a character or block device node.
    pub rdev: u64,
}

/// What [`Dfs::setattr`](crate::Dfs::setattr) changes; `None` leaves a field alone.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<i64>,
    pub mtime: Option<i64>,
}

impl SetAttr {
    /// Set the mode bits, owner and times asked for on `e` (the size is
    /// the caller's: it lives in the file's object); `now` becomes its ctime.
    pub fn apply_to(&self, e: &mut Entry, now: i64) {
        if let Some(m) = self.mode {
            e.mode = (e.mode & libc::S_IFMT) | (m & 0o7777);
        }
        if let Some(u) = self.uid {
            e.uid = u;
        }
        if let Some(g) = self.gid {
            e.gid = g;
        }
        if let Some(t) = self.atime {
            e.atime = t;
        }
        if let Some(t) = self.mtime {
            e.mtime = t;
        }
        e.ctime = now;
    }
}

/// File system figures for `statfs`.
#[derive(Clone, Debug)]
pub struct StatFs {
    pub bsize: u32,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub namelen: u32,
}
