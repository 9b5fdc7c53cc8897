//! The shared-memory data plane against a real engine: data equality with
//! TCP, proof that shared memory was used, socket lifecycle, and a hostile
//! client that must only ever lose its own connection.

mod common;
use common::*;
use peregrine::{Client, ObjectClass, ObjectId, TransportKind};
use peregrine_proto::frame::{self, Header, Opcode, HEADER_LEN};
use peregrine_proto::mgmt::SystemQueryReq;
use peregrine_proto::shm::{self as wire, Hello, Mapping, REGION_LEN};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn socket(c: &Cluster) -> PathBuf {
    c.dir.path().join("peregrine-rank0.sock")
}

fn wait_log(c: &Cluster, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.engines[0].log_text().contains(needle) {
        if Instant::now() > deadline {
            panic!("engine log lacks {needle:?}:\n{}", c.logs());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

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

    let shm = Client::connect_with_transport(&c.mgmt_addr(), TransportKind::Shm).unwrap();
    let tcp = Client::connect_with_transport(&c.mgmt_addr(), TransportKind::Tcp).unwrap();
    let pool = shm.pool_connect("pool").unwrap();
    assert!(pool
        .map()
        .targets
        .iter()
        .all(|t| t.shm_path == sock.display().to_string()));
    let cs = pool.cont_open("cont").unwrap();
    let ct = tcp.pool_connect("pool").unwrap().cont_open("cont").unwrap();

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
    // Arrays up to 16 MiB, written over shm and over TCP, read over both.
    for (i, len) in [4096usize, 3 << 20, 16 << 20].into_iter().enumerate() {
        let oid = ObjectId::new(ObjectClass::SX, 0, 200 + i as u64);
        let v = pattern(1000 + i as u64, len);
        let (w, r) = if i % 2 == 0 { (&cs, &ct) } else { (&ct, &cs) };
        w.object(oid)
            .unwrap()
            .update_array(b"d", b"arr", 0, &v)
            .unwrap();
        for (who, cont) in [("shm", &cs), ("tcp", &ct), ("other", r)] {
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
    let auto = Client::connect_with_transport(&c.mgmt_addr(), TransportKind::Auto).unwrap();
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

    // A killed engine leaves its socket; the restarted one replaces it, and
    // the client's pooled connections reconnect.
    c.engines[0].kill9();
    assert!(sock.exists());
    c.restart(0);
    wait_log(&c, "removed stale shm socket");
    let oid = ObjectId::new(ObjectClass::SX, 0, 100 + 5);
    let got = cs.object(oid).unwrap().fetch_single(b"d", b"a").unwrap();
    assert_eq!(got.unwrap(), pattern(5, 65536));
    // A clean stop removes it.
    c.engines[0].stop();
    assert!(!sock.exists(), "socket left behind after SIGTERM");
}

/// Connect and send a hello (with `fd`, if any) as a hostile client would.
fn raw_hello(sock: &PathBuf, hello: &Hello, fd: Option<&OwnedFd>) -> UnixStream {
    let s = UnixStream::connect(sock).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    wire::send_with_fd(s.as_raw_fd(), &hello.encode(), fd.map(|f| f.as_raw_fd())).unwrap();
    s
}

/// A well-behaved handshake, for the doorbell and frame abuse that follows.
fn raw_connect(sock: &PathBuf) -> (UnixStream, Mapping) {
    let hello = Hello::standard(REGION_LEN);
    let fd = wire::memfd_sealed("hostile", hello.total).unwrap();
    let s = raw_hello(sock, &hello, Some(&fd));
    let mut ack = [0u8; wire::ACK_LEN];
    assert!(wire::recv_exact(s.as_raw_fd(), &mut ack).unwrap());
    wire::check_ack(&ack).unwrap();
    let map = Mapping::map(fd.as_raw_fd(), hello.total).unwrap();
    (s, map)
}

/// The engine must close the connection: end of stream, not an answer or a hang.
fn expect_closed(s: &UnixStream, what: &str) {
    let mut b = [0u8; 64];
    match wire::recv_exact(s.as_raw_fd(), &mut b[..8]) {
        Ok(false) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("{what}: expected the connection closed, got {other:?}"),
    }
}

fn ping(s: &UnixStream, map: &Mapping, id: u64) -> bool {
    let f = frame::encode_frame(Opcode::Ping, 0, id, &[], &[]).unwrap();
    map.write(0, &f).unwrap();
    if wire::send_doorbell(s.as_raw_fd(), f.len() as u64).is_err() {
        return false;
    }
    let mut db = [0u8; 8];
    if !matches!(wire::recv_exact(s.as_raw_fd(), &mut db), Ok(true)) {
        return false;
    }
    let n = u64::from_le_bytes(db) as usize;
    let buf = map.read_vec(REGION_LEN, n).unwrap();
    let (f, _) = frame::decode_frame(&buf).unwrap();
    f.header.request_id == id && f.header.flags & frame::FLAG_RESPONSE != 0
}

#[test]
fn hostile_shm_client_loses_only_its_connection() {
    let c = Cluster::with_pool(spec(), 128, "S1", "off");
    let sock = socket(&c);
    let pid = std::process::id();
    // A good connection opened first must survive everything below.
    let (good, good_map) = raw_connect(&sock);
    assert!(ping(&good, &good_map, 1));

    // Handshake abuse.
    let std_hello = Hello::standard(REGION_LEN);
    let small = wire::memfd_sealed("small", 1 << 20).unwrap();
    let s = raw_hello(&sock, &std_hello, Some(&small));
    expect_closed(&s, "memfd smaller than announced");
    wait_log(&c, "smaller than the announced");

    // SAFETY: a plain memfd without seals.
    let unsealed = unsafe {
        let fd = libc::memfd_create(c"unsealed".as_ptr(), libc::MFD_CLOEXEC);
        assert!(fd >= 0);
        assert_eq!(libc::ftruncate(fd, std_hello.total as libc::off_t), 0);
        OwnedFd::from_raw_fd(fd)
    };
    let s = raw_hello(&sock, &std_hello, Some(&unsealed));
    expect_closed(&s, "unsealed memfd");
    wait_log(&c, "not sealed against shrinking");

    let s = raw_hello(&sock, &std_hello, None);
    expect_closed(&s, "hello without fd");
    wait_log(&c, "hello came without a memfd");

    let mut bad = std_hello;
    bad.resp_off = 4096;
    let fd = wire::memfd_sealed("overlap", bad.total).unwrap();
    let s = raw_hello(&sock, &bad, Some(&fd));
    expect_closed(&s, "overlapping regions");
    wait_log(&c, "regions overlap");

    // Doorbell beyond the request region.
    let (s, _map) = raw_connect(&sock);
    wire::send_doorbell(s.as_raw_fd(), REGION_LEN + 1).unwrap();
    expect_closed(&s, "doorbell beyond the region");
    wait_log(&c, &format!("outside the {REGION_LEN}-byte request region"));
    let (s, _map) = raw_connect(&sock);
    wire::send_doorbell(s.as_raw_fd(), u64::MAX).unwrap();
    expect_closed(&s, "doorbell u64::MAX");

    // Garbage frame.
    let (s, map) = raw_connect(&sock);
    map.write(0, &pattern(7, 4096)).unwrap();
    wire::send_doorbell(s.as_raw_fd(), 4096).unwrap();
    expect_closed(&s, "garbage frame");
    wait_log(&c, "request frame: bad magic");

    // A valid header whose lengths disagree with the doorbell.
    let (s, map) = raw_connect(&sock);
    let h = Header {
        opcode: Opcode::Update as u16,
        flags: 0,
        request_id: 9,
        msg_len: 10,
        bulk_len: 60 << 20,
    };
    map.write(0, &h.encode()).unwrap();
    wire::send_doorbell(s.as_raw_fd(), HEADER_LEN as u64 + 10).unwrap();
    expect_closed(&s, "length mismatch");
    wait_log(&c, "does not match the frame's");

    // Right lengths, undecodable message.
    let (s, map) = raw_connect(&sock);
    let f = frame::encode_frame(Opcode::Fetch, 0, 3, &[0xff; 17], &[]).unwrap();
    map.write(0, &f).unwrap();
    wire::send_doorbell(s.as_raw_fd(), f.len() as u64).unwrap();
    expect_closed(&s, "undecodable message");
    wait_log(&c, "undecodable fetch message");

    // A client that vanishes mid-request.
    let (s, map) = raw_connect(&sock);
    let f = frame::encode_frame(Opcode::Ping, 0, 4, &[], &[]).unwrap();
    map.write(0, &f).unwrap();
    wire::send_doorbell(s.as_raw_fd(), f.len() as u64).unwrap();
    drop(s);

    // Every rejection was logged against this process, and the engine
    // still serves the old connection, new ones, and TCP.
    wait_log(&c, &format!("shm pid {pid}: closing connection"));
    assert!(
        ping(&good, &good_map, 2),
        "good connection broken:\n{}",
        c.logs()
    );
    let (s, map) = raw_connect(&sock);
    assert!(ping(&s, &map, 3));
    c.wait_serving(0);
    let shm = Client::connect_with_transport(&c.mgmt_addr(), TransportKind::Shm).unwrap();
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
