//! Replication and erasure coding across engines: degraded reads with an
//! engine stopped, and checksums catching a flipped byte on the device.

mod common;
use common::*;
use peregrine::{ArrayRead, ReadQueue};
use peregrine_proto::{ObjectClass, ObjectId};

fn write_objects(cont: &peregrine::Container, class: ObjectClass, n: u64, len: usize) {
    for i in 0..n {
        let obj = cont.object(ObjectId::new(class, 1, i)).unwrap();
        // Unaligned, multi-stripe array writes plus a small single value.
        obj.update_array(b"chunk", b"data", 1000, &pattern(i, len))
            .unwrap();
        obj.update_single(b"meta", b"name", format!("object {i}").as_bytes())
            .unwrap();
    }
}

fn verify_objects(cont: &peregrine::Container, class: ObjectClass, n: u64, len: usize) {
    // A 4 KiB piece of every object as one batch (erasure-coded ones, and
    // any whose first copy is away, take the path of a lone read).
    let objs: Vec<_> = (0..n)
        .map(|i| cont.object(ObjectId::new(class, 1, i)).unwrap())
        .collect();
    let mut bufs = vec![vec![0u8; 4096]; n as usize];
    let mut reads: Vec<ArrayRead<'_>> = objs
        .iter()
        .zip(bufs.iter_mut())
        .map(|(obj, buf)| ArrayRead {
            obj,
            dkey: b"chunk",
            akey: b"data",
            offset: 1000 + 777,
            buf,
        })
        .collect();
    for (i, r) in cont.fetch_arrays(&mut reads).into_iter().enumerate() {
        r.unwrap_or_else(|e| panic!("{class} object {i}, batched: {e}"));
    }
    for (i, b) in bufs.iter().enumerate() {
        assert!(
            b[..] == pattern(i as u64, len)[777..777 + 4096],
            "{class} object {i}: wrong data in a batch"
        );
    }
    // The same pieces through a queue that keeps two in flight, each
    // taken as its reply comes.
    let mut qbufs = vec![vec![0u8; 4096]; n as usize];
    let mut queue = ReadQueue::new(cont);
    let mut todo = objs.iter().zip(qbufs.iter_mut()).enumerate();
    let mut done = Vec::new();
    let mut seen = 0;
    loop {
        while queue.len() < 2 {
            let Some((i, (obj, buf))) = todo.next() else {
                break;
            };
            let read = ArrayRead {
                obj,
                dkey: b"chunk",
                akey: b"data",
                offset: 1000 + 777,
                buf,
            };
            queue.submit(i as u64, read);
        }
        if queue.is_empty() {
            break;
        }
        queue.reap(&mut done);
        for c in done.drain(..) {
            let i = c.tag;
            c.result
                .unwrap_or_else(|e| panic!("{class} object {i}, queued: {e}"));
            assert!(
                c.read.buf[..] == pattern(i, len)[777..777 + 4096],
                "{class} object {i}: wrong data through the queue"
            );
            seen += 1;
        }
    }
    assert_eq!(seen, n, "{class}: every queued read handed back once");
    for i in 0..n {
        let obj = cont.object(ObjectId::new(class, 1, i)).unwrap();
        let got = obj
            .fetch_array(b"chunk", b"data", 1000, len)
            .unwrap_or_else(|e| panic!("{class} object {i}: {e}"));
        assert!(got == pattern(i, len), "{class} object {i}: wrong data");
        let head = obj.fetch_array(b"chunk", b"data", 0, 1000).unwrap();
        assert!(
            head.iter().all(|&b| b == 0),
            "{class} object {i}: hole not zero"
        );
        assert_eq!(
            obj.array_size(b"chunk", b"data").unwrap(),
            1000 + len as u64
        );
        // The last dkey holding "data": "meta" sorts after "chunk" but
        // holds no "data".
        assert_eq!(
            obj.last_sized(b"data").unwrap(),
            Some((b"chunk".to_vec(), 1000 + len as u64)),
            "{class} object {i}: the last sized dkey"
        );
        let name = obj.fetch_single(b"meta", b"name").unwrap().unwrap();
        assert_eq!(name, format!("object {i}").as_bytes());
    }
}

fn degraded_read(class: ObjectClass) {
    let mut c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 256,
            scm_mib: 128,
        },
        384,
        class.name(),
        "crc32c",
    );
    let cont = c.container();
    let len = 300 * 1024 + 17;
    write_objects(&cont, class, 12, len);
    verify_objects(&cont, class, 12, len);
    for victim in 0..3 {
        // Rank 0 hosts the management service; the data plane needs only the survivors.
        c.engines[victim].kill9();
        verify_objects(&cont, class, 12, len);
        c.restart(victim);
    }
}

#[test]
fn degraded_read_rp_2g1() {
    degraded_read(ObjectClass::Rp2G1);
}

#[test]
fn degraded_read_ec_2p1g1() {
    degraded_read(ObjectClass::Ec2P1G1);
}

/// EC_4P2G1 over six engines survives two of them stopped at once.
#[test]
fn degraded_read_ec_4p2g1_two_engines_down() {
    let class = ObjectClass::Ec4P2G1;
    let mut c = Cluster::with_pool(
        ClusterSpec {
            engines: 6,
            targets: 1,
            device_mib: 256,
            scm_mib: 64,
        },
        768,
        class.name(),
        "crc32c",
    );
    let cont = c.container();
    let len = 700 * 1024 + 3;
    write_objects(&cont, class, 6, len);
    // Rank 0 hosts the management service; the data plane needs only the survivors.
    c.engines[2].kill9();
    c.engines[5].kill9();
    verify_objects(&cont, class, 6, len);
    c.restart(2);
    c.restart(5);
}

/// Flip one byte of a stored extent inside the device file.
fn flip_byte_of(dev: &std::path::Path, needle: &[u8]) -> bool {
    let mut data = read_file(dev);
    match find_bytes(&data, needle) {
        Some(at) => {
            data[at + needle.len() / 2] ^= 0x40;
            std::fs::write(dev, &data).unwrap();
            true
        }
        None => false,
    }
}

#[test]
fn flipped_byte_is_a_checksum_error_not_data() {
    let mut c = Cluster::with_pool(ClusterSpec::default(), 64, "S1", "crc32c");
    let cont = c.container();
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 5, 5)).unwrap();
    let val = pattern(77, 64 * 1024);
    obj.update_array(b"d", b"a", 0, &val).unwrap();
    drop(obj);
    drop(cont);
    c.engines[0].stop();
    assert!(
        flip_byte_of(&c.engines[0].device, &val[20_000..20_064]),
        "value not found on the device"
    );
    c.restart(0);
    let cont = c.container();
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 5, 5)).unwrap();
    let err = obj
        .fetch_array(b"d", b"a", 0, val.len())
        .expect_err("corrupt data came back as data");
    assert_eq!(err.code, -libc::EILSEQ, "{err}");
    // Reads of other chunks of the same extent are still served.
    let tail = obj.fetch_array(b"d", b"a", 48 * 1024, 16 * 1024).unwrap();
    assert!(tail == val[48 * 1024..]);
}

#[test]
fn flipped_byte_is_served_from_the_replica() {
    let mut c = Cluster::with_pool(
        ClusterSpec {
            engines: 2,
            targets: 1,
            device_mib: 128,
            scm_mib: 64,
        },
        96,
        "RP_2G1",
        "crc32c",
    );
    let cont = c.container();
    let obj = cont
        .object(ObjectId::new(ObjectClass::Rp2G1, 6, 6))
        .unwrap();
    let val = pattern(78, 64 * 1024);
    obj.update_array(b"d", b"a", 0, &val).unwrap();
    drop(obj);
    drop(cont);
    for e in &mut c.engines {
        e.stop();
    }
    // Corrupt the copy on rank 1 only.
    assert!(flip_byte_of(&c.engines[1].device, &val[30_000..30_064]));
    c.engines[1].start();
    c.restart(0);
    c.wait_serving(1);
    let cont = c.container();
    let obj = cont
        .object(ObjectId::new(ObjectClass::Rp2G1, 6, 6))
        .unwrap();
    for _ in 0..4 {
        assert!(obj.fetch_array(b"d", b"a", 0, val.len()).unwrap() == val);
    }
}

// ---- concurrent partial-stripe writers in separate processes ----

const DISJOINT_ROUNDS: u64 = 50;
const DISJOINT_LEN: usize = 5000;
const DISJOINT_STRIPES: u64 = 3;
/// EC_2P1G1: two 128 KiB data cells per stripe.
const DISJOINT_STRIPE: u64 = 2 * 128 * 1024;

/// Where writer `role` (0 = A, 1 = B) writes in round `r`: A inside the
/// stripe's first data cell, B inside its second, neither cell-aligned.
fn disjoint_range(role: u64, r: u64) -> (u64, Vec<u8>) {
    let s = r % DISJOINT_STRIPES;
    let base = if role == 0 { 1000 } else { 140_000 };
    let off = s * DISJOINT_STRIPE + base + (r % 7) * 3;
    (off, pattern(1 + role * 1000 + r, DISJOINT_LEN))
}

/// Replay writer `role`'s first `rounds` rounds into `image`.
fn disjoint_apply(image: &mut [u8], role: u64, rounds: u64) {
    for r in 0..rounds {
        let (off, data) = disjoint_range(role, r);
        image[off as usize..off as usize + data.len()].copy_from_slice(&data);
    }
}

fn disjoint_oid() -> ObjectId {
    ObjectId::new(ObjectClass::Ec2P1G1, 9, 9)
}

/// One writer process of `disjoint_partial_stripe_writers_in_two_processes`
/// (does nothing unless started by it). After each write it checks that
/// all its own bytes so far are still there: the other writer must never
/// overwrite them.
#[test]
fn disjoint_writer_child() {
    let Ok(role) = std::env::var("PRG_DISJOINT_ROLE") else {
        return;
    };
    let role: u64 = role.parse().unwrap();
    let mgmt = std::env::var("PRG_DISJOINT_MGMT").unwrap();
    let dir = std::path::PathBuf::from(std::env::var("PRG_DISJOINT_DIR").unwrap());
    let security = peregrine::Security::from_env().unwrap();
    let client = peregrine::Client::connect(&mgmt, &security).unwrap();
    let cont = client
        .pool_connect("pool")
        .unwrap()
        .cont_open("cont")
        .unwrap();
    let obj = cont.object(disjoint_oid()).unwrap();
    std::fs::write(dir.join(format!("ready{role}")), b"").unwrap();
    while !dir.join("go").exists() {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    let span = (DISJOINT_STRIPES * DISJOINT_STRIPE) as usize;
    for r in 0..DISJOINT_ROUNDS {
        let (off, data) = disjoint_range(role, r);
        obj.update_array(b"d", b"a", off, &data).unwrap();
        let mut mine = vec![0u8; span];
        disjoint_apply(&mut mine, role, r + 1);
        let got = obj.fetch_array(b"d", b"a", 0, span).unwrap();
        for rr in 0..=r.min(DISJOINT_STRIPES + 6) {
            let (o, d) = disjoint_range(role, r - rr);
            let (o, n) = (o as usize, d.len());
            assert!(
                got[o..o + n] == mine[o..o + n],
                "writer {role} round {r}: its bytes at {o}..{} were overwritten",
                o + n
            );
        }
    }
}

/// Two clients in two processes (so no in-process lock can serialize
/// them) repeatedly write disjoint, non-cell-aligned ranges of the same
/// EC stripes: neither may lose the other's acknowledged bytes.
#[test]
fn disjoint_partial_stripe_writers_in_two_processes() {
    let class = ObjectClass::Ec2P1G1;
    let mut c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 256,
            scm_mib: 128,
        },
        384,
        class.name(),
        "crc32c",
    );
    let sync = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut kids: Vec<_> = (0..2u64)
        .map(|role| {
            std::process::Command::new(&exe)
                .args([
                    "--exact",
                    "disjoint_writer_child",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("PRG_DISJOINT_ROLE", role.to_string())
                .env("PRG_DISJOINT_MGMT", c.mgmt_addr())
                .envs(c.tls_env())
                .env("PRG_DISJOINT_DIR", sync.path())
                .spawn()
                .unwrap()
        })
        .collect();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !(sync.path().join("ready0").exists() && sync.path().join("ready1").exists()) {
        assert!(std::time::Instant::now() < deadline, "writers not ready");
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    std::fs::write(sync.path().join("go"), b"").unwrap();
    let ok: Vec<bool> = kids
        .iter_mut()
        .map(|k| k.wait().unwrap().success())
        .collect();
    assert!(
        ok.iter().all(|&o| o),
        "a writer lost bytes or failed: {ok:?}"
    );

    let span = (DISJOINT_STRIPES * DISJOINT_STRIPE) as usize;
    let mut want = vec![0u8; span];
    disjoint_apply(&mut want, 0, DISJOINT_ROUNDS);
    disjoint_apply(&mut want, 1, DISJOINT_ROUNDS);
    let cont = c.container();
    let obj = cont.object(disjoint_oid()).unwrap();
    let got = obj.fetch_array(b"d", b"a", 0, span).unwrap();
    if let Some(at) = (0..span).find(|&i| got[i] != want[i]) {
        panic!("byte {at} wrong after both writers finished");
    }
    // Once both writers returned, parity matches the data: reads with any
    // one engine stopped (reconstructing from parity) give the same bytes.
    for victim in 0..3 {
        c.engines[victim].kill9();
        let got = obj.fetch_array(b"d", b"a", 0, span).unwrap();
        if let Some(at) = (0..span).find(|&i| got[i] != want[i]) {
            panic!("rank {victim} stopped: byte {at} reconstructed wrong (stale parity)");
        }
        c.restart(victim);
    }
}
