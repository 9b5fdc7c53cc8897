//! The bytes that travel with a request and with its reply, kept where
//! they already are so that each value is copied once on its way through
//! the engine.
//!
//! An update's values may still sit in a local client's shared memory
//! ([`Bulk::Shared`]): the target copies each value once, straight into
//! the registered buffer its device write starts from (or into its index,
//! for a small value), and checks the client's checksum on that copy, the
//! bytes it stores. A fetch's reply is a [`Gather`] of pieces, most of
//! them borrowed from the target's device buffers for as long as the reply
//! callback runs: the shared-memory transport copies them once, into the
//! client's response region.

use std::borrow::Cow;
use std::io;

/// Bytes in memory that a peer shares with the engine. The peer may change
/// them at any time, so they are only ever copied out, and whatever is
/// checked is checked on the copy.
pub trait SharedBytes: Send {
    fn len(&self) -> usize;
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copy `out.len()` bytes from offset `off` into `out`; [`Bulk`] asks
    /// only for bytes inside `len()`.
    fn copy_out(&self, off: usize, out: &mut [u8]) -> io::Result<()>;
}

/// The values of an update, concatenated in iod order.
pub enum Bulk {
    Owned(Vec<u8>),
    Shared(Box<dyn SharedBytes>),
}

impl Bulk {
    pub fn len(&self) -> usize {
        match self {
            Bulk::Owned(v) => v.len(),
            Bulk::Shared(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copy `out.len()` bytes from offset `off` into `out`.
    pub fn copy_out(&self, off: usize, out: &mut [u8]) -> io::Result<()> {
        let end = off
            .checked_add(out.len())
            .filter(|&end| end <= self.len())
            .ok_or_else(|| {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("bulk {off}+{} beyond its {} bytes", out.len(), self.len()),
                )
            })?;
        match self {
            Bulk::Owned(v) => {
                out.copy_from_slice(&v[off..end]);
                Ok(())
            }
            Bulk::Shared(s) => s.copy_out(off, out),
        }
    }

    /// `len` bytes from offset `off`, as a vector of their own.
    pub fn to_vec(&self, off: usize, len: usize) -> io::Result<Vec<u8>> {
        let mut v = vec![0u8; len];
        self.copy_out(off, &mut v)?;
        Ok(v)
    }
}

impl From<Vec<u8>> for Bulk {
    fn from(v: Vec<u8>) -> Bulk {
        Bulk::Owned(v)
    }
}

impl std::fmt::Debug for Bulk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Bulk::Owned(v) => write!(f, "Bulk::Owned({} bytes)", v.len()),
            Bulk::Shared(s) => write!(f, "Bulk::Shared({} bytes)", s.len()),
        }
    }
}

/// A reply's bulk: pieces in order, owned or borrowed (from the target's
/// device buffers, for the duration of the reply callback); or bytes the
/// device already put in the source's [`crate::ReplyArea`].
#[derive(Debug, Default)]
pub struct Gather<'a> {
    parts: Vec<Cow<'a, [u8]>>,
    len: usize,
    in_place: bool,
}

impl<'a> Gather<'a> {
    /// `len` bytes already at the start of the request's reply area.
    pub fn in_place(len: usize) -> Gather<'a> {
        Gather {
            parts: Vec::new(),
            len,
            in_place: true,
        }
    }

    /// Whether the bytes are in the reply area (and nowhere else).
    pub fn is_in_place(&self) -> bool {
        self.in_place
    }

    pub fn push(&mut self, part: Cow<'a, [u8]>) {
        debug_assert!(!self.in_place, "a gather in place takes no parts");
        if !part.is_empty() {
            self.len += part.len();
            self.parts.push(part);
        }
    }

    /// Add `other`'s pieces after these.
    pub fn append(&mut self, other: Gather<'a>) {
        debug_assert!(!self.in_place && !other.in_place);
        self.len += other.len;
        self.parts.extend(other.parts);
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn parts(&self) -> impl Iterator<Item = &[u8]> {
        self.parts.iter().map(|p| p.as_ref())
    }

    /// CRC32C of all the bytes.
    pub fn crc32c(&self) -> u32 {
        self.parts().fold(0, peregrine_isal::crc32c_append)
    }

    /// The bytes as one vector (no copy when they are one owned piece).
    /// Not for a gather in place, whose bytes only its source can reach.
    pub fn into_vec(mut self) -> Vec<u8> {
        assert!(
            !self.in_place,
            "the bytes of a gather in place are in the reply area"
        );
        if self.parts.len() == 1 {
            return self.parts.pop().expect("one part").into_owned();
        }
        let mut v = Vec::with_capacity(self.len);
        for p in &self.parts {
            v.extend_from_slice(p);
        }
        v
    }
}

impl From<Vec<u8>> for Gather<'_> {
    fn from(v: Vec<u8>) -> Self {
        let mut g = Gather::default();
        g.push(Cow::Owned(v));
        g
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gather_keeps_order_and_skips_empty_parts() {
        let buf = [1u8, 2, 3, 4];
        let mut g = Gather::default();
        g.push(Cow::Borrowed(&buf[1..3]));
        g.push(Cow::Owned(Vec::new()));
        g.push(Cow::Owned(vec![9, 9]));
        assert_eq!(g.len(), 4);
        assert_eq!(g.parts().count(), 2);
        assert_eq!(g.crc32c(), peregrine_isal::crc32c(&[2, 3, 9, 9]));
        assert_eq!(g.into_vec(), vec![2, 3, 9, 9]);
        assert!(Gather::default().into_vec().is_empty());
    }

    #[test]
    fn owned_bulk_checks_its_bounds() {
        let b = Bulk::from(vec![5u8; 10]);
        assert_eq!(b.to_vec(8, 2).unwrap(), vec![5, 5]);
        assert!(b.to_vec(9, 2).is_err());
        assert!(b.copy_out(usize::MAX, &mut [0u8; 2]).is_err());
    }
}
