//! A `peregrine-fuse` daemon serving one mount, for tests that run programs
//! in it. Dropping it kills the daemon and detaches the mount.

use super::Cluster;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const FUSE_BIN: &str = env!("CARGO_BIN_EXE_peregrine-fuse");

/// False (and a printed reason) where the kernel offers no FUSE.
pub fn fuse_available() -> bool {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: /dev/fuse is absent; FUSE tests need it");
        return false;
    }
    true
}

/// Whether this kernel has FUSE over io_uring (Linux 6.14+ with CONFIG_FUSE_IO_URING):
/// its module parameter exists.
pub fn io_uring_available() -> bool {
    Path::new("/sys/module/fuse/parameters/enable_uring").exists()
}

/// False (and a printed reason) where the kernel offers no FUSE over io_uring.
pub fn fuse_io_uring_available() -> bool {
    if !fuse_available() {
        return false;
    }
    if !io_uring_available() {
        eprintln!("SKIP: this kernel has no FUSE over io_uring (fuse.enable_uring)");
        return false;
    }
    true
}

pub fn is_mounted(dir: &Path) -> bool {
    let d = dir.to_str().unwrap();
    fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(d) && l.split(' ').nth(2) == Some("fuse.peregrine"))
}

pub struct FuseMount {
    pub dir: PathBuf,
    pub child: Option<Child>,
}

impl FuseMount {
    /// Mount container `cont` of pool `pool` on `dir` (created if needed),
    /// foreground daemon, extra daemon flags in `extra`. The daemon takes its
    /// requests over FUSE over io_uring (`--io-uring on`, which turns the
    /// kernel's parameter on) unless `extra` says otherwise; where the kernel
    /// has no such parameter, over /dev/fuse.
    pub fn start(c: &Cluster, cont: &str, dir: &Path, extra: &[&str]) -> FuseMount {
        FuseMount::start_on(c, "pool", cont, dir, extra)
    }

    /// As [`FuseMount::start`], for a container of pool `pool`.
    pub fn start_on(c: &Cluster, pool: &str, cont: &str, dir: &Path, extra: &[&str]) -> FuseMount {
        let child = FuseMount::command(c, pool, cont, dir, extra)
            .spawn()
            .unwrap();
        FuseMount::wait_mounted(dir, child)
    }

    /// The daemon's command line for [`FuseMount::start_on`], its output
    /// to the mount's log (`dir` created): for a test that changes how it
    /// runs, then spawns it and gives it to [`FuseMount::wait_mounted`].
    pub fn command(c: &Cluster, pool: &str, cont: &str, dir: &Path, extra: &[&str]) -> Command {
        fs::create_dir_all(dir).unwrap();
        let log = fs::File::create(dir.with_extension("log")).unwrap();
        let mut cmd = Command::new(FUSE_BIN);
        cmd.args(["--mgmt", &c.mgmt_addr(), "--pool", pool, "--cont", cont])
            .args(c.tls_args())
            .arg("--mountpoint")
            .arg(dir)
            .arg("--foreground")
            .args(
                (!extra.contains(&"--io-uring") && io_uring_available())
                    .then_some(["--io-uring", "on"])
                    .into_iter()
                    .flatten(),
            )
            .args(extra)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log));
        cmd
    }

    /// Waits until the daemon `child` (of [`FuseMount::command`]) has
    /// mounted `dir`; panics with its log if it exits first.
    pub fn wait_mounted(dir: &Path, child: Child) -> FuseMount {
        let mut m = FuseMount {
            dir: dir.canonicalize().unwrap(),
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !is_mounted(&m.dir) {
            if let Some(st) = m.exit_status() {
                panic!("peregrine-fuse exited with {st}: {}", m.log());
            }
            assert!(
                Instant::now() < deadline,
                "not mounted in 30 s: {}",
                m.log()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        m
    }

    pub fn log(&self) -> String {
        fs::read_to_string(self.dir.with_extension("log")).unwrap_or_default()
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    /// The daemon's exit status if it has exited (None while it runs).
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().unwrap())
    }

    /// SIGTERM; the daemon must unmount and exit 0.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill on the pid of our own child, not yet reaped (so not reused).
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Some(st) = c.try_wait().unwrap() {
                    assert!(st.success(), "exit status {st}: {}", self.log());
                    break;
                }
                assert!(Instant::now() < deadline, "no exit 20 s after SIGTERM");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        assert!(!is_mounted(&self.dir), "still mounted after SIGTERM");
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let cs = CString::new(self.dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: `cs` is a NUL-terminated CString alive for the call.
        unsafe { libc::umount2(cs.as_ptr(), libc::MNT_DETACH) };
    }
}
