//! The shared harness (crates/testcluster).
#![allow(unused_imports, dead_code)]
pub use peregrine_testcluster::*;

pub mod preload;
pub use preload::*;
