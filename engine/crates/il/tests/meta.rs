//! Issue 19, point 6: path calls (stat, access, mkdir, unlink, rmdir,
//! rename, open) on files of a Peregrine mount served by
//! libperegrine_il.so through the POSIX layer, against real engines and a
//! real peregrine-fuse mount. Each step runs a real program with the
//! library and compares its output with the same program on the kernel
//! path (no library), and checks from the report that the library served
//! the calls.

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::time::Duration;

fn fuse_ok() -> bool {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: /dev/fuse is absent; the interception tests need a FUSE mount");
        return false;
    }
    true
}

fn cluster() -> Cluster {
    Cluster::with_pool(
        ClusterSpec {
            engines: 1,
            targets: 2,
            device_mib: 512,
            scm_mib: 128,
        },
        300,
        "SX",
        "crc32c",
    )
}

/// The daemon's default attribute and entry timeout, the bound of the
/// kernel's caches and of the library's (PEREGRINE_IL_CACHE_MS default).
const TTL: Duration = Duration::from_millis(1000);

/// A cluster, a mount of it and tests/c/metatest.c built outside it.
fn with_metatest() -> (Cluster, Mount, std::path::PathBuf) {
    let c = cluster();
    let m = Mount::start(&c, &c.dir.path().join("mnt"));
    let tmp = c.dir.path().join("local");
    fs::create_dir_all(&tmp).unwrap();
    let bin = cc("metatest", &tmp);
    (c, m, bin)
}

/// stat, lstat, fstatat, statx and access of files, directories, a
/// symlink, a FIFO, missing names and paths through a file, through the
/// library and on the kernel path: the same answers, field by field.
#[test]
fn stat_and_access_match_the_kernel() {
    if !fuse_ok() {
        return;
    }
    let (_c, m, bin) = with_metatest();
    sh(
        &m.dir,
        "mkdir -p d/e/g && echo hello > d/f && printf 12345678 > d/e/big && ln -s f d/l \
         && ln -s nowhere d/dangling && mkfifo d/p && chmod 640 d/f && chmod 700 d/e/g \
         && chmod 1777 d/e",
    );
    // The kernel's cached attributes of what was just made expire.
    std::thread::sleep(TTL + Duration::from_millis(200));
    let paths = "d d/ d/e d/e/g d/f d/e/big d/l d/dangling d/p d/nope d/f/x d/e/../f \
                 ./d/./e/big d/e/g/.. . ..";
    let cmd = format!(
        "{} stat {paths} && {} stat {}/d/f {}",
        bin.display(),
        bin.display(),
        m.dir.display(),
        m.dir.display()
    );
    let want = sh(&m.dir, &cmd);
    let (got, r) = il_sh(&m.dir, &cmd);
    eprintln!("stat through the library: {r:?}");
    assert_same(&got, &want, "metatest stat");
    assert!(r.path_stats >= 40 && r.path_access >= 40, "{r:?}");
    // Symlinks followed, `..` above the mount: the kernel's.
    assert!(r.path_fallbacks >= 1, "{r:?}");

    // coreutils and python3 agree too.
    let cmd = "stat -c '%d %i %f %h %u %g %s %b %B %o %x %y %z %n' d d/e d/f d/e/big d/p \
               && ls -la d d/e && test -e d/f && ! test -e d/nope && test -d d/e";
    let want = sh(&m.dir, cmd);
    let (got, r) = il_sh(&m.dir, cmd);
    assert_same(&got, &want, "coreutils");
    assert!(r.path_stats >= 5, "{r:?}");
    if have("python3") {
        let py = "python3 -c 'import os\nfor p in [\"d\", \"d/f\", \"d/l\", \"d/nope\"]:\n  \
                  try:\n    s = os.stat(p); print(p, s.st_ino, s.st_mode, s.st_size, \
                  s.st_nlink, s.st_mtime_ns, os.access(p, os.W_OK))\n  \
                  except OSError as e: print(p, e.errno)\n'";
        let want = sh(&m.dir, py);
        let (got, r) = il_sh(&m.dir, py);
        assert_same(&got, &want, "python3");
        assert!(r.path_stats >= 3, "{r:?}");
    }
    assert!(!m.log().contains("panicked"), "daemon log: {}", m.log());
}

/// mkdir, rename, renameat2 (NOREPLACE, EXCHANGE), unlink, unlinkat and
/// rmdir with their failures (EEXIST, ENOENT, ENOTDIR, EISDIR, ENOTEMPTY,
/// EINVAL for a directory into itself), and umask: tests/c/metatest.c
/// gives the same answers through the library as on the kernel path, and
/// the kernel path then shows the tree the library made.
#[test]
fn namespace_changes_match_the_kernel() {
    if !fuse_ok() {
        return;
    }
    let (_c, m, bin) = with_metatest();
    // A regular file the library finds the mount's container through.
    sh(&m.dir, "echo seed > seed && mkdir k l");
    let want = sh(&m.dir, &format!("{} ns k", bin.display()));
    let (got, r) = il_sh(&m.dir, &format!("{} ns l", bin.display()));
    eprintln!("ns through the library: {r:?}");
    assert_same(&got, &want, "metatest ns");
    assert!(r.mkdirs >= 6 && r.renames >= 2 && r.rmdirs >= 2, "{r:?}");
    // On the kernel path, after its caches expire, the trees are the same.
    std::thread::sleep(TTL + Duration::from_millis(200));
    let tree = |d: &str| {
        sh(
            &m.dir,
            &format!("cd {d} && find . -printf '%p %M %n %s\\n' | sort"),
        )
    };
    assert_same(&tree("l"), &tree("k"), "trees");
    // coreutils through the library agree with the kernel path too.
    let script = "mkdir -p p/q/r && mv p/q p/s && touch p/s/t && rm p/s/t && rmdir p/s/r p/s \
                  && mkdir p/u && mv -T p/u p/v && ls -la p | awk '{print $1, $2, $NF}'";
    let want = sh(&m.p("k"), script);
    let (got, r) = il_sh(&m.p("l"), script);
    assert_same(&got, &want, "coreutils");
    // mv and rmdir are other processes than mkdir: the names are not
    // theirs, the kernel removes and renames them (see nsops.rs).
    assert!(r.mkdirs >= 1 && r.path_stats >= 1, "{r:?}");
    assert!(!m.log().contains("panicked"), "daemon log: {}", m.log());
}

/// Listings (readdir and friends) through the library: the same entries,
/// inodes and types as the kernel's, seekdir/telldir/rewinddir/readdir_r
/// as on the kernel path, over more entries than one round of the store;
/// coreutils, find and python3 agree, and the stats after a listing are
/// answered from the cache it filled.
#[test]
fn listings_match_the_kernel() {
    if !fuse_ok() {
        return;
    }
    let (_c, m, bin) = with_metatest();
    sh(
        &m.dir,
        "mkdir -p d/sub/deeper d/empty && for i in $(seq 1 300); do echo $i > d/f$i; done \
         && ln -s f1 d/link && mkfifo d/fifo && echo x > d/sub/g",
    );
    std::thread::sleep(TTL + Duration::from_millis(200));
    let cmd = format!("{} dirs d d/sub d/empty . d/nope d/f1", bin.display());
    let want = sh(&m.dir, &cmd);
    let (got, r) = il_sh(&m.dir, &cmd);
    eprintln!("listings through the library: {r:?}");
    assert_same(&got, &want, "metatest dirs");
    assert!(want.contains("306 entries"), "{want}");
    // d: 2 dots + 304 entries, listed three times (readdir, after
    // rewinddir, readdir_r).
    assert!(r.readdirs >= 3 * 306, "{r:?}");

    let cmd = "ls -lai d d/sub | sort && find . | sort && find d -type d | sort";
    let want = sh(&m.dir, cmd);
    let (got, r) = il_sh(&m.dir, cmd);
    assert_same(&got, &want, "coreutils and find");
    assert!(r.readdirs >= 306, "{r:?}");
    if have("python3") {
        let py =
            "python3 -c 'import os\nfor e in sorted(os.scandir(\"d\"), key=lambda e: e.name):\n  \
                  print(e.name, e.inode(), e.is_dir(follow_symlinks=False), \
                  e.is_symlink())\nprint(sorted(os.listdir(\"d/sub\")))\n'";
        let want = sh(&m.dir, py);
        let (got, r) = il_sh(&m.dir, py);
        assert_same(&got, &want, "python3");
        assert!(r.readdirs >= 304, "{r:?}");
    }
    // Off: the kernel lists.
    let (got, r) = il_sh_env(&m.dir, &cmd_dirs(&bin), &[("PEREGRINE_IL_METADATA", "0")]);
    assert_same(&got, &sh(&m.dir, &cmd_dirs(&bin)), "metadata off");
    assert_eq!(r.readdirs, 0, "{r:?}");
}

fn cmd_dirs(bin: &Path) -> String {
    format!("{} dirs d/sub", bin.display())
}

/// PEREGRINE_IL_METADATA=0: path calls go to the kernel (nothing served,
/// nothing counted), data calls are still intercepted. (mkdir, mv and
/// rmdir are separate processes: only mkdir is served when on.)
#[test]
fn metadata_switch_off_keeps_data_interception() {
    if !fuse_ok() {
        return;
    }
    let c = cluster();
    let m = Mount::start(&c, &c.dir.path().join("mnt"));
    sh(&m.dir, "echo hello > f && mkdir d");
    let script = "stat -c '%s %F' f d && mkdir d/e && mv d/e d/g && rmdir d/g && cat f";
    let want = sh(&m.dir, script);
    let off = [("PEREGRINE_IL_METADATA", "0")];
    let (got, r) = il_sh_env(&m.dir, script, &off);
    assert_same(&got, &want, "metadata off");
    assert_eq!(
        (
            r.path_stats,
            r.mkdirs,
            r.renames,
            r.rmdirs,
            r.path_fallbacks
        ),
        (0, 0, 0, 0, 0),
        "{r:?}"
    );
    assert!(
        r.opens >= 1 && r.bytes_read == 6,
        "data still intercepted: {r:?}"
    );
    let (got, r) = il_sh(&m.dir, script);
    assert_same(&got, &want, "metadata on");
    assert!(
        r.path_stats >= 2 && r.mkdirs == 1 && r.path_opens == 1,
        "{r:?}"
    );
}

/// A program run under the library that prints `ready`, then one line
/// for each `go` it reads: what a running process sees as others change
/// the namespace.
struct Asked {
    child: std::process::Child,
    out: std::io::BufReader<std::process::ChildStdout>,
    stdin: Option<std::process::ChildStdin>,
}

impl Asked {
    fn start(prog: &str, args: &[&str], dir: &Path) -> Asked {
        use std::io::BufRead;
        use std::process::{Command, Stdio};
        let mut child = Command::new(prog)
            .args(args)
            .current_dir(dir)
            .env("LD_PRELOAD", il_so())
            .env("PEREGRINE_IL_REPORT", "1")
            .env_remove("PEREGRINE_IL_METADATA")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut out = std::io::BufReader::new(child.stdout.take().unwrap());
        let stdin = child.stdin.take();
        let mut line = String::new();
        out.read_line(&mut line).unwrap();
        assert_eq!(line, "ready\n", "{prog}");
        Asked { child, out, stdin }
    }

    /// Its answer to one `go`, trimmed.
    fn ask(&mut self) -> String {
        self.say("go")
    }

    /// Its answer to one line of input, trimmed.
    fn say(&mut self, input: &str) -> String {
        use std::io::{BufRead, Write};
        writeln!(self.stdin.as_mut().unwrap(), "{input}").unwrap();
        let mut line = String::new();
        self.out.read_line(&mut line).unwrap();
        line.trim().to_string()
    }

    /// End its input; its library's report.
    fn finish(mut self) -> Report {
        drop(self.stdin.take());
        let o = self.child.wait_with_output().unwrap();
        parse_report(&String::from_utf8_lossy(&o.stderr))
    }
}

/// One cluster mounted twice (a second mount stands for another client:
/// another daemon, another node); None (skipped) without /dev/fuse or
/// python3. The cluster goes last, after its mounts.
fn two_mounts() -> Option<(Cluster, Mount, Mount)> {
    if !fuse_ok() || !have("python3") {
        eprintln!("SKIP: needs /dev/fuse and python3");
        return None;
    }
    let c = cluster();
    let m = Mount::start(&c, &c.dir.path().join("mnt"));
    let m2 = Mount::start(&c, &c.dir.path().join("mnt2"));
    Some((c, m, m2))
}

/// Another client's changes (a second mount of the container, another
/// daemon) reach a process that cached the file within the bound: the
/// library's TTL (the daemon's default attribute timeout), plus slack for
/// a loaded machine.
#[test]
fn other_clients_changes_are_seen_within_the_bound() {
    let Some((_c, m, m2)) = two_mounts() else {
        return;
    };
    sh(&m.dir, "echo 1234 > f && mkdir d");
    let py = r#"
import os, sys, time
def wait(what, cond):
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > 10:
            print(what, "never"); sys.stdout.flush(); return
    print(what, "%.3f" % (time.monotonic() - t0)); sys.stdout.flush()
def size():
    try: return os.stat("f").st_size
    except FileNotFoundError: return -1
for k in range(200):
    size()
print("ready"); sys.stdout.flush()
sys.stdin.readline()
wait("size", lambda: size() == 11)
sys.stdin.readline()
wait("unlink", lambda: size() == -1)
sys.stdin.readline()
wait("mkdir", lambda: os.path.isdir("d/new"))
"#;
    let mut p = Asked::start("python3", &["-c", py], &m.dir);
    let mut step = |change: &str| -> f64 {
        sh(&m2.dir, change);
        let line = p.ask();
        eprintln!("{change}: seen after {line}");
        let secs: f64 = line
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap_or(99.0);
        assert!(
            secs <= TTL.as_secs_f64() + 0.5,
            "{change}: seen after {line} (bound {TTL:?})"
        );
        secs
    };
    step("echo 1234567890 > f");
    step("rm f");
    step("mkdir d/new");
    let r = p.finish();
    assert!(r.path_stats >= 200, "served through the library: {r:?}");
}

/// Files a process wrote through the library read back from its memory
/// (data_cache.rs) and as written; with a TTL long enough that a missed
/// drop would show, its own later changes are seen at once: a write
/// through another descriptor, a truncate by path, a child's rewrite (a
/// spawn drops what is kept), posix_fallocate and splice into the file
/// (kernel-path changes through a descriptor the library tracks). Files past 64 KiB are not kept, and
/// PEREGRINE_IL_DATA_CACHE_MB=0 keeps nothing: the same bytes, fetched.
#[test]
fn own_writes_read_back_from_memory_and_own_changes_are_seen_at_once() {
    if !fuse_ok() || !have("python3") {
        eprintln!("SKIP: needs /dev/fuse and python3");
        return;
    }
    let c = cluster();
    let m = Mount::start(&c, &c.dir.path().join("mnt"));
    let script = c.dir.path().join("own.py");
    fs::write(&script, OWN_WRITES_PY).unwrap();
    // Each run in a directory of its own: the kernel may still hold the
    // names a run before removed (the daemon's entry timeout).
    let mut runs = 0;
    let mut run = |args: &str, env: &[(&str, &str)]| {
        runs += 1;
        let cmd = format!("python3 {} {args} run{runs}", script.display());
        let (out, r) = il_sh_env(&m.dir, &cmd, env);
        assert_eq!(out, "ok\n", "{cmd}");
        r
    };
    let long = ("PEREGRINE_IL_CACHE_MS", "60000");
    let r = run("small", &[long]);
    // Each read of a kept file: its bytes, then the end of file.
    assert!(r.cached_reads >= 8, "{r:?}");
    assert!(r.path_creates >= 6, "created through the library: {r:?}");
    let r = run("big", &[long]);
    assert_eq!(r.cached_reads, 0, "a file past 64 KiB is not kept: {r:?}");
    let r = run("small", &[long, ("PEREGRINE_IL_DATA_CACHE_MB", "0")]);
    assert_eq!(r.cached_reads, 0, "{r:?}");
}

const OWN_WRITES_PY: &str = r#"
import os, sys
os.mkdir(sys.argv[2]); os.chdir(sys.argv[2])
W = os.O_WRONLY | os.O_CREAT | os.O_EXCL
def put(name, data):
    fd = os.open(name, W, 0o644); os.write(fd, data); os.close(fd)
def check(name, want):
    with open(name, "rb") as f: got = f.read()
    assert got == want, (name, len(got), got[:16], len(want), want[:16])
if sys.argv[1] == "big":
    put("big", b"z" * 70000); check("big", b"z" * 70000)
else:
    x = b"x" * 3901
    put("a", x); check("a", x); check("a", x)
    fd = os.open("a", os.O_RDWR); os.pwrite(fd, b"yy", 10); os.close(fd)
    check("a", x[:10] + b"yy" + x[12:])
    put("b", b"hello world"); check("b", b"hello world")
    os.truncate("b", 5); check("b", b"hello")
    fd = os.open("c", W, 0o644); os.pwrite(fd, b"end", 100); os.write(fd, b"st"); os.close(fd)
    check("c", b"st" + bytes(98) + b"end")
    put("d", b"mine"); check("d", b"mine")
    assert os.system("printf theirs > d") == 0
    check("d", b"theirs")
    put("e", b"abc"); check("e", b"abc")
    fd = os.open("e", os.O_RDWR); os.posix_fallocate(fd, 0, 10); os.close(fd)
    check("e", b"abc" + bytes(7))
    put("g", b"abc"); check("g", b"abc")
    r, w = os.pipe(); os.write(w, b"xyz")
    fd = os.open("g", os.O_RDWR); assert os.splice(r, fd, 3) == 3; os.close(fd)
    check("g", b"xyz")
print("ok")
"#;

/// Another client's rewrite of a file this process wrote (and keeps the
/// bytes of) is read within the bound, as the path cache's changes are.
#[test]
fn another_clients_rewrite_of_own_file_is_read_within_the_bound() {
    let Some((_c, m, m2)) = two_mounts() else {
        return;
    };
    let py = r#"
import os, sys, time
def get():
    with open("e", "rb") as f: return f.read()
fd = os.open("e", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
os.write(fd, b"before"); os.close(fd)
assert get() == b"before"
print("ready"); sys.stdout.flush()
sys.stdin.readline()
t0 = time.monotonic()
while get() != b"changed":
    if time.monotonic() - t0 > 10: break
print("%.3f" % (time.monotonic() - t0)); sys.stdout.flush()
"#;
    let mut p = Asked::start("python3", &["-c", py], &m.dir);
    sh(&m2.dir, "printf changed > e");
    let line = p.ask();
    let secs: f64 = line.parse().unwrap_or(99.0);
    assert!(
        secs <= TTL.as_secs_f64() + 0.5,
        "seen after {line} (bound {TTL:?})"
    );
    let r = p.finish();
    assert!(r.cached_reads >= 1, "kept before the change: {r:?}");
}

/// Arguments: seconds to wait, then names. Makes `first` and the named
/// files, prints `ready`, waits for a line, sleeps that long, then
/// unlinks the named files and says for each whether it was removed or
/// not there.
const REMOVE_OWN_PY: &str = r#"
import os, sys, time
wait, names = float(sys.argv[1]), sys.argv[2:]
# The first create goes through the kernel (it tells the library the mount).
for name in ["first"] + names:
    with open(name, "x") as f:
        f.write("bytes of " + name)
print("ready"); sys.stdout.flush()
sys.stdin.readline()
time.sleep(wait)
for name in names:
    try:
        os.unlink(name); print(name, "removed", end=" ")
    except FileNotFoundError:
        print(name, "ENOENT", end=" ")
print(); sys.stdout.flush()
"#;

/// A process removes files it made through the library (an unlink that
/// trusts the version its create wrote, without reading the entry): the
/// one nobody touched is removed; the one another client renamed away
/// meanwhile is not there (ENOENT), and the renamed file keeps its bytes.
#[test]
fn removals_of_own_files_leave_what_another_client_moved() {
    let Some((_c, m, m2)) = two_mounts() else {
        return;
    };
    let mut p = Asked::start(
        "python3",
        &["-c", REMOVE_OWN_PY, "0", "mine", "moved"],
        &m.dir,
    );
    sh(&m2.dir, "mv moved kept");
    assert_eq!(p.ask(), "mine removed moved ENOENT");
    let r = p.finish();
    assert!(
        r.path_creates >= 2 && r.unlinks >= 2,
        "served by the library: {r:?}"
    );
    assert_eq!(sh(&m2.dir, "ls; cat kept"), "first\nkept\nbytes of moved");
}

/// As above, but past the library's cache bound, so that the removals
/// find no cached entry and trust the version each create wrote without
/// reading it (nsops.rs, `remove_unread`): the file nobody touched is
/// removed; the one another client renamed away is not there (ENOENT) and
/// keeps its bytes; the one it replaced is removed (the new file: what
/// the name holds now), and so is the one it changed the mode of.
#[test]
fn removals_of_own_files_past_the_cache_bound_see_other_clients_changes() {
    let Some((_c, m, m2)) = two_mounts() else {
        return;
    };
    let wait = format!("{}", (TTL + Duration::from_millis(300)).as_secs_f64());
    let names = ["mine", "moved", "replaced", "chmodded"];
    let args = [&["-c", REMOVE_OWN_PY, &wait][..], &names].concat();
    let mut p = Asked::start("python3", &args, &m.dir);
    sh(
        &m2.dir,
        "mv moved kept && rm replaced && echo new > replaced && chmod 600 chmodded",
    );
    assert_eq!(
        p.ask(),
        "mine removed moved ENOENT replaced removed chmodded removed"
    );
    let r = p.finish();
    // The replaced name is another client's file: its removal is the
    // kernel's (nsops.rs: removals of names made here only).
    assert!(
        r.path_creates >= 4 && r.unlinks >= 3 && r.path_fallbacks >= 1,
        "served by the library: {r:?}"
    );
    assert_eq!(sh(&m2.dir, "ls; cat kept"), "first\nkept\nbytes of moved");
}

/// A mount over the Peregrine mount, and its removal, change what a path
/// names at once: the library rereads the mount table on the next call
/// after the kernel's change (its watch of /proc/self/mountinfo), not
/// within a bound, so a process told of the change by another finds the
/// new file system. A tmpfs over the mount hides its file; after the
/// unmount the library serves the path again. Asked by python3, and by
/// tests/c/mountwatch.c, whose first path calls come from a thread that
/// exits before the changes (a watch armed by that thread alone would
/// never report them).
#[test]
fn a_mount_over_the_mount_is_seen_by_the_next_call() {
    if !fuse_ok() || !have("python3") {
        eprintln!("SKIP: needs /dev/fuse and python3");
        return;
    }
    let c = cluster();
    let m = Mount::start(&c, &c.dir.path().join("mnt"));
    sh(&m.dir, "echo peregrine > f");
    let probe = c.dir.path().join("probe");
    fs::create_dir_all(&probe).unwrap();
    if std::process::Command::new("mount")
        .args(["-t", "tmpfs", "peregrine-probe"])
        .arg(&probe)
        .status()
        .map_or(true, |s| !s.success())
    {
        eprintln!("SKIP: mounting a tmpfs needs root");
        return;
    }
    sh(c.dir.path(), "umount probe");
    let py = r#"
import os, sys
for k in range(100):
    os.stat("mnt/f")
print("ready"); sys.stdout.flush()
for line in sys.stdin:
    print(os.path.exists("mnt/f"), os.path.exists("mnt/tmpfs-only")); sys.stdout.flush()
"#;
    let local = c.dir.path().join("local");
    fs::create_dir_all(&local).unwrap();
    let c_prog = cc("mountwatch", &local);
    let programs: [(&str, Vec<&str>); 2] = [
        ("python3", vec!["-c", py]),
        (c_prog.to_str().unwrap(), vec![]),
    ];
    for (prog, args) in programs {
        let mut p = Asked::start(prog, &args, c.dir.path());
        let mut ask = |change: &str| -> String {
            sh(c.dir.path(), change);
            p.ask()
        };
        let over = ask("mount -t tmpfs peregrine-test mnt && touch mnt/tmpfs-only");
        let back = ask("umount mnt");
        let r = p.finish();
        assert_eq!(over, "False True", "{prog}: with a tmpfs over the mount");
        assert_eq!(back, "True False", "{prog}: after its unmount");
        assert!(
            r.path_stats >= 100,
            "{prog}: served through the library: {r:?}"
        );
    }
}

/// Opens the library serves (files it creates, read-only opens) behind
/// placeholder descriptors: read, write, dup, fstat, statx and fstatat
/// with AT_EMPTY_PATH, F_GETFL, O_APPEND, fork (the offset shared with the
/// child), exec (sh writes to an inherited placeholder, converted before
/// execvp), mmap and locks (converted first), a name made, removed and
/// made again, a rename, a file removed while open (still readable and
/// writable through its descriptors): tests/c/metatest.c prints the same through the
/// library as on the kernel path, and the files read back on the kernel
/// path from another process are the same.
#[test]
fn opens_fork_and_exec_match_the_kernel() {
    if !fuse_ok() {
        return;
    }
    let (_c, m, bin) = with_metatest();
    sh(&m.dir, "echo seed > seed && mkdir k l");
    let want = sh(&m.dir, &format!("{} files k", bin.display()));
    let (got, r) = il_sh(&m.dir, &format!("{} files l", bin.display()));
    eprintln!("files through the library: {r:?}");
    assert_same(&got, &want, "metatest files");
    assert!(r.path_creates >= 6 && r.path_opens >= 2, "{r:?}");
    // The unlink and rename of names this process made.
    assert!(r.unlinks >= 1 && r.renames >= 1, "{r:?}");
    assert_eq!(r.fallbacks, 0, "{r:?}");
    let files = "cat a b c d e f h | od -c | head -20; stat -c '%n %s %f' a b c d e f h";
    assert_same(
        &sh(&m.p("l"), files),
        &sh(&m.p("k"), files),
        "files on the kernel path",
    );
    // A second process right away (well within the kernel's entry
    // timeout) reads, lists and removes them on the kernel path.
    let tree = "ls -l | awk '{print $1, $5, $NF}' && rm a b c d e f h && ls";
    assert_same(
        &sh(&m.p("l"), tree),
        &sh(&m.p("k"), tree),
        "kernel path after",
    );
    // python3 and coreutils: a file written and read back in one process.
    if have("python3") {
        let py = "python3 -c 'import os\nwith open(\"p.txt\", \"w\") as f: f.write(\"x\" * 5000)\n\
                  print(os.stat(\"p.txt\").st_size, len(open(\"p.txt\").read()))\n\
                  os.rename(\"p.txt\", \"q.txt\"); os.remove(\"q.txt\"); print(os.path.exists(\"q.txt\"))'";
        let want = sh(&m.p("k"), py);
        let (got, r) = il_sh(&m.p("l"), py);
        assert_same(&got, &want, "python3");
        assert!(r.path_creates >= 1 && r.unlinks >= 1, "{r:?}");
    }
    assert!(!m.log().contains("panicked"), "daemon log: {}", m.log());
}

/// Three engines of one target each, a pool with 2 copies of everything.
fn replicated_cluster() -> Cluster {
    Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 512,
            scm_mib: 64,
        },
        600,
        "RP_2G1",
        "crc32c",
    )
}

/// Targets of pool "pool" not up-and-in, by the management service.
fn targets_out(c: &Cluster) -> Option<u32> {
    let mut m = c.mgmt();
    let req = peregrine_proto::mgmt::PoolQueryReq { id: "pool".into() };
    let p = c.rt.block_on(m.pool_query(req)).ok()?.into_inner();
    Some(p.disabled_targets + p.reintegrating_targets)
}

/// Restart engine `rank` and wait until the pool has every target back.
fn back(c: &mut Cluster, rank: usize) {
    c.restart(rank);
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    while targets_out(c) != Some(0) {
        assert!(
            std::time::Instant::now() < deadline,
            "rank {rank} not reintegrated; logs:\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Listings through the library while an engine of a replicated pool is
/// down, of names made and removed meanwhile too, and after it returned
/// and was copied back (another engine away then, so some entries come
/// from its copy): the same as the kernel's each time.
#[test]
fn listings_through_an_engine_outage_match_the_kernel() {
    if !fuse_ok() {
        return;
    }
    let mut c = replicated_cluster();
    let m = Mount::start(&c, &c.dir.path().join("mnt"));
    let tmp = c.dir.path().join("local");
    fs::create_dir_all(&tmp).unwrap();
    let bin = cc("metatest", &tmp);
    sh(
        &m.dir,
        "mkdir -p d/sub && for i in $(seq 1 200); do echo $i > d/f$i; done",
    );
    let cmd = format!("{} dirs d d/sub", bin.display());
    let before = sh(&m.dir, &cmd);

    c.engines[2].kill9();
    let (got, r) = il_sh(&m.dir, &cmd);
    assert_same(&got, &before, "listing with rank 2 down");
    assert!(r.readdirs >= 202, "listed through the library: {r:?}");
    il_sh(
        &m.dir,
        "for i in $(seq 1 20); do echo n > d/new$i; done && rm d/f1 d/f2 && mkdir d/sub/k",
    );
    std::thread::sleep(TTL + Duration::from_millis(200));
    let during = sh(&m.dir, &cmd);
    assert!(
        during.contains("new20") && !during.contains(" f1 ") && during.contains(" k "),
        "the kernel sees the changes made during the outage:\n{during}"
    );
    let (got, _) = il_sh(&m.dir, &cmd);
    assert_same(&got, &during, "listing of what changed with rank 2 down");

    back(&mut c, 2);
    c.engines[1].kill9();
    let (got, _) = il_sh(&m.dir, &cmd);
    assert_same(&got, &during, "listing after rank 2's return, rank 1 down");
    std::thread::sleep(TTL + Duration::from_millis(200));
    assert_same(&sh(&m.dir, &cmd), &during, "kernel listing, rank 1 down");
}

/// Creates the named files through the library (and "first", through the
/// kernel, which tells the library the mount), then answers each line:
/// `rm NAME...` unlinks them, `cat NAME...` reads them, each with what
/// came of it.
const OUTAGE_PY: &str = r#"
import os, sys
for name in ["first"] + sys.argv[1:]:
    with open(name, "x") as f:
        f.write("bytes of " + name)
print("ready"); sys.stdout.flush()
for line in sys.stdin:
    cmd, *names = line.split()
    for name in names:
        try:
            if cmd == "rm":
                os.unlink(name); print(name, "removed", end=" ")
            else:
                print(name, open(name).read().replace(" ", "_"), end=" ")
        except FileNotFoundError:
            print(name, "ENOENT", end=" ")
    print(); sys.stdout.flush()
"#;

/// Removals of a process's own files that trust the version its create
/// wrote (one round trip, no lookup: nsops.rs `remove_unread`), made
/// while an engine of a replicated pool is down, and after it came back
/// with another one down: every name removed stays removed, every other
/// one keeps its bytes, seen by the kernel and through the library with
/// each of those engines down in turn, and by the process itself during
/// the second outage. (2 copies on 3 engines; rank 0, which runs the
/// management service, stays up. When the copies are on ranks 1 and 2,
/// each final read finds only a copy that was away for some removals and
/// was copied back; otherwise rank 0's copy, which saw them all, may
/// answer.)
#[test]
fn removals_of_own_files_through_engine_outages_hold() {
    if !fuse_ok() || !have("python3") {
        eprintln!("SKIP: needs /dev/fuse and python3");
        return;
    }
    let mut c = replicated_cluster();
    let m = Mount::start(&c, &c.dir.path().join("mnt"));
    let names: Vec<String> = (1..=30).map(|i| format!("o{i}")).collect();
    let list = |r: std::ops::Range<usize>| names[r].join(" ");
    let removed = |r: std::ops::Range<usize>| {
        names[r]
            .iter()
            .map(|n| format!("{n} removed"))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let args: Vec<&str> = ["-c", OUTAGE_PY]
        .into_iter()
        .chain(names.iter().map(String::as_str))
        .collect();
    let mut p = Asked::start("python3", &args, &m.dir);
    // Past the cache's bound each time: the removals read no entry.
    let past_bound = || std::thread::sleep(TTL + Duration::from_millis(300));

    c.engines[2].kill9();
    past_bound();
    assert_eq!(p.say(&format!("rm {}", list(0..10))), removed(0..10));
    back(&mut c, 2);

    c.engines[1].kill9();
    past_bound();
    assert_eq!(p.say(&format!("rm {}", list(10..20))), removed(10..20));
    assert_eq!(
        p.say(&format!("rm {}", list(0..2))),
        "o1 ENOENT o2 ENOENT",
        "a second removal of a name removed"
    );
    assert_eq!(p.say("cat o21 o30"), "o21 bytes_of_o21 o30 bytes_of_o30");
    back(&mut c, 1);
    let r = p.finish();
    assert!(
        r.path_creates >= 30 && r.unlinks >= 20,
        "served by the library: {r:?}"
    );

    let want: String = ["first"]
        .into_iter()
        .chain(names[20..].iter().map(String::as_str))
        .map(|n| format!("{n}: bytes of {n}\n"))
        .collect();
    let cat = "for f in $(ls | sort -V); do printf '%s: ' $f; cat $f; echo; done";
    for rank in [2, 1] {
        c.engines[rank].kill9();
        past_bound();
        assert_eq!(sh(&m.dir, cat), want, "the kernel, rank {rank} down");
        let (got, r) = il_sh(&m.dir, cat);
        assert_eq!(got, want, "the library, rank {rank} down");
        assert!(r.readdirs >= 1, "listed through the library: {r:?}");
        if rank == 2 {
            back(&mut c, 2);
        }
    }
}
