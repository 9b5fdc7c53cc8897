//! `peregrine-mdtest`: a metadata benchmark in the style of mdtest, on any
//! mounted directory (a peregrine-fuse mount, or a local file system to compare).
//!
//! ```text
//! peregrine-mdtest --dir DIR [--threads 4] [--items 1000] [--sizes 0,3901]
//!     [--layout unique,shared] [--json-out FILE]
//! ```
//!
//! For each file size and each directory layout it runs four phases, one
//! after the other, every thread working on its own `--items` files:
//! create (open O_CREAT|O_EXCL, write the bytes, close), stat, read (open,
//! read to EOF, check the size, close) and delete (unlink). `unique`: each
//! thread has its own directory (mdtest `-u`); `shared`: all threads create
//! their files in one directory. A phase is timed from the first thread's
//! start (all leave one barrier together) to the last thread's end;
//! ops/s = files / that time.
//! Prints one table and optionally writes the results as JSON.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Barrier;
use std::time::Instant;

#[derive(Parser, Debug)]
#[command(
    name = "peregrine-mdtest",
    version,
    about = "mdtest-style metadata benchmark on a mounted directory"
)]
struct Args {
    /// Directory to work in (a peregrine-fuse mount); a fresh subdirectory is used and removed.
    #[arg(long)]
    dir: PathBuf,
    /// Worker threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Files per thread in each phase.
    #[arg(long, default_value_t = 1000)]
    items: usize,
    /// File sizes in bytes, comma separated (mdtest -w).
    #[arg(long, value_delimiter = ',', default_value = "0,3901")]
    sizes: Vec<usize>,
    /// Directory layouts, comma separated: unique (one directory per thread), shared (one for all).
    #[arg(long, value_delimiter = ',', default_value = "unique,shared")]
    layout: Vec<String>,
    /// Write the results as JSON.
    #[arg(long, value_name = "FILE")]
    json_out: Option<PathBuf>,
}

const PHASES: [&str; 4] = ["create", "stat", "read", "delete"];

struct Run {
    size: usize,
    layout: String,
    /// Seconds per phase, in PHASES order.
    secs: [f64; 4],
    files: usize,
}

fn file_path(base: &Path, layout: &str, t: usize, i: usize) -> PathBuf {
    if layout == "unique" {
        base.join(format!("t{t}")).join(format!("f{i}"))
    } else {
        base.join(format!("f.{t}.{i}"))
    }
}

fn phase(op: usize, path: &Path, data: &[u8], buf: &mut Vec<u8>) -> Result<()> {
    match PHASES[op] {
        "create" => {
            let mut f = fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .with_context(|| format!("create {}", path.display()))?;
            if !data.is_empty() {
                f.write_all(data)
                    .with_context(|| format!("write {}", path.display()))?;
            }
        }
        "stat" => {
            let m = fs::metadata(path).with_context(|| format!("stat {}", path.display()))?;
            if m.len() != data.len() as u64 {
                bail!("{}: size {} != {}", path.display(), m.len(), data.len());
            }
        }
        "read" => {
            buf.clear();
            fs::File::open(path)
                .and_then(|mut f| f.read_to_end(buf))
                .with_context(|| format!("read {}", path.display()))?;
            if buf.len() != data.len() {
                bail!(
                    "{}: read {} bytes, want {}",
                    path.display(),
                    buf.len(),
                    data.len()
                );
            }
        }
        _ => fs::remove_file(path).with_context(|| format!("unlink {}", path.display()))?,
    }
    Ok(())
}

fn run_one(root: &Path, size: usize, layout: &str, threads: usize, items: usize) -> Result<Run> {
    let base = root.join(format!("{layout}.{size}"));
    fs::create_dir(&base).with_context(|| format!("mkdir {}", base.display()))?;
    if layout == "unique" {
        for t in 0..threads {
            fs::create_dir(base.join(format!("t{t}")))?;
        }
    }
    let data: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
    // Each worker notes when it started and ended each phase; a phase lasts
    // from the first start to the last end. (Timing in the coordinating thread
    // would be wrong on a busy machine: it can be descheduled while the
    // workers run.)
    let barrier = Barrier::new(threads);
    let spans: Vec<Vec<(Instant, Instant)>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (barrier, data, base) = (&barrier, &data, &base);
                s.spawn(move || -> Result<Vec<(Instant, Instant)>> {
                    let mut buf = Vec::with_capacity(data.len() + 1);
                    let mut res = Ok(());
                    let mut spans = vec![];
                    for op in 0..PHASES.len() {
                        barrier.wait();
                        let t0 = Instant::now();
                        if res.is_ok() {
                            for i in 0..items {
                                if let Err(e) =
                                    phase(op, &file_path(base, layout, t, i), data, &mut buf)
                                {
                                    res = Err(e);
                                    break;
                                }
                            }
                        }
                        spans.push((t0, Instant::now()));
                    }
                    res.map(|_| spans)
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker panicked"))
            .collect::<Result<Vec<_>>>()
    })?;
    let mut secs = [0f64; 4];
    for (p, s) in secs.iter_mut().enumerate() {
        let start = spans.iter().map(|v| v[p].0).min().unwrap();
        let end = spans.iter().map(|v| v[p].1).max().unwrap();
        *s = end.duration_since(start).as_secs_f64().max(1e-9);
    }
    if layout == "unique" {
        for t in 0..threads {
            fs::remove_dir(base.join(format!("t{t}")))?;
        }
    }
    fs::remove_dir(&base)?;
    Ok(Run {
        size,
        layout: layout.to_string(),
        secs,
        files: threads * items,
    })
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.threads == 0 || a.items == 0 {
        bail!("--threads and --items must be at least 1");
    }
    for l in &a.layout {
        if l != "unique" && l != "shared" {
            bail!("--layout: unknown {l:?} (unique, shared)");
        }
    }
    let root = a.dir.join(format!("mdtest.{}", std::process::id()));
    fs::create_dir(&root).with_context(|| format!("mkdir {}", root.display()))?;
    let mut runs = vec![];
    for &size in &a.sizes {
        for layout in &a.layout {
            let r = run_one(&root, size, layout, a.threads, a.items);
            let r = match r {
                Ok(r) => r,
                Err(e) => {
                    let _ = fs::remove_dir_all(&root);
                    return Err(e);
                }
            };
            eprintln!(
                "mdtest: {} B, {layout}: {}",
                size,
                PHASES
                    .iter()
                    .zip(r.secs)
                    .map(|(p, s)| format!("{p} {:.0}/s", r.files as f64 / s))
                    .collect::<Vec<_>>()
                    .join(", ")
            );
            runs.push(r);
        }
    }
    fs::remove_dir(&root)?;

    // The table: one row per phase, one column per (size, layout).
    println!(
        "\nmdtest: {} threads x {} files per phase, ops/s (in {})",
        a.threads,
        a.items,
        a.dir.display()
    );
    let cols: Vec<String> = runs
        .iter()
        .map(|r| {
            let sz = if r.size == 0 {
                "empty".to_string()
            } else {
                format!("{}B", r.size)
            };
            format!("{sz} {}", r.layout)
        })
        .collect();
    print!("{:<8}", "phase");
    for c in &cols {
        print!(" {c:>14}");
    }
    println!();
    for (p, name) in PHASES.iter().enumerate() {
        print!("{name:<8}");
        for r in &runs {
            print!(" {:>14.0}", r.files as f64 / r.secs[p]);
        }
        println!();
    }

    if let Some(out) = &a.json_out {
        let results: Vec<_> = runs
            .iter()
            .flat_map(|r| {
                PHASES.iter().enumerate().map(move |(p, name)| {
                    serde_json::json!({
                        "size": r.size,
                        "layout": r.layout,
                        "phase": name,
                        "files": r.files,
                        "secs": r.secs[p],
                        "ops_per_sec": r.files as f64 / r.secs[p],
                    })
                })
            })
            .collect();
        let doc = serde_json::json!({
            "tool": "peregrine-mdtest",
            "dir": a.dir,
            "threads": a.threads,
            "items_per_thread": a.items,
            "results": results,
        });
        fs::write(out, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("write {}", out.display()))?;
    }
    Ok(())
}
