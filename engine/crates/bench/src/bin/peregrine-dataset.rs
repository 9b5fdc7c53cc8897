//! `peregrine-dataset`: what a training job does to its storage, on any mounted directory. It
//! writes a dataset of many files (the preparation step), then reads all of it back in epochs,
//! each in a new random order over several loader threads (as a PyTorch DataLoader does), and
//! checks every byte. It prints progress every second and, per phase, MiB/s and files/s.
//!
//! ```text
//! peregrine-dataset --dir DIR [--files 2000] [--file-size 256KiB] [--epochs 3] [--threads 4]
//!     [--keep]
//! ```
//!
//! File i holds a pattern derived from i and the run's seed, so a file read back with another
//! file's content, stale or torn data fails the run (exit 1) instead of passing as fast reads.

use anyhow::{bail, Context, Result};
use clap::Parser;
use peregrine_proto::size::parse_size;
use rand::seq::SliceRandom;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "peregrine-dataset",
    version,
    about = "write a dataset of many files, then read it back in shuffled epochs"
)]
struct Args {
    /// Directory to work in (a Peregrine volume); the dataset goes into DIR/dataset.
    #[arg(long)]
    dir: PathBuf,
    /// Files in the dataset.
    #[arg(long, default_value_t = 2000)]
    files: usize,
    /// Size of each file (bytes, or with KiB, MiB, GiB).
    #[arg(long, default_value = "256KiB", value_parser = parse_size)]
    file_size: u64,
    /// Passes over the whole dataset, each in a new random order.
    #[arg(long, default_value_t = 3)]
    epochs: usize,
    /// Loader threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Keep the dataset afterwards (by default it is removed).
    #[arg(long)]
    keep: bool,
}

/// Files per subdirectory, as datasets are sharded to keep directories small.
const PER_DIR: usize = 1000;

fn path_of(root: &Path, i: usize) -> PathBuf {
    root.join(format!("shard-{:04}", i / PER_DIR))
        .join(format!("sample-{i:07}.bin"))
}

/// The content of file i: 8-byte words of a sequence that depends on i and the seed.
fn fill(buf: &mut [u8], seed: u64, i: usize) {
    let mut x = seed ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    for w in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        w.copy_from_slice(&x.to_le_bytes()[..w.len()]);
    }
}

struct Phase<'a> {
    name: String,
    files: &'a AtomicUsize,
    bytes: &'a AtomicU64,
}

/// Runs work(i) for every index of order over threads, printing progress every second.
fn run_phase(
    name: &str,
    order: &[usize],
    threads: usize,
    work: impl Fn(usize) -> Result<u64> + Sync,
) -> Result<(f64, u64)> {
    let files = AtomicUsize::new(0);
    let bytes = AtomicU64::new(0);
    let next = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let phase = Phase {
        name: name.to_string(),
        files: &files,
        bytes: &bytes,
    };
    let start = Instant::now();
    let result: Result<()> = std::thread::scope(|s| {
        let progress = s.spawn(|| progress(&phase, order.len(), start, &done));
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> Result<()> {
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= order.len() {
                            return Ok(());
                        }
                        let n = work(order[k])?;
                        bytes.fetch_add(n, Ordering::Relaxed);
                        files.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        let mut first_err = None;
        for w in workers {
            if let Err(e) = w.join().expect("a loader thread panicked") {
                // Stop the others at their next file.
                next.store(order.len(), Ordering::Relaxed);
                first_err.get_or_insert(e);
            }
        }
        done.store(true, Ordering::Relaxed);
        progress.join().expect("the progress thread panicked");
        first_err.map_or(Ok(()), Err)
    });
    result?;
    Ok((start.elapsed().as_secs_f64(), bytes.load(Ordering::Relaxed)))
}

fn progress(p: &Phase, total: usize, start: Instant, done: &AtomicBool) {
    let mut last = Instant::now();
    while !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(50));
        if last.elapsed() < Duration::from_secs(1) {
            continue;
        }
        last = Instant::now();
        let secs = start.elapsed().as_secs_f64();
        let (n, b) = (
            p.files.load(Ordering::Relaxed),
            p.bytes.load(Ordering::Relaxed),
        );
        println!(
            "  {:<8} {:>7}/{} files  {:>8.1} MiB/s  {:>8.0} files/s",
            p.name,
            n,
            total,
            b as f64 / secs / (1 << 20) as f64,
            n as f64 / secs
        );
    }
}

fn report(name: &str, files: usize, secs: f64, bytes: u64) {
    println!(
        "{name:<8} {files} files, {:.1} MiB in {secs:.2} s: {:.1} MiB/s, {:.0} files/s",
        bytes as f64 / (1 << 20) as f64,
        bytes as f64 / secs / (1 << 20) as f64,
        files as f64 / secs
    );
}

fn main() -> Result<()> {
    let args = Args::parse();
    if args.files == 0 {
        bail!("--files must be at least 1");
    }
    let size = usize::try_from(args.file_size).context("--file-size")?;
    let root = args.dir.join("dataset");
    if root.exists() {
        fs::remove_dir_all(&root).with_context(|| format!("removing an old {}", root.display()))?;
    }
    for d in 0..args.files.div_ceil(PER_DIR) {
        let shard = root.join(format!("shard-{d:04}"));
        fs::create_dir_all(&shard).with_context(|| format!("creating {}", shard.display()))?;
    }
    let seed = rand::random::<u64>() | 1;
    println!(
        "dataset: {} files of {} bytes ({:.1} MiB) in {}, {} epochs, {} threads",
        args.files,
        size,
        (args.files * size) as f64 / (1 << 20) as f64,
        root.display(),
        args.epochs,
        args.threads
    );

    let in_order: Vec<usize> = (0..args.files).collect();
    let (secs, bytes) = run_phase("write", &in_order, args.threads, |i| {
        let mut buf = vec![0u8; size];
        fill(&mut buf, seed, i);
        let p = path_of(&root, i);
        fs::write(&p, &buf).with_context(|| format!("writing {}", p.display()))?;
        Ok(size as u64)
    })?;
    report("write", args.files, secs, bytes);

    let mut rng = rand::thread_rng();
    let mut total = (0.0, 0u64);
    for epoch in 1..=args.epochs {
        let mut order = in_order.clone();
        order.shuffle(&mut rng);
        let name = format!("epoch {epoch}");
        let (secs, bytes) = run_phase(&name, &order, args.threads, |i| {
            let p = path_of(&root, i);
            let got = fs::read(&p).with_context(|| format!("reading {}", p.display()))?;
            let mut want = vec![0u8; size];
            fill(&mut want, seed, i);
            if got != want {
                let at = got
                    .iter()
                    .zip(&want)
                    .position(|(a, b)| a != b)
                    .unwrap_or(got.len().min(want.len()));
                bail!(
                    "{}: {} bytes read, {} written; first difference at byte {at}",
                    p.display(),
                    got.len(),
                    want.len()
                );
            }
            Ok(got.len() as u64)
        })?;
        report(&name, args.files, secs, bytes);
        total = (total.0 + secs, total.1 + bytes);
    }
    if args.epochs > 0 {
        report("read", args.files * args.epochs, total.0, total.1);
    }
    println!("verified: every file of every epoch read back as written");
    if !args.keep {
        fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    }
    Ok(())
}
