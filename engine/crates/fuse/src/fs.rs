//! The FUSE file system: kernel requests -> [`peregrine_dfs::Dfs`].
//!
//! Inode numbers are a 64-bit hash of the object id (root = 1), so they
//! are the same in every daemon and in readdir and stat. The inode table
//! maps a number to its [`Node`] (parent directory object + name), which
//! rename keeps current. fuser runs `--threads` event-loop threads, each
//! reading requests from /dev/fuse and calling into the Dfs, so requests
//! proceed in parallel.

mod caps;
mod handles;
mod inodes;
mod list;

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, InitFlags,
    IoctlFlags, KernelConfig, LockOwner, Notifier, OpenAccMode, OpenFlags, RenameFlags, ReplyAttr,
    ReplyCreate, ReplyData, ReplyDirectory, ReplyDirectoryPlus, ReplyEmpty, ReplyEntry, ReplyIoctl,
    ReplyOpen, ReplyStatfs, ReplyWrite, ReplyXattr, Request, TimeOrNow, WriteFlags,
};
use inodes::Created;
use parking_lot::Mutex;
use peregrine::{Error, ObjectId};
use peregrine_dfs::{now_ns, Dfs, DirHandle, Entry, File, Node, SetAttr, Stat, DIR_TIME_TICK_NS};
use std::collections::HashMap;
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Size of `struct peregrine_fuse_handle` (include/peregrine_fuse.h).
pub const HANDLE_SIZE: usize = 208;
/// Bytes of the management address field, NUL included.
pub const HANDLE_MGMT_MAX: usize = 128;
pub const HANDLE_VERSION: u32 = 1;
pub const HANDLE_FLAG_RDONLY: u32 = 1;
/// The handle is of a directory (its object; no chunk size).
pub const HANDLE_FLAG_DIR: u32 = 2;
/// `_IOR('P', 1, struct peregrine_fuse_handle)`.
pub const PEREGRINE_IOC_GET_HANDLE: u32 =
    (2u32 << 30) | ((HANDLE_SIZE as u32) << 16) | ((b'P' as u32) << 8) | 1;
/// `_IO('P', 2)`: the caller wrote the file behind the kernel's back (the
/// interception library): record size and mtime in the entry and drop the
/// kernel's cached attributes and pages of the inode, so that stat and
/// reads through the mount, in any process, see the new data.
pub const PEREGRINE_IOC_INVALIDATE: u32 = ((b'P' as u32) << 8) | 2;

/// Page-cache policy for file data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DataCache {
    /// Kernel page cache kept across opens.
    On,
    /// No page cache (direct I/O): every read and write reaches the daemon.
    Off,
    /// Page cache kept across opens that come within this long of the
    /// open that (re)validated it; later opens drop it (as dfuse).
    For(Duration),
}

#[derive(Clone, Debug)]
pub struct Options {
    pub attr_ttl: Duration,
    pub entry_ttl: Duration,
    pub data_cache: DataCache,
    pub mgmt: String,
    pub read_only: bool,
}

struct Ino {
    node: Node,
    lookups: u64,
    open: u32,
    /// Removed while open: punch its object at the last close.
    unlinked: Option<Entry>,
    cache_stamp: Option<Instant>,
    /// Since when it is known to have no file capabilities (`caps.rs`).
    no_caps_since: Option<Instant>,
}

enum Handle {
    File {
        ino: u64,
        file: File,
        written: AtomicBool,
        /// The mtime the file was made with, when this handle's create made
        /// it: writes within that clock tick keep it ([`stamp_written`]).
        made_at: Option<i64>,
    },
    Dir(DirHandle),
}

pub struct PeregrineFs {
    dfs: Dfs,
    opts: Options,
    inodes: Mutex<HashMap<u64, Ino>>,
    handles: Mutex<HashMap<u64, Arc<Handle>>>,
    /// Names this mount created, with the epoch of the entry's version it
    /// wrote, while it knows of no rewrite (`inodes.rs`, [`Created`]).
    created: Mutex<Created>,
    /// `PEREGRINE_IOC_GET_CONT`'s last answer (ctl.rs).
    descriptions: crate::ctl::Descriptions,
    next_fh: AtomicU64,
    /// Set by main once the session exists (kernel cache invalidation).
    notifier: Arc<OnceLock<Notifier>>,
}

/// Whether a file this handle made is still in the clock tick it was made
/// in: its writes then need no new mtime (file times have the tick's
/// granularity, as with Linux's coarse clock), which saves the entry's read
/// and rewrite on close, a round trip and a commit per small file. The
/// interception library applies the same rule.
fn within_made_tick(made_at: Option<i64>) -> bool {
    made_at.is_some_and(|t| now_ns() - t < DIR_TIME_TICK_NS)
}

/// Inode number of an object (root: 1).
pub fn ino_of(oid: ObjectId, root: ObjectId) -> u64 {
    if oid == root {
        return 1;
    }
    let mut x = oid.hi ^ oid.lo.rotate_left(29) ^ 0x9E37_79B9_7F4A_7C15;
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    if x <= 1 {
        x += 2;
    }
    x
}

fn ns_time(ns: i64) -> SystemTime {
    if ns >= 0 {
        UNIX_EPOCH + Duration::from_nanos(ns as u64)
    } else {
        UNIX_EPOCH - Duration::from_nanos(ns.unsigned_abs())
    }
}

fn time_ns(t: TimeOrNow) -> i64 {
    match t {
        TimeOrNow::Now => now_ns(),
        TimeOrNow::SpecificTime(t) => match t.duration_since(UNIX_EPOCH) {
            Ok(d) => d.as_nanos() as i64,
            Err(e) => -(e.duration().as_nanos() as i64),
        },
    }
}

fn kind_of(mode: u32) -> FileType {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => FileType::Directory,
        libc::S_IFLNK => FileType::Symlink,
        libc::S_IFIFO => FileType::NamedPipe,
        libc::S_IFSOCK => FileType::Socket,
        libc::S_IFCHR => FileType::CharDevice,
        libc::S_IFBLK => FileType::BlockDevice,
        _ => FileType::RegularFile,
    }
}

/// glibc's `makedev` form (what [`peregrine_dfs::Entry::rdev`] holds) from
/// the kernel's 32-bit `new_encode_dev` form that FUSE carries.
pub fn decode_dev(d: u32) -> u64 {
    let (major, minor) = ((d & 0xfff00) >> 8, (d & 0xff) | ((d >> 12) & 0xfff00));
    libc::makedev(major, minor)
}

/// The kernel's 32-bit `new_encode_dev` form of a `makedev` number.
pub fn encode_dev(d: u64) -> u32 {
    let (major, minor) = (libc::major(d), libc::minor(d));
    (minor & 0xff) | ((major & 0xfff) << 8) | ((minor & !0xff) << 12)
}

/// Errors the application should see as they are; anything else (a
/// transport or engine failure) becomes EIO.
fn errno(e: &Error) -> Errno {
    let c = -e.code;
    const POSIX: &[i32] = &[
        libc::ENOENT,
        libc::EEXIST,
        libc::ENOTDIR,
        libc::EISDIR,
        libc::ENOTEMPTY,
        libc::ENAMETOOLONG,
        libc::EINVAL,
        libc::EROFS,
        libc::ENOSPC,
        libc::EDQUOT,
        libc::EOPNOTSUPP,
        libc::ENODATA,
        libc::ERANGE,
        libc::E2BIG,
        libc::EACCES,
        libc::EPERM,
        libc::EXDEV,
        libc::ENODEV,
        libc::EBADF,
        libc::EFBIG,
    ];
    if POSIX.contains(&c) {
        Errno::from_i32(c)
    } else {
        eprintln!("peregrine-fuse: I/O error: {e} (errno {c})");
        Errno::EIO
    }
}

macro_rules! tryr {
    ($reply:expr, $e:expr) => {
        match $e {
            Ok(v) => v,
            Err(e) => {
                $reply.error(errno(&e));
                return;
            }
        }
    };
}

fn stale() -> Error {
    Error::new(-libc::ENOENT, "unknown inode (stale handle)")
}

impl PeregrineFs {
    pub fn new(dfs: Dfs, opts: Options) -> PeregrineFs {
        let mut inodes = HashMap::new();
        inodes.insert(
            1,
            Ino {
                node: dfs.root(),
                lookups: 1,
                open: 0,
                unlinked: None,
                cache_stamp: None,
                no_caps_since: None,
            },
        );
        PeregrineFs {
            dfs,
            opts,
            inodes: Mutex::new(inodes),
            handles: Mutex::new(HashMap::new()),
            created: Mutex::new(HashMap::new()),
            descriptions: Default::default(),
            next_fh: AtomicU64::new(1),
            notifier: Arc::new(OnceLock::new()),
        }
    }

    /// Where main puts the session's [`Notifier`] (for `PEREGRINE_IOC_INVALIDATE`).
    pub fn notifier_slot(&self) -> Arc<OnceLock<Notifier>> {
        self.notifier.clone()
    }

    fn attr(&self, st: &Stat) -> FileAttr {
        FileAttr {
            ino: INodeNo(self.ino(st.oid)),
            size: st.size,
            blocks: st.blocks,
            atime: ns_time(st.atime),
            mtime: ns_time(st.mtime),
            ctime: ns_time(st.ctime),
            crtime: ns_time(st.ctime),
            kind: kind_of(st.mode),
            perm: (st.mode & 0o7777) as u16,
            nlink: st.nlink,
            uid: st.uid,
            gid: st.gid,
            // FUSE carries 32 bits: the kernel's new_encode_dev() form,
            // which makedev() values of 12-bit majors and 20-bit minors
            // (every Linux device number) map to one to one.
            rdev: encode_dev(st.rdev),
            blksize: st.chunk_size.clamp(4096, 1 << 20) as u32,
            flags: 0,
        }
    }

    /// Attributes of a freshly read node (no second entry fetch).
    fn stat_node(&self, n: &Node) -> Result<Stat, Error> {
        self.dfs.stat_node(n)
    }

    fn reply_entry(&self, n: &Node, reply: ReplyEntry) {
        let st = tryr!(reply, self.stat_node(n));
        self.remember(n);
        reply.entry(&self.opts.entry_ttl, &self.attr(&st), Generation(0));
    }
}

impl Filesystem for PeregrineFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        let _ = config.set_max_readahead(1 << 20);
        // READDIRPLUS when the kernel offers it, and its choice of when
        // (plain READDIR once a listing is not followed by lookups).
        let _ = config
            .add_capabilities(InitFlags::FUSE_DO_READDIRPLUS | InitFlags::FUSE_READDIRPLUS_AUTO);
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        let p = tryr!(reply, self.node(parent));
        let n = tryr!(reply, self.dfs.lookup(&p, name.as_bytes()));
        self.reply_entry(&n, reply);
    }

    fn forget(&self, _req: &Request, ino: INodeNo, nlookup: u64) {
        if ino.0 == 1 {
            return;
        }
        let mut t = self.inodes.lock();
        if let Some(i) = t.get_mut(&ino.0) {
            i.lookups = i.lookups.saturating_sub(nlookup);
            if i.lookups == 0 && i.open == 0 {
                t.remove(&ino.0);
            }
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        let n = tryr!(reply, self.node(ino));
        // The name now naming another object (removed and made again, by
        // another client too) is this inode gone, not the other's attributes.
        let was = n.oid();
        let got = self
            .dfs
            .getattr_within(&n, self.opts.attr_ttl)
            .and_then(|(n, st)| {
                if n.oid() == was {
                    Ok((n, st))
                } else {
                    Err(Error::new(
                        -libc::ENOENT,
                        "entry removed and its name reused",
                    ))
                }
            });
        match got {
            Ok((n, st)) => {
                self.update(&n);
                reply.attr(&self.opts.attr_ttl, &self.attr(&st));
            }
            Err(e) if e.code == -libc::ENOENT => match self.orphan(ino.0) {
                // fstat of a file removed while open.
                Some(entry) => {
                    let st = tryr!(reply, self.orphan_stat(&entry));
                    reply.attr(&self.opts.attr_ttl, &self.attr(&st));
                }
                None => reply.error(errno(&e)),
            },
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        atime: Option<TimeOrNow>,
        mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        let n = tryr!(reply, self.node(ino));
        let a = SetAttr {
            mode,
            uid,
            gid,
            size,
            atime: atime.map(time_ns),
            mtime: mtime.map(time_ns),
        };
        let (n, st) = match self.dfs.setattr(&n, &a) {
            Ok(r) => r,
            Err(e) if e.code == -libc::ENOENT && self.orphan(ino.0).is_some() => {
                // ftruncate/fchmod/futimens of a file removed while open.
                let st = tryr!(reply, self.orphan_setattr(ino.0, &a));
                reply.attr(&self.opts.attr_ttl, &self.attr(&st));
                return;
            }
            Err(e) => {
                reply.error(errno(&e));
                return;
            }
        };
        if mtime.is_some() {
            // An explicit mtime (cp -a, touch -d) wins over the "written, so
            // now" stamp that release would apply for earlier writes.
            for h in self.handles.lock().values() {
                if let Handle::File {
                    ino: hino, written, ..
                } = &**h
                {
                    if *hino == ino.0 {
                        written.store(false, Ordering::Relaxed);
                    }
                }
            }
        }
        self.rewritten(&n);
        self.update(&n);
        reply.attr(&self.opts.attr_ttl, &self.attr(&st));
    }

    fn readlink(&self, _req: &Request, ino: INodeNo, reply: ReplyData) {
        let n = tryr!(reply, self.node(ino));
        let t = tryr!(reply, self.dfs.readlink(&n));
        reply.data(&t);
    }

    /// Regular files, FIFOs, sockets (bind(2) of a unix socket) and
    /// character and block device nodes (the kernel checks CAP_MKNOD for
    /// devices before asking; opening a special file never reaches the
    /// daemon: the kernel serves it from the type and device number that
    /// lookup and getattr report).
    fn mknod(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        rdev: u32,
        reply: ReplyEntry,
    ) {
        let p = tryr!(reply, self.node(parent));
        let n = tryr!(
            reply,
            self.dfs.mknod(
                &p,
                name.as_bytes(),
                mode,
                decode_dev(rdev),
                req.uid(),
                req.gid()
            )
        );
        self.reply_entry(&n, reply);
    }

    fn mkdir(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        reply: ReplyEntry,
    ) {
        let p = tryr!(reply, self.node(parent));
        let n = tryr!(
            reply,
            self.dfs
                .mkdir(&p, name.as_bytes(), mode, req.uid(), req.gid())
        );
        self.reply_entry(&n, reply);
    }

    fn unlink(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let p = tryr!(reply, self.node(parent));
        let removed = match self.take_created(&p, name.as_bytes()) {
            Some((n, epoch)) => self.dfs.unlink_written_at_deferred(&p, &n, epoch),
            None => self.dfs.unlink_deferred(&p, name.as_bytes()),
        };
        // The file's last name gone: its data goes once it is closed.
        if let Some(e) = tryr!(reply, removed) {
            tryr!(reply, self.removed(e));
        }
        reply.ok();
    }

    fn rmdir(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let p = tryr!(reply, self.node(parent));
        tryr!(reply, self.dfs.rmdir(&p, name.as_bytes()));
        reply.ok();
    }

    fn symlink(
        &self,
        req: &Request,
        parent: INodeNo,
        link_name: &OsStr,
        target: &Path,
        reply: ReplyEntry,
    ) {
        let p = tryr!(reply, self.node(parent));
        let n = tryr!(
            reply,
            self.dfs.symlink(
                &p,
                link_name.as_bytes(),
                target.as_os_str().as_bytes(),
                req.uid(),
                req.gid()
            )
        );
        self.reply_entry(&n, reply);
    }

    fn rename(
        &self,
        _req: &Request,
        parent: INodeNo,
        name: &OsStr,
        newparent: INodeNo,
        newname: &OsStr,
        flags: RenameFlags,
        reply: ReplyEmpty,
    ) {
        let sp = tryr!(reply, self.node(parent));
        let dp = tryr!(reply, self.node(newparent));
        let (s, d) = (name.as_bytes(), newname.as_bytes());
        let replaced = tryr!(
            reply,
            self.dfs.rename_deferred(&sp, s, &dp, d, flags.bits())
        );
        // Keep the inode table's (parent, name) current.
        {
            let mut c = self.created.lock();
            c.remove(&(sp.oid(), s.to_vec()));
            c.remove(&(dp.oid(), d.to_vec()));
        }
        {
            let mut t = self.inodes.lock();
            let exchange = flags.bits() & peregrine_dfs::RENAME_EXCHANGE != 0;
            for i in t.values_mut() {
                if i.node.parent == sp.oid() && i.node.name == s {
                    i.node.parent = dp.oid();
                    i.node.name = d.to_vec();
                } else if exchange && i.node.parent == dp.oid() && i.node.name == d {
                    i.node.parent = sp.oid();
                    i.node.name = s.to_vec();
                }
            }
        }
        if let Some(e) = replaced {
            tryr!(reply, self.removed(e));
        }
        reply.ok();
    }

    fn link(
        &self,
        _req: &Request,
        ino: INodeNo,
        newparent: INodeNo,
        newname: &OsStr,
        reply: ReplyEntry,
    ) {
        let n = tryr!(reply, self.node(ino));
        let p = tryr!(reply, self.node(newparent));
        self.rewritten(&n);
        let n = tryr!(reply, self.dfs.link(&n, &p, newname.as_bytes()));
        self.reply_entry(&n, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        let n = tryr!(reply, self.node(ino));
        // A file opened for reading has nothing to record at close (FLUSH
        // records a write's mtime; locks are the kernel's own, this daemon
        // has no lock calls): its close(2) need not wait for a FLUSH.
        let noflush = match flags.acc_mode() {
            OpenAccMode::O_RDONLY => FopenFlags::FOPEN_NOFLUSH,
            _ => FopenFlags::empty(),
        };
        let mut r = Some(reply);
        let opened = |fh, fl| r.take().unwrap().opened(FileHandle(fh), fl | noflush);
        if let Err(e) = self.open_file(&n, None, opened) {
            if let Some(reply) = r {
                reply.error(errno(&e));
            }
        }
    }

    fn create(
        &self,
        req: &Request,
        parent: INodeNo,
        name: &OsStr,
        mode: u32,
        _umask: u32,
        flags: i32,
        reply: ReplyCreate,
    ) {
        let p = tryr!(reply, self.node(parent));
        let excl = flags & libc::O_EXCL != 0;
        let made = Instant::now();
        let (n, written_at) = tryr!(
            reply,
            self.dfs
                .create_versioned(&p, name.as_bytes(), mode, req.uid(), req.gid(), excl)
        );
        let created = written_at.is_some();
        // A file just made is empty: no size query of its new object.
        let st = match created {
            true => self.dfs.stat_of(&n.entry, 0),
            false => tryr!(reply, self.stat_node(&n)),
        };
        let ino = self.remember(&n);
        if let Some(epoch) = written_at {
            self.set_caps_absent(ino, Some(made));
            self.note_created(&n, epoch);
        }
        let attr = self.attr(&st);
        let ttl = self.opts.entry_ttl;
        let mut r = Some(reply);
        let made_at = created.then_some(n.entry.mtime);
        if let Err(e) = self.open_file(&n, made_at, |fh, fl| {
            r.take()
                .unwrap()
                .created(&ttl, &attr, Generation(0), FileHandle(fh), fl)
        }) {
            if let Some(reply) = r {
                reply.error(errno(&e));
            }
        }
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let h = tryr!(reply, self.handle(fh));
        let Handle::File { file, .. } = &*h else {
            reply.error(Errno::from_i32(libc::EISDIR));
            return;
        };
        let mut buf = vec![0u8; size as usize];
        let n = tryr!(reply, file.read_at(offset, &mut buf));
        reply.data(&buf[..n]);
    }

    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        let h = tryr!(reply, self.handle(fh));
        let Handle::File { file, written, .. } = &*h else {
            reply.error(Errno::from_i32(libc::EISDIR));
            return;
        };
        let n = tryr!(reply, file.write_at(offset, data));
        written.store(true, Ordering::Relaxed);
        // O_SYNC/O_DSYNC need nothing here: the kernel follows each such
        // write with FSYNC (generic_write_sync).
        reply.written(n as u32);
    }

    fn flush(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        // close(2) waits for FLUSH but not for RELEASE: record the write's
        // mtime now, so that a stat right after close sees it (and not a
        // second, later change when RELEASE arrives).
        if let Ok(h) = self.handle(fh) {
            if let Handle::File {
                ino,
                file,
                written,
                made_at,
            } = &*h
            {
                if written.swap(false, Ordering::Relaxed) && !within_made_tick(*made_at) {
                    let node = self.inodes.lock().get(ino).map(|i| i.node.clone());
                    if let Some(n) = node {
                        self.rewritten(&n);
                        if let Err(e) = self.dfs.touch_written(&n, file.cached_size()) {
                            // The data is written; only its stamp is not
                            // (full pool, engine down): RELEASE tries again.
                            eprintln!("peregrine-fuse: flush: recording mtime: {e}");
                            written.store(true, Ordering::Relaxed);
                        }
                    }
                }
            }
        }
        reply.ok();
    }

    fn release(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        _flush: bool,
        reply: ReplyEmpty,
    ) {
        let Some(h) = self.handles.lock().remove(&fh.0) else {
            reply.ok();
            return;
        };
        let Handle::File {
            ino,
            file,
            written,
            made_at,
        } = &*h
        else {
            reply.ok();
            return;
        };
        let (node, punch) = {
            let mut t = self.inodes.lock();
            match t.get_mut(ino) {
                Some(i) => {
                    i.open = i.open.saturating_sub(1);
                    let punch = if i.open == 0 { i.unlinked.take() } else { None };
                    let node = i.node.clone();
                    if i.open == 0 && i.lookups == 0 {
                        t.remove(ino);
                    }
                    (Some(node), punch)
                }
                None => (None, None),
            }
        };
        if let Some(e) = punch {
            tryr!(reply, self.dfs.release_object(&e));
        } else if written.load(Ordering::Relaxed) && !within_made_tick(*made_at) {
            if let Some(n) = node {
                tryr!(reply, self.dfs.touch_written(&n, file.cached_size()));
            }
        }
        reply.ok();
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let n = tryr!(reply, self.node(ino));
        tryr!(reply, self.dfs.fsync(&n));
        reply.ok();
    }

    fn opendir(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        let n = tryr!(reply, self.node(ino));
        let h = tryr!(reply, self.dfs.opendir(&n));
        let fh = self.add_handle(Handle::Dir(h));
        reply.opened(FileHandle(fh), FopenFlags::empty());
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        let r = self.list(ino, fh, offset, false, |ino, off, kind, name, _| {
            reply.add(ino, off, kind, name)
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn readdirplus(
        &self,
        _req: &Request,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectoryPlus,
    ) {
        let ttl = self.opts.entry_ttl;
        let r = self.list(ino, fh, offset, true, |ino, off, _, name, attr| {
            reply.add(ino, off, name, &ttl, attr, Generation(0))
        });
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(errno(&e)),
        }
    }

    fn releasedir(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: OpenFlags,
        reply: ReplyEmpty,
    ) {
        self.handles.lock().remove(&fh.0);
        reply.ok();
    }

    fn fsyncdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        let n = tryr!(reply, self.node(ino));
        tryr!(reply, self.dfs.fsync(&n));
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let s = tryr!(reply, self.dfs.statfs());
        reply.statfs(
            s.blocks, s.bfree, s.bavail, s.files, s.ffree, s.bsize, s.namelen, s.bsize,
        );
    }

    fn setxattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        name: &OsStr,
        value: &[u8],
        flags: i32,
        _position: u32,
        reply: ReplyEmpty,
    ) {
        // POSIX ACLs are not implemented: saying so makes cp -a and friends
        // fall back to chmod instead of believing the mode was set.
        if matches!(
            name.as_bytes(),
            b"system.posix_acl_access" | b"system.posix_acl_default"
        ) {
            reply.error(Errno::from_i32(libc::EOPNOTSUPP));
            return;
        }
        let n = tryr!(reply, self.node(ino));
        self.set_caps_absent(ino.0, None);
        tryr!(reply, self.dfs.setxattr(&n, name.as_bytes(), value, flags));
        self.rewritten(&n);
        if let Ok(n) = self.dfs.refresh(&n) {
            self.update(&n);
        }
        reply.ok();
    }

    fn getxattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, size: u32, reply: ReplyXattr) {
        let caps = name.as_bytes() == caps::CAPS_XATTR;
        if caps && self.caps_absent(ino.0) {
            reply.error(Errno::from_i32(libc::ENODATA));
            return;
        }
        let n = tryr!(reply, self.node(ino));
        let asked = Instant::now();
        let v = match self.dfs.getxattr(&n, name.as_bytes()) {
            Ok(v) => v,
            Err(e) => {
                if caps && e.code == -libc::ENODATA {
                    self.set_caps_absent(ino.0, Some(asked));
                }
                reply.error(errno(&e));
                return;
            }
        };
        if size == 0 {
            reply.size(v.len() as u32);
        } else if (size as usize) < v.len() {
            reply.error(Errno::from_i32(libc::ERANGE));
        } else {
            reply.data(&v);
        }
    }

    fn listxattr(&self, _req: &Request, ino: INodeNo, size: u32, reply: ReplyXattr) {
        let n = tryr!(reply, self.node(ino));
        let names = tryr!(reply, self.dfs.listxattr(&n));
        let mut buf = Vec::new();
        for x in names {
            buf.extend_from_slice(&x);
            buf.push(0);
        }
        if size == 0 {
            reply.size(buf.len() as u32);
        } else if (size as usize) < buf.len() {
            reply.error(Errno::from_i32(libc::ERANGE));
        } else {
            reply.data(&buf);
        }
    }

    fn removexattr(&self, _req: &Request, ino: INodeNo, name: &OsStr, reply: ReplyEmpty) {
        let n = tryr!(reply, self.node(ino));
        self.set_caps_absent(ino.0, None);
        tryr!(reply, self.dfs.removexattr(&n, name.as_bytes()));
        self.rewritten(&n);
        if let Ok(n) = self.dfs.refresh(&n) {
            self.update(&n);
        }
        reply.ok();
    }

    fn ioctl(
        &self,
        _req: &Request,
        _ino: INodeNo,
        fh: FileHandle,
        _flags: IoctlFlags,
        cmd: u32,
        _in_data: &[u8],
        out_size: u32,
        reply: ReplyIoctl,
    ) {
        if cmd == PEREGRINE_IOC_INVALIDATE {
            let h = tryr!(reply, self.handle(fh));
            let Handle::File { ino, file, .. } = &*h else {
                reply.error(Errno::from_i32(libc::ENOTTY));
                return;
            };
            tryr!(reply, self.invalidate(*ino, file));
            reply.ioctl(0, &[]);
            return;
        }
        if cmd == peregrine::dirs_changed::IOC_INVALIDATE_DIRS {
            // On any open file or directory of the mount.
            let Some(dirs) = peregrine::dirs_changed::decode(_in_data) else {
                reply.error(Errno::from_i32(libc::EINVAL));
                return;
            };
            for dir in dirs {
                tryr!(reply, self.dir_changed_elsewhere(dir));
            }
            reply.ioctl(0, &[]);
            return;
        }
        if cmd == peregrine::handoff::IOC_GET_CONT {
            // The interception library's control-port-free open (ctl.rs).
            match self.descriptions.get_cont(&self.dfs, _in_data, out_size) {
                Ok(b) => reply.ioctl(0, &b),
                Err(e) => reply.error(Errno::from_i32(e)),
            }
            return;
        }
        if cmd != PEREGRINE_IOC_GET_HANDLE {
            reply.error(Errno::from_i32(libc::ENOTTY));
            return;
        }
        let h = tryr!(reply, self.handle(fh));
        if (out_size as usize) < HANDLE_SIZE {
            reply.error(Errno::from_i32(libc::EINVAL));
            return;
        }
        let b = match &*h {
            Handle::File { file, .. } => self.handle_bytes(file.oid(), file.chunk_size(), 0),
            // The interception library learns the container from the
            // mount's root, without a file to find first.
            Handle::Dir(_) => {
                let n = tryr!(reply, self.node(_ino));
                self.handle_bytes(n.oid(), 0, HANDLE_FLAG_DIR)
            }
        };
        reply.ioctl(0, &b);
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        let n = tryr!(reply, self.node(ino));
        tryr!(reply, self.dfs.fallocate(&n, mode, offset, length));
        reply.ok();
    }
}
