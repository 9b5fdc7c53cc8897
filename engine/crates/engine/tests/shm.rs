//! The shared-memory data plane against a real engine: data equality with
//! TCP, proof that shared memory was used, socket lifecycle, and a hostile
//! client that must only ever lose its own connection.

mod common;
mod shmraw;
use common::*;
use peregrine::shm::{ShmConfig, ShmTransport};
use peregrine::transport::{MultiTransport, TcpTransport};
use peregrine::{Client, ObjectClass, ObjectId, TransportKind};
use peregrine_proto::frame::{self, Header, Opcode, HEADER_LEN};
use peregrine_proto::mgmt::SystemQueryReq;
use peregrine_proto::shm::{self as wire, Hello, Mapping, REGION_LEN};
use shmraw::*;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;

fn spec() -> ClusterSpec {
    ClusterSpec {
        engines: 1,
        targets: 2,
        device_mib: 512,
        scm_mib: 256,
    }
}

#[test]
fn shm_io_matches_tcp_and_uses_shared_memory() {
    let mut c = Cluster::with_pool(spec(), 320, "SX", "crc32c");
    let sock = socket(&c);
    assert!(sock.exists(), "no socket at {}", sock.display());

    // The management service advertises the socket.
    let mut m = c.mgmt();
    let members =
        c.rt.block_on(m.system_query(SystemQueryReq {}))
            .unwrap()
            .into_inner()
            .members;
    assert_eq!(members[0].shm_path, sock.display().to_string());

    let shm =
        Client::connect_with_transport(&c.mgmt_addr(), &c.security(), TransportKind::Shm).unwrap();
    let tcp =
        Client::connect_with_transport(&c.mgmt_addr(), &c.security(), TransportKind::Tcp).unwrap();
    let pool = shm.pool_connect("pool").unwrap();
    assert!(pool
        .map()
        .targets
        .iter()
        .all(|t| t.shm_path == sock.display().to_string()));
    let cs = pool.cont_open("cont").unwrap();
    let ct = tcp.pool_connect("pool").unwrap().cont_open("cont").unwrap();
    // A client whose memory the engine may not read (as from a pod in
    // another pid namespace): its large values go through the region.
    let copied = Client::connect_with(
        &c.mgmt_addr(),
        &c.security(),
        std::sync::Arc::new(MultiTransport::with(
            TransportKind::Shm,
            TcpTransport::default(),
            ShmTransport::new(ShmConfig {
                direct_reads: false,
                ..Default::default()
            }),
        )),
    )
    .unwrap();
    let cc = copied
        .pool_connect("pool")
        .unwrap()
        .cont_open("cont")
        .unwrap();

    // Single values around the SCM/NVMe threshold and up to 1 MiB.
    for (i, len) in [0usize, 1, 64, 4095, 4096, 65536, 1 << 20]
        .into_iter()
        .enumerate()
    {
        let oid = ObjectId::new(ObjectClass::SX, 0, 100 + i as u64);
        let v = pattern(i as u64, len);
        cs.object(oid)
            .unwrap()
            .update_single(b"d", b"a", &v)
            .unwrap();
        let got = cs.object(oid).unwrap().fetch_single(b"d", b"a").unwrap();
        assert_eq!(
            got.as_deref(),
            Some(&v[..]),
            "shm round trip of {len} bytes"
        );
        let got = ct.object(oid).unwrap().fetch_single(b"d", b"a").unwrap();
        assert_eq!(got.as_deref(), Some(&v[..]), "tcp read of {len} bytes");
    }
    // Arrays up to 16 MiB, written over shm (values read from our memory,
    // or copied through the region) and over TCP, read over all three.
    for (i, len) in [4096usize, 3 << 20, 16 << 20, 5 << 20]
        .into_iter()
        .enumerate()
    {
        let oid = ObjectId::new(ObjectClass::SX, 0, 200 + i as u64);
        let v = pattern(1000 + i as u64, len);
        let w = [&cs, &ct, &cs, &cc][i];
        w.object(oid)
            .unwrap()
            .update_array(b"d", b"arr", 0, &v)
            .unwrap();
        for (who, cont) in [("shm", &cs), ("tcp", &ct), ("shm copied", &cc)] {
            let got = cont
                .object(oid)
                .unwrap()
                .fetch_array(b"d", b"arr", 0, len)
                .unwrap();
            assert!(got == v, "{who} read of a {len}-byte array differs");
        }
        let mut buf = vec![0u8; len / 4];
        cs.object(oid)
            .unwrap()
            .fetch_array_into(b"d", b"arr", (len / 2) as u64, &mut buf[..len / 4])
            .unwrap();
        assert_eq!(&buf[..len / 4], &v[len / 2..len / 2 + len / 4]);
    }

    // Shared memory was really used, and only it.
    let st = shm.transport().stats();
    assert!(st.shm_calls >= 20, "{st:?}");
    assert_eq!((st.tcp_calls, st.shm_fallbacks), (0, 0), "{st:?}");
    assert!(tcp.transport().stats().shm_calls == 0);
    wait_log(
        &c,
        &format!("shm connection from pid {}", std::process::id()),
    );
    // Auto picks shared memory for this engine on this node.
    let auto =
        Client::connect_with_transport(&c.mgmt_addr(), &c.security(), TransportKind::Auto).unwrap();
    let ca = auto
        .pool_connect("pool")
        .unwrap()
        .cont_open("cont")
        .unwrap();
    let oid = ObjectId::new(ObjectClass::SX, 0, 100 + 6);
    assert_eq!(
        ca.object(oid)
            .unwrap()
            .fetch_single(b"d", b"a")
            .unwrap()
            .unwrap(),
        pattern(6, 1 << 20)
    );
    assert_eq!(auto.transport().stats().tcp_calls, 0);

    // A fan-out (a striped object's last sized dkey: one query per
    // target) goes out together over shared memory, and answers as TCP does.
    let wide = ObjectId::new(ObjectClass::SX, 0, 300);
    let o = cs.object(wide).unwrap();
    for k in 0..8u64 {
        o.update_array(&k.to_be_bytes(), b"arr", 0, &pattern(k, 100 + k as usize))
            .unwrap();
    }
    let last = Some((7u64.to_be_bytes().to_vec(), 107));
    let calls = shm.transport().stats().shm_calls;
    assert_eq!(o.last_sized(b"arr").unwrap(), last);
    assert_eq!(
        shm.transport().stats().shm_calls - calls,
        2,
        "one query per target"
    );
    assert_eq!(ct.object(wide).unwrap().last_sized(b"arr").unwrap(), last);
    // Reads of several dkeys as one batch: one shm call each, as written.
    let mut bufs = vec![vec![0u8; 50]; 8];
    let keys: Vec<[u8; 8]> = (0..8u64).map(|k| k.to_be_bytes()).collect();
    let mut reads: Vec<peregrine::ArrayRead<'_>> = keys
        .iter()
        .zip(bufs.iter_mut())
        .map(|(k, buf)| peregrine::ArrayRead {
            obj: &o,
            dkey: k,
            akey: b"arr",
            offset: 10,
            buf,
        })
        .collect();
    let calls = shm.transport().stats().shm_calls;
    assert!(cs.fetch_arrays(&mut reads).iter().all(|r| r.is_ok()));
    assert_eq!(shm.transport().stats().shm_calls - calls, 8);
    for (k, b) in bufs.iter().enumerate() {
        assert_eq!(b[..], pattern(k as u64, 100 + k)[10..60], "dkey {k}");
    }
    // The same reads through a queue: all eight in flight at once, one
    // shm call each, every reply taken into its own buffer.
    let calls = shm.transport().stats().shm_calls;
    queued_reads(&cs, &o, &keys);
    assert_eq!(shm.transport().stats().shm_calls - calls, 8);

    // A killed engine leaves its socket; the restarted one replaces it, and
    // the client's pooled connections reconnect.
    c.engines[0].kill9();
    assert!(sock.exists());
    c.restart(0);
    wait_log(&c, "removed stale shm socket");
    // A fan-out over idle connections from before the restart, too.
    assert_eq!(o.last_sized(b"arr").unwrap(), last);
    // A queue's reads go out on idle connections from before the restart
    // (the engine it wrote to is gone) and come back right all the same.
    c.engines[0].kill9();
    c.restart(0);
    queued_reads(&cs, &o, &keys);
    o.discard().unwrap();
    assert_eq!(o.last_sized(b"arr").unwrap(), None);
    assert_eq!(ct.object(wide).unwrap().last_sized(b"arr").unwrap(), None);
    let oid = ObjectId::new(ObjectClass::SX, 0, 100 + 5);
    let got = cs.object(oid).unwrap().fetch_single(b"d", b"a").unwrap();
    assert_eq!(got.unwrap(), pattern(5, 65536));
    // A clean stop removes it.
    c.engines[0].stop();
    assert!(!sock.exists(), "socket left behind after SIGTERM");
}

/// Reads of 50 bytes at 10 of ARRAY `arr` of each of `keys` (dkey `k`
/// holds `pattern(k, 100 + k)`), all in flight through one [`ReadQueue`].
fn queued_reads(cont: &peregrine::Container, o: &peregrine::Object, keys: &[[u8; 8]]) {
    let mut bufs = vec![vec![0u8; 50]; keys.len()];
    let mut queue = peregrine::ReadQueue::new(cont);
    for (k, (key, buf)) in keys.iter().zip(bufs.iter_mut()).enumerate() {
        let read = peregrine::ArrayRead {
            obj: o,
            dkey: key,
            akey: b"arr",
            offset: 10,
            buf,
        };
        queue.submit(k as u64, read);
    }
    let mut done = Vec::new();
    while !queue.is_empty() {
        queue.reap(&mut done);
    }
    assert_eq!(done.len(), keys.len());
    for c in done {
        let k = c.tag;
        c.result.unwrap_or_else(|e| panic!("dkey {k}: {e}"));
        assert_eq!(
            c.read.buf[..],
            pattern(k, 100 + k as usize)[10..60],
            "dkey {k}"
        );
    }
}

fn expect_refused(raw: &Raw, what: &str) {
    assert_eq!(raw.reply(), None, "{what}: expected the connection closed");
}

#[test]
fn hostile_shm_client_loses_only_its_connection() {
    let c = Cluster::with_pool(spec(), 128, "S1", "off");
    let sock = socket(&c);
    let pid = std::process::id();
    // A good connection opened first must survive everything below.
    let good = raw_connect(&sock, 0);
    assert!(good.ping(1));
    // The target's page is published read-only.
    assert!(Mapping::map(good.page.as_raw_fd(), wire::TARGET_PAGE_LEN).is_err());

    // Handshake abuse.
    let std_hello = Hello::standard(REGION_LEN, 0);
    let small = wire::memfd_sealed("small", 1 << 20).unwrap();
    let s = raw_hello(&sock, &std_hello, &[&small]);
    expect_closed(&s, "memfd smaller than announced");
    wait_log(&c, "smaller than the announced");

    // SAFETY: a plain memfd without seals.
    let unsealed = unsafe {
        let fd = libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, std_hello.total as libc::off_t), 0);
        OwnedFd::from_raw_fd(fd)
    };
    let s = raw_hello(&sock, &std_hello, &[&unsealed]);
    expect_closed(&s, "unsealed memfd");
    wait_log(&c, "not sealed against shrinking");

    let s = raw_hello(&sock, &std_hello, &[]);
    expect_closed(&s, "hello without fd");
    wait_log(&c, "hello came with 0 descriptors");

    let mut bad = std_hello;
    bad.resp_off = 4096;
    let fd = wire::memfd_sealed("overlap", bad.total).unwrap();
    let s = raw_hello(&sock, &bad, &[&fd]);
    expect_closed(&s, "overlapping regions");
    wait_log(&c, "regions overlap");

    let far = Hello::standard(REGION_LEN, 7);
    let fd = wire::memfd_sealed("far", far.total).unwrap();
    let s = raw_hello(&sock, &far, &[&fd]);
    expect_closed(&s, "target out of range");
    wait_log(&c, "target 7 out of range (this engine has 2 targets)");

    // Request lengths beyond the request region.
    let raw = raw_connect(&sock, 0);
    raw.post(REGION_LEN + 1);
    expect_refused(&raw, "length beyond the region");
    wait_log(&c, &format!("outside the {REGION_LEN}-byte request region"));
    let raw = raw_connect(&sock, 1);
    raw.post(u64::MAX);
    expect_refused(&raw, "length u64::MAX");

    // Garbage frame.
    let raw = raw_connect(&sock, 0);
    raw.write(&pattern(7, 4096));
    raw.post(4096);
    expect_refused(&raw, "garbage frame");
    wait_log(&c, "request frame: bad magic");

    // A valid header whose lengths disagree with the posted length.
    let raw = raw_connect(&sock, 0);
    let h = Header {
        opcode: Opcode::Update as u16,
        flags: 0,
        request_id: 9,
        msg_len: 10,
        bulk_len: 60 << 20,
    };
    raw.write(&h.encode());
    raw.post(HEADER_LEN as u64 + 10);
    expect_refused(&raw, "length mismatch");
    wait_log(&c, "does not match the frame's");

    // Right lengths, undecodable message.
    let raw = raw_connect(&sock, 0);
    let f = frame::encode_frame(Opcode::Fetch, 0, 3, &[0xff; 17], &[]).unwrap();
    raw.write(&f);
    raw.post(f.len() as u64);
    expect_refused(&raw, "undecodable message");
    wait_log(&c, "undecodable fetch message");

    // A well-formed request for the other target.
    let raw = raw_connect(&sock, 0);
    let req = peregrine_proto::data::ListReq {
        addr: Some(peregrine_proto::data::Address {
            pool: vec![0; 16],
            cont: vec![0; 16],
            oid: Some(Default::default()),
            target: 1,
            ..Default::default()
        }),
        ..Default::default()
    };
    let f = frame::encode_frame(
        Opcode::List,
        0,
        5,
        &prost::Message::encode_to_vec(&req),
        &[],
    )
    .unwrap();
    raw.write(&f);
    raw.post(f.len() as u64);
    expect_refused(&raw, "request for another target");
    wait_log(&c, "request for target 1 on a connection to target 0");

    // Bytes on the socket after the hello.
    let raw = raw_connect(&sock, 1);
    wire::send_doorbell(raw.s.as_raw_fd(), 8).unwrap();
    expect_closed(&raw.s, "socket write after the hello");
    wait_log(&c, "wrote to the socket after its hello");

    // A client that vanishes mid-request.
    let raw = raw_connect(&sock, 0);
    let f = frame::encode_frame(Opcode::Ping, 0, 4, &[], &[]).unwrap();
    raw.write(&f);
    raw.post(f.len() as u64);
    drop(raw);

    // Every rejection was logged against this process, and the engine
    // still serves the old connection, new ones, and TCP.
    wait_log(&c, &format!("shm pid {pid}: closing connection"));
    assert!(good.ping(2), "good connection broken:\n{}", c.logs());
    let raw = raw_connect(&sock, 1);
    assert!(raw.ping(3));
    c.wait_serving(0);
    let shm =
        Client::connect_with_transport(&c.mgmt_addr(), &c.security(), TransportKind::Shm).unwrap();
    let cont = shm.pool_connect("pool").unwrap().cont_open("cont").unwrap();
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 0, 1)).unwrap();
    obj.update_single(b"d", b"a", b"still here").unwrap();
    assert_eq!(
        obj.fetch_single(b"d", b"a").unwrap().unwrap(),
        b"still here"
    );
    assert!(c.engines[0].child.is_some());
    assert!(
        !c.engines[0].log_text().contains("panicked"),
        "engine panicked:\n{}",
        c.logs()
    );
}

/// Fetches of whole chunks go from the device straight into the client's
/// response region, page-aligned after the frame header; a client whose
/// region is off the page grid (its own layout) gets the same bytes
/// copied in, after the header, as any other fetch.
#[test]
fn aligned_fetches_land_in_the_response_region_and_others_are_copied() {
    let c = Cluster::with_pool(spec(), 128, "S1", "crc32c");
    let addr = object_address(&c);
    let value = pattern(5, 3 << 20);
    let raw = raw_connect(&socket(&c), 0);
    let (f, _) = update_frame(&addr, b"d", 1, &value, &value, 0);
    raw.write(&f);
    let (resp, _) = raw.call(f.len() as u64);
    assert_eq!(resp.status.map_or(0, |s| s.code), 0);

    let shifted = {
        let mut h = Hello::standard(REGION_LEN, 0);
        h.resp_off += 512;
        h.total += 512;
        raw_connect_with(&socket(&c), h)
    };
    for (off, len, aligned) in [
        (0u64, value.len() as u64, true),
        (1 << 20, 1 << 20, true),
        (4096 * 3, 10, true),
        (100, 1 << 20, false),
    ] {
        let want = &value[off as usize..(off + len) as usize];
        for (conn, page_grid) in [(&raw, true), (&shifted, false)] {
            let (v, bytes) = conn.fetch(&addr, b"d", off, len);
            assert_eq!(v.status, 0);
            assert!(bytes == want, "fetch {off}+{len}: bytes");
            assert_eq!(
                v.crc,
                peregrine_isal::crc32c(want),
                "fetch {off}+{len}: crc"
            );
            assert_eq!(
                conn.last_in_place(),
                aligned && page_grid,
                "fetch {off}+{len}, region on the page grid: {page_grid}"
            );
        }
    }
}

/// An update's values stay in the client's request region until the target
/// copies them, and the client can write that region at any time. A client
/// that rewrites its values while the update is served must get them
/// refused for their checksum, or stored exactly as checksummed: never
/// stored bytes that differ from the checksum stored with them.
#[test]
fn values_rewritten_during_their_update_are_stored_as_checked_or_refused() {
    let c = Cluster::with_pool(spec(), 128, "S1", "crc32c");
    let addr = object_address(&c);
    let raw = raw_connect(&socket(&c), 0);
    let len = 1 << 20;
    let (good, other) = (pattern(1, len), pattern(2, len));
    let (mut stored, mut refused) = (0, 0);
    for round in 0..48u64 {
        let dkey = format!("d{round}").into_bytes();
        let (f, msg_len) = update_frame(&addr, &dkey, round + 1, &good, &good, 0);
        raw.write(&f);
        let bulk_off = raw.hello.req_off + (HEADER_LEN + msg_len) as u64;
        let done = std::sync::atomic::AtomicBool::new(false);
        let (resp, _) = std::thread::scope(|s| {
            // Every other round the values change under the target.
            if round % 2 == 1 {
                s.spawn(|| {
                    while !done.load(Ordering::Relaxed) {
                        raw.map.write(bulk_off + 4096, &other[..256]).unwrap();
                        raw.map.write(bulk_off + 4096, &good[4096..4352]).unwrap();
                    }
                });
            }
            let r = raw.call(f.len() as u64);
            done.store(true, Ordering::Relaxed);
            r
        });
        let code = resp.status.as_ref().map_or(0, |s| s.code);
        if code != 0 {
            assert_eq!(
                code,
                -peregrine_proto::CSUM_ERRNO,
                "round {round}: {resp:?}"
            );
            refused += 1;
        } else {
            stored += 1;
        }
        // What is stored reads back as exactly the checked bytes.
        let (got, bulk) = raw.fetch(&addr, &dkey, 0, len as u64);
        assert_eq!(got.status, 0, "round {round}: {got:?}");
        if code == 0 {
            assert!(
                bulk == good,
                "round {round}: stored bytes differ from the checked ones"
            );
            assert_eq!(got.crc, peregrine_isal::crc32c(&good));
        } else {
            assert_eq!(got.size, 0, "round {round}: a refused update left data");
        }
    }
    eprintln!("rewritten values: {stored} stored, {refused} refused");
    assert!(
        stored >= 24,
        "the untouched rounds are stored ({stored} stored, {refused} refused)"
    );
    assert!(
        !c.engines[0].log_text().contains("panicked"),
        "{}",
        c.logs()
    );
}

/// Large update values can stay in the client's own memory: the engine
/// reads them with process_vm_readv once the hello's probe showed it may.
/// A remote bulk without that, or naming memory the client does not have,
/// is refused with a reason, and the engine carries on.
#[test]
fn remote_update_values_are_read_from_the_client_or_refused() {
    use peregrine_proto::shm::RemotePart;
    let c = Cluster::with_pool(spec(), 128, "S1", "crc32c");
    let addr = object_address(&c);
    let value = pattern(9, (1 << 20) + 4096);
    let update = |dkey: &[u8], id: u64, parts: &[RemotePart]| {
        let list = RemotePart::encode_all(parts);
        update_frame(&addr, dkey, id, &value, &list, wire::FLAG_BULK_REMOTE).0
    };
    let (half, rest) = value.split_at(300_000);
    let parts = [
        RemotePart {
            addr: half.as_ptr() as u64,
            len: half.len() as u64,
        },
        RemotePart {
            addr: rest.as_ptr() as u64,
            len: rest.len() as u64,
        },
    ];

    // Without a probe in the hello the engine reads no client memory.
    let plain = raw_connect(&socket(&c), 0);
    let f = update(b"d0", 1, &parts);
    plain.write(&f);
    plain.post(f.len() as u64);
    expect_refused(&plain, "remote bulk without direct reads");
    wait_log(&c, "on a connection without direct reads");

    // With a probe that reads back, the ack says so and remote values work.
    let nonce = Box::new(0x5eed_f00d_u64);
    let mut hello = Hello::standard(REGION_LEN, 0);
    hello.probe = &*nonce as *const u64 as u64;
    hello.nonce = *nonce;
    let raw = raw_connect_with(&socket(&c), hello);
    assert_ne!(
        raw.ack_flags & wire::ACK_CMA,
        0,
        "the engine took the probe"
    );
    let f = update(b"d1", 2, &parts);
    raw.write(&f);
    let (resp, _) = raw.call(f.len() as u64);
    assert_eq!(resp.status.map_or(0, |s| s.code), 0);
    let (v, bytes) = raw.fetch(&addr, b"d1", 0, value.len() as u64);
    assert_eq!(v.status, 0);
    assert!(bytes == value, "values read from the client's memory");

    // Memory the client does not have: a clear error, nothing stored.
    let bad = [RemotePart {
        addr: 4096,
        len: value.len() as u64,
    }];
    let f = update(b"d2", 3, &bad);
    raw.write(&f);
    let (resp, _) = raw.call(f.len() as u64);
    let st = resp.status.unwrap();
    assert_eq!(st.code, -libc::EINVAL, "{st:?}");
    assert!(st.message.contains("reading the client's memory"), "{st:?}");
    let (v, _) = raw.fetch(&addr, b"d2", 0, 10);
    assert_eq!(v.size, 0, "nothing stored");
    assert!(raw.ping(9), "the connection carries on");
}
