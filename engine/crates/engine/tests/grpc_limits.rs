//! The gRPC control service's limits, through a real engine (issue 20,
//! point 3): an oversize request is refused naming the limit and the
//! service keeps serving; connections past `control_plane.max_connections`
//! are closed at once, connections that never send a byte are closed after
//! the first-byte timeout, and the engine's memory stays bounded with many
//! idle connections (VmRSS printed).

mod common;
use common::*;
use peregrine_proto::mgmt::mgmt_client::MgmtClient;
use peregrine_proto::mgmt::{PoolQueryReq, SystemQueryReq};
use std::io::Read;
use std::net::TcpStream;
use std::time::{Duration, Instant};

fn rss(c: &Cluster) -> u64 {
    proc_status(c.engines[0].child.as_ref().unwrap().id(), "VmRSS")
}

/// The system query answers, promptly.
fn serves(c: &Cluster, what: &str) {
    let t = Instant::now();
    let mut m = c.mgmt();
    let r = c.rt.block_on(m.system_query(SystemQueryReq {}));
    assert!(r.is_ok(), "{what}: system query failed: {r:?}");
    assert!(
        t.elapsed() < Duration::from_secs(10),
        "{what}: {:?}",
        t.elapsed()
    );
}

#[test]
fn an_oversize_request_is_refused_naming_the_limit() {
    let c = Cluster::start_configured(
        ClusterSpec::default(),
        "control_plane: {max_message_bytes: 1MiB}\n",
    );
    let mut m = c.mgmt();
    let big = "x".repeat(2 << 20);
    let st =
        c.rt.block_on(m.pool_query(PoolQueryReq { id: big }))
            .unwrap_err();
    eprintln!("oversize request: {:?}: {}", st.code(), st.message());
    assert!(
        matches!(
            st.code(),
            tonic::Code::OutOfRange | tonic::Code::ResourceExhausted | tonic::Code::InvalidArgument
        ),
        "{st:?}"
    );
    assert!(
        st.message().contains("limit") && st.message().contains(&(1u64 << 20).to_string()),
        "the refusal names the limit: {st:?}"
    );
    // The same connection and new ones go on.
    let r = c.rt.block_on(m.system_query(SystemQueryReq {}));
    assert!(r.is_ok(), "{r:?}");
    serves(&c, "after an oversize request");
}

#[test]
fn control_connections_are_capped_and_silent_ones_closed() {
    let c = Cluster::start_configured(
        ClusterSpec::default(),
        "control_plane: {max_connections: 32}\n",
    );
    serves(&c, "at start");
    let addr = c.mgmt_addr();
    let before = rss(&c);
    // 200 connections that send nothing: past the cap they are closed at
    // once (an immediate end of stream), the others after the first-byte
    // timeout (10 s).
    let mut conns: Vec<TcpStream> = (0..200)
        .map(|_| TcpStream::connect(&addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    let mut closed = 0;
    for s in &mut conns {
        s.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut b = [0u8; 64];
        if matches!(s.read(&mut b), Ok(0)) {
            closed += 1;
        }
    }
    let during = rss(&c);
    eprintln!(
        "200 silent control connections, cap 32: {closed} closed at once; VmRSS {} -> {} MiB",
        before >> 20,
        during >> 20
    );
    assert!(closed >= 200 - 32, "only {closed} of 200 closed at once");
    wait_log(&c, "(control_plane.max_connections)");
    // The silent ones are gone after the first-byte timeout, and the
    // service answers again.
    let t = Instant::now();
    let mut open = conns.len();
    while open > 0 {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "{open} silent connections still open"
        );
        std::thread::sleep(Duration::from_millis(500));
        open = conns
            .iter()
            .filter(|s| {
                let mut b = [0u8; 64];
                let mut r: &TcpStream = s;
                matches!(r.read(&mut b), Err(ref e)
                    if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut))
            })
            .count();
    }
    serves(&c, "after the silent connections");
}

fn wait_log(c: &Cluster, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.engines[0].log_text().contains(needle) {
        assert!(
            Instant::now() < deadline,
            "engine log lacks {needle:?}:\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Many established, idle HTTP/2 connections (up to the default cap of
/// 1024) cost the engine a bounded amount of memory each, and do not stop
/// it serving.
#[test]
fn many_idle_control_connections_keep_memory_bounded() {
    let c = Cluster::start(ClusterSpec::default());
    serves(&c, "at start");
    let before = rss(&c);
    let (addr, security) = (c.mgmt_addr(), c.security());
    let n = 500;
    let mut clients = Vec::with_capacity(n);
    for _ in 0..n {
        let ch = c.channel(&addr, &security).unwrap();
        let mut m = MgmtClient::new(ch);
        c.rt.block_on(m.system_query(SystemQueryReq {})).unwrap();
        clients.push(m);
    }
    std::thread::sleep(Duration::from_secs(1));
    let after = rss(&c);
    let per = after.saturating_sub(before) / n as u64;
    eprintln!(
        "{n} idle HTTP/2 control connections: engine VmRSS {} -> {} MiB ({} KiB each)",
        before >> 20,
        after >> 20,
        per >> 10
    );
    assert!(per < 256 << 10, "{} KiB per idle connection", per >> 10);
    serves(&c, "with 500 idle connections");
    drop(clients);
}
