//! The object handle the daemon hands out for an open file
//! (`ioctl(PEREGRINE_IOC_GET_HANDLE)`, include/peregrine_fuse.h) and the
//! ioctl numbers.

use libc::c_ulong;

/// `struct peregrine_fuse_handle` (include/peregrine_fuse.h).
pub(crate) const HANDLE_SIZE: usize = 208;
const HANDLE_FLAG_RDONLY: u32 = 1;
/// `_IOR('P', 1, struct peregrine_fuse_handle)`.
pub(crate) const IOC_GET_HANDLE: c_ulong =
    (2 << 30) | ((HANDLE_SIZE as c_ulong) << 16) | ((b'P' as c_ulong) << 8) | 1;
/// `_IO('P', 2)`.
pub(crate) const IOC_INVALIDATE: c_ulong = ((b'P' as c_ulong) << 8) | 2;

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Handle {
    pub(crate) pool: [u8; 16],
    pub(crate) cont: [u8; 16],
    pub(crate) oid: peregrine::ObjectId,
    pub(crate) chunk: u64,
    pub(crate) read_only: bool,
    pub(crate) mgmt: String,
}

impl Handle {
    pub(crate) fn parse(b: &[u8; HANDLE_SIZE]) -> Option<Handle> {
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        let u64_at = |o: usize| u64::from_ne_bytes(b[o..o + 8].try_into().unwrap());
        if u32_at(0) != 1 {
            return None;
        }
        let m = &b[80..];
        let mgmt = String::from_utf8(m[..m.iter().position(|&c| c == 0)?].to_vec()).ok()?;
        Some(Handle {
            read_only: u32_at(4) & HANDLE_FLAG_RDONLY != 0,
            pool: b[8..24].try_into().unwrap(),
            cont: b[24..40].try_into().unwrap(),
            oid: peregrine::ObjectId {
                hi: u64_at(40),
                lo: u64_at(48),
            },
            chunk: u64_at(56),
            mgmt,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_layout() {
        let mut b = [0u8; HANDLE_SIZE];
        b[0] = 1;
        b[4] = 1;
        b[8] = 0xaa;
        b[24] = 0xbb;
        b[40..48].copy_from_slice(&7u64.to_ne_bytes());
        b[48..56].copy_from_slice(&9u64.to_ne_bytes());
        b[56..64].copy_from_slice(&(1u64 << 20).to_ne_bytes());
        b[80..94].copy_from_slice(b"127.0.0.1:1000");
        let h = Handle::parse(&b).unwrap();
        assert!(h.read_only);
        assert_eq!(h.pool[0], 0xaa);
        assert_eq!(h.cont[0], 0xbb);
        assert_eq!((h.oid.hi, h.oid.lo, h.chunk), (7, 9, 1 << 20));
        assert_eq!(h.mgmt, "127.0.0.1:1000");
        b[0] = 2;
        assert!(Handle::parse(&b).is_none());
        assert_eq!(IOC_GET_HANDLE, 0x80d0_5001);
        assert_eq!(IOC_INVALIDATE, 0x5002);
    }
}
