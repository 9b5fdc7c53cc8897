//! The library's locks in a process that forks (the interception library
//! runs inside programs that do): a child forked while one of the parent's
//! threads waits starts threads of its own, which wait and are woken.
//!
//! A thread the child starts gets the stack of a parent's thread back from
//! glibc. With parking_lot's process-wide table of waiters, the child found
//! the parent's waiter still queued at the same address as its new one and
//! the next wake-up looped for ever: this test then hung in 1 child in 16
//! (the children's condition variables differ in address, so in bucket).
//! Its own binary: the children fork from a process with no other tests'
//! threads in it.

use peregrine::sync::{Condvar, Mutex};
use std::sync::Arc;
use std::time::{Duration, Instant};

type Flag = Arc<(Mutex<bool>, Condvar)>;

fn wait_for(flag: &Flag) {
    let mut g = flag.0.lock();
    while !*g {
        flag.1.wait(&mut g);
    }
}

fn raise(flag: &Flag) {
    *flag.0.lock() = true;
    flag.1.notify_all();
}

#[test]
fn children_forked_while_a_thread_waits_wait_and_wake() {
    const CHILDREN: usize = 64;
    let parked = Flag::default();
    let p = parked.clone();
    let waiter = std::thread::spawn(move || wait_for(&p));
    std::thread::sleep(Duration::from_millis(50));
    for i in 0..CHILDREN {
        // SAFETY: the child allocates, starts and joins one thread, and
        // leaves with _exit (no destructors, no exit handlers).
        let pid = unsafe { libc::fork() };
        assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
        if pid == 0 {
            // A different address (and wait bucket) in each child.
            let shift: Vec<Flag> = (0..i).map(|_| Flag::default()).collect();
            let f = Flag::default();
            let f2 = f.clone();
            let t = std::thread::spawn(move || wait_for(&f2));
            std::thread::sleep(Duration::from_millis(2));
            raise(&f);
            let ok = t.join().is_ok();
            drop(shift);
            // SAFETY: ends the child.
            unsafe { libc::_exit(if ok { 0 } else { 1 }) };
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut status = 0;
        // SAFETY: waits for the child just forked.
        while unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) } != pid {
            if Instant::now() > deadline {
                // SAFETY: the child just forked, then reaped.
                unsafe {
                    libc::kill(pid, libc::SIGKILL);
                    libc::waitpid(pid, &mut status, 0);
                }
                panic!("child {i} of {CHILDREN} hung waking its own thread");
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(
            libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
            "child {i}: status {status:#x}"
        );
    }
    raise(&parked);
    waiter.join().unwrap();
}
