//! The TCP data plane's limits, through a real engine (issue 20, point 3):
//! frames that start and never finish, a client that never reads its
//! replies, more connections than the cap, and connections left idle. Each
//! time the engine keeps serving its other clients, its memory stays
//! bounded (VmRSS and VmData of /proc/PID/status, printed), and what it
//! holds of the offender is closed or held back.

mod common;
use common::*;
use peregrine::transport::TransportKind;
use peregrine::{ObjectClass, ObjectId};
use peregrine_proto::data;
use peregrine_proto::frame::{self, Header, Opcode, HEADER_LEN, MAX_MSG};
use prost::Message;
use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// (VmRSS, VmData) of the engine.
fn mem(c: &Cluster) -> (u64, u64) {
    let pid = c.engines[0].child.as_ref().expect("engine running").id();
    (proc_status(pid, "VmRSS"), proc_status(pid, "VmData"))
}

fn mib(b: u64) -> u64 {
    b >> 20
}

/// A formatted one-engine cluster (2 targets) with pool "pool" and
/// container "cont", configured with `extra`.
fn cluster(extra: &str) -> Cluster {
    let c = Cluster::start_configured(ClusterSpec::default(), extra);
    c.format();
    c.create_pool(64, "S1", "crc32c");
    c
}

/// A container opened by a client that uses TCP only (not shared memory).
fn tcp_container(c: &Cluster) -> peregrine::Container {
    let client = peregrine::Client::connect_with_transport(
        &c.mgmt_addr(),
        &c.security(),
        TransportKind::Tcp,
    )
    .unwrap_or_else(|e| panic!("client connect: {e}"));
    client
        .pool_connect("pool")
        .unwrap()
        .cont_open("cont")
        .unwrap()
}

fn data_addr(c: &Cluster) -> String {
    format!("127.0.0.1:{}", c.engines[0].data_port)
}

/// An ordinary client's round trip, which must be served promptly.
fn served(obj: &peregrine::Object, value: &[u8], what: &str) {
    let t = Instant::now();
    let mut back = vec![0u8; value.len()];
    obj.fetch_array_into(b"d", b"a", 0, &mut back)
        .unwrap_or_else(|e| panic!("{what}: the other client's fetch failed: {e}"));
    assert!(back == value, "{what}: the other client read wrong bytes");
    obj.update_single(b"d", b"s", what.as_bytes())
        .unwrap_or_else(|e| panic!("{what}: the other client's update failed: {e}"));
    let took = t.elapsed();
    assert!(
        took < Duration::from_secs(5),
        "{what}: the other client waited {took:?}"
    );
}

/// A ping over `s`; whether it was answered (false: the engine closed it).
fn ping(s: &mut TcpStream) -> bool {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    if frame::write_frame(s, Opcode::Ping, 0, 5, &[], &[]).is_err() {
        return false;
    }
    match frame::read_frame(s) {
        Ok(f) => f.header.request_id == 5,
        Err(frame::FrameError::Io(e)) if e.kind() == ErrorKind::WouldBlock => {
            panic!("neither a reply nor a close within 10 s")
        }
        Err(_) => false,
    }
}

/// Wait (up to `within`) for the engine to close `s`; how long it took.
fn closed_within(s: &mut TcpStream, within: Duration) -> Option<Duration> {
    let t = Instant::now();
    s.set_read_timeout(Some(within)).unwrap();
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return Some(t.elapsed()),
            Ok(_) => continue,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return None
            }
            Err(_) => return Some(t.elapsed()),
        }
    }
}

const STALLED: usize = 200;

/// 200 connections that each start a frame and stall: half a header, or a
/// whole header claiming 4 MiB of message (and 64 MiB of bulk) followed
/// by 16 KiB of it. The engine reserves no more than arrived, serves its
/// other clients throughout, and closes each after the read timeout (2 s
/// here).
#[test]
fn stalled_frames_reserve_nothing_and_are_closed_after_the_read_timeout() {
    let mut c = cluster("data_plane:\n  read_timeout_ms: 2000\n");
    let obj = tcp_container(&c)
        .object(ObjectId::new(ObjectClass::S1, 0, 1))
        .unwrap();
    let value = pattern(1, 1 << 20);
    obj.update_array(b"d", b"a", 0, &value).unwrap();
    served(&obj, &value, "before");
    let before = mem(&c);

    let claim = Header {
        opcode: Opcode::Update as u16,
        flags: 0,
        request_id: 1,
        msg_len: MAX_MSG,
        bulk_len: frame::MAX_BULK,
    }
    .encode();
    let mut socks = Vec::new();
    for i in 0..STALLED {
        let mut s = TcpStream::connect(data_addr(&c)).unwrap();
        if i % 4 == 0 {
            s.write_all(&claim[..HEADER_LEN / 2]).unwrap();
        } else {
            s.write_all(&claim).unwrap();
            s.write_all(&[0x0a; 16 << 10]).unwrap();
        }
        socks.push(s);
    }
    let sent = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    let during = mem(&c);
    served(&obj, &value, "while 200 frames stall");
    let during2 = mem(&c);

    // Every stalled connection is closed: not at once, and not much later
    // than 2 s after its first byte.
    for (i, s) in socks.iter_mut().enumerate() {
        let left = Duration::from_secs(12).saturating_sub(sent.elapsed());
        assert!(
            closed_within(s, left).is_some(),
            "stalled connection {i} still open {:?} after its frame started (read timeout 2 s)",
            sent.elapsed()
        );
    }
    let all_closed = sent.elapsed();
    assert!(
        all_closed >= Duration::from_millis(1500),
        "closed after {all_closed:?}, before the read timeout"
    );
    served(&obj, &value, "after");
    let after = mem(&c);
    eprintln!(
        "engine VmRSS/VmData (MiB): {}/{} before, {}/{} and {}/{} with {STALLED} stalled frames \
         ({} claiming {} MiB each), {}/{} after; all closed {all_closed:?} after they started",
        mib(before.0),
        mib(before.1),
        mib(during.0),
        mib(during.1),
        mib(during2.0),
        mib(during2.1),
        STALLED * 3 / 4,
        mib((MAX_MSG + frame::MAX_BULK) as u64),
        mib(after.0),
        mib(after.1),
    );
    for (now, what) in [(during, "stalled"), (during2, "stalled, serving")] {
        assert!(
            now.0 < before.0 + (64 << 20),
            "VmRSS grew from {} to {} MiB ({what})",
            mib(before.0),
            mib(now.0)
        );
        // 150 x 4 MiB claimed: 600 MiB if reserved up front.
        assert!(
            now.1 < before.1 + (128 << 20),
            "VmData grew from {} to {} MiB: buffers reserved for bytes that never came ({what})",
            mib(before.1),
            mib(now.1)
        );
    }
    assert!(rank0_alive(&mut c), "engine died; logs:\n{}", c.logs());
    let log = c.engines[0].log_text();
    assert!(log.contains("did not arrive whole"), "{log}");
    // Rate-limited: not a line per connection.
    let lines = log.matches("did not arrive whole").count();
    assert!(lines <= 3, "{lines} log lines for one burst of timeouts");
}

fn addr(pool: uuid::Uuid, cont: uuid::Uuid, target: u32, handle: &[u8]) -> Option<data::Address> {
    Some(data::Address {
        pool: pool.as_bytes().to_vec(),
        cont: cont.as_bytes().to_vec(),
        oid: Some(data::ObjectId { hi: 7, lo: 7 }),
        shard: 0,
        target,
        map_version: u64::MAX,
        handle: handle.to_vec(),
    })
}

fn array(len: u64) -> data::Iod {
    data::Iod {
        akey: b"a".to_vec(),
        kind: data::ValueKind::Array as i32,
        offset: 0,
        len,
        ..Default::default()
    }
}

/// Write 1 MiB of (incompressible, so resident when read) data on the
/// shard of object 7.7 on `target`, over a raw connection.
fn write_mib(c: &Cluster, pool: uuid::Uuid, cont: uuid::Uuid, target: u32) {
    let req = data::UpdateReq {
        addr: addr(pool, cont, target, &admin_handle(c)),
        epoch: peregrine::hlc::now(),
        dkey: b"d".to_vec(),
        iods: vec![array(1 << 20)],
        ..Default::default()
    };
    let mut s = TcpStream::connect(data_addr(c)).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let bulk = pattern(u64::from(target) + 7, 1 << 20);
    frame::write_frame(&mut s, Opcode::Update, 0, 3, &req.encode_to_vec(), &[&bulk]).unwrap();
    let f = frame::read_frame(&mut s).unwrap();
    let resp = data::Response::decode(f.msg.as_slice()).unwrap();
    assert_eq!(resp.status.unwrap_or_default().code, 0, "raw update");
}

/// A fetch of that MiB `times` over (one iod each): `times` MiB of reply.
fn fetch(pool: uuid::Uuid, cont: uuid::Uuid, target: u32, times: usize, handle: &[u8]) -> Vec<u8> {
    data::FetchReq {
        addr: addr(pool, cont, target, handle),
        epoch: u64::MAX,
        dkey: b"d".to_vec(),
        iods: vec![array(1 << 20); times],
    }
    .encode_to_vec()
}

/// Send up to `n` fetches of `mib` MiB over a new connection and read no
/// reply; stop once the engine stops taking them (a write blocked 2 s).
/// The connection and how many were sent.
fn never_read(c: &Cluster, target: u32, n: usize, mib: usize) -> (TcpStream, usize) {
    let (pool, cont) = pool_cont(c);
    let msg = fetch(pool, cont, target, mib, &admin_handle(c));
    let mut s = TcpStream::connect(data_addr(c)).unwrap();
    s.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let one = frame::encode_frame(Opcode::Fetch, 0, 9, &msg, &[]).unwrap();
    let mut sent = 0;
    while sent < n {
        match s.write_all(&one) {
            Ok(()) => sent += 1,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => break,
            Err(e) => panic!("fetch {sent}: {e}"),
        }
    }
    (s, sent)
}

/// A client that sends fetches and never reads the replies: many of 1 MiB,
/// and (the reported case) 40 of 64 MiB. The engine stops reading its
/// requests once 64 MiB of replies wait (max_unread_reply_bytes), so its
/// memory stays bounded, and it serves its other clients throughout.
#[test]
fn a_client_that_never_reads_its_replies_pins_at_most_the_cap() {
    let mut c = cluster("");
    let obj = tcp_container(&c)
        .object(ObjectId::new(ObjectClass::S1, 0, 2))
        .unwrap();
    let value = pattern(2, 1 << 20);
    obj.update_array(b"d", b"a", 0, &value).unwrap();
    served(&obj, &value, "before");
    let (pool, cont) = pool_cont(&c);
    write_mib(&c, pool, cont, 0);
    write_mib(&c, pool, cont, 1);
    let before = mem(&c);

    let (small, n_small) = never_read(&c, 0, 20_000, 1);
    std::thread::sleep(Duration::from_secs(2));
    let with_small = mem(&c);
    served(&obj, &value, "while 1 MiB fetches are not read");

    let (big, n_big) = never_read(&c, 1, 40, 64);
    std::thread::sleep(Duration::from_secs(3));
    let with_big = mem(&c);
    served(&obj, &value, "while 64 MiB fetches are not read");
    let with_big2 = mem(&c);
    eprintln!(
        "engine VmRSS (MiB): {} before, {} with {n_small} fetches of 1 MiB unread ({} GiB asked), \
         {} / {} with {n_big} fetches of 64 MiB unread too ({} GiB asked)",
        mib(before.0),
        mib(with_small.0),
        n_small >> 10,
        mib(with_big.0),
        mib(with_big2.0),
        (n_big * 64) >> 10,
    );
    assert!(
        n_small as u64 > 128,
        "only {n_small} fetches were taken: the test did not load the engine"
    );
    assert!(
        with_small.0 < before.0 + (192 << 20),
        "VmRSS grew from {} to {} MiB with 1 MiB fetches unread",
        mib(before.0),
        mib(with_small.0)
    );
    for now in [with_big, with_big2] {
        assert!(
            now.0 < before.0 + (384 << 20),
            "VmRSS grew from {} to {} MiB with 64 MiB fetches unread",
            mib(before.0),
            mib(now.0)
        );
    }
    assert!(rank0_alive(&mut c), "engine died; logs:\n{}", c.logs());

    // The client then reads: its replies come, in order, all of them.
    let mut small = small;
    small
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    for i in 0..n_small.min(300) {
        let f = frame::read_frame(&mut small).unwrap_or_else(|e| panic!("reply {i}: {e}"));
        assert!(f.bulk == pattern(7, 1 << 20), "reply {i}");
    }
    drop((small, big));
    served(&obj, &value, "after");
    let after = mem(&c);
    eprintln!("engine VmRSS after both hung up: {} MiB", mib(after.0));
}

/// With max_connections 8: the connections over the cap are closed at once
/// (one log line for the burst), the others keep working, and once some
/// close, new ones are taken again.
#[test]
fn connections_over_the_cap_are_refused_and_the_others_keep_working() {
    let mut c = cluster("data_plane:\n  max_connections: 8\n");
    let obj = tcp_container(&c)
        .object(ObjectId::new(ObjectClass::S1, 0, 3))
        .unwrap();
    let value = pattern(3, 64 << 10);
    obj.update_array(b"d", b"a", 0, &value).unwrap();
    served(&obj, &value, "before");
    // The client holds one pooled connection; 7 more fill the cap.
    let mut held: Vec<TcpStream> = (0..7)
        .map(|_| TcpStream::connect(data_addr(&c)).unwrap())
        .collect();
    for (i, s) in held.iter_mut().enumerate() {
        assert!(ping(s), "connection {i} under the cap was not served");
    }
    for i in 0..4 {
        let mut s = TcpStream::connect(data_addr(&c)).unwrap();
        let t = Instant::now();
        assert!(
            !ping(&mut s),
            "connection {} over the cap of 8 was served",
            8 + i
        );
        assert!(t.elapsed() < Duration::from_secs(2), "{:?}", t.elapsed());
    }
    served(&obj, &value, "at the cap");
    for (i, s) in held.iter_mut().enumerate() {
        assert!(ping(s), "connection {i} under the cap stopped being served");
    }
    // Two hang up: room for two more.
    held.truncate(5);
    let t = Instant::now();
    loop {
        let mut s = TcpStream::connect(data_addr(&c)).unwrap();
        if ping(&mut s) {
            held.push(s);
            break;
        }
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "no connection taken after two closed"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    served(&obj, &value, "after");
    assert!(rank0_alive(&mut c), "engine died; logs:\n{}", c.logs());
    let log = c.engines[0].log_text();
    let lines = log.matches("connection refused").count();
    assert!(
        (1..=2).contains(&lines),
        "{lines} log lines for a burst of refusals:\n{log}"
    );
    assert!(log.contains("data_plane.max_connections"), "{log}");
}

/// With idle_timeout_s 1: an idle connection is closed by the engine, and
/// a client whose pooled connections were closed so carries on (it
/// reconnects), from several threads at once.
#[test]
fn idle_connections_are_closed_and_clients_reconnect() {
    let mut c = cluster("data_plane:\n  idle_timeout_s: 1\n");
    let cont = tcp_container(&c);
    let objs: Vec<_> = (0..4)
        .map(|i| {
            cont.object(ObjectId::new(ObjectClass::S1, 0, 10 + i))
                .unwrap()
        })
        .collect();
    let value = pattern(4, 256 << 10);
    let round = |what: &str| {
        std::thread::scope(|s| {
            for o in &objs {
                s.spawn(|| {
                    for _ in 0..3 {
                        o.update_array(b"d", b"a", 0, &value)
                            .unwrap_or_else(|e| panic!("{what}: update: {e}"));
                        served(o, &value, what);
                    }
                });
            }
        });
    };
    round("first");
    // A raw connection that stays idle is closed after about 1 s.
    let mut raw = TcpStream::connect(data_addr(&c)).unwrap();
    assert!(ping(&mut raw));
    let idle = closed_within(&mut raw, Duration::from_secs(10))
        .expect("an idle connection was still open 10 s later (idle timeout 1 s)");
    assert!(
        idle >= Duration::from_millis(800),
        "closed after {idle:?}, before the idle timeout"
    );
    // The client's pooled connections were idle as long: closed too. The
    // client carries on.
    std::thread::sleep(Duration::from_millis(1500));
    round("after the idle close");
    std::thread::sleep(Duration::from_millis(2500));
    round("after another");
    assert!(rank0_alive(&mut c), "engine died; logs:\n{}", c.logs());
    eprintln!("idle connection closed by the engine after {idle:?}; the client reconnected");
}

/// With room for one request per target and 1 MiB of requests over both
/// targets (max_queued_request_bytes, smaller than one big update): many
/// clients at once, pipelined requests on one connection and updates
/// bigger than the whole budget are all served, in order, with nothing
/// lost: the readers wait for room, and nothing waits in a circle.
#[test]
fn a_tiny_target_mailbox_slows_readers_and_never_deadlocks() {
    let mut c = cluster("data_plane:\n  target_queue_depth: 1\n  max_queued_request_bytes: 1MiB\n");
    let (pool, cont) = pool_cont(&c);
    let handle = admin_handle(&c);
    write_mib(&c, pool, cont, 0);
    write_mib(&c, pool, cont, 1);
    let container = tcp_container(&c);
    let t = Instant::now();
    std::thread::scope(|s| {
        // A pipeline of 200 fetches over one connection, read afterwards.
        s.spawn(|| {
            let mut raw = TcpStream::connect(data_addr(&c)).unwrap();
            raw.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
            for i in 0..200u64 {
                let msg = fetch(pool, cont, (i % 2) as u32, 1, &handle);
                let f = frame::encode_frame(Opcode::Fetch, 0, i, &msg, &[]).unwrap();
                raw.write_all(&f).unwrap();
            }
            for i in 0..200u64 {
                let f = frame::read_frame(&mut raw).unwrap_or_else(|e| panic!("reply {i}: {e}"));
                assert_eq!(f.header.request_id, i);
                assert!(f.bulk == pattern(7 + i % 2, 1 << 20), "reply {i}");
            }
        });
        for k in 0..6u64 {
            let container = &container;
            s.spawn(move || {
                let o = container
                    .object(ObjectId::new(ObjectClass::S1, 0, 20 + k))
                    .unwrap();
                // 2 MiB: more than all the queue's bytes at once.
                let value = pattern(20 + k, 2 << 20);
                for _ in 0..5 {
                    o.update_array(b"d", b"a", 0, &value).unwrap();
                    let mut back = vec![0u8; value.len()];
                    o.fetch_array_into(b"d", b"a", 0, &mut back).unwrap();
                    assert!(back == value, "object {k} read wrong bytes");
                }
            });
        }
    });
    let took = t.elapsed();
    eprintln!(
        "200 pipelined fetches and 6 x 5 updates/fetches of 2 MiB through a mailbox of 1: {took:?}"
    );
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert!(rank0_alive(&mut c), "engine died; logs:\n{}", c.logs());
}
