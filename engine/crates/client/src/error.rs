//! The one error type of the client library: a negative errno plus a message
//! that names what failed (pool, rank, address, object, dkey), so the C ABI
//! can return the code and keep the text for `prg_last_error()`.

use std::fmt;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Error {
    /// Negative errno (`-libc::ENOENT`, ...); never 0.
    pub code: i32,
    /// What failed, for humans.
    pub msg: String,
}

pub type Result<T> = std::result::Result<T, Error>;

impl Error {
    pub fn new(code: i32, msg: impl Into<String>) -> Error {
        debug_assert!(code < 0, "error codes are negative errnos");
        Error {
            code,
            msg: msg.into(),
        }
    }
    pub fn inval(msg: impl Into<String>) -> Error {
        Error::new(-libc::EINVAL, msg)
    }
    pub fn io(msg: impl Into<String>) -> Error {
        Error::new(-libc::EIO, msg)
    }
    /// Prefix the message with context, keeping the code.
    pub fn context(self, what: impl fmt::Display) -> Error {
        Error {
            code: self.code,
            msg: format!("{what}: {}", self.msg),
        }
    }
    /// Map an I/O error to its errno (timeouts become -ETIMEDOUT).
    pub fn from_io(e: &std::io::Error) -> Error {
        use std::io::ErrorKind::*;
        let code = match e.kind() {
            TimedOut | WouldBlock => libc::ETIMEDOUT,
            UnexpectedEof => libc::ECONNRESET,
            _ => e.raw_os_error().unwrap_or(libc::EIO),
        };
        let msg = match e.kind() {
            TimedOut | WouldBlock => "timed out".to_string(),
            _ => e.to_string(),
        };
        Error::new(-code, msg)
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.msg)
    }
}

impl std::error::Error for Error {}

/// Render a key for messages: printable ASCII as is, other bytes as `\xNN`.
pub fn fmt_key(k: &[u8]) -> String {
    let mut s = String::with_capacity(k.len() + 2);
    s.push('"');
    for &b in k {
        if (0x20..0x7f).contains(&b) && b != b'"' && b != b'\\' {
            s.push(b as char);
        } else {
            s.push_str(&format!("\\x{b:02x}"));
        }
    }
    s.push('"');
    s
}
