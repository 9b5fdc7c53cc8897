//! Inputs that ask for too much, through a real engine: a fetch whose total
//! is absurd, a Join whose fields would not fit the management state. Each
//! is refused with an error naming the limit; the engine keeps serving its
//! other clients and its memory stays bounded.

mod common;
use common::*;
use peregrine::{ObjectClass, ObjectId};
use peregrine_proto::data;
use peregrine_proto::frame::{self, Opcode};
use peregrine_proto::mgmt::mgmt_client::MgmtClient;
use peregrine_proto::mgmt::*;
use prost::Message;
use std::net::TcpStream;
use std::time::Duration;

fn engine_pid(c: &Cluster) -> u32 {
    c.engines[0].child.as_ref().expect("engine running").id()
}

/// A fetch of `n` ARRAY iods of `len` bytes each, on an akey never written.
fn fetch(pool: uuid::Uuid, cont: uuid::Uuid, target: u32, n: usize, len: u64) -> data::FetchReq {
    data::FetchReq {
        addr: Some(data::Address {
            pool: pool.as_bytes().to_vec(),
            cont: cont.as_bytes().to_vec(),
            oid: Some(data::ObjectId { hi: 7, lo: 7 }),
            shard: 0,
            target,
            map_version: u64::MAX,
            ..Default::default()
        }),
        epoch: u64::MAX,
        dkey: b"d".to_vec(),
        iods: (0..n)
            .map(|_| data::Iod {
                akey: b"absent".to_vec(),
                kind: data::ValueKind::Array as i32,
                offset: 0,
                len,
                ..Default::default()
            })
            .collect(),
    }
}

/// Send `req` raw over a connection of its own; the reply's status and bulk length.
fn call(c: &Cluster, req: &data::FetchReq) -> (data::Status, usize) {
    let addr = format!("127.0.0.1:{}", c.engines[0].data_port);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut req = req.clone();
    req.addr.as_mut().expect("an address").handle = admin_handle(c);
    let msg = req.encode_to_vec();
    frame::write_frame(&mut s, Opcode::Fetch, 0, 11, &msg, &[]).unwrap();
    let f = frame::read_frame(&mut s).unwrap_or_else(|e| {
        std::thread::sleep(Duration::from_millis(300));
        panic!("no reply to a fetch ({e}); logs:\n{}", c.logs())
    });
    let resp = data::Response::decode(f.msg.as_slice()).unwrap();
    (resp.status.unwrap_or_default(), f.bulk.len())
}

#[test]
fn a_fetch_asking_for_100_gib_is_refused_and_the_engine_serves_on() {
    let mut c = Cluster::with_pool(ClusterSpec::default(), 64, "S1", "crc32c");
    let (pool, cont) = pool_cont(&c);
    let obj = c
        .container()
        .object(ObjectId::new(ObjectClass::S1, 0, 1))
        .unwrap();
    let value = pattern(3, 1 << 20);
    obj.update_array(b"d", b"a", 0, &value).unwrap();
    let pid = engine_pid(&c);
    let before = proc_status(pid, "VmRSS");

    // The reported crash: 100 iods of 1 GiB on an akey that does not exist.
    let big = fetch(pool, cont, 0, 100, 1 << 30);
    let wire = big.encode_to_vec().len();
    assert!(wire < 2048, "the request is {wire} bytes");
    let limit = peregrine_proto::MAX_IO_BYTES;
    for target in 0..2 {
        let (st, bulk) = call(&c, &fetch(pool, cont, target, 100, 1 << 30));
        assert!(
            rank0_alive(&mut c),
            "engine died on a {wire}-byte fetch; logs:\n{}",
            c.logs()
        );
        assert_eq!(st.code, -libc::EINVAL, "{st:?}");
        assert!(
            st.message.contains(&limit.to_string())
                && st.message.contains(&(100u64 << 30).to_string()),
            "the error names neither the limit nor the size asked: {st:?}"
        );
        assert_eq!(bulk, 0);
    }
    // One byte over the limit, split over iods, is refused too ...
    let (st, _) = call(&c, &{
        let mut f = fetch(pool, cont, 0, 64, limit / 64);
        f.iods[0].len += 1;
        f
    });
    assert_eq!(st.code, -libc::EINVAL, "{st:?}");
    // ... and the limit itself is served (holes as zeros), as before.
    let (st, bulk) = call(&c, &fetch(pool, cont, 1, 64, limit / 64));
    assert_eq!(st.code, 0, "{st:?}");
    assert_eq!(bulk as u64, limit);

    // Other clients are served throughout.
    let mut back = vec![0u8; value.len()];
    obj.fetch_array_into(b"d", b"a", 0, &mut back).unwrap();
    assert!(back == value, "the other client read wrong bytes");
    let after = proc_status(pid, "VmRSS");
    eprintln!(
        "engine VmRSS: {} MiB before, {} MiB after the oversized fetches and one of {} MiB",
        before >> 20,
        after >> 20,
        limit >> 20
    );
    assert!(
        after < before + (256 << 20),
        "engine VmRSS grew from {before} to {after} bytes"
    );
    let log = c.engines[0].log_text();
    assert!(!log.contains("panicked"), "{log}");
    assert!(!log.contains("memory allocation"), "{log}");
}

/// A Join as an engine sends it, of rank `rank`, in system "test".
fn join(rank: u32) -> JoinReq {
    JoinReq {
        rank,
        uuid: uuid::Uuid::new_v4().to_string(),
        control_addr: "127.0.0.1:1".into(),
        data_addr: "127.0.0.1:2".into(),
        fault_domain: format!("/forged{rank}"),
        targets: 4,
        system: "test".into(),
        state: "ready".into(),
        shm_path: String::new(),
        want_snapshots: false,
    }
}

#[test]
fn joins_with_huge_fields_zero_targets_or_no_system_are_refused() {
    let mut c = Cluster::start(ClusterSpec::default());
    c.format();
    let mut m = c.mgmt();
    let pid = engine_pid(&c);
    let before = proc_status(pid, "VmRSS");
    let refused = |c: &Cluster, m: &mut MgmtClient<_>, j: JoinReq, field: &str| {
        let e =
            c.rt.block_on(m.join(j))
                .expect_err(&format!("a Join with a bad {field} was accepted"));
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{field}: {e}");
        assert!(e.message().contains(field), "{field}: {e}");
    };
    // 3 MiB of address: more than the management state's slot (2 MiB).
    let huge = "x".repeat(3 << 20);
    refused(
        &c,
        &mut m,
        JoinReq {
            control_addr: format!("{huge}:1"),
            ..join(9)
        },
        "control_addr",
    );
    refused(
        &c,
        &mut m,
        JoinReq {
            fault_domain: huge.clone(),
            ..join(9)
        },
        "fault_domain",
    );
    // A forged rank with no targets, which a pool would divide its space by.
    refused(
        &c,
        &mut m,
        JoinReq {
            targets: 0,
            ..join(7)
        },
        "targets",
    );
    // No system name is not a way around the name check.
    refused(
        &c,
        &mut m,
        JoinReq {
            system: String::new(),
            ..join(8)
        },
        "system",
    );
    let e =
        c.rt.block_on(m.join(JoinReq {
            system: "other".into(),
            ..join(8)
        }))
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::PermissionDenied, "{e}");

    // Nothing of them was kept: the members are the engine alone, a pool
    // on the forged rank is refused (not a panic), and saves still work.
    let members =
        c.rt.block_on(m.system_query(SystemQueryReq {}))
            .unwrap()
            .into_inner()
            .members;
    assert_eq!(
        members.iter().map(|x| x.rank).collect::<Vec<_>>(),
        vec![0],
        "{members:?}"
    );
    let e =
        c.rt.block_on(m.pool_create(PoolCreateReq {
            label: "forged".into(),
            total_size: 64 << 20,
            ranks: vec![7],
            ..Default::default()
        }))
        .unwrap_err();
    assert!(e.message().contains("rank 7"), "{e}");
    c.create_pool(64, "S1", "crc32c");
    let obj = c
        .container()
        .object(ObjectId::new(ObjectClass::S1, 0, 2))
        .unwrap();
    obj.update_single(b"d", b"a", b"served").unwrap();
    assert_eq!(
        obj.fetch_single(b"d", b"a").unwrap().as_deref(),
        Some(&b"served"[..])
    );
    assert!(rank0_alive(&mut c), "engine died; logs:\n{}", c.logs());
    let after = proc_status(pid, "VmRSS");
    eprintln!(
        "engine VmRSS: {} MiB before, {} MiB after the refused joins",
        before >> 20,
        after >> 20
    );
    assert!(after < before + (256 << 20), "{before} -> {after}");
    let log = c.engines[0].log_text();
    assert!(!log.contains("panicked"), "{log}");
}
