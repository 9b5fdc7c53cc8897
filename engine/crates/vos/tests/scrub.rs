//! The scrubber: each idle target verifies its stored extents' checksums
//! at a bounded rate and reports what it verified and what is damaged,
//! with where.

mod common;

use common::*;
use peregrine_vos::*;
use std::time::{Duration, Instant};

const VAL: usize = 256 << 10;

/// Wait until every target finished a pass; returns the reports.
fn passed(st: &Storage, within: Duration) -> Vec<ScrubReport> {
    let deadline = Instant::now() + within;
    loop {
        let r = st.scrub_reports();
        if r.iter().all(|r| r.passes >= 1) {
            return r;
        }
        assert!(
            Instant::now() < deadline,
            "no pass within {within:?}: {r:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_pass_verifies_every_extent_and_names_the_damaged_one() {
    let e = env(64, 2);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    st.set_scrub_rate(0);
    for t in 0..2u32 {
        let o = Obj::new(pool, cont, 1 + t as u64, t);
        for i in 0..4u64 {
            let v = pattern(t as u64 * 10 + i, VAL);
            update(&st, &o, 10, &format!("d{i}"), vec![single("a", &v)]).unwrap();
        }
    }
    st.close();
    // Media damage under one stored value of target 1.
    damage(&e, &pattern(12, VAL)[..8192]);
    let st = Storage::open(&e.opts).unwrap();
    st.set_scrub_rate(64 << 20);
    let r = passed(&st, Duration::from_secs(20));
    assert_eq!((r[0].extents, r[0].damaged), (4, 0), "{:?}", r[0]);
    assert_eq!(r[0].bytes, 4 * VAL as u64);
    assert_eq!((r[1].extents, r[1].damaged), (4, 1), "{:?}", r[1]);
    let place = &r[1].places[0];
    assert!(
        place.contains("target 1")
            && place.contains(&format!("pool {pool}"))
            && place.contains("dkey \"d2\"")
            && place.contains("akey \"a\"")
            && place.contains("2 of 64 chunks fail their checksum"),
        "{place}"
    );
}

#[test]
fn scrubbing_keeps_to_its_rate() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    st.set_scrub_rate(0);
    let o = Obj::new(pool, cont, 1, 0);
    for i in 0..12u64 {
        let v = pattern(i, VAL);
        update(&st, &o, 10, &format!("d{i}"), vec![single("a", &v)]).unwrap();
    }
    let rate = 1u64 << 20;
    st.set_scrub_rate(rate);
    let t0 = Instant::now();
    loop {
        let r = st.scrub_reports().remove(0);
        let allowed = (t0.elapsed().as_secs_f64() * rate as f64) as u64 + (1 << 20) + VAL as u64;
        assert!(
            r.bytes <= allowed,
            "{} bytes after {:?}",
            r.bytes,
            t0.elapsed()
        );
        if r.passes >= 1 {
            assert_eq!((r.extents, r.damaged), (12, 0));
            assert!(t0.elapsed() >= Duration::from_secs(2), "3 MiB at 1 MiB/s");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "{r:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_rate_at_open_comes_from_the_options() {
    let mut e = env(64, 2);
    let st = Storage::open(&e.opts).unwrap();
    let rates: Vec<u64> = st.scrub_reports().iter().map(|r| r.rate).collect();
    assert_eq!(rates, [DEFAULT_SCRUB_RATE; 2]);
    st.close();
    e.opts.scrub_rate = 0;
    let st = Storage::open(&e.opts).unwrap();
    let rates: Vec<u64> = st.scrub_reports().iter().map(|r| r.rate).collect();
    assert_eq!(rates, [0; 2]);
}

/// Between the requests of a steady load a target is idle for moments at
/// a time; the scrubber waits for a quiet spell instead, and scrubs once
/// the load stops.
#[test]
fn a_steady_load_keeps_the_scrubber_out_of_its_way() {
    const N: u64 = 320;
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    st.set_scrub_rate(0);
    let o = Obj::new(pool, cont, 1, 0);
    for i in 0..N {
        // One block each: a step reads at most 16 of them.
        let v = pattern(i, 4096);
        update(&st, &o, 10, &format!("d{i}"), vec![single("a", &v)]).unwrap();
    }
    st.set_scrub_rate(64 << 20);
    let t0 = Instant::now();
    let mut fetches = 0u64;
    while t0.elapsed() < Duration::from_millis(2500) {
        get_single(&st, &o, 20, &format!("d{}", fetches % N), "a").unwrap();
        fetches += 1;
    }
    let during = st.scrub_reports().remove(0);
    // Unloaded, 64 MiB/s would verify all 320 blocks in a few
    // milliseconds; under the load only steps after a quiet spell (a
    // stall of this process) or one a second may run.
    assert!(
        during.passes == 0 && during.extents < N / 2,
        "scrubbed under a steady load ({fetches} fetches): {during:?}"
    );
    let r = passed(&st, Duration::from_secs(10));
    assert_eq!((r[0].extents, r[0].damaged), (N, 0), "{:?}", r[0]);
}
