//! Directory attributes this mount read or changed itself, answered again
//! for a caller that accepts them up to an age ([`Dfs::getattr_within`]).
//!
//! Why: a FUSE kernel drops a directory's cached attributes after every
//! create or unlink in it (its times moved), and then asks for them on the
//! next path walk, for the permission check. Reading them back costs two
//! fetches (the entry and the subdirectory count), as much as the create
//! itself. What changed is known here: [`Dfs::touch_dir`] wrote the times,
//! [`Dfs::adjust_subdirs`] the count. So the attributes read at `t` are
//! kept with this mount's own changes applied, and served until `t + max
//! age`; another client's change shows by then, as it would have through
//! the kernel's own attribute cache of the same age, which the directory
//! would have kept had this mount not changed it.
//!
//! A read that races a change of the same directory must not store what it
//! read before the change: each change takes a new generation, and a read
//! stores only if its directory's generation did not move meanwhile.

use crate::{Dfs, Entry, Node, Stat};
use peregrine::sync::Mutex;
use peregrine::{ObjectId, Result};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Directories remembered at most; past it, the stale ones go.
const DIR_STATS_MAX: usize = 4096;

#[derive(Default)]
pub(crate) struct DirStats {
    slots: Mutex<HashMap<ObjectId, Slot>>,
    next_gen: AtomicU64,
}

struct Slot {
    gen: u64,
    known: Option<Known>,
}

struct Known {
    node: Node,
    subdirs: u64,
    read_at: Instant,
}

/// What a change did to a directory's attributes.
enum Change {
    /// Its mtime and ctime set to this time.
    Times(i64),
    /// Its subdirectory count moved by this much.
    Subdirs(i64),
    /// Anything else (or a change that may have failed): read it again.
    Unknown,
}

impl DirStats {
    fn new_gen(&self) -> u64 {
        self.next_gen.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The generation a read of `dir` starts at.
    fn begin_read(&self, dir: ObjectId) -> u64 {
        let mut m = self.slots.lock();
        if m.len() >= DIR_STATS_MAX && !m.contains_key(&dir) {
            m.retain(|_, s| s.known.is_some());
            if m.len() >= DIR_STATS_MAX {
                m.clear();
            }
        }
        let gen = self.next_gen.load(Ordering::Relaxed);
        m.entry(dir).or_insert(Slot { gen, known: None }).gen
    }

    fn store(&self, gen: u64, node: &Node, subdirs: u64, read_at: Instant) {
        let mut m = self.slots.lock();
        if let Some(s) = m.get_mut(&node.oid()) {
            if s.gen == gen {
                s.known = Some(Known {
                    node: node.clone(),
                    subdirs,
                    read_at,
                });
            }
        }
    }

    fn fresh(&self, dir: ObjectId, max_age: Duration) -> Option<(Node, u64)> {
        let m = self.slots.lock();
        let k = m.get(&dir)?.known.as_ref()?;
        (k.read_at.elapsed() < max_age).then(|| (k.node.clone(), k.subdirs))
    }

    fn changed(&self, dir: ObjectId, c: Change) {
        let gen = self.new_gen();
        let mut m = self.slots.lock();
        let Some(s) = m.get_mut(&dir) else {
            return;
        };
        s.gen = gen;
        match (c, &mut s.known) {
            (Change::Times(t), Some(k)) => {
                k.node.entry.mtime = t;
                k.node.entry.ctime = t;
            }
            (Change::Subdirs(d), Some(k)) => {
                k.subdirs = (k.subdirs as i64).saturating_add(d).max(0) as u64;
            }
            (_, known) => *known = None,
        }
    }

    /// A change whose directories are not all known (renames, removals):
    /// nothing read before it is served after it.
    fn clear(&self) {
        let gen = self.new_gen();
        for s in self.slots.lock().values_mut() {
            s.gen = gen;
            s.known = None;
        }
    }
}

impl Dfs {
    /// Like [`Dfs::getattr`], but a directory's attributes read by this
    /// mount less than `max_age` ago, with its own changes since applied,
    /// are answered without reading them again (see the module comment).
    pub fn getattr_within(&self, node: &Node, max_age: Duration) -> Result<(Node, Stat)> {
        if !node.is_dir() {
            return self.getattr(node);
        }
        let stats = &self.inner.dir_stats;
        if let Some((n, subdirs)) = stats.fresh(node.oid(), max_age) {
            let st = self.dir_stat(&n.entry, subdirs);
            return Ok((n, st));
        }
        let gen = stats.begin_read(node.oid());
        let read_at = Instant::now();
        let n = self.refresh(node)?;
        if !n.is_dir() || n.oid() != node.oid() || !n.entry.subdirs_counted {
            let st = self.stat_node(&n)?;
            return Ok((n, st));
        }
        let subdirs = self.subdirs(n.oid())?;
        stats.store(gen, &n, subdirs, read_at);
        let st = self.dir_stat(&n.entry, subdirs);
        Ok((n, st))
    }

    fn dir_stat(&self, e: &Entry, subdirs: u64) -> Stat {
        let mut st = self.stat_of(e, 4096);
        st.nlink = 2u64.saturating_add(subdirs).min(u32::MAX as u64) as u32;
        st
    }

    /// [`Dfs::touch_dir`] set `dir`'s times to `t` (`None`: it may have failed).
    pub(crate) fn dir_times_set(&self, dir: ObjectId, t: Option<i64>) {
        let c = t.map_or(Change::Unknown, Change::Times);
        self.inner.dir_stats.changed(dir, c);
    }

    /// [`Dfs::adjust_subdirs`] moved `dir`'s count by `delta` (`None`: it may have failed).
    pub(crate) fn dir_subdirs_moved(&self, dir: ObjectId, delta: Option<i64>) {
        let c = delta.map_or(Change::Unknown, Change::Subdirs);
        self.inner.dir_stats.changed(dir, c);
    }

    /// An explicit change of `dir`'s own entry (chmod, utimens, its xattrs).
    pub(crate) fn dir_entry_changed(&self, dir: ObjectId) {
        self.inner.dir_stats.changed(dir, Change::Unknown);
    }

    /// Another client (the interception library in a process on this
    /// node) changed `dir`: what is kept of it is read again.
    pub fn dir_changed_elsewhere(&self, dir: ObjectId) {
        self.inner.dir_stats.changed(dir, Change::Unknown);
    }

    /// A change that may move or remove directories (rename, rmdir).
    pub(crate) fn dirs_moved(&self) {
        self.inner.dir_stats.clear();
    }
}
