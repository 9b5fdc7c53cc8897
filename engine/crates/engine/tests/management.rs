//! Management API against real engines: pools, containers, snapshots,
//! labels and UUIDs, and the errors that name what is wrong.

mod common;
use common::*;
use peregrine_proto::mgmt::*;
use tonic::Code;

#[test]
fn pool_and_container_lifecycle() {
    let c = Cluster::start(ClusterSpec {
        engines: 2,
        ..Default::default()
    });
    let mut m = c.mgmt();

    // Before format: pool create is refused with a reason.
    let err =
        c.rt.block_on(m.pool_create(PoolCreateReq {
            label: "tank".into(),
            total_size: 64 << 20,
            ..Default::default()
        }))
        .unwrap_err();
    assert!(err.message().contains("format"), "{err}");

    c.format();
    let sys =
        c.rt.block_on(m.system_query(SystemQueryReq {}))
            .unwrap()
            .into_inner();
    assert_eq!(sys.members.len(), 2);
    assert!(
        sys.members.iter().all(|x| x.state() == MemberState::Joined),
        "{sys:?}"
    );

    let pool =
        c.rt.block_on(m.pool_create(PoolCreateReq {
            label: "tank".into(),
            total_size: 128 << 20,
            ..Default::default()
        }))
        .unwrap()
        .into_inner();
    assert_eq!(pool.ranks, vec![0, 1]);
    assert_eq!(pool.total_targets, 4);
    let nvme = pool.tiers.iter().find(|t| t.name == "nvme").unwrap();
    assert!(
        nvme.total >= 110 << 20 && nvme.free <= nvme.total,
        "{pool:?}"
    );

    // Duplicate label, bad label, too small, unknown property.
    let e =
        c.rt.block_on(m.pool_create(PoolCreateReq {
            label: "tank".into(),
            total_size: 64 << 20,
            ..Default::default()
        }))
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e}");
    let e =
        c.rt.block_on(m.pool_create(PoolCreateReq {
            label: "bad label!".into(),
            total_size: 64 << 20,
            ..Default::default()
        }))
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e}");
    let e =
        c.rt.block_on(m.pool_create(PoolCreateReq {
            label: "huge".into(),
            total_size: 64 << 30,
            ..Default::default()
        }))
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    assert!(
        e.message().contains("nvme") || e.message().contains("scm"),
        "{e}"
    );
    let mut props = std::collections::HashMap::new();
    props.insert("colour".to_string(), "blue".to_string());
    let e =
        c.rt.block_on(m.pool_create(PoolCreateReq {
            label: "p2".into(),
            total_size: 64 << 20,
            props,
            ..Default::default()
        }))
        .unwrap_err();
    assert!(e.message().contains("colour"), "{e}");

    // Query by label and by UUID give the same pool.
    let by_uuid =
        c.rt.block_on(m.pool_query(PoolQueryReq {
            id: pool.uuid.clone(),
        }))
        .unwrap()
        .into_inner();
    assert_eq!(by_uuid.label, "tank");

    // Containers: defaults, bad classes, duplicate labels.
    let cont =
        c.rt.block_on(m.cont_create(ContCreateReq {
            pool: pool.uuid.clone(),
            label: "data".into(),
            ..Default::default()
        }))
        .unwrap()
        .into_inner();
    assert_eq!(
        (
            cont.oclass.as_str(),
            cont.chunk_size,
            cont.checksum(),
            cont.r#type()
        ),
        ("SX", 1 << 20, Checksum::Crc32c, ContType::Posix)
    );
    let e =
        c.rt.block_on(m.cont_create(ContCreateReq {
            pool: "tank".into(),
            label: "x".into(),
            oclass: "RP_9G9".into(),
            ..Default::default()
        }))
        .unwrap_err();
    assert!(
        e.message().contains("unknown object class") && e.message().contains("RP_9G9"),
        "{e}"
    );
    let e =
        c.rt.block_on(m.cont_create(ContCreateReq {
            pool: "tank".into(),
            label: "x".into(),
            oclass: "RP_3G1".into(),
            ..Default::default()
        }))
        .unwrap_err();
    assert!(e.message().contains("needs 3 engines"), "{e}");
    let e =
        c.rt.block_on(m.cont_create(ContCreateReq {
            pool: "tank".into(),
            label: "x".into(),
            oclass: "S1".into(),
            redundancy_factor: 1,
            ..Default::default()
        }))
        .unwrap_err();
    assert!(e.message().contains("redundancy factor"), "{e}");
    let e =
        c.rt.block_on(m.cont_create(ContCreateReq {
            pool: "tank".into(),
            label: "data".into(),
            ..Default::default()
        }))
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    let e =
        c.rt.block_on(m.cont_create(ContCreateReq {
            pool: "nope".into(),
            label: "y".into(),
            ..Default::default()
        }))
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(e.message().contains("nope"));

    let q =
        c.rt.block_on(m.cont_query(ContQueryReq {
            pool: "tank".into(),
            id: cont.uuid.clone(),
            ..Default::default()
        }))
        .unwrap()
        .into_inner();
    assert_eq!(q.label, "data");
    let mut props = std::collections::HashMap::new();
    props.insert("checksum".to_string(), "off".to_string());
    let q =
        c.rt.block_on(m.cont_set_prop(ContSetPropReq {
            pool: "tank".into(),
            id: "data".into(),
            props,
        }))
        .unwrap()
        .into_inner();
    assert_eq!(q.checksum(), Checksum::Off);
    let mut props = std::collections::HashMap::new();
    props.insert("chunk_size".to_string(), "4096".to_string());
    assert!(c
        .rt
        .block_on(m.cont_set_prop(ContSetPropReq {
            pool: "tank".into(),
            id: "data".into(),
            props
        }))
        .is_err());

    // Snapshots.
    let s1 =
        c.rt.block_on(m.snap_create(SnapCreateReq {
            pool: "tank".into(),
            cont: "data".into(),
            name: "first".into(),
        }))
        .unwrap()
        .into_inner();
    let list =
        c.rt.block_on(m.snap_list(SnapListReq {
            pool: "tank".into(),
            cont: "data".into(),
        }))
        .unwrap()
        .into_inner();
    assert_eq!(list.snapshots.len(), 1);
    assert_eq!(list.snapshots[0].epoch, s1.epoch);
    c.rt.block_on(m.snap_destroy(SnapDestroyReq {
        pool: "tank".into(),
        cont: "data".into(),
        name: "first".into(),
        epoch: 0,
    }))
    .unwrap();
    assert!(c
        .rt
        .block_on(m.snap_destroy(SnapDestroyReq {
            pool: "tank".into(),
            cont: "data".into(),
            name: "first".into(),
            epoch: 0
        }))
        .is_err());

    // Destroy is refused while containers exist, unless forced.
    let e =
        c.rt.block_on(m.pool_destroy(PoolDestroyReq {
            id: "tank".into(),
            force: false,
        }))
        .unwrap_err();
    assert!(e.message().contains("data"), "names the container: {e}");
    c.rt.block_on(m.cont_destroy(ContDestroyReq {
        pool: "tank".into(),
        id: "data".into(),
        force: false,
    }))
    .unwrap();
    c.rt.block_on(m.pool_destroy(PoolDestroyReq {
        id: "tank".into(),
        force: false,
    }))
    .unwrap();
    let pools =
        c.rt.block_on(m.pool_list(PoolListReq {}))
            .unwrap()
            .into_inner();
    assert!(pools.pools.is_empty());
}

#[test]
fn management_state_survives_restart() {
    let mut c = Cluster::with_pool(ClusterSpec::default(), 64, "S1", "crc32c");
    c.engines[0].kill9();
    c.restart(0);
    let mut m = c.mgmt();
    let conts =
        c.rt.block_on(m.cont_list(ContListReq {
            pool: "pool".into(),
        }))
        .unwrap()
        .into_inner();
    assert_eq!(conts.containers.len(), 1);
    assert_eq!(conts.containers[0].label, "cont");
}

#[test]
fn unformatted_engine_refuses_io_and_foreign_device_needs_force() {
    let c = Cluster::start(ClusterSpec::default());
    let mut m = c.mgmt();
    let scan =
        c.rt.block_on(m.storage_scan(StorageScanReq {}))
            .unwrap()
            .into_inner();
    assert_eq!(scan.ranks.len(), 1);
    assert!(!scan.ranks[0].formatted);
    assert_eq!(scan.ranks[0].state(), StorageState::Maintenance);

    // The data plane refuses I/O until the device is formatted, saying why.
    {
        use peregrine_proto::data;
        use peregrine_proto::frame::{self, Opcode};
        use prost::Message;
        let mut s = std::net::TcpStream::connect(("127.0.0.1", c.engines[0].data_port)).unwrap();
        let fetch = data::FetchReq {
            addr: Some(data::Address {
                pool: vec![1; 16],
                cont: vec![2; 16],
                oid: Some(data::ObjectId { hi: 1, lo: 1 }),
                shard: 0,
                target: 0,
                map_version: 0,
                ..Default::default()
            }),
            epoch: u64::MAX,
            dkey: b"d".to_vec(),
            iods: vec![data::Iod {
                akey: b"a".to_vec(),
                ..Default::default()
            }],
        };
        frame::write_frame(&mut s, Opcode::Fetch, 0, 3, &fetch.encode_to_vec(), &[]).unwrap();
        let f = frame::read_frame(&mut s).unwrap();
        let st = data::Response::decode(f.msg.as_slice())
            .unwrap()
            .status
            .unwrap();
        assert_eq!(st.code, -libc::EAGAIN, "{st:?}");
        assert!(st.message.contains("maintenance"), "{st:?}");
    }

    // Put an ext4-like signature on the device: format must refuse without force.
    let mut e = c;
    e.engines[0].kill9();
    let dev = e.engines[0].device.clone();
    let mut data = vec![0u8; 64 << 20];
    data[1080] = 0x53;
    data[1081] = 0xEF;
    std::fs::write(&dev, &data).unwrap();
    e.restart_maintenance(0);
    let mut m = e.mgmt();
    let err =
        e.rt.block_on(m.storage_format(StorageFormatReq { force: false }))
            .unwrap_err();
    assert!(
        err.message().contains("ext4") || err.message().contains("signature"),
        "{err}"
    );
    e.rt.block_on(m.storage_format(StorageFormatReq { force: true }))
        .unwrap();
}

trait RestartMaintenance {
    fn restart_maintenance(&mut self, rank: usize);
}
impl RestartMaintenance for Cluster {
    fn restart_maintenance(&mut self, rank: usize) {
        self.engines[rank].start();
        self.wait_members(self.engines.len(), &[MemberState::Maintenance]);
    }
}
