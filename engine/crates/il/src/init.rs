//! Init (the library's constructor), fork handlers and the exit flush.

use crate::mounts::MOUNTS;
use crate::ns::NSS;
use crate::real::r_fcntl;
use crate::report::{enabled, env_on, report, COUNTS, REPORT_FD};
use crate::table::{Shared, CONTS, FDS, MAPPED};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// At exit: the connections are never dropped (they live in a static), so
/// send the commits of this process's last writes before it goes, or other
/// readers of them wait for the engines to settle them (seconds).
extern "C" fn flush_commits() {
    crate::ns::settle_discards();
    // Another thread may hold the table while the process exits: skip then.
    if let Some(conts) = CONTS.try_lock() {
        for (_, c, _) in conts.iter() {
            c.pool().client().flush_commits();
        }
    }
}

extern "C" fn fork_prepare() {
    // Placeholders become the real files first: parent and child then
    // share the kernel's open file (and its offset) even if the child
    // execs (a conversion in the child would give it a file of its own).
    crate::convert::hand_over(true);
    // Hold the tables across fork so the child gets them consistent.
    FDS.hold_across_fork();
    CONTS.hold_across_fork();
    MOUNTS.hold_across_fork();
    MAPPED.hold_across_fork();
    NSS.hold_across_fork();
    crate::cache::hold_across_fork();
    crate::nsops::hold_across_fork();
    crate::dirs::hold_across_fork();
    crate::dirs_changed::hold_across_fork();
}

extern "C" fn fork_parent() {
    peregrine::sync::release_held();
}

extern "C" fn fork_child() {
    // Held by fork_prepare in the thread that forked (this one).
    // MAPPED is kept: the child inherits the parent's mappings.
    peregrine::sync::release_held();
    // Connections belong to the parent: leak them (dropping could touch
    // locks held by the parent's other threads, or their sockets).
    std::mem::forget(std::mem::take(&mut *CONTS.lock()));
    crate::ns::fork_child();
    MOUNTS.lock().forget_watch();
    // Fresh locks and no File per tracked description (dup'ed fds keep
    // sharing one state); the child reconnects on first use.
    let mut t = FDS.write();
    let old = std::mem::take(&mut *t);
    let mut new: Vec<Option<Arc<Shared>>> = Vec::with_capacity(old.len());
    let mut map: Vec<(*const Shared, Arc<Shared>)> = Vec::new();
    for e in &old {
        new.push(e.as_ref().map(|s| {
            let p = Arc::as_ptr(s);
            if let Some((_, n)) = map.iter().find(|(q, _)| *q == p) {
                return n.clone();
            }
            let n = Arc::new(s.fresh_copy());
            map.push((p, n.clone()));
            n
        }));
    }
    std::mem::forget(old);
    *t = new;
    for c in &COUNTS {
        c.store(0, Ordering::Relaxed);
    }
    crate::place::note_pid();
}

extern "C" fn il_init() {
    crate::probe::answer();
    crate::place::note_pid();
    if !enabled() {
        return;
    }
    // SAFETY: registering static handlers.
    unsafe {
        libc::pthread_atfork(Some(fork_prepare), Some(fork_parent), Some(fork_child));
        libc::atexit(flush_commits);
        libc::atexit(crate::dirs_changed::at_exit);
        if env_on(b"PEREGRINE_IL_REPORT\0") {
            let fd = r_fcntl()(2, libc::F_DUPFD_CLOEXEC, 900);
            REPORT_FD.store(fd, Ordering::Relaxed);
            libc::atexit(report);
        }
        // Last registered, first run: before the report and the commits.
        libc::atexit(crate::stray::at_exit);
    }
}

#[used]
#[link_section = ".init_array"]
static INIT: extern "C" fn() = il_init;
