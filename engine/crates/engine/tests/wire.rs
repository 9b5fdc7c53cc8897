//! Malformed data-plane input: each bad frame closes only its own
//! connection, with a logged reason; the engine keeps serving.

mod common;
use common::*;
use peregrine_proto::data;
use peregrine_proto::frame::{self, Header, Opcode, HEADER_LEN};
use prost::Message;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

fn ping(addr: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    frame::write_frame(&mut s, Opcode::Ping, 0, 1, &[], &[]).unwrap();
    match frame::read_frame(&mut s) {
        Ok(f) => f.header.request_id == 1 && f.header.flags & frame::FLAG_RESPONSE != 0,
        Err(_) => false,
    }
}

/// Send `bytes`, then expect the engine to close the connection (EOF) rather than hang or answer.
fn expect_closed(addr: &str, bytes: &[u8], what: &str) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(bytes);
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut buf = [0u8; 64];
    match s.read(&mut buf) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("{what}: expected the connection closed, got {other:?}"),
    }
}

fn header(op: u16, msg_len: u32, bulk_len: u32) -> Vec<u8> {
    Header {
        opcode: op,
        flags: 0,
        request_id: 9,
        msg_len,
        bulk_len,
    }
    .encode()
    .to_vec()
}

#[test]
fn malformed_frames_close_only_their_connection() {
    let c = Cluster::with_pool(ClusterSpec::default(), 64, "S1", "crc32c");
    let addr = format!("127.0.0.1:{}", c.engines[0].data_port);
    assert!(ping(&addr));

    let good = frame::encode_frame(Opcode::Ping, 0, 1, &[], &[]).unwrap();
    let mut corpus: Vec<(String, Vec<u8>)> = vec![
        (
            "bad magic".into(),
            b"HTTP/1.1 GET / \r\n\r\n0123456789abcdef".to_vec(),
        ),
        ("truncated header".into(), good[..HEADER_LEN - 5].to_vec()),
        ("oversized message".into(), header(2, u32::MAX, 0)),
        ("oversized bulk".into(), header(2, 10, u32::MAX)),
        ("unknown opcode".into(), header(77, 0, 0)),
        (
            "truncated message".into(),
            [header(2, 100, 0), vec![1u8; 10]].concat(),
        ),
        (
            "undecodable update".into(),
            [header(2, 8, 0), vec![0xFF; 8]].concat(),
        ),
        (
            "undecodable fetch".into(),
            [header(3, 3, 0), vec![0x0A, 0xFF, 0xFF]].concat(),
        ),
    ];
    let mut bad_version = good.clone();
    bad_version[4] = 9;
    corpus.push(("wrong version".into(), bad_version));
    // Every single-bit flip in a valid header.
    for bit in (0..HEADER_LEN * 8).step_by(7) {
        let mut b = good.clone();
        b[bit / 8] ^= 1 << (bit % 8);
        corpus.push((format!("header bit {bit} flipped"), b));
    }
    // Random garbage, deterministic.
    for seed in 0..20u64 {
        corpus.push((
            format!("random {seed}"),
            pattern(seed, 32 + (seed as usize * 37) % 500),
        ));
    }
    for (what, bytes) in &corpus {
        expect_closed(&addr, bytes, what);
    }
    // Requests whose messages decode but say impossible things get an error reply, not a crash.
    let mut s = TcpStream::connect(&addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let upd = data::UpdateReq {
        addr: Some(data::Address {
            pool: vec![1; 3],
            cont: vec![],
            oid: None,
            shard: 0,
            target: 999,
            map_version: 0,
            ..Default::default()
        }),
        epoch: 1,
        dkey: b"d".to_vec(),
        iods: vec![data::Iod {
            akey: b"a".to_vec(),
            kind: 0,
            offset: 0,
            len: 1 << 20,
            crc: 0,
            has_crc: false,
            ..Default::default()
        }],
        insert_only: false,
        sync: false,
        dtx: None,
        conditions: Vec::new(),
    };
    frame::write_frame(
        &mut s,
        Opcode::Update,
        0,
        5,
        &upd.encode_to_vec(),
        &[b"short"],
    )
    .unwrap();
    let f = frame::read_frame(&mut s).expect("error reply");
    let resp = data::Response::decode(f.msg.as_slice()).unwrap();
    let st = resp.status.unwrap();
    assert!(st.code < 0 && !st.message.is_empty(), "{st:?}");

    assert!(
        ping(&addr),
        "engine stopped serving after the corpus; logs:\n{}",
        c.logs()
    );
    let log = c.engines[0].log_text();
    assert!(
        log.contains("closing connection"),
        "no logged reason:\n{log}"
    );
    assert!(!log.contains("panicked"), "{log}");
}
