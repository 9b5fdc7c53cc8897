//! A scrape: everything [`super`] lists, read from the data path's
//! counters, what the targets publish and the pool maps, without asking a
//! target anything (a scrape answers even when a target is stuck).

use super::io::{HistogramSnapshot, IoMetrics, Op, PoolIo, TargetIo};
use crate::node::Node;
use peregrine_proto::mgmt::TargetState;
use peregrine_vos::TargetSpace;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Unit;
use std::collections::BTreeMap;
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use uuid::Uuid;

type Labels = Vec<(&'static str, String)>;

/// The engine's metrics at the time of a scrape.
pub struct EngineCollector {
    pub node: Arc<Node>,
}

impl fmt::Debug for EngineCollector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "EngineCollector(rank {})", self.node.cfg.rank)
    }
}

/// The label of a target's state in a pool map (DAOS's names, lowercase).
pub fn state_name(s: TargetState) -> &'static str {
    match s {
        TargetState::TargetUpIn => "upin",
        TargetState::TargetUp => "up",
        TargetState::TargetDown => "down",
        TargetState::TargetDownOut => "downout",
    }
}

const STATES: [TargetState; 4] = [
    TargetState::TargetUpIn,
    TargetState::TargetUp,
    TargetState::TargetDown,
    TargetState::TargetDownOut,
];

fn counters(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    series: Vec<(Labels, u64)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (labels, v) in series {
        ConstCounter::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn gauges(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    series: Vec<(Labels, i64)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, v) in series {
        ConstGauge::new(v).encode(m.encode_family(&labels)?)?;
    }
    Ok(())
}

fn histograms(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: Vec<(Labels, HistogramSnapshot)>,
) -> fmt::Result {
    let mut m = enc.encode_descriptor(name, help, Some(&Unit::Seconds), MetricType::Histogram)?;
    for (labels, (sum, count, buckets)) in series {
        m.encode_family(&labels)?
            .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
    }
    Ok(())
}

fn load(a: &AtomicU64) -> u64 {
    a.load(Ordering::Relaxed)
}

fn gauge_of(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// The data path's series of every pool that exists: counted pools, and
/// pools not yet written to at zero (so that a rate has a start).
struct PoolSeries<'a> {
    io: &'a IoMetrics,
    /// (pool label, its counters if any request of it was counted).
    pools: Vec<(String, Option<&'a PoolIo>)>,
}

impl<'a> PoolSeries<'a> {
    fn new(io: &'a IoMetrics, existing: &BTreeMap<Uuid, PoolSummary>) -> PoolSeries<'a> {
        let mut pools: Vec<(String, Option<&PoolIo>)> = Vec::new();
        let mut counted = std::collections::HashSet::new();
        for p in io.pools() {
            if p.pool.is_nil() {
                pools.push(("other".into(), Some(p)));
            } else if existing.contains_key(&p.pool) {
                counted.insert(p.pool);
                pools.push((p.pool.to_string(), Some(p)));
            }
        }
        for pool in existing.keys().filter(|p| !counted.contains(*p)) {
            pools.push((pool.to_string(), None));
        }
        PoolSeries { io, pools }
    }

    /// One value per (pool, target, extra labels) from each target's counters.
    fn each<T>(
        &self,
        extra: &[(&'static str, &str)],
        f: impl Fn(&TargetIo) -> T,
    ) -> Vec<(Labels, T)>
    where
        T: Default,
    {
        let mut out = Vec::new();
        for (label, io) in &self.pools {
            for t in 0..self.io.targets() {
                let mut labels: Labels = vec![("pool", label.clone()), ("target", t.to_string())];
                labels.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
                let v = io.map_or_else(T::default, |p| f(&p.targets[t as usize]));
                out.push((labels, v));
            }
        }
        out
    }
}

/// One pool as this engine sees it: its space summed over the targets,
/// its map version and its targets' state.
#[derive(Default)]
struct PoolSummary {
    scm: (u64, u64),
    nvme: (u64, u64),
    version: u64,
    state: Option<TargetState>,
}

impl Collector for EngineCollector {
    fn encode(&self, mut enc: DescriptorEncoder) -> fmt::Result {
        let node = &self.node;
        let storage = node.storage().ok();
        gauges(
            &mut enc,
            "peregrine_engine_ready",
            "Whether the engine's storage is open (0: maintenance mode, no I/O).",
            None,
            vec![(vec![], storage.is_some() as i64)],
        )?;
        let Some(storage) = storage else {
            return Ok(());
        };
        let targets = storage.targets();
        let spaces: Vec<TargetSpace> = storage.counters().iter().map(|c| c.space()).collect();
        let mut pools: BTreeMap<Uuid, PoolSummary> = BTreeMap::new();
        for s in &spaces {
            for (pool, scm, nvme) in &s.pools {
                let p = pools.entry(*pool).or_default();
                p.scm = (p.scm.0 + scm.total, p.scm.1 + scm.used);
                p.nvme = (p.nvme.0 + nvme.total, p.nvme.1 + nvme.used);
            }
        }
        for (pool, view) in node.pool_maps.views() {
            let p = pools.entry(pool).or_default();
            p.version = view.version;
            p.state = Some(view.state);
        }
        let series = PoolSeries::new(node.io, &pools);

        // Per pool and target: the data path.
        let ops = |f: fn(&TargetIo) -> &[AtomicU64; Op::ALL.len()]| {
            Op::ALL
                .iter()
                .flat_map(|op| series.each(&[("op", op.name())], |t| load(&f(t)[*op as usize])))
                .collect::<Vec<_>>()
        };
        counters(
            &mut enc,
            "peregrine_target_ops",
            "Requests answered by a target, by pool and kind of request.",
            None,
            ops(|t| &t.ops),
        )?;
        counters(
            &mut enc,
            "peregrine_target_op_failures",
            "Of the requests answered, those that failed (or were refused before the target, as with a stale pool map).",
            None,
            ops(|t| &t.failed),
        )?;
        counters(
            &mut enc,
            "peregrine_target_update",
            "Value bytes stored by updates.",
            Some(&Unit::Bytes),
            series.each(&[], |t| load(&t.update_bytes)),
        )?;
        counters(
            &mut enc,
            "peregrine_target_fetch",
            "Value bytes returned by fetches.",
            Some(&Unit::Bytes),
            series.each(&[], |t| load(&t.fetch_bytes)),
        )?;
        histograms(
            &mut enc,
            "peregrine_target_update_latency",
            "Time from an update's arrival at the engine to its acknowledgement (written), successful updates.",
            series.each(&[], |t| t.update_latency.snapshot()),
        )?;
        histograms(
            &mut enc,
            "peregrine_target_fetch_latency",
            "Time from a fetch's arrival at the engine to its reply, successful fetches.",
            series.each(&[], |t| t.fetch_latency.snapshot()),
        )?;
        counters(
            &mut enc,
            "peregrine_target_checksum_errors",
            "Checksum failures: fetched values whose stored data is corrupt, and updates whose data was damaged on the way.",
            None,
            series.each(&[], |t| load(&t.checksum_errors)),
        )?;
        counters(
            &mut enc,
            "peregrine_target_io_errors",
            "Requests and fetched values that failed with EIO: a device read or write failed.",
            None,
            series.each(&[], |t| load(&t.io_errors)),
        )?;

        // Per target: its queue, log and space.
        let per_target = |f: &dyn Fn(u32) -> u64| {
            (0..targets)
                .map(|t| (vec![("target", t.to_string())], f(t)))
                .collect::<Vec<_>>()
        };
        let c = storage.counters();
        gauges(
            &mut enc,
            "peregrine_target_queue_depth",
            "Requests handed to a target and not answered yet.",
            None,
            (0..targets)
                .map(|t| (vec![("target", t.to_string())], node.io.queue_depth(t)))
                .collect(),
        )?;
        counters(
            &mut enc,
            "peregrine_target_wal_records",
            "WAL records written (one per group commit or control operation) since the engine started.",
            None,
            per_target(&|t| c[t as usize].wal_records()),
        )?;
        counters(
            &mut enc,
            "peregrine_target_wal_flushes",
            "Device flushes (fdatasync) of committed batches since the engine started.",
            None,
            per_target(&|t| c[t as usize].flushes()),
        )?;
        counters(
            &mut enc,
            "peregrine_target_checkpoints",
            "Index checkpoints written since the engine started.",
            None,
            per_target(&|t| c[t as usize].checkpoints()),
        )?;
        let tiers = |f: &dyn Fn(&TargetSpace) -> (u64, u64)| {
            let mut out = Vec::new();
            for (t, s) in spaces.iter().enumerate() {
                let (scm, nvme) = f(s);
                for (tier, v) in [("scm", scm), ("nvme", nvme)] {
                    out.push((
                        vec![("target", t.to_string()), ("tier", tier.into())],
                        gauge_of(v),
                    ));
                }
            }
            out
        };
        gauges(
            &mut enc,
            "peregrine_target_space_size",
            "A target's space per tier: its share of the RAM budget (scm) and its data region on the device (nvme).",
            Some(&Unit::Bytes),
            tiers(&|s| (s.scm.total, s.nvme.total)),
        )?;
        gauges(
            &mut enc,
            "peregrine_target_space_used",
            "Bytes of a target's space used by the data and metadata of all its pools.",
            Some(&Unit::Bytes),
            tiers(&|s| (s.scm.used, s.nvme.used)),
        )?;
        gauges(
            &mut enc,
            "peregrine_target_faulted",
            "1 while a target refuses updates after a device write failed (until the engine restarts).",
            None,
            (0..targets)
                .map(|t| (vec![("target", t.to_string())], storage.fault(t).is_some() as i64))
                .collect(),
        )?;

        // Per pool: this engine's part of it.
        let per_pool = |f: &dyn Fn(&PoolSummary) -> (u64, u64)| {
            let mut out = Vec::new();
            for (pool, p) in &pools {
                let (scm, nvme) = f(p);
                for (tier, v) in [("scm", scm), ("nvme", nvme)] {
                    out.push((
                        vec![("pool", pool.to_string()), ("tier", tier.into())],
                        gauge_of(v),
                    ));
                }
            }
            out
        };
        gauges(
            &mut enc,
            "peregrine_pool_space_size",
            "A pool's space reserved on this engine's targets, per tier.",
            Some(&Unit::Bytes),
            per_pool(&|p| (p.scm.0, p.nvme.0)),
        )?;
        gauges(
            &mut enc,
            "peregrine_pool_space_used",
            "Bytes of a pool's space used on this engine's targets, per tier.",
            Some(&Unit::Bytes),
            per_pool(&|p| (p.scm.1, p.nvme.1)),
        )?;
        let mut states = Vec::new();
        for (pool, p) in &pools {
            // A pool created since the last pool map is served as up and in (see `crate::poolmap`).
            let now = p.state.unwrap_or(TargetState::TargetUpIn);
            for s in STATES {
                let n = if s == now { targets as i64 } else { 0 };
                states.push((
                    vec![("pool", pool.to_string()), ("state", state_name(s).into())],
                    n,
                ));
            }
        }
        gauges(
            &mut enc,
            "peregrine_pool_targets",
            "This engine's targets of a pool by their state in the pool map (upin, up: reintegrating, down, downout).",
            None,
            states,
        )?;
        gauges(
            &mut enc,
            "peregrine_pool_map_version",
            "The pool map version this engine holds (0: none pushed yet).",
            None,
            pools
                .iter()
                .map(|(pool, p)| (vec![("pool", pool.to_string())], gauge_of(p.version)))
                .collect(),
        )?;
        Ok(())
    }
}
