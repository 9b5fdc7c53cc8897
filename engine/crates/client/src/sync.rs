//! Locks for code that runs inside other people's processes: this library,
//! and through it the FUSE layer (`peregrine-dfs`) and the interception
//! library, which is preloaded into programs that fork.
//!
//! They are std's futex locks behind the interface the crates had from
//! parking_lot (a lock is taken without a poison check; a condition wait
//! borrows the guard). Why not parking_lot: its waiters are recorded in one
//! process-wide table, and fork(2) copies that table with the records of
//! threads the child does not have. A thread the child starts gets such a
//! thread's stack back from glibc, and with it the same record, which it
//! then queues a second time: the next wake-up in that bucket loops for
//! ever. That hung `bash` under LD_PRELOAD (a command substitution's child
//! reconnecting while the parent's commit thread waited). A futex waiter
//! leaves nothing in the child.
//!
//! Locks held across fork (the interception library's tables) are taken
//! with [`Mutex::hold_across_fork`] / [`RwLock::hold_across_fork`] and let
//! go in both processes with [`release_held`].

use std::any::Any;
use std::cell::RefCell;
use std::ops::{Deref, DerefMut};
use std::sync::PoisonError;
use std::time::Duration;

/// A mutual exclusion lock; a panic while it was held does not poison it.
#[derive(Default, Debug)]
pub struct Mutex<T: ?Sized>(std::sync::Mutex<T>);

/// The guard of a [`Mutex`]; `None` only inside [`Condvar::wait`].
pub struct MutexGuard<'a, T: ?Sized + 'a>(Option<std::sync::MutexGuard<'a, T>>);

impl<T> Mutex<T> {
    pub const fn new(value: T) -> Mutex<T> {
        Mutex(std::sync::Mutex::new(value))
    }
}

impl<T: ?Sized> Mutex<T> {
    pub fn lock(&self) -> MutexGuard<'_, T> {
        MutexGuard(Some(self.0.lock().unwrap_or_else(PoisonError::into_inner)))
    }

    pub fn try_lock(&self) -> Option<MutexGuard<'_, T>> {
        match self.0.try_lock() {
            Ok(g) => Some(MutexGuard(Some(g))),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(MutexGuard(Some(p.into_inner()))),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

impl<T: ?Sized + 'static> Mutex<T> {
    /// Lock it in this thread until [`release_held`] (fork's prepare
    /// handler: the child then finds the data consistent).
    pub fn hold_across_fork(&'static self) {
        hold(Box::new(self.lock()));
    }
}

impl<T: ?Sized> Deref for MutexGuard<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        self.0.as_deref().expect("guard present outside a wait")
    }
}

impl<T: ?Sized> DerefMut for MutexGuard<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        self.0.as_deref_mut().expect("guard present outside a wait")
    }
}

/// A reader-writer lock; a panic while it was held does not poison it.
#[derive(Default, Debug)]
pub struct RwLock<T: ?Sized>(std::sync::RwLock<T>);

pub type RwLockReadGuard<'a, T> = std::sync::RwLockReadGuard<'a, T>;
pub type RwLockWriteGuard<'a, T> = std::sync::RwLockWriteGuard<'a, T>;

impl<T> RwLock<T> {
    pub const fn new(value: T) -> RwLock<T> {
        RwLock(std::sync::RwLock::new(value))
    }
}

impl<T: ?Sized> RwLock<T> {
    pub fn read(&self) -> RwLockReadGuard<'_, T> {
        self.0.read().unwrap_or_else(PoisonError::into_inner)
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, T> {
        self.0.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// Read-lock it if no writer holds it.
    pub fn try_read(&self) -> Option<RwLockReadGuard<'_, T>> {
        match self.0.try_read() {
            Ok(g) => Some(g),
            Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }
}

impl<T: ?Sized + 'static> RwLock<T> {
    /// Write-lock it in this thread until [`release_held`].
    pub fn hold_across_fork(&'static self) {
        hold(Box::new(self.write()));
    }
}

/// A condition variable for [`Mutex`].
#[derive(Default, Debug)]
pub struct Condvar(std::sync::Condvar);

impl Condvar {
    pub const fn new() -> Condvar {
        Condvar(std::sync::Condvar::new())
    }

    /// Unlock `guard`, wait for a notification (or a spurious wake-up), and
    /// lock it again.
    pub fn wait<T>(&self, guard: &mut MutexGuard<'_, T>) {
        let g = guard.0.take().expect("guard present outside a wait");
        guard.0 = Some(self.0.wait(g).unwrap_or_else(PoisonError::into_inner));
    }

    /// [`Condvar::wait`] for at most `timeout`; true if it timed out.
    pub fn wait_for<T>(&self, guard: &mut MutexGuard<'_, T>, timeout: Duration) -> bool {
        let g = guard.0.take().expect("guard present outside a wait");
        let (g, r) = self
            .0
            .wait_timeout(g, timeout)
            .unwrap_or_else(PoisonError::into_inner);
        guard.0 = Some(g);
        r.timed_out()
    }

    pub fn notify_all(&self) {
        self.0.notify_all();
    }
}

thread_local! {
    /// Guards held across a fork by the thread that forks, in the order taken.
    static HELD: RefCell<Vec<Box<dyn Any>>> = const { RefCell::new(Vec::new()) };
}

fn hold(guard: Box<dyn Any>) {
    HELD.with(|h| h.borrow_mut().push(guard));
}

/// Unlock, last taken first, what this thread took with `hold_across_fork`
/// (fork's parent and child handlers; the child is that same thread).
pub fn release_held() {
    while let Some(g) = HELD.with(|h| h.borrow_mut().pop()) {
        drop(g);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_wait_gives_the_lock_back_and_takes_it_again() {
        let pair = Arc::new((Mutex::new(0u32), Condvar::new()));
        let p = pair.clone();
        let t = std::thread::spawn(move || {
            *p.0.lock() = 1;
            p.1.notify_all();
        });
        let mut g = pair.0.lock();
        while *g == 0 {
            pair.1.wait(&mut g);
        }
        assert_eq!(*g, 1);
        drop(g);
        t.join().unwrap();
        assert!(pair
            .1
            .wait_for(&mut pair.0.lock(), Duration::from_millis(1)));
    }

    #[test]
    fn a_panic_under_the_lock_does_not_poison_it() {
        let m = Arc::new(Mutex::new(5));
        let m2 = m.clone();
        let _ = std::thread::spawn(move || {
            let _g = m2.lock();
            panic!("under the lock");
        })
        .join();
        assert_eq!(*m.lock(), 5);
        assert!(m.try_lock().is_some());
    }

    #[test]
    fn held_locks_are_released_last_first() {
        static A: Mutex<u8> = Mutex::new(0);
        static B: RwLock<u8> = RwLock::new(0);
        A.hold_across_fork();
        B.hold_across_fork();
        assert!(A.try_lock().is_none());
        release_held();
        assert!(A.try_lock().is_some());
        *B.write() = 1;
    }
}
