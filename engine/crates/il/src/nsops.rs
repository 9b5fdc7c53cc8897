//! Namespace changes by path served through the POSIX layer: mkdir,
//! unlink, rmdir and rename (with their `at` forms), and `umask`, which
//! the library must know to create as the kernel would.
//!
//! Permission checks are the kernel's (write and search permission on the
//! parent, the sticky bit, write permission on a directory moved to
//! another parent); whatever the mode bits do not grant goes to the kernel
//! (capabilities). A file this process has open or mapped is removed or
//! replaced on the kernel path: the daemon then keeps its data until the
//! last close, as POSIX wants (the library would punch it at once).
//! When such a call goes to the kernel, the library's cache is dropped:
//! this process must see its own change at once.
//!
//! Removals (unlink, rmdir, the source of a rename) are served only for
//! names this process made through the library ([`BORN`]): the kernel
//! cannot hold a directory entry for a name it never saw, and a removal
//! behind the kernel's back of a name it holds would leave that entry
//! (up to the daemon's `--dentry-timeout`) pointing at the removed object,
//! so that a kernel-path open by that name in any process of the node
//! would open the removed file instead of creating a new one (the kernel
//! offers no way but the daemon to drop the entry, and the daemon has no
//! call for it). Likewise a rename onto an existing name goes to the
//! kernel. Names of other processes or made on the kernel path are
//! removed on the kernel path.

use crate::cache;
use crate::dirs_changed;
use crate::report::{meta_enabled, Busy, C};
use crate::stat::{answer, ino_of};
use crate::table::{guarded, FDS, MAPPED};
use crate::walk::{locate, lookup, lookup_identity, posix, w, walk_parent, Cred, Loc, W};
use libc::{c_char, c_int, c_uint};
use peregrine::sync::Mutex;
use peregrine::{Error, ObjectId};
use peregrine_dfs::Node;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

/// Names (directory object, name) this process made through the library
/// and the kernel has not been asked about since by this process.
/// Bounded: when full it starts over (those names then go to the kernel
/// path, which is always right).
type Names = HashMap<(ObjectId, Vec<u8>), Made>;
static BORN: Mutex<Option<Names>> = Mutex::new(None);
const BORN_MAX: usize = 1 << 16;

/// What this process knows of a name it made.
#[derive(Clone)]
struct Made {
    oid: ObjectId,
    /// The epoch of the entry's version its create wrote, and that entry,
    /// while nothing here is known to have rewritten it: its unlink then
    /// reads neither the cache nor the entry, and is conditional on that
    /// version ([`peregrine_dfs::Dfs::unlink_if_written_at`]). The node is
    /// the one the cache holds while it does (BORN_MAX of them at most).
    written_at: Option<(u64, Arc<Node>)>,
}

/// `n` was made through the library by this process; `written_at`: the
/// epoch of the entry's version it wrote, if it knows it.
pub(crate) fn born(n: &Arc<Node>, written_at: Option<u64>) {
    let mut g = BORN.lock();
    let m = g.get_or_insert_with(HashMap::new);
    if m.len() >= BORN_MAX {
        m.clear();
    }
    let made = Made {
        oid: n.oid(),
        written_at: written_at.map(|e| (e, n.clone())),
    };
    m.insert((n.parent, n.name.clone()), made);
}

/// This process rewrote the entry of `n` (its size and times): the
/// version its create wrote is gone.
pub(crate) fn rewritten(n: &Node) {
    if let Some(m) = BORN
        .lock()
        .as_mut()
        .and_then(|m| m.get_mut(&(n.parent, n.name.clone())))
    {
        m.written_at = None;
    }
}

/// Objects this process opened on the kernel path: the kernel knows
/// their names (bounded as [`BORN`]).
static SEEN: Mutex<Option<std::collections::HashSet<ObjectId>>> = Mutex::new(None);

/// Object `oid` was opened on the kernel path (track.rs).
pub(crate) fn kernel_knows(oid: ObjectId) {
    let mut g = SEEN.lock();
    let m = g.get_or_insert_with(Default::default);
    if m.len() >= BORN_MAX {
        m.clear();
        // Forgetting what the kernel knows would be wrong: forget what
        // was made here instead (its removals then go to the kernel).
        if let Some(b) = BORN.lock().as_mut() {
            b.clear();
        }
    }
    m.insert(oid);
}

/// Was `n` made here (and is it still that object), and not opened on
/// the kernel path since? What is known of it, if so.
fn born_here(n: &Node) -> Option<Made> {
    made_here(n.parent, &n.name).filter(|m| m.oid == n.oid())
}

/// What is known of the name `name` in `dir` if this process made it
/// and has not opened it on the kernel path since.
fn made_here(dir: ObjectId, name: &[u8]) -> Option<Made> {
    let made = BORN
        .lock()
        .as_ref()
        .and_then(|m| m.get(&(dir, name.to_vec())).cloned())?;
    let seen = SEEN.lock().as_ref().is_some_and(|s| s.contains(&made.oid));
    (!seen).then_some(made)
}

/// The kernel may know `n` from now on (opened on the kernel path).
pub(crate) fn unborn(parent: ObjectId, name: &[u8]) {
    if let Some(m) = BORN.lock().as_mut() {
        m.remove(&(parent, name.to_vec()));
    }
}

/// fork: hold the set across it.
pub(crate) fn hold_across_fork() {
    BORN.hold_across_fork();
    SEEN.hold_across_fork();
}

/// The process's umask (u32::MAX: not read yet).
static UMASK: AtomicU32 = AtomicU32::new(u32::MAX);

/// The process's umask: from /proc/self/status once, then from the
/// `umask` interposer (reading it with umask(2) would change it for a
/// moment under other threads).
pub(crate) fn current_umask() -> Option<u32> {
    let u = UMASK.load(Ordering::Relaxed);
    if u != u32::MAX {
        return Some(u);
    }
    let fd = crate::ns::sys_open(b"/proc/self/status", libc::O_RDONLY);
    if fd < 0 {
        return None;
    }
    let mut b = vec![0u8; 8192];
    // SAFETY: read into our buffer, close our fd.
    let n = unsafe {
        let n = libc::syscall(libc::SYS_read, fd, b.as_mut_ptr(), b.len());
        libc::syscall(libc::SYS_close, fd);
        n
    };
    if n <= 0 {
        return None;
    }
    b.truncate(n as usize);
    let line = b
        .split(|&c| c == b'\n')
        .find(|l| l.starts_with(b"Umask:"))?;
    let v = std::str::from_utf8(&line[6..]).ok()?.trim();
    let u = u32::from_str_radix(v, 8).ok()? & 0o777;
    UMASK.store(u, Ordering::Relaxed);
    Some(u)
}

#[no_mangle]
pub unsafe extern "C" fn umask(m: libc::mode_t) -> libc::mode_t {
    let old = crate::real::r_umask()(m);
    UMASK.store(m & 0o777, Ordering::Relaxed);
    old
}

/// The errno of a failed change through the POSIX layer: its own when it
/// is a POSIX answer, else EIO (the change may or may not have happened:
/// it cannot go to the kernel path now).
fn changed_err(e: &Error) -> c_int {
    let c = -e.code;
    if posix(c) {
        c
    } else {
        libc::EIO
    }
}

/// Is object `n` open or mapped in this process (a tracked descriptor,
/// or a file handed to the kernel path by mmap)? Its placeholders are
/// then made real files: the change goes to the kernel, and the daemon
/// keeps a removed file's data until the kernel's last close only for
/// opens it knows of (and a placeholder reopened by its path after a
/// rename would find another file).
fn open_here(loc: &Loc, n: &Node) -> bool {
    let oid = n.oid();
    let (a, b) = loc.ns.mnt.dev;
    let key = (a, b, ino_of(oid, loc.ns.root.oid()));
    if FDS.read().iter().flatten().any(|s| s.h.oid == oid) {
        crate::place::convert_key(key);
        return true;
    }
    MAPPED.lock().contains(&key)
}

/// May `cred` remove or replace `child` in `dir` (write and search on the
/// directory, and the sticky bit)? No: the kernel's to decide.
fn may_remove(cred: &Cred, dir: &Node, child: Option<&Node>) -> bool {
    if !cred.may(&dir.entry, 3) {
        return false;
    }
    match child {
        Some(c) if dir.entry.mode & libc::S_ISVTX != 0 => {
            cred.uid() == c.entry.uid || cred.uid() == dir.entry.uid
        }
        _ => true,
    }
}

/// A served change (that happened or may have) touched directories `dirs`
/// of `loc`'s mount: this process reads their entries again, and the
/// kernel learns of them before the next program runs (`dirs_changed.rs`).
pub(crate) fn dirs_touched(loc: &Loc, dirs: &[ObjectId]) {
    for d in dirs {
        cache::entry_changed(*d);
    }
    dirs_changed::changed(loc, dirs);
}

/// Run a served change: None (kernel path) unless the library is on and
/// the path is in a mount it serves.
unsafe fn serve(
    paths: &[(c_int, *const c_char)],
    c: C,
    f: impl FnOnce(&[Loc]) -> W<()>,
) -> Option<c_int> {
    if !meta_enabled() {
        return None;
    }
    let _b = Busy::enter()?;
    guarded(None, || {
        let mut locs = Vec::with_capacity(paths.len());
        for &(d, p) in paths {
            locs.push(locate(d, p)?);
        }
        let r = answer(f(&locs), c, |_| {});
        if r.is_none() {
            // The kernel makes the change: forget what it may touch.
            cache::clear();
        }
        r
    })
}

/// Before the kernel removes or renames a name: every live placeholder of
/// this process becomes a real file first. The name may be one of them
/// (through another name of a hard-linked file, or a path the library
/// could not place), and the daemon keeps a removed file's data for the
/// opens it knows of only.
fn before_kernel_removal() {
    crate::place::convert_all(true);
}

/// After a change on the kernel path that the library did not see
/// located (relative to a directory fd, outside a served mount): what it
/// changed may be cached.
pub(crate) fn after_kernel_change(r: c_int) -> c_int {
    if r == 0 {
        cache::clear();
    }
    r
}

/// After a change on the kernel path through descriptor `fd`: as
/// [`after_kernel_change`] if `fd` is in a Peregrine mount. Any other
/// file's change (a program's temporary file, the client's own
/// shared-memory segments, which it sizes with ftruncate) leaves the
/// cache alone.
pub(crate) fn after_kernel_change_on(fd: c_int, r: c_int) -> c_int {
    if r == 0 && crate::track::in_peregrine_mount(fd) {
        cache::clear();
    }
    r
}

unsafe fn mkdir_at(d: c_int, p: *const c_char, mode: libc::mode_t) -> Option<c_int> {
    serve(&[(d, p)], C::Mkdirs, |l| {
        let (loc, cred) = (&l[0], l[0].cred());
        let at = w!(walk_parent(loc, &cred));
        let (Some(name), Some(mask)) = (&at.name, current_umask()) else {
            return W::Fall;
        };
        let dir = at.dir();
        if !cred.may(&dir.entry, 3) || loc.ns.read_only() {
            return W::Fall;
        }
        let mode = mode & 0o1777 & !mask;
        let made = loc.ns.dfs.mkdir(dir, name, mode, cred.uid(), cred.gid());
        dirs_touched(loc, &[dir.oid()]);
        match made {
            Ok(n) => {
                let n = Arc::new(n);
                cache::put_dent(loc.ns.key(), n.clone());
                born(&n, None);
                W::Ok(())
            }
            Err(e) => W::Err(changed_err(&e)),
        }
    })
}

unsafe fn remove_at(d: c_int, p: *const c_char, dir_too: bool) -> Option<c_int> {
    let c = if dir_too { C::Rmdirs } else { C::Unlinks };
    serve(&[(d, p)], c, |l| {
        let (loc, cred) = (&l[0], l[0].cred());
        let at = w!(walk_parent(loc, &cred));
        let Some(name) = &at.name else {
            return W::Fall;
        };
        if loc.slash && !dir_too {
            return W::Fall;
        }
        let dir = at.dir();
        if !dir_too {
            if let Some(r) = remove_unread(loc, &cred, dir, name) {
                return r;
            }
        }
        // The store checks the entry again as it removes it.
        let Some(n) = w!(lookup_identity(&loc.ns, dir, name)) else {
            return W::Err(libc::ENOENT);
        };
        if !may_remove(&cred, dir, Some(&n)) || loc.ns.read_only() {
            return W::Fall;
        }
        let Some(made) = born_here(&n) else {
            return W::Fall;
        };
        let r = if dir_too {
            if !n.is_dir() {
                return W::Err(libc::ENOTDIR);
            }
            loc.ns.dfs.rmdir(dir, name)
        } else {
            if n.is_dir() {
                return W::Err(libc::EISDIR);
            }
            if open_here(loc, &n) {
                return W::Fall;
            }
            match made.written_at {
                Some((epoch, _)) => loc.ns.dfs.unlink_written_at(dir, &n, epoch),
                None => loc.ns.dfs.unlink(dir, name),
            }
        };
        removed(loc, dir, name, n.oid(), r)
    })
}

/// Unlink of a file this process made whose version it knows, without a
/// lookup (the cache's entry may have expired: a removal a second after
/// the create would read the entry first): the removal is conditional on
/// that version, so that another client's change since (a rewrite,
/// chmod, rename or replacement) leaves it undone. None: not such a
/// file, or not that version any more: the caller looks the name up.
fn remove_unread(loc: &Loc, cred: &Cred, dir: &Node, name: &[u8]) -> Option<W<()>> {
    let (epoch, n) = made_here(dir.oid(), name)?.written_at?;
    if !may_remove(cred, dir, Some(&n)) || loc.ns.read_only() || open_here(loc, &n) {
        return None;
    }
    let r = match loc.ns.dfs.unlink_if_written_at(dir, &n, epoch) {
        Ok(false) => return None,
        r => r.map(|_| ()),
    };
    Some(removed(loc, dir, name, n.oid(), r))
}

/// After a served removal of `name` (object `oid`) in `dir`, which
/// happened or may have: what this process knows of it goes.
fn removed(loc: &Loc, dir: &Node, name: &[u8], oid: ObjectId, r: peregrine::Result<()>) -> W<()> {
    dirs_touched(loc, &[dir.oid()]);
    cache::drop_dent(dir.oid(), name);
    cache::entry_changed(oid);
    unborn(dir.oid(), name);
    match r {
        Ok(()) => W::Ok(()),
        Err(e) => W::Err(changed_err(&e)),
    }
}

unsafe fn rename_at(
    od: c_int,
    op: *const c_char,
    nd: c_int,
    np: *const c_char,
    flags: c_uint,
) -> Option<c_int> {
    if flags & !(libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE) != 0 {
        return None;
    }
    serve(&[(od, op), (nd, np)], C::Renames, |l| {
        let (from, to, cred) = (&l[0], &l[1], l[0].cred());
        if !Arc::ptr_eq(&from.ns, &to.ns) || from.slash || to.slash {
            return W::Fall;
        }
        let ns = &from.ns;
        let a = w!(walk_parent(from, &cred));
        let b = w!(walk_parent(to, &cred));
        let (Some(sname), Some(dname)) = (&a.name, &b.name) else {
            return W::Fall;
        };
        let (sp, dp) = (a.dir(), b.dir());
        let Some(src) = w!(lookup(ns, sp, sname)) else {
            return W::Err(libc::ENOENT);
        };
        let dst = w!(lookup(ns, dp, dname));
        if dst.is_some() || born_here(&src).is_none() {
            // Replacing (or exchanging) a name the kernel may hold, or
            // moving one it may hold: the kernel's (see the module docs).
            return W::Fall;
        }
        if flags & libc::RENAME_EXCHANGE != 0 {
            return W::Err(libc::ENOENT); // nothing to exchange with
        }
        if !may_remove(&cred, sp, Some(&src))
            || !cred.may(&dp.entry, 3)
            || ns.read_only()
            || open_here(from, &src)
        {
            return W::Fall;
        }
        // A directory moved elsewhere has its `..` rewritten: write
        // permission on it.
        if src.is_dir() && sp.oid() != dp.oid() && !cred.may(&src.entry, 2) {
            return W::Fall;
        }
        // Into its own subtree: the walk of the destination passed it.
        if src.is_dir() && b.chain.iter().any(|n| n.oid() == src.oid()) {
            return W::Err(libc::EINVAL);
        }
        let r = ns.dfs.rename(sp, sname, dp, dname, flags);
        // A directory moved to another parent has a new `..`.
        let moved_dir = (src.is_dir() && sp.oid() != dp.oid()).then(|| src.oid());
        let dirs: Vec<ObjectId> = [sp.oid(), dp.oid()].into_iter().chain(moved_dir).collect();
        dirs_touched(from, &dirs);
        unborn(sp.oid(), sname);
        if r.is_ok() {
            let moved = Node {
                parent: dp.oid(),
                name: dname.clone(),
                entry: src.entry.clone(),
            };
            born(&Arc::new(moved), None);
        }
        cache::drop_dent(sp.oid(), sname);
        cache::drop_dent(dp.oid(), dname);
        cache::entry_changed(src.oid());
        match r {
            Ok(()) => W::Ok(()),
            Err(e) => W::Err(changed_err(&e)),
        }
    })
}

// ------------------------------------------------------------ interposers

#[no_mangle]
pub unsafe extern "C" fn mkdir(p: *const c_char, mode: libc::mode_t) -> c_int {
    if let Some(r) = mkdir_at(libc::AT_FDCWD, p, mode) {
        return r;
    }
    after_kernel_change(crate::real::r_mkdir()(p, mode))
}

#[no_mangle]
pub unsafe extern "C" fn mkdirat(d: c_int, p: *const c_char, mode: libc::mode_t) -> c_int {
    if let Some(r) = mkdir_at(d, p, mode) {
        return r;
    }
    after_kernel_change(crate::real::r_mkdirat()(d, p, mode))
}

#[no_mangle]
pub unsafe extern "C" fn unlink(p: *const c_char) -> c_int {
    if let Some(r) = remove_at(libc::AT_FDCWD, p, false) {
        return r;
    }
    before_kernel_removal();
    after_kernel_change(crate::real::r_unlink()(p))
}

#[no_mangle]
pub unsafe extern "C" fn rmdir(p: *const c_char) -> c_int {
    if let Some(r) = remove_at(libc::AT_FDCWD, p, true) {
        return r;
    }
    after_kernel_change(crate::real::r_rmdir()(p))
}

#[no_mangle]
pub unsafe extern "C" fn unlinkat(d: c_int, p: *const c_char, fl: c_int) -> c_int {
    if fl & !libc::AT_REMOVEDIR == 0 {
        if let Some(r) = remove_at(d, p, fl & libc::AT_REMOVEDIR != 0) {
            return r;
        }
    }
    before_kernel_removal();
    after_kernel_change(crate::real::r_unlinkat()(d, p, fl))
}

#[no_mangle]
pub unsafe extern "C" fn rename(o: *const c_char, n: *const c_char) -> c_int {
    if let Some(r) = rename_at(libc::AT_FDCWD, o, libc::AT_FDCWD, n, 0) {
        return r;
    }
    before_kernel_removal();
    after_kernel_change(crate::real::r_rename()(o, n))
}

#[no_mangle]
pub unsafe extern "C" fn renameat(
    od: c_int,
    o: *const c_char,
    nd: c_int,
    n: *const c_char,
) -> c_int {
    if let Some(r) = rename_at(od, o, nd, n, 0) {
        return r;
    }
    before_kernel_removal();
    after_kernel_change(crate::real::r_renameat()(od, o, nd, n))
}

#[no_mangle]
pub unsafe extern "C" fn renameat2(
    od: c_int,
    o: *const c_char,
    nd: c_int,
    n: *const c_char,
    fl: c_uint,
) -> c_int {
    if let Some(r) = rename_at(od, o, nd, n, fl) {
        return r;
    }
    before_kernel_removal();
    after_kernel_change(crate::real::r_renameat2()(od, o, nd, n, fl))
}

/// Calls the library does not serve that change what it caches (modes,
/// owners, times, sizes, names): the kernel makes them, the cache is
/// dropped after, so this process sees its own change at once.
macro_rules! clears_cache {
    ($name:ident, $real:ident, ($($a:ident : $t:ty),*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($($a: $t),*) -> c_int {
            after_kernel_change(crate::real::$real()($($a),*))
        }
    };
}
clears_cache!(chmod, r_chmod, (p: *const c_char, m: libc::mode_t));
/// Calls on a descriptor that change what is cached: a placeholder is
/// converted first (place.rs), then as [`clears_cache`].
macro_rules! fd_clears_cache {
    ($name:ident, $real:ident, ($fd:ident : c_int $(, $a:ident : $t:ty)*)) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name($fd: c_int $(, $a: $t)*) -> c_int {
            if crate::table::NTRACKED.load(Ordering::Relaxed) != 0 {
                if let Some(_b) = Busy::enter() {
                    let r = guarded(Err(libc::EIO), || crate::track::before_kernel_change_on($fd));
                    if let Err(e) = r {
                        crate::real::set_errno(e);
                        return -1;
                    }
                }
            }
            after_kernel_change_on($fd, crate::real::$real()($fd $(, $a)*))
        }
    };
}
fd_clears_cache!(fchmod, r_fchmod, (fd: c_int, m: libc::mode_t));
clears_cache!(fchmodat, r_fchmodat, (d: c_int, p: *const c_char, m: libc::mode_t, f: c_int));
clears_cache!(chown, r_chown, (p: *const c_char, u: libc::uid_t, g: libc::gid_t));
clears_cache!(lchown, r_lchown, (p: *const c_char, u: libc::uid_t, g: libc::gid_t));
fd_clears_cache!(fchown, r_fchown, (fd: c_int, u: libc::uid_t, g: libc::gid_t));
clears_cache!(fchownat, r_fchownat, (d: c_int, p: *const c_char, u: libc::uid_t, g: libc::gid_t, f: c_int));
clears_cache!(truncate, r_truncate, (p: *const c_char, l: libc::off_t));
clears_cache!(truncate64, r_truncate64, (p: *const c_char, l: libc::off_t));
/// utimensat with no path (or an empty one and AT_EMPTY_PATH) is futimens
/// of descriptor `d`.
#[no_mangle]
pub unsafe extern "C" fn utimensat(
    d: c_int,
    p: *const c_char,
    t: *const libc::timespec,
    f: c_int,
) -> c_int {
    if p.is_null() || (f & libc::AT_EMPTY_PATH != 0 && *p == 0) {
        return futimens(d, t);
    }
    after_kernel_change(crate::real::r_utimensat()(d, p, t, f))
}
fd_clears_cache!(futimens, r_futimens, (fd: c_int, t: *const libc::timespec));
clears_cache!(utimes, r_utimes, (p: *const c_char, t: *const libc::timeval));
clears_cache!(utime, r_utime, (p: *const c_char, t: *const libc::utimbuf));
clears_cache!(symlink, r_symlink, (t: *const c_char, p: *const c_char));
clears_cache!(symlinkat, r_symlinkat, (t: *const c_char, d: c_int, p: *const c_char));
clears_cache!(link, r_link, (a: *const c_char, b: *const c_char));
clears_cache!(linkat, r_linkat, (ad: c_int, a: *const c_char, bd: c_int, b: *const c_char, f: c_int));
clears_cache!(mknod, r_mknod, (p: *const c_char, m: libc::mode_t, d: libc::dev_t));
clears_cache!(mknodat, r_mknodat, (fd: c_int, p: *const c_char, m: libc::mode_t, d: libc::dev_t));
