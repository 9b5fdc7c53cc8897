//! On-device records: WAL batches and checkpoints share one framing.
//!
//! ```text
//! 0   magic (4)  "PWAL" or "PCKP"
//! 4   device uuid (16): records of an earlier format never match
//! 20  sequence (8): WAL: batch number; checkpoint: last batch it contains
//! 28  payload length (8); its top bit set: the record is packed
//! 36  payload CRC32C (4)
//! 40  header CRC32C over bytes 0..40 (4)
//! 44  generation (8): WAL records: the writer's, one per opening of the
//!     target; 0 in records of earlier versions and in checkpoints
//! 52  CRC32C of the generation (4), absent (0) with generation 0
//! 64  payload (bincode), zero-padded to whole 4 KiB blocks, or, packed,
//!     to a multiple of 64 bytes
//! ```
//! A torn write shows as a bad header or payload CRC and the whole record is
//! ignored: a batch is applied all or nothing. The generation tells records
//! a crash left behind the replayed end of the log (in flight then, never
//! acknowledged) from the records written after the restart that follow
//! them: see `Target::replay`.
//!
//! Packed records ([`Layout::Packed`]) are those of a WAL in the page cache
//! ([`crate::WalIo::PageCache`]): a create's record carries ~300 bytes, and
//! padded to a block it filled the WAL (and brought its checkpoints) ten
//! times sooner, and wrote ten times the bytes back. A block then holds
//! several records, written at different times; a write that tears (a power
//! cut during writeback) leaves each sector old or new, and the bytes of
//! the records already there are the same in both, so no record before the
//! torn one is harmed. An O_DIRECT WAL keeps whole blocks: its writes are
//! in flight several at a time, and two rewriting one block could land in
//! either order.

use crate::superblock::BLOCK;
use uuid::Uuid;

pub(crate) const WAL_MAGIC: &[u8; 4] = b"PWAL";
pub(crate) const CKPT_MAGIC: &[u8; 4] = b"PCKP";
pub(crate) const HDR: usize = 64;
/// Packed records start at multiples of this many bytes.
pub(crate) const PACK: u64 = 64;
/// The bit of the length field that marks a packed record.
const PACKED_BIT: u64 = 1 << 63;

pub(crate) fn round_up(n: u64) -> u64 {
    n.div_ceil(BLOCK) * BLOCK
}

/// How a record ends: where the next one may start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// Zero-padded to whole blocks (checkpoints, an O_DIRECT WAL).
    Blocks,
    /// Padded to a multiple of [`PACK`] bytes (a WAL in the page cache).
    Packed,
}

impl Layout {
    /// Bytes a record of `len` payload bytes occupies.
    pub(crate) fn record_bytes(self, len: u64) -> u64 {
        match self {
            Layout::Blocks => round_up(HDR as u64 + len),
            Layout::Packed => (HDR as u64 + len).div_ceil(PACK) * PACK,
        }
    }
}

/// Frame `payload` as a WAL record of generation `gen`, laid out as `layout`.
pub(crate) fn encode(
    magic: &[u8; 4],
    dev: Uuid,
    seq: u64,
    gen: u64,
    payload: &[u8],
    layout: Layout,
) -> Vec<u8> {
    let mut rec = with_room(payload.len() as u64);
    rec.extend_from_slice(payload);
    seal_as(magic, dev, seq, gen, rec, layout)
}

/// An empty record with room for a payload of `len` bytes: the payload is
/// written after the header's bytes (in place: a checkpoint is one buffer
/// of its size, not its encoding and then a copy), then [`seal`]ed.
pub(crate) fn with_room(len: u64) -> Vec<u8> {
    let mut rec = Vec::with_capacity(round_up(HDR as u64 + len) as usize);
    rec.resize(HDR, 0);
    rec
}

/// The header of a record [`with_room`] whose payload follows it now, and
/// the padding to whole blocks.
pub(crate) fn seal(magic: &[u8; 4], dev: Uuid, seq: u64, gen: u64, rec: Vec<u8>) -> Vec<u8> {
    seal_as(magic, dev, seq, gen, rec, Layout::Blocks)
}

fn seal_as(
    magic: &[u8; 4],
    dev: Uuid,
    seq: u64,
    gen: u64,
    mut rec: Vec<u8>,
    layout: Layout,
) -> Vec<u8> {
    let len = (rec.len() - HDR) as u64;
    let crc = peregrine_isal::crc32c(&rec[HDR..]);
    let field = match layout {
        Layout::Blocks => len,
        Layout::Packed => len | PACKED_BIT,
    };
    rec[0..4].copy_from_slice(magic);
    rec[4..20].copy_from_slice(dev.as_bytes());
    rec[20..28].copy_from_slice(&seq.to_le_bytes());
    rec[28..36].copy_from_slice(&field.to_le_bytes());
    rec[36..40].copy_from_slice(&crc.to_le_bytes());
    let hcrc = peregrine_isal::crc32c(&rec[0..40]);
    rec[40..44].copy_from_slice(&hcrc.to_le_bytes());
    if gen != 0 {
        rec[44..52].copy_from_slice(&gen.to_le_bytes());
        let gcrc = peregrine_isal::crc32c(&rec[44..52]);
        rec[52..56].copy_from_slice(&gcrc.to_le_bytes());
    }
    rec.resize(layout.record_bytes(len) as usize, 0);
    rec
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Header {
    pub seq: u64,
    pub len: u64,
    pub gen: u64,
    pub layout: Layout,
    crc: u32,
}

impl Header {
    /// Bytes the whole record occupies on the device.
    pub(crate) fn record_bytes(&self) -> u64 {
        self.layout.record_bytes(self.len)
    }
}

/// Parse the header in the first block of a record; `None` if it is not a
/// valid record of this kind and this format.
pub(crate) fn decode_header(magic: &[u8; 4], dev: Uuid, b: &[u8]) -> Option<Header> {
    if b.len() < HDR || &b[0..4] != magic || &b[4..20] != dev.as_bytes() {
        return None;
    }
    let hcrc = u32::from_le_bytes(b[40..44].try_into().unwrap());
    if peregrine_isal::crc32c(&b[0..40]) != hcrc {
        return None;
    }
    let gen = u64::from_le_bytes(b[44..52].try_into().unwrap());
    let gcrc = u32::from_le_bytes(b[52..56].try_into().unwrap());
    if gen != 0 && peregrine_isal::crc32c(&b[44..52]) != gcrc {
        return None;
    }
    let field = u64::from_le_bytes(b[28..36].try_into().unwrap());
    Some(Header {
        seq: u64::from_le_bytes(b[20..28].try_into().unwrap()),
        len: field & !PACKED_BIT,
        gen,
        layout: if field & PACKED_BIT != 0 {
            Layout::Packed
        } else {
            Layout::Blocks
        },
        crc: u32::from_le_bytes(b[36..40].try_into().unwrap()),
    })
}

/// The payload of a whole record, if its CRC holds.
pub(crate) fn payload<'a>(h: &Header, rec: &'a [u8]) -> Option<&'a [u8]> {
    let p = rec.get(HDR..HDR + h.len as usize)?;
    (peregrine_isal::crc32c(p) == h.crc).then_some(p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_torn_detection() {
        let dev = Uuid::new_v4();
        let body = vec![7u8; 5000];
        let mut rec = encode(WAL_MAGIC, dev, 42, 7, &body, Layout::Blocks);
        assert_eq!(rec.len(), 8192);
        let h = decode_header(WAL_MAGIC, dev, &rec).unwrap();
        assert_eq!((h.seq, h.len, h.gen, h.record_bytes()), (42, 5000, 7, 8192));
        let legacy = encode(WAL_MAGIC, dev, 42, 0, &body, Layout::Blocks);
        assert_eq!(decode_header(WAL_MAGIC, dev, &legacy).unwrap().gen, 0);
        let mut bad_gen = rec.clone();
        bad_gen[45] ^= 1;
        assert!(
            decode_header(WAL_MAGIC, dev, &bad_gen).is_none(),
            "torn generation"
        );
        assert_eq!(payload(&h, &rec).unwrap(), &body[..]);
        assert!(decode_header(CKPT_MAGIC, dev, &rec).is_none());
        assert!(
            decode_header(WAL_MAGIC, Uuid::new_v4(), &rec).is_none(),
            "other format"
        );
        rec[4096 + 10] ^= 1; // second block torn
        assert!(payload(&h, &rec).is_none());
        rec[21] ^= 1;
        assert!(decode_header(WAL_MAGIC, dev, &rec).is_none());
    }

    #[test]
    fn a_packed_record_ends_at_the_next_multiple_of_64_bytes() {
        let dev = Uuid::new_v4();
        let body = vec![3u8; 300];
        let rec = encode(WAL_MAGIC, dev, 9, 5, &body, Layout::Packed);
        assert_eq!(
            rec.len(),
            384,
            "64 header + 300 payload, to a multiple of 64"
        );
        let h = decode_header(WAL_MAGIC, dev, &rec).unwrap();
        assert_eq!(
            (h.seq, h.len, h.layout, h.record_bytes()),
            (9, 300, Layout::Packed, 384)
        );
        assert_eq!(payload(&h, &rec).unwrap(), &body[..]);
        // The mark is under the header CRC: a flipped bit is a bad header,
        // not a record of another length.
        let mut flipped = rec.clone();
        flipped[35] ^= 0x80;
        assert!(decode_header(WAL_MAGIC, dev, &flipped).is_none());
        let exact = encode(WAL_MAGIC, dev, 9, 5, &[1u8; 64], Layout::Packed);
        assert_eq!(exact.len(), 128);
    }
}
