//! Containers cloned from a snapshot hold what the source held at the
//! snapshot, not what it holds now, for every kind of object class.

mod common;
use common::*;
use peregrine_proto::mgmt::*;
use peregrine_proto::{ObjectClass, ObjectId};

fn snapshot(c: &Cluster, name: &str) -> u64 {
    let mut m = c.mgmt();
    c.rt.block_on(m.snap_create(SnapCreateReq {
        pool: "pool".into(),
        cont: "cont".into(),
        name: name.into(),
    }))
    .unwrap()
    .into_inner()
    .epoch
}

#[allow(clippy::result_large_err)]
fn clone(c: &Cluster, label: &str, epoch: u64) -> Result<ContInfo, tonic::Status> {
    let mut m = c.mgmt();
    c.rt.block_on(m.cont_create(ContCreateReq {
        pool: "pool".into(),
        label: label.into(),
        clone_from: "cont".into(),
        clone_epoch: epoch,
        ..Default::default()
    }))
    .map(|r| r.into_inner())
}

#[test]
fn clone_holds_the_snapshot_of_striped_replicated_and_ec_objects() {
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 2,
            device_mib: 512,
            scm_mib: 64,
        },
        768,
        "EC_2P1G1",
        "crc32c",
    );
    let cont = c.container();
    let classes = [ObjectClass::SX, ObjectClass::Rp2G1, ObjectClass::Ec2P1G1];
    let objs: Vec<_> = classes
        .iter()
        .enumerate()
        .map(|(i, &k)| cont.object(ObjectId::new(k, 9, i as u64)).unwrap())
        .collect();
    let big = pattern(1, 3 << 20);
    for (i, o) in objs.iter().enumerate() {
        for d in 0..4u64 {
            let dkey = format!("d{d}");
            o.update_array(dkey.as_bytes(), b"data", 0, &big).unwrap();
            o.update_single(dkey.as_bytes(), b"meta", format!("v1-{i}-{d}").as_bytes())
                .unwrap();
        }
        // A sparse array: a hole, then bytes at 5 MiB.
        o.update_array(b"sparse", b"data", 5 << 20, b"tail")
            .unwrap();
    }
    // A whole object punched before the snapshot: what the copy lists of it
    // is a punch that names no dkey.
    let gone = cont.object(ObjectId::new(ObjectClass::SX, 9, 99)).unwrap();
    gone.update_single(b"d", b"meta", b"soon gone").unwrap();
    gone.punch().unwrap();
    let epoch = snapshot(&c, "s1");
    // After the snapshot: overwrites, a new dkey, a punched dkey.
    for o in &objs {
        o.update_array(b"d0", b"data", 0, &pattern(2, 1 << 20))
            .unwrap();
        o.update_single(b"d1", b"meta", b"v2").unwrap();
        o.update_single(b"new", b"meta", b"after").unwrap();
        o.punch_dkey(b"d2").unwrap();
    }

    let info = clone(&c, "copy", epoch).unwrap();
    assert_eq!(info.state, ContState::ContReady as i32);
    assert_eq!(info.oclass, "EC_2P1G1", "the source's properties");
    let copy = c
        .client()
        .pool_connect("pool")
        .unwrap()
        .cont_open("copy")
        .unwrap();
    assert_eq!(
        copy.object(gone.id())
            .unwrap()
            .fetch_single(b"d", b"meta")
            .unwrap(),
        None
    );
    for (i, o) in objs.iter().enumerate() {
        let k = copy.object(o.id()).unwrap();
        for d in 0..4u64 {
            let dkey = format!("d{d}");
            let got = k
                .fetch_array(dkey.as_bytes(), b"data", 0, big.len())
                .unwrap();
            assert!(got == big, "{:?} {dkey}: array differs", classes[i]);
            assert_eq!(
                k.fetch_single(dkey.as_bytes(), b"meta").unwrap().as_deref(),
                Some(format!("v1-{i}-{d}").as_bytes()),
                "{:?} {dkey}",
                classes[i]
            );
        }
        assert_eq!(k.fetch_single(b"new", b"meta").unwrap(), None);
        assert_eq!(k.array_size(b"sparse", b"data").unwrap(), (5 << 20) + 4);
        let tail = k.fetch_array(b"sparse", b"data", (5 << 20) - 4, 8).unwrap();
        assert_eq!(&tail, b"\0\0\0\0tail");
        // The source still reads as now.
        assert_eq!(
            o.fetch_single(b"d1", b"meta").unwrap().as_deref(),
            Some(&b"v2"[..])
        );
        // The clone is a container of its own: writes to it leave the source alone.
        k.update_single(b"d3", b"meta", b"clone's own").unwrap();
        assert_eq!(
            o.fetch_single(b"d3", b"meta").unwrap().as_deref(),
            Some(format!("v1-{i}-3").as_bytes())
        );
    }
    let used =
        c.rt.block_on(c.mgmt().cont_query(ContQueryReq {
            pool: "pool".into(),
            id: "copy".into(),
            ..Default::default()
        }))
        .unwrap()
        .into_inner()
        .used_bytes;
    // Holes stayed holes: 4 x 3 MiB per object stored once (SX), twice
    // (RP_2G1) and 1.5 times (EC_2P1G1) is 54 MiB; the three 5 MiB holes
    // written as zeros would add 22.5 MiB more.
    assert!(used < 64 << 20, "clone uses {used} bytes");

    // A caller that stops waiting does not stop the copy: the clone shows
    // as copying, then ready, with the same content.
    let mut m = c.mgmt();
    let mut req = tonic::Request::new(ContCreateReq {
        pool: "pool".into(),
        label: "impatient".into(),
        clone_from: "cont".into(),
        clone_epoch: epoch,
        ..Default::default()
    });
    req.set_timeout(std::time::Duration::from_millis(50));
    let e = c.rt.block_on(m.cont_create(req)).unwrap_err();
    assert!(
        matches!(
            e.code(),
            tonic::Code::Cancelled | tonic::Code::DeadlineExceeded
        ),
        "{e}"
    );
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut seen_copying = false;
    loop {
        let info =
            c.rt.block_on(m.cont_query(ContQueryReq {
                pool: "pool".into(),
                id: "impatient".into(),
                ..Default::default()
            }))
            .unwrap_or_else(|e| panic!("{e}\n{}", c.logs()))
            .into_inner();
        if info.state == ContState::ContReady as i32 {
            break;
        }
        assert_eq!(info.state, ContState::ContCopying as i32);
        seen_copying = true;
        assert!(std::time::Instant::now() < deadline, "clone still copying");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    assert!(
        seen_copying,
        "the clone was ready before a 50 ms call ended"
    );
    let k = c
        .client()
        .pool_connect("pool")
        .unwrap()
        .cont_open("impatient")
        .unwrap()
        .object(objs[2].id())
        .unwrap();
    assert!(k.fetch_array(b"d3", b"data", 0, big.len()).unwrap() == big);

    // Errors name what is wrong.
    let e = clone(&c, "copy2", epoch + 1).unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e}");
    assert!(e.message().contains("snapshot"), "{}", e.message());
    let e = clone(&c, "copy", epoch).unwrap_err();
    assert_eq!(e.code(), tonic::Code::AlreadyExists, "{e}");
}

/// Arrays smaller than an EC cell (a small file's only chunk): they touch
/// one data shard and the parity, and the clone must find and copy each.
#[test]
fn clone_copies_small_ec_arrays() {
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 2,
            device_mib: 256,
            scm_mib: 64,
        },
        384,
        "EC_2P1G1",
        "crc32c",
    );
    let cont = c.container();
    let n = 40u64;
    for i in 0..n {
        let o = cont
            .object(ObjectId::new(ObjectClass::Ec2P1G1, 7, i))
            .unwrap();
        o.update_array(b"0", b"data", 0, format!("small {i}\n").as_bytes())
            .unwrap();
    }
    let epoch = snapshot(&c, "s1");
    clone(&c, "copy", epoch).unwrap();
    let copy = c
        .client()
        .pool_connect("pool")
        .unwrap()
        .cont_open("copy")
        .unwrap();
    let mut lost = vec![];
    for i in 0..n {
        let k = copy
            .object(ObjectId::new(ObjectClass::Ec2P1G1, 7, i))
            .unwrap();
        let want = format!("small {i}\n");
        let size = k.array_size(b"0", b"data").unwrap();
        let dkeys = k.list_dkeys().unwrap();
        if size != want.len() as u64 || dkeys.is_empty() {
            lost.push((i, size, dkeys.len()));
        }
    }
    assert!(lost.is_empty(), "lost (object, size, dkeys): {lost:?}");
}
