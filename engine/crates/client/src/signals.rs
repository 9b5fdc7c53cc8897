//! The library's own threads take no signals. A signal the program
//! handles is delivered to any thread that does not block it; its handler
//! run on one of ours races with the program (bash's SIGCHLD handler walks
//! its job table: bash under the interception library crashed in a
//! `peregrine-io` thread). So they start with every signal blocked.

use std::io;
use std::thread::{Builder, JoinHandle};

/// Block every signal in the calling thread; the old mask.
pub fn block_all() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; sigfillset and pthread_sigmask fill
    // and read live locals.
    unsafe {
        let mut all: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigfillset(&mut all);
        libc::pthread_sigmask(libc::SIG_BLOCK, &all, &mut old);
        old
    }
}

/// Put back a mask [`block_all`] returned.
pub fn restore(old: &libc::sigset_t) {
    // SAFETY: `old` is a mask pthread_sigmask gave.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}

/// `b.spawn(f)` with every signal blocked in the new thread from its
/// first instruction (it inherits the mask set around the spawn).
pub fn spawn_quiet<F, T>(b: Builder, f: F) -> io::Result<JoinHandle<T>>
where
    F: FnOnce() -> T + Send + 'static,
    T: Send + 'static,
{
    let old = block_all();
    let r = b.spawn(f);
    restore(&old);
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quiet_thread_blocks_every_signal_and_the_caller_keeps_its_mask() {
        fn blocked(s: &libc::sigset_t, sig: libc::c_int) -> bool {
            // SAFETY: sigismember reads a mask pthread_sigmask gave.
            unsafe { libc::sigismember(s, sig) == 1 }
        }
        let mine = block_all();
        restore(&mine);
        let t = spawn_quiet(Builder::new(), move || {
            let cur = block_all();
            [libc::SIGCHLD, libc::SIGINT, libc::SIGUSR1, libc::SIGTERM]
                .iter()
                .all(|&sig| blocked(&cur, sig))
        })
        .unwrap();
        assert!(t.join().unwrap());
        let now = block_all();
        restore(&now);
        assert_eq!(blocked(&now, libc::SIGUSR1), blocked(&mine, libc::SIGUSR1));
    }
}
