//! `PEREGRINE_IOC_INVALIDATE_DIRS` (include/peregrine_fuse.h): the
//! interception library tells a FUSE daemon which directories it changed
//! behind the kernel's back, so that the daemon forgets the attributes it
//! keeps of them and drops the kernel's (link count, times), and other
//! processes on the node see the changes at once rather than within the
//! attribute timeout.
//!
//! `struct peregrine_fuse_dirs` (native endian), in only:
//!
//! ```text
//!  0 u32 count        directories in oid[] (at most DIRS_MAX)
//!  4 u32 reserved     0
//!  8 {u64 hi; u64 lo} oid[DIRS_MAX]
//! ```

use peregrine_proto::ObjectId;

/// Directories per call.
pub const DIRS_MAX: usize = 255;
/// Size of `struct peregrine_fuse_dirs`.
pub const DIRS_SIZE: usize = 8 + 16 * DIRS_MAX;
/// `_IOW('P', 4, struct peregrine_fuse_dirs)`.
pub const IOC_INVALIDATE_DIRS: u32 =
    (1 << 30) | ((DIRS_SIZE as u32) << 16) | ((b'P' as u32) << 8) | 4;

/// The structure naming `dirs`, in `b`; past [`DIRS_MAX`] they are left
/// out. (A caller's buffer: the interception library fills it on its way
/// out of `_exit`, where it must not allocate.)
pub fn encode(dirs: &[ObjectId], b: &mut [u8; DIRS_SIZE]) {
    let dirs = &dirs[..dirs.len().min(DIRS_MAX)];
    b.fill(0);
    b[..4].copy_from_slice(&(dirs.len() as u32).to_ne_bytes());
    for (i, o) in dirs.iter().enumerate() {
        let at = 8 + 16 * i;
        b[at..at + 8].copy_from_slice(&o.hi.to_ne_bytes());
        b[at + 8..at + 16].copy_from_slice(&o.lo.to_ne_bytes());
    }
}

/// The directories a caller's structure names; None if it is not one.
pub fn decode(b: &[u8]) -> Option<Vec<ObjectId>> {
    if b.len() < DIRS_SIZE {
        return None;
    }
    let word = |at: usize| u32::from_ne_bytes(b[at..at + 4].try_into().unwrap());
    let long = |at: usize| u64::from_ne_bytes(b[at..at + 8].try_into().unwrap());
    let count = word(0) as usize;
    if count > DIRS_MAX || word(4) != 0 {
        return None;
    }
    Some(
        (0..count)
            .map(|i| ObjectId {
                hi: long(8 + 16 * i),
                lo: long(16 + 16 * i),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ioctl_number_is_the_headers() {
        // _IOW('P', 4, struct peregrine_fuse_dirs): 4088 bytes.
        assert_eq!(DIRS_SIZE, 4088);
        assert_eq!(IOC_INVALIDATE_DIRS, 0x4ff8_5004);
    }

    #[test]
    fn what_is_encoded_decodes_and_anything_else_is_refused() {
        let dirs: Vec<ObjectId> = (0..300u64).map(|i| ObjectId { hi: i, lo: !i }).collect();
        let enc = |d: &[ObjectId]| {
            let mut b = [0xffu8; DIRS_SIZE];
            encode(d, &mut b);
            b
        };
        assert_eq!(decode(&enc(&dirs[..3])).unwrap(), dirs[..3].to_vec());
        // Past DIRS_MAX: the first DIRS_MAX.
        assert_eq!(decode(&enc(&dirs)).unwrap(), dirs[..DIRS_MAX].to_vec());
        assert_eq!(decode(&enc(&[])).unwrap(), vec![]);

        let good = enc(&dirs[..1]);
        assert_eq!(decode(&good[..DIRS_SIZE - 1]), None, "short");
        let mut b = good;
        b[..4].copy_from_slice(&(DIRS_MAX as u32 + 1).to_ne_bytes());
        assert_eq!(decode(&b), None, "a count past the array");
        let mut b = good;
        b[4] = 1;
        assert_eq!(decode(&b), None, "reserved set");
    }
}
