//! Discards through a real engine: one DISCARD request punches every
//! object it names on its target, and nothing else; one that names too many
//! objects, or mixes them with a dkey, is refused with an error naming what
//! is wrong, and punches nothing. Through the client library, the discards
//! of many objects of every shape come out punched.

mod common;
use common::*;
use peregrine::{Discarding, Object, ObjectClass, ObjectId};
use peregrine_proto::data;
use peregrine_proto::frame::{self, Opcode};
use peregrine_proto::MAX_DISCARD_MORE;
use prost::Message;
use std::net::TcpStream;
use std::time::Duration;

/// Send `req` as `op` over a connection of its own; the reply's status.
fn call(c: &Cluster, op: Opcode, req: &data::PunchReq) -> data::Status {
    let addr = format!("127.0.0.1:{}", c.engines[0].data_port);
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    frame::write_frame(&mut s, op, 0, 5, &req.encode_to_vec(), &[]).unwrap();
    let f = frame::read_frame(&mut s)
        .unwrap_or_else(|e| panic!("no reply to a discard ({e}); logs:\n{}", c.logs()));
    data::Response::decode(f.msg.as_slice())
        .unwrap()
        .status
        .unwrap_or_default()
}

fn oid(i: u64) -> ObjectId {
    ObjectId::new(ObjectClass::S1, 0, 100 + i)
}

/// A whole-object punch of `first` and `more` (all shard 0, on target 0).
fn discard(c: &Cluster, first: u64, more: impl Iterator<Item = u64>) -> data::PunchReq {
    let (pool, cont) = pool_cont(c);
    let wire = |o: ObjectId| data::ObjectId { hi: o.hi, lo: o.lo };
    data::PunchReq {
        addr: Some(data::Address {
            pool: pool.as_bytes().to_vec(),
            cont: cont.as_bytes().to_vec(),
            oid: Some(wire(oid(first))),
            shard: 0,
            target: 0,
            map_version: u64::MAX,
            handle: admin_handle(c),
        }),
        epoch: peregrine::hlc::now(),
        more: more
            .map(|i| data::ShardId {
                oid: Some(wire(oid(i))),
                shard: 0,
            })
            .collect(),
        ..Default::default()
    }
}

fn value(o: &Object) -> Option<Vec<u8>> {
    o.fetch_single(b"d", b"a").unwrap()
}

#[test]
fn one_discard_punches_the_objects_it_names_and_refuses_what_is_malformed() {
    // One target: every S1 object's shard 0 is on target 0.
    let spec = ClusterSpec {
        targets: 1,
        ..Default::default()
    };
    let c = Cluster::with_pool(spec, 64, "S1", "crc32c");
    let cont = c.container();
    let n = MAX_DISCARD_MORE as u64 + 10;
    let objs: Vec<Object> = (0..n).map(|i| cont.object(oid(i)).unwrap()).collect();
    for (i, o) in objs.iter().enumerate() {
        o.update_single(b"d", b"a", format!("v{i}").as_bytes())
            .unwrap();
    }

    // Too many objects: refused, naming the limit; nothing punched.
    let over = discard(&c, 0, 1..=MAX_DISCARD_MORE as u64 + 1);
    let st = call(&c, Opcode::Discard, &over);
    assert_eq!(st.code, -libc::EINVAL, "{st:?}");
    assert!(st.message.contains("at most 255"), "{st:?}");
    // More objects with a dkey: refused; nothing punched.
    let mut keyed = discard(&c, 0, 1..3);
    keyed.dkey = b"d".to_vec();
    let st = call(&c, Opcode::Discard, &keyed);
    assert_eq!(st.code, -libc::EINVAL, "{st:?}");
    assert!(st.message.contains("whole-object punch"), "{st:?}");
    for (i, o) in objs.iter().enumerate() {
        assert_eq!(value(o), Some(format!("v{i}").into_bytes()), "object {i}");
    }

    // Objects 0..=200 in one request: exactly those are gone.
    let st = call(&c, Opcode::Discard, &discard(&c, 0, 1..=200));
    assert_eq!(st.code, 0, "{st:?}");
    for (i, o) in objs.iter().enumerate() {
        match i <= 200 {
            true => assert_eq!(value(o), None, "object {i}"),
            false => assert_eq!(value(o), Some(format!("v{i}").into_bytes()), "object {i}"),
        }
    }
    // The engine serves on, and the punches are durable: after a restart
    // they still hold.
    let mut c = c;
    c.engines[0].kill9();
    c.restart(0);
    let cont = c.container();
    for i in [0u64, 1, 200, 201, n - 1] {
        let o = cont.object(oid(i)).unwrap();
        assert_eq!(value(&o).is_none(), i <= 200, "object {i} after a restart");
    }
}

#[test]
fn the_library_discards_many_objects_of_every_layout_in_one_go() {
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 2,
            ..Default::default()
        },
        128,
        "SX",
        "crc32c",
    );
    let cont = c.container();
    let classes = [ObjectClass::S1, ObjectClass::SX, ObjectClass::Rp2G1];
    let objs: Vec<Object> = (0..150u64)
        .map(|i| {
            let o = cont
                .object(ObjectId::new(classes[i as usize % 3], 0, 1000 + i))
                .unwrap();
            for d in 0..4u8 {
                o.update_single(&[b'd', d], b"a", &[d; 100]).unwrap();
            }
            o
        })
        .collect();
    let keep = cont.object(ObjectId::new(ObjectClass::SX, 0, 7)).unwrap();
    keep.update_single(b"d", b"a", b"kept").unwrap();

    Discarding::start(objs.clone()).finish().unwrap();
    for (i, o) in objs.iter().enumerate() {
        assert!(o.list_dkeys().unwrap().is_empty(), "object {i}");
    }
    assert_eq!(keep.fetch_single(b"d", b"a").unwrap().unwrap(), b"kept");
}
