//! Integration tests of the store on real device files: space (ENOSPC,
//! reuse after punch and aggregation), snapshots and aggregation.

mod common;

use common::*;
use peregrine_vos::*;
use uuid::Uuid;

const LATEST: u64 = u64::MAX;

#[test]
fn enospc_and_space_reuse_after_punch_and_aggregation() {
    let e = env(64, 2);
    let st = Storage::open(&e.opts).unwrap();
    let (nvme_total, nvme_unres, scm_total, _) = st.device_space();
    assert_eq!(nvme_total, nvme_unres);
    // 64 MiB configured, capped to half of each target's checkpoint slot.
    assert_eq!(scm_total, 2 * st.superblock().ckpt_bytes / 2);
    // Too big for the device: named tier, need and free.
    let err = st.pool_create(Uuid::new_v4(), MIB, nvme_total).unwrap_err();
    assert_eq!(err.errno(), -libc::ENOSPC);
    assert!(
        err.to_string().contains("tier nvme") && err.to_string().contains("need"),
        "{err}"
    );
    assert!(st.pools().is_empty(), "failed create leaves nothing");

    let pool = Uuid::new_v4();
    st.pool_create(pool, 64 * 1024, MIB).unwrap();
    st.pool_create(pool, 64 * 1024, MIB).unwrap(); // idempotent
    assert_eq!(
        st.pool_create(pool, 64 * 1024, 2 * MIB)
            .unwrap_err()
            .errno(),
        -libc::EEXIST
    );
    let cont = Uuid::new_v4();
    let o = Obj::new(pool, cont, 1, 1);
    let v = pattern(1, 64 * 1024);
    let mut n = 0;
    let err = loop {
        match update(&st, &o, 10 + n, &format!("k{n}"), vec![single("a", &v)]) {
            Ok(()) => n += 1,
            Err(e) => break e,
        }
    };
    assert_eq!(n, 16, "1 MiB of 64 KiB values");
    assert_eq!(err.code, -libc::ENOSPC);
    assert!(
        err.msg.contains(&pool.to_string())
            && err.msg.contains("nvme")
            && err.msg.contains("need 65536"),
        "{}",
        err.msg
    );
    assert_eq!(
        get_single(&st, &o, LATEST, &format!("k{n}"), "a"),
        Err(-libc::ENOENT),
        "failed update stored nothing"
    );
    let space = st.pool_space(pool).unwrap();
    assert_eq!(
        space.nvme_free, MIB,
        "target 0 untouched, target 1 full: {space:?}"
    );
    assert!(space.cont_used[&cont] >= 16 * 64 * 1024);

    // Punch all, aggregate: the blocks and scm come back and are reused.
    for i in 0..n {
        punch(&st, &o, 1000, &format!("k{i}"), &[]).unwrap();
    }
    let reclaimed = st.aggregate(pool).unwrap();
    // Targets also aggregate on their own above 80% nvme use, so part of the
    // space may already be back; what matters is that all of it is.
    assert!(reclaimed > 0, "{reclaimed}");
    let space = st.pool_space(pool).unwrap();
    assert_eq!(
        (space.nvme_free, space.scm_free),
        (2 * MIB, 2 * 64 * 1024),
        "{space:?}"
    );
    for i in 0..16 {
        update(&st, &o, 2000 + i, &format!("n{i}"), vec![single("a", &v)]).unwrap();
    }
    assert_eq!(get_single(&st, &o, LATEST, "n15", "a").unwrap(), v);

    // scm tier: small values exhaust the 64 KiB metadata budget.
    let o2 = Obj::new(pool, cont, 2, 0);
    let small = pattern(2, 1000);
    let err = (0..1000)
        .find_map(|i| update(&st, &o2, 10, &format!("s{i}"), vec![single("a", &small)]).err())
        .unwrap();
    assert!(
        err.code == -libc::ENOSPC && err.msg.contains("tier scm"),
        "{}",
        err.msg
    );

    // Container destroy gives everything back.
    st.cont_destroy(pool, cont).unwrap();
    let space = st.pool_space(pool).unwrap();
    assert_eq!((space.nvme_free, space.scm_free), (2 * MIB, 2 * 64 * 1024));
    assert!(space.cont_used.is_empty());
    assert_eq!(get_single(&st, &o, LATEST, "n15", "a"), Err(-libc::ENOENT));
    st.pool_destroy(pool).unwrap();
    assert_eq!(st.device_space().1, nvme_total);
    st.pool_destroy(pool).unwrap(); // idempotent
    assert!(st.pools().is_empty());
}

/// Files removed give their space back to the next files written, at once:
/// an update that does not fit aggregates the pool first (here the SCM
/// tier, which small values fill and which no usage level aggregates), and
/// only a pool full of live values answers ENOSPC.
#[test]
fn an_update_that_does_not_fit_gets_the_space_of_removed_values() {
    let e = env(64, 1);
    let st = Storage::open(&e.opts).unwrap();
    let pool = Uuid::new_v4();
    st.pool_create(pool, 64 * 1024, MIB).unwrap();
    let o = Obj::new(pool, Uuid::new_v4(), 1, 0);
    let small = pattern(3, 1000);
    let fill = |round: u64| {
        let mut n = 0;
        loop {
            let r = update(
                &st,
                &o,
                round * 1000 + n,
                &format!("r{round}-{n}"),
                vec![single("a", &small)],
            );
            match r {
                Ok(()) => n += 1,
                Err(e) => break (n, e),
            }
            assert!(n < 1000, "64 KiB of SCM took {n} values of 1000 bytes");
        }
    };
    let (first, err) = fill(1);
    assert!(first > 10, "{first} values");
    assert!(
        err.code == -libc::ENOSPC && err.msg.contains("tier scm"),
        "{}",
        err.msg
    );
    for round in 2..5u64 {
        // Remove the last round's values, then write as many again at once.
        for i in 0..first {
            punch(
                &st,
                &o,
                round * 1000 - 1,
                &format!("r{}-{i}", round - 1),
                &[],
            )
            .unwrap();
        }
        let (n, err) = fill(round);
        assert!(
            n + 2 >= first,
            "round {round}: {n} values fit after removing {first}: {}",
            err.msg
        );
        assert_eq!(err.code, -libc::ENOSPC, "{}", err.msg);
        assert_eq!(
            get_single(&st, &o, LATEST, &format!("r{round}-0"), "a").unwrap(),
            small
        );
    }
}

#[test]
fn snapshots_survive_aggregation() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    for ep in 1..=10u64 {
        update(
            &st,
            &o,
            ep * 10,
            "d",
            vec![
                single("s", &pattern(ep, 5000)),
                extent("a", 0, &pattern(ep, 8192)),
            ],
        )
        .unwrap();
    }
    st.set_snapshots(pool, cont, vec![35, 75], None).unwrap();
    let reclaimed = st.aggregate(pool).unwrap();
    assert!(reclaimed >= 6 * 8192, "{reclaimed}");
    assert_eq!(get_single(&st, &o, 35, "d", "s").unwrap(), pattern(3, 5000));
    assert_eq!(get_single(&st, &o, 75, "d", "s").unwrap(), pattern(7, 5000));
    assert_eq!(
        get_single(&st, &o, LATEST, "d", "s").unwrap(),
        pattern(10, 5000)
    );
    assert_eq!(
        get_array(&st, &o, 35, "d", "a", 0, 8192).unwrap().0,
        pattern(3, 8192)
    );
    assert_eq!(
        get_single(&st, &o, 55, "d", "s").unwrap(),
        pattern(3, 5000),
        "epoch 50 aggregated away"
    );
    assert_eq!(st.aggregate(pool).unwrap(), 0, "nothing more to reclaim");
    st.close();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(get_single(&st, &o, 75, "d", "s").unwrap(), pattern(7, 5000));
}

/// A snapshot whose epoch an aggregation already passed (the management
/// service chose it before the target heard of it) is refused, so that it is
/// taken again at a newer epoch, not silently missing what it should read;
/// the horizon survives a restart, and a list only re-sent is kept.
#[test]
fn snapshot_behind_an_aggregation_is_refused() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    for ep in 1..=4u64 {
        update(
            &st,
            &o,
            ep * 10,
            "d",
            vec![extent("a", 0, &pattern(ep, 8192))],
        )
        .unwrap();
    }
    st.set_snapshots(pool, cont, vec![15], Some(15)).unwrap();
    assert!(st.aggregate(pool).unwrap() >= 2 * 8192);
    let err = st
        .set_snapshots(pool, cont, vec![15, 25], Some(25))
        .unwrap_err();
    assert_eq!(err.errno(), -libc::EAGAIN, "{err}");
    assert!(
        err.to_string().contains("epoch 25") && err.to_string().contains("aggregated"),
        "{err}"
    );
    // The snapshot already known is still accepted as part of a list.
    st.set_snapshots(pool, cont, vec![15], Some(15)).unwrap();
    st.close();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(
        st.set_snapshots(pool, cont, vec![15, 25], Some(25))
            .unwrap_err()
            .errno(),
        -libc::EAGAIN,
        "the horizon is kept across a restart"
    );
    let later = peregrine_proto::epoch_now() + (10 << 16);
    st.set_snapshots(pool, cont, vec![15, later], Some(later))
        .unwrap();
    assert_eq!(
        get_array(&st, &o, 15, "d", "a", 0, 8192).unwrap().0,
        pattern(1, 8192)
    );
    // A list re-sent to an engine that was away is kept, late epochs too.
    st.set_snapshots(pool, cont, vec![15, 25, later], None)
        .unwrap();
}

/// Without the aggregation lease (an engine the management service may count
/// as stopped), targets do not aggregate on their own: overwrites fill the
/// pool to ENOSPC. With it they do, and the same overwrites go on.
#[test]
fn targets_aggregate_on_their_own_only_under_the_lease() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 2 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let overwrite = |ep: u64| {
        update(
            &st,
            &o,
            ep,
            "d",
            vec![extent("a", 0, &pattern(ep, 256 * 1024))],
        )
    };
    st.lease_aggregation(std::time::Instant::now());
    let mut ep = 1;
    let err = loop {
        match overwrite(ep) {
            Ok(()) => ep += 1,
            Err(e) => break e,
        }
        assert!(ep < 100, "a 2 MiB pool took {ep} versions of 256 KiB");
    };
    assert_eq!((ep, err.code), (9, -libc::ENOSPC), "{}", err.msg);
    st.lease_aggregation(std::time::Instant::now() + std::time::Duration::from_secs(600));
    // The target aggregates after the batch in hand: a retry finds room
    // (the first may be answered before the target got to it).
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while let Err(e) = overwrite(ep) {
        assert!(
            std::time::Instant::now() < deadline,
            "no room under the lease: {}",
            e.msg
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for ep in ep + 1..ep + 40 {
        overwrite(ep).unwrap_or_else(|e| panic!("overwrite {ep} under the lease: {}", e.msg));
    }
    assert_eq!(
        get_array(&st, &o, LATEST, "d", "a", 0, 256 * 1024)
            .unwrap()
            .0,
        pattern(ep + 39, 256 * 1024)
    );
}
