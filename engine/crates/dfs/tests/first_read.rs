//! A file's first read asks its extent and where the file ends together
//! (`File::read_at` through `Object::fetch_array_with_end`) against real
//! engines: what it answers for small, multi-chunk, sparse and empty
//! files, and that a read racing appends never returns bytes the append
//! had not written yet (zeros) as part of the file.

mod common;

use common::*;
use peregrine_dfs::*;

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    (0..len as u64)
        .map(|i| (i.wrapping_mul(2654435761).wrapping_add(seed) % 255) as u8 + 1)
        .collect()
}

/// A file named `name` in the root holding `data` at `off`.
fn file_with(fs: &Dfs, name: &[u8], off: u64, data: &[u8]) -> Node {
    let (n, _) = fs.create(&fs.root(), name, 0o644, 0, 0, true).unwrap();
    fs.open(&n).unwrap().write_at(off, data).unwrap();
    n
}

#[test]
fn a_first_read_learns_the_size_with_its_extent() {
    let c = cluster(1);
    // Chunks of 64 KiB: a file of 200 KiB ends in its fourth chunk.
    let fs = mount(&c, "small", false);
    let chunk = 64u64 << 10;

    let small = pattern(3901, 1);
    let n = file_with(&fs, b"small", 0, &small);
    let obj = fs.container().object(n.oid()).unwrap();
    let mut buf = vec![0u8; 8192];
    let got = obj
        .fetch_array_with_end(&chunk_dkey(0), DATA_AKEY, 0, &mut buf)
        .unwrap()
        .expect("answered together");
    assert_eq!(got.last, Some((chunk_dkey(0).to_vec(), 3901)));
    assert_eq!(got.seen, 3901);
    assert_eq!(&buf[..3901], &small[..]);
    assert!(buf[3901..].iter().all(|&b| b == 0));
    let f = fs.open(&n).unwrap();
    assert_eq!(f.read_at(0, &mut buf).unwrap(), 3901);
    assert_eq!(&buf[..3901], &small[..]);
    assert_eq!(f.cached_size(), 3901, "the read learned the size");
    assert_eq!(fs.open(&n).unwrap().read_at(3901, &mut buf).unwrap(), 0);
    assert_eq!(fs.open(&n).unwrap().read_at(1 << 40, &mut buf).unwrap(), 0);

    let big = pattern(200 << 10, 2);
    let n = file_with(&fs, b"big", 0, &big);
    let obj = fs.container().object(n.oid()).unwrap();
    let got = obj
        .fetch_array_with_end(&chunk_dkey(0), DATA_AKEY, 100, &mut buf)
        .unwrap()
        .expect("answered together");
    assert_eq!(got.last, Some((chunk_dkey(3).to_vec(), 8 << 10)));
    assert_eq!(got.seen, chunk);
    for off in [0, 100, chunk - 10, 3 * chunk + 5, (200 << 10) - 1000] {
        let f = fs.open(&n).unwrap();
        let want = ((200u64 << 10) - off).min(buf.len() as u64) as usize;
        assert_eq!(f.read_at(off, &mut buf).unwrap(), want, "at {off}");
        assert_eq!(
            &buf[..want],
            &big[off as usize..off as usize + want],
            "at {off}"
        );
        assert_eq!(f.cached_size(), 200 << 10);
    }

    // More than the first read's guess, across chunks: the rest is read
    // knowing the size.
    let mut large = vec![0u8; 100 << 10];
    for off in [0, 3000, chunk - 100] {
        let f = fs.open(&n).unwrap();
        assert_eq!(f.read_at(off, &mut large).unwrap(), large.len(), "at {off}");
        assert_eq!(&large[..], &big[off as usize..off as usize + large.len()]);
    }
    let f = fs.open(&n).unwrap();
    let tail_off = (200 << 10) - 5000;
    assert_eq!(f.read_at(tail_off, &mut large).unwrap(), 5000);
    assert_eq!(&large[..5000], &big[tail_off as usize..]);
    let f = fs.open(&file_with(&fs, b"small2", 0, &small)).unwrap();
    assert_eq!(f.read_at(0, &mut large).unwrap(), 3901);
    assert_eq!(&large[..3901], &small[..]);

    // A hole where the read is, data in a later chunk: the fetch saw no
    // bytes below the end, so the read asks again knowing the size.
    let tail = pattern(1000, 3);
    let n = file_with(&fs, b"sparse", 2 * chunk, &tail);
    let f = fs.open(&n).unwrap();
    buf.fill(7);
    assert_eq!(f.read_at(10, &mut buf).unwrap(), buf.len());
    assert!(buf.iter().all(|&b| b == 0), "a hole reads as zeros");
    assert_eq!(f.read_at(2 * chunk + 500, &mut buf).unwrap(), 500);
    assert_eq!(&buf[..500], &tail[500..]);

    let n = file_with(&fs, b"empty", 0, b"");
    assert_eq!(fs.open(&n).unwrap().read_at(0, &mut buf).unwrap(), 0);

    // Larger than one request is worth: not answered together.
    let mut large = vec![0u8; peregrine::FETCH_WITH_END_MAX + 1];
    let obj = fs.container().object(n.oid()).unwrap();
    assert_eq!(
        obj.fetch_array_with_end(&chunk_dkey(0), DATA_AKEY, 0, &mut large)
            .unwrap(),
        None
    );
}

/// Readers opening the file afresh while a writer appends: each read
/// returns a prefix of what the writer wrote, never zeros in its place
/// (an append seen by the end's query but not yet by the fetch).
#[test]
fn a_first_read_racing_appends_returns_only_written_bytes() {
    let c = cluster(1);
    let fs = mount(&c, "small", false);
    let data = pattern(60 << 10, 4);
    let n = file_with(&fs, b"log", 0, b"");
    let done = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = fs.open(&n).unwrap();
            for (i, piece) in data.chunks(300).enumerate() {
                f.write_at((i * 300) as u64, piece).unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        });
        for _ in 0..2 {
            s.spawn(|| {
                let mut buf = vec![0u8; 64 << 10];
                let mut reads = 0;
                while !done.load(std::sync::atomic::Ordering::SeqCst) || reads == 0 {
                    let got = fs.open(&n).unwrap().read_at(0, &mut buf).unwrap();
                    assert_eq!(&buf[..got], &data[..got], "read {reads}: {got} bytes");
                    reads += 1;
                }
            });
        }
    });
}

/// A replicated file written while one of its engines is down, then read
/// by first reads (fresh handles, which ask the end with the bytes)
/// during the outage and after the engine returned: every read is whole.
#[test]
fn first_reads_while_a_replica_is_down_and_after_it_returns() {
    use peregrine_proto::mgmt::ContCreateReq;
    let mut c = Cluster::replicated(ContCreateReq {
        label: "rp".into(),
        chunk_size: 64 << 10,
        ..Default::default()
    });
    let fs = mount(&c, "rp", false);
    let data = pattern(150 << 10, 5);
    let n = file_with(&fs, b"f", 0, &data[..3901]);
    let check = |fs: &Dfs, n: &Node, len: usize, when: &str| {
        let mut buf = vec![0u8; 8192];
        for off in [0usize, 3000, len - 100] {
            let f = fs.open(n).unwrap();
            let want = (len - off).min(buf.len());
            assert_eq!(
                f.read_at(off as u64, &mut buf).unwrap(),
                want,
                "{when}, at {off}"
            );
            assert_eq!(&buf[..want], &data[off..off + want], "{when}, at {off}");
        }
    };
    c.engines[2].kill9();
    // During the outage: the file grows into later chunks, and is read.
    fs.open(&n).unwrap().write_at(3901, &data[3901..]).unwrap();
    check(&fs, &n, data.len(), "during the outage");
    c.restart(2);
    check(&fs, &n, data.len(), "after the return");
    let again = mount(&c, "rp", false);
    check(
        &again,
        &again.lookup(&again.root(), b"f").unwrap(),
        data.len(),
        "a new mount",
    );
}
