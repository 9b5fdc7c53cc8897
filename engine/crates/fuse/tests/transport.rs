//! Which transport the daemon takes the kernel's requests over when
//! io_uring is refused to it, as a container's default seccomp profile
//! refuses it (containerd's and Docker's deny the io_uring system calls):
//! `auto` mounts over /dev/fuse and says why, `on` refuses to mount.

mod common;

use common::mount::{fuse_io_uring_available, is_mounted, FuseMount};
use common::*;
use std::fs;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

/// A seccomp filter that fails io_uring_setup, io_uring_enter and
/// io_uring_register with EPERM and allows every other call.
fn io_uring_denied() -> Vec<libc::sock_filter> {
    let stmt = |code: u32, k: u32| libc::sock_filter {
        code: code as u16,
        jt: 0,
        jf: 0,
        k,
    };
    let jeq = |k: libc::c_long, jt: u8| libc::sock_filter {
        code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16,
        jt,
        jf: 0,
        k: k as u32,
    };
    vec![
        // seccomp_data.nr
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        jeq(libc::SYS_io_uring_setup, 3),
        jeq(libc::SYS_io_uring_enter, 2),
        jeq(libc::SYS_io_uring_register, 1),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
        stmt(
            libc::BPF_RET | libc::BPF_K,
            libc::SECCOMP_RET_ERRNO | libc::EPERM as u32,
        ),
    ]
}

/// The daemon's command, run under [`io_uring_denied`].
fn denied_command(c: &Cluster, dir: &std::path::Path, io_uring: &str) -> std::process::Command {
    let mut cmd = FuseMount::command(c, "pool", "cont", dir, &["--io-uring", io_uring]);
    let mut filter = io_uring_denied();
    // SAFETY: the closure runs in the child between fork and exec and makes
    // only the two prctl calls, on memory allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog {
                len: filter.len() as u16,
                filter: filter.as_mut_ptr(),
            };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(
                    libc::PR_SET_SECCOMP,
                    libc::SECCOMP_MODE_FILTER,
                    &prog as *const libc::sock_fprog,
                ) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    cmd
}

#[test]
fn io_uring_refused_by_seccomp_auto_serves_dev_fuse_and_on_refuses() {
    if !fuse_io_uring_available() {
        return;
    }
    // The parameter on (as `--io-uring on` leaves it): the kernel offers it.
    fs::write("/sys/module/fuse/parameters/enable_uring", "Y").unwrap();
    let c = Cluster::with_pool(ClusterSpec::default(), 128, "SX", "crc32c");
    let tmp = tempfile::tempdir().unwrap();

    // auto: mounted over /dev/fuse, the reason in the log, and it works.
    let dir = tmp.path().join("auto");
    let child = denied_command(&c, &dir, "auto").spawn().unwrap();
    let mut m = FuseMount::wait_mounted(&dir, child);
    // Bounded: a kernel that negotiated io_uring holds every request until
    // the rings are up, so without the check at INIT this hung.
    let f = m.p("f");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        fs::write(&f, b"over /dev/fuse").unwrap();
        tx.send(fs::read(&f).unwrap()).unwrap();
    });
    let got = rx.recv_timeout(Duration::from_secs(30));
    assert_eq!(
        got.as_deref().ok(),
        Some(&b"over /dev/fuse"[..]),
        "{}",
        m.log()
    );
    let log = m.log();
    let mounted = log
        .lines()
        .find(|l| l.contains("peregrine-fuse: mounted "))
        .unwrap_or_else(|| panic!("no mount line: {log}"));
    assert!(mounted.ends_with(", /dev/fuse)"), "{log}");
    assert!(
        log.contains("FUSE over io_uring: io_uring_setup: Operation not permitted"),
        "{log}"
    );
    m.stop();

    // on: no mount, and the error says why.
    let dir = tmp.path().join("on");
    let mut child = denied_command(&c, &dir, "on").spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    let st = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "--io-uring on still running");
        std::thread::sleep(Duration::from_millis(20));
    };
    let log = fs::read_to_string(dir.with_extension("log")).unwrap();
    assert!(!st.success(), "{log}");
    assert!(
        log.contains("--io-uring on: FUSE over io_uring is not available"),
        "{log}"
    );
    assert!(!is_mounted(&dir.canonicalize().unwrap()), "{log}");
}
