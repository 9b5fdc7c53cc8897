//! stat by path (stat, lstat, fstatat, statx, the `__xstat` family) and
//! access (access, faccessat, euidaccess) on files of Peregrine mounts,
//! answered through the POSIX layer and the cache, with the attributes the
//! kernel would show for the same file through the mount (same st_dev,
//! inode numbers as the daemon's, link counts, block size).

use crate::cache;
use crate::report::{count, meta_enabled, Busy, C};
use crate::table::guarded;
use crate::walk::{locate, resolve, w, Cred, Loc, W};
use libc::{c_char, c_int, c_uint};
use peregrine::ObjectId;
use peregrine_dfs::{Node, Stat};

/// Inode number of an object as the daemon numbers it (peregrine-fuse
/// `ino_of`, crates/fuse/src/fs.rs: the root is 1, others a hash).
pub(crate) fn ino_of(oid: ObjectId, root: ObjectId) -> u64 {
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

/// The attributes of `n`, from the cache unless `force`.
pub(crate) fn attrs(ns: &crate::ns::Ns, n: &Node, force: bool) -> W<Stat> {
    if !force {
        if let Some(s) = cache::attr(ns.key(), n.oid()) {
            return W::Ok(s);
        }
    }
    match ns.dfs.stat_node(n) {
        Ok(s) => {
            cache::put_attr(ns.key(), &s);
            W::Ok(s)
        }
        Err(_) => W::Fall,
    }
}

/// The block size the kernel shows: FUSE keeps `1 << ilog2(blksize)` of
/// the daemon's (the chunk size clamped to 4 KiB..1 MiB).
fn blksize(chunk: u64) -> u64 {
    let b = chunk.clamp(4096, 1 << 20);
    1 << (63 - b.leading_zeros())
}

fn split_ns(t: i64) -> (i64, i64) {
    (t.div_euclid(1_000_000_000), t.rem_euclid(1_000_000_000))
}

/// What the caller wants filled.
#[derive(Clone, Copy)]
pub(crate) enum Out {
    Stat(*mut libc::stat),
    Statx(*mut libc::statx),
}

struct Got<'a> {
    loc: &'a Loc,
    st: Stat,
    /// The node is the mount's root.
    mount_root: bool,
}

unsafe fn fill(g: &Got, out: &Out) {
    fill_parts(&g.loc.ns, &g.st, g.mount_root, out)
}

/// Fill `out` with `st` as the kernel shows it through mount `ns`.
pub(crate) unsafe fn fill_parts(ns: &crate::ns::Ns, st: &Stat, mount_root: bool, out: &Out) {
    let ino = ino_of(st.oid, ns.root.oid());
    let (dmaj, dmin) = ns.mnt.dev;
    let (a, m, c) = (split_ns(st.atime), split_ns(st.mtime), split_ns(st.ctime));
    match *out {
        Out::Stat(p) => {
            let mut s: libc::stat = std::mem::zeroed();
            s.st_dev = libc::makedev(dmaj, dmin);
            s.st_ino = ino;
            s.st_nlink = st.nlink as _;
            s.st_mode = st.mode;
            s.st_uid = st.uid;
            s.st_gid = st.gid;
            s.st_rdev = st.rdev;
            s.st_size = st.size as i64;
            s.st_blksize = blksize(st.chunk_size) as _;
            s.st_blocks = st.blocks as i64;
            (s.st_atime, s.st_atime_nsec) = (a.0, a.1);
            (s.st_mtime, s.st_mtime_nsec) = (m.0, m.1);
            (s.st_ctime, s.st_ctime_nsec) = (c.0, c.1);
            *p = s;
        }
        Out::Statx(p) => {
            let mut s: libc::statx = std::mem::zeroed();
            s.stx_mask = libc::STATX_BASIC_STATS | libc::STATX_MNT_ID;
            s.stx_blksize = blksize(st.chunk_size) as u32;
            // What the kernel always declares it knows (vfs_getattr_nosec, vfs_statx).
            s.stx_attributes_mask = (libc::STATX_ATTR_AUTOMOUNT
                | libc::STATX_ATTR_MOUNT_ROOT
                | libc::STATX_ATTR_DAX) as u64;
            if mount_root {
                s.stx_attributes = libc::STATX_ATTR_MOUNT_ROOT as u64;
            }
            s.stx_nlink = st.nlink;
            s.stx_uid = st.uid;
            s.stx_gid = st.gid;
            s.stx_mode = st.mode as u16;
            s.stx_ino = ino;
            s.stx_size = st.size;
            s.stx_blocks = st.blocks;
            s.stx_atime.tv_sec = a.0;
            s.stx_atime.tv_nsec = a.1 as u32;
            s.stx_mtime.tv_sec = m.0;
            s.stx_mtime.tv_nsec = m.1 as u32;
            s.stx_ctime.tv_sec = c.0;
            s.stx_ctime.tv_nsec = c.1 as u32;
            s.stx_rdev_major = libc::major(st.rdev);
            s.stx_rdev_minor = libc::minor(st.rdev);
            s.stx_dev_major = dmaj;
            s.stx_dev_minor = dmin;
            s.stx_mnt_id = ns.mnt.id;
            *p = s;
        }
    }
}

/// stat of `path` relative to `dirfd`: None to use the kernel path, else
/// the call's return value (errno set).
pub(crate) unsafe fn stat_at(
    dirfd: c_int,
    path: *const c_char,
    follow: bool,
    force: bool,
    out: Out,
) -> Option<c_int> {
    if !meta_enabled() {
        return None;
    }
    let _b = Busy::enter()?;
    guarded(None, || {
        let loc = locate(dirfd, path)?;
        let r = (|| {
            let cred = loc.cred();
            let (at, node) = w!(resolve(&loc, follow, &cred));
            let st = w!(attrs(&loc.ns, &node, force));
            let mount_root = at.name.is_none() && at.chain.len() == 1;
            W::Ok(Got {
                loc: &loc,
                st,
                mount_root,
            })
        })();
        answer(r, C::PathStats, |g| fill(g, &out))
    })
}

/// The return value of a served call, or None (counted as a fallback).
pub(crate) fn answer<T>(r: W<T>, c: C, done: impl FnOnce(&T)) -> Option<c_int> {
    match r {
        W::Fall => {
            count(C::PathFallbacks, 1);
            None
        }
        W::Err(e) => {
            count(c, 1);
            crate::real::set_errno(e);
            Some(-1)
        }
        W::Ok(v) => {
            count(c, 1);
            done(&v);
            Some(0)
        }
    }
}

/// access/faccessat: `mode` F_OK or R_OK|W_OK|X_OK; `eff`: AT_EACCESS.
pub(crate) unsafe fn access_at(
    dirfd: c_int,
    path: *const c_char,
    mode: c_int,
    flags: c_int,
) -> Option<c_int> {
    if !meta_enabled() || flags & !(libc::AT_EACCESS | libc::AT_SYMLINK_NOFOLLOW) != 0 {
        return None;
    }
    if mode & !(libc::R_OK | libc::W_OK | libc::X_OK) != 0 {
        return None; // EINVAL: the kernel's to say
    }
    let _b = Busy::enter()?;
    guarded(None, || {
        let loc = locate(dirfd, path)?;
        let r = (|| {
            // access(2) checks with the real ids, AT_EACCESS the effective.
            let cred = if flags & libc::AT_EACCESS != 0 {
                loc.cred()
            } else {
                Cred::real()
            };
            let follow = flags & libc::AT_SYMLINK_NOFOLLOW == 0;
            let (_, node) = w!(resolve(&loc, follow, &cred));
            if mode == libc::F_OK {
                return W::Ok(());
            }
            if mode & libc::W_OK != 0 && loc.ns.read_only() && !node.entry.is_special() {
                return W::Err(libc::EROFS);
            }
            if cred.may(&node.entry, mode as u32) {
                W::Ok(())
            } else {
                W::Fall
            }
        })();
        answer(r, C::PathAccess, |_| {})
    })
}

// ------------------------------------------------------------ interposers

macro_rules! stat_like {
    ($name:ident, $real:ident, $follow:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(p: *const c_char, st: *mut libc::stat) -> c_int {
            if let Some(r) = stat_at(libc::AT_FDCWD, p, $follow, false, Out::Stat(st)) {
                return r;
            }
            crate::real::$real()(p, st)
        }
    };
}
stat_like!(stat, r_stat, true);
stat_like!(stat64, r_stat64, true);
stat_like!(lstat, r_lstat, false);
stat_like!(lstat64, r_lstat64, false);

macro_rules! xstat_like {
    ($name:ident, $real:ident, $follow:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(v: c_int, p: *const c_char, st: *mut libc::stat) -> c_int {
            if let Some(r) = stat_at(libc::AT_FDCWD, p, $follow, false, Out::Stat(st)) {
                return r;
            }
            crate::real::$real()(v, p, st)
        }
    };
}
xstat_like!(__xstat, r_xstat, true);
xstat_like!(__xstat64, r_xstat64, true);
xstat_like!(__lxstat, r_lxstat, false);
xstat_like!(__lxstat64, r_lxstat64, false);

/// fstatat's flags the library serves (AT_EMPTY_PATH with a path is the
/// path; with "" it is fstat, which the descriptor interposers serve).
fn at_flags_ok(flags: c_int) -> bool {
    flags & !(libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT | libc::AT_EMPTY_PATH) == 0
}

/// fstatat/statx with AT_EMPTY_PATH and "": the descriptor's own
/// attributes; served for placeholders (tracked non-placeholders: the
/// kernel's, as before).
unsafe fn empty_path(d: c_int, p: *const c_char, fl: c_int, out: Out) -> Option<c_int> {
    if fl & libc::AT_EMPTY_PATH == 0 || p.is_null() || *p != 0 {
        return None;
    }
    let (_b, s) = crate::table::tracked(d)?;
    let ph = crate::place::of(&s)?;
    Some(guarded(-1, || crate::place::fstat_into(&s, ph, out)))
}

macro_rules! fstatat_like {
    ($name:ident, $real:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            d: c_int,
            p: *const c_char,
            st: *mut libc::stat,
            fl: c_int,
        ) -> c_int {
            if let Some(r) = empty_path(d, p, fl, Out::Stat(st)) {
                return r;
            }
            if at_flags_ok(fl) && !p.is_null() && *p != 0 {
                let follow = fl & libc::AT_SYMLINK_NOFOLLOW == 0;
                if let Some(r) = stat_at(d, p, follow, false, Out::Stat(st)) {
                    return r;
                }
            }
            crate::real::$real()(d, p, st, fl)
        }
    };
}
fstatat_like!(fstatat, r_fstatat);
fstatat_like!(fstatat64, r_fstatat64);

macro_rules! fxstatat_like {
    ($name:ident, $real:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            v: c_int,
            d: c_int,
            p: *const c_char,
            st: *mut libc::stat,
            fl: c_int,
        ) -> c_int {
            if let Some(r) = empty_path(d, p, fl, Out::Stat(st)) {
                return r;
            }
            if at_flags_ok(fl) && !p.is_null() && *p != 0 {
                let follow = fl & libc::AT_SYMLINK_NOFOLLOW == 0;
                if let Some(r) = stat_at(d, p, follow, false, Out::Stat(st)) {
                    return r;
                }
            }
            crate::real::$real()(v, d, p, st, fl)
        }
    };
}
fxstatat_like!(__fxstatat, r_fxstatat);
fxstatat_like!(__fxstatat64, r_fxstatat64);

#[no_mangle]
pub unsafe extern "C" fn statx(
    d: c_int,
    p: *const c_char,
    fl: c_int,
    mask: c_uint,
    sx: *mut libc::statx,
) -> c_int {
    if let Some(r) = empty_path(d, p, fl, Out::Statx(sx)) {
        return r;
    }
    let sync = libc::AT_STATX_FORCE_SYNC | libc::AT_STATX_DONT_SYNC;
    if at_flags_ok(fl & !sync) && fl & sync != sync && !p.is_null() && *p != 0 {
        let follow = fl & libc::AT_SYMLINK_NOFOLLOW == 0;
        let force = fl & libc::AT_STATX_FORCE_SYNC != 0;
        if let Some(r) = stat_at(d, p, follow, force, Out::Statx(sx)) {
            return r;
        }
    }
    crate::real::r_statx()(d, p, fl, mask, sx)
}

#[no_mangle]
pub unsafe extern "C" fn access(p: *const c_char, mode: c_int) -> c_int {
    if let Some(r) = access_at(libc::AT_FDCWD, p, mode, 0) {
        return r;
    }
    crate::real::r_access()(p, mode)
}

#[no_mangle]
pub unsafe extern "C" fn faccessat(d: c_int, p: *const c_char, mode: c_int, fl: c_int) -> c_int {
    if let Some(r) = access_at(d, p, mode, fl) {
        return r;
    }
    crate::real::r_faccessat()(d, p, mode, fl)
}

macro_rules! eaccess_like {
    ($name:ident, $real:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(p: *const c_char, mode: c_int) -> c_int {
            if let Some(r) = access_at(libc::AT_FDCWD, p, mode, libc::AT_EACCESS) {
                return r;
            }
            crate::real::$real()(p, mode)
        }
    };
}
eaccess_like!(euidaccess, r_euidaccess);
eaccess_like!(eaccess, r_eaccess);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kernel_block_size_and_times() {
        assert_eq!(blksize(1 << 20), 1 << 20);
        assert_eq!(blksize(8 << 20), 1 << 20);
        assert_eq!(blksize(1000), 4096);
        assert_eq!(blksize(3 << 16), 1 << 17);
        assert_eq!(split_ns(-1), (-1, 999_999_999));
        assert_eq!(split_ns(1_500_000_000), (1, 500_000_000));
        let root = ObjectId { hi: 5, lo: 1 };
        assert_eq!(ino_of(root, root), 1);
        assert!(ino_of(ObjectId { hi: 5, lo: 2 }, root) > 1);
    }
}
