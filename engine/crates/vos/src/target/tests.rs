//! Unit tests of the target pipeline (fetches in flight, blocks freed under
//! them, writes started ahead).

use super::*;
use crate::{BdevClass, BdevSpec, FetchReq, Iod, IodKind, ScanState, StorageOptions, UpdateReq};

const MIB: u64 = 1 << 20;

fn addr(pool: Uuid) -> Address {
    Address {
        pool,
        cont: Uuid::nil(),
        oid: crate::ObjectId { hi: 1, lo: 2 },
        shard: 0,
        target: 0,
    }
}

fn iod(len: u64) -> Iod {
    Iod {
        akey: b"v".to_vec(),
        kind: IodKind::Single,
        len,
        ..Default::default()
    }
}

fn array(offset: u64) -> IodKind {
    IodKind::Array {
        offset,
        unchanged_since: None,
    }
}

fn update(pool: Uuid, byte: u8, len: usize) -> Request {
    let u = UpdateReq {
        addr: addr(pool),
        epoch: 1,
        dkey: b"d".to_vec(),
        iods: vec![iod(len as u64)],
        insert_only: false,
        sync: false,
        dtx: None,
        conditions: Vec::new(),
    };
    Request::Update(u, vec![byte; len].into())
}

fn open_target(dir: &std::path::Path) -> (Target, Uuid) {
    let opts = StorageOptions {
        bdev: BdevSpec {
            class: BdevClass::File,
            path: dir.join("nvme.img"),
            size: 64 * MIB,
        },
        scm_bytes: 16 * MIB,
        targets: 1,
        hugepages: false,
        flush_interval: crate::DEFAULT_FLUSH_INTERVAL,
        poll: crate::DEFAULT_POLL,
        read_spin: crate::DEFAULT_READ_SPIN,
        scrub_rate: crate::DEFAULT_SCRUB_RATE,
        scm_value_max: crate::SCM_VALUE_MAX,
        wal_io: crate::WalIo::PageCache,
    };
    crate::format(&opts, "t", 0, false).unwrap();
    let ScanState::Formatted(sb) = crate::scan(&opts.bdev).unwrap() else {
        panic!("not formatted")
    };
    let mut t = Target::open(
        sb,
        &opts,
        0,
        8 * MIB,
        Default::default(),
        Default::default(),
    )
    .unwrap();
    let pool = Uuid::new_v4();
    t.control(Ctl::PoolCreate {
        pool,
        scm: 4 * MIB,
        nvme: 32 * MIB,
    })
    .unwrap();
    (t, pool)
}

/// A fetch whose bytes are whole chunks of one extent is read from the
/// device straight into its source's area (the reply says so and
/// carries no bytes); any other fetch that offers an area is served from
/// the target's buffers as usual, with the same bytes.
#[test]
fn aligned_fetches_are_read_straight_into_the_reply_area() {
    let dir = tempfile::tempdir().unwrap();
    let (mut t, pool) = open_target(dir.path());
    let len = (3 * MIB + 5000) as usize; // pieces of 2 MiB and a short chunk at the end
    let value: Vec<u8> = (0..len).map(|i| (i * 7 % 251) as u8).collect();
    let u = UpdateReq {
        addr: addr(pool),
        epoch: 1,
        dkey: b"d".to_vec(),
        iods: vec![Iod {
            kind: array(0),
            len: len as u64,
            crc: Some(peregrine_isal::crc32c(&value)),
            ..iod(0)
        }],
        insert_only: false,
        sync: false,
        dtx: None,
        conditions: Vec::new(),
    };
    let u = Request::Update(u, value.clone().into());
    t.handle(u, Responder(None));
    t.drain();

    let layout = std::alloc::Layout::from_size_align(8 * MIB as usize, 4096).unwrap();
    // SAFETY: a zeroed allocation, freed at the end of the test.
    let area = unsafe { std::alloc::alloc_zeroed(layout) };
    let fetch = |off: u64, n: u64| {
        let (tx, rx) = std::sync::mpsc::channel();
        let f = FetchReq {
            addr: addr(pool),
            epoch: u64::MAX,
            dkey: b"d".to_vec(),
            iods: vec![Iod {
                kind: array(off),
                len: n,
                ..iod(0)
            }],
        };
        (f, tx, rx)
    };
    for (off, n, direct) in [
        (0, len as u64, true),
        (2 * MIB, MIB, true),
        (4096, 100, true),
        (100, 4096, false),
        (len as u64 - 10, 20, false), // past the end: zeros follow
    ] {
        let (f, tx, rx) = fetch(off, n);
        let reply = Responder(Some(Box::new(move |r: crate::ReplyRef<'_>| {
            let (resp, g) = r.unwrap();
            let bytes = (!g.is_in_place()).then(|| g.into_vec());
            tx.send((resp, bytes)).unwrap();
        })));
        let area_len = 8 * MIB as usize;
        t.fetch.queued.push((
            f,
            reply,
            Some(ReplyArea {
                addr: area as usize,
                len: area_len,
            }),
        ));
        t.drain();
        let (resp, bytes) = rx.recv().unwrap();
        assert_eq!(
            bytes.is_none(),
            direct,
            "fetch {off}+{n}: read into the area"
        );
        let Answer::Fetch(values) = resp else {
            panic!("{resp:?}")
        };
        let mut want = vec![0u8; n as usize];
        let have = value.len().saturating_sub(off as usize).min(n as usize);
        want[..have].copy_from_slice(&value[off as usize..off as usize + have]);
        let got = match bytes {
            None => {
                // SAFETY: the area holds at least n bytes, written by the device.
                unsafe { std::slice::from_raw_parts(area, n as usize) }.to_vec()
            }
            Some(b) => b,
        };
        assert_eq!(values[0].status, 0);
        assert!(got == want, "bytes of fetch {off}+{n}");
        assert_eq!(
            values[0].crc,
            Some(peregrine_isal::crc32c(&want)),
            "crc of {off}+{n}"
        );
        assert!(
            t.dev.regions_idle(),
            "fetch {off}+{n}: every region given back"
        );
    }
    // SAFETY: allocated above with this layout.
    unsafe { std::alloc::dealloc(area, layout) };
}

/// Deterministic form of tests/pipeline.rs: an overwrite applied while a
/// fetch's read of the old value is in flight (not reaped) does not give
/// the old blocks back to the allocator until that fetch is done.
#[test]
fn blocks_freed_under_a_read_in_flight_wait_for_it() {
    let dir = tempfile::tempdir().unwrap();
    let (mut t, pool) = open_target(dir.path());
    let len = 64 << 10;
    let blocks = (len as u64) / BLOCK;
    t.handle(update(pool, 1, len), Responder(None));
    t.drain();
    let free = t.alloc.free_blocks();

    let (rtx, rrx) = std::sync::mpsc::channel();
    let fetch = FetchReq {
        addr: addr(pool),
        epoch: u64::MAX,
        dkey: b"d".to_vec(),
        iods: vec![iod(len as u64)],
    };
    let reply = Responder(Some(Box::new(move |r: crate::ReplyRef<'_>| {
        rtx.send(r.map(|(resp, bulk)| (resp, bulk.into_vec())))
            .unwrap()
    })));
    t.fetch.queued.push((fetch, reply, None));
    t.start_fetches();
    assert_eq!(t.fetch.jobs.len(), 1, "the fetch is in flight");

    // The same epoch: the new value replaces the old one and frees its blocks.
    t.handle(update(pool, 2, len), Responder(None));
    for op in std::mem::take(&mut t.commit.open.ops) {
        t.apply(op, t.wal.seq + 1);
    }
    // As if a flushed record said that one was flushed.
    t.flush.settled = t.wal.seq + 1;
    t.settle();
    assert_eq!(
        t.alloc.free_blocks(),
        free - blocks,
        "the old value's blocks must stay taken while the read is in flight"
    );
    t.drain();
    assert_eq!(
        t.alloc.free_blocks(),
        free,
        "released once the fetch is done"
    );
    let (_, bytes) = rrx.recv().unwrap().unwrap();
    assert_eq!(bytes, vec![1u8; len], "the fetch read the old value");
}

/// A large value goes to the device piece by piece while it is copied
/// in, before its checksum has been checked. When the check then fails,
/// the update is refused, and its blocks stay taken until those writes
/// are done (no later value is written to a block with a write in flight).
#[test]
fn blocks_written_ahead_for_a_refused_update_wait_for_those_writes() {
    let dir = tempfile::tempdir().unwrap();
    let (mut t, pool) = open_target(dir.path());
    let free = t.alloc.free_blocks();
    let len = MIB as usize;
    let Request::Update(mut u, bulk) = update(pool, 3, len) else {
        unreachable!()
    };
    u.iods[0].crc = Some(peregrine_isal::crc32c(&vec![3u8; len]) ^ 1);
    let (tx, rx) = std::sync::mpsc::channel();
    let reply = Responder(Some(Box::new(move |r: crate::ReplyRef<'_>| {
        tx.send(r.map(|_| ())).unwrap()
    })));
    t.handle(Request::Update(u, bulk), reply);
    let e = rx.try_recv().expect("answered at once").unwrap_err();
    assert_eq!(e.code, -peregrine_proto::CSUM_ERRNO, "{e}");
    assert_eq!(
        t.commit.ahead.len(),
        len / WRITE_PIECE,
        "every piece was started ahead"
    );
    assert_eq!(
        t.alloc.free_blocks(),
        free - MIB / BLOCK,
        "the blocks stay taken while writes to them are in flight"
    );
    t.drain();
    assert!(t.commit.ahead.is_empty() && t.commit.orphans.is_empty());
    assert_eq!(t.alloc.free_blocks(), free, "given back once they are done");
    // Nothing was committed, and the target carries on.
    assert!(t.commit.commits.is_empty() && t.commit.open.ops.is_empty());
    t.handle(update(pool, 4, len), Responder(None));
    t.drain();
    assert_eq!(t.alloc.free_blocks(), free - MIB / BLOCK);
}

/// A scrubbing step reads at most [`scrub::STEP_READS`] extents, however
/// small they are (each read blocks the target), and the steps from each
/// one's stop cover every extent once.
#[test]
fn a_scrubbing_step_reads_a_bounded_number_of_extents() {
    let dir = tempfile::tempdir().unwrap();
    let (mut t, pool) = open_target(dir.path());
    let n = 3 * scrub::STEP_READS + 5;
    for i in 0..n {
        let u = UpdateReq {
            addr: addr(pool),
            epoch: 1,
            dkey: format!("d{i}").into_bytes(),
            iods: vec![iod(BLOCK)],
            insert_only: false,
            sync: false,
            dtx: None,
            conditions: Vec::new(),
        };
        t.handle(
            Request::Update(u, vec![i as u8; BLOCK as usize].into()),
            Responder(None),
        );
    }
    t.drain();
    let mut blocks = std::collections::BTreeSet::new();
    let mut after = None;
    let mut steps = 0;
    loop {
        let w = scrub::gather(&t.index, after.as_ref(), 1 << 20);
        assert!(
            w.items.len() <= scrub::STEP_READS,
            "{} reads in a step",
            w.items.len()
        );
        blocks.extend(w.items.iter().map(|it| it.block));
        steps += 1;
        match w.stop {
            Some(p) => after = Some(p),
            None => break,
        }
    }
    assert_eq!(blocks.len(), n, "every extent once");
    assert!(steps >= 4, "{steps} steps");
}

/// Fetches started together are answered one by one, each once its own
/// reads are done: one served from RAM does not wait for another's device
/// read, and a fetch's regions go back with its reply.
#[test]
fn a_fetch_is_answered_when_its_own_reads_are_done() {
    let dir = tempfile::tempdir().unwrap();
    let (mut t, pool) = open_target(dir.path());
    let len = 64 << 10;
    t.handle(update(pool, 1, len), Responder(None));
    // A small value under another dkey stays in RAM.
    let small = UpdateReq {
        addr: addr(pool),
        epoch: 1,
        dkey: b"e".to_vec(),
        iods: vec![iod(100)],
        insert_only: false,
        sync: false,
        dtx: None,
        conditions: Vec::new(),
    };
    t.handle(
        Request::Update(small, vec![2u8; 100].into()),
        Responder(None),
    );
    t.drain();

    let fetch = |dkey: &[u8], n: u64| {
        let (tx, rx) = std::sync::mpsc::channel();
        let f = FetchReq {
            addr: addr(pool),
            epoch: u64::MAX,
            dkey: dkey.to_vec(),
            iods: vec![iod(n)],
        };
        let reply = Responder(Some(Box::new(move |r: crate::ReplyRef<'_>| {
            tx.send(r.map(|(_, bulk)| bulk.into_vec())).unwrap()
        })));
        ((f, reply, None), rx)
    };
    let (on_device, device_rx) = fetch(b"d", len as u64);
    let (in_ram, ram_rx) = fetch(b"e", 100);
    t.fetch.queued.extend([on_device, in_ram]);
    t.start_fetches();
    assert_eq!(t.fetch.jobs.len(), 1, "the device read is in flight");
    assert_eq!(
        ram_rx.try_recv().expect("answered at once").unwrap(),
        vec![2u8; 100]
    );
    assert!(device_rx.try_recv().is_err(), "not before its read is done");
    t.drain();
    assert_eq!(device_rx.recv().unwrap().unwrap(), vec![1u8; len]);
    assert!(t.fetch.jobs.is_empty());
    assert!(t.dev.regions_idle(), "every region given back");
}
