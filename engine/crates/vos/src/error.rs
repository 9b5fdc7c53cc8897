//! Errors of the store: [`StorageError`] for control-plane calls and [`Errno`]
//! for data-plane replies. Both name what failed and on what.

use std::fmt;

/// A control-plane failure. `Display` names the object and the operation;
/// [`StorageError::errno`] maps it to a negative errno for the wire.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An I/O error on the device (or its file).
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// A pool (or the device) lacks room on one tier.
    #[error("pool {pool}: no space on tier {tier} of target {target} (need {need}, free {free})")]
    NoSpace {
        pool: String,
        tier: &'static str,
        target: u32,
        need: u64,
        free: u64,
    },
    /// Something named does not exist (pool, device, slot).
    #[error("{0}")]
    NotFound(String),
    /// An argument or request is malformed.
    #[error("{0}")]
    Invalid(String),
    /// The object exists with different properties.
    #[error("{0}")]
    Exists(String),
    /// The device holds something that is not ours, or we refuse to overwrite it.
    #[error("{0}")]
    Refused(String),
    /// On-device metadata failed its checks.
    #[error("{0}")]
    Corrupt(String),
    /// The store is shutting down or a target thread is gone.
    #[error("{0}")]
    Shutdown(String),
    /// Refused as things stand; the same request with fresh arguments may pass.
    #[error("{0}")]
    Retry(String),
}

impl StorageError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        StorageError::Io {
            what: what.into(),
            source,
        }
    }

    /// The negative errno a client sees for this error.
    pub fn errno(&self) -> i32 {
        -match self {
            StorageError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            StorageError::NoSpace { .. } => libc::ENOSPC,
            StorageError::NotFound(_) => libc::ENOENT,
            StorageError::Invalid(_) => libc::EINVAL,
            StorageError::Exists(_) => libc::EEXIST,
            StorageError::Refused(_) => libc::EPERM,
            StorageError::Corrupt(_) => peregrine_proto::CSUM_ERRNO,
            StorageError::Shutdown(_) => libc::ESHUTDOWN,
            StorageError::Retry(_) => libc::EAGAIN,
        }
    }
}

/// A data-plane failure: a negative errno plus a message naming what failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Errno {
    /// Negative errno (`-libc::ENOENT`, ...).
    pub code: i32,
    /// What failed, on what.
    pub msg: String,
}

impl Errno {
    pub fn new(code: i32, msg: impl Into<String>) -> Self {
        Errno {
            code,
            msg: msg.into(),
        }
    }
    pub fn inval(msg: impl Into<String>) -> Self {
        Errno::new(-libc::EINVAL, msg)
    }
}

impl fmt::Display for Errno {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.msg, self.code)
    }
}

impl std::error::Error for Errno {}

impl From<StorageError> for Errno {
    fn from(e: StorageError) -> Self {
        Errno::new(e.errno(), e.to_string())
    }
}
