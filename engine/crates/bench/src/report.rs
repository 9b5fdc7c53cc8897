//! Result types of a benchmark run, percentiles, and the printed table.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Throughput {
    /// Megabytes (10^6 bytes) per second, as fio reports bandwidth.
    pub mbps: f64,
    pub bytes: u64,
    pub secs: f64,
}

impl Throughput {
    pub fn new(bytes: u64, secs: f64) -> Self {
        Throughput {
            mbps: bytes as f64 / 1e6 / secs.max(1e-9),
            bytes,
            secs,
        }
    }
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Iops {
    pub iops: f64,
    pub ops: u64,
    pub secs: f64,
    pub queue_depth: usize,
    /// Threads that kept the reads in flight (absent in older results).
    #[serde(default)]
    pub threads: usize,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Latency {
    pub p50_us: f64,
    pub p99_us: f64,
    pub mean_us: f64,
    pub ops: u64,
}

impl Latency {
    /// Summarize per-operation latencies (nanoseconds); `None` when there are none.
    pub fn from_ns(mut ns: Vec<u64>) -> Option<Self> {
        if ns.is_empty() {
            return None;
        }
        ns.sort_unstable();
        let mean = ns.iter().map(|&x| x as f64).sum::<f64>() / ns.len() as f64;
        Some(Latency {
            p50_us: percentile(&ns, 50.0) as f64 / 1e3,
            p99_us: percentile(&ns, 99.0) as f64 / 1e3,
            mean_us: mean / 1e3,
            ops: ns.len() as u64,
        })
    }
}

/// Nearest-rank percentile of sorted values (the definition fio uses).
pub fn percentile(sorted: &[u64], p: f64) -> u64 {
    assert!(!sorted.is_empty());
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct Small {
    pub value_bytes: usize,
    pub threads: usize,
    pub update_ops: f64,
    pub fetch_ops: f64,
    pub ops: u64,
}

/// The small-value test on two containers in alternating blocks (`paired`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct SmallPaired {
    pub value_bytes: usize,
    pub threads: usize,
    pub blocks: u64,
    pub ops_per_side: u64,
    /// ops/s on side A (`--cont`) and side B (`--pair-cont`).
    pub update_ops: [f64; 2],
    pub fetch_ops: [f64; 2],
    /// A's rate over B's in each block.
    pub update_ratio_per_block: Vec<f64>,
    pub fetch_ratio_per_block: Vec<f64>,
}

/// Everything one run measured; tests not run are absent.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Results {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_write: Option<Throughput>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_read: Option<Throughput>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rand_read: Option<Iops>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<Latency>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small: Option<Small>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub small_paired: Option<SmallPaired>,
    /// The parameters the run used, for the record.
    #[serde(default)]
    pub config: serde_json::Value,
}

/// Numbers for tables: thousands separated, one decimal below 100.
pub fn fmt_num(v: f64) -> String {
    if v.abs() < 100.0 {
        return format!("{v:.1}");
    }
    let s = format!("{:.0}", v.abs());
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if v < 0.0 {
        format!("-{out}")
    } else {
        out
    }
}

pub fn table(r: &Results) -> String {
    let mut rows: Vec<(String, String, String)> = Vec::new();
    if let Some(t) = &r.seq_write {
        rows.push((
            "seq write 1MiB".into(),
            fmt_num(t.mbps),
            format!("MB/s ({} in {:.2}s)", mb(t.bytes), t.secs),
        ));
    }
    if let Some(t) = &r.seq_read {
        rows.push((
            "seq read 1MiB".into(),
            fmt_num(t.mbps),
            format!("MB/s ({} in {:.2}s)", mb(t.bytes), t.secs),
        ));
    }
    if let Some(t) = &r.rand_read {
        rows.push((
            format!("rand read 4KiB QD{}", t.queue_depth),
            fmt_num(t.iops),
            format!("IOPS ({} ops)", t.ops),
        ));
    }
    if let Some(t) = &r.latency {
        rows.push(("read 4KiB QD1 p50".into(), fmt_num(t.p50_us), "us".into()));
        rows.push(("read 4KiB QD1 p99".into(), fmt_num(t.p99_us), "us".into()));
        rows.push((
            "read 4KiB QD1 mean".into(),
            fmt_num(t.mean_us),
            format!("us ({} ops)", t.ops),
        ));
    }
    if let Some(t) = &r.small {
        let what = format!("ops/s ({} threads, {} ops)", t.threads, t.ops);
        rows.push((
            format!("small update {}B", t.value_bytes),
            fmt_num(t.update_ops),
            what.clone(),
        ));
        rows.push((
            format!("small fetch {}B", t.value_bytes),
            fmt_num(t.fetch_ops),
            what,
        ));
    }
    if let Some(t) = &r.small_paired {
        for (name, ops) in [("update", t.update_ops), ("fetch", t.fetch_ops)] {
            for (side, v) in ["A", "B"].iter().zip(ops) {
                rows.push((
                    format!("small {name} {}B, {side}", t.value_bytes),
                    fmt_num(v),
                    format!(
                        "ops/s ({} threads, {} ops in {} blocks per side)",
                        t.threads, t.ops_per_side, t.blocks
                    ),
                ));
            }
        }
    }
    let w0 = rows.iter().map(|r| r.0.len()).max().unwrap_or(0).max(4);
    let w1 = rows.iter().map(|r| r.1.len()).max().unwrap_or(0).max(6);
    let mut out = format!(
        "{:<w0$}  {:>w1$}  unit\n{}  {}  ----\n",
        "test",
        "result",
        "-".repeat(w0),
        "-".repeat(w1)
    );
    for (a, b, c) in rows {
        out.push_str(&format!("{a:<w0$}  {b:>w1$}  {c}\n"));
    }
    out
}

fn mb(bytes: u64) -> String {
    format!("{:.0} MiB", bytes as f64 / (1u64 << 20) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 50.0), 50);
        assert_eq!(percentile(&v, 99.0), 99);
        assert_eq!(percentile(&v, 100.0), 100);
        assert_eq!(percentile(&[7], 99.0), 7);
        let l = Latency::from_ns(vec![3000, 1000, 2000]).unwrap();
        assert_eq!((l.p50_us, l.p99_us, l.mean_us), (2.0, 3.0, 2.0));
        assert!(Latency::from_ns(vec![]).is_none());
    }

    #[test]
    fn numbers() {
        assert_eq!(fmt_num(12.345), "12.3");
        assert_eq!(fmt_num(1234.0), "1,234");
        assert_eq!(fmt_num(1234567.8), "1,234,568");
        assert_eq!(fmt_num(100.0), "100");
    }

    #[test]
    fn results_round_trip_as_json() {
        let r = Results {
            seq_write: Some(Throughput::new(2_000_000, 2.0)),
            ..Default::default()
        };
        assert_eq!(r.seq_write.as_ref().unwrap().mbps, 1.0);
        let back: Results = serde_json::from_str(&serde_json::to_string(&r).unwrap()).unwrap();
        assert_eq!(back, r);
        assert!(table(&r).contains("seq write 1MiB"));
    }
}
