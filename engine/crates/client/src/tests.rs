//! Client tests against the in-process fake system ([`crate::testkit`]):
//! real frames over real TCP, with injected faults.

use crate::object::EC_SIZE_PREFIX;
use crate::testkit::FakeCluster;
use crate::transport::{TcpConfig, TcpTransport};
use crate::{Client, Container, Object, ObjectClass, ObjectId, Security};
use peregrine_proto::oclass::EC_CELL_SIZE;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::{Duration, Instant};

fn setup(engines: usize, cont: &str) -> (FakeCluster, Client, Container) {
    let fc = FakeCluster::start(engines, 2);
    let client = Client::connect(&fc.mgmt_addr, &Security::Insecure).unwrap();
    let cont = client
        .pool_connect("tank")
        .unwrap()
        .cont_open(cont)
        .unwrap();
    (fc, client, cont)
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u64)
                .wrapping_mul(2654435761)
                .wrapping_add(seed as u64)
                .to_le_bytes()[1]
        })
        .collect()
}

/// Ranks holding the shards of `dkey`'s group, in shard order.
fn ranks(obj: &Object, dkey: &[u8]) -> Vec<usize> {
    let map = obj.container().pool().map();
    obj.group(&map, dkey)
        .unwrap()
        .shards
        .iter()
        .map(|l| map.targets[l.target].rank as usize)
        .collect()
}

#[test]
fn basic_ops_every_class() {
    let (_fc, _c, cont) = setup(6, "c1");
    assert!(cont.checksum());
    for (i, class) in peregrine_proto::oclass::ALL_CLASSES.into_iter().enumerate() {
        let obj = cont.object(ObjectId::new(class, 1, i as u64)).unwrap();
        assert_eq!(obj.fetch_single(b"d1", b"a").unwrap(), None, "{class}");
        obj.update_single(b"d1", b"a", b"hello").unwrap();
        obj.update_single(b"d2", b"a", b"").unwrap();
        assert_eq!(obj.fetch_single(b"d1", b"a").unwrap().unwrap(), b"hello");
        assert_eq!(obj.fetch_single(b"d2", b"a").unwrap().unwrap(), b"");
        obj.update_single(b"d1", b"a", b"replaced").unwrap();
        assert_eq!(obj.fetch_single(b"d1", b"a").unwrap().unwrap(), b"replaced");

        let data = pattern(300_000, i as u8);
        obj.update_array(b"d1", b"arr", 5, &data).unwrap();
        assert_eq!(obj.array_size(b"d1", b"arr").unwrap(), 300_005, "{class}");
        assert_eq!(obj.array_size(b"d1", b"nothing").unwrap(), 0);
        let got = obj.fetch_array(b"d1", b"arr", 0, 300_010).unwrap();
        assert_eq!(&got[..5], &[0; 5]);
        assert_eq!(&got[5..300_005], &data[..], "{class}");
        assert_eq!(&got[300_005..], &[0; 5]);
        assert_eq!(
            obj.fetch_array(b"d1", b"arr", 1000, 10).unwrap(),
            &data[995..1005]
        );

        let mut akeys = obj.list_akeys(b"d1").unwrap();
        akeys.sort();
        assert_eq!(
            akeys,
            vec![b"a".to_vec(), b"arr".to_vec()],
            "{class}: size companion must be hidden"
        );
        assert_eq!(
            obj.list_dkeys().unwrap(),
            vec![b"d1".to_vec(), b"d2".to_vec()],
            "{class}"
        );

        obj.punch_akeys(b"d1", &[b"arr"]).unwrap();
        assert_eq!(obj.array_size(b"d1", b"arr").unwrap(), 0, "{class}");
        assert_eq!(obj.list_akeys(b"d1").unwrap(), vec![b"a".to_vec()]);
        obj.punch_dkey(b"d2").unwrap();
        assert_eq!(obj.list_dkeys().unwrap(), vec![b"d1".to_vec()]);
        obj.punch().unwrap();
        assert!(obj.list_dkeys().unwrap().is_empty());
        assert_eq!(obj.fetch_single(b"d1", b"a").unwrap(), None);
    }
}

#[test]
fn many_dkeys_spread_over_groups_and_list_back() {
    let (fc, _c, cont) = setup(4, "nocsum");
    let obj = cont.object(ObjectId::new(ObjectClass::SX, 0, 77)).unwrap();
    let mut want: Vec<Vec<u8>> = (0..200).map(|i| format!("k{i:03}").into_bytes()).collect();
    for k in &want {
        obj.update_single(k, b"v", k).unwrap();
    }
    want.sort();
    assert_eq!(obj.list_dkeys().unwrap(), want);
    // Every engine got some of them.
    for r in 0..4 {
        assert!(
            fc.engine(r).requests.load(Relaxed) > 10,
            "engine {r} unused"
        );
    }
}

#[test]
fn ec_layout_matches_the_documented_mapping() {
    let (_fc, _c, cont) = setup(3, "c1");
    let obj = cont
        .object(ObjectId::new(ObjectClass::Ec2P1G1, 0, 5))
        .unwrap();
    let cell = EC_CELL_SIZE as usize;
    let data = pattern(5 * cell + 777, 3); // 2.5+ stripes
    obj.update_array(b"d", b"a", 0, &data).unwrap();
    let map = obj.container().pool().map();
    let g = obj.group(&map, b"d").unwrap();
    let e = crate::EPOCH_LATEST;
    // data cell c lives on shard c % 2 at (c / 2) * cell.
    for c in 0..6usize {
        let got = obj
            .fetch_extent(
                &map,
                &g.shards[c % 2],
                e,
                b"d",
                b"a",
                ((c / 2) * cell) as u64,
                cell,
            )
            .unwrap();
        let lo = c * cell;
        let hi = ((c + 1) * cell).min(data.len());
        assert_eq!(&got[..hi - lo], &data[lo..hi], "cell {c}");
        assert!(got[hi - lo..].iter().all(|&b| b == 0));
    }
    // parity = encode of the stripe's data cells.
    let rs = peregrine_isal::ReedSolomon::new(2, 1);
    for s in 0..3usize {
        let mut cells: Vec<Vec<u8>> = (0..2)
            .map(|j| {
                obj.fetch_extent(&map, &g.shards[j], e, b"d", b"a", (s * cell) as u64, cell)
                    .unwrap()
            })
            .collect();
        let refs: Vec<&[u8]> = cells.iter().map(|c| c.as_slice()).collect();
        let parity = rs.encode(&refs).unwrap();
        let stored = obj
            .fetch_extent(&map, &g.shards[2], e, b"d", b"a", (s * cell) as u64, cell)
            .unwrap();
        assert_eq!(parity[0], stored, "parity of stripe {s}");
        cells.clear();
    }
    // The size companion is on every shard.
    let key = [EC_SIZE_PREFIX, b"a"].concat();
    for l in &g.shards {
        let size_arr = obj.fetch_extent(&map, l, e, b"d", &key, 0, 1).unwrap();
        assert_eq!(size_arr, vec![0]);
    }
    assert_eq!(obj.array_size(b"d", b"a").unwrap(), data.len() as u64);
}

#[test]
fn ec_partial_updates_and_degraded_reads() {
    for (class, engines) in [
        (ObjectClass::Ec2P1G1, 3),
        (ObjectClass::Ec4P2G1, 6),
        (ObjectClass::Ec2P1GX, 4),
    ] {
        let (fc, _c, cont) = setup(engines, "c1");
        let obj = cont.object(ObjectId::new(class, 9, 1)).unwrap();
        let cell = EC_CELL_SIZE as usize;
        let mut model = vec![0u8; 12 * cell];
        let writes: [(usize, usize); 5] = [
            (100, 3 * cell),
            (5 * cell - 10, 20),
            (0, 1),
            (7 * cell + 3, 4 * cell + 5),
            (2 * cell, 2 * cell),
        ];
        for (i, &(off, len)) in writes.iter().enumerate() {
            let d = pattern(len, i as u8 + 1);
            obj.update_array(b"dk", b"ak", off as u64, &d).unwrap();
            model[off..off + len].copy_from_slice(&d);
        }
        let size = writes.iter().map(|(o, l)| o + l).max().unwrap();
        assert_eq!(
            obj.array_size(b"dk", b"ak").unwrap(),
            size as u64,
            "{class}"
        );
        assert_eq!(
            obj.fetch_array(b"dk", b"ak", 0, size).unwrap(),
            &model[..size],
            "{class}"
        );

        let rk = ranks(&obj, b"dk");
        let p = class.fault_tolerance() as usize;
        // Data shards unreachable (engines down but still "up" in the map):
        // reads reconstruct from parity.
        for &r in &rk[..p] {
            fc.engine(r).down.store(true, Relaxed);
        }
        assert_eq!(
            obj.fetch_array(b"dk", b"ak", 0, size).unwrap(),
            &model[..size],
            "{class} degraded"
        );
        assert_eq!(
            obj.fetch_array(b"dk", b"ak", (3 * cell - 7) as u64, 50)
                .unwrap(),
            &model[3 * cell - 7..3 * cell + 43]
        );
        assert_eq!(obj.array_size(b"dk", b"ak").unwrap(), size as u64);
        // One more failure is too many.
        fc.engine(rk[p]).down.store(true, Relaxed);
        let e = obj.fetch_array(b"dk", b"ak", 0, 10).unwrap_err();
        assert!(
            e.msg.contains("dkey \"dk\"") && e.msg.contains("need"),
            "{e}"
        );
        for &r in &rk {
            fc.engine(r).down.store(false, Relaxed);
        }

        // Stored corruption on one data shard: reconstructed, not returned.
        fc.engine(rk[0]).corrupt_stored.store(true, Relaxed);
        assert_eq!(
            obj.fetch_array(b"dk", b"ak", 0, size).unwrap(),
            &model[..size],
            "{class} corrupt"
        );
        // Corruption in flight is caught by the client's own check.
        fc.engine(rk[0]).corrupt_stored.store(false, Relaxed);
        fc.engine(rk[1]).corrupt_wire.store(true, Relaxed);
        assert_eq!(
            obj.fetch_array(b"dk", b"ak", 0, size).unwrap(),
            &model[..size],
            "{class} wire"
        );
        fc.engine(rk[1]).corrupt_wire.store(false, Relaxed);

        // A write while a data engine is excluded from the map: the write
        // skips it (degraded read-modify-write), reads rebuild its cells.
        fc.set_rank_up(rk[0] as u32, false);
        cont.pool().refresh().unwrap();
        let d = pattern(cell + 99, 42);
        obj.update_array(b"dk", b"ak", (cell / 2) as u64, &d)
            .unwrap();
        model[cell / 2..cell / 2 + d.len()].copy_from_slice(&d);
        assert_eq!(
            obj.fetch_array(b"dk", b"ak", 0, size).unwrap(),
            &model[..size],
            "{class} after degraded write"
        );
    }
}

#[test]
fn ec_large_write_spans_batches() {
    let (_fc, _c, cont) = setup(3, "nocsum");
    let obj = cont
        .object(ObjectId::new(ObjectClass::Ec2P1G1, 0, 8))
        .unwrap();
    let stripe = 2 * EC_CELL_SIZE as usize;
    let len = stripe * (crate::object::EC_BATCH_STRIPES as usize + 3) + 12345;
    let d = pattern(len, 8);
    obj.update_array(b"d", b"a", 999, &d).unwrap();
    assert_eq!(obj.array_size(b"d", b"a").unwrap(), (999 + len) as u64);
    let got = obj.fetch_array(b"d", b"a", 999, len).unwrap();
    assert!(got == d, "large EC round trip differs");
}

#[test]
fn replicated_reads_survive_failures_and_corruption() {
    let (fc, _c, cont) = setup(4, "c1");
    let obj = cont
        .object(ObjectId::new(ObjectClass::Rp3G1, 3, 3))
        .unwrap();
    let big = pattern(MAX_IO_PLUS, 7);
    obj.update_single(b"d", b"s", b"single").unwrap();
    obj.update_array(b"d", b"a", 0, &big).unwrap();
    let rk = ranks(&obj, b"d");
    assert_eq!(rk.len(), 3);
    for &r in &rk {
        assert!(
            fc.engine(r).requests.load(Relaxed) >= 2,
            "replica on rank {r} not written"
        );
    }

    // Two replicas unreachable: the third answers.
    fc.engine(rk[0]).down.store(true, Relaxed);
    fc.engine(rk[1]).down.store(true, Relaxed);
    assert_eq!(obj.fetch_single(b"d", b"s").unwrap().unwrap(), b"single");
    assert!(obj.fetch_array(b"d", b"a", 0, big.len()).unwrap() == big);
    // A write needs every replica the pool map counts in: it waits for
    // them (the management service would exclude them), then fails.
    obj.container()
        .pool()
        .client()
        .set_retry_window(Duration::from_millis(300));
    let t0 = Instant::now();
    let e = obj.update_single(b"d", b"s", b"x").unwrap_err();
    assert!(
        t0.elapsed() >= Duration::from_millis(300),
        "it did not wait"
    );
    assert!(
        e.msg.contains(&format!("rank {}", rk[0])) || e.msg.contains(&format!("rank {}", rk[1])),
        "{e}"
    );
    fc.engine(rk[0]).down.store(false, Relaxed);
    fc.engine(rk[1]).down.store(false, Relaxed);

    // Corrupt stored data on two replicas: the third is used.
    fc.engine(rk[0]).corrupt_stored.store(true, Relaxed);
    fc.engine(rk[2]).corrupt_wire.store(true, Relaxed);
    for _ in 0..5 {
        assert_eq!(obj.fetch_single(b"d", b"s").unwrap().unwrap(), b"single");
    }
    // All three bad: -EILSEQ naming the object and dkey.
    fc.engine(rk[1]).corrupt_stored.store(true, Relaxed);
    let e = obj.fetch_single(b"d", b"s").unwrap_err();
    assert_eq!(e.code, -libc::EILSEQ, "{e}");
    assert!(
        e.msg.contains(&obj.id().to_string()) && e.msg.contains("dkey \"d\""),
        "{e}"
    );
    let e = obj.fetch_array(b"d", b"a", 0, 10).unwrap_err();
    assert_eq!(e.code, -libc::EILSEQ, "{e}");
}

const MAX_IO_PLUS: usize = crate::object::MAX_IO + 4097;

#[test]
fn excluded_targets_are_skipped_and_writes_keep_going() {
    let (fc, _c, cont) = setup(3, "c1");
    let obj = cont
        .object(ObjectId::new(ObjectClass::Rp2G1, 1, 1))
        .unwrap();
    obj.update_single(b"d", b"s", b"v1").unwrap();
    let rk = ranks(&obj, b"d");
    fc.set_rank_up(rk[0] as u32, false);
    fc.engine(rk[0]).down.store(true, Relaxed);
    cont.pool().refresh().unwrap();
    obj.update_single(b"d", b"s", b"v2").unwrap();
    assert_eq!(obj.fetch_single(b"d", b"s").unwrap().unwrap(), b"v2");
    // Both replicas excluded: nothing to write to.
    fc.set_rank_up(rk[1] as u32, false);
    cont.pool().refresh().unwrap();
    let e = obj.update_single(b"d", b"s", b"v3").unwrap_err();
    assert_eq!(e.code, -libc::EHOSTDOWN, "{e}");
    assert!(e.msg.contains("tolerates 1"), "{e}");
}

#[test]
fn stale_map_is_refreshed_and_retried() {
    let (fc, _c, cont) = setup(2, "c1");
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 1, 2)).unwrap();
    obj.update_single(b"d", b"s", b"v").unwrap();
    fc.set_rank_up(0, true); // version 2, same targets
    fc.require_map_version(2);
    assert_eq!(cont.pool().map().version, 1);
    assert_eq!(obj.fetch_single(b"d", b"s").unwrap().unwrap(), b"v");
    assert_eq!(cont.pool().map().version, 2);
}

#[test]
fn snapshots_read_old_versions() {
    let (_fc, _c, cont) = setup(3, "c1");
    let obj = cont
        .object(ObjectId::new(ObjectClass::Ec2P1G1, 1, 3))
        .unwrap();
    obj.update_single(b"d", b"s", b"old").unwrap();
    obj.update_array(b"d", b"a", 0, b"old array").unwrap();
    let snap = cont.snapshot("s1").unwrap();
    obj.update_single(b"d", b"s", b"new").unwrap();
    obj.update_array(b"d", b"a", 0, b"NEW ARRAY, longer")
        .unwrap();
    obj.update_single(b"d2", b"s", b"x").unwrap();
    let at = obj.at(snap);
    assert_eq!(at.fetch_single(b"d", b"s").unwrap().unwrap(), b"old");
    assert_eq!(at.fetch_array(b"d", b"a", 0, 9).unwrap(), b"old array");
    assert_eq!(at.array_size(b"d", b"a").unwrap(), 9);
    assert_eq!(at.list_dkeys().unwrap(), vec![b"d".to_vec()]);
    assert_eq!(obj.array_size(b"d", b"a").unwrap(), 17);
    assert_eq!(obj.fetch_single(b"d", b"s").unwrap().unwrap(), b"new");
}

#[test]
fn errors_name_what_failed() {
    let (fc, client, cont) = setup(2, "c1");
    // Unknown class id in the oid.
    let e = cont
        .object(ObjectId {
            hi: 0xEE << 56,
            lo: 1,
        })
        .unwrap_err();
    assert_eq!(e.code, -libc::EINVAL);
    assert!(e.msg.contains("class id 238"), "{e}");
    // Not enough engines for the class.
    let e = cont
        .object(ObjectId::new(ObjectClass::Rp3G1, 0, 1))
        .unwrap_err();
    assert_eq!(
        e.msg,
        "object class RP_3G1 needs 3 engines, pool \"tank\" has 2"
    );
    // Unknown pool / container: the management service's message.
    let e = client.pool_connect("nope").unwrap_err();
    assert_eq!(e.code, -libc::ENOENT);
    assert!(e.msg.contains("\"nope\""), "{e}");
    let e = client
        .pool_connect("tank")
        .unwrap()
        .cont_open("nope")
        .unwrap_err();
    assert_eq!(e.code, -libc::ENOENT, "{e}");
    // A dead engine: error names pool, rank and address (once the update
    // has waited for it long enough).
    cont.pool()
        .client()
        .set_retry_window(Duration::from_millis(300));
    let obj = cont.object(ObjectId::new(ObjectClass::S1, 0, 1)).unwrap();
    let r = ranks(&obj, b"d")[0];
    fc.engine(r).down.store(true, Relaxed);
    let e = obj.update_single(b"d", b"a", b"v").unwrap_err();
    assert!(
        e.msg
            .contains(&format!("pool \"tank\" rank {r} ({})", fc.engines[r].addr)),
        "{e}"
    );
    assert!(e.msg.contains("dkey \"d\""), "{e}");
    // Bad arguments.
    assert_eq!(
        obj.update_single(b"", b"a", b"v").unwrap_err().code,
        -libc::EINVAL
    );
    assert_eq!(
        obj.update_array(b"d", b"a", u64::MAX, b"vv")
            .unwrap_err()
            .code,
        -libc::EINVAL
    );
    // Management connection refused.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = dead.local_addr().unwrap().to_string();
    drop(dead);
    let e = Client::connect(&addr, &Security::Insecure).err().unwrap();
    assert!(e.msg.contains(&addr), "{e}");
}

#[test]
fn hung_engine_times_out() {
    let fc = FakeCluster::start(2, 1);
    let t = Arc::new(TcpTransport::new(TcpConfig {
        io_timeout: Duration::from_millis(300),
        ..Default::default()
    }));
    let client = Client::connect_with(&fc.mgmt_addr, &Security::Insecure, t).unwrap();
    let cont = client
        .pool_connect("tank")
        .unwrap()
        .cont_open("c1")
        .unwrap();
    let obj = cont
        .object(ObjectId::new(ObjectClass::Rp2G1, 0, 1))
        .unwrap();
    obj.update_single(b"d", b"a", b"v").unwrap();
    let rk = ranks(&obj, b"d");
    // One replica hangs: the read still succeeds after the timeout.
    fc.engine(rk[0]).hang.store(true, Relaxed);
    fc.engine(rk[1]).hang.store(true, Relaxed);
    let t0 = Instant::now();
    let e = obj.fetch_single(b"d", b"a").unwrap_err();
    assert_eq!(e.code, -libc::ETIMEDOUT, "{e}");
    assert!(t0.elapsed() < Duration::from_secs(5));
    fc.engine(rk[1]).hang.store(false, Relaxed);
    assert_eq!(obj.fetch_single(b"d", b"a").unwrap().unwrap(), b"v");
    fc.engine(rk[0]).hang.store(false, Relaxed);
}

#[test]
fn concurrent_threads_share_a_client() {
    let (_fc, _c, cont) = setup(3, "c1");
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let cont = &cont;
            s.spawn(move || {
                let obj = cont
                    .object(ObjectId::new(ObjectClass::Rp2GX, t, t))
                    .unwrap();
                for i in 0..30u32 {
                    let d = format!("d{i}");
                    let v = pattern(1000 + i as usize, t as u8);
                    obj.update_array(d.as_bytes(), b"a", 0, &v).unwrap();
                    assert_eq!(obj.fetch_array(d.as_bytes(), b"a", 0, v.len()).unwrap(), v);
                }
            });
        }
    });
}

#[test]
fn concurrent_writes_to_one_array() {
    for class in [
        ObjectClass::SX,
        ObjectClass::S1,
        ObjectClass::Ec2P1G1,
        ObjectClass::Rp2G1,
    ] {
        let (_fc, _c, cont) = setup(3, "c1");
        let obj = cont.object(ObjectId::new(class, 0x1234, 99)).unwrap();
        let chunk = 65536usize;
        let w = pattern(8 * chunk, 99);
        obj.update_single(b"d1", b"s", b"hello").unwrap();
        obj.update_array(b"d1", b"arr", 7, &pattern(300000, 7))
            .unwrap();
        std::thread::scope(|s| {
            for i in 0..8 {
                let (obj, w) = (&obj, &w);
                s.spawn(move || {
                    obj.update_array(
                        b"d2",
                        b"async",
                        (i * chunk) as u64,
                        &w[i * chunk..(i + 1) * chunk],
                    )
                    .unwrap()
                });
            }
        });
        let parts: Vec<Vec<u8>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..8)
                .map(|i| {
                    let obj = &obj;
                    s.spawn(move || {
                        obj.fetch_array(b"d2", b"async", (i * chunk) as u64, chunk)
                            .unwrap()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let bad: Vec<usize> = (0..8)
            .filter(|&i| parts[i] != w[i * chunk..(i + 1) * chunk])
            .collect();
        assert!(
            bad.is_empty(),
            "{class}: chunks {bad:?} differ (parallel read)"
        );
        let r = obj.fetch_array(b"d2", b"async", 0, 8 * chunk).unwrap();
        let bad: Vec<usize> = (0..8)
            .filter(|&i| r[i * chunk..(i + 1) * chunk] != w[i * chunk..(i + 1) * chunk])
            .collect();
        assert!(bad.is_empty(), "{class}: chunks {bad:?} differ");
    }
}

/// Shared memory advertised but unusable (socket missing, or not an engine):
/// `auto` falls back to TCP for that engine; `shm` fails instead.
#[test]
fn shm_falls_back_to_tcp() {
    use crate::transport::{MultiTransport, Transport, TransportKind};
    let fc = FakeCluster::start(1, 2);
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("peregrine-rank0.sock");
    // A socket that closes every connection: exists, but is no engine.
    let mute = dir.path().join("mute.sock");
    let listener = std::os::unix::net::UnixListener::bind(&mute).unwrap();
    std::thread::spawn(move || {
        for s in listener.incoming() {
            drop(s);
        }
    });
    for path in [&missing, &mute] {
        let t = Arc::new(MultiTransport::new(TransportKind::Auto));
        let client = Client::connect_with(&fc.mgmt_addr, &Security::Insecure, t.clone()).unwrap();
        let pool = client.pool_connect("tank").unwrap();
        let addr = pool.map().targets[0].addr.clone();
        t.add_route(&addr, path.to_str().unwrap());
        let obj = pool
            .cont_open("c1")
            .unwrap()
            .object(ObjectId::new(ObjectClass::S1, 0, 7))
            .unwrap();
        obj.update_single(b"d", b"a", b"v").unwrap();
        assert_eq!(obj.fetch_single(b"d", b"a").unwrap().unwrap(), b"v");
        let st = t.stats();
        assert_eq!(st.shm_calls, 0, "{path:?}: {st:?}");
        assert_eq!(st.shm_fallbacks, 1, "{path:?}: {st:?}");
        assert!(st.tcp_calls >= 2, "{path:?}: {st:?}");

        // Forced shared memory does not fall back.
        let t = Arc::new(MultiTransport::new(TransportKind::Shm));
        let client = Client::connect_with(&fc.mgmt_addr, &Security::Insecure, t.clone()).unwrap();
        let pool = client.pool_connect("tank").unwrap();
        let obj = pool
            .cont_open("c1")
            .unwrap()
            .object(ObjectId::new(ObjectClass::S1, 0, 7))
            .unwrap();
        let e = obj.fetch_single(b"d", b"a").unwrap_err();
        assert_eq!(e.code, -libc::EHOSTUNREACH, "{e}");
        t.add_route(&addr, path.to_str().unwrap());
        let e = obj.fetch_single(b"d", b"a").unwrap_err();
        assert!(e.msg.contains(path.to_str().unwrap()), "{e}");
        assert_eq!(t.stats().tcp_calls, 0);
    }
    assert_eq!("TCP".parse::<TransportKind>().unwrap(), TransportKind::Tcp);
    assert!("udp".parse::<TransportKind>().is_err());
}

#[test]
fn discards_on_an_engine_without_batched_punches_are_made_one_by_one() {
    // The test double refuses DISCARD, as engines before it do.
    let (_fc, _c, cont) = setup(3, "c1");
    let objs: Vec<Object> = (0..40u64)
        .map(|i| {
            let o = cont.object(ObjectId::new(ObjectClass::SX, 0, i)).unwrap();
            o.update_single(b"d", b"a", b"v").unwrap();
            o.update_single(b"e", b"a", b"w").unwrap();
            o
        })
        .collect();
    crate::Discarding::start(objs.clone()).finish().unwrap();
    for (i, o) in objs.iter().enumerate() {
        assert!(o.list_dkeys().unwrap().is_empty(), "object {i}");
    }
    // Through a queue, settled.
    let q = crate::DiscardQueue::default();
    let o = cont.object(ObjectId::new(ObjectClass::S1, 0, 99)).unwrap();
    o.update_single(b"d", b"a", b"v").unwrap();
    q.push(o.clone());
    q.settle().unwrap();
    assert!(o.list_dkeys().unwrap().is_empty());
}
