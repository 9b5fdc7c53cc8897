//! The namespace of each Peregrine mount, served by the library itself:
//! a [`Dfs`] over the mount's container, made on first use.
//!
//! The daemon hands out the container (pool, container, management
//! address) through `PEREGRINE_IOC_GET_HANDLE` on an open file or
//! directory of the mount (include/peregrine_fuse.h). So the library
//! learns a mount's container from the first regular file of it that the
//! process opens on the kernel path (track.rs calls [`learn`]), or, on the
//! first path call into a mount it does not know, from the mount's root
//! directory. A daemon that answers only on regular files (older ones)
//! is served by opening a regular file found in the mount's first
//! directories (at most [`SCAN_DIRS`] directories, [`SCAN_ENTRIES`]
//! entries, once a second per mount); until one exists, calls into that
//! mount go to the kernel.

use crate::handle::{Handle, HANDLE_SIZE, IOC_GET_HANDLE};
use crate::mounts::Mnt;
use crate::real::ioctl_raw;
use crate::report::note_failure;
use crate::table::{container, err_of};
use libc::{c_int, c_void};
use peregrine::sync::Mutex;
use peregrine_dfs::{Dfs, Node};
use std::sync::Arc;
use std::time::{Duration, Instant};

const SCAN_DIRS: usize = 8;
const SCAN_ENTRIES: usize = 512;
const SCAN_AGAIN: Duration = Duration::from_secs(1);

/// A mount's dev as one number (the caches' keys).
pub(crate) fn dev_key(dev: (u32, u32)) -> u64 {
    ((dev.0 as u64) << 32) | dev.1 as u64
}

/// A Peregrine mount served by the library.
pub(crate) struct Ns {
    pub(crate) mnt: Mnt,
    pub(crate) dfs: Dfs,
    pub(crate) h: Handle,
    /// The container's root directory (inode 1); its parent and name key
    /// its entry in the cache.
    pub(crate) root: Node,
}

impl Ns {
    /// The mount's dev as one number (cache keys).
    pub(crate) fn key(&self) -> u64 {
        dev_key(self.mnt.dev)
    }
    pub(crate) fn read_only(&self) -> bool {
        self.h.read_only
    }
}

pub(crate) enum Slot {
    Ready(Arc<Ns>),
    /// The container is known (a handle), not yet mounted here.
    Known(Handle),
    /// No handle yet; scan again after this.
    Unknown(Instant),
    /// Mounting failed: the kernel path for good.
    Failed,
}

pub(crate) static NSS: Mutex<Vec<((u32, u32), Slot)>> = Mutex::new(Vec::new());

/// At exit and before an exec: send the punches of removed files still
/// queued and wait for them (a failure is retried). Skipped if another
/// thread holds the table as the process exits.
pub(crate) fn settle_discards() {
    let Some(t) = NSS.try_lock() else { return };
    for (_, s) in t.iter() {
        if let Slot::Ready(ns) = s {
            if let Err(e) = ns.dfs.settle_discards() {
                crate::report::note_failure(format!("punching a removed file's data: {e}"));
            }
        }
    }
}

/// The container of mount `dev`, learnt from a handle.
pub(crate) fn learn(dev: (u32, u32), h: &Handle) {
    let mut t = NSS.lock();
    match t.iter_mut().find(|(d, _)| *d == dev) {
        Some((_, s @ Slot::Unknown(_))) => *s = Slot::Known(h.clone()),
        Some(_) => {}
        None => t.push((dev, Slot::Known(h.clone()))),
    }
}

/// After fork: connections belong to the parent; keep what is known.
pub(crate) fn fork_child() {
    let mut t = NSS.lock();
    for (_, s) in t.iter_mut() {
        if let Slot::Ready(ns) = s {
            let h = ns.h.clone();
            // Leaked, never dropped: its locks and threads are the parent's.
            std::mem::forget(std::mem::replace(s, Slot::Known(h)));
        }
    }
}

/// The namespace of mount `dev` when its container is known (after a
/// fork: mounted again here).
pub(crate) fn by_dev(dev: (u32, u32)) -> Option<Arc<Ns>> {
    let mut t = NSS.lock();
    let i = t.iter().position(|(d, _)| *d == dev)?;
    match &t[i].1 {
        Slot::Ready(ns) => Some(ns.clone()),
        Slot::Known(h) => {
            // Only the mount (its id, root) is needed again: the old Ns
            // was replaced by its handle at fork.
            let h = h.clone();
            let m = crate::mounts::by_dev(dev)?;
            let ns = Arc::new(mount(&m, h).ok()?);
            t[i].1 = Slot::Ready(ns.clone());
            Some(ns)
        }
        _ => None,
    }
}

/// The namespace of mount `m` (None: serve it on the kernel path);
/// `mount_point` is asked only the first time.
pub(crate) fn get(m: &Mnt, mount_point: impl FnOnce() -> Vec<u8>) -> Option<Arc<Ns>> {
    let mut t = NSS.lock();
    let i = match t.iter().position(|(d, _)| *d == m.dev) {
        Some(i) => i,
        None => {
            t.push((m.dev, Slot::Unknown(Instant::now())));
            t.len() - 1
        }
    };
    let h = match &t[i].1 {
        Slot::Ready(ns) if ns.mnt == *m => return Some(ns.clone()),
        // The dev now names another mount (unmounted, mounted again).
        Slot::Ready(ns) => ns.h.clone(),
        Slot::Failed => return None,
        Slot::Known(h) => h.clone(),
        Slot::Unknown(at) => {
            if *at > Instant::now() {
                return None;
            }
            match scan(&mount_point()) {
                Some(h) => h,
                None => {
                    t[i].1 = Slot::Unknown(Instant::now() + SCAN_AGAIN);
                    return None;
                }
            }
        }
    };
    match mount(m, h.clone()) {
        Ok(ns) => {
            let ns = Arc::new(ns);
            t[i].1 = Slot::Ready(ns.clone());
            Some(ns)
        }
        Err(why) => {
            note_failure(why);
            t[i].1 = Slot::Failed;
            None
        }
    }
}

fn mount(m: &Mnt, h: Handle) -> Result<Ns, String> {
    // Dfs::mount reads the superblock: the data plane is tried there.
    let cont = container(&h, false).map_err(|e| format!("metadata: container: errno {e}"))?;
    let dfs = Dfs::mount(cont, false, h.read_only)
        .map_err(|e| format!("metadata: mount of the container: {e} ({})", err_of(&e)))?;
    crate::table::reached(&h);
    Ok(Ns {
        mnt: m.clone(),
        root: dfs.root(),
        dfs,
        h,
    })
}

/// A handle of the mount at `mount_point`, from a regular file found in
/// its first directories (raw system calls: the program's interposers are
/// not involved).
fn scan(mount_point: &[u8]) -> Option<Handle> {
    // The root's own handle, from a daemon that answers on directories:
    // no listing, no file to find.
    if let Some(h) = handle_of(mount_point, libc::O_DIRECTORY) {
        return Some(h);
    }
    let mut dirs: Vec<Vec<u8>> = vec![mount_point.to_vec()];
    let (mut seen, mut done) = (0usize, 0usize);
    while let Some(d) = (done < dirs.len()).then(|| dirs[done].clone()) {
        done += 1;
        if done > SCAN_DIRS {
            break;
        }
        let fd = sys_open(&d, libc::O_RDONLY | libc::O_DIRECTORY);
        if fd < 0 {
            continue;
        }
        let mut buf = [0u8; 8192];
        'read: loop {
            // SAFETY: getdents64 into our buffer.
            let n = unsafe { libc::syscall(libc::SYS_getdents64, fd, buf.as_mut_ptr(), buf.len()) };
            if n <= 0 {
                break;
            }
            let mut at = 0usize;
            while at + 19 < n as usize {
                let reclen = u16::from_ne_bytes([buf[at + 16], buf[at + 17]]) as usize;
                let kind = buf[at + 18];
                let name = &buf[at + 19..at + reclen];
                let name = &name[..name.iter().position(|&c| c == 0).unwrap_or(name.len())];
                at += reclen.max(1);
                seen += 1;
                if seen > SCAN_ENTRIES {
                    break 'read;
                }
                if name == b"." || name == b".." {
                    continue;
                }
                let mut p = d.clone();
                p.push(b'/');
                p.extend_from_slice(name);
                if kind == libc::DT_DIR {
                    dirs.push(p);
                } else if kind == libc::DT_REG {
                    if let Some(h) = handle_of(&p, 0) {
                        // SAFETY: our own descriptor.
                        unsafe { libc::syscall(libc::SYS_close, fd) };
                        return Some(h);
                    }
                }
            }
        }
        // SAFETY: our own descriptor.
        unsafe { libc::syscall(libc::SYS_close, fd) };
    }
    None
}

pub(crate) fn sys_open(p: &[u8], flags: c_int) -> c_int {
    let mut c = p.to_vec();
    c.push(0);
    // SAFETY: NUL-terminated path.
    unsafe {
        libc::syscall(
            libc::SYS_openat,
            libc::AT_FDCWD,
            c.as_ptr(),
            flags | libc::O_CLOEXEC | libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY,
            0,
        ) as c_int
    }
}

fn handle_of(p: &[u8], flags: c_int) -> Option<Handle> {
    let fd = sys_open(p, libc::O_RDONLY | flags);
    if fd < 0 {
        return None;
    }
    let mut b = [0u8; HANDLE_SIZE];
    // SAFETY: the ioctl writes HANDLE_SIZE bytes into b.
    let r = unsafe { ioctl_raw(fd, IOC_GET_HANDLE, b.as_mut_ptr() as *mut c_void) };
    let h = (r == 0).then(|| Handle::parse(&b)).flatten();
    if let Some(h) = &h {
        // The container is opened through the daemon, on an open file of
        // it: this one, while it is open.
        crate::table::daemon::prime(fd, h, crate::table::is_open(h));
    }
    // SAFETY: our own descriptor.
    unsafe { libc::syscall(libc::SYS_close, fd) };
    h
}
