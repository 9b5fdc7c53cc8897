//! PEREGRINE_IOC_INVALIDATE: after writing a file behind the kernel's back
//! (as the interception library does), the ioctl makes stat and reads
//! through the mount see the new size and data at once, despite the
//! attribute and page caches.

mod common;

use common::*;
use peregrine::dirs_changed;
use std::ffi::CString;
use std::fs;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const IOC_INVALIDATE: u64 = ((b'P' as u64) << 8) | 2;
const IOC_GET_HANDLE: u64 = (2 << 30) | (208 << 16) | ((b'P' as u64) << 8) | 1;

#[test]
fn invalidate_ioctl_refreshes_kernel_caches() {
    if !Path::new("/dev/fuse").exists() {
        eprintln!("SKIP: /dev/fuse is absent");
        return;
    }
    let c = Cluster::with_pool(ClusterSpec::default(), 128, "SX", "crc32c");
    let dir = c.dir.path().join("mnt");
    fs::create_dir_all(&dir).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_peregrine-fuse"))
        .args(["--mgmt", &c.mgmt_addr(), "--pool", "pool", "--cont", "cont"])
        .args(c.tls_args())
        .arg("--mountpoint")
        .arg(&dir)
        .args(["--foreground", "--attr-timeout", "60", "--data-cache", "on"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let dir = dir.canonicalize().unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !fs::read_to_string("/proc/mounts")
        .unwrap()
        .contains(&format!(" {} fuse.peregrine ", dir.display()))
    {
        assert!(Instant::now() < deadline, "not mounted");
        std::thread::sleep(Duration::from_millis(50));
    }
    let p = dir.join("f");
    fs::write(&p, vec![b'a'; 8192]).unwrap();
    let mut f = fs::File::options().read(true).write(true).open(&p).unwrap();
    let mut buf = Vec::new();
    f.read_to_end(&mut buf).unwrap(); // pages and attributes now cached
    assert_eq!(fs::metadata(&p).unwrap().len(), 8192);

    // Write directly through the object handle.
    let mut h = [0u8; 208];
    assert_eq!(
        // SAFETY: IOC_GET_HANDLE writes 208 bytes, the length of the live local `h`.
        unsafe { libc::ioctl(f.as_raw_fd(), IOC_GET_HANDLE as _, h.as_mut_ptr()) },
        0
    );
    let u64_at = |o: usize| u64::from_ne_bytes(h[o..o + 8].try_into().unwrap());
    let pool = c.client().pool_connect("pool").unwrap();
    assert_eq!(&h[8..24], pool.uuid().as_bytes());
    let cont = pool.cont_open("cont").unwrap();
    let oid = peregrine::ObjectId {
        hi: u64_at(40),
        lo: u64_at(48),
    };
    let direct = peregrine_dfs::File::new(&cont, oid, u64_at(56), false).unwrap();
    direct.write_at(0, &vec![b'b'; 4096]).unwrap();
    direct.write_at(8192, &vec![b'c'; 4096]).unwrap();

    // The kernel still has the old view (60 s attributes, cached pages) ...
    assert_eq!(fs::metadata(&p).unwrap().len(), 8192);
    // ... until the ioctl.
    // SAFETY: IOC_INVALIDATE takes no argument; `f` is an open file.
    let r = unsafe { libc::ioctl(f.as_raw_fd(), IOC_INVALIDATE as _) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    assert_eq!(fs::metadata(&p).unwrap().len(), 12288);
    let got = fs::read(&p).unwrap();
    assert_eq!(got.len(), 12288);
    assert!(got[..4096].iter().all(|&b| b == b'b'));
    assert!(got[4096..8192].iter().all(|&b| b == b'a'));
    assert!(got[8192..].iter().all(|&b| b == b'c'));
    f.seek(SeekFrom::Start(0)).unwrap();
    let mut head = [0u8; 4];
    f.read_exact(&mut head).unwrap();
    assert_eq!(&head, b"bbbb");
    drop(f);

    // PEREGRINE_IOC_INVALIDATE_DIRS: a directory changed behind the
    // kernel's back (another client's mkdir in the root) shows its new link
    // count once named, on a descriptor of the directory itself.
    let nlink = |p: &Path| std::os::unix::fs::MetadataExt::nlink(&fs::metadata(p).unwrap());
    let before = nlink(&dir);
    let dfs = peregrine_dfs::Dfs::mount(cont, false, false).unwrap();
    dfs.mkdir(&dfs.root(), b"elsewhere", 0o755, 0, 0).unwrap();
    assert_eq!(nlink(&dir), before, "the kernel's attributes last 60 s");
    let root = fs::File::open(&dir).unwrap();
    // The root's own handle: its object, flagged as a directory's (the
    // interception library learns the container from it).
    let mut h = [0u8; 208];
    // SAFETY: IOC_GET_HANDLE writes 208 bytes, the length of the live local `h`.
    let r = unsafe { libc::ioctl(root.as_raw_fd(), IOC_GET_HANDLE as _, h.as_mut_ptr()) };
    assert_eq!(r, 0, "{}", std::io::Error::last_os_error());
    let u64_at = |o: usize| u64::from_ne_bytes(h[o..o + 8].try_into().unwrap());
    assert_eq!(
        u32::from_ne_bytes(h[4..8].try_into().unwrap()) & 2,
        2,
        "PEREGRINE_FUSE_HANDLE_DIR"
    );
    assert_eq!(&h[24..40], dfs.container().uuid().as_bytes());
    let root_oid = dfs.root().oid();
    assert_eq!(
        (u64_at(40), u64_at(48), u64_at(56)),
        (root_oid.hi, root_oid.lo, 0)
    );
    let call = |b: &mut [u8; dirs_changed::DIRS_SIZE]| {
        // SAFETY: the ioctl reads DIRS_SIZE bytes from `b`, alive for the call.
        let r = unsafe {
            libc::ioctl(
                root.as_raw_fd(),
                dirs_changed::IOC_INVALIDATE_DIRS as _,
                b.as_mut_ptr(),
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error().raw_os_error())
        }
    };
    let mut b = [0u8; dirs_changed::DIRS_SIZE];
    dirs_changed::encode(&[dfs.root().oid()], &mut b);
    // A bad structure is refused and changes nothing.
    let mut bad = b;
    bad[..4].copy_from_slice(&(dirs_changed::DIRS_MAX as u32 + 1).to_ne_bytes());
    assert_eq!(call(&mut bad), Err(Some(libc::EINVAL)));
    assert_eq!(nlink(&dir), before);
    call(&mut b).unwrap();
    assert_eq!(nlink(&dir), before + 1);
    drop(root);

    // SAFETY: kill on the pid of our own child, not yet reaped (so not reused).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    let cs = CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: `cs` is a NUL-terminated CString alive for the call.
    unsafe { libc::umount2(cs.as_ptr(), libc::MNT_DETACH) };
}
