//! The benchmark tests, through the blocking client library.
//!
//! Data layout, as DAOS arrays: each sequential thread owns one object, and its
//! data is cut in `block`-sized chunks, one dkey per chunk (dkey = chunk number),
//! akey `d`. One dkey per chunk lets striped classes spread a thread's data over
//! targets, like a file of 1 MiB chunks. The random and latency tests read 4 KiB
//! pieces of that same data set, so they measure reads of data that exists.

use crate::report::{Iops, Latency, Results, Small, Throughput};
use crate::{RunArgs, Test};
use anyhow::{anyhow, bail, Context, Result};
use peregrine::{ArrayRead, Client, Container, Object, ObjectClass, ObjectId, ReadQueue};
use rand::{Rng, SeedableRng};
use serde_json::json;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

const AKEY: &[u8] = b"d";

pub(crate) fn cerr(e: peregrine::Error) -> anyhow::Error {
    anyhow!("{}", e.msg)
}

/// The sequential data set: `threads` objects of `chunks` chunks of `block` bytes.
struct DataSet {
    objects: Vec<Object>,
    chunks: u64,
    block: u64,
}

impl DataSet {
    fn bytes(&self) -> u64 {
        self.objects.len() as u64 * self.chunks * self.block
    }
}

/// Contents of chunk `c` of object `t`: cheap to generate, different per chunk,
/// so a misplaced or stale chunk fails `--verify`.
fn fill(buf: &mut [u8], t: usize, c: u64) {
    let seed = ((t as u64) << 40) ^ c.wrapping_mul(0x9E37_79B9_7F4A_7C15);
    for (i, w) in buf.chunks_mut(8).enumerate() {
        let v = seed
            .wrapping_add(i as u64)
            .wrapping_mul(0xBF58_476D_1CE4_E5B9)
            .to_le_bytes();
        w.copy_from_slice(&v[..w.len()]);
    }
}

fn dkey(c: u64) -> Vec<u8> {
    c.to_string().into_bytes()
}

/// Run `f(thread_index)` on `n` threads; the first error stops the others
/// (they poll `stop`) and is returned.
pub(crate) fn on_threads<T: Send>(
    n: usize,
    stop: &AtomicBool,
    f: impl Fn(usize) -> Result<T> + Sync,
) -> Result<Vec<T>> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..n)
            .map(|i| {
                let f = &f;
                s.spawn(move || {
                    let r = f(i);
                    if r.is_err() {
                        stop.store(true, Ordering::Relaxed);
                    }
                    r
                })
            })
            .collect();
        let mut out = Vec::with_capacity(n);
        let mut first_err = None;
        for h in hs {
            match h.join() {
                Ok(Ok(v)) => out.push(v),
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
                }
                Err(_) => {
                    first_err.get_or_insert(anyhow!("a benchmark thread panicked"));
                }
            }
        }
        match first_err {
            Some(e) => Err(e),
            None => Ok(out),
        }
    })
}

pub fn run_all(a: &RunArgs, pool: &str, cont: &str) -> Result<Results> {
    // The control plane's security from PEREGRINE_TLS_DIR or
    // PEREGRINE_INSECURE=1 (docs/tls.md), as the C ABI takes it.
    let security = peregrine::Security::from_env().map_err(|e| anyhow::anyhow!(e))?;
    let shm = peregrine::shm::ShmConfig::default().with_vars(|k| std::env::var(k).ok());
    let client = Client::connect_with_shm(&a.mgmt, &security, a.transport, shm)
        .map_err(cerr)
        .context("connecting")?;
    let pool_h = client.pool_connect(pool).map_err(cerr)?;
    let cont_h = pool_h.cont_open(cont).map_err(cerr)?;
    let class: ObjectClass = match &a.oclass {
        Some(c) => c.parse().map_err(|e| anyhow!("--oclass: {e}"))?,
        None if cont_h.info().oclass.is_empty() => ObjectClass::SX,
        None => cont_h
            .info()
            .oclass
            .parse()
            .map_err(|e| anyhow!("container's object class: {e}"))?,
    };
    if !a.block.is_multiple_of(a.rand_block) {
        bail!(
            "--block ({}) must be a multiple of --rand-block ({})",
            a.block,
            a.rand_block
        );
    }
    // A fresh id space per run, so runs against the same container never read each other's data.
    let run_id: u32 = rand::thread_rng().gen();
    let per_thread = a.seq_bytes / a.threads as u64;
    let chunks = per_thread / a.block;
    if chunks == 0 {
        bail!(
            "--seq-bytes ({}) is less than --threads x --block",
            a.seq_bytes
        );
    }
    let objects = (0..a.threads)
        .map(|t| {
            cont_h
                .object(ObjectId::new(class, u64::from(run_id), t as u64))
                .map_err(cerr)
        })
        .collect::<Result<Vec<_>>>()?;
    let ds = DataSet {
        objects,
        chunks,
        block: a.block,
    };

    let mut r = Results {
        config: json!({
            "mgmt": a.mgmt, "pool": pool, "cont": cont, "oclass": class.name(),
            "seq_bytes": ds.bytes(), "block": a.block, "threads": a.threads,
            "rand_block": a.rand_block, "qd": a.qd, "rand_secs": a.rand_secs, "lat_secs": a.lat_secs,
            "small_ops": a.small_ops, "small_threads": a.small_threads, "small_size": a.small_size,
            "targets": pool_h.map().targets.len(),
        }),
        ..Default::default()
    };
    let wants = |t: Test| a.tests.contains(&t);
    eprintln!(
        "peregrine-bench: pool {pool:?} container {cont:?} class {class}, {} MiB data set over {} objects",
        ds.bytes() >> 20,
        a.threads
    );

    if wants(Test::Seq) || wants(Test::Rand) || wants(Test::Lat) {
        let w = seq_write(&ds)?;
        if wants(Test::Seq) {
            eprintln!("peregrine-bench: seq write {:.0} MB/s", w.mbps);
            r.seq_write = Some(w);
            let rd = seq_read(&ds, a.verify)?;
            eprintln!("peregrine-bench: seq read {:.0} MB/s", rd.mbps);
            r.seq_read = Some(rd);
        }
    }
    if wants(Test::Rand) {
        let t = rand_read(
            &cont_h,
            &ds,
            a.rand_block,
            a.qd,
            a.rand_threads,
            secs(a.rand_secs)?,
        )?;
        eprintln!(
            "peregrine-bench: rand read QD{} ({} threads) {:.0} IOPS",
            a.qd, t.threads, t.iops
        );
        r.rand_read = Some(t);
    }
    if wants(Test::Lat) {
        let t = latency(&ds, a.rand_block, secs(a.lat_secs)?)?;
        eprintln!(
            "peregrine-bench: QD1 read p50 {:.1} us, p99 {:.1} us",
            t.p50_us, t.p99_us
        );
        r.latency = Some(t);
    }
    if wants(Test::Small) {
        let t = small(
            &cont_h,
            class,
            run_id,
            a.small_threads,
            a.small_ops,
            a.small_size,
        )?;
        eprintln!(
            "peregrine-bench: small update {:.0} ops/s, fetch {:.0} ops/s",
            t.update_ops, t.fetch_ops
        );
        r.small = Some(t);
    }
    if wants(Test::SmallPaired) {
        let (Some(pp), Some(pc)) = (&a.pair_pool, &a.pair_cont) else {
            bail!("--tests small-paired needs --pair-pool and --pair-cont");
        };
        let pair = client
            .pool_connect(pp)
            .and_then(|p| p.cont_open(pc))
            .map_err(cerr)
            .with_context(|| format!("the pair container {pp}/{pc}"))?;
        let t = crate::paired::small_paired(
            [&cont_h, &pair],
            class,
            run_id,
            a.small_threads,
            a.small_ops,
            a.small_size,
            a.pair_blocks,
        )?;
        eprintln!(
            "peregrine-bench: paired small update {:.0} / {:.0} ops/s, fetch {:.0} / {:.0} ops/s ({pool}/{cont} / {pp}/{pc})",
            t.update_ops[0], t.update_ops[1], t.fetch_ops[0], t.fetch_ops[1]
        );
        r.small_paired = Some(t);
    }
    // The data set goes with the run, so that runs can follow each other on one pool.
    for o in &ds.objects {
        o.punch().map_err(cerr).context("removing the data set")?;
    }
    let st = client.transport().stats();
    eprintln!(
        "peregrine-bench: transport {:?}: {} shm calls, {} tcp calls, {} shm fallbacks",
        a.transport, st.shm_calls, st.tcp_calls, st.shm_fallbacks
    );
    Ok(r)
}

fn secs(s: f64) -> Result<Duration> {
    if !(s > 0.0 && s.is_finite()) {
        bail!("durations must be positive seconds, got {s}");
    }
    Ok(Duration::from_secs_f64(s))
}

fn seq_write(ds: &DataSet) -> Result<Throughput> {
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    on_threads(ds.objects.len(), &stop, |t| {
        let mut buf = vec![0u8; ds.block as usize];
        for c in 0..ds.chunks {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            fill(&mut buf, t, c);
            ds.objects[t]
                .update_array(&dkey(c), AKEY, 0, &buf)
                .map_err(cerr)
                .with_context(|| format!("seq write: object {t} chunk {c}"))?;
        }
        Ok(())
    })?;
    Ok(Throughput::new(ds.bytes(), start.elapsed().as_secs_f64()))
}

fn seq_read(ds: &DataSet, verify: bool) -> Result<Throughput> {
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    on_threads(ds.objects.len(), &stop, |t| {
        let mut buf = vec![0u8; ds.block as usize];
        let mut want = vec![0u8; if verify { ds.block as usize } else { 0 }];
        for c in 0..ds.chunks {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            ds.objects[t]
                .fetch_array_into(&dkey(c), AKEY, 0, &mut buf)
                .map_err(cerr)
                .with_context(|| format!("seq read: object {t} chunk {c}"))?;
            if verify {
                fill(&mut want, t, c);
                if buf != want {
                    bail!("seq read: object {t} chunk {c}: data differs from what was written");
                }
            }
        }
        Ok(())
    })?;
    Ok(Throughput::new(ds.bytes(), start.elapsed().as_secs_f64()))
}

/// A random `len`-byte piece of the data set: (object, chunk, offset).
fn random_at(ds: &DataSet, len: u64, rng: &mut impl Rng) -> (usize, u64, u64) {
    let t = rng.gen_range(0..ds.objects.len());
    let c = rng.gen_range(0..ds.chunks);
    let off = rng.gen_range(0..ds.block / len) * len;
    (t, c, off)
}

/// `qd` reads in flight from `threads` threads (at most `qd`): each keeps
/// its share of them in flight ([`ReadQueue`]), sending the next read as
/// soon as one is done, as one fio job keeps its queue depth through
/// io_uring; with `threads` = `qd` each thread makes one read at a time.
fn rand_read(
    cont: &Container,
    ds: &DataSet,
    len: u64,
    qd: usize,
    threads: usize,
    dur: Duration,
) -> Result<Iops> {
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    let threads = threads.clamp(1, qd);
    // Every chunk's dkey, made once: a read borrows its dkey while in flight.
    let dkeys: Vec<Vec<u8>> = (0..ds.chunks).map(dkey).collect();
    let counts = on_threads(threads, &stop, |i| {
        let depth = qd / threads + usize::from(i < qd % threads);
        let mut rng = rand::rngs::StdRng::seed_from_u64(i as u64 + 1);
        let mut next = |buf| {
            let (t, c, offset) = random_at(ds, len, &mut rng);
            ArrayRead {
                obj: &ds.objects[t],
                dkey: &dkeys[c as usize],
                akey: AKEY,
                offset,
                buf,
            }
        };
        let mut bufs = vec![vec![0u8; len as usize]; depth];
        let mut queue = ReadQueue::new(cont);
        for buf in bufs.iter_mut() {
            queue.submit(0, next(buf));
        }
        let mut done = Vec::with_capacity(depth);
        let mut n = 0u64;
        while !queue.is_empty() {
            queue.reap(&mut done);
            for c in done.drain(..) {
                c.result.map_err(cerr).context("rand read")?;
                n += 1;
                if !stop.load(Ordering::Relaxed) && start.elapsed() < dur {
                    queue.submit(0, next(c.read.buf));
                }
            }
        }
        Ok(n)
    })?;
    let secs = start.elapsed().as_secs_f64();
    let ops: u64 = counts.iter().sum();
    Ok(Iops {
        iops: ops as f64 / secs,
        ops,
        secs,
        queue_depth: qd,
        threads,
    })
}

fn latency(ds: &DataSet, len: u64, dur: Duration) -> Result<Latency> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(42);
    let mut buf = vec![0u8; len as usize];
    let mut samples = Vec::new();
    let start = Instant::now();
    while start.elapsed() < dur {
        let (t, c, off) = random_at(ds, len, &mut rng);
        let dk = dkey(c);
        let t0 = Instant::now();
        ds.objects[t]
            .fetch_array_into(&dk, AKEY, off, &mut buf)
            .map_err(cerr)
            .context("QD1 read")?;
        samples.push(t0.elapsed().as_nanos() as u64);
    }
    Latency::from_ns(samples).context("no operation finished within the latency test's duration")
}

/// The small test's value of key `i` of thread `t`: different for every key.
pub(crate) fn small_value(t: usize, i: u64, size: usize) -> Vec<u8> {
    (0..size)
        .map(|b| (t as u64 * 31 + i + b as u64) as u8)
        .collect()
}

fn small(
    cont: &Container,
    class: ObjectClass,
    run_id: u32,
    threads: usize,
    ops: u64,
    size: usize,
) -> Result<Small> {
    let per_thread = (ops / threads as u64).max(1);
    // Object numbers past the sequential test's, so the two never share an object.
    let objects = (0..threads)
        .map(|t| {
            cont.object(ObjectId::new(
                class,
                u64::from(run_id),
                1_000_000 + t as u64,
            ))
            .map_err(cerr)
        })
        .collect::<Result<Vec<_>>>()?;
    let stop = AtomicBool::new(false);
    let start = Instant::now();
    on_threads(threads, &stop, |t| {
        for i in 0..per_thread {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            objects[t]
                .update_single(format!("k{i}").as_bytes(), b"v", &small_value(t, i, size))
                .map_err(cerr)
                .context("small update")?;
        }
        Ok(())
    })?;
    let update_secs = start.elapsed().as_secs_f64();

    let start = Instant::now();
    on_threads(threads, &stop, |t| {
        for i in 0..per_thread {
            if stop.load(Ordering::Relaxed) {
                break;
            }
            let v = objects[t]
                .fetch_single(format!("k{i}").as_bytes(), b"v")
                .map_err(cerr)
                .context("small fetch")?;
            if v.as_deref() != Some(&small_value(t, i, size)[..]) {
                bail!("small fetch: object {t} key k{i}: value differs from what was written");
            }
        }
        Ok(())
    })?;
    let fetch_secs = start.elapsed().as_secs_f64();
    for o in &objects {
        o.punch()
            .map_err(cerr)
            .context("removing the small values")?;
    }
    let total = per_thread * threads as u64;
    Ok(Small {
        value_bytes: size,
        threads,
        update_ops: total as f64 / update_secs.max(1e-9),
        fetch_ops: total as f64 / fetch_secs.max(1e-9),
        ops: total,
    })
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn fill_differs_per_chunk_and_is_deterministic() {
        let (mut a, mut b, mut c) = (vec![0u8; 100], vec![0u8; 100], vec![0u8; 100]);
        fill(&mut a, 0, 1);
        fill(&mut b, 0, 2);
        fill(&mut c, 0, 1);
        assert_ne!(a, b);
        assert_eq!(a, c);
        fill(&mut b, 1, 1);
        assert_ne!(a, b, "threads write different data");
    }
}
