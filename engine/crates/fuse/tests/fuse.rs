//! peregrine-fuse against real engines, through real mounts.

mod common;

use common::*;
use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::mount::{fuse_available, is_mounted as mounted, FuseMount as Mount, FUSE_BIN};

fn mounts() -> String {
    fs::read_to_string("/proc/mounts").unwrap()
}

fn cluster(engines: u32) -> Cluster {
    Cluster::with_pool(
        ClusterSpec {
            engines,
            ..Default::default()
        },
        128,
        "SX",
        "crc32c",
    )
}

fn errno_of<T: std::fmt::Debug>(r: std::io::Result<T>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

#[repr(C)]
#[derive(Debug)]
struct Handle {
    version: u32,
    flags: u32,
    pool: [u8; 16],
    cont: [u8; 16],
    oid_hi: u64,
    oid_lo: u64,
    chunk_size: u64,
    reserved: [u64; 2],
    mgmt: [u8; 128],
}

/// The POSIX calls and error codes are in the suite (tests/posix.rs runs
/// src/bin/posix_suite/ through a mount, with and without the
/// interception library); here: the mount itself, the daemon's handle
/// ioctl, and real programs.
#[test]
fn handle_ioctl_and_real_programs() {
    if !fuse_available() {
        return;
    }
    let c = cluster(1);
    let tmp = tempfile::tempdir().unwrap();
    let mut m = Mount::start(&c, "cont", &tmp.path().join("mnt"), &["--threads", "4"]);
    assert!(mounts().contains("peregrine "), "{}", mounts());
    fs::create_dir(m.p("d1")).unwrap();
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("d1/fa"))
        .unwrap();
    f.set_len(3 << 20).unwrap();

    // The handle ioctl for the interception library.
    use std::os::fd::AsRawFd;
    // SAFETY: `Handle` is a repr(C) struct of integers, for which all zeroes is valid.
    let mut h: Handle = unsafe { std::mem::zeroed() };
    let cmd: u64 =
        (2 << 30) | ((std::mem::size_of::<Handle>() as u64) << 16) | ((b'P' as u64) << 8) | 1;
    assert_eq!(std::mem::size_of::<Handle>(), 208);
    // SAFETY: the command's size field is size_of::<Handle>() and `h` is a live,
    // writable Handle: the kernel writes at most that many bytes into it.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, &mut h as *mut Handle) };
    assert_eq!(r, 0, "ioctl: {}", std::io::Error::last_os_error());
    assert_eq!(h.version, 1);
    assert_eq!(h.flags, 0, "read-write mount");
    assert_eq!(h.chunk_size, 1 << 20);
    assert_ne!(h.oid_hi, 0);
    let client = c.client();
    let pool = client.pool_connect("pool").unwrap();
    assert_eq!(&h.pool, pool.uuid().as_bytes());
    let mgmt = String::from_utf8_lossy(&h.mgmt[..h.mgmt.iter().position(|&b| b == 0).unwrap()])
        .into_owned();
    assert_eq!(mgmt, c.mgmt_addr());
    // ... and with it the data is reachable directly.
    let cont = pool.cont_open(&uuid_str(&h.cont)).unwrap();
    let direct = peregrine_dfs_file(&cont, &h);
    assert_eq!(direct.size().unwrap(), 3 << 20);
    direct.write_at(0, b"direct!").unwrap();
    let mut f2 = fs::File::open(m.p("d1/fa")).unwrap();
    let mut head = [0u8; 7];
    f2.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"direct!");
    // A directory answers with its own object, flagged as a directory's,
    // in the same container; an unknown command answers ENOTTY.
    let d = fs::File::open(m.p("d1")).unwrap();
    let file_cont = h.cont;
    assert_eq!(
        // SAFETY: as above: `h` is a live Handle of the size the command names.
        unsafe { libc::ioctl(d.as_raw_fd(), cmd as _, &mut h as *mut Handle) },
        0
    );
    assert_eq!((h.flags & 2, h.chunk_size, h.cont), (2, 0, file_cont));
    let unknown = cmd + 0x10; // another command number, same size
    assert_eq!(
        // SAFETY: as above.
        unsafe { libc::ioctl(d.as_raw_fd(), unknown as _, &mut h as *mut Handle) },
        -1
    );
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::ENOTTY)
    );
    drop(f);

    // Real programs, when present.
    real_programs(&m);

    m.stop();
}

fn uuid_str(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn peregrine_dfs_file(cont: &peregrine::Container, h: &Handle) -> peregrine_dfs::File {
    let oid = peregrine::ObjectId {
        hi: h.oid_hi,
        lo: h.oid_lo,
    };
    peregrine_dfs::File::new(cont, oid, h.chunk_size, false).unwrap()
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

fn real_programs(m: &Mount) {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../dfs");
    if have("tar") && have("diff") {
        fs::create_dir(m.p("tarx")).unwrap();
        sh(
            &m.dir,
            &format!(
                "tar -C {} -cf - . | tar -C tarx -xf - && diff -r {} tarx",
                src.display(),
                src.display()
            ),
        );
    } else {
        eprintln!("SKIP tar/diff: not installed");
    }
    if have("git") {
        fs::create_dir(m.p("repo")).unwrap();
        sh(
            &m.p("repo"),
            "git init -q . && git config user.email t@e && git config user.name t && \
             echo hello > a && mkdir -p b && echo x > b/c && git add -A && git commit -qm one && \
             echo more >> a && git commit -qam two && git log --oneline | wc -l | grep -q 2 && git fsck 2>&1",
        );
    } else {
        eprintln!("SKIP git: not installed");
    }
}

#[test]
fn two_daemons_share_a_file() {
    if !fuse_available() {
        return;
    }
    let c = cluster(2);
    let tmp = tempfile::tempdir().unwrap();
    let opts = [
        "--data-cache",
        "off",
        "--attr-timeout",
        "0",
        "--dentry-timeout",
        "0",
    ];
    let mut a = Mount::start(&c, "cont", &tmp.path().join("a"), &opts);
    let mut b = Mount::start(&c, "cont", &tmp.path().join("b"), &opts);
    fs::write(a.p("shared"), b"").unwrap();
    let half = 3 << 20;
    let da = pattern(10, half);
    let db = pattern(11, half);
    std::thread::scope(|s| {
        s.spawn(|| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .open(a.p("shared"))
                .unwrap();
            f.write_all(&da).unwrap();
        });
        s.spawn(|| {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .open(b.p("shared"))
                .unwrap();
            f.seek(SeekFrom::Start(half as u64)).unwrap();
            f.write_all(&db).unwrap();
        });
    });
    for m in [&a, &b] {
        assert_eq!(fs::metadata(m.p("shared")).unwrap().len(), 2 * half as u64);
        let all = fs::read(m.p("shared")).unwrap();
        assert_eq!(&all[..half], &da[..]);
        assert_eq!(&all[half..], &db[..]);
    }
    a.stop();
    b.stop();
}

/// A daemon removes the files it created without reading their entries
/// first (it knows the version its create wrote): the one nobody touched
/// is removed; the one another daemon renamed away meanwhile, while this
/// kernel still holds its name, is not there (ENOENT), and the renamed
/// file keeps its bytes.
#[test]
fn removals_through_a_daemon_leave_what_another_daemon_moved() {
    if !fuse_available() {
        return;
    }
    let c = cluster(2);
    let tmp = tempfile::tempdir().unwrap();
    let mut a = Mount::start(&c, "cont", &tmp.path().join("a"), &[]);
    let mut b = Mount::start(&c, "cont", &tmp.path().join("b"), &[]);
    fs::write(a.p("mine"), b"mine").unwrap();
    fs::write(a.p("moved"), b"keep me").unwrap();
    fs::rename(b.p("moved"), b.p("kept")).unwrap();
    fs::remove_file(a.p("mine")).unwrap();
    assert_eq!(errno_of(fs::remove_file(a.p("moved"))), libc::ENOENT);
    assert_eq!(errno_of(fs::metadata(b.p("mine"))), libc::ENOENT);
    for m in [&a, &b] {
        assert_eq!(fs::read(m.p("kept")).unwrap(), b"keep me");
    }
    a.stop();
    b.stop();
}

#[test]
fn stale_mount_and_helper_form() {
    if !fuse_available() {
        return;
    }
    let c = cluster(1);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("m");
    let mut m = Mount::start(&c, "cont", &dir, &[]);
    fs::write(m.p("keep"), b"kept").unwrap();
    // SIGKILL leaves a stale mount: ENOTCONN. Over io_uring, until the dead
    // daemon's rings are torn down, ECONNABORTED (a request the connection's
    // abort catches) or ECANCELED (one handed to a dead ring entry).
    let mut child = m.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    let e = errno_of(fs::metadata(&m.dir));
    assert!(
        [libc::ENOTCONN, libc::ECONNABORTED, libc::ECANCELED].contains(&e),
        "errno {e}"
    );
    // The next start detects and clears it: helper form, backgrounded.
    let st = Command::new(FUSE_BIN)
        .arg("pool/cont")
        .arg(&dir)
        .args(["-o", &format!("mgmt={},rw,noatime", c.mgmt_addr())])
        .envs(c.tls_env())
        .status()
        .unwrap();
    assert!(st.success());
    assert!(mounted(&m.dir), "{}", mounts());
    assert_eq!(fs::read(m.p("keep")).unwrap(), b"kept");
    // Only one peregrine mount on the directory now.
    let d = m.dir.to_str().unwrap().to_string();
    assert_eq!(
        mounts()
            .lines()
            .filter(|l| l.split(' ').nth(1) == Some(&d))
            .count(),
        1
    );
    // umount makes the detached daemon exit.
    let st = Command::new("umount").arg(&m.dir).status().unwrap();
    assert!(st.success());
    assert!(!mounted(&m.dir));
}

#[test]
fn engine_down_gives_eio_not_a_hang() {
    if !fuse_available() {
        return;
    }
    let mut c = cluster(1);
    let tmp = tempfile::tempdir().unwrap();
    let mut m = Mount::start(
        &c,
        "cont",
        &tmp.path().join("m"),
        &["--data-cache", "off", "--attr-timeout", "0"],
    );
    fs::write(m.p("f"), b"x").unwrap();
    c.engines[0].kill9();
    let t = Instant::now();
    let r = fs::write(m.p("f"), b"more");
    assert!(r.is_err(), "write with the engine down succeeded");
    assert!(
        t.elapsed() < Duration::from_secs(70),
        "took {:?}",
        t.elapsed()
    );
    eprintln!("engine down: {:?} after {:?}", r.unwrap_err(), t.elapsed());
    m.stop();
}

/// close(2) of a file opened for reading does not wait for the daemon
/// (FOPEN_NOFLUSH: nothing to record), while the close of a written file
/// still does (its FLUSH records the write's mtime). Seen with the daemon
/// stopped (SIGSTOP): the first close returns, the second waits for SIGCONT.
#[test]
fn only_closes_of_written_files_wait_for_the_daemon() {
    if !fuse_available() {
        return;
    }
    let c = cluster(1);
    let tmp = tempfile::tempdir().unwrap();
    let mut m = Mount::start(&c, "cont", &tmp.path().join("m"), &[]);
    fs::write(m.p("r"), b"read me").unwrap();
    let mut reader = fs::File::open(m.p("r")).unwrap();
    let mut s = String::new();
    std::io::Read::read_to_string(&mut reader, &mut s).unwrap();
    assert_eq!(s, "read me");
    let mut writer = fs::OpenOptions::new().write(true).open(m.p("r")).unwrap();
    std::io::Write::write_all(&mut writer, b"READ").unwrap();
    let pid = m.child.as_ref().unwrap().id() as libc::pid_t;
    // SAFETY: signals to our own child, not yet reaped.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGSTOP) }, 0);
    let close_in_thread = |f: fs::File| {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            drop(f);
            let _ = tx.send(());
        });
        rx
    };
    let read_closed = close_in_thread(reader).recv_timeout(Duration::from_secs(10));
    let write_closed = close_in_thread(writer);
    let waited = write_closed
        .recv_timeout(Duration::from_millis(500))
        .is_err();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGCONT) }, 0);
    assert!(
        read_closed.is_ok(),
        "close of a read-only file waited for the stopped daemon"
    );
    assert!(waited, "close of a written file did not wait for its FLUSH");
    write_closed.recv_timeout(Duration::from_secs(30)).unwrap();
    assert_eq!(fs::read(m.p("r")).unwrap(), b"READ me");
    m.stop();
}

// ------------------------------------------------ mount(8), fstab, users

/// Running `peregrine-fuse` daemons whose arguments name `dir`.
fn daemons_on(dir: &Path) -> Vec<u32> {
    let d = dir.as_os_str().as_bytes();
    let mut v = vec![];
    for e in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(cl) = fs::read(e.path().join("cmdline")) else {
            continue;
        };
        let argv: Vec<&[u8]> = cl.split(|&b| b == 0).collect();
        let prog = Path::new(std::ffi::OsStr::from_bytes(argv[0]));
        let name = prog.file_name().map(|n| n.as_bytes()).unwrap_or(b"");
        if matches!(name, b"peregrine" | b"peregrine-fuse") && argv.contains(&d) {
            v.push(pid);
        }
    }
    v
}

/// Wait until no daemon serves `dir` any more (10 s).
fn wait_no_daemon(dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !daemons_on(dir).is_empty() {
        assert!(
            Instant::now() < deadline,
            "daemon still running 10 s after unmount: {:?}",
            daemons_on(dir)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn have_cmd(tool: &str) -> bool {
    let ok = have(tool);
    if !ok {
        eprintln!("SKIP: {tool} is not installed");
    }
    ok
}

fn is_root() -> bool {
    // SAFETY: geteuid takes no arguments and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    if !root {
        eprintln!("SKIP: needs root");
    }
    root
}

fn run_ok(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{cmd:?} exited {}:\n{}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `sh -c script` in a private mount namespace (mounts made there vanish
/// with it), killed after two minutes.
fn sh_in_private_mount_ns(script: &str) -> Command {
    let mut cmd = Command::new("timeout");
    cmd.args([
        "-k",
        "5",
        "120",
        "unshare",
        "--mount",
        "--propagation",
        "private",
    ])
    .args(["sh", "-c", script]);
    cmd
}

fn mount_line(dir: &Path) -> String {
    let d = dir.to_str().unwrap();
    mounts()
        .lines()
        .find(|l| l.split(' ').nth(1) == Some(d))
        .unwrap_or_else(|| panic!("{d} not in /proc/mounts"))
        .to_string()
}

/// The argument form mount.fuse3 (package fuse3) gives a FUSE daemon:
/// `TYPE SOURCE DIR -o OPTIONS` with its own options added (dev, suid) and
/// mount(8)'s removed (_netdev, nofail, noauto), TYPE found on PATH. This
/// is the path of the mount.fuse.peregrine helper (next test) without
/// mount(8), which drops PATH and only searches /sbin for helpers.
#[test]
fn mount_fuse3_starts_the_daemon() {
    if !fuse_available() || !is_root() {
        return;
    }
    if !Path::new("/sbin/mount.fuse3").exists() {
        eprintln!("SKIP: /sbin/mount.fuse3 (package fuse3) is not installed");
        return;
    }
    let c = cluster(1);
    let tmp = tempfile::tempdir().unwrap();
    let bin = tmp.path().join("bin");
    fs::create_dir(&bin).unwrap();
    std::os::unix::fs::symlink(FUSE_BIN, bin.join("peregrine-fuse")).unwrap();
    let dir = tmp.path().join("m");
    fs::create_dir(&dir).unwrap();
    let dir = dir.canonicalize().unwrap();
    run_ok(
        Command::new("/sbin/mount.fuse3")
            .arg("pool/cont")
            .arg(&dir)
            .arg("-o")
            .arg(format!(
                "mgmt={},attr_timeout=0,threads=2,_netdev,nofail,noauto",
                c.mgmt_addr()
            ))
            .args(["-t", "fuse.peregrine-fuse"])
            .envs(c.tls_env())
            .env("PATH", format!("{}:/usr/bin:/bin", bin.display())),
    );
    assert!(mounted(&dir), "{}", mounts());
    let line = mount_line(&dir);
    assert!(
        line.starts_with("peregrine ") && line.contains(" fuse.peregrine rw,"),
        "{line}"
    );
    assert_eq!(daemons_on(&dir).len(), 1, "one detached daemon");
    fs::write(dir.join("f"), b"mount.fuse3").unwrap();
    assert_eq!(fs::read(dir.join("f")).unwrap(), b"mount.fuse3");
    run_ok(Command::new("umount").arg(&dir));
    assert!(!mounted(&dir));
    wait_no_daemon(&dir);
}

/// `mount -t fuse.peregrine -o pool=,cont=,... peregrine DIR` and an fstab
/// line through mount(8), the shipped helper `mount.fuse.peregrine` and
/// mount.fuse3, installed as a real system has them:
/// /sbin/mount.fuse.peregrine, `peregrine` (the admin CLI, here a stand-in
/// that fails loudly if run as a mount helper) and peregrine-fuse on the
/// standard PATH. The helper appears in /sbin only inside
/// a private mount namespace (an overlay on /usr/sbin that dies with it),
/// so nothing is installed on the machine.
#[test]
fn mount_fuse_peregrine_helper_and_fstab() {
    if !fuse_available() || !is_root() || !have_cmd("unshare") || !have_cmd("mount") {
        return;
    }
    if !Path::new("/sbin/mount.fuse3").exists() {
        eprintln!("SKIP: /sbin/mount.fuse3 (package fuse3) is not installed");
        return;
    }
    if !fs::read_to_string("/proc/filesystems")
        .unwrap()
        .contains("overlay")
    {
        eprintln!("SKIP: no overlay file system to place the helper in /sbin privately");
        return;
    }
    let installed = Path::new("/sbin/mount.fuse.peregrine").exists();
    let extra2 = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(FUSE_BIN, extra2.path().join("mount.fuse.peregrine")).unwrap();
    let c = cluster(1);
    let tmp = tempfile::tempdir().unwrap();
    let extra = tmp.path().join("extra");
    fs::create_dir(&extra).unwrap();
    let helper = extra.join("mount.fuse.peregrine");
    fs::copy(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("mount.fuse.peregrine"),
        &helper,
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&helper, fs::Permissions::from_mode(0o755)).unwrap();
    // mount(8) runs helpers without PATH (a shell then searches the
    // standard directories): the daemon, and a stand-in for the admin CLI
    // that fails loudly if run as a mount helper, go to /sbin as well.
    std::os::unix::fs::symlink(FUSE_BIN, extra.join("peregrine-fuse")).unwrap();
    fs::write(
        extra.join("peregrine"),
        "#!/bin/sh\necho \"the admin CLI was run as a mount helper: $*\" >&2\nexit 3\n",
    )
    .unwrap();
    fs::set_permissions(extra.join("peregrine"), fs::Permissions::from_mode(0o755)).unwrap();
    let dir = tmp.path().join("m");
    fs::create_dir(&dir).unwrap();
    let dir = dir.canonicalize().unwrap();
    let fstab = tmp.path().join("fstab");
    fs::write(
        &fstab,
        format!(
            "peregrine {} fuse.peregrine pool=pool,cont=cont,mgmt={},ro,noauto,_netdev 0 0\n",
            dir.display(),
            c.mgmt_addr()
        ),
    )
    .unwrap();
    let sbin = fs::canonicalize("/sbin").unwrap();
    let script = r#"set -eu
mount -t overlay overlay -o "lowerdir=$EXTRA:$SBIN" "$SBIN"
test -x /sbin/mount.fuse.peregrine
mount -t fuse.peregrine -o "pool=pool,cont=cont,mgmt=$MGMT,_netdev,nofail" peregrine "$DIR"
grep "^peregrine $DIR fuse.peregrine " /proc/self/mounts | cut -d' ' -f4 | cut -d, -f1
echo helper > "$DIR/helper.txt"
cat "$DIR/helper.txt"
umount "$DIR"
mount -T "$FSTAB" "$DIR"
grep "^peregrine $DIR fuse.peregrine " /proc/self/mounts | cut -d' ' -f4 | cut -d, -f1
cat "$DIR/helper.txt"
umount "$DIR"
# The daemon itself as the helper (a plain symlink) works too.
mount -t overlay overlay -o "lowerdir=$EXTRA2:$SBIN" "$SBIN"
test -L /sbin/mount.fuse.peregrine
mount -t fuse.peregrine -o "pool=pool,cont=cont,mgmt=$MGMT,_netdev,nofail" peregrine "$DIR"
cat "$DIR/helper.txt"
umount "$DIR"
echo done
"#;
    let out = run_ok(
        sh_in_private_mount_ns(script)
            .env("EXTRA", &extra)
            .env("EXTRA2", extra2.path())
            .env("SBIN", &sbin)
            .env("MGMT", c.mgmt_addr())
            .envs(c.tls_env())
            .env("DIR", &dir)
            .env("FSTAB", &fstab)
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
    );
    assert_eq!(out, "rw\nhelper\nro\nhelper\nhelper\ndone\n");
    wait_no_daemon(&dir);
    assert!(!mounted(&dir));
    assert_eq!(
        Path::new("/sbin/mount.fuse.peregrine").exists(),
        installed,
        "the helper leaked out of the namespace"
    );
}

/// Unprivileged: a user (nobody) runs peregrine-fuse, which mounts through
/// the setuid fusermount3; only that user may use the mount (no
/// allow_other); `fusermount3 -u` by the user, and SIGTERM to the daemon,
/// unmount it. FUSE for users needs a /dev/fuse they may open (0666 on
/// distributions); where it is root-only, as in some containers, a 0666
/// node is bound over it inside a private mount namespace, which also
/// holds the mounts: nothing changes outside.
#[test]
fn unprivileged_mount_through_fusermount3() {
    if !fuse_available()
        || !is_root()
        || !have_cmd("setpriv")
        || !have_cmd("fusermount3")
        || !have_cmd("unshare")
    {
        return;
    }
    let c = cluster(1);
    // The daemon acts for nobody, whom the pool and container must grant
    // (docs/access-control.md): by uid, as nobody's name varies by system.
    {
        use peregrine_proto::mgmt::{ContSetPropReq, PoolSetPropReq};
        let acl = || {
            [(
                "acl".to_string(),
                "A::OWNER@:rwa,A:G:GROUP@:rw,A::65534@:rw".to_string(),
            )]
            .into_iter()
            .collect()
        };
        let mut m = c.mgmt();
        c.rt.block_on(m.pool_set_prop(PoolSetPropReq {
            id: "pool".into(),
            props: acl(),
        }))
        .unwrap();
        c.rt.block_on(m.cont_set_prop(ContSetPropReq {
            pool: "pool".into(),
            id: "cont".into(),
            props: acl(),
        }))
        .unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let dir = tmp.path().join("m");
    let devdir = tmp.path().join("dev");
    fs::create_dir(&dir).unwrap();
    fs::create_dir(&devdir).unwrap();
    let dir = dir.canonicalize().unwrap();
    let cdir = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: `cdir` is a NUL-terminated CString alive for the call.
    assert_eq!(unsafe { libc::chown(cdir.as_ptr(), 65534, 65534) }, 0);
    // The daemon reads its certificate as that user: a copy the user owns.
    let tls_env = match c.client_tls_dir() {
        Some(src) => {
            let tls = tmp.path().join("tls");
            fs::create_dir(&tls).unwrap();
            for f in ["ca.crt", "tls.crt", "tls.key"] {
                fs::copy(src.join(f), tls.join(f)).unwrap();
                std::os::unix::fs::chown(tls.join(f), Some(65534), Some(65534)).unwrap();
            }
            std::os::unix::fs::chown(&tls, Some(65534), Some(65534)).unwrap();
            vec![("PEREGRINE_TLS_DIR".to_string(), tls.display().to_string())]
        }
        None => c.tls_env(),
    };
    let script = r#"set -eu
if ! setpriv --reuid=65534 --regid=65534 --clear-groups -- test -r /dev/fuse -a -w /dev/fuse; then
    mount -t tmpfs -o mode=755 tmpfs "$DEVDIR"
    mknod -m 666 "$DEVDIR/fuse" c 10 229
    mount --bind "$DEVDIR/fuse" /dev/fuse
fi
as_nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; }
start() {
    setpriv --reuid=65534 --regid=65534 --clear-groups -- \
        "$FUSE_BIN" --mgmt "$MGMT" --pool pool --cont cont --mountpoint "$DIR" --foreground \
        >>"$LOG" 2>&1 &
    pid=$!
    n=0
    until grep -q "^peregrine $DIR fuse.peregrine " /proc/self/mounts; do
        n=$((n + 1)); [ $n -lt 600 ] || { echo "not mounted:"; cat "$LOG"; exit 1; }
        kill -0 $pid || { echo "daemon died:"; cat "$LOG"; exit 1; }
        sleep 0.05
    done
}
start
grep "^peregrine $DIR fuse.peregrine " /proc/self/mounts | grep -o 'user_id=[0-9]*'
as_nobody sh -c 'echo user > "$DIR/f" && cat "$DIR/f" && stat -c %u:%g "$DIR/f"'
if stat "$DIR/f" >/dev/null 2>&1; then echo "root may use it"; else echo "root may not"; fi
as_nobody fusermount3 -u "$DIR"
wait $pid && echo "daemon exit 0"
grep -q " $DIR " /proc/self/mounts || echo unmounted
start
as_nobody cat "$DIR/f"
kill -TERM $pid
wait $pid && echo "daemon exit 0 after SIGTERM"
grep -q " $DIR " /proc/self/mounts || echo unmounted
"#;
    let out = run_ok(
        sh_in_private_mount_ns(script)
            .env("FUSE_BIN", FUSE_BIN)
            .env("MGMT", c.mgmt_addr())
            .envs(tls_env)
            .env("DIR", &dir)
            .env("DEVDIR", &devdir)
            .env("LOG", tmp.path().join("daemon.log")),
    );
    assert_eq!(
        out,
        "user_id=65534\nuser\n65534:65534\nroot may not\ndaemon exit 0\nunmounted\n\
         user\ndaemon exit 0 after SIGTERM\nunmounted\n",
        "daemon log: {}",
        fs::read_to_string(tmp.path().join("daemon.log")).unwrap_or_default()
    );
    assert!(!mounted(&dir));
}

/// FIFOs, unix sockets and device nodes made by real programs (mkfifo,
/// python's socket.bind, mknod), used (a reader and a writer through the
/// FIFO), found (`find -type`), copied (`cp -a`, `tar`); directory link
/// counts as `stat` and `find` see them, kept by two mounts making
/// subdirectories of one directory at once.
#[test]
fn special_files_and_link_counts_with_real_programs() {
    if !fuse_available() {
        return;
    }
    let c = cluster(1);
    let tmp = tempfile::tempdir().unwrap();
    let opts = ["--attr-timeout", "0", "--dentry-timeout", "0"];
    let mut a = Mount::start(&c, "cont", &tmp.path().join("a"), &opts);
    let mut b = Mount::start(&c, "cont", &tmp.path().join("b"), &opts);
    let root = is_root();

    // A FIFO: a writer and a reader through it, in two processes.
    fs::create_dir(a.p("t")).unwrap();
    sh(
        &a.p("t"),
        "mkfifo -m 640 fifo && { cat fifo > ../got & } && printf 'through the fifo' > fifo && wait && \
         test \"$(cat ../got)\" = 'through the fifo' && test -p fifo",
    );
    // The other mount sees a FIFO too, and a reader there gets what a
    // writer here writes (the pipe is the kernel's, one per node and host).
    assert_eq!(
        sh(&b.p("t"), "stat -c '%F %a %h %s' fifo").trim(),
        "fifo 640 1 0"
    );
    // A unix socket bound by python, a client connecting through the node.
    if have("python3") {
        sh(
            &a.p("t"),
            "python3 -c '
import socket
s = socket.socket(socket.AF_UNIX)
s.bind(\"sock\")
s.listen(1)
c = socket.socket(socket.AF_UNIX)
c.connect(\"sock\")
x, _ = s.accept()
c.sendall(b\"hello\")
assert x.recv(5) == b\"hello\"
' && test -S sock",
        );
    } else {
        eprintln!("SKIP python3: not installed");
    }
    if root {
        sh(
            &a.p("t"),
            "mknod -m 666 null c 1 3 && mknod -m 660 blk b 7 9",
        );
        assert_eq!(
            sh(&b.p("t"), "stat -c '%F %t:%T' null blk"),
            "character special file 1:3\nblock special file 7:9\n"
        );
        // nodev mount: the kernel refuses to open the device.
        let e = fs::File::open(a.p("t/null")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES), "{e}");
    } else {
        eprintln!("SKIP mknod c/b: not root");
    }
    let mut want = vec!["./t/fifo"];
    if have("python3") {
        want.push("./t/sock");
    }
    if root {
        want.extend(["./t/blk", "./t/null"]);
    }
    want.sort();
    let find = |m: &Mount, dir: &str| -> Vec<String> {
        let mut v: Vec<String> = sh(&m.p(dir), "find . -type p -o -type s -o -type c -o -type b")
            .lines()
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    assert_eq!(find(&b, ""), want);
    // cp -a and tar copy the nodes with their types, modes and numbers.
    let shape = |sockets: bool| {
        format!(
            "find . -mindepth 1 {} | sort | while read -r f; do stat -c '%n %F %a %t:%T %h' \"$f\"; done",
            if sockets { "" } else { "! -type s" }
        )
    };
    let orig = sh(&a.p("t"), &shape(true));
    assert_eq!(orig.lines().count(), want.len(), "{orig}");
    // (tar leaves sockets out: "socket ignored".)
    sh(
        &a.dir,
        "cp -a t cpa && mkdir tarx && tar -C t -cf - . 2>/dev/null | tar -C tarx -xf -",
    );
    assert_eq!(sh(&b.p("cpa"), &shape(true)), orig);
    assert_eq!(
        sh(&b.p("tarx"), &shape(false)),
        sh(&a.p("t"), &shape(false))
    );
    // chmod, rename and rm of nodes.
    sh(
        &a.dir,
        "chmod 600 t/fifo && mv t/fifo t/fifo.moved && test -p t/fifo.moved && \
         test \"$(stat -c %a t/fifo.moved)\" = 600 && rm t/fifo.moved && ! test -e t/fifo.moved",
    );

    // Link counts: a deep tree, as stat and find see it.
    sh(
        &a.dir,
        "mkdir -p deep/a/b/c/d/e deep/a/x deep/a/y/z deep/f && touch deep/a/file deep/a/b/file && \
         mkfifo deep/a/p && ln -s b deep/a/l",
    );
    let counts = sh(
        &b.p("deep"),
        "find . -type d | sort | while read -r d; do echo \"$d $(stat -c %h \"$d\")\"; done",
    );
    assert_eq!(
        counts,
        ". 4\n./a 5\n./a/b 3\n./a/b/c 3\n./a/b/c/d 3\n./a/b/c/d/e 2\n./a/x 2\n./a/y 3\n./a/y/z 2\n./f 2\n"
    );
    // find with and without the leaf optimization agree (it may rely on
    // the counts: 2 + subdirectories).
    let f1 = sh(&b.p("deep"), "find . | sort");
    let f2 = sh(&b.p("deep"), "find . -noleaf | sort");
    assert_eq!(f1, f2);
    assert_eq!(f1.lines().count(), 14, "{f1}");
    sh(&a.dir, "mv deep/a/y deep/f/ && rmdir deep/a/x");
    assert_eq!(sh(&b.p("deep"), "stat -c %h . a f"), "4\n3\n3\n");

    // An open file removed: fstat reports 0 links (python's os.fstat).
    if have("python3") {
        sh(
            &a.dir,
            "python3 -c '
import os
f = open(\"gone\", \"w\")
assert os.fstat(f.fileno()).st_nlink == 1
os.unlink(\"gone\")
assert os.fstat(f.fileno()).st_nlink == 0, os.fstat(f.fileno())
'",
        );
    }

    // Two mounts make 40 subdirectories each in one directory at once.
    fs::create_dir(a.p("both")).unwrap();
    std::thread::scope(|s| {
        for (m, tag) in [(&a, "a"), (&b, "b")] {
            s.spawn(move || {
                for i in 0..40 {
                    fs::create_dir(m.p(&format!("both/{tag}{i}"))).unwrap();
                }
            });
        }
    });
    use std::os::unix::fs::MetadataExt;
    for m in [&a, &b] {
        assert_eq!(fs::metadata(m.p("both")).unwrap().nlink(), 82);
    }
    a.stop();
    b.stop();
    for m in [&a, &b] {
        assert!(!m.log().contains("panicked"), "daemon log: {}", m.log());
    }
}
