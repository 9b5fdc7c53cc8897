//! Helpers shared by the integration tests: a formatted device in a temp dir
//! and thin wrappers building data-plane requests.
#![allow(dead_code)]

use peregrine_vos::*;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::process::Command;
use uuid::Uuid;

pub const MIB: u64 = 1 << 20;

pub fn options(path: &Path, mib: u64, targets: u32) -> StorageOptions {
    StorageOptions {
        bdev: BdevSpec {
            class: BdevClass::File,
            path: path.to_path_buf(),
            size: mib * MIB,
        },
        scm_bytes: 64 * MIB,
        targets,
        hugepages: false,
        // No flush on its own during a test: what was not flushed is what
        // a power cut may lose.
        flush_interval: std::time::Duration::from_secs(3600),
        poll: DEFAULT_POLL,
        read_spin: DEFAULT_READ_SPIN,
        scrub_rate: DEFAULT_SCRUB_RATE,
        scm_value_max: SCM_VALUE_MAX,
        wal_io: WalIo::default_for(BdevClass::File),
    }
}

/// A freshly formatted device file in its own temp dir.
pub struct Env {
    pub dir: tempfile::TempDir,
    pub opts: StorageOptions,
}

pub fn env(mib: u64, targets: u32) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&dir.path().join("nvme0.img"), mib, targets);
    format(&opts, "test", 0, false).unwrap();
    Env { dir, opts }
}

/// A host file system mounted on a fresh directory for one test, and
/// unmounted when dropped: what a device file's host can and cannot do.
pub struct HostFs {
    dir: tempfile::TempDir,
    /// Where a loop-mounted image lives, dropped after the unmount.
    _image: Option<tempfile::TempDir>,
}

impl HostFs {
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// Mount `source` of file system `fstype` with `opts`; None without
    /// root (mounting needs it), so that tests skip, saying so.
    fn mount(
        fstype: &str,
        source: &Path,
        opts: &str,
        image: Option<tempfile::TempDir>,
    ) -> Option<HostFs> {
        // SAFETY: geteuid takes no arguments and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: mounting a {fstype} host needs root");
            return None;
        }
        let dir = tempfile::tempdir().unwrap();
        let ok = Command::new("mount")
            .args(["-t", fstype, "-o", opts])
            .arg(source)
            .arg(dir.path())
            .status()
            .unwrap();
        assert!(ok.success(), "mount a {fstype} host");
        Some(HostFs { dir, _image: image })
    }
}

impl Drop for HostFs {
    fn drop(&mut self) {
        let _ = Command::new("umount")
            .arg("-l")
            .arg(self.dir.path())
            .status();
    }
}

/// A tmpfs of `mib` MiB: a host that runs out of space.
pub fn tmpfs_host(mib: u64) -> Option<HostFs> {
    HostFs::mount("tmpfs", Path::new("tmpfs"), &format!("size={mib}m"), None)
}

/// An ext2 file system of `mib` MiB on a loop device: a host that cannot
/// reserve blocks (its files have no extents, so fallocate answers
/// EOPNOTSUPP).
pub fn ext2_host(mib: u64) -> Option<HostFs> {
    let image = tempfile::tempdir().unwrap();
    let img = image.path().join("ext2.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(mib * MIB)
        .unwrap();
    let ok = Command::new("mkfs.ext2")
        .args(["-q", "-F"])
        .arg(&img)
        .status()
        .expect("mkfs.ext2 (e2fsprogs)");
    assert!(ok.success(), "mkfs.ext2");
    HostFs::mount("ext2", &img, "loop", Some(image))
}

/// Open the device and create a pool on it: the SCM budget per target is
/// capped by the checkpoint slots of these small devices.
pub fn open_with_pool(e: &Env, nvme: u64) -> (Storage, Uuid, Uuid) {
    let st = Storage::open(&e.opts).unwrap();
    let pool = Uuid::new_v4();
    let scm_per_target = (st.device_space().3 / st.targets() as u64).min(8 * MIB);
    st.pool_create(pool, scm_per_target, nvme).unwrap();
    (st, pool, Uuid::new_v4())
}

#[derive(Clone, Copy)]
pub struct Obj {
    pub pool: Uuid,
    pub cont: Uuid,
    pub hi: u64,
    pub lo: u64,
    pub target: u32,
}

impl Obj {
    pub fn new(pool: Uuid, cont: Uuid, lo: u64, target: u32) -> Obj {
        Obj {
            pool,
            cont,
            hi: 1 << 56,
            lo,
            target,
        }
    }
    pub fn addr(&self) -> Address {
        Address {
            pool: self.pool,
            cont: self.cont,
            oid: ObjectId {
                hi: self.hi,
                lo: self.lo,
            },
            shard: 0,
            target: self.target,
        }
    }
}

pub fn wait(st: &Storage, req: Request) -> Reply {
    st.submit(req).recv().expect("one reply per request")
}

pub fn single(akey: &str, v: &[u8]) -> (Iod, Vec<u8>) {
    (
        Iod {
            akey: akey.as_bytes().to_vec(),
            kind: IodKind::Single,
            len: v.len() as u64,
            crc: Some(peregrine_isal::crc32c(v)),
        },
        v.to_vec(),
    )
}

pub fn extent(akey: &str, offset: u64, v: &[u8]) -> (Iod, Vec<u8>) {
    (
        Iod {
            akey: akey.as_bytes().to_vec(),
            kind: array(offset),
            len: v.len() as u64,
            crc: Some(peregrine_isal::crc32c(v)),
        },
        v.to_vec(),
    )
}

pub fn update(
    st: &Storage,
    o: &Obj,
    epoch: u64,
    dkey: &str,
    vals: Vec<(Iod, Vec<u8>)>,
) -> Result<(), Errno> {
    let mut bulk = Vec::new();
    let mut iods = Vec::new();
    for (i, v) in vals {
        iods.push(i);
        bulk.extend_from_slice(&v);
    }
    let req = UpdateReq {
        addr: o.addr(),
        epoch,
        dkey: dkey.as_bytes().to_vec(),
        iods,
        insert_only: false,
        sync: false,
        dtx: None,
        conditions: Vec::new(),
    };
    wait(st, Request::Update(req, bulk.into())).map(|_| ())
}

pub fn fetch_iods(
    st: &Storage,
    o: &Obj,
    epoch: u64,
    dkey: &str,
    iods: Vec<Iod>,
) -> Result<Vec<(FetchedValue, Vec<u8>)>, Errno> {
    let req = FetchReq {
        addr: o.addr(),
        epoch,
        dkey: dkey.as_bytes().to_vec(),
        iods,
    };
    let (resp, bulk) = wait(st, Request::Fetch(req))?;
    let Answer::Fetch(values) = resp else {
        panic!("fetch reply without values")
    };
    let mut pos = 0;
    Ok(values
        .into_iter()
        .map(|v| {
            let b = bulk[pos..pos + v.len as usize].to_vec();
            pos += v.len as usize;
            if let (0, Some(crc)) = (v.status, v.crc) {
                assert_eq!(
                    crc,
                    peregrine_isal::crc32c(&b),
                    "returned crc covers the returned bytes"
                );
            }
            (v, b)
        })
        .collect())
}

/// Fetch one single value: Ok(bytes) or Err(status).
pub fn get_single(
    st: &Storage,
    o: &Obj,
    epoch: u64,
    dkey: &str,
    akey: &str,
) -> Result<Vec<u8>, i32> {
    let iod = Iod {
        akey: akey.as_bytes().to_vec(),
        kind: IodKind::Single,
        ..Default::default()
    };
    let (v, b) = fetch_iods(st, o, epoch, dkey, vec![iod]).unwrap().remove(0);
    if v.status != 0 {
        return Err(v.status);
    }
    assert_eq!(v.size, b.len() as u64);
    Ok(b)
}

/// Fetch `len` bytes of an array at `offset`: Ok((bytes, size)) or Err(status).
pub fn get_array(
    st: &Storage,
    o: &Obj,
    epoch: u64,
    dkey: &str,
    akey: &str,
    offset: u64,
    len: u64,
) -> Result<(Vec<u8>, u64), i32> {
    let iod = Iod {
        akey: akey.as_bytes().to_vec(),
        kind: array(offset),
        len,
        ..Default::default()
    };
    let (v, b) = fetch_iods(st, o, epoch, dkey, vec![iod]).unwrap().remove(0);
    if v.status != 0 {
        return Err(v.status);
    }
    assert_eq!(b.len() as u64, len);
    Ok((b, v.size))
}

pub fn punch(st: &Storage, o: &Obj, epoch: u64, dkey: &str, akeys: &[&str]) -> Result<(), Errno> {
    let req = PunchReq {
        addr: o.addr(),
        epoch,
        dkey: dkey.as_bytes().to_vec(),
        akeys: akeys.iter().map(|a| a.as_bytes().to_vec()).collect(),
        sync: false,
        dtx: None,
        conditions: Vec::new(),
        more: Vec::new(),
    };
    wait(st, Request::Punch(req)).map(|_| ())
}

/// One list call: (keys, anchor, done).
pub fn list(
    st: &Storage,
    o: &Obj,
    epoch: u64,
    dkey: &str,
    anchor: &[u8],
    max: u32,
) -> (Vec<Vec<u8>>, Vec<u8>, bool) {
    let req = ListReq {
        addr: o.addr(),
        epoch,
        dkey: dkey.as_bytes().to_vec(),
        anchor: anchor.to_vec(),
        max,
    };
    let (resp, _) = wait(st, Request::List(req)).unwrap();
    let Answer::List { keys, anchor, done } = resp else {
        panic!("list reply without keys")
    };
    (keys, anchor, done)
}

/// Every key, following anchors.
pub fn list_all(st: &Storage, o: &Obj, epoch: u64, dkey: &str, max: u32) -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    let mut anchor = Vec::new();
    loop {
        let (keys, a, done) = list(st, o, epoch, dkey, &anchor, max);
        assert!(keys.len() <= max as usize);
        all.extend(keys);
        anchor = a;
        if done {
            return all;
        }
    }
}

pub fn query_size(st: &Storage, o: &Obj, epoch: u64, dkey: &str, akey: &str) -> u64 {
    query_size_resp(st, o, epoch, dkey, akey).size
}

/// The whole query-size reply (size, and whether anything is visible).
pub fn query_size_resp(st: &Storage, o: &Obj, epoch: u64, dkey: &str, akey: &str) -> SizeResp {
    let req = QuerySizeReq {
        addr: o.addr(),
        epoch,
        dkey: dkey.as_bytes().to_vec(),
        akey: akey.as_bytes().to_vec(),
        last: None,
    };
    let (resp, _) = wait(st, Request::QuerySize(req)).unwrap();
    let Answer::Size { size, absent } = resp else {
        panic!("query size reply without a size")
    };
    SizeResp { size, absent }
}

/// A query-size reply.
pub struct SizeResp {
    pub size: u64,
    pub absent: bool,
}

/// An ARRAY iod's kind at `offset`, with no condition.
pub fn array(offset: u64) -> IodKind {
    IodKind::Array {
        offset,
        unchanged_since: None,
    }
}

/// Deterministic pseudo-random bytes.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Zero the bytes of the first copy of `v` found on the device (a value,
/// or a key inside a WAL record).
pub fn damage(e: &Env, v: &[u8]) {
    let dev = std::fs::read(&e.opts.bdev.path).unwrap();
    let head = &v[..v.len().min(64)];
    let at = dev
        .windows(head.len())
        .position(|w| w == head)
        .expect("the bytes are on the device");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&e.opts.bdev.path)
        .unwrap();
    f.write_all_at(&vec![0u8; v.len()], at as u64).unwrap();
}
