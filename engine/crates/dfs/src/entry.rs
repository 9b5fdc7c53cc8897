//! Directory entries: [`Entry`] (the inode of whatever a name names), a
//! rename's intent [`Move`], and their versioned encoding in akey `"inode"`
//! (see "Layout" in the crate docs).

use crate::err;
use peregrine::{ObjectId, Result};

/// One directory entry (the inode of whatever it names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// File type and permission bits (`S_IFDIR | 0o755`, ...).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Times in nanoseconds since the Unix epoch.
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    /// The file's array object or the directory's object (symlinks get a
    /// unique id with no object, for inode numbers).
    pub oid: ObjectId,
    /// Chunk size of a file (copied from the container at creation).
    pub chunk_size: u64,
    /// Size last recorded by a client; NOT authoritative (see [`File::size`](crate::File::size)).
    pub size_hint: u64,
    /// Directories: object class id for new entries below (0 = container default).
    pub child_class: u8,
    /// Symlink target.
    pub target: Vec<u8>,
    /// Set while an old-protocol rename (of a client of before
    /// transactions, see `legacy.rs`) moves this entry away: that rename
    /// is done once the destination names the same object. Never written now.
    pub moving: Option<Box<Move>>,
    /// Where an old-protocol rename moved this entry from: that source
    /// entry may still hold the rename's intent, to be settled before this
    /// one goes away. Never written now.
    pub from: Option<(ObjectId, Vec<u8>)>,
    /// Character and block devices: the device number (`st_rdev`, as
    /// `makedev` encodes it); 0 for everything else.
    pub rdev: u64,
    /// Directories: the directory keeps a count of its subdirectories
    /// (see "Link counts" in the module docs). False for directories made
    /// before counts existed (entry versions 1 and 2): they report
    /// `st_nlink` 1, "not counted", as file systems without counts do.
    pub subdirs_counted: bool,
    /// A name of a file with several hard links: its attributes, xattrs
    /// and link count live in the file's inode record (see "Hard links" in
    /// the crate docs); this entry holds only the type and the object id.
    pub linked: bool,
}

/// An entry's xattrs: (akey with the "x:" prefix, value).
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// A rename's intent, kept in its source entry until the rename is done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub to_dir: ObjectId,
    pub to_name: Vec<u8>,
    /// When the rename started (ns); also the ctime it gives.
    pub since: i64,
    /// RENAME_EXCHANGE: the destination's entry and xattrs, which come here.
    pub exchange: Option<(Entry, Xattrs)>,
}

/// Version 1 entries end after the symlink target; version 2 adds the
/// rename fields; version 3 adds the device number and a flags byte (bit
/// 0: [`Entry::subdirs_counted`]). All three are read; version 3 is
/// written (a build that reads only versions 1 and 2 refuses version 3
/// entries as corrupt instead of misreading them).
const ENTRY_VERSION: u8 = 3;
const ENTRY_SUBDIRS_COUNTED: u8 = 1;
/// Flag bit 1: [`Entry::linked`] (a build that knows only bit 0 refuses
/// such entries as corrupt instead of taking them for the file itself).
const ENTRY_LINKED: u8 = 2;

impl Entry {
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
    pub fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }
    /// A FIFO, a socket, or a character or block device node: an entry
    /// with no object behind it (the kernel serves what opening it does).
    pub fn is_special(&self) -> bool {
        is_special_mode(self.mode)
    }

    /// Little-endian, versioned encoding stored in akey `"inode"`.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(80 + self.target.len());
        b.push(ENTRY_VERSION);
        b.extend_from_slice(&self.mode.to_le_bytes());
        b.extend_from_slice(&self.uid.to_le_bytes());
        b.extend_from_slice(&self.gid.to_le_bytes());
        b.extend_from_slice(&self.atime.to_le_bytes());
        b.extend_from_slice(&self.mtime.to_le_bytes());
        b.extend_from_slice(&self.ctime.to_le_bytes());
        put_oid(&mut b, self.oid);
        b.extend_from_slice(&self.chunk_size.to_le_bytes());
        b.extend_from_slice(&self.size_hint.to_le_bytes());
        b.push(self.child_class);
        put_bytes(&mut b, &self.target);
        match &self.moving {
            None => b.push(0),
            Some(m) => {
                b.push(1);
                put_oid(&mut b, m.to_dir);
                put_bytes(&mut b, &m.to_name);
                b.extend_from_slice(&m.since.to_le_bytes());
                match &m.exchange {
                    None => b.push(0),
                    Some((e, xs)) => {
                        b.push(1);
                        put_bytes(&mut b, &e.encode());
                        b.extend_from_slice(&(xs.len() as u32).to_le_bytes());
                        for (k, v) in xs {
                            put_bytes(&mut b, k);
                            put_bytes(&mut b, v);
                        }
                    }
                }
            }
        }
        match &self.from {
            None => b.push(0),
            Some((dir, name)) => {
                b.push(1);
                put_oid(&mut b, *dir);
                put_bytes(&mut b, name);
            }
        }
        b.extend_from_slice(&self.rdev.to_le_bytes());
        let mut flags = 0;
        if self.subdirs_counted {
            flags |= ENTRY_SUBDIRS_COUNTED;
        }
        if self.linked {
            flags |= ENTRY_LINKED;
        }
        b.push(flags);
        b
    }

    pub fn decode(b: &[u8]) -> Result<Entry> {
        let bad = || {
            err(
                libc::EIO,
                format!("corrupt directory entry ({} bytes)", b.len()),
            )
        };
        let version = *b.first().ok_or_else(bad)?;
        if !(1..=ENTRY_VERSION).contains(&version) {
            return Err(bad());
        }
        let mut r = Reader(&b[1..]);
        let mut fields = || -> Option<Entry> {
            let mut e = Entry {
                mode: r.u32()?,
                uid: r.u32()?,
                gid: r.u32()?,
                atime: r.u64()? as i64,
                mtime: r.u64()? as i64,
                ctime: r.u64()? as i64,
                oid: r.oid()?,
                chunk_size: r.u64()?,
                size_hint: r.u64()?,
                child_class: r.u8()?,
                target: r.bytes()?,
                moving: None,
                from: None,
                rdev: 0,
                subdirs_counted: false,
                linked: false,
            };
            if version >= 2 {
                (e.moving, e.from) = decode_rename_fields(&mut r)?;
            }
            if version >= 3 {
                e.rdev = r.u64()?;
                let flags = r.u8()?;
                if flags & !(ENTRY_SUBDIRS_COUNTED | ENTRY_LINKED) != 0 {
                    return None;
                }
                e.subdirs_counted = flags & ENTRY_SUBDIRS_COUNTED != 0;
                e.linked = flags & ENTRY_LINKED != 0;
            }
            r.0.is_empty().then_some(e)
        };
        fields().ok_or_else(bad)
    }
}

fn put_bytes(b: &mut Vec<u8>, v: &[u8]) {
    b.extend_from_slice(&(v.len() as u32).to_le_bytes());
    b.extend_from_slice(v);
}

fn put_oid(b: &mut Vec<u8>, o: ObjectId) {
    b.extend_from_slice(&o.hi.to_le_bytes());
    b.extend_from_slice(&o.lo.to_le_bytes());
}

type RenameFields = (Option<Box<Move>>, Option<(ObjectId, Vec<u8>)>);

/// Reads the fields of an encoded entry; None past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (h, t) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = t;
        Some(h)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.u32()? as usize;
        Some(self.take(n)?.to_vec())
    }
    fn oid(&mut self) -> Option<ObjectId> {
        Some(ObjectId {
            hi: self.u64()?,
            lo: self.u64()?,
        })
    }
}

/// The fields version 2 adds: the rename intent and origin.
fn decode_rename_fields(r: &mut Reader<'_>) -> Option<RenameFields> {
    let moving = match r.u8()? {
        0 => None,
        1 => {
            let to_dir = r.oid()?;
            let to_name = r.bytes()?;
            let since = r.u64()? as i64;
            let exchange = match r.u8()? {
                0 => None,
                1 => {
                    let e = Entry::decode(&r.bytes()?).ok()?;
                    let n = r.u32()? as usize;
                    let mut xs = Vec::with_capacity(n.min(1024));
                    for _ in 0..n {
                        xs.push((r.bytes()?, r.bytes()?));
                    }
                    Some((e, xs))
                }
                _ => return None,
            };
            Some(Box::new(Move {
                to_dir,
                to_name,
                since,
                exchange,
            }))
        }
        _ => return None,
    };
    let from = match r.u8()? {
        0 => None,
        1 => Some((r.oid()?, r.bytes()?)),
        _ => return None,
    };
    Some((moving, from))
}

pub(crate) fn is_special_mode(mode: u32) -> bool {
    matches!(
        mode & libc::S_IFMT,
        libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR | libc::S_IFBLK
    )
}
