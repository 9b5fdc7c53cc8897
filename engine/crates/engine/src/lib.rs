//! The Peregrine engine: one process per node (or disk group) serving its
//! targets' storage over the data plane, the `Engine` control service, and,
//! on the first management-service replica, the `Mgmt` service.

// gRPC handlers return tonic::Status, which is large by design; boxing it everywhere buys nothing here.
#![allow(clippy::result_large_err)]

pub mod access;
pub mod auth;
pub mod config;
pub mod control;
pub mod dataplane;
pub mod dtx;
pub mod fuzz;
pub mod metrics;
pub mod ms;
pub mod node;
pub mod poolmap;
pub mod request;
pub mod shm;
pub mod tls;
