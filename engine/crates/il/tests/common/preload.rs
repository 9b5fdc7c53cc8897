//! What the interception tests share: the library and the daemon built,
//! a peregrine-fuse mount, commands run with and without the library, its
//! report parsed.

use super::*;
use std::ffi::CString;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub fn target_dir() -> PathBuf {
    // target/<profile>/deps/il-<hash>
    let exe = std::env::current_exe().unwrap();
    exe.parent().unwrap().parent().unwrap().to_path_buf()
}

/// A workspace artifact: built with `cargo build -p <pkg>` when missing.
pub fn artifact(name: &str, pkg: &str) -> PathBuf {
    let p = target_dir().join(name);
    if !p.exists() {
        let profile = target_dir()
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let mut cmd = Command::new(env!("CARGO"));
        cmd.args(["build", "-p", pkg])
            .current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../.."));
        if profile == "release" {
            cmd.arg("--release");
        }
        let st = cmd.status();
        assert!(
            p.exists(),
            "{} is missing and `cargo build -p {pkg}` did not make it ({st:?}); build it first",
            p.display()
        );
    }
    p
}

/// The library, rebuilt when older than any of its sources or those of
/// the crates of this workspace it is built from (`cargo test` builds the
/// test harness, not the cdylib).
pub fn il_so() -> PathBuf {
    let p = target_dir().join("libperegrine_il.so");
    let crates = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let newest = ["il", "dfs", "client", "proto", "isal"]
        .iter()
        .filter_map(|c| newest_in(&crates.join(c).join("src")))
        .max();
    if p.exists() && mtime(&p) < newest {
        let _ = fs::remove_file(&p);
    }
    artifact("libperegrine_il.so", "peregrine-il")
}

fn mtime(p: &Path) -> Option<std::time::SystemTime> {
    fs::metadata(p).and_then(|m| m.modified()).ok()
}

/// The latest change of a file under `dir`.
fn newest_in(dir: &Path) -> Option<std::time::SystemTime> {
    fs::read_dir(dir)
        .ok()?
        .filter_map(|e| {
            let p = e.ok()?.path();
            match p.is_dir() {
                true => newest_in(&p),
                false => mtime(&p),
            }
        })
        .max()
}

pub fn mounted(dir: &Path) -> bool {
    let d = dir.to_str().unwrap();
    fs::read_to_string("/proc/mounts")
        .unwrap()
        .lines()
        .any(|l| l.split(' ').nth(1) == Some(d) && l.split(' ').nth(2) == Some("fuse.peregrine"))
}

pub struct Mount {
    pub dir: PathBuf,
    child: Option<Child>,
}

impl Mount {
    pub fn start(c: &Cluster, dir: &Path) -> Mount {
        Mount::start_with(c, dir, &[])
    }

    /// [`Mount::start`] with more daemon arguments.
    pub fn start_with(c: &Cluster, dir: &Path, args: &[&str]) -> Mount {
        fs::create_dir_all(dir).unwrap();
        let log = fs::File::create(dir.with_extension("log")).unwrap();
        // Default caching (attributes 1 s, page cache kept for 1 s): the
        // library must invalidate it after writing behind the kernel. Requests
        // over FUSE over io_uring where the kernel has it, as the daemon takes
        // them by default once its parameter is on.
        let uring = Path::new("/sys/module/fuse/parameters/enable_uring").exists()
            && !args.contains(&"--io-uring");
        let child = Command::new(artifact("peregrine-fuse", "peregrine-fuse"))
            .args(["--mgmt", &c.mgmt_addr(), "--pool", "pool", "--cont", "cont"])
            .args(c.tls_args())
            .arg("--mountpoint")
            .arg(dir)
            .arg("--foreground")
            .args(uring.then_some(["--io-uring", "on"]).into_iter().flatten())
            .args(args)
            .stdout(Stdio::from(log.try_clone().unwrap()))
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let m = Mount {
            dir: dir.canonicalize().unwrap(),
            child: Some(child),
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !mounted(&m.dir) {
            assert!(Instant::now() < deadline, "not mounted: {}", m.log());
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
}

impl Drop for Mount {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill on the pid of our own child, not yet reaped (so not reused).
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(10);
            while c.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
        let cs = CString::new(self.dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: `cs` is a NUL-terminated CString alive for the call.
        unsafe { libc::umount2(cs.as_ptr(), libc::MNT_DETACH) };
    }
}

/// Summed PEREGRINE_IL_REPORT counts of all processes of one command.
#[derive(Debug, Default)]
pub struct Report {
    pub lines: usize,
    pub opens: u64,
    pub reads: u64,
    pub writes: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
    pub stray_bytes: u64,
    pub stdio: u64,
    pub fallbacks: u64,
    pub syncs: u64,
    pub mmaps: u64,
    /// Path calls served by the library, and those it handed to the kernel.
    pub path_stats: u64,
    pub path_access: u64,
    pub mkdirs: u64,
    pub unlinks: u64,
    pub rmdirs: u64,
    pub renames: u64,
    pub path_opens: u64,
    pub path_creates: u64,
    /// Directory entries listed by the library.
    pub readdirs: u64,
    pub path_fallbacks: u64,
    /// Reads answered from the process's own writes (no round trip).
    pub cached_reads: u64,
    /// The first process's `first_failure` (quoted as the library prints it).
    pub first_failure: Option<String>,
}

pub fn parse_report(stderr: &str) -> Report {
    let mut r = Report::default();
    for l in stderr.lines().filter(|l| l.starts_with("peregrine-il[")) {
        r.lines += 1;
        if let Some((_, why)) = l.split_once(" first_failure=") {
            r.first_failure.get_or_insert_with(|| why.to_string());
        }
        for kv in l.split_whitespace() {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            let v: u64 = v.parse().unwrap_or(0);
            match k {
                "opens" => r.opens += v,
                "reads" => r.reads += v,
                "writes" => r.writes += v,
                "bytes_read" => r.bytes_read += v,
                "bytes_written" => r.bytes_written += v,
                "stray_bytes" => r.stray_bytes += v,
                "stdio" => r.stdio += v,
                "fallbacks" => r.fallbacks += v,
                "syncs" => r.syncs += v,
                "mmaps" => r.mmaps += v,
                "path_stats" => r.path_stats += v,
                "path_access" => r.path_access += v,
                "mkdirs" => r.mkdirs += v,
                "unlinks" => r.unlinks += v,
                "rmdirs" => r.rmdirs += v,
                "renames" => r.renames += v,
                "path_opens" => r.path_opens += v,
                "path_creates" => r.path_creates += v,
                "readdirs" => r.readdirs += v,
                "path_fallbacks" => r.path_fallbacks += v,
                "cached_reads" => r.cached_reads += v,
                _ => {}
            }
        }
    }
    r
}

/// `sh -c script` with the library preloaded; asserts success.
pub fn il_sh(dir: &Path, script: &str) -> (String, Report) {
    il_sh_env(dir, script, &[])
}

/// [`il_sh`] with more environment variables.
pub fn il_sh_env(dir: &Path, script: &str, env: &[(&str, &str)]) -> (String, Report) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("LD_PRELOAD", il_so())
        .env("PEREGRINE_IL_REPORT", "1")
        .env_remove("PEREGRINE_IL_DISABLE")
        // Path calls served too (the default); a test's `env` may say 0.
        .env_remove("PEREGRINE_IL_METADATA")
        .envs(env.iter().copied())
        .output()
        .unwrap_or_else(|e| {
            // Usually the mount refusing the chdir: the daemon's log says why.
            let log = fs::read_to_string(dir.with_extension("log")).unwrap_or_default();
            panic!("sh in {}: {e}\ndaemon log:\n{log}", dir.display())
        });
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(
        out.status.success(),
        "{script}: {}\n{err}",
        String::from_utf8_lossy(&out.stdout)
    );
    let rep = parse_report(&err);
    assert!(rep.lines > 0, "{script}: no report on stderr:\n{err}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), rep)
}

/// `sh -c script` on the kernel path (no library), from another process.
pub fn sh(dir: &Path, script: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env_remove("LD_PRELOAD")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// `tests/c/<name>.c` compiled into `dir`.
pub fn cc(name: &str, dir: &Path) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let bin = dir.join(name);
    let out = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("cc");
    assert!(
        out.status.success(),
        "cc {}: {}",
        src.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    bin
}

/// `cmd` with the library preloaded but switched off
/// (`PEREGRINE_IL_DISABLE=1`); asserts success, returns stdout.
pub fn disabled_sh(dir: &Path, script: &str) -> String {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .env("LD_PRELOAD", il_so())
        .env("PEREGRINE_IL_DISABLE", "1")
        .env("PEREGRINE_IL_REPORT", "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "{script} (library disabled): {}\n{err}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(!err.contains("peregrine-il["), "disabled library reported");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `got` equals `want`; on a difference, the first differing lines.
pub fn assert_same(got: &str, want: &str, what: &str) {
    if got == want {
        return;
    }
    for (i, (g, w)) in got.lines().zip(want.lines()).enumerate() {
        assert_eq!(g, w, "{what}: line {} differs (library, kernel)", i + 1);
    }
    assert_eq!(
        got.lines().count(),
        want.lines().count(),
        "{what}: line counts differ:\n{got}\n----\n{want}"
    );
}
