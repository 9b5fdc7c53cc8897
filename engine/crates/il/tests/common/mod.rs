//! The shared harness (crates/testcluster).
#![allow(unused_imports)]
pub use peregrine_testcluster::*;
