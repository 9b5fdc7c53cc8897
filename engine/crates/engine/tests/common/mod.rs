//! The shared harness (crates/testcluster).
#![allow(unused_imports, dead_code)]
pub use peregrine_testcluster::*;

/// The engine binary cargo built for these tests.
pub const ENGINE_BIN: &str = env!("CARGO_BIN_EXE_peregrine-engine");
