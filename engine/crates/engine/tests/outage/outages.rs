//! An engine down briefly or past failure detection under a writer and a
//! reader, per object class; updates that fail are all or nothing.

use super::*;

fn outage(class: ObjectClass, engines: u32, victim: usize, down: Duration) {
    let _serial = one_at_a_time();
    let mut c = one_target_engines(engines, 1024, 640 * engines as u64, class.name());
    let w = Workload::new(class);
    let threads = start(&c, &w);
    std::thread::sleep(Duration::from_secs(2));
    let (v0, _, _) = pool_out(&c);
    c.engines[victim].kill9();
    std::thread::sleep(down);
    // (The management service is the victim's: nobody to ask.)
    let excluded = victim != 0 && pool_out(&c).1 > 0;
    c.restart(victim);
    wait_reintegrated(&c, Duration::from_secs(60));
    let (v1, _, _) = pool_out(&c);
    std::thread::sleep(Duration::from_secs(1));
    w.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    if down > Duration::from_secs(7) && victim != 0 {
        // Excluded, back as reintegrating, in again: three map versions.
        assert!(excluded, "rank {victim} was never excluded");
        assert!(v1 >= v0 + 3, "pool map version {v0} -> {v1}");
    }
    assert!(
        w.writes.load(Ordering::Relaxed) > 10,
        "the writer made no progress"
    );
    if !w.wrong.lock().unwrap().is_empty() {
        eprintln!("{}", pool_map_events(&c));
    }
    w.assert_clean(&format!("{class}, rank {victim} down {down:?}"));
    verify_each_missing(&mut c, &w);
    w.assert_clean(&format!("{class} after rank {victim} came back"));
    eprintln!(
        "{class}: rank {victim} down {down:?}: {} writes, {} reads, 0 wrong; map {v0} -> {v1}",
        w.writes.load(Ordering::Relaxed),
        w.reads.load(Ordering::Relaxed),
    );
}

#[test]
fn rp_2g1_engine_down_past_detection() {
    outage(ObjectClass::Rp2G1, 3, 2, LONG);
}

#[test]
fn rp_2g1_management_engine_down_briefly() {
    outage(ObjectClass::Rp2G1, 3, 0, SHORT);
}

#[test]
fn rp_3g1_engine_down_past_detection() {
    outage(ObjectClass::Rp3G1, 3, 1, LONG);
}

#[test]
fn rp_3g1_engine_down_briefly() {
    outage(ObjectClass::Rp3G1, 3, 2, SHORT);
}

#[test]
fn ec_4p2g1_engine_down_briefly() {
    outage(ObjectClass::Ec4P2G1, 6, 3, SHORT);
}

#[test]
fn ec_2p1g1_engine_down_past_detection() {
    outage(ObjectClass::Ec2P1G1, 3, 1, LONG);
}

#[test]
fn ec_2p1g1_engine_down_briefly() {
    outage(ObjectClass::Ec2P1G1, 3, 2, SHORT);
}

#[test]
fn ec_2p1g1_management_engine_down_past_detection() {
    outage(ObjectClass::Ec2P1G1, 3, 0, LONG);
}

#[test]
fn ec_4p2g1_engine_down_past_detection() {
    outage(ObjectClass::Ec4P2G1, 6, 4, LONG);
}

/// Updates that fail (the writer gives up after 1 s, while an engine is
/// dead but not yet excluded) take effect wholly or not at all: read back
/// at once (degraded) and after the return with each engine missing in turn.
fn failed_updates(class: ObjectClass, engines: u32) {
    let _serial = one_at_a_time();
    let mut c = one_target_engines(engines, 1024, 640 * engines as u64, class.name());
    let w = Arc::new(Workload {
        tolerate_failures: true,
        ..Workload::build(class)
    });
    let wc = c.container();
    wc.pool().client().set_retry_window(Duration::from_secs(1));
    let (w1, w2) = (w.clone(), w.clone());
    let rc = c.container();
    let threads = vec![
        std::thread::spawn(move || w1.writer(wc)),
        std::thread::spawn(move || w2.reader(rc)),
    ];
    // An outage fails the updates made before the engine is excluded,
    // unless the writer spends that time waiting on something else (a
    // transaction its engine led, in doubt until then): a few tries.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(2));
        c.engines[1].kill9();
        std::thread::sleep(LONG);
        c.restart(1);
        wait_reintegrated(&c, Duration::from_secs(60));
        if w.failures.load(Ordering::Relaxed) > 0 {
            break;
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    w.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let failed = w.failures.load(Ordering::Relaxed);
    w.assert_clean(&format!("{class}: {failed} failed updates"));
    assert!(
        failed > 0,
        "{class}: no update failed; the test tested nothing"
    );
    verify_each_missing(&mut c, &w);
    w.assert_clean(&format!("{class} after the return"));
    eprintln!(
        "{class}: {failed} failed updates, each wholly applied or not; {} writes, {} reads",
        w.writes.load(Ordering::Relaxed),
        w.reads.load(Ordering::Relaxed)
    );
}

#[test]
fn failed_rp_updates_are_all_or_nothing() {
    failed_updates(ObjectClass::Rp2G1, 3);
}

#[test]
fn failed_ec_updates_are_all_or_nothing() {
    failed_updates(ObjectClass::Ec2P1G1, 3);
}

/// A reader of an EC object never sees part of an update in flight: its
/// cells become visible together (one transaction), and a read of several
/// cells is fenced by the stripe's version.
#[test]
fn ec_reads_see_no_update_in_flight() {
    let _serial = one_at_a_time();
    let c = one_target_engines(3, 256, 384, "EC_2P1G1");
    let w = Workload::new(ObjectClass::Ec2P1G1);
    let threads = start(&c, &w);
    std::thread::sleep(Duration::from_secs(6));
    w.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    w.assert_clean("EC_2P1G1 under a writer");
}

/// Objects discarded (as removed files are) while an engine holding some
/// of their replicas is down past detection stay discarded once it is back
/// and reintegrated: read through every replica (each engine stopped in
/// turn), none holds data again.
#[test]
fn rp_2g1_discard_during_an_outage_holds_after_the_return() {
    let _serial = one_at_a_time();
    let class = ObjectClass::Rp2G1;
    let mut c = one_target_engines(3, 1024, 640 * 3, class.name());
    let cont = c.container();
    let objs: Vec<_> = (0..OBJECTS)
        .map(|i| cont.object(ObjectId::new(class, 9, i)).unwrap())
        .collect();
    for (i, o) in objs.iter().enumerate() {
        o.update_array(b"chunk", b"data", 0, &pattern(i as u64, 6000))
            .unwrap();
    }
    let victim = 2;
    c.engines[victim].kill9();
    let deadline = Instant::now() + Duration::from_secs(30);
    while pool_out(&c).1 == 0 {
        assert!(Instant::now() < deadline, "rank {victim} never excluded");
        std::thread::sleep(Duration::from_millis(200));
    }
    for (i, o) in objs.iter().enumerate() {
        o.discard()
            .unwrap_or_else(|e| panic!("discard of object {i} with rank {victim} down: {e}"));
    }
    c.restart(victim);
    wait_reintegrated(&c, Duration::from_secs(60));
    // (Opened before rank 0, the management service, is stopped.)
    let cont = c.container();
    let check = |when: &str| {
        for i in 0..OBJECTS {
            let o = cont.object(ObjectId::new(class, 9, i)).unwrap();
            assert_eq!(
                o.last_sized(b"data").unwrap(),
                None,
                "object {i}, {when}: data back after its discard"
            );
            assert!(
                o.list_dkeys().unwrap().is_empty(),
                "object {i}, {when}: dkeys back after its discard"
            );
        }
    };
    check("all engines up");
    for r in 0..c.engines.len() {
        c.engines[r].kill9();
        check(&format!("rank {r} stopped"));
        c.restart(r);
    }
    wait_reintegrated(&c, Duration::from_secs(60));
}
