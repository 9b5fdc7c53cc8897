//! Opens served by the library: open/openat/creat (and `__open_2` & co.)
//! of a regular file of a Peregrine mount through the POSIX layer, with no
//! kernel or daemon involved: files this open creates write-only (O_CREAT
//! on a free name), and existing files opened read-only. Writes to
//! an existing file go to the kernel (then tracked as before): the kernel
//! may hold its pages and attributes, which only the daemon can drop
//! (`PEREGRINE_IOC_INVALIDATE` on a kernel fd), while a file made by the
//! library is unknown to the kernel and one only read changes nothing.
//!
//! The program gets a real descriptor number: a *placeholder*, an
//! anonymous memory file (`memfd_create`) that the library tracks like
//! any other descriptor and serves wholly (reads, writes, seeks, fstat,
//! statx, close...). A file created for writing gets a memfd of its own:
//! the kernel then keeps the file offset in the open file description, as
//! for a real file (see "the kernel's offset is the offset" in the crate
//! docs), and bytes written to it around the library can be moved into
//! the file (stray.rs). A file opened for reading gets a dup of one
//! read-only, sealed memfd that all of them share ([`template`]): making
//! and closing a memfd costs 5-9 us on these VMs, more than the rest of an
//! open, read and close of a small file through the library, and a dup
//! 0.4 us. Its offset is then the placeholder's own ([`own_offset`],
//! moved under the description's `io` lock, shared by its dups as the
//! kernel's would be); a fork or exec converts it first (below), so no
//! other process shares it. Calls around the library read end of file
//! from it and cannot write it (EBADF), as with a real read-only file.
//!
//! Whatever the library does not serve itself is asked of the real file:
//! before exec (execve & co., posix_spawn, system, popen), mmap, locks,
//! ioctl, fchmod, fchown, futimens, xattrs, fstatfs, fallocate, splice,
//! the placeholder is *converted*: the file is opened through the mount
//! by its path, moved to the placeholder's offset and dup'ed onto every
//! descriptor number that shares the placeholder, and from then on it is
//! an ordinary tracked descriptor (see [`to_kernel`]). What is not
//! intercepted at all sees the memfd (documented in the crate docs).

use crate::cache;
use crate::data_cache::{Change, Image};
use crate::handle::{Handle, IOC_INVALIDATE};
use crate::nsops::{born, current_umask, rewritten, unborn};
use crate::real::{ioctl_raw, r_fcntl, r_lseek, set_errno};
use crate::report::{count, meta_enabled, note_failure, Busy, C};
use crate::stat::ino_of;
use crate::table::{err_of, guarded, insert, Shared, FDS, MAPPED};
use crate::walk::{locate_open, lookup, posix, w, walk_parent, W};
use libc::{c_char, c_int};
use peregrine::sync::Mutex;
use peregrine_dfs::{now_ns, File, Node, Stat, DIR_TIME_TICK_NS};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicI64, Ordering};
use std::sync::Arc;

/// What a placeholder stands for.
pub(crate) struct Placeholder {
    pub(crate) dev: (u32, u32),
    /// The file as opened (or created).
    pub(crate) node: Node,
    /// The absolute path it was opened by: the kernel opens it by this
    /// path when it is converted.
    pub(crate) path: Vec<u8>,
    /// open(2) flags (F_GETFL, and the conversion's open).
    pub(crate) flags: c_int,
    /// Made by this open: its entry's mtime is the open's time.
    pub(crate) created: bool,
    /// Converted: an ordinary tracked descriptor now.
    pub(crate) converted: AtomicBool,
    /// The bytes written through it, while they are all the file holds
    /// (made by this open, small, no one else's change: data_cache.rs).
    image: Mutex<Option<Image>>,
    /// Opened for reading: the file offset, which the shared memfd behind
    /// the descriptor cannot keep ([`template`]). None: the memfd's own.
    offset: Option<AtomicI64>,
}

impl Placeholder {
    pub(crate) fn live(&self) -> bool {
        !self.converted.load(Ordering::Acquire)
    }

    /// The file's bytes, if this process wrote them lately (data_cache.rs).
    pub(crate) fn cached_bytes(&self) -> Option<Arc<[u8]>> {
        crate::data_cache::get(crate::ns::dev_key(self.dev), self.node.oid())
    }

    /// A write through this placeholder of `data` (`None`: it failed) at
    /// `off`, between the changes `before` and `after`.
    pub(crate) fn wrote(&self, before: Change, after: Change, off: u64, data: Option<&[u8]>) {
        let mut g = self.image.lock();
        let kept = match (g.as_mut(), data) {
            (Some(img), Some(d)) => img.wrote(before, after, off, d),
            _ => false,
        };
        if !kept {
            *g = None;
        }
    }
}

/// The live placeholder behind a tracked descriptor, if it is one.
pub(crate) fn of(s: &Shared) -> Option<&Placeholder> {
    s.ph.as_deref().filter(|p| p.live())
}

/// The file offset of a live read-only placeholder, which the library
/// keeps (None: the kernel's offset of the descriptor is the offset). The
/// caller holds `s.io`, under which a placeholder is converted.
pub(crate) fn own_offset(s: &Shared) -> Option<&AtomicI64> {
    of(s).and_then(|p| p.offset.as_ref())
}

/// The memfd every read-only placeholder is a dup of (-1: none yet, or
/// the program closed it).
static TEMPLATE: AtomicI32 = AtomicI32::new(-1);

/// The shared memfd of read-only placeholders: empty, sealed against
/// growth and writes, open read-only where /proc allows (so writes around
/// the library fail with EBADF, as on a read-only file), close-on-exec,
/// and kept at descriptor 700 or above, out of the program's way.
fn template() -> c_int {
    let t = TEMPLATE.load(Ordering::Acquire);
    if t >= 0 {
        return t;
    }
    // SAFETY: memfd_create with a static name; fcntl, openat and close on
    // our own descriptors with raw system calls or the real functions.
    let made = unsafe {
        let m = libc::memfd_create(
            c"peregrine-il".as_ptr(),
            libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING,
        );
        if m < 0 {
            return -1;
        }
        let seals =
            libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;
        r_fcntl()(m, libc::F_ADD_SEALS, seals as libc::c_ulong);
        let path = format!("/proc/self/fd/{m}\0");
        let ro = libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            path.as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
        ) as c_int;
        let src = if ro >= 0 {
            libc::syscall(libc::SYS_close, m);
            ro
        } else {
            m
        };
        let hi = r_fcntl()(src, libc::F_DUPFD_CLOEXEC, 700);
        if hi >= 0 {
            libc::syscall(libc::SYS_close, src);
            hi
        } else {
            src
        }
    };
    match TEMPLATE.compare_exchange(-1, made, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => made,
        Err(other) => {
            // SAFETY: ours, made just now; another thread's is kept.
            unsafe { libc::syscall(libc::SYS_close, made) };
            other
        }
    }
}

/// The program closes descriptor `fd`, or dup2s onto it: if it is the
/// template's, a new one is made on the next read-only open.
pub(crate) fn fd_taken(fd: c_int) {
    if fd >= 0 && TEMPLATE.load(Ordering::Relaxed) == fd {
        let _ = TEMPLATE.compare_exchange(fd, -1, Ordering::AcqRel, Ordering::Relaxed);
    }
}

/// A new descriptor for a placeholder opened with `flags` (-1 and errno
/// if none can be made): the lowest free number, as open(2) gives.
fn placeholder_fd(flags: c_int) -> c_int {
    let cloexec = flags & libc::O_CLOEXEC != 0;
    if flags & libc::O_ACCMODE != libc::O_RDONLY {
        let mfd = if cloexec { libc::MFD_CLOEXEC } else { 0 };
        // SAFETY: memfd_create with a static name.
        return unsafe { libc::memfd_create(c"peregrine-il".as_ptr(), mfd) };
    }
    let cmd = if cloexec {
        libc::F_DUPFD_CLOEXEC
    } else {
        libc::F_DUPFD
    };
    for _ in 0..2 {
        let t = template();
        if t < 0 {
            return -1;
        }
        // SAFETY: the real fcntl on our own descriptor.
        let fd = unsafe { r_fcntl()(t, cmd, 0) };
        if fd >= 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::EBADF) {
            return fd;
        }
        // Closed behind our back (close_range, closefrom): make another.
        let _ = TEMPLATE.compare_exchange(t, -1, Ordering::AcqRel, Ordering::Relaxed);
    }
    -1
}

const FLAGS_SERVED: c_int = libc::O_ACCMODE
    | libc::O_CREAT
    | libc::O_EXCL
    | libc::O_TRUNC
    | libc::O_APPEND
    | libc::O_CLOEXEC
    | libc::O_NOCTTY
    | libc::O_LARGEFILE
    | libc::O_NOFOLLOW
    | libc::O_NONBLOCK
    | libc::O_NOATIME
    | libc::O_DSYNC
    | libc::O_SYNC
    | libc::O_DIRECT;

fn changed_err(e: &peregrine::Error) -> c_int {
    let c = -e.code;
    if posix(c) {
        c
    } else {
        libc::EIO
    }
}

/// open of `path` relative to `dirfd`: None to use the kernel path, else
/// the call's return value (a placeholder, or -1 with errno).
pub(crate) unsafe fn open_at(
    dirfd: c_int,
    path: *const c_char,
    flags: c_int,
    mode: libc::mode_t,
) -> Option<c_int> {
    let acc = flags & libc::O_ACCMODE;
    if !meta_enabled()
        || flags & !FLAGS_SERVED != 0
        || acc == libc::O_ACCMODE
        || (flags & libc::O_TRUNC != 0 && acc == libc::O_RDONLY)
        // Read-write opens go to the kernel, created or not (below).
        || acc == libc::O_RDWR
    {
        return None;
    }
    let _b = Busy::enter()?;
    guarded(None, || {
        let loc = locate_open(dirfd, path)?;
        let ns = loc.ns.clone();
        let r = (|| -> W<(Arc<Node>, bool)> {
            let cred = loc.cred();
            let at = w!(walk_parent(&loc, &cred));
            let Some(name) = &at.name else {
                return W::Fall;
            };
            if loc.slash {
                return W::Fall;
            }
            let dir = at.dir();
            // A write-only create of a name not cached inserts at once:
            // the insert is conditional on the name being free, so a new
            // file costs one round trip, not a lookup and an insert.
            let cached = cache::dent(ns.key(), dir.oid(), name);
            let found = if cached.is_some() || flags & libc::O_CREAT == 0 {
                w!(lookup(&ns, dir, name))
            } else {
                None
            };
            match found {
                Some(n) => {
                    if flags & libc::O_CREAT != 0 && flags & libc::O_EXCL != 0 {
                        return W::Err(libc::EEXIST);
                    }
                    // Existing files are served for reading only: writes
                    // to a file the kernel may cache (pages, attributes)
                    // must reach it through an fd of the kernel's (the
                    // daemon's invalidation), which a tracked kernel open
                    // has.
                    let key = (ns.mnt.dev.0, ns.mnt.dev.1, ino_of(n.oid(), ns.root.oid()));
                    if acc != libc::O_RDONLY
                        || !n.entry.is_file()
                        || !cred.may(&n.entry, 4)
                        || MAPPED.lock().contains(&key)
                    {
                        return W::Fall;
                    }
                    W::Ok((n, false))
                }
                None if flags & libc::O_CREAT == 0 => W::Err(libc::ENOENT),
                // (Read-write creates go to the kernel: with two sqlite3
                // processes writing one WAL database at once, runs where
                // both the -wal and -shm files were made through
                // placeholders lost a transaction about one time in two
                // (il.rs, mmap_is_coherent_with_the_library); not
                // understood yet, so not served.)
                None => {
                    let Some(mask) = current_umask() else {
                        return W::Fall;
                    };
                    if !cred.may(&dir.entry, 3) || ns.read_only() {
                        return W::Fall;
                    }
                    let mode = mode & 0o7777 & !mask;
                    let made =
                        ns.dfs
                            .create_versioned(dir, name, mode, cred.uid(), cred.gid(), true);
                    crate::nsops::dirs_touched(&loc, &[dir.oid()]);
                    match made {
                        Ok((n, written_at)) => {
                            let n = Arc::new(n);
                            cache::put_dent(ns.key(), n.clone());
                            born(&n, written_at);
                            W::Ok((n, true))
                        }
                        // There already (not looked up), or made by someone
                        // else meanwhile: without O_EXCL the kernel opens it
                        // (existing files are written on the kernel path).
                        Err(e) if -e.code == libc::EEXIST && flags & libc::O_EXCL == 0 => W::Fall,
                        Err(e) => W::Err(changed_err(&e)),
                    }
                }
            }
        })();
        let (node, created) = match r {
            W::Fall => {
                count(C::PathFallbacks, 1);
                return None;
            }
            W::Err(e) => {
                count(C::PathOpens, 1);
                set_errno(e);
                return Some(-1);
            }
            W::Ok(v) => v,
        };
        count(
            if created {
                C::PathCreates
            } else {
                C::PathOpens
            },
            1,
        );
        // Also an open whose data the library serves, as tracked ones.
        count(C::Opens, 1);
        let abs = loc.abs().to_vec();
        Some(make(&ns, Arc::unwrap_or_clone(node), created, abs, flags))
    })
}

/// A placeholder descriptor for `node` (-1 and errno if none can be made).
fn make(ns: &crate::ns::Ns, node: Node, created: bool, path: Vec<u8>, flags: c_int) -> c_int {
    let fd = placeholder_fd(flags);
    if fd < 0 {
        return -1;
    }
    let oid = node.oid();
    let h = Handle {
        pool: ns.h.pool,
        cont: ns.h.cont,
        oid,
        chunk: node.entry.chunk_size,
        read_only: ns.h.read_only,
        mgmt: ns.h.mgmt.clone(),
    };
    let file = File::new(
        ns.dfs.container(),
        oid,
        node.entry.chunk_size,
        ns.read_only(),
    )
    .ok()
    .map(Arc::new);
    let acc = flags & libc::O_ACCMODE;
    let s = Shared {
        h,
        key: (ns.mnt.dev.0, ns.mnt.dev.1, ino_of(oid, ns.root.oid())),
        acc,
        append: AtomicBool::new(flags & libc::O_APPEND != 0),
        dirty: AtomicBool::new(false),
        retired: AtomicBool::new(false),
        sync: flags & libc::O_DSYNC != 0,
        io: Mutex::new(()),
        file: Mutex::new(file),
        ph: Some(Arc::new(Placeholder {
            dev: ns.mnt.dev,
            node,
            path: path.clone(),
            flags,
            created,
            converted: AtomicBool::new(false),
            image: Mutex::new(if created { Image::new_file() } else { None }),
            offset: (acc == libc::O_RDONLY).then(|| AtomicI64::new(0)),
        })),
    };
    if created {
        // Nothing written yet: a stat before the first write needs no
        // round trip.
        let st = ns.dfs.stat_of(&s.ph.as_ref().unwrap().node.entry, 0);
        cache::put_attr(ns.key(), &st);
    }
    if insert(fd, Arc::new(s)) {
        keep_off_std(fd);
        return fd;
    }
    // Mapped meanwhile by another thread: the file is the kernel's now.
    let mut c = path.clone();
    c.push(0);
    // SAFETY: our own memfd; a NUL-terminated path (raw system calls).
    unsafe {
        libc::syscall(libc::SYS_close, fd);
        let f = flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC);
        libc::syscall(libc::SYS_openat, libc::AT_FDCWD, c.as_ptr(), f, 0) as c_int
    }
}

/// The attributes of a placeholder's file: the size from the store (as
/// fstat of a tracked descriptor: processes sharing a file through the
/// library see each other's writes at once, which databases rely on; the
/// path cache's bound is for path calls only), the rest from its entry as
/// opened or last recorded here.
pub(crate) fn stat_of(s: &Shared, p: &Placeholder) -> Result<Stat, c_int> {
    let ns = crate::ns::by_dev(p.dev).ok_or(libc::EIO)?;
    let size = match crate::data_cache::get(ns.key(), p.node.oid()) {
        Some(b) => b.len() as u64,
        None => s.file().and_then(|f| f.size().map_err(|e| err_of(&e)))?,
    };
    let mut e = p.node.entry.clone();
    if let Some(st) = cache::attr(ns.key(), p.node.oid()) {
        (e.mtime, e.ctime) = (st.mtime, st.ctime);
    }
    let st = ns.dfs.stat_of(&e, size);
    cache::put_attr(ns.key(), &st);
    Ok(st)
}

/// fstat/statx of a placeholder into the caller's buffer.
pub(crate) unsafe fn fstat_into(s: &Shared, p: &Placeholder, out: crate::stat::Out) -> c_int {
    count(C::Stats, 1);
    let Some(ns) = crate::ns::by_dev(p.dev) else {
        set_errno(libc::EIO);
        return -1;
    };
    match stat_of(s, p) {
        Ok(st) => {
            crate::stat::fill_parts(&ns, &st, false, &out);
            0
        }
        Err(e) => {
            set_errno(e);
            -1
        }
    }
}

/// After writes through a placeholder (close, fsync, fstat): record the
/// size and mtime in the entry, as the daemon does when a written file is
/// closed; and keep the attributes in the cache. A file made by this open
/// and written within the clock tick it was made in keeps the mtime it
/// was made with (file times have that granularity, as Linux's coarse
/// clock: DIR_TIME_TICK_NS), which saves the entry's read and write.
pub(crate) fn record(s: &Shared, p: &Placeholder) {
    if !s.dirty.swap(false, Ordering::AcqRel) {
        return;
    }
    count(C::Invalidates, 1);
    let Some(ns) = crate::ns::by_dev(p.dev) else {
        return;
    };
    let Ok(f) = s.file() else { return };
    // Only files made by their open are written through placeholders:
    // their size is what this handle produced (writes, truncates).
    let size = f.cached_size();
    if let Some(img) = p.image.lock().as_ref().filter(|i| i.len() == size) {
        img.keep(ns.key(), p.node.oid());
    }
    let recent = p.created && now_ns() - p.node.entry.mtime < DIR_TIME_TICK_NS;
    let mut e = p.node.entry.clone();
    if !recent {
        // The cache gets the very time the entry got: stat after a chmod
        // (which drops the cache) must not see the mtime move back.
        e.mtime = match ns.dfs.touch_written(&p.node, size) {
            Ok(t) => t,
            Err(x) => {
                note_failure(format!("recording the mtime of a written file: {x}"));
                now_ns()
            }
        };
        e.ctime = e.mtime;
        cache::entry_changed(p.node.oid());
        rewritten(&p.node);
    }
    cache::put_attr(ns.key(), &ns.dfs.stat_of(&e, size));
}

/// F_GETFL of a placeholder: the flags it was opened with (the memfd's
/// are not the file's).
pub(crate) fn f_getfl(p: &Placeholder, s: &Shared) -> c_int {
    let mut fl = p.flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC | libc::O_NOCTTY);
    fl &= !libc::O_CLOEXEC;
    if s.append.load(Ordering::Relaxed) {
        fl |= libc::O_APPEND;
    } else {
        fl &= !libc::O_APPEND;
    }
    fl | libc::O_LARGEFILE
}

/// A placeholder on descriptor 0, 1 or 2 becomes the real file: glibc's
/// stdin, stdout and stderr streams use those descriptors with calls no
/// interposer sees (a shell's builtin `echo > f`, printf after `close(1)`
/// and an open), which would read or write the memfd (stray.rs).
pub(crate) fn keep_off_std(fd: c_int) {
    if fd > 2 {
        return;
    }
    if let Some(s) = crate::table::lookup(fd) {
        if let Err(e) = convert(&s) {
            note_failure(format!(
                "placeholder on descriptor {fd} to kernel: errno {e}"
            ));
        }
    }
}

/// Convert the placeholder behind `fd` (if it is one) into the real file
/// opened through the mount: every descriptor number sharing it then
/// refers to the kernel's open file, at the same offset, with its own
/// close-on-exec flag. Err(errno) if the file cannot be opened by its
/// path any more (renamed or removed since): the caller's call fails.
pub(crate) fn to_kernel(fd: c_int) -> Result<(), c_int> {
    let Some(s) = crate::table::lookup(fd) else {
        return Ok(());
    };
    convert(&s)
}

fn convert(s: &Arc<Shared>) -> Result<(), c_int> {
    let Some(p) = of(s) else { return Ok(()) };
    let _g = s.io.lock();
    if !p.live() {
        return Ok(());
    }
    let fds: Vec<c_int> = FDS
        .read()
        .iter()
        .enumerate()
        .filter(|(_, e)| e.as_ref().is_some_and(|x| Arc::ptr_eq(x, s)))
        .map(|(i, _)| i as c_int)
        .collect();
    let Some(&first) = fds.first() else {
        return Ok(());
    };
    crate::stray::adopt_locked(first, s);
    // Anything written through it (or moved in just now)? A shell's
    // redirection converts before the first write: nothing for the kernel
    // to drop then.
    let written = s.dirty.load(Ordering::Acquire) || s.file().is_ok_and(|f| f.cached_size() > 0);
    record(s, p);
    let flags = (p.flags & !(libc::O_CREAT | libc::O_EXCL | libc::O_TRUNC))
        | libc::O_CLOEXEC
        | libc::O_NOCTTY;
    let mut cpath = p.path.clone();
    cpath.push(0);
    let want_ino = s.key.2;
    let kopen = || {
        // SAFETY: NUL-terminated path; the raw system call: no interposer.
        unsafe {
            libc::syscall(libc::SYS_openat, libc::AT_FDCWD, cpath.as_ptr(), flags, 0) as c_int
        }
    };
    let mut k = kopen();
    if k >= 0 && ino(k) != Some(want_ino) {
        // The kernel's entry for the name is older than the file (its
        // entry cache still names an object removed by the library):
        // an exclusive create makes the kernel look the name up again (it
        // exists, so nothing is made: EEXIST), then open again.
        // SAFETY: raw system calls on our own descriptors and path.
        unsafe {
            libc::syscall(libc::SYS_close, k);
            let x = libc::syscall(
                libc::SYS_openat,
                libc::AT_FDCWD,
                cpath.as_ptr(),
                libc::O_CREAT | libc::O_EXCL | libc::O_RDONLY | libc::O_CLOEXEC,
                0,
            ) as c_int;
            if x >= 0 {
                // Removed meanwhile and made again, empty, by us: undo.
                libc::syscall(libc::SYS_close, x);
                libc::syscall(libc::SYS_unlinkat, libc::AT_FDCWD, cpath.as_ptr(), 0);
                return Err(libc::ESTALE);
            }
        }
        k = kopen();
        if k >= 0 && ino(k) != Some(want_ino) {
            // SAFETY: our own descriptor.
            unsafe { libc::syscall(libc::SYS_close, k) };
            return Err(libc::ESTALE);
        }
    }
    if k < 0 {
        let e = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO);
        note_failure(format!(
            "placeholder to kernel: open {}: errno {e}",
            String::from_utf8_lossy(&p.path)
        ));
        return Err(e);
    }
    // SAFETY: real calls on descriptors of this process.
    unsafe {
        let off = match &p.offset {
            Some(o) => o.load(Ordering::Relaxed),
            None => r_lseek()(first, 0, libc::SEEK_CUR),
        };
        r_lseek()(k, off.max(0), libc::SEEK_SET);
        // The kernel may hold attributes or pages of the file from before
        // the library's writes. Only files made by their open are written
        // through placeholders; the daemon records an mtime as it
        // invalidates, which a file only read must keep (cp -a converts
        // its source to read the xattrs).
        if p.created && written {
            ioctl_raw(k, IOC_INVALIDATE, std::ptr::null_mut());
        }
        for &n in &fds {
            let cloexec = r_fcntl()(n, libc::F_GETFD, 0) & libc::FD_CLOEXEC != 0;
            libc::syscall(
                libc::SYS_dup3,
                k,
                n,
                if cloexec { libc::O_CLOEXEC } else { 0 },
            );
            if s.append.load(Ordering::Relaxed) {
                r_fcntl()(n, libc::F_SETFL, libc::O_APPEND as libc::c_ulong);
            }
        }
        libc::syscall(libc::SYS_close, k);
    }
    p.converted.store(true, Ordering::Release);
    // The kernel knows the name now.
    unborn(p.node.parent, &p.node.name);
    Ok(())
}

fn ino(fd: c_int) -> Option<u64> {
    // SAFETY: statx is plain integers, for which all zeroes is valid.
    let mut sx: libc::statx = unsafe { std::mem::zeroed() };
    // SAFETY: `fd` is the caller's descriptor, the empty path with AT_EMPTY_PATH
    // names it, and `sx` is a live local statx the kernel fills.
    let r = unsafe {
        libc::statx(
            fd,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_STATX_DONT_SYNC,
            libc::STATX_INO,
            &mut sx,
        )
    };
    (r == 0).then_some(sx.stx_ino)
}

/// Convert every live placeholder of file `key` (before the file is
/// mapped: it leaves the library's path for good, placeholders included).
pub(crate) fn convert_key(key: crate::table::Key) {
    let live: Vec<Arc<Shared>> = FDS
        .read()
        .iter()
        .flatten()
        .filter(|s| s.key == key && of(s).is_some())
        .cloned()
        .collect();
    for s in live {
        if let Err(e) = convert(&s) {
            note_failure(format!("placeholder to kernel before mmap: errno {e}"));
        }
    }
}

/// The pid of this process as the library last set up (at load, in a
/// forked child).
static PID: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

pub(crate) fn note_pid() {
    // SAFETY: getpid has no preconditions.
    PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
}

/// The descriptors of `fds` (the table) that are live placeholders.
pub(crate) fn live_placeholders(fds: &[Option<Arc<Shared>>]) -> Vec<(c_int, Arc<Shared>)> {
    fds.iter()
        .enumerate()
        .filter_map(|(i, e)| {
            e.as_ref()
                .filter(|s| of(s).is_some())
                .map(|s| (i as c_int, s.clone()))
        })
        .collect()
}

/// Before fork, exec or a spawn: convert every live placeholder (`all`),
/// or those an exec keeps (not close-on-exec). Not in the child of a
/// vfork (or of a clone without fork handlers), which shares the parent's
/// memory but not its descriptors: converting there would mark the
/// parent's placeholders converted while its descriptors stay memfds.
pub(crate) fn convert_all(all: bool) {
    if crate::table::NTRACKED.load(Ordering::Relaxed) == 0 || !meta_enabled() {
        return;
    }
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != PID.load(Ordering::Relaxed) {
        return;
    }
    let Some(_b) = Busy::enter() else { return };
    let live = live_placeholders(&FDS.read());
    for (fd, s) in live {
        // SAFETY: F_GETFD has no argument.
        let keep = unsafe { r_fcntl()(fd, libc::F_GETFD, 0) } & libc::FD_CLOEXEC == 0;
        if all || keep {
            let _ = guarded(Ok(()), || convert(&s));
        }
    }
}
