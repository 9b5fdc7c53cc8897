//! `peregrine-bench`: measure a live Peregrine system with the client library.
//!
//! ```text
//! peregrine-bench --mgmt ADDR --pool P --cont C [--tests seq,rand,lat,small] [--json-out FILE]
//! peregrine-bench compare --peregrine RESULTS.json --fio FIO.json [--json-out FILE]
//! ```
//!
//! The first form runs the tests (see [`tests`]) and prints a table; the second
//! puts a run next to fio's numbers for the same patterns on the raw device
//! (bench/run.sh drives both).

mod compare;
mod paired;
mod report;
mod tests;

use anyhow::{bail, Context, Result};
use clap::{Args, Parser, Subcommand, ValueEnum};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "peregrine-bench",
    version,
    about = "Benchmark a live Peregrine system",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    #[command(subcommand)]
    cmd: Option<Cmd>,
    #[command(flatten)]
    run: RunArgs,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Compare a peregrine-bench result file with fio's JSON output.
    Compare {
        /// A file written by `peregrine-bench --json-out`.
        #[arg(long, value_name = "FILE")]
        peregrine: PathBuf,
        /// fio's `--output-format=json` output, jobs named seq_write, seq_read, rand_read_qd32, lat_qd1.
        #[arg(long, value_name = "FILE")]
        fio: PathBuf,
        /// Write the combined result as JSON.
        #[arg(long, value_name = "FILE")]
        json_out: Option<PathBuf>,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Test {
    /// 1 MiB sequential update, then fetch, several threads.
    Seq,
    /// 4 KiB random fetch at a queue depth (threads), IOPS.
    Rand,
    /// 4 KiB random fetch at QD1: median and p99 latency.
    Lat,
    /// 64 B single-value update and fetch, ops/s.
    Small,
    /// The small test on --cont and --pair-cont in alternating blocks (bench/access-paired.sh).
    SmallPaired,
}

#[derive(Args, Debug, Clone)]
pub struct RunArgs {
    /// Management service address.
    #[arg(
        long,
        env = "PEREGRINE_MGMT",
        default_value = "127.0.0.1:10001",
        value_name = "ADDR"
    )]
    pub mgmt: String,
    /// Pool label or UUID.
    #[arg(long, value_name = "POOL")]
    pub pool: Option<String>,
    /// Container label or UUID.
    #[arg(long, value_name = "CONT")]
    pub cont: Option<String>,
    /// Tests to run, comma separated.
    #[arg(
        long,
        value_enum,
        value_delimiter = ',',
        default_value = "seq,rand,lat,small"
    )]
    pub tests: Vec<Test>,
    /// Object class of the benchmark's objects (default: the container's).
    #[arg(long, value_name = "CLASS")]
    pub oclass: Option<String>,
    /// Total bytes of the sequential test (also the data set the random tests read).
    #[arg(long, value_parser = parse_size, default_value = "1GiB", value_name = "SIZE")]
    pub seq_bytes: u64,
    /// Request size of the sequential test.
    #[arg(long, value_parser = parse_size, default_value = "1MiB", value_name = "SIZE")]
    pub block: u64,
    /// Threads of the sequential test, each with its own object.
    #[arg(long, default_value_t = 4)]
    pub threads: usize,
    /// Request size of the random and latency tests.
    #[arg(long, value_parser = parse_size, default_value = "4KiB", value_name = "SIZE")]
    pub rand_block: u64,
    /// Requests in flight in the random test.
    #[arg(long, default_value_t = 32)]
    pub qd: usize,
    /// Threads of the random test: each keeps its share of --qd in flight
    /// as one batch (`Container::fetch_arrays`); --rand-threads equal to
    /// --qd is one blocking read per thread.
    #[arg(long, default_value_t = 2)]
    pub rand_threads: usize,
    /// Seconds the random test runs.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    pub rand_secs: f64,
    /// Seconds the QD1 latency test runs.
    #[arg(long, default_value_t = 10.0, value_name = "SECS")]
    pub lat_secs: f64,
    /// Operations of the small-value test (each of update and fetch).
    #[arg(long, default_value_t = 40_000)]
    pub small_ops: u64,
    /// Threads of the small-value test.
    #[arg(long, default_value_t = 4)]
    pub small_threads: usize,
    /// Bytes of each small value.
    #[arg(long, default_value_t = 64)]
    pub small_size: usize,
    /// The second pool of --tests small-paired.
    #[arg(long, value_name = "POOL")]
    pub pair_pool: Option<String>,
    /// The second container of --tests small-paired (in --pair-pool).
    #[arg(long, value_name = "CONT")]
    pub pair_cont: Option<String>,
    /// Blocks per side of --tests small-paired (--small-ops split among them).
    #[arg(long, default_value_t = 40)]
    pub pair_blocks: u64,
    /// Check every byte read in the sequential test against what was written.
    #[arg(long)]
    pub verify: bool,
    /// Write the results as JSON.
    #[arg(long, value_name = "FILE")]
    pub json_out: Option<PathBuf>,
    /// Data-plane transport: tcp, shm (shared memory with engines on this node) or auto.
    #[arg(long, env = "PEREGRINE_TRANSPORT", default_value = "auto", value_parser = parse_transport)]
    pub transport: peregrine::TransportKind,
}

fn parse_transport(s: &str) -> Result<peregrine::TransportKind, String> {
    s.parse().map_err(|e: peregrine::Error| e.msg)
}

/// Sizes as the CLI takes them (binary units): 4096, 4KiB, 1M, 1GiB; zero is no size here.
pub fn parse_size(s: &str) -> Result<u64, String> {
    match peregrine_proto::size::parse_size(s) {
        Ok(0) => Err(format!("{s:?}: must be positive")),
        r => r.map_err(|e| format!("{s:?}: {e}")),
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let r = match cli.cmd {
        Some(Cmd::Compare {
            peregrine,
            fio,
            json_out,
        }) => compare_files(&peregrine, &fio, json_out.as_deref()),
        None => run(&cli.run),
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("peregrine-bench: {}", format!("{e:#}").replace('\n', " "));
            ExitCode::from(1)
        }
    }
}

fn run(a: &RunArgs) -> Result<()> {
    let (Some(pool), Some(cont)) = (&a.pool, &a.cont) else {
        bail!("--pool and --cont are required to run the tests");
    };
    if a.threads == 0 || a.qd == 0 || a.small_threads == 0 || a.rand_threads == 0 {
        bail!("--threads, --qd, --rand-threads and --small-threads must be at least 1");
    }
    let results = tests::run_all(a, pool, cont)?;
    print!("{}", report::table(&results));
    if let Some(p) = &a.json_out {
        write_json(p, &serde_json::to_value(&results)?)?;
    }
    Ok(())
}

fn compare_files(
    peregrine: &std::path::Path,
    fio: &std::path::Path,
    out: Option<&std::path::Path>,
) -> Result<()> {
    let p: report::Results = serde_json::from_str(
        &std::fs::read_to_string(peregrine)
            .with_context(|| format!("reading {}", peregrine.display()))?,
    )
    .with_context(|| format!("{}: not a peregrine-bench result", peregrine.display()))?;
    let f = compare::parse_fio(
        &std::fs::read_to_string(fio).with_context(|| format!("reading {}", fio.display()))?,
    )
    .with_context(|| fio.display().to_string())?;
    let rows = compare::rows(&p, &f);
    print!("{}", compare::table(&rows));
    if let Some(out) = out {
        write_json(out, &compare::to_json(&p, &f, &rows))?;
    }
    Ok(())
}

fn write_json(path: &std::path::Path, v: &serde_json::Value) -> Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let text = serde_json::to_string_pretty(v)? + "\n";
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod cli_tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn command_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("100"), Ok(100));
        assert!(parse_size("0").is_err());
        assert!(parse_size("1XB").is_err());
    }

    #[test]
    fn test_lists() {
        let c = Cli::try_parse_from([
            "peregrine-bench",
            "--pool",
            "p",
            "--cont",
            "c",
            "--tests",
            "seq,lat",
        ])
        .unwrap();
        assert_eq!(c.run.tests, vec![Test::Seq, Test::Lat]);
        assert!(Cli::try_parse_from(["peregrine-bench", "--tests", "bogus"]).is_err());
    }
}
