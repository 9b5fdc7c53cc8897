//! Integration tests of the store on real device files: values in and
//! out, punches and listings, checksums, malformed requests, batched
//! fetches, buffers, conditional inserts.

mod common;

use common::*;
use peregrine_vos::*;
use std::os::unix::fs::FileExt;
use uuid::Uuid;

const LATEST: u64 = u64::MAX;

#[test]
fn single_and_array_round_trips() {
    let e = env(64, 2);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 7, 1);
    let small = pattern(1, 100);
    let large = pattern(2, 70_000); // three 32 KiB checksum chunks, not block aligned
    update(
        &st,
        &o,
        10,
        "d",
        vec![single("s", &small), single("l", &large)],
    )
    .unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "d", "s").unwrap(), small);
    assert_eq!(get_single(&st, &o, LATEST, "d", "l").unwrap(), large);
    assert_eq!(
        get_single(&st, &o, 9, "d", "s"),
        Err(-libc::ENOENT),
        "before its epoch"
    );
    assert_eq!(get_single(&st, &o, LATEST, "d", "nope"), Err(-libc::ENOENT));

    // A new version replaces the whole value; the old one stays readable at its epoch.
    let small2 = pattern(3, 10);
    update(&st, &o, 20, "d", vec![single("s", &small2)]).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "d", "s").unwrap(), small2);
    assert_eq!(get_single(&st, &o, 15, "d", "s").unwrap(), small);

    // A read of exactly one extent as written returns the client's stored
    // checksum (fetch_iods checks every returned crc against the bytes):
    // the newest of several with the same range, each at its own epoch,
    // and a computed one for part of it or after a partial overwrite.
    let (v1, v2) = (pattern(7, 40_000), pattern(8, 40_000));
    update(&st, &o, 30, "x", vec![extent("e", 4096, &v1)]).unwrap();
    update(&st, &o, 31, "x", vec![extent("e", 4096, &v2)]).unwrap();
    assert_eq!(
        get_array(&st, &o, LATEST, "x", "e", 4096, 40_000)
            .unwrap()
            .0,
        v2
    );
    assert_eq!(
        get_array(&st, &o, 30, "x", "e", 4096, 40_000).unwrap().0,
        v1
    );
    assert_eq!(
        get_array(&st, &o, LATEST, "x", "e", 5000, 100).unwrap().0,
        v2[904..1004]
    );
    update(&st, &o, 32, "x", vec![extent("e", 8192, &small)]).unwrap();
    let mut want = v2.clone();
    want[4096..4196].copy_from_slice(&small);
    assert_eq!(
        get_array(&st, &o, LATEST, "x", "e", 4096, 40_000)
            .unwrap()
            .0,
        want
    );

    // Arrays: unaligned offsets, overlaps, holes, small and large extents.
    let a = pattern(4, 10_000);
    let b = pattern(5, 300);
    let c = pattern(6, 5000);
    update(&st, &o, 10, "d", vec![extent("arr", 1000, &a)]).unwrap();
    update(&st, &o, 11, "d", vec![extent("arr", 4097, &b)]).unwrap();
    update(&st, &o, 12, "d", vec![extent("arr", 20_000, &c)]).unwrap();
    let mut want = vec![0u8; 25_000];
    want[1000..11_000].copy_from_slice(&a);
    want[4097..4397].copy_from_slice(&b);
    want[20_000..25_000].copy_from_slice(&c);
    let (got, size) = get_array(&st, &o, LATEST, "d", "arr", 0, 25_000).unwrap();
    assert_eq!(size, 25_000);
    assert!(
        got == want,
        "array assembled per byte from the newest extent"
    );
    // A sub-range inside one large extent and across the hole.
    let (got, _) = get_array(&st, &o, LATEST, "d", "arr", 10_990, 9020).unwrap();
    assert_eq!(got, want[10_990..20_010]);
    // Read past the end: zeros, size unchanged.
    let (got, size) = get_array(&st, &o, LATEST, "d", "arr", 24_000, 2000).unwrap();
    assert_eq!(
        (&got[..1000], &got[1000..], size),
        (&want[24_000..], &[0u8; 1000][..], 25_000)
    );
    // Snapshot-style read at an older epoch.
    let (got, size) = get_array(&st, &o, 10, "d", "arr", 0, 11_000).unwrap();
    assert_eq!((&got[1000..], size), (&a[..], 11_000));
    assert_eq!(query_size(&st, &o, LATEST, "d", "arr"), 25_000);
    assert_eq!(query_size(&st, &o, 11, "d", "arr"), 11_000);
    assert_eq!(query_size(&st, &o, LATEST, "d", "l"), 70_000);
    // A missing array reads as zeros with size 0.
    assert_eq!(
        get_array(&st, &o, LATEST, "d", "none", 5, 10).unwrap(),
        (vec![0u8; 10], 0)
    );

    // Several iods in one fetch: bulk in iod order.
    let iods = vec![
        Iod {
            akey: b"s".to_vec(),
            kind: IodKind::Single,
            ..Default::default()
        },
        Iod {
            akey: b"arr".to_vec(),
            kind: array(4097),
            len: 300,
            ..Default::default()
        },
        Iod {
            akey: b"zz".to_vec(),
            kind: IodKind::Single,
            ..Default::default()
        },
    ];
    let vals = fetch_iods(&st, &o, LATEST, "d", iods).unwrap();
    assert_eq!(vals[0].1, small2);
    assert_eq!(vals[1].1, b);
    assert!(vals[1].0.crc.is_some());
    assert_eq!(vals[2].0.status, -libc::ENOENT);

    // Everything survives a clean close and reopen.
    st.close();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "d", "l").unwrap(), large);
    assert_eq!(
        get_array(&st, &o, LATEST, "d", "arr", 0, 25_000).unwrap().0,
        want
    );
}

#[test]
fn punches_and_listing_with_anchors() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    // 1500 dkeys, in batches of updates sent concurrently (exercises group commit).
    let rxs: Vec<_> = (0..1500)
        .map(|i| {
            let (iod, v) = single("a", format!("v{i}").as_bytes());
            let req = UpdateReq {
                addr: o.addr(),
                epoch: 10,
                dkey: format!("k{i:05}").into_bytes(),
                iods: vec![iod],
                insert_only: false,
                sync: false,
                dtx: None,
                conditions: Vec::new(),
            };
            st.submit(Request::Update(req, v.into()))
        })
        .collect();
    for rx in rxs {
        rx.recv().unwrap().unwrap();
    }
    let keys = list_all(&st, &o, LATEST, "", 97);
    assert_eq!(keys.len(), 1500);
    assert!(keys.windows(2).all(|w| w[0] < w[1]), "ordered");
    assert_eq!(keys[0], b"k00000");
    let (first, anchor, done) = list(&st, &o, LATEST, "", b"", 10);
    assert_eq!((first.len(), done), (10, false));
    let (next, _, _) = list(&st, &o, LATEST, "", &anchor, 1);
    assert_eq!(next, vec![b"k00010".to_vec()], "strictly after the anchor");
    assert!(
        list(&st, &o, 5, "", b"", 10).0.is_empty(),
        "nothing before epoch 10"
    );

    // Punch one dkey, one akey, then the whole object.
    update(&st, &o, 11, "k00001", vec![single("b", b"bee")]).unwrap();
    punch(&st, &o, 20, "k00000", &[]).unwrap();
    punch(&st, &o, 20, "k00001", &["a"]).unwrap();
    assert_eq!(list_all(&st, &o, LATEST, "", 1000).len(), 1499);
    assert_eq!(
        list_all(&st, &o, 19, "", 1000).len(),
        1500,
        "punch invisible before its epoch"
    );
    assert_eq!(list_all(&st, &o, LATEST, "k00001", 10), vec![b"b".to_vec()]);
    assert_eq!(
        get_single(&st, &o, LATEST, "k00001", "a"),
        Err(-libc::ENOENT)
    );
    assert_eq!(get_single(&st, &o, 19, "k00001", "a").unwrap(), b"v1");
    assert_eq!(
        get_single(&st, &o, LATEST, "k00000", "a"),
        Err(-libc::ENOENT)
    );
    // Rewrite after punch becomes visible again.
    update(&st, &o, 30, "k00000", vec![single("a", b"again")]).unwrap();
    assert_eq!(
        get_single(&st, &o, LATEST, "k00000", "a").unwrap(),
        b"again"
    );
    punch(&st, &o, 40, "", &[]).unwrap();
    assert!(list_all(&st, &o, LATEST, "", 1000).is_empty());
    assert_eq!(list_all(&st, &o, 35, "", 1000).len(), 1500);
    // Aggregation with no snapshots drops everything under the object punch.
    let reclaimed = st.aggregate(pool).unwrap();
    assert!(reclaimed > 1500 * 64, "reclaimed {reclaimed}");
    assert!(
        list_all(&st, &o, 35, "", 1000).is_empty(),
        "old versions gone after aggregation"
    );
    let space = st.pool_space(pool).unwrap();
    assert_eq!(
        space.scm_free, space.scm_total,
        "all scm returned: {space:?}"
    );
}

#[test]
fn checksums_on_update_and_device_corruption() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let (mut iod, v) = single("a", &pattern(1, 100));
    iod.crc = iod.crc.map(|c| c ^ 1);
    let err = update(&st, &o, 10, "d", vec![(iod, v)]).unwrap_err();
    assert_eq!(err.code, -peregrine_proto::CSUM_ERRNO);
    assert!(err.msg.contains("checksum"), "{}", err.msg);
    assert_eq!(
        get_single(&st, &o, LATEST, "d", "a"),
        Err(-libc::ENOENT),
        "nothing stored"
    );

    // A recognizable large value; find it in the device file and flip one byte.
    let mut marker = b"PEREGRINE-CORRUPTION-MARKER-".to_vec();
    marker.extend(pattern(99, 80_000 - marker.len()));
    update(
        &st,
        &o,
        10,
        "d",
        vec![single("big", &marker), extent("arr", 0, &marker)],
    )
    .unwrap();
    update(&st, &o, 10, "d2", vec![single("ok", &pattern(5, 9000))]).unwrap();
    st.close();
    let f = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&e.opts.bdev.path)
        .unwrap();
    let len = f.metadata().unwrap().len();
    let mut found = Vec::new();
    let mut buf = vec![0u8; 1 << 20];
    for off in (0..len).step_by(1 << 20) {
        f.read_exact_at(&mut buf, off).unwrap();
        // Data blocks start block-aligned with the value's first bytes.
        for b in (0..buf.len()).step_by(4096) {
            if buf[b..].starts_with(&marker[..64]) {
                found.push(off + b as u64);
            }
        }
    }
    assert_eq!(found.len(), 2, "both copies on the device");
    for at in &found {
        let pos = at + 40_000; // inside the tenth 4 KiB checksum chunk (36864..40960)
        let mut byte = [0u8];
        f.read_exact_at(&mut byte, pos).unwrap();
        f.write_all_at(&[byte[0] ^ 0x20], pos).unwrap();
    }
    f.sync_all().unwrap();
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(
        get_single(&st, &o, LATEST, "d", "big"),
        Err(-peregrine_proto::CSUM_ERRNO)
    );
    assert_eq!(
        get_array(&st, &o, LATEST, "d", "arr", 39_995, 10),
        Err(-peregrine_proto::CSUM_ERRNO)
    );
    assert_eq!(
        get_array(&st, &o, LATEST, "d", "arr", 30_000, 40_000),
        Err(-peregrine_proto::CSUM_ERRNO),
        "a read spanning the bad chunk fails"
    );
    // Chunks that are intact still read, and other values are unaffected:
    // checksums cover 4 KiB, so even the chunks right next to the bad one do.
    assert_eq!(
        get_array(&st, &o, LATEST, "d", "arr", 100, 1000).unwrap().0,
        marker[100..1100]
    );
    assert_eq!(
        get_array(&st, &o, LATEST, "d", "arr", 32_768, 4096)
            .unwrap()
            .0,
        marker[32_768..36_864]
    );
    assert_eq!(
        get_array(&st, &o, LATEST, "d", "arr", 40_960, 30_000)
            .unwrap()
            .0,
        marker[40_960..70_960]
    );
    assert_eq!(
        get_single(&st, &o, LATEST, "d2", "ok").unwrap(),
        pattern(5, 9000)
    );
}

#[test]
fn malformed_requests_get_errnos() {
    let e = env(32, 2);
    let (st, pool, cont) = open_with_pool(&e, MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let expect = |r: Reply, code: i32, words: &str| {
        let err = r.unwrap_err();
        assert_eq!(err.code, code, "{}", err.msg);
        assert!(err.msg.contains(words), "{:?} lacks {words:?}", err.msg);
    };
    let (iod, v) = single("a", b"value");
    let upd = |addr, bulk: Vec<u8>| {
        Request::Update(
            UpdateReq {
                addr,
                epoch: 1,
                dkey: b"d".to_vec(),
                iods: vec![iod.clone()],
                insert_only: false,
                sync: false,
                dtx: None,
                conditions: Vec::new(),
            },
            bulk.into(),
        )
    };
    // A missing address, a malformed UUID, an unknown value kind: the
    // engine's conversion refuses them (engine/src/request/tests.rs).
    let mut a = o.addr();
    a.target = 7;
    expect(wait(&st, upd(a, v.clone())), -libc::EINVAL, "target 7");
    let other = Uuid::new_v4();
    let mut a = o.addr();
    a.pool = other;
    expect(
        wait(&st, upd(a, v.clone())),
        -libc::ENOENT,
        &other.to_string(),
    );
    expect(
        wait(&st, upd(o.addr(), b"va".to_vec())),
        -libc::EINVAL,
        "shorter",
    );
    // The store still works.
    wait(&st, upd(o.addr(), v.clone())).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "d", "a").unwrap(), b"value");
    assert_eq!(st.pool_space(other).unwrap_err().errno(), -libc::ENOENT);
}

#[test]
fn storage_is_send_and_sync() {
    fn check<T: Send + Sync>() {}
    check::<Storage>();
}

/// Many fetches queued at once are served as one batch of device reads:
/// small reads packed into the registered buffers, large ones split over
/// them, more than the buffers hold split into groups; each reply is exact,
/// also with updates of the same batch in between (which fetches queued
/// before them do not see) and a corrupt chunk failing only its own iod.
#[test]
fn batched_fetches_are_exact() {
    let e = env(256, 1);
    let (st, pool, cont) = open_with_pool(&e, 120 * MIB);
    let o = Obj::new(pool, cont, 1, 0);
    let small = pattern(1, 4 * MIB as usize + 1000);
    let big = pattern(2, 40 * MIB as usize + 123);
    update(&st, &o, 10, "d", vec![extent("a", 0, &small)]).unwrap();
    update(&st, &o, 10, "big", vec![single("v", &big)]).unwrap();
    let fetch = |dkey: &str, iods: Vec<Iod>| {
        st.submit(Request::Fetch(FetchReq {
            addr: o.addr(),
            epoch: LATEST,
            dkey: dkey.as_bytes().to_vec(),
            iods,
        }))
    };
    let arr = |off: u64, len: u64| Iod {
        akey: b"a".to_vec(),
        kind: array(off),
        len,
        ..Default::default()
    };
    let mut pending = Vec::new();
    for i in 0..600u64 {
        // Unaligned offsets and lengths, 4 KiB-ish reads, some past the end (zeros).
        let off = (i * 7919 * 13) % (small.len() as u64 + 8192);
        let len = 1 + (i * 131) % 9000;
        let mut want = vec![0u8; len as usize];
        for (k, w) in want.iter_mut().enumerate() {
            if let Some(b) = small.get(off as usize + k) {
                *w = *b;
            }
        }
        pending.push((fetch("d", vec![arr(off, len), arr(0, 10)]), want, true));
        if i % 100 == 0 {
            let v = Iod {
                akey: b"v".to_vec(),
                kind: IodKind::Single,
                ..Default::default()
            };
            pending.push((fetch("big", vec![v]), big.clone(), false));
            // An update in the middle of the batch: later fetches of "d" at
            // LATEST see the old value until it commits, so write elsewhere.
            let (iod, v) = extent("a", 0, &pattern(3, 9000));
            let req = UpdateReq {
                addr: o.addr(),
                epoch: 11,
                dkey: b"other".to_vec(),
                iods: vec![iod],
                insert_only: false,
                sync: false,
                dtx: None,
                conditions: Vec::new(),
            };
            pending.push((st.submit(Request::Update(req, v.into())), Vec::new(), false));
        }
    }
    for (rx, want, two) in pending {
        let (resp, bulk) = rx.recv().unwrap().unwrap();
        let Answer::Fetch(values) = resp else {
            assert!(want.is_empty(), "update reply");
            continue;
        };
        assert!(values.iter().all(|v| v.status == 0));
        let n = want.len();
        assert_eq!(&bulk[..n], &want[..], "fetched bytes");
        if two {
            assert_eq!(&bulk[n..], &small[..10]);
        }
        if let Some(crc) = values[0].crc {
            assert_eq!(crc, peregrine_isal::crc32c(&bulk[..n]));
        }
    }
    assert_eq!(
        get_array(&st, &o, LATEST, "other", "a", 0, 9000).unwrap().0,
        pattern(3, 9000)
    );
}

fn hugepages_free() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("HugePages_Free:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// With hugepages on the machine, a target's registered buffers come from
/// them. Without any, the test reserves some (as root) and gives them back.
#[test]
fn buffers_come_from_hugepages_when_the_machine_has_them() {
    const KNOB: &str = "/proc/sys/vm/nr_hugepages";
    let original = std::fs::read_to_string(KNOB).unwrap_or_default();
    let mut raised = false;
    if hugepages_free() < 32 {
        let n: u64 = original.trim().parse().unwrap_or(0);
        raised = std::fs::write(KNOB, format!("{}", n + 64)).is_ok();
    }
    let free_before = hugepages_free();
    if free_before < 32 {
        eprintln!("SKIP: no hugepages available and cannot reserve any (not root?)");
        return;
    }
    let e = env(64, 1);
    let mut opts = e.opts.clone();
    opts.hugepages = true;
    let st = Storage::open(&opts).unwrap();
    let used = free_before - hugepages_free();
    st.close();
    if raised {
        let _ = std::fs::write(KNOB, original.trim());
    }
    assert!(
        used >= 16,
        "the target's 16 x 2 MiB buffers should be hugepages; {used} pages taken"
    );
}

fn insert_req(o: &Obj, epoch: u64, dkey: &str, akey: &str, v: &[u8]) -> Request {
    let (iod, bulk) = single(akey, v);
    let req = UpdateReq {
        addr: o.addr(),
        epoch,
        dkey: dkey.as_bytes().to_vec(),
        iods: vec![iod],
        insert_only: true,
        sync: false,
        dtx: None,
        conditions: Vec::new(),
    };
    Request::Update(req, bulk.into())
}

#[test]
fn insert_only_is_a_conditional_insert() {
    let e = env(64, 1);
    let (st, pool, cont) = open_with_pool(&e, 16 * MIB);
    let o = Obj::new(pool, cont, 9, 0);

    // New akey: stored.
    wait(&st, insert_req(&o, 10, "d", "a", b"one")).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "d", "a").unwrap(), b"one");
    // Existing akey: EEXIST naming the keys, nothing changed (not even the
    // other, new akey of the same request).
    let (i1, v1) = single("b", b"new");
    let (i2, v2) = single("a", b"two");
    let req = UpdateReq {
        addr: o.addr(),
        epoch: 20,
        dkey: b"d".to_vec(),
        iods: vec![i1, i2],
        insert_only: true,
        sync: false,
        dtx: None,
        conditions: Vec::new(),
    };
    let err = wait(&st, Request::Update(req, [v1, v2].concat().into())).unwrap_err();
    assert_eq!(err.code, -libc::EEXIST, "{err}");
    assert!(
        err.msg.contains("\"d\"") && err.msg.contains("\"a\""),
        "{err}"
    );
    assert_eq!(get_single(&st, &o, LATEST, "d", "a").unwrap(), b"one");
    assert_eq!(get_single(&st, &o, LATEST, "d", "b"), Err(-libc::ENOENT));
    // After a punch (akey or dkey level) the insert succeeds again.
    punch(&st, &o, 30, "d", &["a"]).unwrap();
    wait(&st, insert_req(&o, 40, "d", "a", b"three")).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "d", "a").unwrap(), b"three");
    punch(&st, &o, 50, "d", &[]).unwrap();
    wait(&st, insert_req(&o, 60, "d", "a", b"four")).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "d", "a").unwrap(), b"four");
    // A plain update still overwrites.
    update(&st, &o, 70, "d", vec![single("a", b"five")]).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "d", "a").unwrap(), b"five");

    // Pipelined: two conditional inserts per key queued back to back (so
    // they mostly share a batch): exactly one of each pair wins, and the
    // stored value is the winner's.
    let n = 100;
    let mut pending = Vec::new();
    for i in 0..n {
        let k = format!("k{i}");
        for w in 0..2u8 {
            pending.push((
                i,
                w,
                st.submit(insert_req(&o, 100 + i as u64, &k, "inode", &[w])),
            ));
        }
    }
    let mut wins = vec![Vec::new(); n];
    for (i, w, rx) in pending {
        match rx.recv().unwrap() {
            Ok(_) => wins[i].push(w),
            Err(e) => assert_eq!(e.code, -libc::EEXIST, "{e}"),
        }
    }
    for (i, w) in wins.iter().enumerate() {
        assert_eq!(w.len(), 1, "key k{i}: winners {w:?}");
        let k = format!("k{i}");
        assert_eq!(
            get_single(&st, &o, LATEST, &k, "inode").unwrap(),
            vec![w[0]]
        );
    }
    // Within one batch, a queued punch makes room and a queued update takes it.
    let rp = st.submit(Request::Punch(PunchReq {
        addr: o.addr(),
        epoch: 1000,
        dkey: b"k0".to_vec(),
        akeys: vec![],
        sync: false,
        dtx: None,
        conditions: Vec::new(),
        more: Vec::new(),
    }));
    let ri = st.submit(insert_req(&o, 1001, "k0", "inode", b"x"));
    let ru = st.submit({
        let (iod, bulk) = single("inode", b"y");
        Request::Update(
            UpdateReq {
                addr: o.addr(),
                epoch: 1002,
                dkey: b"k1".to_vec(),
                iods: vec![iod],
                insert_only: false,
                sync: false,
                dtx: None,
                conditions: Vec::new(),
            },
            bulk.into(),
        )
    });
    let ri2 = st.submit(insert_req(&o, 1003, "k1", "inode", b"z"));
    rp.recv().unwrap().unwrap();
    ri.recv().unwrap().unwrap();
    ru.recv().unwrap().unwrap();
    assert_eq!(ri2.recv().unwrap().unwrap_err().code, -libc::EEXIST);
    assert_eq!(get_single(&st, &o, LATEST, "k0", "inode").unwrap(), b"x");
    assert_eq!(get_single(&st, &o, LATEST, "k1", "inode").unwrap(), b"y");

    // The outcome survives replay.
    drop(st);
    let st = Storage::open(&e.opts).unwrap();
    assert_eq!(get_single(&st, &o, LATEST, "k1", "inode").unwrap(), b"y");
    let err = wait(&st, insert_req(&o, 2000, "k1", "inode", b"w")).unwrap_err();
    assert_eq!(err.code, -libc::EEXIST);
}
