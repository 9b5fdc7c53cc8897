//! The target keeps several commits and fetch rounds in flight at once:
//! what that must not change.

mod common;

use common::*;
use peregrine_vos::*;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

const LATEST: u64 = u64::MAX;

fn insert_req(o: &Obj, epoch: u64, dkey: &str, v: &[u8]) -> Request {
    let (iod, bulk) = single("inode", v);
    Request::Update(
        UpdateReq {
            addr: o.addr(),
            epoch,
            dkey: dkey.as_bytes().to_vec(),
            iods: vec![iod],
            insert_only: true,
            sync: false,
            dtx: None,
            conditions: Vec::new(),
        },
        bulk.into(),
    )
}

/// A conditional insert is judged against the commits still in flight, not
/// only the applied index: the second insert of each key is queued after
/// the first one's batch has (mostly) left for the device.
#[test]
fn insert_only_sees_commits_in_flight() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 3, 0);
    let n = 300;
    let mut pending = Vec::new();
    for round in 0..2u8 {
        for i in 0..n {
            let rx = st.submit(insert_req(
                &o,
                10 + round as u64,
                &format!("k{i}"),
                &[round],
            ));
            pending.push((i, round, rx));
        }
    }
    let mut wins = vec![Vec::new(); n];
    for (i, round, rx) in pending {
        match rx.recv().unwrap() {
            Ok(_) => wins[i].push(round),
            Err(e) => assert_eq!(e.code, -libc::EEXIST, "{e}"),
        }
    }
    for (i, w) in wins.iter().enumerate() {
        assert_eq!(w, &vec![0u8], "key k{i}: the first insert alone must win");
        assert_eq!(
            get_single(&st, &o, LATEST, &format!("k{i}"), "inode").unwrap(),
            vec![0]
        );
    }
}

/// Blocks freed by an overwrite are not reused while a fetch that planned
/// to read them is still in flight: readers racing overwriters of large
/// values always get one whole version, never a checksum error or a mix.
#[test]
fn reads_in_flight_never_see_reused_blocks() {
    let e = env(128, 1);
    let (st, pool, cont) = open_with_pool(&e, 48 * MIB);
    let o = Obj::new(pool, cont, 4, 0);
    let keys = 4;
    let len = 192 << 10;
    for k in 0..keys {
        update(
            &st,
            &o,
            1,
            &format!("d{k}"),
            vec![single("v", &vec![1u8; len])],
        )
        .unwrap();
    }
    let stop = AtomicBool::new(false);
    let version = AtomicU64::new(2);
    let reads = AtomicU64::new(0);
    std::thread::scope(|s| {
        for w in 0..2 {
            let (st, o, stop, version) = (&st, &o, &stop, &version);
            s.spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let n = version.fetch_add(1, Ordering::Relaxed);
                    let k = (i + w) % keys;
                    let v = vec![(n % 251) as u8; len];
                    // The same epoch: the new value replaces the old one,
                    // whose blocks are freed when the update is applied.
                    update(st, o, 1, &format!("d{k}"), vec![single("v", &v)]).unwrap();
                    i += 1;
                }
            });
        }
        for r in 0..3 {
            let (st, o, stop, reads) = (&st, &o, &stop, &reads);
            s.spawn(move || {
                let mut i = r;
                while !stop.load(Ordering::Relaxed) {
                    let k = i % keys;
                    let v = get_single(st, o, LATEST, &format!("d{k}"), "v")
                        .unwrap_or_else(|e| panic!("fetch d{k}: errno {e}"));
                    assert_eq!(v.len(), len);
                    assert!(
                        v.iter().all(|&b| b == v[0]),
                        "d{k}: a fetch returned bytes of two versions"
                    );
                    reads.fetch_add(1, Ordering::Relaxed);
                    i += 1;
                }
            });
        }
        std::thread::sleep(std::time::Duration::from_secs(2));
        stop.store(true, Ordering::Relaxed);
    });
    assert!(
        reads.load(Ordering::Relaxed) > 100,
        "too few reads to mean anything"
    );
}

/// A target that never goes idle still aggregates a pool that fills with
/// old versions: overwrites at new epochs of three times the pool's size,
/// with readers keeping the device busy throughout, never get ENOSPC.
#[test]
fn a_busy_target_still_aggregates_a_filling_pool() {
    let e = env(128, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 5, 0);
    let len = 256 << 10;
    let rounds = 3 * 16 * MIB as usize / len / 2;
    let epoch = AtomicU64::new(1);
    let stop = AtomicBool::new(false);
    update(&st, &o, 1, "d0", vec![single("v", &vec![0u8; len])]).unwrap();
    std::thread::scope(|s| {
        let writers: Vec<_> = (0..2)
            .map(|w| {
                let (st, o, epoch) = (&st, &o, &epoch);
                s.spawn(move || {
                    for i in 0..rounds {
                        let ep = epoch.fetch_add(1, Ordering::Relaxed) + 1;
                        let k = (i + w) % 4;
                        let v = vec![(ep % 251) as u8; len];
                        update(st, o, ep, &format!("d{k}"), vec![single("v", &v)])
                            .unwrap_or_else(|e| panic!("update {i} of writer {w}: {e}"));
                    }
                })
            })
            .collect();
        let (st2, o2, stop2) = (&st, &o, &stop);
        s.spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                get_single(st2, o2, LATEST, "d0", "v").unwrap();
            }
        });
        let done: Vec<_> = writers.into_iter().map(|w| w.join()).collect();
        stop.store(true, Ordering::Relaxed);
        for d in done {
            if let Err(p) = d {
                std::panic::resume_unwind(p);
            }
        }
    });
}
