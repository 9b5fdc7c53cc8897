//! Access control on every I/O (docs/access-control.md), through real
//! engines with the control plane's mutual TLS: the ACLs decide who gets
//! which handle at pool connect and container open, the engines refuse
//! every request whose handle does not allow it (missing, forged, of
//! another container, read-only, evicted), on both transports, and what
//! they know of the keys survives a kill -9.

mod common;
use common::*;
use peregrine::{Client, ObjectClass, ObjectId, TransportKind};
use peregrine_proto::data;
use peregrine_proto::frame::Opcode;
use peregrine_proto::mgmt::*;
use prost::Message;

/// A user as the client library sends it.
fn user(name: &str, uid: u32, groups: &[&str]) -> Credential {
    Credential {
        uid,
        gid: uid,
        user: name.into(),
        groups: groups.iter().map(|g| g.to_string()).collect(),
    }
}

/// A client with the `client` certificate acting for `cred` (`None`: for
/// no one), over `kind`.
fn client_as(c: &Cluster, cred: Option<Credential>, kind: TransportKind) -> Client {
    let cl = Client::connect_with_transport(&c.mgmt_addr(), &c.client_security(), kind)
        .unwrap_or_else(|e| panic!("connect: {e}"));
    cl.mgmt().set_credential(cred);
    cl
}

/// A cluster of one engine with pool "pool" (anyone may connect) and
/// containers "shared" (ann owns it; bob reads; group "writers" writes)
/// and "private" (ann's alone). A TLS cluster: checks are on by default.
fn cluster() -> Cluster {
    let c = Cluster::start(ClusterSpec::default());
    c.format();
    let mut m = c.mgmt();
    c.rt.block_on(m.pool_create(PoolCreateReq {
        label: "pool".into(),
        total_size: 64 << 20,
        props: props(&[("acl", "A::OWNER@:rwa,A::EVERYONE@:r")]),
        ..Default::default()
    }))
    .unwrap();
    for (label, acl) in [
        ("shared", "A::OWNER@:rwa,A::bob@:r,A:G:writers@:rw"),
        ("private", "A::OWNER@:rwa"),
    ] {
        c.rt.block_on(m.cont_create(ContCreateReq {
            pool: "pool".into(),
            label: label.into(),
            oclass: "S1".into(),
            props: props(&[("acl", acl), ("owner", "ann@")]),
            cred: Some(user("root", 0, &["root"])),
            ..Default::default()
        }))
        .unwrap();
    }
    c
}

fn oid() -> ObjectId {
    ObjectId::new(ObjectClass::S1, 0, 42)
}

fn errno(r: peregrine::Result<impl std::fmt::Debug>) -> (i32, String) {
    let e = r.expect_err("refused");
    (e.code, e.to_string())
}

#[test]
fn acls_decide_the_handles_and_engines_enforce_them_on_both_transports() {
    let c = cluster();
    let ann = user("ann", 1000, &["staff"]);
    let bob = user("bob", 1001, &["staff"]);
    let cy = user("cy", 1002, &["writers"]);
    let eve = user("eve", 1003, &["other"]);
    for kind in [TransportKind::Tcp, TransportKind::Shm] {
        let v = format!("{kind:?}").into_bytes();
        // The owner writes; bob reads it; cy (group writers) writes too.
        let owner = client_as(&c, Some(ann.clone()), kind);
        let shared = owner
            .pool_connect("pool")
            .unwrap()
            .cont_open("shared")
            .unwrap();
        shared
            .object(oid())
            .unwrap()
            .update_single(b"d", b"a", &v)
            .unwrap();
        let reader = client_as(&c, Some(bob.clone()), kind);
        let r = reader
            .pool_connect("pool")
            .unwrap()
            .cont_open("shared")
            .unwrap();
        let o = r.object(oid()).unwrap();
        assert_eq!(o.fetch_single(b"d", b"a").unwrap().unwrap(), v);
        // bob's handle is read-only: the engine refuses his write.
        let (code, msg) = errno(o.update_single(b"d", b"a", b"bob was here"));
        assert_eq!(code, -libc::EACCES, "{kind:?}: {msg}");
        assert!(msg.contains("read-only"), "{msg}");
        let writer = client_as(&c, Some(cy.clone()), kind);
        let w = writer
            .pool_connect("pool")
            .unwrap()
            .cont_open("shared")
            .unwrap();
        w.object(oid())
            .unwrap()
            .update_single(b"d", b"b", b"cy")
            .unwrap();
        // Asked read-only, cy gets a read-only handle.
        let ro = writer
            .pool_connect("pool")
            .unwrap()
            .cont_open_read_only("shared")
            .unwrap();
        assert_eq!(
            errno(ro.object(oid()).unwrap().update_single(b"d", b"b", b"x")).0,
            -libc::EACCES
        );
        // eve may connect (EVERYONE@:r on the pool) but not open either container.
        let stranger = client_as(&c, Some(eve.clone()), kind);
        let p = stranger.pool_connect("pool").unwrap();
        for cont in ["shared", "private"] {
            let (code, msg) = errno(p.cont_open(cont));
            assert_eq!(code, -libc::EACCES, "{msg}");
            assert!(msg.contains("user eve@") && msg.contains(cont), "{msg}");
        }
        // bob may not open ann's private container.
        assert_eq!(
            errno(reader.pool_connect("pool").unwrap().cont_open("private")).0,
            -libc::EACCES
        );
    }
    // A client certificate acting for no one is refused outright.
    let nobody = client_as(&c, None, TransportKind::Tcp);
    let (code, msg) = errno(nobody.pool_connect("pool"));
    assert_eq!(code, -libc::EACCES, "{msg}");
    assert!(msg.contains("credential"), "{msg}");
    // A malformed ACL is refused naming the entry.
    let mut m = c.mgmt();
    let e =
        c.rt.block_on(m.cont_set_prop(ContSetPropReq {
            pool: "pool".into(),
            id: "shared".into(),
            props: props(&[("acl", "A::OWNER@:rwa,A::bob@:rx")]),
        }))
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("entry 2"), "{}", e.message());
}

/// Where the shard of dkey "d" of `oid()` is, for raw requests: its address
/// as the library builds it (with `handle`), and the engine's endpoint.
fn shard(cont: &peregrine::Container, handle: Vec<u8>) -> (data::Address, String) {
    let map = cont.pool().map();
    let g = peregrine::placement::place(&map, oid(), ObjectClass::S1, b"d").unwrap();
    let t = &map.targets[g.shards[0].target];
    let a = data::Address {
        pool: map.uuid.as_bytes().to_vec(),
        cont: cont.uuid().as_bytes().to_vec(),
        oid: Some(data::ObjectId {
            hi: oid().hi,
            lo: oid().lo,
        }),
        shard: g.shards[0].shard,
        target: t.index,
        map_version: map.version,
        handle,
    };
    (a, t.addr.clone())
}

/// Send `op` with `msg` raw through `client`'s transport to `endpoint`.
fn raw(
    client: &Client,
    endpoint: &str,
    target: u32,
    op: Opcode,
    msg: Vec<u8>,
    bulk: &[&[u8]],
) -> data::Status {
    let reply = client
        .transport()
        .call(endpoint, target, op, &msg, bulk)
        .unwrap_or_else(|e| panic!("{op:?}: {e}"));
    data::Response::decode(reply.msg.as_slice())
        .unwrap()
        .status
        .unwrap_or_default()
}

fn fetch(addr: data::Address) -> Vec<u8> {
    data::FetchReq {
        addr: Some(addr),
        epoch: u64::MAX,
        dkey: b"d".to_vec(),
        iods: vec![data::Iod {
            akey: b"a".to_vec(),
            ..Default::default()
        }],
    }
    .encode_to_vec()
}

fn update(addr: data::Address, v: &[u8]) -> Vec<u8> {
    data::UpdateReq {
        addr: Some(addr),
        dkey: b"d".to_vec(),
        iods: vec![data::Iod {
            akey: b"a".to_vec(),
            len: v.len() as u64,
            ..Default::default()
        }],
        ..Default::default()
    }
    .encode_to_vec()
}

#[test]
fn forged_missing_foreign_and_evicted_handles_are_refused_and_keys_survive_a_kill() {
    let mut c = cluster();
    let ann = client_as(&c, Some(user("ann", 1000, &[])), TransportKind::Tcp);
    let shared = ann
        .pool_connect("pool")
        .unwrap()
        .cont_open("shared")
        .unwrap();
    let private = ann
        .pool_connect("pool")
        .unwrap()
        .cont_open("private")
        .unwrap();
    let o = shared.object(oid()).unwrap();
    o.update_single(b"d", b"a", b"v1").unwrap();
    // The shard's address, as the library builds it, with a chosen handle.
    let map = shared.pool().map();
    let (_, endpoint) = shard(&shared, vec![]);
    let at = |handle: Vec<u8>| shard(&shared, handle).0;
    let target = at(vec![]).target;
    let good = shared.handle().to_vec();
    assert_eq!(
        raw(
            &ann,
            &endpoint,
            target,
            Opcode::Fetch,
            fetch(at(good.clone())),
            &[]
        )
        .code,
        0
    );
    let refused = |handle: Vec<u8>, says: &str| {
        let s = raw(
            &ann,
            &endpoint,
            target,
            Opcode::Fetch,
            fetch(at(handle)),
            &[],
        );
        assert_eq!(s.code, -libc::EACCES, "{says}: {}", s.message);
        assert!(s.message.contains(says), "{says}: {}", s.message);
    };
    refused(vec![], "no handle");
    refused(good[..20].to_vec(), "malformed");
    let mut forged = good.clone();
    forged[16] |= 4; // raised to pool-wide
    refused(forged, "not valid");
    let mut forged = good.clone();
    *forged.last_mut().unwrap() ^= 1;
    refused(forged, "not valid");
    // Another container's handle, and the pool handle, on this container.
    refused(private.handle().to_vec(), "not valid");
    refused(map.handle.clone(), "not valid");
    // A user's pool handle does not list what reintegration lists.
    let list = data::ListChangedReq {
        addr: Some(data::Address {
            pool: map.uuid.as_bytes().to_vec(),
            target,
            map_version: map.version,
            handle: map.handle.clone(),
            ..Default::default()
        }),
        max: 10,
        ..Default::default()
    };
    let s = raw(
        &ann,
        &endpoint,
        target,
        Opcode::ListChanged,
        list.encode_to_vec(),
        &[],
    );
    assert_eq!(s.code, -libc::EACCES, "{}", s.message);
    assert!(s.message.contains("pool-wide"), "{}", s.message);
    // A write with a read handle never reaches the target.
    let bob = client_as(&c, Some(user("bob", 1001, &[])), TransportKind::Tcp);
    let bobs = bob
        .pool_connect("pool")
        .unwrap()
        .cont_open("shared")
        .unwrap();
    let s = raw(
        &bob,
        &endpoint,
        target,
        Opcode::Update,
        update(at(bobs.handle().to_vec()), b"v2"),
        &[b"v2"],
    );
    assert_eq!(s.code, -libc::EACCES, "{}", s.message);
    assert_eq!(o.fetch_single(b"d", b"a").unwrap().unwrap(), b"v1");

    // Evict bob's handle alone: his reads end, ann's go on.
    let mut m = c.mgmt();
    let bob_id = bobs.handle()[..16].to_vec();
    c.rt.block_on(m.pool_evict(PoolEvictReq {
        id: "pool".into(),
        handle: bob_id,
    }))
    .unwrap();
    let (code, msg) = errno(bobs.object(oid()).unwrap().fetch_single(b"d", b"a"));
    assert_eq!(code, -libc::EACCES, "{msg}");
    assert!(msg.contains("evicted"), "{msg}");
    assert_eq!(o.fetch_single(b"d", b"a").unwrap().unwrap(), b"v1");
    // Opened again, bob reads.
    let again = bob
        .pool_connect("pool")
        .unwrap()
        .cont_open("shared")
        .unwrap();
    assert_eq!(
        again
            .object(oid())
            .unwrap()
            .fetch_single(b"d", b"a")
            .unwrap()
            .unwrap(),
        b"v1"
    );

    // A kill -9: the engine learns the keys and revocations again before it
    // serves; handles issued before still work, the evicted one does not.
    c.engines[0].kill9();
    c.engines[0].start();
    c.wait_serving(0);
    assert_eq!(o.fetch_single(b"d", b"a").unwrap().unwrap(), b"v1");
    assert_eq!(
        errno(bobs.object(oid()).unwrap().fetch_single(b"d", b"a")).0,
        -libc::EACCES
    );
    o.update_single(b"d", b"a", b"v3").unwrap();

    // Evict everyone: a new key; every handle so far ends, new opens work.
    let mut m = c.mgmt();
    c.rt.block_on(m.pool_evict(PoolEvictReq {
        id: "pool".into(),
        handle: vec![],
    }))
    .unwrap();
    for h in [good, again.handle().to_vec(), map.handle.clone()] {
        let s = raw(&ann, &endpoint, target, Opcode::Fetch, fetch(at(h)), &[]);
        assert_eq!(s.code, -libc::EACCES, "{}", s.message);
    }
    let fresh = ann
        .pool_connect("pool")
        .unwrap()
        .cont_open("shared")
        .unwrap();
    assert_eq!(
        fresh
            .object(oid())
            .unwrap()
            .fetch_single(b"d", b"a")
            .unwrap()
            .unwrap(),
        b"v3"
    );
}

#[test]
fn an_insecure_system_checks_handles_when_asked_and_believes_credentials() {
    let c = Cluster::start_configured(
        ClusterSpec::default(),
        "allow_insecure: true\naccess_checks: true\n",
    );
    c.format();
    c.create_pool(64, "S1", "off");
    let mut m = c.mgmt();
    c.rt.block_on(m.pool_set_prop(PoolSetPropReq {
        id: "pool".into(),
        props: props(&[("acl", "A::OWNER@:rwa,A::EVERYONE@:r")]),
    }))
    .unwrap();
    c.rt.block_on(m.cont_set_prop(ContSetPropReq {
        pool: "pool".into(),
        id: "cont".into(),
        props: props(&[("acl", "A::OWNER@:rwa"), ("owner", "ann@")]),
    }))
    .unwrap();
    let ann = client_as(&c, Some(user("ann", 1000, &[])), TransportKind::Tcp);
    let cont = ann.pool_connect("pool").unwrap().cont_open("cont").unwrap();
    cont.object(oid())
        .unwrap()
        .update_single(b"d", b"a", b"x")
        .unwrap();
    let eve = client_as(&c, Some(user("eve", 1003, &[])), TransportKind::Tcp);
    let (code, msg) = errno(eve.pool_connect("pool").unwrap().cont_open("cont"));
    assert_eq!(code, -libc::EACCES, "{msg}");
    // A raw request without a handle is refused here too.
    let (a, endpoint) = shard(&cont, vec![]);
    let target = a.target;
    assert_eq!(
        raw(&eve, &endpoint, target, Opcode::Fetch, fetch(a), &[]).code,
        -libc::EACCES
    );
}
