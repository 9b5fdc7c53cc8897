//! Real programs in a real `peregrine-fuse` mount over real engines: sqlite3
//! in WAL mode, Python file I/O, `cp -a` + `diff -r`, `dd`, fio with
//! `--verify=crc32c` on psync, libaio and io_uring, ENOSPC on a full pool,
//! an engine killed mid-write (EIO, daemon alive, reconnect after restart),
//! and hard links made by `ln`, `cp -al`, `git clone --local` and `rsync -H`.
//!
//! Each test asserts the program's own verdict and checks the result itself.
//! Programs that are not installed are skipped with a printed reason
//! (hack/install-deps.sh installs them); a missing /dev/fuse skips everything.

mod common;

use common::mount::{fuse_available, FuseMount};
use common::*;
use std::fs;
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime};

/// A formatted single-engine cluster with `pool_mib` pool, container `cont`
/// (SX, crc32c), on a `device_mib` sparse device.
fn cluster(device_mib: u64, pool_mib: u64) -> Cluster {
    Cluster::with_pool(
        ClusterSpec {
            device_mib,
            ..Default::default()
        },
        pool_mib,
        "SX",
        "crc32c",
    )
}

fn have(tool: &str) -> bool {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if !ok {
        eprintln!("SKIP: {tool} is not installed (hack/install-deps.sh installs it)");
    }
    ok
}

/// Run `cmd` in `dir` with `stdin` fed; panic with its output unless it exits 0.
fn run(dir: &Path, cmd: &[&str], stdin: &[u8]) -> Output {
    let mut child = Command::new(cmd[0])
        .args(&cmd[1..])
        .current_dir(dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let mut input = child.stdin.take().unwrap();
    let data = stdin.to_vec();
    let feeder = std::thread::spawn(move || {
        let _ = input.write_all(&data);
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} exited {}:\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

#[test]
fn sqlite3_wal() {
    if !fuse_available() || !have("sqlite3") {
        return;
    }
    let c = cluster(256, 128);
    let tmp = tempfile::tempdir().unwrap();
    let mut m = FuseMount::start(&c, "cont", &tmp.path().join("m"), &[]);
    let db = m.p("t.db");
    let db = db.to_str().unwrap();
    let o = run(&m.dir, &["sqlite3", db, "PRAGMA journal_mode=WAL;"], b"");
    assert_eq!(stdout(&o), "wal");
    // 10 transactions of 1,000 single-row inserts each.
    let mut sql = String::from(
        "CREATE TABLE t(id INTEGER PRIMARY KEY, a INTEGER, b TEXT);\nCREATE INDEX ta ON t(a);\n",
    );
    for tx in 0..10 {
        sql.push_str("BEGIN;\n");
        for i in 0..1000 {
            let n = tx * 1000 + i;
            sql.push_str(&format!(
                "INSERT INTO t(a, b) VALUES ({n}, '{}');\n",
                format!("row-{n}-").repeat(1 + n % 7)
            ));
        }
        sql.push_str("COMMIT;\n");
    }
    sql.push_str("PRAGMA integrity_check;\n");
    let o = run(&m.dir, &["sqlite3", db], sql.as_bytes());
    assert_eq!(stdout(&o), "ok", "integrity_check");
    assert!(
        m.p("t.db-wal").exists() || fs::metadata(m.p("t.db")).unwrap().len() > 0,
        "no database written"
    );
    // Reopen in a new process: WAL mode persisted, every row there.
    let o = run(
        &m.dir,
        &[
            "sqlite3",
            db,
            "PRAGMA journal_mode; SELECT count(*), sum(a) FROM t; PRAGMA integrity_check;",
        ],
        b"",
    );
    let expect_sum: u64 = (0..10_000).sum();
    assert_eq!(stdout(&o), format!("wal\n10000|{expect_sum}\nok"));
    // And after a checkpoint folds the WAL into the main file.
    let o = run(
        &m.dir,
        &[
            "sqlite3",
            db,
            "PRAGMA wal_checkpoint(TRUNCATE); SELECT count(*) FROM t WHERE b LIKE 'row-9999-%';",
        ],
        b"",
    );
    assert!(stdout(&o).ends_with("\n1"), "{}", stdout(&o));
    m.stop();
}

const PY: &str = r#"
import os, sys
d = sys.argv[1]
p = os.path.join(d, "f.bin")
with open(p, "wb") as f:
    f.write(b"A" * 100000)
with open(p, "r+b") as f:
    f.seek(50000)
    f.write(b"B" * 10)
    f.seek(0, os.SEEK_END)
    assert f.tell() == 100000, f.tell()
    f.seek(-5, os.SEEK_END)
    assert f.read() == b"AAAAA"
with open(p, "ab") as f:
    f.write(b"tail")
    assert f.tell() == 100004
exp = bytearray(b"A" * 100000)
exp[50000:50010] = b"B" * 10
exp += b"tail"
with open(p, "rb") as f:
    assert f.read() == bytes(exp)
    f.seek(49995)
    assert f.read(20) == b"AAAAA" + b"B" * 10 + b"AAAAA"
os.truncate(p, 1234)
assert os.path.getsize(p) == 1234
with open(p, "r+b") as f:
    assert f.read() == bytes(exp[:1234])
    f.truncate(5000)
with open(p, "rb") as f:
    assert f.read() == bytes(exp[:1234]) + b"\0" * (5000 - 1234)
# a sparse write far out, then text mode and line reads
with open(p, "r+b") as f:
    f.seek(3 << 20)
    f.write(b"far")
assert os.stat(p).st_size == (3 << 20) + 3
with open(p, "rb") as f:
    f.seek(5000)
    assert f.read(1 << 20) == b"\0" * (1 << 20)
t = os.path.join(d, "t.txt")
with open(t, "w") as f:
    f.writelines("line %d\n" % i for i in range(5000))
with open(t) as f:
    assert [l.rstrip("\n") for l in f] == ["line %d" % i for i in range(5000)]
# scandir over 1000 entries
sd = os.path.join(d, "many")
os.mkdir(sd)
for i in range(1000):
    with open(os.path.join(sd, "e%04d" % i), "w") as f:
        f.write(str(i))
ents = list(os.scandir(sd))
assert sorted(e.name for e in ents) == ["e%04d" % i for i in range(1000)], len(ents)
for e in ents:
    assert e.is_file() and not e.is_dir()
    assert e.stat().st_size == len(str(int(e.name[1:]))), e.name
# renames: plain, over an existing file, across directories, a directory
os.rename(os.path.join(sd, "e0000"), os.path.join(sd, "renamed"))
os.rename(os.path.join(sd, "e0001"), os.path.join(sd, "e0002"))
with open(os.path.join(sd, "e0002")) as f:
    assert f.read() == "1"
os.mkdir(os.path.join(d, "other"))
os.rename(os.path.join(sd, "e0003"), os.path.join(d, "other", "moved"))
os.rename(os.path.join(d, "other"), os.path.join(d, "other2"))
with open(os.path.join(d, "other2", "moved")) as f:
    assert f.read() == "3"
names = sorted(os.listdir(sd))
assert len(names) == 998, len(names)
assert "renamed" in names and "e0000" not in names and "e0001" not in names and "e0003" not in names
assert not os.path.exists(os.path.join(d, "other"))
os.replace(t, p)
with open(p) as f:
    assert f.readline() == "line 0\n"
print("python-ok")
"#;

#[test]
fn python_file_io() {
    if !fuse_available() || !have("python3") {
        return;
    }
    let c = cluster(256, 128);
    let tmp = tempfile::tempdir().unwrap();
    let mut m = FuseMount::start(&c, "cont", &tmp.path().join("m"), &[]);
    let script = tmp.path().join("t.py");
    fs::write(&script, PY).unwrap();
    let o = run(
        &m.dir,
        &["python3", script.to_str().unwrap(), m.dir.to_str().unwrap()],
        b"",
    );
    assert_eq!(stdout(&o), "python-ok");
    m.stop();
}

/// A tree of `n` files (most small, some up to 3 MiB), subdirectories,
/// symlinks, varied modes and old mtimes. Returns its total size in bytes.
fn make_tree(root: &Path, n: usize) -> u64 {
    let modes = [0o644, 0o600, 0o755, 0o640, 0o444, 0o700];
    let mut total = 0u64;
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    for i in 0..n {
        let dir = root.join(format!("d{}/s{}", i % 7, i % 3));
        fs::create_dir_all(&dir).unwrap();
        // One file in ten is big (up to 3 MiB), the rest up to 64 KiB; some empty.
        let len = match rnd() % 10 {
            0 => (rnd() % (3 << 20)) as usize + 1,
            1 => 0,
            _ => (rnd() % (64 << 10)) as usize,
        };
        total += len as u64;
        let f = dir.join(format!("f{i:03}.dat"));
        fs::write(&f, pattern(i as u64, len)).unwrap();
        let t =
            SystemTime::UNIX_EPOCH + Duration::new(1_500_000_000 + i as u64 * 3600, 123_456_789);
        fs::File::options()
            .write(true)
            .open(&f)
            .unwrap()
            .set_modified(t)
            .unwrap();
        fs::set_permissions(&f, fs::Permissions::from_mode(modes[i % modes.len()])).unwrap();
        if i % 25 == 0 {
            std::os::unix::fs::symlink(format!("f{i:03}.dat"), dir.join(format!("l{i:03}")))
                .unwrap();
            std::os::unix::fs::symlink("../..", dir.join(format!("up{i:03}"))).unwrap();
        }
    }
    fs::set_permissions(root.join("d3"), fs::Permissions::from_mode(0o750)).unwrap();
    total
}

/// Compare two trees entry by entry: type, size, link target, and (if `meta`)
/// permission bits and file mtimes to the nanosecond.
fn compare_trees(a: &Path, b: &Path, meta: bool) -> usize {
    let mut n = 0;
    let mut ents: Vec<_> = fs::read_dir(a).unwrap().map(|e| e.unwrap()).collect();
    ents.sort_by_key(|e| e.file_name());
    let count_b = fs::read_dir(b).unwrap().count();
    assert_eq!(ents.len(), count_b, "entry count of {}", b.display());
    for e in ents {
        let pa = e.path();
        let pb = b.join(e.file_name());
        let ma = fs::symlink_metadata(&pa).unwrap();
        let mb = fs::symlink_metadata(&pb).unwrap_or_else(|err| panic!("{}: {err}", pb.display()));
        assert_eq!(
            ma.file_type(),
            mb.file_type(),
            "file type of {}",
            pb.display()
        );
        if meta {
            assert_eq!(
                format!("{:o}", ma.mode()),
                format!("{:o}", mb.mode()),
                "mode of {}",
                pb.display()
            );
        }
        n += 1;
        if ma.file_type().is_symlink() {
            assert_eq!(fs::read_link(&pa).unwrap(), fs::read_link(&pb).unwrap());
        } else if ma.is_dir() {
            n += compare_trees(&pa, &pb, meta);
        } else {
            assert_eq!(ma.len(), mb.len(), "size of {}", pb.display());
            if meta {
                assert_eq!(
                    (ma.mtime(), ma.mtime_nsec()),
                    (mb.mtime(), mb.mtime_nsec()),
                    "mtime of {}",
                    pb.display()
                );
            }
        }
    }
    n
}

/// `cp -a` of a generated tree into the mount and back out, `diff -r` both
/// ways, then the entry-by-entry comparison.
fn cp_a_round_trip(meta: bool) {
    let c = cluster(1024, 512);
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    let total = make_tree(&src, 300);
    eprintln!("tree: 300 files, {} MiB", total >> 20);
    let mut m = FuseMount::start(&c, "cont", &tmp.path().join("m"), &[]);
    let t = Instant::now();
    run(
        &m.dir,
        &[
            "cp",
            "-a",
            src.to_str().unwrap(),
            m.p("copy").to_str().unwrap(),
        ],
        b"",
    );
    eprintln!("cp -a: {:?}", t.elapsed());
    run(
        &m.dir,
        &[
            "diff",
            "-r",
            "--no-dereference",
            src.to_str().unwrap(),
            "copy",
        ],
        b"",
    );
    let n = compare_trees(&src, &m.p("copy"), meta);
    assert!(n > 300, "only {n} entries compared");
    // And back out again: a second copy from the mount is identical too.
    let back = tmp.path().join("back");
    run(&m.dir, &["cp", "-a", "copy", back.to_str().unwrap()], b"");
    run(
        tmp.path(),
        &["diff", "-r", "--no-dereference", "src", "back"],
        b"",
    );
    compare_trees(&src, &back, meta);
    m.stop();
}

/// Contents (diff -r), file types, sizes and symlink targets.
#[test]
fn cp_a_then_diff_r() {
    if !fuse_available() || !have("cp") || !have("diff") {
        return;
    }
    cp_a_round_trip(false);
}

/// The same, and every mode and file mtime preserved, as `cp -a` promises:
/// coreutils sets modes with setxattr("system.posix_acl_access") and falls
/// back to chmod only on EOPNOTSUPP, and sets times with futimens before
/// close, which must survive the close.
#[test]
fn cp_a_preserves_modes_and_mtimes() {
    if !fuse_available() || !have("cp") || !have("diff") {
        return;
    }
    cp_a_round_trip(true);
}

#[test]
fn dd_1mib_blocks() {
    if !fuse_available() || !have("dd") || !have("cmp") {
        return;
    }
    let c = cluster(256, 128);
    let tmp = tempfile::tempdir().unwrap();
    let mut m = FuseMount::start(&c, "cont", &tmp.path().join("m"), &[]);
    let src = tmp.path().join("src.bin");
    fs::write(&src, pattern(7, 24 << 20)).unwrap();
    let dst = m.p("dd.bin");
    run(
        &m.dir,
        &[
            "dd",
            &format!("if={}", src.display()),
            &format!("of={}", dst.display()),
            "bs=1M",
            "conv=fsync",
            "status=none",
        ],
        b"",
    );
    assert_eq!(fs::metadata(&dst).unwrap().len(), 24 << 20);
    let back = tmp.path().join("back.bin");
    run(
        &m.dir,
        &[
            "dd",
            &format!("if={}", dst.display()),
            &format!("of={}", back.display()),
            "bs=1M",
            "status=none",
        ],
        b"",
    );
    run(tmp.path(), &["cmp", "src.bin", "back.bin"], b"");
    // O_DIRECT both ways, unaligned tail block, into an existing file at an offset.
    run(
        &m.dir,
        &[
            "dd",
            &format!("if={}", src.display()),
            &format!("of={}", dst.display()),
            "bs=1M",
            "count=4",
            "seek=30",
            "oflag=direct",
            "conv=notrunc",
            "status=none",
        ],
        b"",
    );
    assert_eq!(fs::metadata(&dst).unwrap().len(), 34 << 20);
    let o = run(
        &m.dir,
        &[
            "dd",
            &format!("if={}", dst.display()),
            "bs=1M",
            "skip=30",
            "iflag=direct",
            "status=none",
        ],
        b"",
    );
    assert!(o.stdout == pattern(7, 4 << 20), "direct read-back differs");
    run(
        tmp.path(),
        &[
            "cmp",
            "-n",
            &(24u64 << 20).to_string(),
            "src.bin",
            dst.to_str().unwrap(),
        ],
        b"",
    );
    m.stop();
}

#[test]
fn fio_verify_crc32c() {
    if !fuse_available() || !have("fio") {
        return;
    }
    let c = cluster(1024, 512);
    let tmp = tempfile::tempdir().unwrap();
    let mut m = FuseMount::start(&c, "cont", &tmp.path().join("m"), &[]);
    for (engine, depth, rw) in [
        ("psync", 1, "write"),
        ("libaio", 8, "randwrite"),
        ("io_uring", 8, "randwrite"),
    ] {
        let t = Instant::now();
        let out = Command::new("fio")
            .current_dir(&m.dir)
            .args([
                &format!("--name=verify-{engine}"),
                &format!("--filename={}", m.p(&format!("fio.{engine}")).display()),
                &format!("--ioengine={engine}"),
                &format!("--iodepth={depth}"),
                &format!("--rw={rw}"),
                "--bs=64k",
                "--size=32m",
                "--direct=1",
                "--verify=crc32c",
                "--do_verify=1",
                "--verify_fatal=1",
                "--output-format=json",
            ])
            .output()
            .unwrap();
        let so = String::from_utf8_lossy(&out.stdout);
        let se = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "fio {engine} exited {}:\n{se}\n{so}",
            out.status
        );
        assert!(!se.contains("verify:"), "fio {engine} verify errors:\n{se}");
        assert!(
            so.contains("\"error\" : 0"),
            "fio {engine}: no job with error 0:\n{so}"
        );
        assert!(!se.contains("fio: "), "fio {engine} complained:\n{se}");
        assert_eq!(
            fs::metadata(m.p(&format!("fio.{engine}"))).unwrap().len(),
            32 << 20
        );
        eprintln!("fio {engine} {rw} + verify: {:?}", t.elapsed());
    }
    m.stop();
}

#[test]
fn enospc_on_a_full_pool() {
    if !fuse_available() {
        return;
    }
    let c = cluster(256, 64);
    let tmp = tempfile::tempdir().unwrap();
    let mut m = FuseMount::start(&c, "cont", &tmp.path().join("m"), &[]);
    let chunk = pattern(3, 1 << 20);
    let mut written = 0u64;
    let err = {
        let mut f = fs::File::create(m.p("fill")).unwrap();
        let mut err = None;
        // Bounded: a 64 MiB pool cannot take 512 MiB.
        for _ in 0..512 {
            match f.write_all(&chunk) {
                Ok(()) => written += chunk.len() as u64,
                Err(e) => {
                    err = Some(e);
                    break;
                }
            }
        }
        err.or_else(|| f.sync_all().err())
    };
    let err = err.unwrap_or_else(|| panic!("wrote {written} bytes into a 64 MiB pool"));
    eprintln!("full after {} MiB: {err}", written >> 20);
    assert_eq!(err.raw_os_error(), Some(libc::ENOSPC), "{err:?}");
    assert!(written > 8 << 20, "ENOSPC after only {written} bytes");
    // The daemon is fine, the mount still answers, and freeing space lets
    // writes succeed again (space may come back asynchronously: retry).
    assert!(m.exit_status().is_none(), "daemon died: {}", m.log());
    fs::remove_file(m.p("fill")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let r = fs::write(m.p("again"), &chunk[..]).and_then(|_| fs::read(m.p("again")));
        match r {
            Ok(back) => {
                assert_eq!(back, chunk);
                break;
            }
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "write after delete still fails after 30 s: {e}"
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    m.stop();
}

#[test]
fn engine_killed_mid_write_then_reconnect() {
    if !fuse_available() {
        return;
    }
    let mut c = cluster(512, 256);
    let tmp = tempfile::tempdir().unwrap();
    let mut m = FuseMount::start(&c, "cont", &tmp.path().join("m"), &[]);
    fs::write(m.p("before"), b"before the crash").unwrap();
    let path = m.p("victim");
    let (started_tx, started_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel();
    let writer = std::thread::spawn(move || {
        let chunk = pattern(5, 256 << 10);
        let mut f = fs::File::create(&path).unwrap();
        let mut n = 0u64;
        loop {
            if let Err(e) = f.write_all(&chunk) {
                let _ = done_tx.send((e, n, Instant::now()));
                return;
            }
            n += 1;
            if n == 8 {
                started_tx.send(()).unwrap();
            }
            // Keep the file small: a 256 KiB write per iteration, rewritten in place.
            if n.is_multiple_of(64) {
                use std::io::Seek;
                f.seek(std::io::SeekFrom::Start(0)).unwrap();
            }
        }
    });
    started_rx
        .recv_timeout(Duration::from_secs(30))
        .expect("writer never got going");
    let killed = Instant::now();
    c.engines[0].kill9();
    let (err, n, at) = done_rx
        .recv_timeout(Duration::from_secs(40))
        .expect("writer got no error within 40 s of SIGKILL of the engine");
    writer.join().unwrap();
    let took = at.duration_since(killed);
    eprintln!("writer: {err} after {took:?} ({n} writes done)");
    assert_eq!(err.raw_os_error(), Some(libc::EIO), "{err:?}");
    assert!(took < Duration::from_secs(40), "{took:?}");
    assert!(
        m.exit_status().is_none(),
        "peregrine-fuse died with the engine: {}",
        m.log()
    );

    // The engine comes back; the same mount serves new I/O.
    c.restart(0);
    let back = Instant::now();
    let data = pattern(6, 3 << 20);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = fs::write(m.p("after"), &data[..]).and_then(|_| fs::read(m.p("after")));
        match r {
            Ok(got) => {
                assert!(got == data, "data written after reconnect differs");
                break;
            }
            Err(e) => {
                assert!(
                    Instant::now() < deadline,
                    "no I/O through the mount 60 s after the engine returned: {e}\n{}",
                    m.log()
                );
                std::thread::sleep(Duration::from_millis(500));
            }
        }
    }
    eprintln!("I/O again {:?} after the engine returned", back.elapsed());
    assert_eq!(fs::read(m.p("before")).unwrap(), b"before the crash");
    assert!(m.exit_status().is_none());
    m.stop();
}

/// Hard links as real programs make and use them: `ln`, `cp -al` (a tree
/// of links), `git clone --local` (the object store hard-linked), `rsync
/// -aH` (links kept in a copy); one inode number per file and link counts
/// as `stat` shows them, through names coming and going.
#[test]
fn hard_links_with_real_programs() {
    if !fuse_available() {
        return;
    }
    let c = cluster(1024, 512);
    let tmp = tempfile::tempdir().unwrap();
    let m = FuseMount::start(&c, "cont", &tmp.path().join("m"), &[]);
    let sh = |script: &str| stdout(&run(&m.dir, &["sh", "-euc", script], b""));
    sh("mkdir -p src/sub && echo one > src/a && echo two > src/sub/b && ln src/a src/a2");
    let links = |p: &str| sh(&format!("stat -c %h {p}"));
    let ino = |p: &str| sh(&format!("stat -c %i {p}"));
    assert_eq!((links("src/a"), ino("src/a2")), ("2".into(), ino("src/a")));

    run(&m.dir, &["cp", "-al", "src", "copy"], b"");
    assert_eq!(links("src/a"), "4", "a, a2 and their copies");
    assert_eq!(ino("copy/sub/b"), ino("src/sub/b"));
    sh("echo more >> copy/sub/b");
    assert_eq!(sh("cat src/sub/b"), "two\nmore", "one file under two names");

    if have("git") {
        sh(
            "git init -q repo && cd repo && for i in $(seq 20); do echo file $i > f$i; done && \
            git add . && git -c user.name=t -c user.email=t@t commit -qm one",
        );
        sh("git clone -q --local repo clone");
        let shared: usize = sh("find clone/.git/objects -type f -links +1 | wc -l")
            .parse()
            .unwrap();
        assert!(shared >= 20, "objects hard-linked by the clone: {shared}");
        sh("git -C clone fsck --strict 2>&1 >/dev/null && test \"$(git -C clone log --oneline | wc -l)\" = 1 && diff -r repo/f7 clone/f7");
        sh("rm -rf repo");
        sh("git -C clone fsck --strict 2>&1 >/dev/null && test \"$(cat clone/f20)\" = 'file 20'");
    }
    if have("rsync") {
        sh("rsync -aH src/ r/");
        assert_eq!((links("r/a"), ino("r/a2")), ("2".into(), ino("r/a")));
        assert_ne!(ino("r/a"), ino("src/a"));
    }

    sh("rm src/a2 copy/a2");
    assert_eq!(links("src/a"), "2");
    sh("rm src/a");
    assert_eq!(
        (links("copy/a"), sh("cat copy/a")),
        ("1".into(), "one".into())
    );
}
