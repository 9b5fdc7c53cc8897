//! Directory listings through the POSIX layer: `opendir` of a directory in
//! a served mount stays the kernel's (a real `DIR`, so every call the
//! library does not interpose still works on it, and the kernel checked
//! the permissions), but `readdir` answers from the store, and every entry
//! it lists goes into the path-call cache, so the stats `ls -l` or `find`
//! make next are answered from it. The kernel's listing would ask the
//! daemon for the same entries, and their attributes too (READDIRPLUS).
//!
//! Offsets are the daemon's (fuse/src/fs/list.rs): "." 1, ".." 2, then the
//! store's cookie + 2, so `telldir`/`seekdir` values mean the same on
//! both paths. A listing reads the snapshot of names taken at its first
//! `readdir` (or `rewinddir`), as the daemon's directory handle does.

use crate::ns::Ns;
use crate::report::{count, meta_enabled, Busy, C};
use crate::stat::ino_of;
use crate::table::guarded;
use crate::walk::{locate, resolve, W};
use libc::{c_char, c_int, c_long, dirent64, DIR};
use peregrine::sync::Mutex;
use peregrine_dfs::{DirHandle, Node};
use std::collections::HashMap;

/// Entries read from the store per round (as the daemon).
const BATCH: usize = 128;
/// Offsets 1 and 2 are "." and "..".
const DOTS: u64 = 2;

/// One entry as `readdir` returns it.
#[derive(Clone)]
struct Dent {
    /// Its offset (telldir after it).
    off: u64,
    ino: u64,
    kind: u8,
    name: Vec<u8>,
}

struct Listing {
    /// The mount (its namespace is looked up again after a fork).
    dev: (u32, u32),
    dir: Node,
    /// The inode numbers of "." and "..".
    dots: [u64; 2],
    /// The snapshot of names, taken at the first read.
    handle: Option<DirHandle>,
    /// Entries read ahead: every entry after offset `ahead_from`, up to
    /// the last one.
    ahead: Vec<Dent>,
    ahead_from: u64,
    /// The offset of the last entry returned (telldir).
    pos: u64,
    /// What `readdir` returned last: valid until the next call on this DIR.
    ent: Box<dirent64>,
}

/// Served listings by `DIR` address.
static DIRS: Mutex<Option<HashMap<usize, Listing>>> = Mutex::new(None);

fn dtype(mode: u32) -> u8 {
    match mode & libc::S_IFMT {
        libc::S_IFDIR => libc::DT_DIR,
        libc::S_IFREG => libc::DT_REG,
        libc::S_IFLNK => libc::DT_LNK,
        libc::S_IFIFO => libc::DT_FIFO,
        libc::S_IFSOCK => libc::DT_SOCK,
        libc::S_IFCHR => libc::DT_CHR,
        libc::S_IFBLK => libc::DT_BLK,
        _ => libc::DT_UNKNOWN,
    }
}

/// After the kernel opened `d` for `path`: serve its listing if `path` is
/// a directory of a served mount, and the one the kernel opened.
unsafe fn adopt(d: *mut DIR, path: *const c_char) {
    let Some(_b) = Busy::enter() else { return };
    guarded((), || {
        let Some(loc) = locate(libc::AT_FDCWD, path) else {
            return;
        };
        let W::Ok((_, node)) = resolve(&loc, true, &loc.cred()) else {
            return;
        };
        let ns: &Ns = &loc.ns;
        let ino = ino_of(node.oid(), ns.root.oid());
        let mut st: libc::stat = std::mem::zeroed();
        // A rename between the kernel's open and the walk: not this one.
        if crate::real::sys_fstat(libc::dirfd(d), &mut st) != 0 || st.st_ino != ino {
            return;
        }
        let parent = if ino == 1 {
            1
        } else {
            ino_of(node.parent, ns.root.oid())
        };
        let l = Listing {
            dev: ns.mnt.dev,
            dots: [ino, parent],
            dir: std::sync::Arc::unwrap_or_clone(node),
            handle: None,
            ahead: Vec::new(),
            ahead_from: 0,
            pos: 0,
            ent: Box::new(std::mem::zeroed()),
        };
        DIRS.lock()
            .get_or_insert_with(HashMap::new)
            .insert(d as usize, l);
    })
}

/// Read the batch of entries after offset `after` (the snapshot of names
/// taken first if there is none).
fn fill(l: &mut Listing, after: u64) -> Result<(), c_int> {
    let ns = crate::ns::by_dev(l.dev).ok_or(libc::EIO)?;
    if l.handle.is_none() {
        l.handle = Some(ns.dfs.opendir(&l.dir).map_err(|_| libc::EIO)?);
    }
    let h = l.handle.as_ref().expect("opened above");
    let batch = (ns.dfs)
        .readdir_nodes(h, after.saturating_sub(DOTS), BATCH)
        .map_err(|_| libc::EIO)?;
    l.ahead = batch
        .into_iter()
        .map(|(cookie, name, node)| {
            crate::cache::put_dent(ns.key(), node.clone());
            Dent {
                off: cookie + DOTS,
                ino: ino_of(node.oid(), ns.root.oid()),
                kind: dtype(node.entry.mode),
                name,
            }
        })
        .collect();
    l.ahead_from = after;
    Ok(())
}

/// The next entry of `l` after its position (None at the end).
fn next(l: &mut Listing) -> Result<Option<Dent>, c_int> {
    if l.pos < DOTS {
        let i = l.pos as usize;
        let name = if i == 0 { &b"."[..] } else { &b".."[..] };
        return Ok(Some(Dent {
            off: l.pos + 1,
            ino: l.dots[i],
            kind: libc::DT_DIR,
            name: name.to_vec(),
        }));
    }
    // What was read ahead serves positions inside it (seekdir may go back).
    let within = |l: &Listing| {
        (l.ahead_from <= l.pos)
            .then(|| l.ahead.iter().find(|e| e.off > l.pos).cloned())
            .flatten()
    };
    if let Some(e) = within(l) {
        return Ok(Some(e));
    }
    fill(l, l.pos)?;
    Ok(l.ahead.first().cloned())
}

/// readdir of a served listing: Some(the entry, or null at the end, or the
/// error), None if `d` is not served.
unsafe fn read(d: *mut DIR) -> Option<Result<*mut dirent64, c_int>> {
    if !meta_enabled() {
        return None;
    }
    let _b = Busy::enter()?;
    guarded(None, || {
        let mut g = DIRS.lock();
        let l = g.as_mut()?.get_mut(&(d as usize))?;
        if l.pos == 0 && l.handle.is_none() {
            // The store first, before anything is returned: if it fails,
            // the kernel's listing serves this DIR from its start.
            if fill(l, DOTS).is_err() {
                g.as_mut()?.remove(&(d as usize));
                return None;
            }
        }
        match next(l) {
            Ok(None) => Some(Ok(std::ptr::null_mut())),
            Ok(Some(de)) => {
                let e = &mut *l.ent;
                e.d_ino = de.ino;
                e.d_off = de.off as i64;
                e.d_type = de.kind;
                let n = de.name.len().min(e.d_name.len() - 1);
                for (dst, src) in e.d_name.iter_mut().zip(&de.name[..n]) {
                    *dst = *src as c_char;
                }
                e.d_name[n] = 0;
                e.d_reclen = std::mem::size_of::<dirent64>() as u16;
                l.pos = de.off;
                count(C::Readdirs, 1);
                Some(Ok(&mut *l.ent as *mut dirent64))
            }
            Err(e) => Some(Err(e)),
        }
    })
}

fn forget(d: *mut DIR) {
    if let Some(m) = DIRS.lock().as_mut() {
        m.remove(&(d as usize));
    }
}

/// fork: hold the table across it.
pub(crate) fn hold_across_fork() {
    DIRS.hold_across_fork();
}

// ------------------------------------------------------------ interposers

// SAFETY (all): the C prototypes of the glibc functions they replace; `d`
// is passed on untouched and only used as a key here.

#[no_mangle]
pub unsafe extern "C" fn opendir(path: *const c_char) -> *mut DIR {
    let d = crate::real::r_opendir()(path);
    if !d.is_null() && meta_enabled() {
        adopt(d, path);
    }
    d
}

/// readdir and readdir64 (one `struct dirent64` on x86-64).
macro_rules! served_readdir {
    ($name:ident, $real:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(d: *mut DIR) -> *mut dirent64 {
            // errno changes only on a failure: programs tell the end from
            // an error by it, and the store's calls (a non-blocking
            // connect's EINPROGRESS) must not show through.
            let saved = crate::real::errno();
            match read(d) {
                Some(Ok(e)) => {
                    crate::real::set_errno(saved);
                    e
                }
                Some(Err(e)) => {
                    crate::real::set_errno(e);
                    std::ptr::null_mut()
                }
                None => crate::real::$real()(d),
            }
        }
    };
}
served_readdir!(readdir, r_readdir);
served_readdir!(readdir64, r_readdir64);

#[no_mangle]
pub unsafe extern "C" fn closedir(d: *mut DIR) -> c_int {
    // Before the real close: the address may be reused by the next open.
    forget(d);
    crate::real::r_closedir()(d)
}

#[no_mangle]
pub unsafe extern "C" fn rewinddir(d: *mut DIR) {
    if let Some(l) = DIRS.lock().as_mut().and_then(|m| m.get_mut(&(d as usize))) {
        // A new snapshot at the next read.
        (l.pos, l.handle, l.ahead_from) = (0, None, 0);
        l.ahead.clear();
    }
    crate::real::r_rewinddir()(d)
}

#[no_mangle]
pub unsafe extern "C" fn telldir(d: *mut DIR) -> c_long {
    if let Some(l) = DIRS.lock().as_ref().and_then(|m| m.get(&(d as usize))) {
        return l.pos as c_long;
    }
    crate::real::r_telldir()(d)
}

#[no_mangle]
pub unsafe extern "C" fn seekdir(d: *mut DIR, pos: c_long) {
    if let Some(l) = DIRS.lock().as_mut().and_then(|m| m.get_mut(&(d as usize))) {
        // Not a position telldir gave: past the end, as the kernel's.
        l.pos = u64::try_from(pos).unwrap_or(u64::MAX);
        return;
    }
    crate::real::r_seekdir()(d, pos)
}

/// readdir_r/readdir64_r: the entry copied into the caller's buffer; the
/// error is the return value, errno is left as it was.
unsafe fn read_r(d: *mut DIR, ent: *mut dirent64, out: *mut *mut dirent64) -> Option<c_int> {
    let saved = crate::real::errno();
    let r = match read(d)? {
        Ok(e) if e.is_null() => {
            *out = std::ptr::null_mut();
            0
        }
        Ok(e) => {
            std::ptr::copy_nonoverlapping(e, ent, 1);
            *out = ent;
            0
        }
        Err(e) => e,
    };
    crate::real::set_errno(saved);
    Some(r)
}

/// readdir_r and readdir64_r.
macro_rules! served_readdir_r {
    ($name:ident, $real:ident) => {
        #[no_mangle]
        pub unsafe extern "C" fn $name(
            d: *mut DIR,
            ent: *mut dirent64,
            out: *mut *mut dirent64,
        ) -> c_int {
            match read_r(d, ent, out) {
                Some(r) => r,
                None => crate::real::$real()(d, ent, out),
            }
        }
    };
}
served_readdir_r!(readdir_r, r_readdir_r);
served_readdir_r!(readdir64_r, r_readdir64_r);
