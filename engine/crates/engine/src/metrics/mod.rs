//! The engine's Prometheus metrics, served by `--metrics-listen ADDR` at
//! `GET /metrics` (see [`http`]; docs/metrics.md lists them for operators).
//!
//! Every series carries `rank`. Per pool (`pool`: its UUID) and target
//! (`target`: its index on this engine), from the data path ([`io`]):
//! `peregrine_target_ops_total{op}`, `peregrine_target_op_failures_total{op}`,
//! `peregrine_target_update_bytes_total`, `peregrine_target_fetch_bytes_total`,
//! `peregrine_target_{update,fetch}_latency_seconds` (histograms),
//! `peregrine_target_checksum_errors_total`, `peregrine_target_io_errors_total`.
//! Per target: `peregrine_target_queue_depth`, `peregrine_target_wal_records_total`,
//! `peregrine_target_wal_flushes_total`, `peregrine_target_checkpoints_total`,
//! `peregrine_target_space_{size,used}_bytes{tier}`, `peregrine_target_faulted`.
//! Per pool (this engine's part of it): `peregrine_pool_space_{size,used}_bytes{tier}`,
//! `peregrine_pool_targets{state}`, `peregrine_pool_map_version`. And
//! `peregrine_engine_ready`.
//!
//! What it costs: a request is counted with a few relaxed atomic adds on
//! counters of its own target (no lock, see [`io`]); a scrape reads those,
//! what the targets publish ([`peregrine_vos::TargetCounters`]) and the
//! pool maps, and never waits for a target.

mod collect;
pub mod http;
pub mod io;

pub use collect::state_name;
pub use io::IoMetrics;

use crate::node::Node;
use prometheus_client::registry::Registry;
use std::sync::Arc;

/// The registry a scrape encodes: the engine's collector, labelled with its rank.
pub fn registry(node: Arc<Node>) -> Registry {
    let rank = node.cfg.rank.to_string();
    let mut r = Registry::with_labels([("rank".into(), rank.into())].into_iter());
    r.register_collector(Box::new(collect::EngineCollector { node }));
    r
}
