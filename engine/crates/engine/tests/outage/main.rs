//! Engines that go away and come back while clients write: every read
//! returns a version that was written and is not older than the last one
//! acknowledged before the read began; after the return every object reads
//! back as its last acknowledged version through every replica (each
//! engine stopped in turn).
//!
//! The writer keeps one history per object (single writer, so versions are
//! ordered): version `v` overwrites a prefix of an ARRAY value with a
//! pattern, or punches it (every 7th), and sets a SINGLE value to `v`.
//! Readers check each read against the versions that were acknowledged
//! before it began or started before it ended.

#[path = "../common/mod.rs"]
mod common;
mod harness;
mod outages;
mod reintegration;
mod restarts;
mod workload;

use common::*;
use harness::*;
use peregrine_isal::crc32c;
use peregrine_proto::mgmt::{PoolQueryReq, SystemQueryReq};
use peregrine_proto::oclass::EC_CELL_SIZE;
use peregrine_proto::{ObjectClass, ObjectId, Redundancy};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use workload::*;

const OBJECTS: u64 = 16;

/// These tests run one at a time (each starts three to six engines and
/// kills some; two at once on a 2-core machine stretch the timings they
/// exercise).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
/// Longer than the management service's failure detection (6 s).
const LONG: Duration = Duration::from_secs(9);
/// Shorter than it: the engine is back before anyone notices.
const SHORT: Duration = Duration::from_secs(2);
