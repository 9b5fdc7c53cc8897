//! `peregrine-mdscale`: metadata at scale (issue 19, point 7), through the POSIX layer
//! (`peregrine_dfs::Dfs` over the client library, no FUSE), so it measures the engines.
//!
//! ```text
//! peregrine-mdscale --mgmt ADDR --pool P --cont C [--files 1000000] [--size 3901]
//!     [--per-dir 1000] [--threads 4] [--stats 20000] [--engine-pid PID]
//! peregrine-mdscale --mgmt ADDR --pool P --cont C --wait-serving SECS
//! peregrine-mdscale --local DIR [--files 1000000] [--size 3901] ...
//! ```
//!
//! Creates `--files` files of `--size` bytes each (3901 as mdtest-hard writes) in a tree
//! `/mdscale/t<thread>/d<k>/file.mdtest.<thread>.<i>`, `--per-dir` files per directory, from
//! `--threads` threads, in decades: up to 10^4, then 10^5, then 10^6 (up to `--files`). After
//! each decade it stats `--stats` files drawn at random from all created so far (lookup of the
//! name in its directory, then the attributes with the file's size: what `stat` through the
//! mount costs) and reads the engine's VmRSS from /proc/PID/status. One line per decade:
//! files, create rate over the decade, stat rate at that size, engine RSS, and RSS per file
//! (growth since the mount, over the files created).
//!
//! `--local DIR` builds the same tree in a local directory through the kernel (the peer
//! measured in the same run, on the same disk), `--stats-only` stats the files of a tree
//! an earlier run left. `--wait-serving SECS` instead waits (up to SECS) until the container mounts and the last
//! file of the tree answers a stat with its size, and prints how long that took: the driver
//! (`bench/mdscale.sh`) runs it right after restarting a SIGKILLed engine.

use anyhow::{bail, Context, Result};
use clap::Parser;
use peregrine_dfs::{Dfs, Node};
use rand::Rng;
use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
#[command(
    name = "peregrine-mdscale",
    version,
    about = "create and stat files at scale"
)]
struct Args {
    /// Management service address.
    #[arg(long, env = "PEREGRINE_MGMT", default_value = "127.0.0.1:10001")]
    mgmt: String,
    #[arg(long, required_unless_present = "local")]
    pool: Option<String>,
    #[arg(long, required_unless_present = "local")]
    cont: Option<String>,
    /// Files to create in all.
    #[arg(long, default_value_t = 1_000_000)]
    files: u64,
    /// Bytes written into each file.
    #[arg(long, default_value_t = 3901)]
    size: usize,
    /// Files per directory.
    #[arg(long, default_value_t = 1000)]
    per_dir: u64,
    /// Client threads (each with its own directories).
    #[arg(long, default_value_t = 4)]
    threads: u64,
    /// Files stat'ed after each decade.
    #[arg(long, default_value_t = 20_000)]
    stats: u64,
    /// The engine whose resident memory is reported (/proc/PID/status).
    #[arg(long)]
    engine_pid: Option<u32>,
    /// Wait until the tree serves again (after a restart) and print how long it took.
    #[arg(long)]
    wait_serving: Option<u64>,
    /// Create nothing: stat `--stats` files drawn from the first `--files` of a tree an
    /// earlier run created (with the same `--threads` and `--per-dir`), and print the rate.
    #[arg(long)]
    stats_only: bool,
    /// Build the tree in this local directory instead, through the kernel's file system:
    /// the peer the store's rates are read against, on the same disk in the same run.
    #[arg(long)]
    local: Option<PathBuf>,
}

/// Where the tree lives.
enum Namespace {
    /// The container, through the POSIX layer.
    Store { fs: Dfs, top: Vec<Node>, tree: Tree },
    /// A local directory (`--local`).
    Local(PathBuf),
}

impl Namespace {
    /// Create file `i` with `data` in it.
    fn create(&self, a: &Args, i: u64, data: &[u8]) -> Result<()> {
        let (t, d, name) = place(a, i);
        match self {
            Namespace::Store { fs, top, tree } => {
                let dir = tree.dir(fs, top, t, d)?;
                let (n, _) = fs
                    .create(&dir, name.as_bytes(), 0o644, 0, 0, true)
                    .with_context(|| format!("create {name}"))?;
                if !data.is_empty() {
                    fs.open(&n)?.write_at(0, data)?;
                }
            }
            Namespace::Local(root) => {
                let dir = root.join(format!("t{t}/d{d}"));
                let path = dir.join(&name);
                let mut f = match std::fs::File::create_new(&path) {
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                        std::fs::create_dir_all(&dir)?;
                        std::fs::File::create_new(&path)
                    }
                    r => r,
                }
                .with_context(|| format!("create {}", path.display()))?;
                f.write_all(data)?;
            }
        }
        Ok(())
    }

    /// The size of file `i`, after the lookups a `stat` of its path makes.
    fn stat(&self, a: &Args, i: u64) -> Result<u64> {
        match self {
            Namespace::Store { fs, top, .. } => stat_one(fs, a, top, i),
            Namespace::Local(root) => {
                let (t, d, name) = place(a, i);
                Ok(std::fs::metadata(root.join(format!("t{t}/d{d}/{name}")))?.len())
            }
        }
    }
}

fn rss_bytes(pid: u32) -> Result<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("read /proc/{pid}/status"))?;
    let line = s
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .context("no VmRSS line")?;
    let kb: u64 = line
        .split_whitespace()
        .nth(1)
        .context("VmRSS value")?
        .parse()?;
    Ok(kb * 1024)
}

fn mount(a: &Args) -> Result<Dfs> {
    // PEREGRINE_TLS_DIR or PEREGRINE_INSECURE=1 (docs/tls.md).
    let security =
        peregrine::Security::from_env().map_err(|e| anyhow::anyhow!("control plane: {e}"))?;
    let shm = peregrine::shm::ShmConfig::default().with_vars(|k| std::env::var(k).ok());
    let client = peregrine::Client::connect_with_shm(
        &a.mgmt,
        &security,
        peregrine::TransportKind::from_env()?,
        shm,
    )?;
    let pool = client.pool_connect(a.pool.as_deref().context("--pool")?)?;
    Ok(Dfs::mount(
        pool.cont_open(a.cont.as_deref().context("--cont")?)?,
        true,
        false,
    )?)
}

/// File `i` of the run: (thread, directory within the thread, name).
fn place(a: &Args, i: u64) -> (u64, u64, String) {
    let t = i % a.threads;
    let j = i / a.threads; // the thread's j-th file
    (t, j / a.per_dir, format!("file.mdtest.{t}.{j}"))
}

/// Each thread's directories, created as needed.
struct Tree {
    dirs: Vec<Mutex<Vec<Node>>>,
}

impl Tree {
    fn dir(&self, fs: &Dfs, top: &[Node], t: u64, d: u64) -> Result<Node> {
        let mut v = self.dirs[t as usize].lock().unwrap();
        while v.len() as u64 <= d {
            let name = format!("d{}", v.len());
            let n = match fs.mkdir(&top[t as usize], name.as_bytes(), 0o755, 0, 0) {
                Ok(n) => n,
                Err(e) if e.code == -libc::EEXIST => {
                    fs.lookup(&top[t as usize], name.as_bytes())?
                }
                Err(e) => return Err(e.into()),
            };
            v.push(n);
        }
        Ok(v[d as usize].clone())
    }
}

fn top_dirs(fs: &Dfs, a: &Args, create: bool) -> Result<Vec<Node>> {
    let root = fs.root();
    let base = match fs.lookup(&root, b"mdscale") {
        Ok(n) => n,
        Err(_) if create => fs.mkdir(&root, b"mdscale", 0o755, 0, 0)?,
        Err(e) => return Err(e.into()),
    };
    (0..a.threads)
        .map(|t| {
            let name = format!("t{t}");
            match fs.lookup(&base, name.as_bytes()) {
                Ok(n) => Ok(n),
                Err(_) if create => Ok(fs.mkdir(&base, name.as_bytes(), 0o755, 0, 0)?),
                Err(e) => Err(e.into()),
            }
        })
        .collect()
}

fn stat_one(fs: &Dfs, a: &Args, top: &[Node], i: u64) -> Result<u64> {
    let (t, d, name) = place(a, i);
    let dir = fs.lookup(&top[t as usize], format!("d{d}").as_bytes())?;
    let n = fs.lookup(&dir, name.as_bytes())?;
    Ok(fs.stat_node(&n)?.size)
}

fn wait_serving(a: &Args, secs: u64) -> Result<()> {
    let start = Instant::now();
    let last = a.files - 1;
    let mut err = String::new();
    while start.elapsed() < Duration::from_secs(secs) {
        let r = mount(a).and_then(|fs| {
            let top = top_dirs(&fs, a, false)?;
            stat_one(&fs, a, &top, last)
        });
        match r {
            Ok(size) if size == a.size as u64 => {
                println!("serving again after {:.2} s", start.elapsed().as_secs_f64());
                return Ok(());
            }
            Ok(size) => bail!("file {last} has {size} bytes, wrote {}", a.size),
            Err(e) => err = format!("{e:#}"),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    bail!("not serving after {secs} s: {err}")
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.threads == 0 || a.per_dir == 0 || a.files == 0 {
        bail!("--threads, --per-dir and --files must be positive");
    }
    if let Some(secs) = a.wait_serving {
        return wait_serving(&a, secs);
    }
    let ns = match &a.local {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
            Namespace::Local(dir.clone())
        }
        None => {
            let fs = mount(&a)?;
            let top = top_dirs(&fs, &a, !a.stats_only)?;
            let tree = Tree {
                dirs: (0..a.threads).map(|_| Mutex::default()).collect(),
            };
            Namespace::Store { fs, top, tree }
        }
    };
    if a.stats_only {
        let rate = stat_phase(&ns, &a, a.files)?;
        println!("{} stats/s over {} files", rate.round(), a.files);
        return Ok(());
    }
    let data: Vec<u8> = (0..a.size).map(|i| (i * 7 + 1) as u8).collect();
    let rss0 = a.engine_pid.map(rss_bytes).transpose()?;
    println!(
        "{:>9} {:>10} {:>10} {:>10} {:>12}",
        "files", "create/s", "stat/s", "rss_MiB", "rss_B/file"
    );
    let mut done = 0u64;
    let mut decade = 10_000u64;
    while done < a.files {
        let upto = decade.min(a.files);
        let next = AtomicU64::new(done);
        let t0 = Instant::now();
        std::thread::scope(|s| -> Result<()> {
            let hs: Vec<_> = (0..a.threads)
                .map(|_| {
                    s.spawn(|| -> Result<()> {
                        loop {
                            let i = next.fetch_add(1, Ordering::Relaxed);
                            if i >= upto {
                                return Ok(());
                            }
                            ns.create(&a, i, &data)?;
                        }
                    })
                })
                .collect();
            for h in hs {
                h.join().expect("create thread")?;
            }
            Ok(())
        })?;
        let create_rate = (upto - done) as f64 / t0.elapsed().as_secs_f64();
        done = upto;
        let stat_rate = stat_phase(&ns, &a, done)?;
        let (rss, per) = match (a.engine_pid, rss0) {
            (Some(pid), Some(r0)) => {
                let r = rss_bytes(pid)?;
                (
                    format!("{:.0}", r as f64 / (1 << 20) as f64),
                    format!("{:.0}", r.saturating_sub(r0) as f64 / done as f64),
                )
            }
            _ => ("-".into(), "-".into()),
        };
        println!("{done:>9} {create_rate:>10.0} {stat_rate:>10.0} {rss:>10} {per:>12}");
        decade *= 10;
    }
    Ok(())
}

/// Stats of `--stats` files drawn at random among the first `done`, from
/// `--threads` threads; the rate.
fn stat_phase(ns: &Namespace, a: &Args, done: u64) -> Result<f64> {
    {
        let nstat = if a.stats_only {
            a.stats
        } else {
            a.stats.min(done)
        };
        let left = AtomicU64::new(nstat);
        let t0 = Instant::now();
        std::thread::scope(|s| -> Result<()> {
            let hs: Vec<_> = (0..a.threads)
                .map(|_| {
                    s.spawn(|| -> Result<()> {
                        let mut rng = rand::thread_rng();
                        while left
                            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                                n.checked_sub(1)
                            })
                            .is_ok()
                        {
                            let i = rng.gen_range(0..done);
                            let size = ns.stat(a, i)?;
                            if size != a.size as u64 {
                                bail!("file {i}: size {size}, wrote {}", a.size);
                            }
                        }
                        Ok(())
                    })
                })
                .collect();
            for h in hs {
                h.join().expect("stat thread")?;
            }
            Ok(())
        })?;
        Ok(nstat as f64 / t0.elapsed().as_secs_f64())
    }
}
