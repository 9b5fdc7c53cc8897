//! An engine coming back: what it is sent (only what it missed, or
//! everything past the window), conditional inserts while it is out, and
//! clients whose pool map is older than its return.

use super::*;

/// Directory entries are conditional inserts: one replica of each group
/// arbitrates. With an engine out, names whose first replica it held are
/// arbitrated by the next one: creates go on (a pod creating files while an
/// engine pod restarts), a name still wins once, and every name reads back
/// through each replica once the engine is back.
#[test]
fn conditional_inserts_go_on_while_a_replica_is_out() {
    let _serial = one_at_a_time();
    let mut c = one_target_engines(3, 256, 384, "RP_2G1");
    let cont = c.container();
    let dir = cont.object(oid(ObjectClass::Rp2G1, 100)).unwrap();
    let (v0, _, _) = pool_out(&c);
    c.engines[2].stop();
    let stopped = Instant::now();
    while pool_out(&c).0 == v0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "rank 2 not excluded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let names: Vec<Vec<u8>> = (0..32).map(|i| format!("file.{i}").into_bytes()).collect();
    for n in &names {
        dir.insert_single(n, b"inode", n).unwrap_or_else(|e| {
            panic!(
                "create {:?} with rank 2 out: {e}",
                String::from_utf8_lossy(n)
            )
        });
        let e = dir.insert_single(n, b"inode", b"again").unwrap_err();
        assert_eq!(e.code, -libc::EEXIST, "{e}");
    }
    c.restart(2);
    wait_reintegrated(&c, Duration::from_secs(60));
    // All up first: the client takes the current map while the management
    // service (rank 0) is there to give it.
    for n in &names {
        assert_eq!(
            dir.fetch_single(n, b"inode").unwrap().as_deref(),
            Some(&n[..])
        );
    }
    for r in 0..3 {
        c.engines[r].kill9();
        for n in &names {
            let got = dir.fetch_single(n, b"inode").unwrap();
            assert_eq!(got.as_deref(), Some(&n[..]), "rank {r} down");
        }
        c.restart(r);
    }
}

/// A returning engine is not sent again what it took before it went away.
/// The copy starts 90 s below the engine's last heartbeat, so it meets every
/// update of that span; written again at their epochs they took their space
/// a second time (one epoch's array extents are not merged before
/// aggregation, which waits for the copy), and a copy that failed and
/// started over took it once more each time. On a cluster, an engine pod
/// deleted a minute after 1 GiB was written filled its target that way:
/// writers got ENOSPC and the copy never ended.
#[test]
fn reintegration_writes_only_what_the_returning_engine_missed() {
    let _serial = one_at_a_time();
    let class = ObjectClass::Ec2P1G1;
    let mut c = one_target_engines(3, 1024, 1920, class.name());
    let cont = c.container();
    // Before the outage: 32 MiB in 1 MiB dkeys, as a file is stored. Every
    // object of a G1 class has a shard on each of the three targets.
    const MIB: usize = 1 << 20;
    let big = cont.object(ObjectId::new(class, 9, 1)).unwrap();
    let before = pattern(1, 32 * MIB);
    for (i, chunk) in before.chunks(MIB).enumerate() {
        big.update_array(format!("d{i}").as_bytes(), b"a", 0, chunk)
            .unwrap();
    }
    let (v0, _, _) = pool_out(&c);
    c.engines[2].stop();
    let stopped = Instant::now();
    while pool_out(&c).0 == v0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "rank 2 not excluded; events:\n{}",
            pool_map_events(&c)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // While it is away: 1 MiB it misses (512 KiB of cells on its target).
    let small = cont.object(ObjectId::new(class, 9, 2)).unwrap();
    let during = pattern(2, MIB);
    small.update_array(b"d0", b"a", 0, &during).unwrap();
    c.restart(2);
    wait_reintegrated(&c, Duration::from_secs(60));

    let logs = c.logs();
    let summary = logs
        .lines()
        .find(|l| l.contains("reintegrated in"))
        .unwrap_or_else(|| panic!("no reintegration summary in the logs:\n{logs}"));
    let number_before = |what: &str| -> u64 {
        let head = &summary[..summary
            .find(what)
            .unwrap_or_else(|| panic!("{what:?} not in {summary:?}"))];
        let digits = head.trim_end().rsplit(' ').next().unwrap_or("");
        digits
            .trim_start_matches('(')
            .parse()
            .unwrap_or_else(|_| panic!("no number before {what:?} in {summary:?}"))
    };
    let (bytes, held) = (number_before(" bytes"), number_before(" already held"));
    eprintln!("{summary}");
    assert!(
        bytes <= MIB as u64,
        "the copy wrote {bytes} bytes for 512 KiB missed: it wrote again what rank 2 held ({summary})"
    );
    assert!(held >= 32, "nothing counted as held already ({summary})");

    // All of it reads back, through each shard in turn (the handles opened
    // before: with rank 0 stopped there is no management service to ask).
    for r in [None, Some(0), Some(1), Some(2)] {
        if let Some(r) = r {
            c.engines[r].kill9();
        }
        for (i, chunk) in before.chunks(MIB).enumerate() {
            let got = big
                .fetch_array(format!("d{i}").as_bytes(), b"a", 0, MIB)
                .unwrap();
            assert!(got == chunk, "dkey d{i} differs with rank {r:?} stopped");
        }
        let got = small.fetch_array(b"d0", b"a", 0, MIB).unwrap();
        assert!(
            got == during,
            "the update made during the outage differs with rank {r:?} stopped"
        );
        if let Some(r) = r {
            c.restart(r);
            wait_reintegrated(&c, Duration::from_secs(60));
        }
    }
}

/// Three engines whose reintegration window is 10 s (an hour by default), so
/// that a test can outlast it; a pool of `class` on them.
fn short_window_cluster(class: ObjectClass) -> Cluster {
    let c = Cluster::start_configured(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 1024,
            scm_mib: 64,
        },
        "reintegration_window_s: 10\n",
    );
    c.format();
    c.create_pool(1920, class.name(), "crc32c");
    c
}

/// A rank stopped cleanly is excluded from when it was last heard of, not
/// from when the management service started: its word that it stops ends
/// its heartbeats, and counting from the service's start made the copy cover
/// everything since then, and once the service had run longer than the
/// reintegration window (10 s here, an hour by default) it wiped the rank
/// whole on its return: any engine pod deleted after the first hour.
#[test]
fn clean_stop_long_after_the_service_started_is_not_copied_whole() {
    let _serial = one_at_a_time();
    let class = ObjectClass::Ec2P1G1;
    let mut c = short_window_cluster(class);
    let cont = c.container();
    let obj = cont.object(ObjectId::new(class, 9, 3)).unwrap();
    let data = pattern(3, 1 << 20);
    obj.update_array(b"d0", b"a", 0, &data).unwrap();
    // Longer than the window since the service started.
    std::thread::sleep(Duration::from_secs(12));
    let (v0, _, _) = pool_out(&c);
    c.engines[2].stop();
    let stopped = Instant::now();
    while pool_out(&c).0 == v0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "rank 2 not excluded; events:\n{}",
            pool_map_events(&c)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Rounds of the pool watch, which marks a rank out past the window.
    std::thread::sleep(Duration::from_secs(2));
    c.restart(2);
    wait_reintegrated(&c, Duration::from_secs(60));
    let events = pool_map_events(&c);
    assert!(
        !events.contains("longer than the reintegration window") && !events.contains("wiped"),
        "rank 2, out for seconds, was copied whole:\n{events}"
    );
    // Read back with another engine away (a handle with the current map:
    // without rank 0 there is no service to refresh it from).
    let obj = c.container().object(ObjectId::new(class, 9, 3)).unwrap();
    c.engines[0].kill9();
    assert!(obj.fetch_array(b"d0", b"a", 0, 1 << 20).unwrap() == data);
}

/// An engine out longer than the reintegration window (10 s here; an
/// hour by default) no longer holds the others' aggregation back; when it
/// returns its pool shards are wiped and copied whole.
#[test]
fn engine_out_past_the_reintegration_window_is_copied_whole() {
    let _serial = one_at_a_time();
    let class = ObjectClass::Ec2P1G1;
    let mut c = short_window_cluster(class);
    let w = Workload::new(class);
    let threads = start(&c, &w);
    std::thread::sleep(Duration::from_secs(1));
    c.engines[1].kill9();
    // The margin (90 s) plus the window must pass; `since` is set 90 s
    // before the last heartbeat, so 10 s after it the window is over.
    std::thread::sleep(Duration::from_secs(14));
    c.restart(1);
    wait_reintegrated(&c, Duration::from_secs(90));
    std::thread::sleep(Duration::from_secs(1));
    w.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let events = pool_map_events(&c);
    assert!(
        events.contains("longer than the reintegration window") && events.contains("wiped"),
        "rank 1 was not copied whole:\n{events}"
    );
    if !w.wrong.lock().unwrap().is_empty() {
        eprintln!("engine logs:\n{}", c.logs());
    }
    w.assert_clean("out past the reintegration window");
    verify_each_missing(&mut c, &w);
    w.assert_clean("out past the reintegration window, each engine missing in turn");
}

/// A client whose pool map is older than the system's reads on when the
/// other replica goes away. It learnt that rank 2 was excluded, then rank 2
/// came back and was reintegrated while the client sent nothing (so no
/// engine told it its map was old), then rank 1 died: by its map, the
/// object's only copies are unreachable or down. It asks for the map again
/// and reads the returned replica, instead of failing (a FUSE daemon
/// answered EIO there).
#[test]
fn a_reader_with_an_old_map_reads_the_replica_that_came_back() {
    let _serial = one_at_a_time();
    let mut c = one_target_engines(3, 256, 384, "RP_2G1");
    let cont = c.container();
    let full = cont.pool().map();
    let ranks = |i: u64| -> Vec<u32> {
        let l = peregrine::placement::layout(&full, oid(ObjectClass::Rp2G1, i), ObjectClass::Rp2G1)
            .unwrap();
        let mut r: Vec<u32> = l[0]
            .shards
            .iter()
            .map(|s| full.targets[s.target].rank)
            .collect();
        r.sort_unstable();
        r
    };
    let i = (0..1000)
        .find(|&i| ranks(i) == [1, 2])
        .expect("an object on ranks 1 and 2");
    let obj = cont.object(oid(ObjectClass::Rp2G1, i)).unwrap();
    obj.update_single(b"d", b"a", b"before").unwrap();

    let (v0, _, _) = pool_out(&c);
    c.engines[2].kill9();
    let killed = Instant::now();
    while !matches!(pool_out(&c), (v, out, _) if v > v0 && out > 0 && out != u32::MAX) {
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "rank 2 not excluded"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = cont.pool().refresh().unwrap();
    assert!(out.version > v0, "the client has the map without rank 2");
    obj.update_single(b"d", b"a", b"during").unwrap();

    c.restart(2);
    wait_reintegrated(&c, Duration::from_secs(60));
    assert_eq!(
        cont.pool().map().version,
        out.version,
        "the client asked nothing meanwhile"
    );
    c.engines[1].kill9();
    let got = obj
        .fetch_single(b"d", b"a")
        .unwrap_or_else(|e| panic!("read with rank 1 down and an old map: {e}"));
    assert_eq!(got.as_deref(), Some(&b"during"[..]));
    assert!(
        cont.pool().map().version > out.version,
        "the read took the new map"
    );
}
