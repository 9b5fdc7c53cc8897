//! Container quotas: engines refuse updates past the property `quota` with
//! EDQUOT, count data (not replicas) against it, lift the refusal when the
//! quota rises or data is removed, and the size shows in statfs.

mod common;
use common::*;
use peregrine_proto::mgmt::*;
use peregrine_proto::{ObjectClass, ObjectId};
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// `engines` engines of `targets` targets on 256 MiB devices, a pool of
/// 256 MiB per target and a container of files of class `oclass`.
fn quota_cluster(engines: u32, targets: u32, oclass: &str) -> Cluster {
    let spec = ClusterSpec {
        engines,
        targets,
        device_mib: 256,
        scm_mib: 64,
    };
    Cluster::with_pool(spec, 256, oclass, "crc32c")
}

fn set_quota(c: &Cluster, v: &str) -> ContInfo {
    let mut m = c.mgmt();
    c.rt.block_on(m.cont_set_prop(ContSetPropReq {
        pool: "pool".into(),
        id: "cont".into(),
        props: HashMap::from([("quota".to_string(), v.to_string())]),
    }))
    .unwrap_or_else(|e| panic!("set quota={v}: {e}"))
    .into_inner()
}

fn query(c: &Cluster) -> ContInfo {
    let mut m = c.mgmt();
    c.rt.block_on(m.cont_query(ContQueryReq {
        pool: "pool".into(),
        id: "cont".into(),
        ..Default::default()
    }))
    .unwrap()
    .into_inner()
}

/// Write 1 MiB dkeys from `from` on until the first failure; the count written.
fn fill(obj: &peregrine::Object, from: u64, max: u64) -> (u64, peregrine::Error) {
    let val = pattern(0, 1 << 20);
    let mut n = 0;
    loop {
        match obj.update_array(format!("d{}", from + n).as_bytes(), b"a", 0, &val) {
            Ok(()) => n += 1,
            Err(e) => return (n, e),
        }
        assert!(n <= max, "{n} MiB written, past any quota of this test");
    }
}

#[test]
fn replicated_container_stops_at_its_quota_in_data_bytes() {
    // Two engines, RP_2G1: every MiB of data is stored twice.
    let c = quota_cluster(2, 2, "RP_2G1");
    let info = set_quota(&c, "8MiB");
    assert_eq!(info.quota_bytes, 8 << 20);
    assert_eq!(info.props.get("quota").map(String::as_str), Some("8388608"));
    let cont = c.container();
    let obj = cont
        .object(ObjectId::new(ObjectClass::Rp2G1, 1, 1))
        .unwrap();
    let (written, err) = fill(&obj, 0, 40);
    assert_eq!(err.code, -libc::EDQUOT, "{err}");
    assert!(err.to_string().contains("quota"), "{err}");
    // The quota counts data: 8 MiB of it fit, not 4 (replicas do not
    // count); engines writing at once can pass it until the service
    // measures again (see ms/quota.rs): here two engines, each of which
    // stored half of what was written since the last measurement.
    assert!(
        (7..=18).contains(&written),
        "{written} MiB written under an 8 MiB quota"
    );
    let info = query(&c);
    assert!(
        info.quota_used_bytes >= written << 20 && info.quota_used_bytes < (written + 1) << 20,
        "quota_used {} after {written} MiB",
        info.quota_used_bytes
    );
    assert!(
        info.used_bytes >= 2 * (written << 20),
        "used {}",
        info.used_bytes
    );
    // Once measured, every engine refuses.
    std::thread::sleep(Duration::from_millis(2500));
    for i in 0..4 {
        let e = obj
            .update_array(format!("late{i}").as_bytes(), b"a", 0, &pattern(i, 4096))
            .unwrap_err();
        assert_eq!(e.code, -libc::EDQUOT, "{e}");
    }
    // Everything acknowledged is intact.
    for i in 0..written {
        let got = obj
            .fetch_array(format!("d{i}").as_bytes(), b"a", 0, 1 << 20)
            .unwrap();
        assert!(got == pattern(0, 1 << 20), "d{i} differs");
    }

    // Raised: writes go through again, at once.
    set_quota(&c, &format!("{}MiB", written + 8));
    let (more, err) = fill(&obj, written, 40);
    assert_eq!(err.code, -libc::EDQUOT, "{err}");
    assert!(
        more >= 7,
        "only {more} MiB more after raising the quota by 8 MiB"
    );

    // Lifted: no limit.
    set_quota(&c, "none");
    let val = pattern(99, 1 << 20);
    obj.update_array(b"after-lift", b"a", 0, &val).unwrap();
    assert_eq!(query(&c).quota_bytes, 0);
}

#[test]
fn striped_container_over_quota_frees_space_by_punching() {
    let c = quota_cluster(2, 2, "SX");
    set_quota(&c, "8MiB");
    let cont = c.container();
    let obj = cont.object(ObjectId::new(ObjectClass::SX, 2, 1)).unwrap();
    // Spread over every target: the engines learn what the others hold.
    let (written, err) = fill(&obj, 0, 40);
    assert_eq!(err.code, -libc::EDQUOT, "{err}");
    assert!(
        (7..=18).contains(&written),
        "{written} MiB under an 8 MiB quota"
    );
    std::thread::sleep(Duration::from_millis(2500));
    let e = obj
        .update_array(b"late", b"a", 0, &pattern(3, 1 << 20))
        .unwrap_err();
    assert_eq!(e.code, -libc::EDQUOT, "{e}");
    // Removing data makes room once the service measures again (a target
    // of a full container reclaims what was removed then).
    for i in 0..written {
        obj.punch_dkey(format!("d{i}").as_bytes()).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match obj.update_array(b"again", b"a", 0, &pattern(7, 1 << 20)) {
            Ok(()) => break,
            Err(e) if e.code == -libc::EDQUOT && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(500))
            }
            Err(e) => panic!("no room after punching everything: {e}"),
        }
    }
}

#[test]
fn bad_quota_is_refused_by_name() {
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 1,
            targets: 1,
            device_mib: 128,
            scm_mib: 64,
        },
        64,
        "S1",
        "crc32c",
    );
    let mut m = c.mgmt();
    let e =
        c.rt.block_on(m.cont_set_prop(ContSetPropReq {
            pool: "pool".into(),
            id: "cont".into(),
            props: HashMap::from([("quota".to_string(), "lots".to_string())]),
        }))
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("quota"), "{}", e.message());
}

#[test]
fn an_engine_back_from_a_restart_enforces_the_quota_again() {
    let mut c = quota_cluster(2, 1, "SX");
    set_quota(&c, "8MiB");
    let cont = c.container();
    let obj = cont.object(ObjectId::new(ObjectClass::SX, 3, 1)).unwrap();
    let (written, err) = fill(&obj, 0, 40);
    assert_eq!(err.code, -libc::EDQUOT, "{err}");
    // Rank 1 is killed and restarts (its targets' quota state is in memory only).
    c.engines[1].kill9();
    c.restart(1);
    std::thread::sleep(Duration::from_millis(2500));
    // Once the service measured again, it refuses as before; what was
    // written before the restart reads back.
    for i in 0..4 {
        let e = obj
            .update_array(
                format!("after{i}").as_bytes(),
                b"a",
                0,
                &pattern(i, 1 << 20),
            )
            .unwrap_err();
        assert_eq!(e.code, -libc::EDQUOT, "{e}");
    }
    for i in 0..written {
        let got = obj
            .fetch_array(format!("d{i}").as_bytes(), b"a", 0, 1 << 20)
            .unwrap();
        assert!(got == pattern(0, 1 << 20), "d{i} differs after the restart");
    }
}

#[test]
fn a_container_refilled_right_after_its_data_was_removed_takes_the_new_data() {
    // Three engines, RP_2GX as the CSI driver's default: every engine holds
    // a part of what is removed, and counts what the others hold.
    let mut c = quota_cluster(3, 2, "RP_2GX");
    set_quota(&c, "16MiB");
    let cont = c.container();
    let file = |round: u64, i: u64| {
        cont.object(ObjectId::new(ObjectClass::Rp2GX, 4, round * 100 + i))
            .unwrap()
    };
    let val = |round: u64, i: u64| pattern(round * 100 + i, 1 << 20);
    // A dataset of 12 files of 1 MiB removed and written again, as a job
    // that regenerates its output does (a removed file is a punched
    // object): three rounds, 36 MiB through a 16 MiB quota; the last stays.
    for round in 0..3 {
        for i in 0..12 {
            file(round, i)
                .update_array(b"0", b"a", 0, &val(round, i))
                .unwrap_or_else(|e| panic!("round {round}, file {i} under a 16 MiB quota: {e}"));
        }
        if round < 2 {
            for i in 0..12 {
                file(round, i).punch().unwrap();
            }
        }
        // The service measures the engines: 12 MiB removed, not yet reclaimed.
        std::thread::sleep(Duration::from_millis(2500));
    }
    // Left alone, the engines reclaim what was removed, though the service
    // measures them (and wakes their targets) every second; what is live stays.
    let live = 12u64 << 20;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let used = query(&c).quota_used_bytes;
        assert!(used >= live, "{used} bytes counted with {live} live");
        if used < live + (1 << 20) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{used} bytes counted against the quota a minute after all but {live} was removed"
        );
        std::thread::sleep(Duration::from_secs(1));
    }
    // What the reclaims kept reads back as written, also from an engine
    // killed and restarted after them (its aggregations replayed).
    c.engines[1].kill9();
    c.restart(1);
    for i in 0..12 {
        let got = file(2, i).fetch_array(b"0", b"a", 0, 1 << 20).unwrap();
        assert!(
            got == val(2, i),
            "file {i} differs after the reclaims and a restart"
        );
        let size = file(0, i).array_size(b"0", b"a").unwrap();
        assert_eq!(size, 0, "removed file {i} of round 0 came back");
    }
}
