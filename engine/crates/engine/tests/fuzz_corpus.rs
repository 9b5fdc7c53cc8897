//! The fuzz targets of `engine/fuzz` on stable Rust, in `cargo test`: every
//! file of their corpora, then a few thousand seeded mutations of them per
//! target, through the same entry points (`peregrine_engine::fuzz`). Past
//! crashes are kept as corpus files and checked here for the error they
//! must now give.
//!
//! `PEREGRINE_WRITE_CORPUS=1 cargo test -p peregrine-engine --test fuzz_corpus`
//! (re)writes the seed and regression files below into `engine/fuzz/corpus`.

use peregrine_engine::fuzz;
use peregrine_proto::data;
use peregrine_proto::frame::{self, decode_frame, Opcode, HEADER_LEN};
use peregrine_proto::mgmt::JoinReq;
use peregrine_proto::shm::{Hello, RemotePart};
use prost::Message;
use rand::{rngs::StdRng, Rng, SeedableRng};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;

type Entry = fn(&[u8]) -> Result<(), String>;

fn frame_entry(b: &[u8]) -> Result<(), String> {
    fuzz::frame_request(b).map(|_| ())
}

const TARGETS: [(&str, Entry); 3] = [
    ("frame_decode", frame_entry),
    ("join", fuzz::join),
    ("shm_hello", fuzz::shm_hello),
];

fn corpus_dir(target: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

fn addr(target: u32) -> Option<data::Address> {
    Some(data::Address {
        pool: vec![1; 16],
        cont: vec![2; 16],
        oid: Some(data::ObjectId { hi: 7, lo: 7 }),
        shard: 0,
        target,
        map_version: 1,
        ..Default::default()
    })
}

fn array(len: u64) -> data::Iod {
    data::Iod {
        akey: b"absent".to_vec(),
        kind: data::ValueKind::Array as i32,
        offset: 0,
        len,
        ..Default::default()
    }
}

fn req_frame(op: Opcode, msg: &impl Message, bulk: &[u8]) -> Vec<u8> {
    frame::encode_frame(op, 0, 1, &msg.encode_to_vec(), &[bulk]).unwrap()
}

fn fetch_frame(iods: Vec<data::Iod>) -> Vec<u8> {
    let f = data::FetchReq {
        addr: addr(0),
        epoch: u64::MAX,
        dkey: b"d".to_vec(),
        iods,
    };
    req_frame(Opcode::Fetch, &f, &[])
}

fn join(rank: u32) -> JoinReq {
    JoinReq {
        rank,
        uuid: "6f1c1d7e-3a52-4d43-9d0b-2d8b1a3f7c11".into(),
        control_addr: "10.0.0.1:10001".into(),
        data_addr: "10.0.0.1:10002".into(),
        fault_domain: "/host1".into(),
        targets: 4,
        system: fuzz::FUZZ_SYSTEM.into(),
        state: "ready".into(),
        shm_path: "/run/peregrine/peregrine-rank1.sock".into(),
        want_snapshots: true,
    }
}

/// What a kept input must give: `Ok`, or an error containing each string.
enum Want {
    Ok,
    Err(&'static [&'static str]),
}

/// The seeds and the past crashes: (target, file name, bytes, outcome).
fn kept() -> Vec<(&'static str, String, Vec<u8>, Want)> {
    let mut v = vec![];
    let mut frame = |name: &str, bytes: Vec<u8>, want: Want| {
        v.push(("frame_decode", name.to_string(), bytes, want));
    };
    frame(
        "seed-ping",
        frame::encode_frame(Opcode::Ping, 0, 1, &[], &[]).unwrap(),
        Want::Ok,
    );
    let update = data::UpdateReq {
        addr: addr(1),
        epoch: 5,
        dkey: b"d".to_vec(),
        iods: vec![
            data::Iod {
                akey: b"s".to_vec(),
                kind: data::ValueKind::Single as i32,
                len: 3,
                has_crc: true,
                crc: peregrine_isal::crc32c(b"abc"),
                ..Default::default()
            },
            data::Iod {
                offset: 4096,
                ..array(5)
            },
        ],
        ..Default::default()
    };
    frame(
        "seed-update",
        req_frame(Opcode::Update, &update, b"abcdefgh"),
        Want::Ok,
    );
    frame("seed-fetch", fetch_frame(vec![array(4096)]), Want::Ok);
    let limit = peregrine_proto::MAX_IO_BYTES;
    frame(
        "seed-fetch-at-the-limit",
        fetch_frame((0..64).map(|_| array(limit / 64)).collect()),
        Want::Ok,
    );
    // Issue 20: 1.6 KB that made a release engine allocate 100 GiB and abort.
    frame(
        "regress-fetch-100x1GiB-absent-akey",
        fetch_frame((0..100).map(|_| array(1 << 30)).collect()),
        Want::Err(&["107374182400", "MAX_IO_BYTES", "67108864"]),
    );
    frame(
        "regress-fetch-lengths-overflow",
        fetch_frame(vec![array(u64::MAX), array(u64::MAX)]),
        Want::Err(&["MAX_IO_BYTES"]),
    );
    let big_update = data::UpdateReq {
        iods: vec![array(limit), array(1)],
        ..update.clone()
    };
    frame(
        "regress-update-iods-over-the-limit",
        req_frame(Opcode::Update, &big_update, b""),
        Want::Err(&["update", "MAX_IO_BYTES"]),
    );
    let too_many = data::PunchReq {
        addr: addr(0),
        more: (0..=peregrine_proto::MAX_DISCARD_MORE as u64)
            .map(|lo| data::ShardId {
                oid: Some(data::ObjectId { hi: 1, lo }),
                shard: 0,
            })
            .collect(),
        ..Default::default()
    };
    frame(
        "regress-discard-over-the-limit",
        req_frame(Opcode::Discard, &too_many, b""),
        Want::Err(&["discard", "at most 255"]),
    );
    for (name, op, msg) in [
        (
            "seed-punch",
            Opcode::Punch,
            data::PunchReq {
                addr: addr(0),
                dkey: b"d".to_vec(),
                akeys: vec![b"a".to_vec()],
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "seed-discard",
            Opcode::Discard,
            data::PunchReq {
                addr: addr(0),
                more: vec![data::ShardId {
                    oid: Some(data::ObjectId { hi: 1, lo: 2 }),
                    shard: 0,
                }],
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "seed-list",
            Opcode::List,
            data::ListReq {
                addr: addr(0),
                max: 10,
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "seed-query-size",
            Opcode::QuerySize,
            data::QuerySizeReq {
                addr: addr(0),
                dkey: b"d".to_vec(),
                akey: b"a".to_vec(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "seed-flush",
            Opcode::Flush,
            data::FlushReq { addr: addr(0) }.encode_to_vec(),
        ),
        (
            "seed-list-changed",
            Opcode::ListChanged,
            data::ListChangedReq {
                addr: addr(0),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "seed-list-records",
            Opcode::ListRecords,
            data::ListRecordsReq {
                addr: addr(0),
                dkey: b"d".to_vec(),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "seed-dtx-decide",
            Opcode::DtxDecide,
            data::DtxDecideReq {
                addr: addr(0),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
        (
            "seed-dtx-query",
            Opcode::DtxQuery,
            data::DtxQueryReq {
                addr: addr(0),
                id: Some(data::DtxId { hi: 7, lo: 9 }),
                ..Default::default()
            }
            .encode_to_vec(),
        ),
    ] {
        frame(
            name,
            frame::encode_frame(op, 0, 2, &msg, &[]).unwrap(),
            Want::Ok,
        );
    }

    let mut mgmt = |name: &str, j: JoinReq, want: Want| {
        v.push(("join", name.to_string(), j.encode_to_vec(), want));
    };
    mgmt("seed-join", join(1), Want::Ok);
    mgmt(
        "seed-join-stopping",
        JoinReq {
            state: "stopping".into(),
            shm_path: String::new(),
            ..join(2)
        },
        Want::Ok,
    );
    // Issue 20: huge fields overflowed the management state's slot (the
    // real one was 3 MiB; anything past the bound is the same case).
    mgmt(
        "regress-join-huge-control-addr",
        JoinReq {
            control_addr: format!("{}:1", "x".repeat(4096)),
            ..join(9)
        },
        Want::Err(&["control_addr"]),
    );
    mgmt(
        "regress-join-huge-fault-domain",
        JoinReq {
            fault_domain: "/".repeat(4096),
            ..join(9)
        },
        Want::Err(&["fault_domain"]),
    );
    // Issue 20: a forged rank with 0 targets (PoolCreate divided by zero).
    mgmt(
        "regress-join-zero-targets",
        JoinReq {
            targets: 0,
            ..join(7)
        },
        Want::Err(&["targets"]),
    );
    // Issue 20: an empty system name skipped the name check.
    mgmt(
        "regress-join-empty-system",
        JoinReq {
            system: String::new(),
            ..join(8)
        },
        Want::Err(&["system"]),
    );

    let hello = Hello {
        probe: 0x7fff_0000_1000,
        nonce: 42,
        ..Hello::standard(1 << 20, 1)
    };
    v.push((
        "shm_hello",
        "seed-hello".into(),
        hello.encode().to_vec(),
        Want::Ok,
    ));
    v.push((
        "shm_hello",
        "seed-ack".into(),
        peregrine_proto::shm::ack("127.0.0.1:10002", 1).to_vec(),
        Want::Err(&["hello"]),
    ));
    v.push((
        "shm_hello",
        "seed-remote-parts".into(),
        RemotePart::encode_all(&[
            RemotePart {
                addr: 0x7fff_0000_0000,
                len: 4096,
            },
            RemotePart {
                addr: 0x7fff_0001_0000,
                len: 100,
            },
        ]),
        Want::Err(&["hello"]),
    ));
    v
}

/// Run `entry` on `input`; a panic fails with the input kept in a file.
fn run(target: &str, entry: Entry, input: &[u8], what: &str) -> Result<(), String> {
    match catch_unwind(AssertUnwindSafe(|| entry(input))) {
        Ok(r) => r,
        Err(_) => {
            let dir = std::env::temp_dir()
                .join("peregrine-fuzz-crashes")
                .join(target);
            std::fs::create_dir_all(&dir).unwrap();
            let path = dir.join(format!("crash-{:016x}", peregrine_isal::crc32c(input)));
            std::fs::write(&path, input).unwrap();
            panic!(
                "{target}: {what} panicked; input ({} bytes) kept in {} (add it to {})",
                input.len(),
                path.display(),
                corpus_dir(target).display()
            )
        }
    }
}

#[test]
fn kept_inputs_give_their_outcome_and_are_in_the_corpus() {
    let write = std::env::var_os("PEREGRINE_WRITE_CORPUS").is_some();
    for (target, name, bytes, want) in kept() {
        let entry = TARGETS.iter().find(|t| t.0 == target).unwrap().1;
        let got = run(target, entry, &bytes, &name);
        match (&want, &got) {
            (Want::Ok, Ok(())) => {}
            (Want::Err(needles), Err(e)) if needles.iter().all(|n| e.contains(n)) => {}
            _ => panic!("{target}/{name}: got {got:?}"),
        }
        let path = corpus_dir(target).join(&name);
        if write {
            std::fs::create_dir_all(corpus_dir(target)).unwrap();
            std::fs::write(&path, &bytes).unwrap();
        }
        let stored = std::fs::read(&path).unwrap_or_else(|e| {
            panic!(
                "{}: {e} (PEREGRINE_WRITE_CORPUS=1 writes it)",
                path.display()
            )
        });
        // A regression file says what it says (its outcome is checked on the
        // file itself below, whatever the code that made it does later).
        if name.starts_with("regress-") {
            let got = run(target, entry, &stored, &name);
            assert!(got.is_err(), "{target}/{name}: accepted from the corpus");
        }
    }
}

fn corpus(target: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(target);
    let mut files: Vec<(String, Vec<u8>)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| {
            let p = e.unwrap().path();
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                std::fs::read(&p).unwrap(),
            )
        })
        .collect();
    files.sort();
    files
}

#[test]
fn every_corpus_file_runs() {
    for (target, entry) in TARGETS {
        let files = corpus(target);
        assert!(
            files.len() >= 3,
            "{target}: corpus has {} files",
            files.len()
        );
        for (name, bytes) in &files {
            let _ = run(target, entry, bytes, name);
        }
    }
}

/// Mutate `b` in place a few times, as a fuzzer would.
fn mutate(rng: &mut StdRng, b: &mut Vec<u8>, other: &[u8]) {
    for _ in 0..rng.gen_range(1..=4) {
        let n = b.len();
        match rng.gen_range(0..8) {
            0 if n > 0 => {
                let i = rng.gen_range(0..n);
                b[i] ^= 1 << rng.gen_range(0..8);
            }
            1 if n > 0 => {
                let i = rng.gen_range(0..n);
                b[i] = [0, 0xff, 0x7f, 0x80, 1, rng.gen()][rng.gen_range(0..6)];
            }
            2 => {
                let i = rng.gen_range(0..=n);
                let k = rng.gen_range(1..16);
                let ins: Vec<u8> = (0..k).map(|_| rng.gen()).collect();
                b.splice(i..i, ins);
            }
            3 if n > 0 => {
                let i = rng.gen_range(0..n);
                let j = rng.gen_range(i..=n.min(i + 16));
                b.drain(i..j);
            }
            4 if n > 0 => b.truncate(rng.gen_range(0..n)),
            5 if !other.is_empty() => {
                // Splice in a piece of another input.
                let s = rng.gen_range(0..other.len());
                let e = rng.gen_range(s..=other.len().min(s + 64));
                let i = rng.gen_range(0..=n);
                b.splice(i..i, other[s..e].iter().copied());
            }
            6 if n > 8 => {
                // A varint or length field set to something large.
                let i = rng.gen_range(0..n - 8);
                let v: u64 = [u64::MAX, 1 << 30, 1 << 40, rng.gen()][rng.gen_range(0..4)];
                b[i..i + 8].copy_from_slice(&v.to_le_bytes());
            }
            _ => b.push(rng.gen()),
        }
    }
}

/// For frames: mutate the message (and bulk) and frame them again with a
/// valid header, so the mutations reach the message decoders and the
/// request checks instead of stopping at the header's CRC.
fn reframe(rng: &mut StdRng, input: &[u8], other: &[u8]) -> Option<Vec<u8>> {
    let (f, _) = decode_frame(input).ok()?;
    let mut msg = f.msg;
    mutate(rng, &mut msg, other.get(HEADER_LEN..).unwrap_or(&[]));
    let mut bulk = f.bulk;
    if rng.gen_bool(0.2) {
        bulk.resize(rng.gen_range(0..4096), 0);
    }
    let op = if rng.gen_bool(0.1) {
        Opcode::from_u16(rng.gen_range(1..=11)).unwrap()
    } else {
        f.header.op()
    };
    frame::encode_frame(op, f.header.flags, f.header.request_id, &msg, &[&bulk]).ok()
}

#[test]
fn seeded_mutations_of_the_corpus_never_panic() {
    const ROUNDS: usize = 4000;
    for (ti, (target, entry)) in TARGETS.into_iter().enumerate() {
        let seeds: Vec<Vec<u8>> = corpus(target).into_iter().map(|(_, b)| b).collect();
        let mut rng = StdRng::seed_from_u64(0x5eed_0000 + ti as u64);
        let (mut ok, mut refused) = (0usize, 0usize);
        for round in 0..ROUNDS {
            let a = &seeds[rng.gen_range(0..seeds.len())];
            let b = &seeds[rng.gen_range(0..seeds.len())];
            let input = match round % 4 {
                // Pure random bytes, now and then.
                0 if round % 16 == 0 => {
                    let n = rng.gen_range(0..512);
                    (0..n).map(|_| rng.gen()).collect()
                }
                1 | 2 if target == "frame_decode" => match reframe(&mut rng, a, b) {
                    Some(v) => v,
                    None => a.clone(),
                },
                _ => {
                    let mut v = a.clone();
                    mutate(&mut rng, &mut v, b);
                    v
                }
            };
            match run(target, entry, &input, &format!("mutation {round}")) {
                Ok(()) => ok += 1,
                Err(_) => refused += 1,
            }
        }
        eprintln!("{target}: {ROUNDS} mutated inputs, {ok} accepted, {refused} refused");
        assert!(refused > 0, "{target}: no mutation was refused");
    }
}
