//! Directory times: an entry change moves its directory's mtime and ctime,
//! shared by concurrent changes (group commit, one stamp per tick).

use crate::dfs::retry_changed;
use crate::{now_ns, Dfs, Node};
use peregrine::sync::{Condvar, Mutex};
use peregrine::{ObjectId, Result};
use std::sync::Arc;

/// Granularity of directory times set by entry changes (as Linux's coarse
/// clock for file times at HZ=250): one stamp per directory and tick.
pub const DIR_TIME_TICK_NS: i64 = 4_000_000;

/// The time updates of one directory: requests are numbered; a round
/// stamps the directory once for every request made before it started
/// (group commit), and a round started in the current tick covers every
/// request of that tick.
#[derive(Default)]
pub(crate) struct Touch {
    st: Mutex<TouchState>,
    done: Condvar,
}

#[derive(Default)]
struct TouchState {
    requested: u64,
    /// Requests up to this number are covered by a finished round.
    covered: u64,
    running: bool,
    /// Tick in which the last finished round started (0: none).
    tick: i64,
}

impl Dfs {
    /// POSIX: an entry created, removed or renamed in directory `dir`
    /// moves the directory's mtime and ctime to now: a read and a write of
    /// the directory's own entry (in its parent), after the operation and
    /// outside its locks. Cheap by sharing: concurrent operations in one
    /// directory share rounds (group commit), and one round per
    /// [`DIR_TIME_TICK_NS`] serves a directory (the times have that
    /// granularity, as with a coarse clock). Across clients the last
    /// writer wins. A failure (a full pool, an engine down) neither undoes
    /// nor fails the operation, which has happened.
    pub(crate) fn touch_dir(&self, dir: &Node) {
        let t = {
            let mut m = self.inner.touches.lock();
            if m.len() > 4096 {
                // Forget directories idle for a tick or more.
                let now = now_ns() / DIR_TIME_TICK_NS;
                m.retain(|_, t| Arc::strong_count(t) > 1 || t.st.lock().tick == now);
            }
            m.entry(dir.oid()).or_default().clone()
        };
        let mut st = t.st.lock();
        st.requested += 1;
        let me = st.requested;
        while st.covered < me && st.tick != now_ns() / DIR_TIME_TICK_NS {
            if st.running {
                t.done.wait(&mut st);
                continue;
            }
            st.running = true;
            let round = st.requested;
            drop(st);
            let tick = now_ns() / DIR_TIME_TICK_NS;
            let r = self.touch_dir_once(dir);
            self.dir_times_set(dir.oid(), r.as_ref().ok().copied().flatten());
            let ok = r.is_ok();
            st = t.st.lock();
            st.running = false;
            st.covered = round;
            if ok {
                st.tick = tick;
            }
            t.done.notify_all();
        }
    }

    /// After an explicit change of a directory's attributes, the next entry
    /// change stamps it again even within the tick.
    pub(crate) fn forget_touch(&self, dir: ObjectId) {
        if let Some(t) = self.inner.touches.lock().get(&dir) {
            t.st.lock().tick = 0;
        }
        self.dir_entry_changed(dir);
    }

    /// The time written, if `dir` was still there to stamp.
    fn touch_dir_once(&self, dir: &Node) -> Result<Option<i64>> {
        let _g = self.lock(&[(dir.parent, &dir.name)]);
        retry_changed(|| match self.node_versioned(dir.parent, &dir.name)? {
            // Still this directory (not renamed away and replaced).
            Some((mut n, epoch)) if n.oid() == dir.oid() => {
                let t = now_ns();
                n.entry.mtime = t;
                n.entry.ctime = t;
                self.replace_entry(&n, epoch).map(|()| Some(t))
            }
            _ => Ok(None),
        })
    }
}
