//! Hard links (see "Hard links" in the crate docs): a file with several
//! names keeps its attributes, xattrs and link count in an inode record of
//! the container's inode table; each name holds a linked entry.

use crate::dfs::{check_name, retry_changed};
use crate::{err, now_ns, show, Dfs, Entry, Node, INODE};
use peregrine::{Expect, ObjectId, Result, Transaction};

/// Akey of an inode record's link count (u64 LE), beside its `"inode"`
/// entry and `"x:"` xattrs.
pub(crate) const NLINK: &[u8] = b"nlink";

/// The inode record's dkey of file object `oid`.
pub(crate) fn record_key(oid: ObjectId) -> Vec<u8> {
    let mut k = Vec::with_capacity(17);
    k.push(b'i');
    k.extend_from_slice(&oid.hi.to_le_bytes());
    k.extend_from_slice(&oid.lo.to_le_bytes());
    k
}

/// What a name of a linked file holds: its type (for listings) and object.
fn link_entry(record: &Entry) -> Entry {
    Entry {
        linked: true,
        target: Vec::new(),
        moving: None,
        from: None,
        ..record.clone()
    }
}

fn decode_count(v: &[u8]) -> Result<u64> {
    <[u8; 8]>::try_from(v)
        .map(u64::from_le_bytes)
        .map_err(|_| err(libc::EIO, format!("corrupt link count ({} bytes)", v.len())))
}

impl Dfs {
    /// The container's inode table: the object of the superblock's class
    /// with id (0, 2) (the superblock is (0, 0), the root (0, 1)).
    pub(crate) fn inode_table(&self) -> ObjectId {
        ObjectId {
            hi: self.inner.sb.hi,
            lo: 2,
        }
    }

    /// Whether `n` is a hard-linked file's inode record.
    pub(crate) fn is_record(&self, n: &Node) -> bool {
        n.parent == self.inode_table()
    }

    /// The node entry `e` at (parent, name) stands for: itself, or for a
    /// linked entry the file's inode record.
    pub(crate) fn resolve(&self, parent: ObjectId, name: &[u8], e: Entry) -> Result<Node> {
        if !e.linked {
            return Ok(Node {
                parent,
                name: name.to_vec(),
                entry: e,
            });
        }
        let (entry, _) = self
            .record(e.oid)
            .map_err(|x| x.context(format!("{:?}", show(name))))?;
        Ok(Node {
            parent: self.inode_table(),
            name: record_key(e.oid),
            entry,
        })
    }

    /// What (parent, name) names now, as [`Dfs::resolve`] does, with the
    /// epoch of the version of the entry read (a linked file's: its
    /// record's): what [`Dfs::replace_entry`] expects.
    pub(crate) fn node_versioned(
        &self,
        parent: ObjectId,
        name: &[u8],
    ) -> Result<Option<(Node, u64)>> {
        match self.fetch_versioned(parent, name)? {
            None => Ok(None),
            Some((e, epoch)) if !e.linked => Ok(Some((
                Node {
                    parent,
                    name: name.to_vec(),
                    entry: e,
                },
                epoch,
            ))),
            Some((e, _)) => {
                let (entry, epoch) = self.record(e.oid)?;
                Ok(Some((
                    Node {
                        parent: self.inode_table(),
                        name: record_key(e.oid),
                        entry,
                    },
                    epoch,
                )))
            }
        }
    }

    /// Write `n`'s entry back where it was read, only if nobody changed it
    /// since `epoch` (`EBUSY` otherwise): a read-modify-write must not bring
    /// back a name renamed or removed meanwhile, nor undo a hard link.
    pub(crate) fn replace_entry(&self, n: &Node, epoch: u64) -> Result<()> {
        let o = self.obj(n.parent)?;
        let mut tx = self.container().transaction();
        tx.update_single(&o, &n.name, INODE, &n.entry.encode())
            .expect(&o, &n.name, INODE, Expect::UnchangedSince(epoch));
        tx.commit()
    }

    /// The inode record of hard-linked file `oid` and the epoch of its version.
    fn record(&self, oid: ObjectId) -> Result<(Entry, u64)> {
        self.fetch_raw_versioned(self.inode_table(), &record_key(oid))?
            .ok_or_else(|| {
                err(
                    libc::EIO,
                    format!("hard link of object {oid}, whose inode record is missing"),
                )
            })
    }

    /// The link count of a hard-linked file's record and the epoch of its version.
    fn link_count(&self, oid: ObjectId) -> Result<(u64, u64)> {
        let (table, key) = (self.inode_table(), record_key(oid));
        match self.obj(table)?.fetch_single_versioned(&key, NLINK)? {
            Some((v, epoch)) => Ok((decode_count(&v)?, epoch)),
            None => Err(err(
                libc::EIO,
                format!("inode record of object {oid}: no link count"),
            )),
        }
    }

    /// `st_nlink` of a hard-linked file's record.
    pub(crate) fn nlink_of_record(&self, n: &Node) -> Result<u32> {
        Ok(self.link_count(n.oid())?.0.min(u32::MAX as u64) as u32)
    }

    /// link(2): a new name (newparent, newname) for the file `node`. The
    /// first extra name turns the file's entry into a linked one and moves
    /// its attributes and xattrs to a new inode record (count 2); later ones
    /// count up. One transaction either way, expecting what it read.
    pub fn link(&self, node: &Node, newparent: &Node, newname: &[u8]) -> Result<Node> {
        Self::need_dir(newparent)?;
        check_name(newname)?;
        self.check_rw()?;
        if node.entry.is_dir() {
            return Err(err(
                libc::EPERM,
                format!("{:?} is a directory: no hard links", show(&node.name)),
            ));
        }
        let g = self.lock(&[(node.parent, &node.name), (newparent.oid(), newname)]);
        let n = retry_changed(|| self.link_once(node, newparent.oid(), newname))?;
        // touch_dir takes the lock of the directory's own entry, which may
        // share a stripe with the ones held: never while holding them (a
        // daemon hung in `git clone --local` that way, one link in a few
        // hundred).
        drop(g);
        self.touch_dir(newparent);
        Ok(n)
    }

    fn link_once(&self, node: &Node, dir: ObjectId, newname: &[u8]) -> Result<Node> {
        let (table, key) = (self.inode_table(), record_key(node.oid()));
        let (t, d) = (self.obj(table)?, self.obj(dir)?);
        let mut tx = self.container().transaction();
        tx.expect(&d, newname, INODE, Expect::Absent);
        let now = now_ns();
        let (name_entry, epoch) =
            self.fetch_versioned(node.parent, &node.name)?
                .ok_or_else(|| {
                    err(
                        libc::ENOENT,
                        format!("{:?}: entry removed", show(&node.name)),
                    )
                })?;
        if name_entry.oid != node.oid() {
            return Err(err(
                libc::ENOENT,
                format!(
                    "{:?}: entry removed (its name now names another)",
                    show(&node.name)
                ),
            ));
        }
        let mut record = if self.is_record(node) || name_entry.linked {
            // Already linked: one more name.
            let (record, record_epoch) = self.record(node.oid())?;
            tx.expect(&t, &key, INODE, Expect::UnchangedSince(record_epoch));
            let (count, count_epoch) = self.link_count(node.oid())?;
            tx.expect(&t, &key, NLINK, Expect::UnchangedSince(count_epoch));
            tx.update_single(&t, &key, NLINK, &(count + 1).to_le_bytes());
            record
        } else {
            // Its second name: the record takes over the entry and its xattrs.
            let o = self.obj(node.parent)?;
            let xs = self.xattrs(node.parent, &node.name)?;
            tx.expect(&o, &node.name, INODE, Expect::UnchangedSince(epoch));
            tx.update_single(&o, &node.name, INODE, &link_entry(&name_entry).encode());
            let keys: Vec<&[u8]> = xs.iter().map(|(k, _)| k.as_slice()).collect();
            tx.punch_akeys(&o, &node.name, &keys);
            tx.expect(&t, &key, INODE, Expect::Absent);
            for (k, v) in &xs {
                tx.update_single(&t, &key, k, v);
            }
            tx.update_single(&t, &key, NLINK, &2u64.to_le_bytes());
            name_entry
        };
        record.ctime = now;
        tx.update_single(&t, &key, INODE, &record.encode());
        tx.update_single(&d, newname, INODE, &link_entry(&record).encode());
        tx.commit().map_err(|e| match e.code {
            c if c == -libc::EEXIST => err(libc::EEXIST, format!("{:?} exists", show(newname))),
            _ => e,
        })?;
        Ok(Node {
            parent: table,
            name: key,
            entry: record,
        })
    }

    /// Add to `tx` the removal of one name of linked file `oid`: the count
    /// down by one, or at its last name the record punched too. Returns the
    /// record's entry if that was the last name (its object is then the
    /// caller's to release).
    pub(crate) fn unlink_record_in(
        &self,
        tx: &mut Transaction,
        oid: ObjectId,
    ) -> Result<Option<Entry>> {
        let (table, key) = (self.inode_table(), record_key(oid));
        let t = self.obj(table)?;
        let (record, record_epoch) = self.record(oid)?;
        let (count, count_epoch) = self.link_count(oid)?;
        tx.expect(&t, &key, NLINK, Expect::UnchangedSince(count_epoch));
        if count <= 1 {
            tx.punch_dkey(&t, &key);
            return Ok(Some(record));
        }
        let mut record = record;
        record.ctime = now_ns();
        tx.expect(&t, &key, INODE, Expect::UnchangedSince(record_epoch));
        tx.update_single(&t, &key, INODE, &record.encode());
        tx.update_single(&t, &key, NLINK, &(count - 1).to_le_bytes());
        Ok(None)
    }
}
