//! Link counts: a directory's subdirectory count and its cross-mount lock
//! (see "Link counts" in the crate docs).

use crate::{now_ns, show, Dfs, Node, COUNT_DKEY, COUNT_LOCK_LEASE_NS, SUBDIRS, SUBDIRS_LOCK};
use peregrine::sync::{Condvar, Mutex};
use peregrine::{Object, ObjectId, Result};
use std::sync::Arc;

/// The subdirectory count changes of one directory: changes made while a
/// round runs are summed and applied by the next round (one locked
/// read-modify-write of the count for all of them).
#[derive(Default)]
pub(crate) struct CountBatch {
    st: Mutex<CountState>,
    done: Condvar,
}

#[derive(Default)]
struct CountState {
    pending: i64,
    requested: u64,
    covered: u64,
    running: bool,
}

impl Dfs {
    /// The subdirectory count of directory object `dir` (0 if none recorded).
    pub(crate) fn subdirs(&self, dir: ObjectId) -> Result<u64> {
        Ok(self
            .obj(dir)?
            .fetch_single(COUNT_DKEY, SUBDIRS)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map(u64::from_le_bytes)
            .unwrap_or(0))
    }

    /// Add `delta` to the subdirectory count of directory `dir` (after a
    /// mkdir, rmdir or rename there; see "Link counts" in the module
    /// docs). Concurrent changes of one directory in this process share
    /// rounds (their sum is applied in one locked read-modify-write). Like
    /// the directory's times, a failure (a full pool, an engine down)
    /// neither undoes nor fails the operation, which has happened: it is
    /// reported on stderr and the count is off by the change.
    pub(crate) fn adjust_subdirs(&self, dir: &Node, delta: i64) {
        if delta == 0 || !dir.is_dir() || !dir.entry.subdirs_counted {
            return;
        }
        let b = {
            let mut m = self.inner.counts.lock();
            if m.len() > 4096 {
                m.retain(|_, b| Arc::strong_count(b) > 1);
            }
            m.entry(dir.oid()).or_default().clone()
        };
        let mut st = b.st.lock();
        st.pending += delta;
        st.requested += 1;
        let me = st.requested;
        while st.covered < me {
            if st.running {
                b.done.wait(&mut st);
                continue;
            }
            st.running = true;
            let round = st.requested;
            let d = std::mem::take(&mut st.pending);
            drop(st);
            let r = self.apply_subdirs(dir.oid(), d);
            self.dir_subdirs_moved(dir.oid(), r.as_ref().ok().map(|()| d));
            if let Err(e) = r {
                eprintln!(
                    "peregrine-dfs: subdirectory count of {:?} ({}) not changed by {d}: {e}",
                    show(&dir.name),
                    dir.oid()
                );
            }
            st = b.st.lock();
            st.running = false;
            st.covered = round;
            b.done.notify_all();
        }
    }

    /// One locked read-modify-write of a directory's subdirectory count.
    fn apply_subdirs(&self, dir: ObjectId, delta: i64) -> Result<()> {
        if delta == 0 {
            return Ok(());
        }
        let o = self.obj(dir)?;
        self.lock_count(&o)?;
        let r = (|| {
            let cur = self.subdirs(dir)?;
            // Below zero: a count that drifted (see "Link counts"); 0 is
            // the nearest truth.
            let new = (cur as i64).saturating_add(delta).max(0) as u64;
            o.update_single(COUNT_DKEY, SUBDIRS, &new.to_le_bytes())
        })();
        let unlock = o.punch_akeys(COUNT_DKEY, &[SUBDIRS_LOCK]);
        r.and(unlock)
    }

    /// Take the subdirectory-count lock of directory object `o`: a
    /// conditional insert of (now, a random token); of several clients,
    /// one wins; the others wait and retry. The winner reads the lock back:
    /// an insert whose epoch is below the punch that released the lock
    /// before it (sent earlier, arrived later) succeeds but stays hidden
    /// under that punch, and does not hold the lock. A lock older than
    /// [`COUNT_LOCK_LEASE_NS`] was left by a client that died holding it:
    /// it is taken over.
    fn lock_count(&self, o: &Object) -> Result<()> {
        let mut pause = std::time::Duration::from_micros(100);
        let since = |v: &[u8]| {
            v.get(..8)
                .map(|t| i64::from_le_bytes(t.try_into().unwrap()))
        };
        loop {
            let mut mine = now_ns().to_le_bytes().to_vec();
            mine.extend_from_slice(&crate::unique_u64().to_le_bytes());
            let held = match o.insert_single(COUNT_DKEY, SUBDIRS_LOCK, &mine) {
                Ok(_) => None,
                Err(e) if e.code == -libc::EEXIST => Some(()),
                Err(e) => return Err(e),
            };
            let now = o.fetch_single(COUNT_DKEY, SUBDIRS_LOCK)?;
            if held.is_none() && now.as_deref() == Some(&mine[..]) {
                return Ok(());
            }
            if let Some(t) = now.as_deref().and_then(since) {
                if now_ns().saturating_sub(t) >= COUNT_LOCK_LEASE_NS {
                    o.punch_akeys(COUNT_DKEY, &[SUBDIRS_LOCK])?;
                    continue;
                }
            }
            // Jittered backoff, so that waiters on several clients do not
            // retry in step.
            let jitter = rand::random::<u64>() % (pause.as_micros() as u64 + 1);
            std::thread::sleep(pause + std::time::Duration::from_micros(jitter));
            pause = (pause * 2).min(std::time::Duration::from_millis(5));
        }
    }
}
