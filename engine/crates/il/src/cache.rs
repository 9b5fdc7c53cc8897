//! The per-process cache of path calls: directory entries (parent object,
//! name) -> [`Node`] and attributes by object -> [`Stat`], each kept for at
//! most the TTL (`PEREGRINE_IL_CACHE_MS`, default 1000 ms: the daemon's
//! default `--attr-timeout` and `--dentry-timeout`, so the library sees
//! other clients' changes within the bound the kernel path has). This
//! process's own changes through the library update or drop the entries
//! they touch at once; writes through tracked descriptors drop the file's
//! attributes. An entry holds a copy of its object's attributes (a
//! directory's times, a file's mode and mtime), so a change of the entry
//! ([`entry_changed`]) also makes the cached entry stale until it is read
//! again; but not for a walk through a directory or a removal, which use
//! only what such a change leaves alone ([`dent_identity`]): creating many
//! files in one directory does not look the directory up again each time.
//! `PEREGRINE_IL_CACHE_MS=0` turns the cache off. Ages are read on the
//! coarse monotonic clock (one kernel tick, 1-10 ms, at most behind) and
//! an entry counts as fresh only while its age plus a tick is under the
//! TTL: a TTL of a tick or less caches nothing.

use peregrine::ObjectId;
use peregrine_dfs::{Node, Stat};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use peregrine::sync::Mutex;

/// More entries than this: start over (a cache, not a copy of the namespace).
const MAX_ENTRIES: usize = 65536;

/// A directory's cached entries: name -> (mount, node, when cached).
type DirDents = HashMap<Vec<u8>, (u64, Arc<Node>, u64)>;

#[derive(Default)]
struct Dents {
    /// By parent directory first, so that a lookup borrows the name it is
    /// asked.
    map: HashMap<ObjectId, DirDents>,
    /// Entries in `map`.
    len: usize,
    /// Objects whose attributes changed here since their entry was cached.
    stale: HashSet<ObjectId>,
}
type Attrs = HashMap<ObjectId, (u64, Stat, u64)>;

static DENTS: Mutex<Option<Dents>> = Mutex::new(None);
static ATTRS: Mutex<Option<Attrs>> = Mutex::new(None);

/// TTL in ms + 1 (0: not read yet).
static TTL: AtomicU64 = AtomicU64::new(0);

pub(crate) fn ttl() -> Duration {
    let mut t = TTL.load(Ordering::Relaxed);
    if t == 0 {
        let ms = crate::report::env_u64(c"PEREGRINE_IL_CACHE_MS");
        t = ms.unwrap_or(1000).min(3_600_000) + 1;
        TTL.store(t, Ordering::Relaxed);
    }
    Duration::from_millis(t - 1)
}

/// CLOCK_MONOTONIC_COARSE in nanoseconds: read without the hardware
/// counter (a stat asks the cache several times), at most a tick behind.
pub(crate) fn coarse_now() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime into our timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
    t.tv_sec as u64 * 1_000_000_000 + t.tv_nsec as u64
}

/// The coarse clock's tick in nanoseconds (a 10 ms tick, HZ=100, the
/// coarsest, if the kernel does not say).
fn tick() -> u64 {
    static TICK: OnceLock<u64> = OnceLock::new();
    *TICK.get_or_init(|| {
        let mut r = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_getres into our timespec.
        match unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut r) } {
            0 => r.tv_sec as u64 * 1_000_000_000 + r.tv_nsec as u64,
            _ => 10_000_000,
        }
    })
}

/// Cached at coarse time `at`, and certainly less than the TTL ago: each
/// reading of the coarse clock may be up to a tick behind the true time.
pub(crate) fn fresh(at: u64) -> bool {
    coarse_now().saturating_sub(at) + tick() < ttl().as_nanos() as u64
}

/// The cached entry `name` of directory `parent` in mount `dev`.
pub(crate) fn dent(dev: u64, parent: ObjectId, name: &[u8]) -> Option<Arc<Node>> {
    cached_dent(dev, parent, name, true)
}

/// As [`dent`], also when its object's times or size changed here since it
/// was cached ([`entry_changed`]): for a caller that needs only what such a
/// change leaves alone (the object, its type, owner and mode), such as a
/// walk through a directory this process just created a file in, or a
/// removal, which checks the entry again in the store.
pub(crate) fn dent_identity(dev: u64, parent: ObjectId, name: &[u8]) -> Option<Arc<Node>> {
    cached_dent(dev, parent, name, false)
}

fn cached_dent(dev: u64, parent: ObjectId, name: &[u8], times: bool) -> Option<Arc<Node>> {
    let g = DENTS.lock();
    let g = g.as_ref()?;
    let (d, n, at) = g.map.get(&parent)?.get(name)?;
    let current = !times || !g.stale.contains(&n.oid());
    (*d == dev && fresh(*at) && current).then(|| n.clone())
}

pub(crate) fn put_dent(dev: u64, n: impl Into<Arc<Node>>) {
    if ttl().is_zero() {
        return;
    }
    let n = n.into();
    let mut g = DENTS.lock();
    let g = g.get_or_insert_with(Dents::default);
    if g.len >= MAX_ENTRIES {
        g.map.clear();
        g.len = 0;
    }
    g.stale.remove(&n.oid());
    let dir = g.map.entry(n.parent).or_default();
    if dir.insert(n.name.clone(), (dev, n, coarse_now())).is_none() {
        g.len += 1;
    }
}

pub(crate) fn drop_dent(parent: ObjectId, name: &[u8]) {
    if let Some(g) = DENTS.lock().as_mut() {
        let Some(dir) = g.map.get_mut(&parent) else {
            return;
        };
        if dir.remove(name).is_some() {
            g.len -= 1;
        }
        if dir.is_empty() {
            g.map.remove(&parent);
        }
    }
}

/// The cached attributes of object `oid` in mount `dev`.
pub(crate) fn attr(dev: u64, oid: ObjectId) -> Option<Stat> {
    let g = ATTRS.lock();
    let (d, s, at) = g.as_ref()?.get(&oid)?;
    (*d == dev && fresh(*at)).then(|| s.clone())
}

pub(crate) fn put_attr(dev: u64, st: &Stat) {
    if ttl().is_zero() {
        return;
    }
    let mut g = ATTRS.lock();
    let m = g.get_or_insert_with(HashMap::default);
    if m.len() >= MAX_ENTRIES {
        m.clear();
    }
    m.insert(st.oid, (dev, st.clone(), coarse_now()));
}

/// Forget the attributes of `oid` (in any mount): its data changed here
/// (a write: its entry, which the store changes only at close, stays).
/// Its cached bytes go too ([`crate::data_cache::changed`]).
pub(crate) fn drop_attr(oid: ObjectId) -> crate::data_cache::Change {
    forget_attr(oid);
    crate::data_cache::changed(oid)
}

fn forget_attr(oid: ObjectId) {
    if let Some(m) = ATTRS.lock().as_mut() {
        m.remove(&oid);
    }
}

/// Forget the attributes of `oid` and its entry's copy of them: its entry
/// changed (a directory's times, a file's mtime recorded at close).
pub(crate) fn entry_changed(oid: ObjectId) {
    forget_attr(oid);
    if let Some(g) = DENTS.lock().as_mut() {
        if g.stale.len() >= MAX_ENTRIES {
            g.map.clear();
            g.len = 0;
            g.stale.clear();
        }
        if !g.map.is_empty() {
            g.stale.insert(oid);
        }
    }
}

/// Forget everything (a change on the kernel path this process made and
/// the library cannot place, e.g. a rename relative to a directory fd).
pub(crate) fn clear() {
    if let Some(g) = DENTS.lock().as_mut() {
        g.map.clear();
        g.len = 0;
        g.stale.clear();
    }
    if let Some(m) = ATTRS.lock().as_mut() {
        m.clear();
    }
    crate::data_cache::clear();
}

/// fork: hold both caches across it (prepare), release them after.
pub(crate) fn hold_across_fork() {
    DENTS.hold_across_fork();
    ATTRS.hold_across_fork();
    crate::data_cache::hold_across_fork();
}
