//! The threads that run an operation's shard requests side by side
//! ([`par_map`]). They are kept between operations: a thread started and
//! joined for each shard request cost more than the request itself on the
//! metadata path (the size of a striped file asks every target, so each
//! stat through the POSIX layer started and ended a thread per extra
//! target: `do_exit` and `start_thread` were about 8% of the CPU time of
//! mdtest through the interception library, bench/posix.sh).
//!
//! A worker waits for jobs on one shared channel; one that has had nothing
//! to do for [`IDLE_EXIT`] ends. A job goes to an idle worker, or to a new
//! one when none is idle, so that nested and concurrent calls never wait
//! for each other. After a fork the child, which has none of its parent's
//! threads, starts a pool of its own (the pool is looked up by pid, without
//! a lock a thread of the parent may have held at the fork).

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicPtr, AtomicUsize, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// How long a worker without work stays.
const IDLE_EXIT: Duration = Duration::from_secs(10);

type Job = Box<dyn FnOnce() + Send + 'static>;

struct Pool {
    pid: u32,
    jobs: Sender<Job>,
    queue: Mutex<Receiver<Job>>,
    /// Workers waiting for a job that no submitter has claimed yet.
    idle: AtomicUsize,
}

/// This process's pool (a leaked `Pool`; a forked child leaks its parent's
/// and makes another).
static POOL: AtomicPtr<Pool> = AtomicPtr::new(std::ptr::null_mut());

fn pool() -> &'static Pool {
    let pid = std::process::id();
    let cur = POOL.load(Ordering::Acquire);
    // SAFETY: POOL holds null or a pointer from Box::leak, never freed.
    if let Some(p) = unsafe { cur.as_ref() } {
        if p.pid == pid {
            return p;
        }
    }
    let (jobs, queue) = channel();
    let new = Box::leak(Box::new(Pool {
        pid,
        jobs,
        queue: Mutex::new(queue),
        idle: AtomicUsize::new(0),
    }));
    match POOL.compare_exchange(cur, new, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => new,
        // Another thread of this process made one first: use that one (the
        // spare is leaked, once).
        // SAFETY: as above.
        Err(other) => unsafe { &*other },
    }
}

fn worker(p: &'static Pool) {
    loop {
        let next = p
            .queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .recv_timeout(IDLE_EXIT);
        match next {
            Ok(job) => {
                job();
                p.idle.fetch_add(1, Ordering::AcqRel);
            }
            Err(RecvTimeoutError::Timeout) => {
                // Leave only if no submitter has counted on this worker.
                let leave = p
                    .idle
                    .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
                    .is_ok();
                if leave {
                    return;
                }
            }
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// Run `job` on a worker: an idle one, else a new one; if no thread can be
/// started, here.
fn submit(job: Job) {
    let p = pool();
    let claimed = p
        .idle
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
        .is_ok();
    if !claimed
        && crate::signals::spawn_quiet(
            std::thread::Builder::new().name("peregrine-io".into()),
            move || worker(p),
        )
        .is_err()
    {
        job();
        return;
    }
    if let Err(e) = p.jobs.send(job) {
        // Unreachable while the pool holds its receiver; run it here rather
        // than lose it.
        (e.0)();
    }
}

/// Counts the jobs of one call still running.
struct Latch {
    left: Mutex<usize>,
    done: Condvar,
}

impl Latch {
    fn count_down(&self) {
        let mut n = self.left.lock().unwrap_or_else(|e| e.into_inner());
        *n -= 1;
        if *n == 0 {
            self.done.notify_all();
        }
    }

    fn wait(&self) {
        let mut n = self.left.lock().unwrap_or_else(|e| e.into_inner());
        while *n > 0 {
            n = self.done.wait(n).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// Run `f` over `items` side by side, at most `width` at once (the first
/// item of each wave on the calling thread), and return the results in
/// order. A panic in any `f` is resumed here once every item of its wave
/// has finished.
pub fn par_map<T: Sync, R: Send>(items: &[T], width: usize, f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(&f).collect();
    }
    let mut out = Vec::with_capacity(items.len());
    for wave in items.chunks(width.max(1)) {
        let slots: Vec<Mutex<Option<std::thread::Result<R>>>> =
            wave[1..].iter().map(|_| Mutex::new(None)).collect();
        let latch = Latch {
            left: Mutex::new(wave.len() - 1),
            done: Condvar::new(),
        };
        for (it, slot) in wave[1..].iter().zip(&slots) {
            let (f, latch) = (&f, &latch);
            let job = move || {
                let r = catch_unwind(AssertUnwindSafe(|| f(it)));
                *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(r);
                latch.count_down();
            };
            let job: Box<dyn FnOnce() + Send + '_> = Box::new(job);
            // SAFETY: the job borrows `f`, `it`, `slot` and `latch`, which
            // live until this function returns; it does not return (nor
            // unwind: the first item's panic is caught) before `latch.wait()`
            // has seen every job of the wave finish, and a job touches
            // nothing of theirs after its count_down.
            let job: Job =
                unsafe { std::mem::transmute::<Box<dyn FnOnce() + Send + '_>, Job>(job) };
            submit(job);
        }
        let first = catch_unwind(AssertUnwindSafe(|| f(&wave[0])));
        latch.wait();
        out.push(first.unwrap_or_else(|p| resume_unwind(p)));
        for s in slots {
            let r = s
                .into_inner()
                .unwrap_or_else(|e| e.into_inner())
                .expect("the latch counted every job done");
            out.push(r.unwrap_or_else(|p| resume_unwind(p)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU32;

    #[test]
    fn results_in_order_nested_calls_and_panics() {
        let items: Vec<u32> = (0..100).collect();
        let out = par_map(&items, 32, |&i| {
            // Nested: a job that runs par_map itself never waits for a
            // worker busy with its caller.
            par_map(&[i, i + 1], 2, |&j| j * 2).iter().sum::<u32>()
        });
        assert_eq!(out, items.iter().map(|i| 4 * i + 2).collect::<Vec<_>>());

        // A panic in a worker's item reaches the caller, after the others ran.
        let ran = AtomicU32::new(0);
        let r = catch_unwind(AssertUnwindSafe(|| {
            par_map(&[0u32, 1, 2, 3], 4, |&i| {
                ran.fetch_add(1, Ordering::SeqCst);
                assert_ne!(i, 2, "item 2 fails");
                i
            })
        }));
        assert!(r.is_err());
        assert_eq!(ran.load(Ordering::SeqCst), 4);
        // The pool still serves.
        assert_eq!(par_map(&[1u32, 2, 3], 3, |&i| i + 1), vec![2, 3, 4]);
    }

    #[test]
    fn a_forked_child_runs_its_own_workers() {
        assert_eq!(par_map(&[1u32, 2], 2, |&i| i), vec![1, 2]);
        // SAFETY: the child only runs par_map (its own new pool) and _exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            // SAFETY: a hung child dies of SIGALRM (the parent then fails).
            unsafe { libc::alarm(20) };
            let ok = par_map(&[1u32, 2, 3], 3, |&i| i * 10) == vec![10, 20, 30];
            // SAFETY: exit without running the parent's destructors.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        assert!(pid > 0, "fork failed");
        let mut status = 0;
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, &mut status, 0) };
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child status {status:#x}"
        );
    }
}
