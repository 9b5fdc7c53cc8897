//! `peregrine-bench compare`: put a peregrine-bench result next to fio's JSON
//! output for the same patterns on a raw device file, as one table.
//!
//! fio's jobs are matched by name: `seq_write`, `seq_read`, `rand_read_qd32`,
//! `lat_qd1` (bench/run.sh writes the job file with these names).

use crate::report::{fmt_num, Results};
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

/// What fio measured, in the units the peregrine results use.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct FioNumbers {
    pub seq_write_mbps: Option<f64>,
    pub seq_read_mbps: Option<f64>,
    pub rand_read_qd32_iops: Option<f64>,
    pub lat_qd1_p50_us: Option<f64>,
    pub lat_qd1_p99_us: Option<f64>,
}

/// fio prints warnings before its JSON on stdout in some versions; skip to the first `{`.
pub fn parse_fio(text: &str) -> Result<FioNumbers> {
    let start = text.find('{').context("no JSON object in fio output")?;
    let v: Value = serde_json::from_str(&text[start..]).context("fio output is not valid JSON")?;
    let jobs = v["jobs"]
        .as_array()
        .context("fio output has no \"jobs\" array")?;
    let mut n = FioNumbers::default();
    for job in jobs {
        let name = job["jobname"].as_str().unwrap_or_default();
        let bw = |dir: &str| job[dir]["bw_bytes"].as_f64().map(|b| b / 1e6);
        match name {
            "seq_write" => n.seq_write_mbps = bw("write"),
            "seq_read" => n.seq_read_mbps = bw("read"),
            "rand_read_qd32" => n.rand_read_qd32_iops = job["read"]["iops"].as_f64(),
            "lat_qd1" => {
                let pct = &job["read"]["clat_ns"]["percentile"];
                let at = |p: &str| {
                    pct.as_object().and_then(|m| {
                        // Keys look like "50.000000"; match on the numeric value.
                        m.iter()
                            .find(|(k, _)| k.parse::<f64>().ok() == p.parse::<f64>().ok())
                            .and_then(|(_, v)| v.as_f64())
                    })
                };
                n.lat_qd1_p50_us = at("50").map(|ns| ns / 1e3);
                n.lat_qd1_p99_us = at("99").map(|ns| ns / 1e3);
            }
            _ => {}
        }
    }
    if n == FioNumbers::default() {
        bail!("fio output holds none of the jobs seq_write, seq_read, rand_read_qd32, lat_qd1");
    }
    Ok(n)
}

/// One line of the comparison.
pub struct Row {
    pub test: &'static str,
    pub unit: &'static str,
    pub peregrine: Option<f64>,
    pub raw: Option<f64>,
    /// Latencies: lower is better, so the share of raw performance is raw/peregrine.
    pub lower_is_better: bool,
}

impl Row {
    /// Share of the raw device's performance Peregrine reaches (1.00 = as fast as raw).
    pub fn ratio(&self) -> Option<f64> {
        let (p, r) = (self.peregrine?, self.raw?);
        if p <= 0.0 || r <= 0.0 {
            return None;
        }
        Some(if self.lower_is_better { r / p } else { p / r })
    }
}

pub fn rows(p: &Results, f: &FioNumbers) -> Vec<Row> {
    let row = |test, unit, peregrine, raw, lower_is_better| Row {
        test,
        unit,
        peregrine,
        raw,
        lower_is_better,
    };
    vec![
        row(
            "seq write 1MiB x4",
            "MB/s",
            p.seq_write.as_ref().map(|t| t.mbps),
            f.seq_write_mbps,
            false,
        ),
        row(
            "seq read 1MiB x4",
            "MB/s",
            p.seq_read.as_ref().map(|t| t.mbps),
            f.seq_read_mbps,
            false,
        ),
        row(
            "rand read 4KiB QD32",
            "IOPS",
            p.rand_read.as_ref().map(|t| t.iops),
            f.rand_read_qd32_iops,
            false,
        ),
        row(
            "read 4KiB QD1 p50",
            "us",
            p.latency.as_ref().map(|t| t.p50_us),
            f.lat_qd1_p50_us,
            true,
        ),
        row(
            "read 4KiB QD1 p99",
            "us",
            p.latency.as_ref().map(|t| t.p99_us),
            f.lat_qd1_p99_us,
            true,
        ),
        row(
            "small update 64B",
            "ops/s",
            p.small.as_ref().map(|t| t.update_ops),
            None,
            false,
        ),
        row(
            "small fetch 64B",
            "ops/s",
            p.small.as_ref().map(|t| t.fetch_ops),
            None,
            false,
        ),
    ]
}

pub fn table(rows: &[Row]) -> String {
    let opt = |v: Option<f64>| v.map(fmt_num).unwrap_or_else(|| "-".into());
    let cells: Vec<[String; 5]> = rows
        .iter()
        .map(|r| {
            [
                r.test.to_string(),
                r.unit.to_string(),
                opt(r.peregrine),
                opt(r.raw),
                r.ratio()
                    .map(|x| format!("{x:.2}"))
                    .unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    let head = ["test", "unit", "peregrine", "raw fio", "ratio"];
    let mut w: Vec<usize> = head.iter().map(|h| h.len()).collect();
    for c in &cells {
        for (i, s) in c.iter().enumerate() {
            w[i] = w[i].max(s.len());
        }
    }
    let mut out = String::new();
    let mut line = |c: &[String]| {
        out.push_str(&format!(
            "{:<w0$}  {:<w1$}  {:>w2$}  {:>w3$}  {:>w4$}\n",
            c[0],
            c[1],
            c[2],
            c[3],
            c[4],
            w0 = w[0],
            w1 = w[1],
            w2 = w[2],
            w3 = w[3],
            w4 = w[4]
        ));
    };
    line(&head.map(String::from));
    line(&w.iter().map(|n| "-".repeat(*n)).collect::<Vec<_>>());
    for c in &cells {
        line(c);
    }
    out
}

pub fn to_json(p: &Results, f: &FioNumbers, rows: &[Row]) -> Value {
    json!({
        "peregrine": p,
        "fio": {
            "seq_write_mbps": f.seq_write_mbps, "seq_read_mbps": f.seq_read_mbps,
            "rand_read_qd32_iops": f.rand_read_qd32_iops,
            "lat_qd1_p50_us": f.lat_qd1_p50_us, "lat_qd1_p99_us": f.lat_qd1_p99_us,
        },
        "rows": rows.iter().map(|r| json!({
            "test": r.test, "unit": r.unit, "peregrine": r.peregrine, "raw_fio": r.raw, "ratio": r.ratio(),
        })).collect::<Vec<_>>(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::{Latency, Throughput};

    const FIO: &str = r#"note: both iodepth >= 1 and synchronous I/O engine are selected
{
  "fio version" : "fio-3.33",
  "jobs" : [
    {"jobname": "seq_write", "write": {"bw_bytes": 2000000000, "iops": 1907.3}, "read": {"bw_bytes": 0}},
    {"jobname": "seq_read", "read": {"bw_bytes": 3000000000, "iops": 2861.0}},
    {"jobname": "rand_read_qd32", "read": {"bw_bytes": 409600000, "iops": 100000.0}},
    {"jobname": "lat_qd1", "read": {"iops": 10000.0, "clat_ns": {"percentile": {"50.000000": 80000, "99.000000": 150000}}}}
  ]
}"#;

    #[test]
    fn parses_fio_json() {
        let n = parse_fio(FIO).unwrap();
        assert_eq!(n.seq_write_mbps, Some(2000.0));
        assert_eq!(n.seq_read_mbps, Some(3000.0));
        assert_eq!(n.rand_read_qd32_iops, Some(100000.0));
        assert_eq!(n.lat_qd1_p50_us, Some(80.0));
        assert_eq!(n.lat_qd1_p99_us, Some(150.0));
        assert!(parse_fio("{\"jobs\": []}").is_err());
        assert!(parse_fio("garbage").is_err());
    }

    #[test]
    fn ratios_are_share_of_raw() {
        let p = Results {
            seq_write: Some(Throughput {
                mbps: 1000.0,
                bytes: 1,
                secs: 1.0,
            }),
            latency: Some(Latency {
                p50_us: 160.0,
                p99_us: 300.0,
                mean_us: 170.0,
                ops: 10,
            }),
            ..Default::default()
        };
        let f = parse_fio(FIO).unwrap();
        let rows = rows(&p, &f);
        assert_eq!(rows[0].ratio(), Some(0.5));
        assert_eq!(rows[3].ratio(), Some(0.5), "latency ratio is raw/peregrine");
        assert_eq!(rows[1].ratio(), None, "no peregrine number, no ratio");
        let t = table(&rows);
        assert!(t.contains("seq write 1MiB x4") && t.contains("0.50"), "{t}");
        let j = to_json(&p, &f, &rows);
        assert_eq!(j["rows"][0]["ratio"], 0.5);
    }
}
