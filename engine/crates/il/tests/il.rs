//! libperegrine_il.so against real engines and a real peregrine-fuse mount,
//! preloaded into real programs (dd, cat, cp, python3, fio, a C program).
//! Every step asserts both that the library intercepted the I/O (the
//! PEREGRINE_IL_REPORT=1 counts) and that the data is right, read back
//! through the kernel path from another process.

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;

/// Writes are acknowledged once on the device; fsync and O_DSYNC flush them
/// from its volatile cache, on the kernel path (FUSE) and through the
/// library alike. `storage scan` counts the records waiting for a flush;
/// the engine's own flush interval is set out of the way.
#[test]
fn fsync_and_o_dsync_flush_on_both_paths() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: /dev/fuse is absent; the interception tests need a FUSE mount");
        return;
    }
    let c = Cluster::start_configured(
        ClusterSpec {
            engines: 1,
            targets: 2,
            device_mib: 512,
            scm_mib: 128,
        },
        "flush_interval_ms: 60000\n",
    );
    c.format();
    c.create_pool(300, "SX", "crc32c");
    let m = Mount::start(&c, &c.dir.path().join("mnt"));
    let waiting = |what: &str| {
        let (left, n) = c.unflushed(0);
        assert!(left > 0, "{what}: nothing waits for a flush ({n} flushes)");
        n
    };
    // `closed`: a writer's close records the file's mtime after its last
    // flushed write (O_DSYNC covers the data, not the times): one record.
    let flushed = |what: &str, before: u64, closed: bool| {
        let (left, n) = c.unflushed(0);
        assert!(
            left <= u64::from(closed),
            "{what}: {left} records left unflushed"
        );
        assert!(n > before, "{what}: no device flush");
    };

    sh(&m.dir, "dd if=/dev/zero of=k bs=1M count=4 oflag=direct");
    let n = waiting("writes on the kernel path");
    sh(&m.dir, "sync k");
    flushed("fsync on the kernel path", n, false);
    sh(&m.dir, "dd if=/dev/zero of=k2 bs=1M count=2 oflag=direct");
    let n = waiting("writes on the kernel path");
    sh(
        &m.dir,
        "dd if=/dev/zero of=k3 bs=1M count=2 oflag=direct,dsync",
    );
    flushed("O_DSYNC writes on the kernel path", n, true);

    let (_, r) = il_sh(&m.dir, "dd if=/dev/zero of=i bs=1M count=4");
    assert_eq!(r.bytes_written, 4 * MIB, "{r:?}");
    let n = waiting("intercepted writes");
    let (_, r) = il_sh(&m.dir, "dd if=/dev/zero of=i2 bs=1M count=2 conv=fsync");
    assert!(r.bytes_written == 2 * MIB && r.syncs >= 1, "{r:?}");
    flushed("fsync through the library", n, true);
    il_sh(&m.dir, "dd if=/dev/zero of=i3 bs=1M count=2");
    let n = waiting("intercepted writes");
    let (_, r) = il_sh(&m.dir, "dd if=/dev/zero of=i4 bs=1M count=2 oflag=dsync");
    assert_eq!(r.bytes_written, 2 * MIB, "{r:?}");
    flushed("O_DSYNC writes through the library", n, true);
    il_sh(&m.dir, "dd if=/dev/zero of=p bs=1M count=2");
    let n = waiting("intercepted writes");
    let (_, r) = il_sh(
        &m.dir,
        "python3 -c 'import os; fd = os.open(\"p2\", os.O_WRONLY | os.O_CREAT); \
         os.pwritev(fd, [b\"x\" * 65536], 0, os.RWF_DSYNC); os.close(fd)'",
    );
    assert!(r.bytes_written == 65536 && r.syncs >= 1, "{r:?}");
    flushed("pwritev2 with RWF_DSYNC through the library", n, true);
    assert_eq!(
        sh(&m.dir, "cat k k2 k3 i i2 i3 i4 | wc -c").trim(),
        "18874368"
    );
}

#[test]
fn interception_with_real_programs() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: /dev/fuse is absent; the interception tests need a FUSE mount");
        return;
    }
    let so = il_so();
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 1,
            targets: 2,
            device_mib: 1024,
            scm_mib: 128,
        },
        600,
        "SX",
        "crc32c",
    );
    let m = Mount::start(&c, &c.dir.path().join("mnt"));
    let tmp = c.dir.path().join("local");
    fs::create_dir_all(&tmp).unwrap();
    let (mnt, t) = (m.dir.display().to_string(), tmp.display().to_string());
    eprintln!("library {}", so.display());

    // dd from /dev/urandom: intercepted writes; the size shows through the
    // mount in another process; the data equals what a kernel-path read
    // and an intercepted read of the mount give.
    let (_, r) = il_sh(
        &tmp,
        &format!("dd if=/dev/urandom of={mnt}/f bs=1M count=64"),
    );
    eprintln!("dd urandom: {r:?}");
    assert!(r.opens >= 1 && r.writes >= 64, "{r:?}");
    assert_eq!(r.bytes_written, 64 * MIB, "{r:?}");
    assert_eq!(sh(&tmp, &format!("stat -c %s {mnt}/f")).trim(), "67108864");
    sh(&tmp, &format!("cp {mnt}/f {t}/copy"));
    let (_, r) = il_sh(&tmp, &format!("cmp {mnt}/f {t}/copy"));
    assert!(
        r.bytes_read >= 64 * MIB,
        "cmp read through the library: {r:?}"
    );
    let a = read_file(&m.p("f"));
    let b = read_file(&tmp.join("copy"));
    assert!(a == b && a.len() as u64 == 64 * MIB);

    // Known data with dd, then the kernel's page cache: a reader caches
    // the file, the library overwrites a part, a reader right away (well
    // within the 1 s data cache) sees the new bytes.
    fs::write(tmp.join("src"), pattern(1, (8 * MIB) as usize)).unwrap();
    let (_, r) = il_sh(&tmp, &format!("dd if={t}/src of={mnt}/g bs=1M"));
    assert_eq!(r.bytes_written, 8 * MIB, "{r:?}");
    sh(&tmp, &format!("cmp {t}/src {mnt}/g"));
    let new = pattern(2, MIB as usize);
    fs::write(tmp.join("patch"), &new).unwrap();
    sh(&tmp, &format!("cat {mnt}/g > /dev/null"));
    let (_, r) = il_sh(
        &tmp,
        &format!("dd if={t}/patch of={mnt}/g bs=1M seek=2 conv=notrunc"),
    );
    assert_eq!(r.bytes_written, MIB, "{r:?}");
    let g = read_file(&m.p("g"));
    assert_eq!(g.len() as u64, 8 * MIB);
    assert!(
        g[(2 * MIB) as usize..(3 * MIB) as usize] == new[..],
        "stale page cache"
    );

    // cat and cp, both sides in the mount.
    let (_, r) = il_sh(&tmp, &format!("cat {mnt}/g > {t}/g.cat"));
    assert!(r.bytes_read >= 8 * MIB, "{r:?}");
    assert_eq!(read_file(&tmp.join("g.cat")), g);
    let (_, r) = il_sh(&tmp, &format!("cp {mnt}/g {mnt}/g.cp"));
    assert!(
        r.bytes_read >= 8 * MIB && r.bytes_written >= 8 * MIB,
        "{r:?}"
    );
    sh(
        &tmp,
        &format!("cmp {mnt}/g {mnt}/g.cp && cmp {t}/g.cat {mnt}/g.cp"),
    );
    // Redirections by the shell (its builtin echo writes through the
    // library, O_APPEND for >>); cat, exec'ed last, reads through it and
    // writes its inherited stdout on the kernel path at the right offset.
    let (_, r) = il_sh(
        &m.dir,
        "echo one > log.txt; echo two >> log.txt; cat log.txt log.txt > log2.txt",
    );
    assert!(r.reads >= 2 && r.bytes_read == 16, "{r:?}");
    assert_eq!(sh(&m.dir, "cat log2.txt"), "one\ntwo\none\ntwo\n");

    // python3: buffered file objects, seek, tell, append.
    if have("python3") {
        let py = format!(
            r#"
import os
p = "{mnt}/py.bin"
data = os.urandom(3 * 1024 * 1024 + 17)
with open(p, "wb") as f:
    f.write(data)
with open(p, "rb") as f:
    assert f.read() == data
    f.seek(1000)
    assert f.read(10) == data[1000:1010]
    assert f.tell() == 1010
with open(p, "ab") as f:
    f.write(b"tail")
assert os.stat(p).st_size == len(data) + 4
fd = os.open(p, os.O_RDWR)
os.pwrite(fd, b"XY", 5)
assert os.pread(fd, 4, 4) == data[4:5] + b"XY" + data[7:8]
assert os.fstat(fd).st_size == len(data) + 4
os.close(fd)
open("{t}/py.bin", "wb").write(data[:5] + b"XY" + data[7:] + b"tail")
print("OK")
"#
        );
        let (out, r) = il_sh(&tmp, &format!("python3 -c '{py}'"));
        assert_eq!(out.trim(), "OK");
        assert!(
            r.writes >= 1 && r.reads >= 1 && r.bytes_written >= 3 * MIB,
            "{r:?}"
        );
        sh(&tmp, &format!("cmp {mnt}/py.bin {t}/py.bin"));
    } else {
        eprintln!("python3 not found: python step skipped");
    }

    // The C program: dup/dup2/F_DUPFD, fork, threads, readv, O_APPEND, stdio.
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c/iltest.c");
    let bin = tmp.join("iltest");
    let cc = Command::new("cc")
        .args(["-O2", "-Wall", "-pthread", "-o"])
        .arg(&bin)
        .arg(&src)
        .output()
        .expect("cc");
    assert!(
        cc.status.success(),
        "cc: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    fs::create_dir(m.p("cdir")).unwrap();
    let (out, r) = il_sh(&tmp, &format!("{} {mnt}/cdir", bin.display()));
    assert_eq!(out.trim(), "OK");
    eprintln!("iltest: {r:?}");
    assert!(r.lines >= 2, "the forked child reports too: {r:?}");
    assert!(
        r.opens >= 5 && r.reads >= 10 && r.writes >= 10 && r.stdio >= 5,
        "{r:?}"
    );
    assert_eq!(r.fallbacks, 0, "{r:?}");
    assert_eq!(
        sh(&tmp, &format!("cat {mnt}/cdir/forked")),
        "parent1\nchild\nparent2\n"
    );
    assert_eq!(
        sh(&tmp, &format!("stat -c %s {mnt}/cdir/threads")).trim(),
        (4 * 8 * 256 * 1024).to_string()
    );
    // The same program on the kernel path (library disabled) passes too.
    fs::create_dir(m.p("cdir2")).unwrap();
    let out = Command::new(&bin)
        .arg(m.p("cdir2"))
        .env("LD_PRELOAD", il_so())
        .env("PEREGRINE_IL_DISABLE", "1")
        .env("PEREGRINE_IL_REPORT", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        !String::from_utf8_lossy(&out.stderr).contains("peregrine-il["),
        "disabled library reported"
    );

    // fio with verification (psync: pread64/pwrite64), one process.
    if have("fio") {
        let (out, r) = il_sh(
            &tmp,
            &format!(
                "fio --name=ilv --directory={mnt} --ioengine=psync --rw=randrw --bs=4k \
                 --size=32M --verify=crc32c --verify_fatal=1 --thread --numjobs=1 \
                 --group_reporting --output-format=terse --terse-version=3"
            ),
        );
        eprintln!("fio: {r:?}\n{}", out.lines().next().unwrap_or(""));
        assert!(r.reads >= 1000 && r.writes >= 1000, "{r:?}");
        assert_eq!(
            sh(&tmp, &format!("stat -c %s {mnt}/ilv.0.0")).trim(),
            (32 * MIB).to_string()
        );
    } else {
        eprintln!("fio not found (hack/install-deps.sh installs it): fio step skipped");
    }
    assert!(!m.log().contains("panicked"), "daemon log: {}", m.log());
}

/// fio through (a) the mount, (b) the mount with the library, (c) a file
/// beside the engines' device files (O_DIRECT): the numbers of
/// bench/posix-il.md. `cargo test -p peregrine-il --test il -- --ignored
/// --nocapture bench_posix_il`
#[test]
#[ignore]
fn bench_posix_il() {
    if !Path::new("/dev/fuse").exists() || !have("fio") {
        eprintln!("SKIP: needs /dev/fuse and fio");
        return;
    }
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 1,
            targets: 2,
            device_mib: 2048,
            scm_mib: 128,
        },
        1200,
        "SX",
        "off",
    );
    let m = Mount::start(&c, &c.dir.path().join("mnt"));
    let raw = c.dir.path().join("raw");
    fs::create_dir_all(&raw).unwrap();
    let jobs = [
        (
            "1MiB seq write",
            "--rw=write --bs=1M --size=512M --end_fsync=1",
            true,
        ),
        ("1MiB seq read", "--rw=read --bs=1M --size=512M", false),
        (
            "4KiB randread QD1",
            "--rw=randread --bs=4k --size=512M --runtime=10 --time_based",
            false,
        ),
    ];
    for (dir, label, il, direct) in [
        (m.dir.clone(), "(a) mount", false, false),
        (m.dir.clone(), "(b) mount + LD_PRELOAD", true, false),
        (raw.clone(), "(c) raw file beside the devices", false, true),
    ] {
        for (name, args, write) in jobs {
            let cmd = format!(
                "fio --name=b --filename={}/bench.dat --ioengine=psync --thread {args} {} \
                 --output-format=terse --terse-version=3",
                dir.display(),
                if direct { "--direct=1" } else { "" }
            );
            let mut c = Command::new("sh");
            c.arg("-c").arg(&cmd);
            if il {
                c.env("LD_PRELOAD", il_so()).env("PEREGRINE_IL_REPORT", "1");
            } else {
                c.env_remove("LD_PRELOAD");
            }
            let out = c.output().unwrap();
            let so = String::from_utf8_lossy(&out.stdout);
            let f: Vec<&str> = so.lines().last().unwrap_or("").split(';').collect();
            let (bw, iops) = if write {
                (f.get(47), f.get(48))
            } else {
                (f.get(6), f.get(7))
            };
            let bw: f64 = bw.and_then(|x| x.parse().ok()).unwrap_or(0.0);
            let iops: f64 = iops.and_then(|x| x.parse().ok()).unwrap_or(0.0);
            let rep = parse_report(&String::from_utf8_lossy(&out.stderr));
            println!(
                "BENCH {label:32} {name:18} {:8.0} MiB/s {:9.0} IOPS {:7.1} us/op  (intercepted r/w {}/{})",
                bw / 1024.0,
                iops,
                if iops > 0.0 { 1e6 / iops } else { 0.0 },
                rep.reads,
                rep.writes
            );
        }
    }
}

/// A process that cannot reach the engines (here: a network namespace of its
/// own, as a pod whose network policy shuts the engines out) keeps working on
/// the kernel path, and its report says why it was not accelerated.
#[test]
fn unreachable_engines_fall_back_and_the_report_says_why() {
    // SAFETY: geteuid takes no arguments and cannot fail.
    if !Path::new("/dev/fuse").exists() || unsafe { libc::geteuid() } != 0 || !have("unshare") {
        eprintln!("SKIP: needs /dev/fuse, root and unshare");
        return;
    }
    let (_c, m) = small_mount();
    sh(&m.dir, "echo 'read on the kernel path' > f");
    // TCP only: shared memory (a unix socket) reaches the engines from any
    // network namespace, and the library needs no control port.
    let (out, r) = il_sh(&m.dir, "unshare -n env PEREGRINE_TRANSPORT=tcp cat f");
    assert_eq!(out, "read on the kernel path\n");
    assert_eq!((r.opens, r.fallbacks), (0, 1), "{r:?}");
    // The first failure is the namespace's: its mount reads the superblock
    // from an engine it cannot reach.
    let why = r.first_failure.unwrap_or_default();
    assert!(
        why.starts_with("\"metadata: mount of the container: ") && why.contains("unreachable"),
        "the report names the failure: {why}"
    );
    // Reachable again: intercepted.
    let (out, r) = il_sh(&m.dir, "cat f");
    assert_eq!(out, "read on the kernel path\n");
    assert_eq!((r.opens, r.fallbacks, r.first_failure), (1, 0, None));
}

/// One engine with one target, a 128 MiB pool, its container mounted.
/// Writes that go around the library's interposers reach the file. glibc's
/// stdio writes a stream's buffer with its own internal write: bash's
/// builtin echo and printf redirected to files, printf after `close(1)`
/// and an open, a stream of `fdopen` left for exit to flush; so does
/// dprintf (tests/c/straytest.c). Before, those bytes went to the memfd
/// standing for a file the library made, and the files came out empty.
/// An append stream stays on the kernel path (awk's `print >>`).
/// Times too: tar sets the mtimes it archived after writing (futimens),
/// and cp -a leaves its source's mtime alone while it reads its xattrs.
#[test]
fn writes_around_the_library_reach_the_file() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: /dev/fuse is absent; the interception tests need a FUSE mount");
        return;
    }
    let (c, m) = small_mount();
    let tmp = c.dir.path().join("local");
    fs::create_dir_all(&tmp).unwrap();
    let mnt = m.dir.display().to_string();

    let (_, r) = il_sh(
        &m.dir,
        r#"bash -c 'echo one > b1; printf "%s\n" two three >> b1; for i in 1 2 3; do echo "n $i" > n$i; done'"#,
    );
    assert!(r.path_creates >= 1, "the library made the files: {r:?}");
    assert_eq!(sh(&m.dir, "cat b1"), "one\ntwo\nthree\n");
    assert_eq!(sh(&m.dir, "cat n1 n2 n3"), "n 1\nn 2\nn 3\n");
    // awk appends with fwrite (the library) and putc (glibc's buffer, then
    // the kernel, which appended at the size it knew: its first bytes
    // were overwritten).
    il_sh(
        &m.dir,
        r#"awk 'BEGIN { print "end" >> "aw"; print "two" >> "aw" }'"#,
    );
    assert_eq!(sh(&m.dir, "cat aw"), "end\ntwo\n");

    let bin = cc("straytest", &tmp);
    fs::create_dir(m.p("s")).unwrap();
    let (_, r) = il_sh(&tmp, &format!("{} {mnt}/s", bin.display()));
    assert!(r.path_creates >= 3 && r.stray_bytes > 0, "{r:?}");
    let want: [(&str, &[u8]); 4] = [
        ("c1", b"line one\n"),
        ("c2", b"AAAABBBBCCCC"),
        ("c3", b"stream 42\n"),
        ("c4", b"left open\n"),
    ];
    for (name, bytes) in want {
        assert_eq!(read_file(&m.p(&format!("s/{name}"))), bytes, "{name}");
    }

    // tar: the archived mtimes come back; cp -a: its source keeps its own.
    fs::create_dir_all(tmp.join("t/a")).unwrap();
    fs::write(tmp.join("t/a/f"), b"tar me\n").unwrap();
    sh(
        &tmp,
        "touch -d '2001-02-03 04:05:06' t/a/f && tar cf t.tar -C t a",
    );
    il_sh(&tmp, &format!("tar xf t.tar -C {mnt}"));
    assert_eq!(sh(&m.dir, "stat -c %Y a/f").trim(), "981173106");
    assert_eq!(sh(&m.dir, "cat a/f"), "tar me\n");
    il_sh(&m.dir, "cp -a a a2");
    assert_eq!(sh(&m.dir, "stat -c %Y a/f a2/f"), "981173106\n981173106\n");
    assert!(!m.log().contains("panicked"), "daemon log: {}", m.log());
}

/// A program that runs after changes made under the library (a shell's
/// next command) sees the directories changed through the kernel at once,
/// not after the attribute timeout: the library names them to the daemon
/// before fork, exec and exit (`dirs_changed.rs`).
#[test]
fn the_next_program_sees_the_directories_changed_under_the_library() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: /dev/fuse is absent; the interception tests need a FUSE mount");
        return;
    }
    let c = small_cluster();
    // Kernel attributes kept for a minute: without the library's word the
    // kernel would answer its old link count for the whole test.
    let m = Mount::start_with(&c, &c.dir.path().join("mnt"), &["--attr-timeout", "60"]);
    // No file in the mount: the library learns the container from the
    // mount's root (ns.rs).
    fs::create_dir(m.p("d")).unwrap();
    assert_eq!(sh(&m.dir, "stat -c %h d").trim(), "2");
    let (_, r) = il_sh(&m.dir, "mkdir d/y");
    assert_eq!(r.mkdirs, 1, "the library made d/y: {r:?}");
    assert_eq!(sh(&m.dir, "stat -c %h d").trim(), "3");
    // A file made in a directory the kernel holds moves its mtime. bash
    // leaves through exit, dash (sh) through _exit, which skips exit's
    // handlers (and so the report: only bash's says what it served).
    for (shell, name) in [("bash", "f"), ("sh", "g")] {
        let before = sh(&m.dir, "stat -c %y d/y");
        let (_, r) = il_sh(
            &m.dir,
            &format!("{shell} -c 'sleep 0.01; echo in > d/y/{name}'"),
        );
        if shell == "bash" {
            assert!(r.path_creates >= 1, "the library made d/y/f: {r:?}");
        }
        let lib = il_sh(&m.dir, "stat -c %y d/y").0;
        assert_ne!(lib, before, "{shell}: the create moved d/y's mtime");
        assert_eq!(sh(&m.dir, "stat -c %y d/y"), lib, "{shell}");
    }

    // mkdir -p opens each directory it made on the kernel path before it
    // makes the next one through the library; the shell then writes a file
    // with a builtin (no fork, no report), and tar compares each directory's
    // attributes before and after reading it: "file changed as we read
    // it" and exit 1 while the kernel held the old ones.
    let (out, r) = il_sh(
        &m.dir,
        "mkdir -p t/x && echo in > t/x/f && tar czf t.tgz t; echo rc=$?",
    );
    assert!(r.mkdirs >= 2, "{r:?}");
    assert_eq!(out.trim(), "rc=0");
    assert_eq!(sh(&m.dir, "tar xzOf t.tgz t/x/f"), "in\n");
    assert!(!m.log().contains("panicked"), "daemon log: {}", m.log());
}

fn small_cluster() -> Cluster {
    Cluster::with_pool(
        ClusterSpec {
            engines: 1,
            targets: 1,
            device_mib: 256,
            scm_mib: 64,
        },
        128,
        "SX",
        "crc32c",
    )
}

fn small_mount() -> (Cluster, Mount) {
    let c = small_cluster();
    let m = Mount::start(&c, &c.dir.path().join("mnt"));
    (c, m)
}

fn fnv(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    })
}

/// Issue 19, point 1: mmap of a file the library writes behind the kernel.
/// The mapping is made up to date (data and size) when it is made and stays
/// coherent with later writes through any descriptor of the file, as on
/// ext4: tests/c/mmaptest.c (write then map; map then pwrite, ftruncate,
/// fallocate, a descriptor opened while mapped) and sqlite3 in WAL mode
/// (SQLite maps its -shm file after extending it with pwrite), each run in
/// a local directory, through the mount on the kernel path, with the library
/// disabled and with it, with the same output.
#[test]
fn mmap_is_coherent_with_the_library() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: /dev/fuse is absent; the interception tests need a FUSE mount");
        return;
    }
    il_so();
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 1,
            targets: 2,
            device_mib: 512,
            scm_mib: 128,
        },
        300,
        "SX",
        "crc32c",
    );
    let m = Mount::start(&c, &c.dir.path().join("mnt"));
    let tmp = c.dir.path().join("local");
    fs::create_dir_all(&tmp).unwrap();
    let bin = cc("mmaptest", &tmp);

    // (mode, files, writes through the library before the first mmap)
    for (mode, files, writes) in [("write-then-map", 5, 5), ("map-then-write", 1, 0)] {
        let local = tmp.join(mode);
        fs::create_dir_all(&local).unwrap();
        let want = sh(
            &tmp,
            &format!("{} {mode} {}", bin.display(), local.display()),
        );
        assert!(want.ends_with("\nOK\n"), "{mode} on the local disk: {want}");
        assert_eq!(want.lines().count() as u64, files + 1, "{want}");
        // "<file> <length> <fnv>" lines: the files as read by this process.
        let check_file = |dir: &str, how: &str| {
            for l in want.lines().filter(|l| *l != "OK") {
                let name = l.split(' ').next().unwrap();
                let b = read_file(&m.p(&format!("{dir}/{name}")));
                assert_eq!(
                    format!("{name} {} {:016x}", b.len(), fnv(&b)),
                    l,
                    "{mode} {how}: the file read back on the kernel path"
                );
            }
        };
        let d = format!("{mode}-kernel");
        fs::create_dir(m.p(&d)).unwrap();
        let got = sh(&m.dir, &format!("{} {mode} {d}", bin.display()));
        assert_eq!(got, want, "{mode} through the mount, no library");
        check_file(&d, "without the library");
        let d = format!("{mode}-disabled");
        fs::create_dir(m.p(&d)).unwrap();
        let got = disabled_sh(&m.dir, &format!("{} {mode} {d}", bin.display()));
        assert_eq!(got, want, "{mode} through the mount, library disabled");
        let d = format!("{mode}-il");
        fs::create_dir(m.p(&d)).unwrap();
        let (got, r) = il_sh(&m.dir, &format!("{} {mode} {d}", bin.display()));
        eprintln!("mmaptest {mode}: {r:?}");
        assert_eq!(got, want, "{mode} through the mount with the library");
        // Each file is written (map-then-write: ftruncated) through the
        // library before its first mapping, and left to the kernel after.
        assert!(
            r.opens >= files && r.writes >= writes && r.mmaps >= files,
            "{r:?}"
        );
        assert_eq!(r.fallbacks, 0, "{r:?}");
        check_file(&d, "with the library");
    }

    if !have("sqlite3") {
        eprintln!(
            "SKIP: sqlite3 is not installed (hack/install-deps.sh installs it): \
             the sqlite3 WAL steps are skipped"
        );
        assert!(!m.log().contains("panicked"), "daemon log: {}", m.log());
        return;
    }
    // Each step in a local directory and in the mount (with the library
    // unless `il` is false); the outputs must agree.
    let mut rows = String::from("BEGIN;\n");
    for i in 0..3000 {
        rows += &format!(
            "INSERT INTO t VALUES({i}, '{}');\n",
            format!("row-{i}-").repeat(1 + i % 13)
        );
    }
    rows += "COMMIT;\n";
    fs::write(tmp.join("rows.sql"), &rows).unwrap();
    for w in 0..2 {
        let mut s = String::from(".timeout 30000\n");
        for i in 0..150 {
            s += &format!("INSERT INTO t VALUES({}, 'w{w}');\n", 10_000 + w * 1000 + i);
        }
        fs::write(tmp.join(format!("w{w}.sql")), s).unwrap();
    }
    let t = tmp.display().to_string();
    let steps: [(bool, String); 7] = [
        (
            true,
            "sqlite3 w.db 'PRAGMA journal_mode=WAL; CREATE TABLE t(a); INSERT INTO t VALUES(1);'"
                .into(),
        ),
        (
            true,
            "sqlite3 w.db 'ALTER TABLE t ADD COLUMN b; SELECT count(*) FROM t;'".into(),
        ),
        (true, format!("sqlite3 w.db < {t}/rows.sql")),
        (
            false,
            "sqlite3 w.db 'PRAGMA journal_mode; SELECT count(*), sum(a), sum(length(b)) FROM t; \
             PRAGMA integrity_check;'"
                .into(),
        ),
        // Two writers at once: the -shm mapping is shared between processes.
        (
            true,
            format!(
                "sqlite3 w.db < {t}/w0.sql & sqlite3 w.db < {t}/w1.sql & wait; \
                 sqlite3 w.db 'SELECT count(*), sum(a) FROM t;'"
            ),
        ),
        (
            true,
            "sqlite3 w.db 'PRAGMA wal_checkpoint(TRUNCATE); PRAGMA integrity_check; \
             SELECT count(*), sum(a), sum(length(b)) FROM t;'"
                .into(),
        ),
        (
            false,
            "sqlite3 w.db 'PRAGMA journal_mode; PRAGMA integrity_check; \
             SELECT count(*), sum(a), sum(length(b)) FROM t;'"
                .into(),
        ),
    ];
    let local = tmp.join("sqlite");
    fs::create_dir_all(&local).unwrap();
    fs::create_dir(m.p("sqlite")).unwrap();
    let mut mmaps = 0;
    for (il, script) in &steps {
        let want = sh(&local, script);
        let got = if *il {
            let (out, r) = il_sh(&m.p("sqlite"), script);
            eprintln!("sqlite3 step {script:?}: {r:?}");
            assert!(r.opens >= 1 && r.reads >= 1, "{r:?}");
            mmaps += r.mmaps;
            out
        } else {
            sh(&m.p("sqlite"), script)
        };
        assert_eq!(got, want, "sqlite3 step {script:?}: mount vs local disk");
    }
    assert!(mmaps >= 5, "the -shm file was mapped {mmaps} times");
    assert!(!m.log().contains("panicked"), "daemon log: {}", m.log());
}

/// A process with a connection forks again and again, and each child
/// writes through the library at once (as bash's command substitutions and
/// Python's worker pools do): each child connects on its own, starts its
/// own commit thread while the parent's waits, writes, exits and reports;
/// every one finishes within the bound and its file reads back on the
/// kernel path, each with its own bytes (children that drew one object-id
/// prefix from the RNG state they inherited shared their files' objects).
/// (The hang this guards against, in the locks themselves, is pinned down
/// by peregrine-client's tests/fork.rs.)
#[test]
fn children_forked_with_a_connection_open_write_and_exit() {
    if !Path::new("/dev/fuse").exists() || !have("python3") {
        eprintln!("SKIP: needs /dev/fuse and python3");
        return;
    }
    let (c, m) = small_mount();
    const CHILDREN: usize = 100;
    let py = format!(
        r#"
import os, sys, time
# Held open across the forks: each child mounts the container through it.
seed = open("seed", "w"); seed.write("parent"); seed.flush()
for i in range({CHILDREN}):
    pid = os.fork()
    if pid == 0:
        fd = os.open("c%d" % i, os.O_CREAT | os.O_WRONLY, 0o644)
        os.write(fd, b"child %d" % i)
        os.close(fd)
        sys.exit(0)
    t0 = time.monotonic()
    while os.waitpid(pid, os.WNOHANG)[0] == 0:
        if time.monotonic() - t0 > 30:
            print("child", i, "hung"); sys.stdout.flush()
            os.kill(pid, 9); os.waitpid(pid, 0); sys.exit(1)
        time.sleep(0.001)
print("done")
"#
    );
    let script = c.dir.path().join("forks.py");
    fs::write(&script, py).unwrap();
    let (out, r) = il_sh(&m.dir, &format!("python3 {}", script.display()));
    assert_eq!(out, "done\n");
    assert!(
        r.opens as usize > CHILDREN,
        "each child wrote through the library: {r:?}"
    );
    let got = sh(&m.dir, "for i in $(seq 0 99); do cat c$i; echo; done");
    let want: String = (0..CHILDREN).map(|i| format!("child {i}\n")).collect();
    assert_eq!(got, want);
}
