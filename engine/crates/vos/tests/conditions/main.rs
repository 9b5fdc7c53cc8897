//! Conditions of updates and punches (`Condition`) on a real target:
//! `absent` (-EEXIST while the akey has a visible value), `unchanged_since`
//! (-EBUSY once a version or punch of the akey, its dkey or its object is
//! newer), -EBUSY whatever the condition while another transaction holds
//! (or is preparing) a change of the akey, a transaction's own changes not
//! counting, `insert_only` as absent-conditions, nothing stored when a
//! condition fails, malformed conditions refused, and a prepared
//! transaction still blocking after the target is reopened.

#[path = "../common/mod.rs"]
mod common;
mod helpers;
mod plain;
mod transactions;

use common::*;
use helpers::*;
use peregrine_vos::*;
use uuid::Uuid;

const LATEST: u64 = u64::MAX;
