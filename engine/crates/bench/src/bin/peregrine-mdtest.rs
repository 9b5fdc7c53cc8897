//! `peregrine-mdtest`: a metadata benchmark in the style of mdtest, on any
//! mounted directory (a peregrine-fuse mount, or a local file system to compare).
//!
//! ```text
//! peregrine-mdtest --dir DIR [--threads 4] [--procs 1] [--items 1000]
//!     [--sizes 0,3901] [--layout unique,shared] [--gap-ms 0] [--json-out FILE]
//! ```
//!
//! For each file size and each directory layout it runs four phases, one
//! after the other, every thread working on its own `--items` files:
//! create (open O_CREAT|O_EXCL, write the bytes, close), stat, read (open,
//! one read of the file's size as mdtest does, check the bytes, close) and
//! delete (unlink). `unique`: each thread has its own directory (mdtest
//! `-u`); `shared`: all threads create their files in one directory. A
//! phase is timed from the first thread's start (all leave one barrier
//! together) to the last thread's end; ops/s = files / that time.
//! `--gap-ms` waits that long between two phases (untimed): the phases
//! after it then find what a cache kept older than its bound (the
//! library's and the kernel's, a second by default), as a program that
//! removes its files a while after it made them does.
//!
//! `--procs P` runs the threads in P worker processes (this program again,
//! `--threads` threads each, P x threads workers in all), as mdtest runs
//! MPI ranks: what a per-process library (LD_PRELOAD of
//! libperegrine_il.so, which each process loads afresh) does with several
//! processes. The processes start each phase together (each waits for a
//! "go" on its stdin after saying it is ready) and report when their
//! threads started and ended it (wall clock, ns), from which the phase's
//! time is taken as above.
//! Prints one table and optionally writes the results as JSON.

use anyhow::{bail, Context, Result};
use clap::Parser;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Barrier;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

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
    /// Worker processes, each running --threads threads.
    #[arg(long, default_value_t = 1)]
    procs: usize,
    /// Milliseconds to wait between two phases (not timed).
    #[arg(long, default_value_t = 0)]
    gap_ms: u64,
    /// Write the results as JSON.
    #[arg(long, value_name = "FILE")]
    json_out: Option<PathBuf>,
    /// Internal: run as worker process K of --procs in the run directory
    /// --dir (the coordinator passes it).
    #[arg(long, hide = true)]
    worker: Option<usize>,
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
            // As mdtest reads: the file's size asked in one read(2), no
            // fstat first and no read at the end (`read_to_end` would add
            // both). The stat phase checked the sizes; the bytes are checked.
            buf.clear();
            buf.resize(data.len(), 0);
            fs::File::open(path)
                .and_then(|mut f| f.read_exact(buf))
                .with_context(|| format!("read {} bytes of {}", data.len(), path.display()))?;
            if buf[..] != data[..] {
                bail!("{}: read bytes differ from those written", path.display());
            }
        }
        _ => fs::remove_file(path).with_context(|| format!("unlink {}", path.display()))?,
    }
    Ok(())
}

/// Wall-clock nanoseconds (comparable between the worker processes).
fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0)
}

/// The phases of threads `first..first + threads`; `go(phase)` is called
/// before each phase starts (a worker process waits for the coordinator
/// there) and `done(phase, span)` after it ends. Per phase: (first
/// thread's start, last thread's end), ns.
/// One run: its directory, file size, layout and files per thread.
struct Job<'a> {
    base: &'a Path,
    size: usize,
    layout: &'a str,
    items: usize,
}

fn run_threads(
    job: &Job,
    first: usize,
    threads: usize,
    go: &mut dyn FnMut(usize) -> Result<()>,
    done: &mut dyn FnMut(usize, (u128, u128)) -> Result<()>,
) -> Result<Vec<(u128, u128)>> {
    let Job {
        base,
        size,
        layout,
        items,
    } = *job;
    let data: Vec<u8> = (0..size).map(|i| (i * 31 + 7) as u8).collect();
    // Each worker notes when it started and ended each phase; a phase lasts
    // from the first start to the last end. (Timing in the coordinating thread
    // would be wrong on a busy machine: it can be descheduled while the
    // workers run.) The coordinating thread joins the barriers too: the
    // threads start a phase together once `go` returned, and it reads
    // their spans once all have ended it.
    let barrier = Barrier::new(threads + 1);
    let marks: std::sync::Mutex<Vec<(u128, u128)>> = std::sync::Mutex::new(vec![]);
    std::thread::scope(|s| {
        let workers: Vec<_> = (first..first + threads)
            .map(|t| {
                let (barrier, data, marks) = (&barrier, &data, &marks);
                s.spawn(move || -> Result<()> {
                    let mut buf = Vec::with_capacity(data.len());
                    let mut res = Ok(());
                    for op in 0..PHASES.len() {
                        barrier.wait();
                        let t0 = now_ns();
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
                        marks.lock().unwrap().push((t0, now_ns()));
                        barrier.wait();
                    }
                    res
                })
            })
            .collect();
        let mut spans = vec![];
        let mut ok = Ok(());
        for op in 0..PHASES.len() {
            if ok.is_ok() {
                ok = go(op);
            }
            barrier.wait();
            barrier.wait();
            let m = std::mem::take(&mut *marks.lock().unwrap());
            let span = (
                m.iter().map(|x| x.0).min().unwrap_or(0),
                m.iter().map(|x| x.1).max().unwrap_or(0),
            );
            if ok.is_ok() {
                ok = done(op, span);
            }
            spans.push(span);
        }
        for w in workers {
            let r = w.join().expect("worker panicked");
            ok = ok.and(r);
        }
        ok.map(|_| spans)
    })
}

/// The phases run by `procs` worker processes of `threads` threads each.
fn run_procs(
    base: &Path,
    size: usize,
    layout: &str,
    threads: usize,
    procs: usize,
    items: usize,
    gap: Duration,
) -> Result<Vec<(u128, u128)>> {
    let exe = std::env::current_exe()?;
    let mut kids = vec![];
    for k in 0..procs {
        let c = Command::new(&exe)
            .arg("--dir")
            .arg(base)
            .args(["--worker", &k.to_string(), "--procs", &procs.to_string()])
            .args([
                "--threads",
                &threads.to_string(),
                "--items",
                &items.to_string(),
            ])
            .args(["--sizes", &size.to_string(), "--layout", layout])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("start a worker process")?;
        kids.push(c);
    }
    let mut ins: Vec<_> = kids.iter_mut().map(|c| c.stdin.take().unwrap()).collect();
    let mut outs: Vec<_> = kids
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().unwrap()))
        .collect();
    let line = |o: &mut BufReader<std::process::ChildStdout>| -> Result<String> {
        let mut l = String::new();
        o.read_line(&mut l)?;
        if l.is_empty() || l.starts_with("error") {
            bail!("a worker process failed: {}", l.trim());
        }
        Ok(l)
    };
    let mut spans = vec![];
    for op in 0..PHASES.len() {
        if op > 0 {
            std::thread::sleep(gap);
        }
        for o in outs.iter_mut() {
            let l = line(o)?;
            if l.trim() != "ready" {
                bail!("worker said {l:?}, not ready");
            }
        }
        for i in ins.iter_mut() {
            i.write_all(b"go\n")?;
            i.flush()?;
        }
        let (mut start, mut end) = (u128::MAX, 0u128);
        for o in outs.iter_mut() {
            let l = line(o)?;
            let v: Vec<u128> = l
                .split_whitespace()
                .skip(1)
                .filter_map(|x| x.parse().ok())
                .collect();
            if v.len() != 2 {
                bail!("worker said {l:?}, not a span");
            }
            start = start.min(v[0]);
            end = end.max(v[1]);
        }
        spans.push((start, end));
    }
    for mut c in kids {
        let st = c.wait()?;
        if !st.success() {
            bail!("a worker process exited with {st}");
        }
    }
    Ok(spans)
}

/// Worker process `k`: threads k*threads.. of the run in directory `--dir`.
/// Says "ready" and waits for a line before each phase, says "span START
/// END" after it; "error ..." if a thread failed.
fn worker(a: &Args, k: usize) -> Result<()> {
    let (size, layout) = (a.sizes[0], a.layout[0].as_str());
    let out = std::cell::RefCell::new(std::io::stdout());
    let mut input = BufReader::new(std::io::stdin());
    let mut go = |_: usize| -> Result<()> {
        let mut o = out.borrow_mut();
        writeln!(o, "ready")?;
        o.flush()?;
        let mut l = String::new();
        input.read_line(&mut l)?;
        Ok(())
    };
    let mut done = |_: usize, (s, e): (u128, u128)| -> Result<()> {
        let mut o = out.borrow_mut();
        writeln!(o, "span {s} {e}")?;
        o.flush()?;
        Ok(())
    };
    let job = Job {
        base: &a.dir,
        size,
        layout,
        items: a.items,
    };
    let r = run_threads(&job, k * a.threads, a.threads, &mut go, &mut done);
    if let Err(e) = &r {
        let mut o = out.borrow_mut();
        writeln!(o, "error {e:#}")?;
        o.flush()?;
    }
    r.map(|_| ())
}

fn run_one(
    root: &Path,
    size: usize,
    layout: &str,
    threads: usize,
    procs: usize,
    items: usize,
    gap: Duration,
) -> Result<Run> {
    let base = root.join(format!("{layout}.{size}"));
    fs::create_dir(&base).with_context(|| format!("mkdir {}", base.display()))?;
    let workers = threads * procs;
    if layout == "unique" {
        for t in 0..workers {
            fs::create_dir(base.join(format!("t{t}")))?;
        }
    }
    let spans = if procs > 1 {
        run_procs(&base, size, layout, threads, procs, items, gap)?
    } else {
        let mut go = |op: usize| {
            if op > 0 {
                std::thread::sleep(gap);
            }
            Ok(())
        };
        let mut done = |_: usize, _: (u128, u128)| Ok(());
        let job = Job {
            base: &base,
            size,
            layout,
            items,
        };
        run_threads(&job, 0, threads, &mut go, &mut done)?
    };
    let mut secs = [0f64; 4];
    for (p, s) in secs.iter_mut().enumerate() {
        let (start, end) = spans[p];
        *s = (end.saturating_sub(start) as f64 / 1e9).max(1e-9);
    }
    if layout == "unique" {
        for t in 0..workers {
            fs::remove_dir(base.join(format!("t{t}")))?;
        }
    }
    fs::remove_dir(&base)?;
    Ok(Run {
        size,
        layout: layout.to_string(),
        secs,
        files: workers * items,
    })
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.threads == 0 || a.items == 0 || a.procs == 0 {
        bail!("--threads, --procs and --items must be at least 1");
    }
    if let Some(k) = a.worker {
        return worker(&a, k);
    }
    for l in &a.layout {
        if l != "unique" && l != "shared" {
            bail!("--layout: unknown {l:?} (unique, shared)");
        }
    }
    let root = a.dir.join(format!("mdtest.{}", std::process::id()));
    fs::create_dir(&root).with_context(|| format!("mkdir {}", root.display()))?;
    let mut runs = vec![];
    let gap = Duration::from_millis(a.gap_ms);
    for &size in &a.sizes {
        for layout in &a.layout {
            let r = run_one(&root, size, layout, a.threads, a.procs, a.items, gap);
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
        "\nmdtest: {} processes x {} threads x {} files per phase, ops/s (in {})",
        a.procs,
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
            "procs": a.procs,
            "items_per_thread": a.items,
            "results": results,
        });
        fs::write(out, serde_json::to_string_pretty(&doc)? + "\n")
            .with_context(|| format!("write {}", out.display()))?;
    }
    Ok(())
}
