//! The per-process cache of small files' bytes: what this process wrote to
//! a file it created through the library (a placeholder, place.rs), kept
//! after close so that reading it back within the TTL of the path cache
//! (`PEREGRINE_IL_CACHE_MS`, [`crate::cache::ttl`]) costs no round trip, as
//! the page cache serves a local file just written. Only this process's
//! own writes fill it, never a read: what another client wrote is always
//! fetched, so the bound on seeing other clients' changes is the path
//! cache's for a file this process wrote itself, and no bound at all
//! (read at once) for any other file. Files of at most [`MAX_FILE`] bytes
//! are kept, up to `PEREGRINE_IL_DATA_CACHE_MB` (default 64; 0 turns it
//! off) in all, oldest dropped first. Bytes older than the TTL are dropped
//! too, so the cache holds at most what the process wrote in the last TTL:
//! 64 MiB lets a process that writes small files at the rate of the store
//! read back every one of them within the TTL (mdtest's 5000 files of
//! 3901 B a process are 19.5 MB; 16 MiB dropped the fifth written first).
//!
//! This process's changes of a file's bytes (writes and truncates through
//! any descriptor the library tracks, and what it hands the kernel:
//! [`crate::cache::clear`]) drop what is cached at once. A change that
//! happens while bytes are on their way to the cache (another thread's
//! write while a file is written or closed) keeps them out: each change
//! takes a *stamp* from one counter, and bytes are cached only if no
//! change of their file was stamped since they were known to be right.

use peregrine::sync::Mutex;
use peregrine::ObjectId;
use rustc_hash::FxHashMap as HashMap;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Files larger than this are not kept: the cache is for the many small
/// files of a metadata-heavy workload, not for streaming.
pub(crate) const MAX_FILE: usize = 64 << 10;

/// Changes remembered by file before starting over (past that, every
/// file counts as changed at the start-over: the files being written then
/// are not kept, one in this many). A few hundred KiB at most.
const MAX_CHANGES: usize = 4096;

/// The stamp the next change takes (0 is the start-over before any).
static STAMP: AtomicU64 = AtomicU64::new(1);

/// Files kept plus images alive: while 0, a change has nothing to drop and
/// nothing to keep out (an image made later knows the file as of then),
/// and a write takes no lock here.
static IN_USE: AtomicUsize = AtomicUsize::new(0);

/// The budget in MiB when `PEREGRINE_IL_DATA_CACHE_MB` is unset.
const DEFAULT_MB: u64 = 64;

/// `PEREGRINE_IL_DATA_CACHE_MB` in bytes + 1 (0: not read yet).
static BUDGET: AtomicU64 = AtomicU64::new(0);

#[derive(Default)]
struct Files {
    /// File -> (mount, bytes, when cached on the coarse clock).
    map: HashMap<ObjectId, (u64, Arc<[u8]>, u64)>,
    /// Files in the order cached (an entry may be stale: its file was
    /// dropped or cached again since; `at` tells).
    order: VecDeque<(ObjectId, u64)>,
    /// Bytes in `map`.
    bytes: usize,
    /// File -> the stamp of its last change here.
    changed: HashMap<ObjectId, u64>,
    /// Files not in `changed` last changed at this stamp or before.
    floor: u64,
}

impl Files {
    fn last_change(&self, oid: ObjectId) -> u64 {
        self.changed.get(&oid).copied().unwrap_or(self.floor)
    }

    fn remove(&mut self, oid: ObjectId) {
        if let Some((_, b, _)) = self.map.remove(&oid) {
            self.bytes -= b.len();
            IN_USE.fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Drop the oldest file (true), if any is left.
    fn drop_oldest(&mut self) -> bool {
        let Some((old, at)) = self.order.pop_front() else {
            return false;
        };
        if self.map.get(&old).is_some_and(|e| e.2 == at) {
            self.remove(old);
        }
        true
    }

    /// Drop the files past their TTL: a process that wrote many small
    /// files once does not hold their bytes for the rest of its life.
    fn drop_expired(&mut self) {
        while self
            .order
            .front()
            .is_some_and(|&(_, at)| !crate::cache::fresh(at))
        {
            self.drop_oldest();
        }
    }
}

static FILES: Mutex<Option<Files>> = Mutex::new(None);

fn budget() -> usize {
    let mut b = BUDGET.load(Ordering::Relaxed);
    if b == 0 {
        let mb = crate::report::env_u64(c"PEREGRINE_IL_DATA_CACHE_MB");
        b = (mb.unwrap_or(DEFAULT_MB).min(1 << 20) << 20) + 1;
        BUDGET.store(b, Ordering::Relaxed);
    }
    (b - 1) as usize
}

fn enabled() -> bool {
    budget() > 0 && !crate::cache::ttl().is_zero()
}

/// The stamp of "now": bytes known right at this point may be cached
/// with it ([`Image`]).
fn now_stamp() -> u64 {
    STAMP.load(Ordering::SeqCst)
}

/// One change of a file's bytes by this process, as [`changed`] stamped it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Change {
    stamp: u64,
    /// The stamp of the file's change before this one.
    prev: u64,
}

/// `oid`'s bytes change (or changed) here: drop them from the cache, and
/// keep out any bytes of it known before now. A writer calls this before
/// its write reaches the store and again after.
pub(crate) fn changed(oid: ObjectId) -> Change {
    if IN_USE.load(Ordering::SeqCst) == 0 {
        return Change { stamp: 0, prev: 0 };
    }
    let mut g = FILES.lock();
    let f = g.get_or_insert_with(Files::default);
    let stamp = STAMP.fetch_add(1, Ordering::SeqCst);
    let prev = f.last_change(oid);
    f.remove(oid);
    if f.changed.len() >= MAX_CHANGES {
        f.changed.clear();
        f.floor = stamp;
    } else {
        f.changed.insert(oid, stamp);
    }
    Change { stamp, prev }
}

/// The cached bytes of file `oid` in mount `dev`, while fresh.
pub(crate) fn get(dev: u64, oid: ObjectId) -> Option<Arc<[u8]>> {
    let mut g = FILES.lock();
    let f = g.as_mut()?;
    match f.map.get(&oid) {
        Some((d, b, at)) if crate::cache::fresh(*at) => (*d == dev).then(|| b.clone()),
        Some(_) => {
            f.drop_expired();
            None
        }
        None => None,
    }
}

/// Forget every file's bytes (the path cache's [`crate::cache::clear`]).
pub(crate) fn clear() {
    if let Some(f) = FILES.lock().as_mut() {
        IN_USE.fetch_sub(f.map.len(), Ordering::SeqCst);
        f.map.clear();
        f.order.clear();
        f.bytes = 0;
        f.changed.clear();
        f.floor = STAMP.fetch_add(1, Ordering::SeqCst);
    }
}

/// fork: hold the cache across it (prepare), release it after.
pub(crate) fn hold_across_fork() {
    FILES.hold_across_fork();
}

/// The bytes of a file this process is writing through one descriptor,
/// from its creation on: what the store holds as long as nothing else
/// changed it since [`Image::as_of`].
pub(crate) struct Image {
    bytes: Vec<u8>,
    /// The stamp at which `bytes` were last known to be the file's.
    as_of: u64,
}

impl Image {
    /// A file made empty just now; `None` if the cache is off.
    pub(crate) fn new_file() -> Option<Image> {
        enabled().then(|| {
            IN_USE.fetch_add(1, Ordering::SeqCst);
            Image {
                bytes: Vec::new(),
                as_of: now_stamp(),
            }
        })
    }

    /// `data` was written at `off` by the descriptor this image follows,
    /// between the changes `before` and `after`. False if the image no
    /// longer knows the file: someone else changed it since the image's
    /// last write or during this one, or it grew past [`MAX_FILE`].
    pub(crate) fn wrote(&mut self, before: Change, after: Change, off: u64, data: &[u8]) -> bool {
        let end = off as usize + data.len();
        if before.prev >= self.as_of || after.prev != before.stamp || end > MAX_FILE {
            return false;
        }
        if self.bytes.len() < end {
            self.bytes.resize(end, 0);
        }
        self.bytes[off as usize..end].copy_from_slice(data);
        // Changes up to `after` were this image's own.
        self.as_of = after.stamp + 1;
        true
    }

    pub(crate) fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    /// Cache the file's bytes (a copy: the descriptor may write on), if no
    /// change of it was stamped since the image last knew it.
    pub(crate) fn keep(&self, dev: u64, oid: ObjectId) {
        let max = budget();
        if self.bytes.len() > max {
            return;
        }
        let mut g = FILES.lock();
        let f = g.get_or_insert_with(Files::default);
        if f.last_change(oid) >= self.as_of {
            return;
        }
        f.remove(oid);
        f.drop_expired();
        while f.bytes + self.bytes.len() > max && f.drop_oldest() {}
        let at = crate::cache::coarse_now();
        f.bytes += self.bytes.len();
        IN_USE.fetch_add(1, Ordering::SeqCst);
        f.map.insert(oid, (dev, self.bytes.as_slice().into(), at));
        f.order.push_back((oid, at));
        // `order` holds stale entries too: keep it to a bound of its own.
        if f.order.len() > 2 * f.map.len() + 64 {
            let map = &f.map;
            f.order
                .retain(|(o, at)| map.get(o).is_some_and(|e| e.2 == *at));
        }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        IN_USE.fetch_sub(1, Ordering::SeqCst);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// [`clear`] and the stamps are process-wide: one test at a time.
    static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

    fn oid(n: u64) -> ObjectId {
        ObjectId { hi: 7, lo: n }
    }

    #[test]
    fn own_writes_are_kept_and_a_foreign_change_keeps_them_out() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let f = oid(1);
        let mut img = Image::new_file().unwrap();
        let (b, a) = (changed(f), changed(f));
        assert!(img.wrote(b, a, 0, b"hello"));
        let (b, a) = (changed(f), changed(f));
        assert!(img.wrote(b, a, 5, b" world"));
        img.keep(9, f);
        assert_eq!(&*get(9, f).unwrap(), b"hello world");
        // Another mount's file of the same object id is not this one.
        assert!(get(8, f).is_none());
        // A change drops the bytes; the image no longer knows the file.
        let other = changed(f);
        assert!(get(9, f).is_none());
        img.keep(9, f);
        assert!(get(9, f).is_none());
        let (b, a) = (changed(f), changed(f));
        assert!(other.stamp < b.stamp);
        assert!(!img.wrote(b, a, 0, b"x"));
    }

    #[test]
    fn a_change_during_a_write_keeps_the_image_out() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let f = oid(2);
        let mut img = Image::new_file().unwrap();
        let b = changed(f);
        changed(f); // another thread's write, between ours' two stamps
        let a = changed(f);
        assert!(!img.wrote(b, a, 0, b"x"));
    }

    #[test]
    fn budget_and_ttl_bound_what_is_kept() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        clear();
        // A budget of two files (as PEREGRINE_IL_DATA_CACHE_MB would set it).
        BUDGET.store(2 * MAX_FILE as u64 + 1, Ordering::Relaxed);
        for n in 0..3 {
            let f = oid(100 + n);
            let mut img = Image::new_file().unwrap();
            let (b, a) = (changed(f), changed(f));
            assert!(img.wrote(b, a, 0, &vec![n as u8; MAX_FILE]));
            img.keep(1, f);
        }
        BUDGET.store(0, Ordering::Relaxed);
        let bytes = FILES.lock().as_ref().unwrap().bytes;
        assert_eq!(bytes, 2 * MAX_FILE);
        assert!(get(1, oid(100)).is_none(), "the oldest goes first");
        assert_eq!(get(1, oid(102)).unwrap()[0], 2);
        // Past the TTL: not served, and dropped from memory.
        let at = crate::cache::coarse_now() - crate::cache::ttl().as_nanos() as u64 - 1;
        for e in FILES.lock().as_mut().unwrap().map.values_mut() {
            e.2 = at;
        }
        for o in FILES.lock().as_mut().unwrap().order.iter_mut() {
            o.1 = at;
        }
        assert!(get(1, oid(102)).is_none());
        let f = FILES.lock();
        let f = f.as_ref().unwrap();
        assert!(f.map.is_empty() && f.bytes == 0, "{}", f.bytes);
    }

    #[test]
    fn large_files_are_not_kept() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let f = oid(3);
        let mut img = Image::new_file().unwrap();
        let (b, a) = (changed(f), changed(f));
        assert!(!img.wrote(b, a, MAX_FILE as u64, b"x"));
        let mut img = Image::new_file().unwrap();
        let (b, a) = (changed(f), changed(f));
        assert!(img.wrote(b, a, 0, &vec![1u8; MAX_FILE]));
        img.keep(1, f);
        assert_eq!(get(1, f).unwrap().len(), MAX_FILE);
    }

    #[test]
    fn clear_forgets_and_keeps_out_what_was_known_before() {
        let _s = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
        let f = oid(4);
        let mut img = Image::new_file().unwrap();
        let (b, a) = (changed(f), changed(f));
        assert!(img.wrote(b, a, 0, b"abc"));
        clear();
        img.keep(1, f);
        assert!(get(1, f).is_none());
        // Nothing kept and no image: a write's change takes no lock.
        drop(img);
        assert_eq!(IN_USE.load(Ordering::SeqCst), 0);
        assert_eq!(changed(f).stamp, 0);
    }
}
