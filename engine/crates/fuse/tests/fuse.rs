//! peregrine-fuse against real engines, through real mounts.

mod common;

use common::*;
use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
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

fn cstr(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).unwrap()
}

fn renameat2(a: &Path, b: &Path, flags: u32) -> std::io::Result<()> {
    let (a, b) = (cstr(a), cstr(b));
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            a.as_ptr(),
            libc::AT_FDCWD,
            b.as_ptr(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn setxattr(p: &Path, name: &str, v: &[u8], flags: i32) -> std::io::Result<()> {
    let n = CString::new(name).unwrap();
    let r = unsafe {
        libc::setxattr(
            cstr(p).as_ptr(),
            n.as_ptr(),
            v.as_ptr() as *const _,
            v.len(),
            flags,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

fn getxattr(p: &Path, name: &str) -> std::io::Result<Vec<u8>> {
    let n = CString::new(name).unwrap();
    let mut buf = vec![0u8; 4096];
    let r = unsafe {
        libc::getxattr(
            cstr(p).as_ptr(),
            n.as_ptr(),
            buf.as_mut_ptr() as *mut _,
            buf.len(),
        )
    };
    if r < 0 {
        return Err(std::io::Error::last_os_error());
    }
    buf.truncate(r as usize);
    Ok(buf)
}

fn listxattr(p: &Path) -> Vec<String> {
    let mut buf = vec![0u8; 4096];
    let r = unsafe { libc::listxattr(cstr(p).as_ptr(), buf.as_mut_ptr() as *mut _, buf.len()) };
    assert!(r >= 0, "{}", std::io::Error::last_os_error());
    buf.truncate(r as usize);
    buf.split(|&b| b == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
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

#[test]
fn posix_through_the_mount() {
    if !fuse_available() {
        return;
    }
    let c = cluster(1);
    let tmp = tempfile::tempdir().unwrap();
    let mut m = Mount::start(&c, "cont", &tmp.path().join("mnt"), &["--threads", "4"]);
    assert!(mounts().contains("peregrine "), "{}", mounts());

    // create / write / read / stat
    let data = pattern(1, 3 << 20);
    fs::write(m.p("a.bin"), &data).unwrap();
    assert_eq!(fs::metadata(m.p("a.bin")).unwrap().len(), data.len() as u64);
    assert_eq!(fs::read(m.p("a.bin")).unwrap(), data);
    let mut f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.p("a.bin"))
        .unwrap();
    f.seek(SeekFrom::Start(5 << 20)).unwrap();
    f.write_all(b"tail").unwrap();
    drop(f);
    assert_eq!(fs::metadata(m.p("a.bin")).unwrap().len(), (5 << 20) + 4);
    // O_APPEND
    let mut f = fs::OpenOptions::new()
        .append(true)
        .open(m.p("a.bin"))
        .unwrap();
    f.write_all(b"++").unwrap();
    drop(f);
    let back = fs::read(m.p("a.bin")).unwrap();
    assert_eq!(back.len(), (5 << 20) + 6);
    assert_eq!(&back[..data.len()], &data[..]);
    assert!(back[data.len()..5 << 20].iter().all(|&b| b == 0));
    assert_eq!(&back[5 << 20..], b"tail++");
    // O_EXCL
    let e = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(m.p("a.bin"));
    assert_eq!(errno_of(e), libc::EEXIST);

    // truncate
    let f = fs::OpenOptions::new()
        .write(true)
        .open(m.p("a.bin"))
        .unwrap();
    f.set_len(1000).unwrap();
    drop(f);
    assert_eq!(fs::metadata(m.p("a.bin")).unwrap().len(), 1000);
    assert_eq!(fs::read(m.p("a.bin")).unwrap(), &data[..1000]);
    fs::OpenOptions::new()
        .write(true)
        .open(m.p("a.bin"))
        .unwrap()
        .set_len(10 << 20)
        .unwrap();
    assert_eq!(fs::metadata(m.p("a.bin")).unwrap().len(), 10 << 20);
    fs::write(m.p("a.bin"), b"short").unwrap(); // O_TRUNC
    assert_eq!(fs::read(m.p("a.bin")).unwrap(), b"short");

    // chmod / utimes
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(m.p("a.bin"), fs::Permissions::from_mode(0o600)).unwrap();
    assert_eq!(fs::metadata(m.p("a.bin")).unwrap().mode() & 0o7777, 0o600);
    let t = std::time::UNIX_EPOCH + Duration::from_secs(1_234_567_890);
    fs::File::options()
        .write(true)
        .open(m.p("a.bin"))
        .unwrap()
        .set_modified(t)
        .unwrap();
    assert_eq!(fs::metadata(m.p("a.bin")).unwrap().mtime(), 1_234_567_890);

    // mkdir / readdir over 2,000 entries, sorted and stable
    fs::create_dir(m.p("many")).unwrap();
    for i in 0..2000 {
        fs::write(m.p(&format!("many/e{i:05}")), b"").unwrap();
    }
    let names = |p: PathBuf| -> Vec<String> {
        fs::read_dir(p)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect()
    };
    let n1 = names(m.p("many"));
    assert_eq!(n1.len(), 2000);
    let mut sorted = n1.clone();
    sorted.sort();
    assert_eq!(n1, sorted);
    assert_eq!(names(m.p("many")), n1, "same order on a second read");
    assert!(fs::read_dir(m.p("many"))
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .file_type()
        .unwrap()
        .is_file());

    // unlink / rmdir ENOTEMPTY / ENOTDIR / EISDIR
    assert_eq!(errno_of(fs::remove_dir(m.p("many"))), libc::ENOTEMPTY);
    fs::remove_file(m.p("many/e00000")).unwrap();
    assert_eq!(errno_of(fs::metadata(m.p("many/e00000"))), libc::ENOENT);
    assert_eq!(errno_of(fs::remove_file(m.p("many"))), libc::EISDIR);
    assert_eq!(errno_of(fs::read_dir(m.p("a.bin/x"))), libc::ENOTDIR);
    fs::create_dir(m.p("empty")).unwrap();
    fs::remove_dir(m.p("empty")).unwrap();
    assert_eq!(errno_of(fs::create_dir(m.p("many"))), libc::EEXIST);

    // ENAMETOOLONG
    let long = "x".repeat(256);
    assert_eq!(errno_of(fs::write(m.p(&long), b"")), libc::ENAMETOOLONG);
    fs::write(m.p(&"y".repeat(255)), b"ok").unwrap();

    // rename: plain, across dirs, over a file, over an empty dir, NOREPLACE, EXCHANGE
    fs::create_dir(m.p("d1")).unwrap();
    fs::create_dir(m.p("d2")).unwrap();
    fs::write(m.p("d1/x"), b"x-data").unwrap();
    fs::rename(m.p("d1/x"), m.p("d2/y")).unwrap();
    assert_eq!(fs::read(m.p("d2/y")).unwrap(), b"x-data");
    assert_eq!(errno_of(fs::metadata(m.p("d1/x"))), libc::ENOENT);
    fs::write(m.p("d2/z"), b"old").unwrap();
    fs::rename(m.p("d2/y"), m.p("d2/z")).unwrap();
    assert_eq!(fs::read(m.p("d2/z")).unwrap(), b"x-data");
    fs::write(m.p("d1/w"), b"w").unwrap();
    assert_eq!(
        errno_of(renameat2(
            &m.p("d1/w"),
            &m.p("d2/z"),
            libc::RENAME_NOREPLACE
        )),
        libc::EEXIST
    );
    renameat2(&m.p("d1/w"), &m.p("d2/z"), libc::RENAME_EXCHANGE).unwrap();
    assert_eq!(fs::read(m.p("d2/z")).unwrap(), b"w");
    assert_eq!(fs::read(m.p("d1/w")).unwrap(), b"x-data");
    fs::create_dir(m.p("d1/sub")).unwrap();
    fs::write(m.p("d1/sub/f"), b"f").unwrap();
    fs::create_dir(m.p("d2/target")).unwrap();
    fs::rename(m.p("d1/sub"), m.p("d2/target")).unwrap();
    assert_eq!(fs::read(m.p("d2/target/f")).unwrap(), b"f");
    fs::create_dir(m.p("d1/sub2")).unwrap();
    assert_eq!(
        errno_of(fs::rename(m.p("d1/sub2"), m.p("d2/target"))),
        libc::ENOTEMPTY
    );
    assert_eq!(
        errno_of(fs::rename(m.p("d1/sub2"), m.p("d2/target/f"))),
        libc::ENOTDIR
    );
    assert_eq!(
        errno_of(fs::rename(m.p("d1/w"), m.p("d1/sub2"))),
        libc::EISDIR
    );
    // a renamed directory keeps working by its new path, old handles too
    fs::rename(m.p("d2"), m.p("d3")).unwrap();
    assert_eq!(fs::read(m.p("d3/target/f")).unwrap(), b"f");

    // symlink / readlink
    std::os::unix::fs::symlink("d3/target/f", m.p("ln")).unwrap();
    assert_eq!(fs::read_link(m.p("ln")).unwrap(), Path::new("d3/target/f"));
    assert_eq!(fs::read(m.p("ln")).unwrap(), b"f");
    assert!(fs::symlink_metadata(m.p("ln"))
        .unwrap()
        .file_type()
        .is_symlink());

    // hard links: EOPNOTSUPP
    assert_eq!(
        errno_of(fs::hard_link(m.p("d1/w"), m.p("d1/hl"))),
        libc::EOPNOTSUPP
    );

    // xattrs
    setxattr(&m.p("d1/w"), "user.k", b"v1", 0).unwrap();
    setxattr(&m.p("d1/w"), "user.k2", b"v2", 0).unwrap();
    assert_eq!(getxattr(&m.p("d1/w"), "user.k").unwrap(), b"v1");
    assert_eq!(
        errno_of(setxattr(&m.p("d1/w"), "user.k", b"x", libc::XATTR_CREATE)),
        libc::EEXIST
    );
    assert_eq!(errno_of(getxattr(&m.p("d1/w"), "user.none")), libc::ENODATA);
    assert_eq!(listxattr(&m.p("d1/w")), vec!["user.k", "user.k2"]);
    let n = CString::new("user.k").unwrap();
    assert_eq!(
        unsafe { libc::removexattr(cstr(&m.p("d1/w")).as_ptr(), n.as_ptr()) },
        0
    );
    assert_eq!(listxattr(&m.p("d1/w")), vec!["user.k2"]);
    // object class by directory xattr, bad value EINVAL
    assert_eq!(
        errno_of(setxattr(&m.p("d1"), "user.peregrine.oclass", b"BOGUS", 0)),
        libc::EINVAL
    );
    setxattr(&m.p("d1"), "user.peregrine.oclass", b"S2", 0).unwrap();
    assert_eq!(
        getxattr(&m.p("d1"), "user.peregrine.oclass").unwrap(),
        b"S2"
    );

    // fallocate mode 0 extends; punch-hole unsupported
    let f = fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(m.p("d1/fa"))
        .unwrap();
    use std::os::fd::AsRawFd;
    assert_eq!(unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, 3 << 20) }, 0);
    assert_eq!(fs::metadata(m.p("d1/fa")).unwrap().len(), 3 << 20);
    let r = unsafe {
        libc::fallocate(
            f.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            0,
            10,
        )
    };
    assert_eq!(r, -1);
    assert_eq!(
        std::io::Error::last_os_error().raw_os_error(),
        Some(libc::EOPNOTSUPP)
    );

    // The handle ioctl for the interception library.
    let mut h: Handle = unsafe { std::mem::zeroed() };
    let cmd: u64 =
        (2 << 30) | ((std::mem::size_of::<Handle>() as u64) << 16) | ((b'P' as u64) << 8) | 1;
    assert_eq!(std::mem::size_of::<Handle>(), 208);
    let r = unsafe { libc::ioctl(f.as_raw_fd(), cmd as _, &mut h as *mut Handle) };
    assert_eq!(r, 0, "ioctl: {}", std::io::Error::last_os_error());
    assert_eq!(h.version, 1);
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
    direct.write_at(0, b"direct!").unwrap();
    let mut f2 = fs::File::open(m.p("d1/fa")).unwrap();
    let mut head = [0u8; 7];
    f2.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"direct!");
    drop(f);

    // statfs from pool space
    let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(cstr(&m.dir).as_ptr(), &mut sv) }, 0);
    assert!(sv.f_blocks > 0 && sv.f_bfree <= sv.f_blocks);
    assert_eq!(sv.f_namemax, 255);

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

fn sh(dir: &Path, script: &str) {
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{script}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
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
fn read_only_mount() {
    if !fuse_available() {
        return;
    }
    let c = cluster(1);
    let tmp = tempfile::tempdir().unwrap();
    {
        let mut m = Mount::start(&c, "cont", &tmp.path().join("rw"), &[]);
        fs::write(m.p("f"), b"data").unwrap();
        m.stop();
    }
    let mut m = Mount::start(&c, "cont", &tmp.path().join("ro"), &["--read-only"]);
    assert_eq!(fs::read(m.p("f")).unwrap(), b"data");
    assert_eq!(errno_of(fs::write(m.p("g"), b"x")), libc::EROFS);
    assert_eq!(
        errno_of(fs::OpenOptions::new().write(true).open(m.p("f"))),
        libc::EROFS
    );
    assert_eq!(errno_of(fs::create_dir(m.p("d"))), libc::EROFS);
    assert_eq!(errno_of(fs::remove_file(m.p("f"))), libc::EROFS);
    m.stop();
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
    // SIGKILL leaves a stale mount: ENOTCONN.
    let mut child = m.child.take().unwrap();
    child.kill().unwrap();
    child.wait().unwrap();
    assert_eq!(errno_of(fs::metadata(&m.dir)), libc::ENOTCONN);
    // The next start detects and clears it: helper form, backgrounded.
    let st = Command::new(FUSE_BIN)
        .arg("pool/cont")
        .arg(&dir)
        .args(["-o", &format!("mgmt={},rw,noatime", c.mgmt_addr())])
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
