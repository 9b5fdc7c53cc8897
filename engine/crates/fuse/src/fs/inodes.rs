//! The inode table: an inode number for an object, the node behind a
//! number, inodes that are open here although their name is gone, and
//! the names this mount created.

use super::{ino_of, stale, Ino, PeregrineFs};
use fuser::INodeNo;
use peregrine::{Error, ObjectId};
use peregrine_dfs::{now_ns, Entry, File, Node, SetAttr, Stat};
use std::collections::HashMap;

/// (directory, name) -> (inode, epoch of the entry's version this mount's
/// create wrote), while the mount knows of no rewrite of that entry: an
/// unlink of the name then removes it without reading it first
/// ([`peregrine_dfs::Dfs::unlink_written_at`]). The store checks the
/// version as it removes, so an entry changed by another client, or by a
/// path missed here, only costs the read after all. Bounded: when full
/// it starts over.
pub(super) type Created = HashMap<(ObjectId, Vec<u8>), (u64, u64)>;
const CREATED_MAX: usize = 1 << 16;

impl PeregrineFs {
    pub(super) fn note_created(&self, n: &Node, epoch: u64) {
        let ino = self.ino(n.oid());
        let mut m = self.created.lock();
        if m.len() >= CREATED_MAX {
            m.clear();
        }
        m.insert((n.parent, n.name.clone()), (ino, epoch));
    }

    /// The node this mount created as `name` in `parent`, with its entry's
    /// epoch, if still known (and forgotten: the name is being removed).
    pub(super) fn take_created(&self, parent: &Node, name: &[u8]) -> Option<(Node, u64)> {
        let key = (parent.oid(), name.to_vec());
        let (ino, epoch) = self.created.lock().remove(&key)?;
        let n = self.inodes.lock().get(&ino).map(|i| i.node.clone())?;
        (n.parent == key.0 && n.name == key.1).then_some((n, epoch))
    }

    /// The entry of `n` is being rewritten (or its name moved).
    pub(super) fn rewritten(&self, n: &Node) {
        self.created.lock().remove(&(n.parent, n.name.clone()));
    }

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
