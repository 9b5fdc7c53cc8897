//! Peregrine client library.
//!
//! Connects to a Peregrine system (management gRPC + data-plane frames),
//! places objects on targets ([`placement`]), keeps redundancy
//! (replication, Reed-Solomon erasure coding from ISA-L), checks data end
//! to end with CRC32C, and exposes all of it to Rust ([`Client`], [`Pool`],
//! [`Container`], [`Object`]) and to C (`include/peregrine.h`, [`capi`]).
//!
//! ```no_run
//! use peregrine::{Client, ObjectClass, ObjectId, Security};
//! let client = Client::connect("127.0.0.1:10001", &Security::tls("/etc/peregrine/tls"))?;
//! let pool = client.pool_connect("tank")?;
//! let cont = pool.cont_open("data")?;
//! let obj = cont.object(ObjectId::new(ObjectClass::Rp2G1, 0, 1))?;
//! obj.update_single(b"dkey", b"akey", b"value")?;
//! assert_eq!(obj.fetch_single(b"dkey", b"akey")?.as_deref(), Some(&b"value"[..]));
//! # Ok::<(), peregrine::Error>(())
//! ```
//!
//! Layout decisions (EC cells and the size companion akey, read order,
//! degraded reads) are documented in [`object`]. One thread keeps many
//! array reads in flight with a [`ReadQueue`] (an event queue: each reply
//! taken as it comes) or [`Container::fetch_arrays`] (a batch).

pub mod agent;
mod batch;
pub mod capi;
/// Certificates for local use (`peregrine certs`, test clusters).
#[cfg(feature = "certgen")]
pub mod certs;
pub mod client;
pub mod clone;
pub mod container;
pub mod credential;
pub mod dirs_changed;
mod discard;
pub mod dtx;
mod ec_read;
mod ec_write;
pub mod error;
mod fds;
pub mod handoff;
pub mod hlc;
pub mod mgmt;
pub mod object;
pub mod placement;
pub mod pool;
mod read;
pub mod reintegrate;
pub mod shm;
pub mod signals;
pub mod sync;
/// Test-only: an in-process fake engine cluster, out of the shipped library
/// (feature `testkit`, which the crate's own tests enable).
#[cfg(any(test, feature = "testkit"))]
#[doc(hidden)]
pub mod testkit;
pub mod tls;
pub mod transaction;
pub mod transport;
mod workers;

pub use batch::{ArrayRead, Completed, ReadQueue};
pub use client::Client;
pub use container::Container;
pub use discard::{DiscardQueue, Discarding, DISCARD_BATCH, DISCARD_DELAY};
pub use error::{Error, Result};
pub use mgmt::Mgmt;
pub use object::{Object, ObjectAt};
pub use peregrine_proto::{ObjectClass, ObjectId, EPOCH_LATEST};
pub use pool::Pool;
pub use read::{FetchedWithEnd, FETCH_WITH_END_MAX};
pub use tls::Security;
pub use transaction::{Expect, Transaction};
pub use transport::{
    MultiTransport, TcpConfig, TcpTransport, Transport, TransportKind, TransportStats,
};
pub use workers::par_map;

#[cfg(test)]
mod tests;
