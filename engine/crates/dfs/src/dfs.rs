//! The [`Dfs`] core: the mounted namespace's state, entry reads and
//! writes, lookup, create, mkdir, mknod, symlink, unlink, rmdir, setattr,
//! statfs, fsync and open.

use crate::dirstat::DirStats;
use crate::entry::is_special_mode;
use crate::links::CountBatch;
use crate::times::Touch;
use crate::{
    err, now_ns, show, Entry, File, Node, SetAttr, Stat, StatFs, COUNT_DKEY, INODE, LOCKS, NAME_MAX,
};
use peregrine::sync::{Mutex, MutexGuard};
use peregrine::{
    Container, DiscardQueue, Error, Expect, Object, ObjectClass, ObjectId, Result, Transaction,
};
use peregrine_proto::mgmt::{ContQueryReq, PoolQueryReq};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) struct Inner {
    pub(crate) cont: Container,
    pub(crate) sb: ObjectId,
    pub(crate) root: Node,
    pub(crate) read_only: bool,
    pub(crate) file_class: ObjectClass,
    pub(crate) dir_class: ObjectClass,
    pub(crate) chunk_size: u64,
    pub(crate) oid_hi: u64,
    pub(crate) next_lo: AtomicU64,
    pub(crate) locks: Vec<Mutex<()>>,
    /// Directory attributes read or changed here (`dirstat.rs`).
    pub(crate) dir_stats: DirStats,
    /// Directory time updates in progress, by directory ([`Dfs::touch_dir`]).
    pub(crate) touches: Mutex<HashMap<ObjectId, Arc<Touch>>>,
    /// Subdirectory count changes in progress, by directory ([`Dfs::adjust_subdirs`]).
    pub(crate) counts: Mutex<HashMap<ObjectId, Arc<CountBatch>>>,
    /// [`RENAME_LEASE_NS`](crate::legacy::RENAME_LEASE_NS); tests shorten it.
    pub(crate) rename_lease_ns: std::sync::atomic::AtomicI64,
    /// Removed objects waiting for their punches ([`Dfs::release_object`]);
    /// dropping the last `Dfs` sends them and waits.
    pub(crate) discards: DiscardQueue,
}

/// A mounted POSIX namespace in one container. Cheap to clone.
#[derive(Clone)]
pub struct Dfs {
    pub(crate) inner: Arc<Inner>,
}

impl std::fmt::Debug for Dfs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dfs")
            .field("cont", &self.inner.cont.uuid())
            .field("read_only", &self.inner.read_only)
            .finish()
    }
}

/// How long a change of entries keeps re-reading and retrying while other
/// clients change them (each try loses only to a change that committed).
const CHANGED_RETRY: Duration = Duration::from_secs(10);

/// An entry as read, with the epoch of its version (what a transaction
/// changing it expects to be unchanged).
pub(crate) type Versioned = (Entry, u64);

/// Run `f` (reads, checks and one transaction that expects what it read)
/// again while it fails with `EBUSY`: another client changed, or is
/// changing, what it read; nothing was applied.
pub(crate) fn retry_changed<T>(mut f: impl FnMut() -> Result<T>) -> Result<T> {
    let deadline = Instant::now() + CHANGED_RETRY;
    let mut pause = Duration::from_micros(500);
    loop {
        match f() {
            Err(e) if e.code == -libc::EBUSY && Instant::now() < deadline => {
                std::thread::sleep(pause.mul_f64(0.5 + unit_random()));
                pause = (pause * 2).min(Duration::from_millis(100));
            }
            r => return r,
        }
    }
}

/// A number in [0, 1) that differs between threads and calls: spreads the
/// retries of clients that collided.
fn unit_random() -> f64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_i64(now_ns());
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

pub(crate) fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(err(
            libc::ENAMETOOLONG,
            format!("name of {} bytes exceeds {NAME_MAX}", name.len()),
        ));
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) || name == b"." || name == b".."
    {
        return Err(Error::inval(format!("invalid entry name {:?}", show(name))));
    }
    Ok(())
}

impl Dfs {
    pub fn container(&self) -> &Container {
        &self.inner.cont
    }
    pub fn read_only(&self) -> bool {
        self.inner.read_only
    }
    pub fn chunk_size(&self) -> u64 {
        self.inner.chunk_size
    }
    pub fn superblock(&self) -> ObjectId {
        self.inner.sb
    }
    /// The root as read at mount.
    pub fn root(&self) -> Node {
        self.inner.root.clone()
    }

    pub(crate) fn obj(&self, oid: ObjectId) -> Result<Object> {
        self.inner.cont.object(oid)
    }

    pub(crate) fn check_rw(&self) -> Result<()> {
        if self.inner.read_only {
            return Err(err(libc::EROFS, "file system mounted read-only"));
        }
        Ok(())
    }

    fn alloc_oid(&self, class: ObjectClass) -> ObjectId {
        let lo = self.inner.next_lo.fetch_add(1, Ordering::Relaxed);
        ObjectId::new(class, self.inner.oid_hi, lo)
    }

    fn lock_idx(parent: ObjectId, name: &[u8]) -> usize {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ parent.hi ^ parent.lo.rotate_left(17);
        for &b in name {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        (h % LOCKS as u64) as usize
    }

    /// Lock (parent, name) pairs in index order (deadlock-free).
    pub(crate) fn lock(&self, keys: &[(ObjectId, &[u8])]) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = keys.iter().map(|(p, n)| Self::lock_idx(*p, n)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter()
            .map(|i| self.inner.locks[i].lock())
            .collect()
    }

    /// The entry at (parent, name), with any rename it is the source of
    /// settled ([`Dfs::settle`]).
    pub(crate) fn fetch_entry(&self, parent: ObjectId, name: &[u8]) -> Result<Option<Entry>> {
        match self.fetch_raw(parent, name)? {
            Some(e) if e.moving.is_some() => self.settle(parent, name, e),
            e => Ok(e),
        }
    }

    /// The entry at (parent, name) as stored.
    pub(crate) fn fetch_raw(&self, parent: ObjectId, name: &[u8]) -> Result<Option<Entry>> {
        Ok(self.fetch_raw_versioned(parent, name)?.map(|(e, _)| e))
    }

    /// The entry at (parent, name) as stored, and the epoch of its version.
    pub(crate) fn fetch_raw_versioned(
        &self,
        parent: ObjectId,
        name: &[u8],
    ) -> Result<Option<(Entry, u64)>> {
        match self.obj(parent)?.fetch_single_versioned(name, INODE)? {
            Some((v, epoch)) => Entry::decode(&v)
                .map(|e| Some((e, epoch)))
                .map_err(|e| e.context(format!("entry {:?} of directory {parent}", show(name)))),
            None => Ok(None),
        }
    }

    /// The entry at (parent, name) and the epoch of its version; an
    /// old-protocol rename's intent is settled first (`EBUSY` while that
    /// rename is still in flight).
    pub(crate) fn fetch_versioned(
        &self,
        parent: ObjectId,
        name: &[u8],
    ) -> Result<Option<Versioned>> {
        match self.fetch_raw_versioned(parent, name)? {
            Some((e, _)) if e.moving.is_some() => match self.settle(parent, name, e)? {
                Some(e) if e.moving.is_some() => Err(err(
                    libc::EBUSY,
                    format!(
                        "{:?} is being renamed by a client of an older version",
                        show(name)
                    ),
                )),
                _ => self.fetch_raw_versioned(parent, name),
            },
            r => Ok(r),
        }
    }

    /// A transaction that removes the entry at (parent, name) only if it
    /// is still the version read at `epoch` (`EBUSY` otherwise: another
    /// client renamed or replaced it meanwhile, and removing what is there
    /// now could punch an object that another name holds). The caller may
    /// add to it before committing.
    pub(crate) fn removal(&self, parent: ObjectId, name: &[u8], epoch: u64) -> Result<Transaction> {
        let o = self.obj(parent)?;
        let mut tx = self.container().transaction();
        tx.punch_dkey(&o, name)
            .expect(&o, name, INODE, Expect::UnchangedSince(epoch));
        Ok(tx)
    }

    /// Write a new entry only if the name is free (conditional insert,
    /// atomic across clients); `EEXIST` otherwise. Returns the epoch of
    /// the entry's version.
    pub(crate) fn insert_entry(&self, parent: ObjectId, name: &[u8], e: &Entry) -> Result<u64> {
        self.obj(parent)?
            .insert_single(name, INODE, &e.encode())
            .map_err(|x| {
                if x.code == -libc::EEXIST {
                    err(libc::EEXIST, format!("{:?} exists", show(name)))
                } else {
                    x
                }
            })
    }

    fn class_for(&self, parent: &Node, dir: bool) -> ObjectClass {
        match ObjectClass::from_id(parent.entry.child_class) {
            Some(c) => c,
            None if dir => self.inner.dir_class,
            None => self.inner.file_class,
        }
    }

    pub(crate) fn need_dir(node: &Node) -> Result<()> {
        if !node.is_dir() {
            return Err(err(
                libc::ENOTDIR,
                format!("{:?} is not a directory", show(&node.name)),
            ));
        }
        Ok(())
    }

    /// Look `name` up in directory `parent`.
    pub fn lookup(&self, parent: &Node, name: &[u8]) -> Result<Node> {
        Self::need_dir(parent)?;
        check_name(name)?;
        match self.fetch_entry(parent.oid(), name)? {
            Some(entry) => self.resolve(parent.oid(), name, entry),
            None => Err(err(
                libc::ENOENT,
                format!("{:?}: no such entry", show(name)),
            )),
        }
    }

    /// Walk an absolute or root-relative path ("/a/b", "a/b").
    pub fn lookup_path(&self, path: &str) -> Result<Node> {
        let mut n = self.root();
        for c in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            n = self.lookup(&n, c.as_bytes())?;
        }
        Ok(n)
    }

    /// The entry as the store holds it now (ENOENT if removed).
    pub fn refresh(&self, node: &Node) -> Result<Node> {
        match self.fetch_entry(node.parent, &node.name)? {
            Some(entry) => self.resolve(node.parent, &node.name, entry),
            None => Err(err(
                libc::ENOENT,
                format!("{:?}: entry removed", show(&node.name)),
            )),
        }
    }

    /// Attributes of `node`, re-read from the store (size from the file's
    /// chunks for regular files).
    pub fn getattr(&self, node: &Node) -> Result<(Node, Stat)> {
        let n = self.refresh(node)?;
        let st = self.stat_node(&n)?;
        Ok((n, st))
    }

    /// Attributes of a node as it was read (no second read of its entry):
    /// a file's size from its chunks, a directory's link count from its
    /// subdirectory count (one fetch from the directory's object, whatever
    /// the directory's size).
    pub fn stat_node(&self, n: &Node) -> Result<Stat> {
        let e = &n.entry;
        let size = if e.is_file() {
            File::new(&self.inner.cont, n.oid(), e.chunk_size, true)?.size()?
        } else if e.is_symlink() {
            e.target.len() as u64
        } else if e.is_dir() {
            4096
        } else {
            0
        };
        let mut st = self.stat_of(e, size);
        if self.is_record(n) {
            st.nlink = self.nlink_of_record(n)?;
        }
        if e.is_dir() && e.subdirs_counted {
            st.nlink = 2u64
                .saturating_add(self.subdirs(e.oid)?)
                .min(u32::MAX as u64) as u32;
        }
        Ok(st)
    }

    /// A [`Stat`] from an entry and a known size; `nlink` is 1 (see
    /// [`Dfs::stat_node`] for a directory's count).
    pub fn stat_of(&self, e: &Entry, size: u64) -> Stat {
        Stat {
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            size,
            blocks: size.div_ceil(512),
            atime: e.atime,
            mtime: e.mtime,
            ctime: e.ctime,
            oid: e.oid,
            chunk_size: e.chunk_size,
            nlink: 1,
            rdev: e.rdev,
        }
    }

    /// A new entry in `parent`. A set-group-ID directory hands its group
    /// to what is made in it, and its set-group-ID bit to new directories
    /// (POSIX; what a pod's fsGroup relies on for directories the kubelet
    /// or the application makes after the group was applied).
    fn new_entry(&self, parent: &Node, mode: u32, uid: u32, gid: u32, oid: ObjectId) -> Entry {
        let t = now_ns();
        let (mut mode, mut gid) = (mode, gid);
        if parent.entry.mode & libc::S_ISGID != 0 {
            gid = parent.entry.gid;
            if mode & libc::S_IFMT == libc::S_IFDIR {
                mode |= libc::S_ISGID;
            }
        }
        Entry {
            mode,
            uid,
            gid,
            atime: t,
            mtime: t,
            ctime: t,
            oid,
            chunk_size: self.inner.chunk_size,
            size_hint: 0,
            child_class: 0,
            target: vec![],
            moving: None,
            from: None,
            rdev: 0,
            subdirs_counted: mode & libc::S_IFMT == libc::S_IFDIR,
            linked: false,
        }
    }

    /// Create (or with `excl` = false, open an existing) regular file.
    /// Returns the node and whether it was created.
    pub fn create(
        &self,
        parent: &Node,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
        excl: bool,
    ) -> Result<(Node, bool)> {
        self.create_versioned(parent, name, mode, uid, gid, excl)
            .map(|(n, made)| (n, made.is_some()))
    }

    /// [`Dfs::create`], with the epoch of the entry's version when this
    /// call made the file (`None`: it opened an existing one), for
    /// [`Dfs::unlink_written_at`].
    pub fn create_versioned(
        &self,
        parent: &Node,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
        excl: bool,
    ) -> Result<(Node, Option<u64>)> {
        let r = self.create_locked(parent, name, mode, uid, gid, excl)?;
        if r.1.is_some() {
            self.touch_dir(parent);
        }
        Ok(r)
    }

    fn create_locked(
        &self,
        parent: &Node,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
        excl: bool,
    ) -> Result<(Node, Option<u64>)> {
        Self::need_dir(parent)?;
        check_name(name)?;
        let _g = self.lock(&[(parent.oid(), name)]);
        // The insert comes first: a new name costs one round trip. Taken,
        // the name is read; another client may remove it in between (read
        // nothing: try again) or create it between our read and insert (a
        // lost insert race opens the winner's file without O_EXCL).
        for tries in 1.. {
            if self.inner.read_only {
                return match self.fetch_entry(parent.oid(), name)? {
                    Some(e) => self.existing(parent, name, e, excl),
                    None => Err(self.check_rw().expect_err("a read-only mount")),
                };
            }
            let oid = self.alloc_oid(self.class_for(parent, false));
            let e = self.new_entry(parent, libc::S_IFREG | (mode & 0o7777), uid, gid, oid);
            match self.insert_entry(parent.oid(), name, &e) {
                Ok(epoch) => {
                    let n = Node {
                        parent: parent.oid(),
                        name: name.to_vec(),
                        entry: e,
                    };
                    return Ok((n, Some(epoch)));
                }
                Err(x) if x.code == -libc::EEXIST && !excl => {}
                Err(x) => return Err(x),
            }
            match self.fetch_entry(parent.oid(), name)? {
                Some(e) => return self.existing(parent, name, e, excl),
                None if tries < 5 => {}
                None => {
                    return Err(err(
                        libc::EAGAIN,
                        format!(
                            "{:?}: created and removed by others, again and again",
                            show(name)
                        ),
                    ))
                }
            }
        }
        unreachable!("the loop returns")
    }

    /// What create(2) of an existing name opens.
    fn existing(
        &self,
        parent: &Node,
        name: &[u8],
        e: Entry,
        excl: bool,
    ) -> Result<(Node, Option<u64>)> {
        if excl {
            return Err(err(libc::EEXIST, format!("{:?} exists", show(name))));
        }
        if e.is_dir() {
            return Err(err(
                libc::EISDIR,
                format!("{:?} is a directory", show(name)),
            ));
        }
        Ok((self.resolve(parent.oid(), name, e)?, None))
    }

    fn add_new(&self, parent: &Node, name: &[u8], e: Entry) -> Result<Node> {
        let n = self.add_new_locked(parent, name, e)?;
        self.touch_dir(parent);
        Ok(n)
    }

    fn add_new_locked(&self, parent: &Node, name: &[u8], e: Entry) -> Result<Node> {
        Self::need_dir(parent)?;
        check_name(name)?;
        self.check_rw()?;
        let _g = self.lock(&[(parent.oid(), name)]);
        self.insert_entry(parent.oid(), name, &e)?;
        Ok(Node {
            parent: parent.oid(),
            name: name.to_vec(),
            entry: e,
        })
    }

    pub fn mkdir(&self, parent: &Node, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Node> {
        let oid = self.alloc_oid(self.class_for(parent, true));
        let mut e = self.new_entry(parent, libc::S_IFDIR | (mode & 0o7777), uid, gid, oid);
        e.child_class = parent.entry.child_class;
        let n = self.add_new(parent, name, e)?;
        self.adjust_subdirs(parent, 1);
        Ok(n)
    }

    /// mknod(2): a FIFO, a socket, or a character or block device node
    /// (`mode` says which; `rdev` is the device number of a device node,
    /// ignored for the others), as an entry with no object behind it
    /// (its id is unique, for inode numbers). A regular file type (or
    /// none) makes an empty regular file, as mknod(2) does.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        parent: &Node,
        name: &[u8],
        mode: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
    ) -> Result<Node> {
        let kind = mode & libc::S_IFMT;
        if kind == 0 || kind == libc::S_IFREG {
            return self
                .create(parent, name, mode & 0o7777, uid, gid, true)
                .map(|(n, _)| n);
        }
        if !is_special_mode(kind) {
            return Err(Error::inval(format!(
                "mknod of {:?}: file type {kind:#o} (directories: mkdir, symlinks: symlink)",
                show(name)
            )));
        }
        let oid = self.alloc_oid(self.inner.file_class);
        let mut e = self.new_entry(parent, kind | (mode & 0o7777), uid, gid, oid);
        if matches!(kind, libc::S_IFCHR | libc::S_IFBLK) {
            e.rdev = rdev;
        }
        self.add_new(parent, name, e)
    }

    pub fn symlink(
        &self,
        parent: &Node,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Node> {
        if target.is_empty() || target.len() > 4095 {
            return Err(err(
                if target.is_empty() {
                    libc::ENOENT
                } else {
                    libc::ENAMETOOLONG
                },
                format!("symlink target of {} bytes", target.len()),
            ));
        }
        let oid = self.alloc_oid(self.inner.file_class);
        let mut e = self.new_entry(parent, libc::S_IFLNK | 0o777, uid, gid, oid);
        e.target = target.to_vec();
        self.add_new(parent, name, e)
    }

    pub fn readlink(&self, node: &Node) -> Result<Vec<u8>> {
        if !node.entry.is_symlink() {
            return Err(Error::inval(format!(
                "{:?} is not a symlink",
                show(&node.name)
            )));
        }
        Ok(node.entry.target.clone())
    }

    /// Remove a non-directory and punch its data.
    pub fn unlink(&self, parent: &Node, name: &[u8]) -> Result<()> {
        match self.unlink_deferred(parent, name)? {
            Some(e) => self.release_object(&e),
            None => Ok(()),
        }
    }

    /// [`Dfs::unlink`] of `n`, whose entry the caller wrote at `epoch`
    /// ([`Dfs::create_versioned`]): if that version is still the name's
    /// live one, it is removed in one round trip, without reading it
    /// first. Otherwise (changed, replaced or removed since, or an engine
    /// that does not know the condition) as `unlink`, which reads what is
    /// there now.
    pub fn unlink_written_at(&self, parent: &Node, n: &Node, epoch: u64) -> Result<()> {
        match self.unlink_written_at_deferred(parent, n, epoch)? {
            Some(e) => self.release_object(&e),
            None => Ok(()),
        }
    }

    /// [`Dfs::unlink_written_at`] that leaves the data, as
    /// [`Dfs::unlink_deferred`] does.
    pub fn unlink_written_at_deferred(
        &self,
        parent: &Node,
        n: &Node,
        epoch: u64,
    ) -> Result<Option<Entry>> {
        match self.unlink_if_written_at_deferred(parent, n, epoch)? {
            Some(e) => Ok(Some(e)),
            None => self.unlink_deferred(parent, &n.name),
        }
    }

    /// Remove `n`, and punch its data, only if its entry is still the
    /// version the caller wrote at `epoch`, in one round trip: true if
    /// removed; false if nothing changed (the entry was rewritten,
    /// replaced, moved or removed since, or is not a plain file): the
    /// caller then looks at what the name holds now. A caller that has
    /// not read the entry lately can trust `n` this way: a removal by it
    /// happens only while it is exactly what the caller wrote.
    pub fn unlink_if_written_at(&self, parent: &Node, n: &Node, epoch: u64) -> Result<bool> {
        match self.unlink_if_written_at_deferred(parent, n, epoch)? {
            Some(e) => self.release_object(&e).map(|()| true),
            None => Ok(false),
        }
    }

    /// [`Dfs::unlink_if_written_at`] that leaves the data: the removed
    /// entry, None if nothing was removed.
    fn unlink_if_written_at_deferred(
        &self,
        parent: &Node,
        n: &Node,
        epoch: u64,
    ) -> Result<Option<Entry>> {
        let e = &n.entry;
        let plain = e.is_file() && !e.linked && e.moving.is_none() && e.from.is_none();
        if !plain || n.parent != parent.oid() {
            return Ok(None);
        }
        check_name(&n.name)?;
        self.check_rw()?;
        let removed = {
            let _g = self.lock(&[(parent.oid(), &n.name)]);
            let o = self.obj(parent.oid())?;
            let mut tx = self.container().transaction();
            tx.punch_dkey(&o, &n.name)
                .expect(&o, &n.name, INODE, Expect::WrittenAt(epoch));
            tx.commit()
        };
        match removed {
            Ok(()) => {
                self.touch_dir(parent);
                Ok(Some(e.clone()))
            }
            // Nothing was stored: the entry is no longer that version (or
            // an engine that does not know the condition).
            Err(x) if x.code == -libc::EBUSY || x.code == -libc::EINVAL => Ok(None),
            Err(x) => Err(x),
        }
    }

    /// Remove a non-directory's name. Returns its entry if that was the
    /// file's last name: its data stays until [`Dfs::release_object`] (for
    /// files still open); `None` if other hard links remain.
    pub fn unlink_deferred(&self, parent: &Node, name: &[u8]) -> Result<Option<Entry>> {
        let e = self.unlink_locked(parent, name)?;
        self.touch_dir(parent);
        Ok(e)
    }

    fn unlink_locked(&self, parent: &Node, name: &[u8]) -> Result<Option<Entry>> {
        Self::need_dir(parent)?;
        check_name(name)?;
        self.check_rw()?;
        let _g = self.lock(&[(parent.oid(), name)]);
        retry_changed(|| {
            let (e, epoch) = self
                .fetch_versioned(parent.oid(), name)?
                .ok_or_else(|| err(libc::ENOENT, format!("{:?}: no such entry", show(name))))?;
            if e.is_dir() {
                return Err(err(
                    libc::EISDIR,
                    format!("{:?} is a directory", show(name)),
                ));
            }
            self.settle_from(&e)?;
            let mut tx = self.removal(parent.oid(), name, epoch)?;
            let last = match e.linked {
                true => self.unlink_record_in(&mut tx, e.oid)?,
                false => Some(e),
            };
            tx.commit()?;
            Ok(last)
        })
    }

    /// Punch the object behind a removed entry (files and directories);
    /// no name reaches it, so its shards are punched each on its own, and
    /// the caller does not wait for them: the object is queued, and the
    /// mount's queue sends the punches of up to [`peregrine::DISCARD_BATCH`]
    /// objects together, at most [`peregrine::DISCARD_DELAY`] later (see
    /// [`DiscardQueue`]). An error here is this object's (its class); a
    /// later failure is retried and then logged (the name is gone whatever
    /// happens: only space is at stake).
    pub fn release_object(&self, e: &Entry) -> Result<()> {
        if !(e.is_file() || e.is_dir()) {
            return Ok(());
        }
        self.inner.discards.push(self.obj(e.oid)?);
        Ok(())
    }

    /// Send the punches [`Dfs::release_object`] queued and wait for them;
    /// the first error among them since the last settle.
    pub fn settle_discards(&self) -> Result<()> {
        self.inner.discards.settle()
    }

    /// ENOTDIR unless `e` (named `name`) is a directory, ENOTEMPTY unless it is empty.
    pub(crate) fn check_empty_dir(&self, e: &Entry, name: &[u8]) -> Result<()> {
        if !e.is_dir() {
            return Err(err(
                libc::ENOTDIR,
                format!("{:?} is not a directory", show(name)),
            ));
        }
        if !self.dir_is_empty(e.oid)? {
            return Err(err(
                libc::ENOTEMPTY,
                format!("directory {:?} is not empty", show(name)),
            ));
        }
        Ok(())
    }

    fn dir_is_empty(&self, dir: ObjectId) -> Result<bool> {
        Ok(self.obj(dir)?.list_dkeys()?.iter().all(|k| k == COUNT_DKEY))
    }

    pub fn rmdir(&self, parent: &Node, name: &[u8]) -> Result<()> {
        let removed = self.rmdir_locked(parent, name);
        self.dirs_moved();
        removed?;
        self.touch_dir(parent);
        self.adjust_subdirs(parent, -1);
        Ok(())
    }

    fn rmdir_locked(&self, parent: &Node, name: &[u8]) -> Result<()> {
        Self::need_dir(parent)?;
        check_name(name)?;
        self.check_rw()?;
        let _g = self.lock(&[(parent.oid(), name)]);
        let e = retry_changed(|| {
            let (e, epoch) = self
                .fetch_versioned(parent.oid(), name)?
                .ok_or_else(|| err(libc::ENOENT, format!("{:?}: no such entry", show(name))))?;
            self.check_empty_dir(&e, name)?;
            self.settle_from(&e)?;
            self.removal(parent.oid(), name, epoch)?.commit()?;
            Ok(e)
        })?;
        self.release_object(&e)
    }

    /// chmod / chown / utimens / truncate in one call; returns the new
    /// node and its attributes.
    pub fn setattr(&self, node: &Node, a: &SetAttr) -> Result<(Node, Stat)> {
        self.check_rw()?;
        let _g = self.lock(&[(node.parent, &node.name)]);
        let n = retry_changed(|| {
            let (n, epoch) = self
                .node_versioned(node.parent, &node.name)?
                .ok_or_else(|| {
                    err(
                        libc::ENOENT,
                        format!("{:?}: entry removed", show(&node.name)),
                    )
                })?;
            self.setattr_once(node, n, epoch, a)
        })?;
        drop(_g);
        if n.is_dir() {
            self.forget_touch(n.oid());
        }
        self.getattr(&n)
    }

    fn setattr_once(&self, node: &Node, mut n: Node, epoch: u64, a: &SetAttr) -> Result<Node> {
        if n.oid() != node.oid() {
            // Removed, and the name made again: not this node's to change.
            return Err(err(
                libc::ENOENT,
                format!(
                    "{:?}: entry removed (its name now names another)",
                    show(&n.name)
                ),
            ));
        }
        if let Some(size) = a.size {
            if n.entry.is_dir() {
                return Err(err(
                    libc::EISDIR,
                    format!("{:?} is a directory", show(&n.name)),
                ));
            }
            if !n.entry.is_file() {
                return Err(Error::inval(format!(
                    "{:?} is not a regular file",
                    show(&n.name)
                )));
            }
            self.open(&n)?.truncate(size)?;
            n.entry.size_hint = size;
            n.entry.mtime = now_ns();
        }
        a.apply_to(&mut n.entry, now_ns());
        self.replace_entry(&n, epoch)?;
        Ok(n)
    }

    /// Record a size hint and mtime after writes (called on close).
    /// Returns the mtime recorded, for a caller that caches the attributes
    /// (a second clock reading would differ from what a later stat reads).
    pub fn touch_written(&self, node: &Node, size: u64) -> Result<i64> {
        let t = now_ns();
        if self.inner.read_only {
            return Ok(t);
        }
        let _g = self.lock(&[(node.parent, &node.name)]);
        retry_changed(|| {
            let (mut n, epoch) = match self.node_versioned(node.parent, &node.name)? {
                // The name now names another file, or none: this one was removed.
                Some((n, _)) if n.oid() != node.oid() => return Ok(()),
                Some(v) => v,
                None => return Ok(()),
            };
            n.entry.mtime = t;
            n.entry.ctime = t;
            n.entry.size_hint = size;
            self.replace_entry(&n, epoch)
        })?;
        Ok(t)
    }

    /// fallocate(2): mode 0 extends the size to `off + len` if larger;
    /// other modes are EOPNOTSUPP.
    pub fn fallocate(&self, node: &Node, mode: i32, off: u64, len: u64) -> Result<()> {
        self.check_rw()?;
        if mode != 0 {
            return Err(err(libc::EOPNOTSUPP, format!("fallocate mode {mode:#x}")));
        }
        if !node.entry.is_file() {
            return Err(err(libc::ENODEV, "fallocate on a non-regular file"));
        }
        self.open(node)?.extend_to(off.saturating_add(len))
    }

    /// Space of the pool (nvme tier if it has one, else scm).
    pub fn statfs(&self) -> Result<StatFs> {
        let pool = self.inner.cont.pool();
        let info = pool.client().mgmt().pool_query(PoolQueryReq {
            id: pool.uuid().to_string(),
        })?;
        let tier = info
            .tiers
            .iter()
            .find(|t| t.name == "nvme" && t.total > 0)
            .or_else(|| info.tiers.iter().find(|t| t.total > 0));
        let (mut total, mut free) = tier.map(|t| (t.total, t.free)).unwrap_or((0, 0));
        // A container with a quota is a file system of that size.
        let cont = pool.client().mgmt().cont_query(ContQueryReq {
            pool: pool.uuid().to_string(),
            id: self.inner.cont.uuid().to_string(),
            ..Default::default()
        })?;
        if cont.quota_bytes > 0 {
            total = cont.quota_bytes;
            free = free.min(cont.quota_bytes.saturating_sub(cont.quota_used_bytes));
        }
        let bsize = 4096u64;
        Ok(StatFs {
            bsize: bsize as u32,
            blocks: total / bsize,
            bfree: free / bsize,
            bavail: free / bsize,
            files: u32::MAX as u64,
            ffree: u32::MAX as u64,
            namelen: NAME_MAX as u32,
        })
    }

    /// Make what was written to `node` (its data, its entry) survive a
    /// power cut, as fsync: flush the node's object and its directory.
    /// Updates are acknowledged once written (they survive the crash of any
    /// process) unless the container says `sync=always`.
    pub fn fsync(&self, node: &Node) -> Result<()> {
        let cont = &self.inner.cont;
        cont.object(node.oid())?.flush()?;
        cont.object(node.parent)?.flush()
    }

    // ---- files ----

    /// Open a regular file for I/O.
    pub fn open(&self, node: &Node) -> Result<File> {
        if node.is_dir() {
            return Err(err(
                libc::EISDIR,
                format!("{:?} is a directory", show(&node.name)),
            ));
        }
        if !node.entry.is_file() {
            return Err(Error::inval(format!(
                "{:?} is not a regular file",
                show(&node.name)
            )));
        }
        File::new(
            &self.inner.cont,
            node.oid(),
            node.entry.chunk_size,
            self.inner.read_only,
        )
    }
}
