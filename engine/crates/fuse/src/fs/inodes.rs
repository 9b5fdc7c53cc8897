//! The inode table: an inode number for an object, the node behind a
//! number, and inodes that are open here although their name is gone.

use super::{ino_of, stale, Ino, PeregrineFs};
use fuser::INodeNo;
use peregrine::{Error, ObjectId};
use peregrine_dfs::{now_ns, Entry, File, Node, SetAttr, Stat};

impl PeregrineFs {
    pub(super) fn ino(&self, oid: ObjectId) -> u64 {
        ino_of(oid, self.dfs.root().oid())
    }

    pub(super) fn node(&self, ino: INodeNo) -> Result<Node, Error> {
        self.inodes
            .lock()
            .get(&ino.0)
            .map(|i| i.node.clone())
            .ok_or_else(stale)
    }

    /// Remember `node` (one more kernel lookup reference).
    pub(super) fn remember(&self, node: &Node) -> u64 {
        let ino = self.ino(node.oid());
        let mut t = self.inodes.lock();
        let e = t.entry(ino).or_insert_with(|| Ino {
            node: node.clone(),
            lookups: 0,
            open: 0,
            unlinked: None,
            cache_stamp: None,
            no_caps_since: None,
        });
        e.node = node.clone();
        e.lookups += 1;
        ino
    }

    pub(super) fn update(&self, node: &Node) {
        let ino = self.ino(node.oid());
        if let Some(e) = self.inodes.lock().get_mut(&ino) {
            e.node = node.clone();
        }
    }

    /// A removed entry: punch now, or at the last close if open here.
    pub(super) fn removed(&self, e: Entry) -> Result<(), Error> {
        let ino = self.ino(e.oid);
        {
            let mut t = self.inodes.lock();
            if let Some(i) = t.get_mut(&ino) {
                if i.open > 0 {
                    i.unlinked = Some(e);
                    return Ok(());
                }
            }
        }
        self.dfs.release_object(&e)
    }

    /// The entry of an inode that is open here although its name is gone
    /// (removed here, or by another client): what it was when removed.
    pub(super) fn orphan(&self, ino: u64) -> Option<Entry> {
        let t = self.inodes.lock();
        let i = t.get(&ino)?;
        if i.open == 0 {
            return None;
        }
        Some(i.unlinked.clone().unwrap_or_else(|| i.node.entry.clone()))
    }

    /// Attributes of a file removed while open: no name links to it any
    /// more, so `st_nlink` is 0 (as Linux file systems report through fstat).
    pub(super) fn orphan_stat(&self, e: &Entry) -> Result<Stat, Error> {
        let size = if e.is_file() {
            File::new(self.dfs.container(), e.oid, e.chunk_size, true)?.size()?
        } else {
            0
        };
        let mut st = self.dfs.stat_of(e, size);
        st.nlink = 0;
        Ok(st)
    }

    /// setattr of an orphan: the size on its object, the rest on the
    /// remembered entry (there is no stored one any more).
    pub(super) fn orphan_setattr(&self, ino: u64, a: &SetAttr) -> Result<Stat, Error> {
        if self.opts.read_only {
            return Err(Error::new(-libc::EROFS, "file system mounted read-only"));
        }
        let mut e = self.orphan(ino).ok_or_else(stale)?;
        let now = now_ns();
        if let Some(size) = a.size {
            if !e.is_file() {
                return Err(Error::inval("truncate of a non-regular file"));
            }
            File::new(self.dfs.container(), e.oid, e.chunk_size, false)?.truncate(size)?;
            e.mtime = now;
        }
        a.apply_to(&mut e, now);
        if let Some(i) = self.inodes.lock().get_mut(&ino) {
            if i.unlinked.is_some() {
                i.unlinked = Some(e.clone());
            } else {
                i.node.entry = e.clone();
            }
        }
        self.orphan_stat(&e)
    }
}
