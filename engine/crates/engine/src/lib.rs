//! The Peregrine engine: one process per node (or disk group) serving its
//! targets' storage over the data plane, the `Engine` control service, and,
//! on the first management-service replica, the `Mgmt` service.

pub mod config;
pub mod control;
pub mod dataplane;
pub mod ms;
pub mod node;
