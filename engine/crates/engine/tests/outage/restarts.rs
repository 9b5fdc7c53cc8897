//! Engines stopped and started again: rolling restarts, a clean stop, many
//! restarts in a row.

use super::*;

/// What a rolling upgrade does: every engine in turn stopped, held down past
/// failure detection (so it is excluded and reintegrated; the management
/// service's own engine is not, nobody excludes it), restarted, and the
/// next one taken down only once it is back in every pool.
#[test]
fn rolling_restart_under_a_writer() {
    let _serial = one_at_a_time();
    let class = ObjectClass::Ec2P1G1;
    let mut c = one_target_engines(3, 1024, 1920, class.name());
    let w = Workload::new(class);
    let threads = start(&c, &w);
    for victim in [1, 2, 0] {
        std::thread::sleep(Duration::from_secs(1));
        c.engines[victim].kill9();
        std::thread::sleep(Duration::from_secs(7));
        c.restart(victim);
        wait_reintegrated(&c, Duration::from_secs(60));
    }
    std::thread::sleep(Duration::from_secs(1));
    w.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    if !w.wrong.lock().unwrap().is_empty() {
        eprintln!("{}", pool_map_events(&c));
    }
    w.assert_clean("rolling restart");
    verify_each_missing(&mut c, &w);
    w.assert_clean("rolling restart, each engine missing in turn");
}

/// An engine stopped cleanly (SIGTERM, as Kubernetes stops a pod) tells the
/// management service, which excludes it at once: updates go on degraded
/// within about a second instead of waiting out the 6 s heartbeat timeout.
#[test]
fn clean_stop_is_excluded_at_once() {
    let _serial = one_at_a_time();
    let class = ObjectClass::Rp2G1;
    let mut c = one_target_engines(3, 1024, 1920, class.name());
    let w = Workload::new(class);
    let threads = start(&c, &w);
    std::thread::sleep(Duration::from_secs(1));
    let (v0, _, _) = pool_out(&c);
    c.engines[2].stop();
    let stopped = Instant::now();
    while pool_out(&c).0 == v0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(3),
            "rank 2 not excluded within 3 s of its exit; events:\n{}",
            pool_map_events(&c)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = w.writes.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        w.writes.load(Ordering::Relaxed) > before + 10,
        "updates did not go on degraded"
    );
    c.restart(2);
    wait_reintegrated(&c, Duration::from_secs(60));
    w.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    w.assert_clean("clean stop");
    verify_each_missing(&mut c, &w);
    w.assert_clean("clean stop, each engine missing in turn");
}

/// The long version, by hand: `PEREGRINE_RESTARTS=100 cargo test -p
/// peregrine-engine --test outage many_restarts -- --ignored --nocapture`.
/// Random victims (the management service's engine among them), down for
/// 1 to 9 s, RP_2G1 and EC_2P1G1 in turn.
#[test]
#[ignore = "long: minutes per ten restarts"]
fn many_restarts() {
    let _serial = one_at_a_time();
    let restarts: u64 = std::env::var("PEREGRINE_RESTARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let mut seed = 0x5eed_u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let started = Instant::now();
    let per_class = restarts.div_ceil(2);
    let mut done = 0;
    for class in [ObjectClass::Rp2G1, ObjectClass::Ec2P1G1] {
        let mut c = Cluster::with_pool(
            ClusterSpec {
                engines: 3,
                targets: 1,
                device_mib: 1024,
                scm_mib: 128,
            },
            1920,
            class.name(),
            "crc32c",
        );
        let w = Workload::new(class);
        let threads = start(&c, &w);
        for _ in 0..per_class.min(restarts - done) {
            let victim = (rand() % 3) as usize;
            let down = Duration::from_millis(1000 + rand() % 8000);
            c.engines[victim].kill9();
            std::thread::sleep(down);
            c.restart(victim);
            wait_reintegrated(&c, Duration::from_secs(120));
            done += 1;
            eprintln!(
                "restart {done}: {class} rank {victim} down {down:?}; {} writes, {} reads, {} wrong so far ({:?})",
                w.writes.load(Ordering::Relaxed),
                w.reads.load(Ordering::Relaxed),
                w.wrong.lock().unwrap().len(),
                started.elapsed()
            );
        }
        w.stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        verify_each_missing(&mut c, &w);
        w.assert_clean(&format!("{class}: many restarts"));
    }
}
