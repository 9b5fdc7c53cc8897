//! Data-plane framing: a fixed 32-byte header, a protobuf message, raw bulk bytes.
//!
//! Every length is checked against hard limits before anything is allocated,
//! and the header carries its own CRC32C, so a corrupt or truncated frame is
//! rejected with a [`FrameError`] naming what is wrong instead of being
//! interpreted.

use std::io::{Read, Write};
#[cfg(feature = "grpc")]
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

pub const MAGIC: [u8; 4] = *b"PRGN";
pub const VERSION: u16 = 1;
pub const HEADER_LEN: usize = 32;
/// Largest protobuf message in a frame.
pub const MAX_MSG: u32 = 4 << 20;
/// Largest bulk section in a frame.
pub const MAX_BULK: u32 = 64 << 20;

/// Set in `flags` of response frames.
pub const FLAG_RESPONSE: u32 = 1;

#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opcode {
    Ping = 1,
    Update = 2,
    Fetch = 3,
    Punch = 4,
    List = 5,
    QuerySize = 6,
    Flush = 7,
    ListChanged = 8,
    ListRecords = 9,
    DtxDecide = 10,
    DtxQuery = 11,
    /// A punch whose message may name more objects (`PunchReq.more`):
    /// engines that do not know the field refuse the opcode.
    Discard = 12,
}

impl Opcode {
    pub fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => Opcode::Ping,
            2 => Opcode::Update,
            3 => Opcode::Fetch,
            4 => Opcode::Punch,
            5 => Opcode::List,
            6 => Opcode::QuerySize,
            7 => Opcode::Flush,
            8 => Opcode::ListChanged,
            9 => Opcode::ListRecords,
            10 => Opcode::DtxDecide,
            11 => Opcode::DtxQuery,
            12 => Opcode::Discard,
            _ => return None,
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub opcode: u16,
    pub flags: u32,
    pub request_id: u64,
    pub msg_len: u32,
    pub bulk_len: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("bad magic {0:02x?} (not a Peregrine peer?)")]
    BadMagic([u8; 4]),
    #[error("unsupported protocol version {0} (this side speaks {VERSION})")]
    BadVersion(u16),
    #[error("header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    HeaderChecksum { stored: u32, computed: u32 },
    #[error("message length {0} exceeds limit {MAX_MSG}")]
    MsgTooLong(u32),
    #[error("bulk length {0} exceeds limit {MAX_BULK}")]
    BulkTooLong(u32),
    #[error("unknown opcode {0}")]
    BadOpcode(u16),
    #[error("truncated frame: need {need} bytes, have {have}")]
    Truncated { need: usize, have: usize },
    #[error("undecodable {what} message: {err}")]
    BadMessage { what: &'static str, err: String },
    #[error("connection closed")]
    Closed,
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
}

impl Header {
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&VERSION.to_le_bytes());
        b[6..8].copy_from_slice(&self.opcode.to_le_bytes());
        b[8..12].copy_from_slice(&self.flags.to_le_bytes());
        b[12..20].copy_from_slice(&self.request_id.to_le_bytes());
        b[20..24].copy_from_slice(&self.msg_len.to_le_bytes());
        b[24..28].copy_from_slice(&self.bulk_len.to_le_bytes());
        let crc = peregrine_isal::crc32c(&b[..28]);
        b[28..32].copy_from_slice(&crc.to_le_bytes());
        b
    }

    pub fn decode(b: &[u8; HEADER_LEN]) -> Result<Header, FrameError> {
        let magic: [u8; 4] = b[0..4].try_into().unwrap();
        if magic != MAGIC {
            return Err(FrameError::BadMagic(magic));
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let version = u16_at(4);
        if version != VERSION {
            return Err(FrameError::BadVersion(version));
        }
        let stored = u32_at(28);
        let computed = peregrine_isal::crc32c(&b[..28]);
        if stored != computed {
            return Err(FrameError::HeaderChecksum { stored, computed });
        }
        let h = Header {
            opcode: u16_at(6),
            flags: u32_at(8),
            request_id: u64::from_le_bytes(b[12..20].try_into().unwrap()),
            msg_len: u32_at(20),
            bulk_len: u32_at(24),
        };
        if h.msg_len > MAX_MSG {
            return Err(FrameError::MsgTooLong(h.msg_len));
        }
        if h.bulk_len > MAX_BULK {
            return Err(FrameError::BulkTooLong(h.bulk_len));
        }
        if Opcode::from_u16(h.opcode).is_none() {
            return Err(FrameError::BadOpcode(h.opcode));
        }
        Ok(h)
    }

    pub fn op(&self) -> Opcode {
        Opcode::from_u16(self.opcode).expect("validated by decode")
    }
}

/// A whole frame as read off a connection.
#[derive(Debug)]
pub struct Frame {
    pub header: Header,
    pub msg: Vec<u8>,
    pub bulk: Vec<u8>,
}

impl Frame {
    /// Decode the message part as protobuf message `M`.
    pub fn message<M: prost::Message + Default>(
        &self,
        what: &'static str,
    ) -> Result<M, FrameError> {
        M::decode(self.msg.as_slice()).map_err(|e| FrameError::BadMessage {
            what,
            err: e.to_string(),
        })
    }
}

/// Parse one frame from the front of `buf` (no I/O; the fuzz target's entry).
/// Returns the frame and the bytes it used.
pub fn decode_frame(buf: &[u8]) -> Result<(Frame, usize), FrameError> {
    if buf.len() < HEADER_LEN {
        return Err(FrameError::Truncated {
            need: HEADER_LEN,
            have: buf.len(),
        });
    }
    let header = Header::decode(buf[..HEADER_LEN].try_into().unwrap())?;
    let need = HEADER_LEN + header.msg_len as usize + header.bulk_len as usize;
    if buf.len() < need {
        return Err(FrameError::Truncated {
            need,
            have: buf.len(),
        });
    }
    let m_end = HEADER_LEN + header.msg_len as usize;
    Ok((
        Frame {
            header,
            msg: buf[HEADER_LEN..m_end].to_vec(),
            bulk: buf[m_end..need].to_vec(),
        },
        need,
    ))
}

fn header_for(
    op: Opcode,
    flags: u32,
    request_id: u64,
    msg: &[u8],
    bulk_len: usize,
) -> Result<Header, FrameError> {
    if msg.len() > MAX_MSG as usize {
        return Err(FrameError::MsgTooLong(msg.len() as u32));
    }
    if bulk_len > MAX_BULK as usize {
        return Err(FrameError::BulkTooLong(
            bulk_len.min(u32::MAX as usize) as u32
        ));
    }
    Ok(Header {
        opcode: op as u16,
        flags,
        request_id,
        msg_len: msg.len() as u32,
        bulk_len: bulk_len as u32,
    })
}

/// Encode a whole frame into one buffer. `bulk` parts are concatenated.
pub fn encode_frame(
    op: Opcode,
    flags: u32,
    request_id: u64,
    msg: &[u8],
    bulk: &[&[u8]],
) -> Result<Vec<u8>, FrameError> {
    let bulk_len: usize = bulk.iter().map(|b| b.len()).sum();
    let h = header_for(op, flags, request_id, msg, bulk_len)?;
    let mut out = Vec::with_capacity(HEADER_LEN + msg.len() + bulk_len);
    out.extend_from_slice(&h.encode());
    out.extend_from_slice(msg);
    for b in bulk {
        out.extend_from_slice(b);
    }
    Ok(out)
}

/// Write a frame without copying the bulk parts.
pub fn write_frame<W: Write>(
    w: &mut W,
    op: Opcode,
    flags: u32,
    request_id: u64,
    msg: &[u8],
    bulk: &[&[u8]],
) -> Result<(), FrameError> {
    let bulk_len: usize = bulk.iter().map(|b| b.len()).sum();
    let h = header_for(op, flags, request_id, msg, bulk_len)?;
    let mut head = Vec::with_capacity(HEADER_LEN + msg.len());
    head.extend_from_slice(&h.encode());
    head.extend_from_slice(msg);
    w.write_all(&head)?;
    for b in bulk {
        w.write_all(b)?;
    }
    w.flush()?;
    Ok(())
}

pub fn read_frame<R: Read>(r: &mut R) -> Result<Frame, FrameError> {
    let mut hb = [0u8; HEADER_LEN];
    if let Err(e) = r.read_exact(&mut hb) {
        return Err(if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FrameError::Closed
        } else {
            e.into()
        });
    }
    let header = Header::decode(&hb)?;
    let mut msg = vec![0u8; header.msg_len as usize];
    r.read_exact(&mut msg).map_err(truncated)?;
    let mut bulk = vec![0u8; header.bulk_len as usize];
    r.read_exact(&mut bulk).map_err(truncated)?;
    Ok(Frame { header, msg, bulk })
}

/// [`read_frame`] on an async stream (the TCP data plane).
#[cfg(feature = "grpc")]
pub async fn read_frame_async<R: AsyncRead + Unpin>(r: &mut R) -> Result<Frame, FrameError> {
    let mut hb = [0u8; HEADER_LEN];
    if let Err(e) = r.read_exact(&mut hb).await {
        return Err(if e.kind() == std::io::ErrorKind::UnexpectedEof {
            FrameError::Closed
        } else {
            e.into()
        });
    }
    let header = Header::decode(&hb)?;
    let mut msg = vec![0u8; header.msg_len as usize];
    r.read_exact(&mut msg).await.map_err(truncated)?;
    let mut bulk = vec![0u8; header.bulk_len as usize];
    r.read_exact(&mut bulk).await.map_err(truncated)?;
    Ok(Frame { header, msg, bulk })
}

/// [`write_frame`] on an async stream (the TCP data plane).
#[cfg(feature = "grpc")]
pub async fn write_frame_async<W: AsyncWrite + Unpin>(
    w: &mut W,
    op: Opcode,
    flags: u32,
    request_id: u64,
    msg: &[u8],
    bulk: &[&[u8]],
) -> Result<(), FrameError> {
    let bulk_len: usize = bulk.iter().map(|b| b.len()).sum();
    let h = header_for(op, flags, request_id, msg, bulk_len)?;
    let mut head = Vec::with_capacity(HEADER_LEN + msg.len());
    head.extend_from_slice(&h.encode());
    head.extend_from_slice(msg);
    w.write_all(&head).await?;
    for b in bulk {
        w.write_all(b).await?;
    }
    w.flush().await?;
    Ok(())
}

fn truncated(e: std::io::Error) -> FrameError {
    if e.kind() == std::io::ErrorKind::UnexpectedEof {
        FrameError::Truncated { need: 0, have: 0 }
    } else {
        e.into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let buf = encode_frame(Opcode::Update, 0, 42, b"msg", &[b"bu", b"lk"]).unwrap();
        let (f, used) = decode_frame(&buf).unwrap();
        assert_eq!(used, buf.len());
        assert_eq!(f.header.request_id, 42);
        assert_eq!(f.msg, b"msg");
        assert_eq!(f.bulk, b"bulk");
        let f2 = read_frame(&mut buf.as_slice()).unwrap();
        assert_eq!(f2.bulk, b"bulk");
    }

    #[test]
    fn every_truncation_and_bit_flip_is_rejected_or_harmless() {
        let buf = encode_frame(Opcode::Fetch, 0, 7, b"hello", &[b"world"]).unwrap();
        for cut in 0..buf.len() {
            assert!(decode_frame(&buf[..cut]).is_err(), "cut at {cut}");
        }
        // Any single-bit flip in the header is caught by its CRC.
        for bit in 0..HEADER_LEN * 8 {
            let mut b = buf.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(
                decode_frame(&b).is_err(),
                "flip of header bit {bit} accepted"
            );
        }
    }

    #[test]
    fn oversized_lengths_are_refused_before_allocation() {
        let h = Header {
            opcode: 2,
            flags: 0,
            request_id: 1,
            msg_len: MAX_MSG + 1,
            bulk_len: 0,
        };
        assert!(matches!(
            Header::decode(&h.encode()),
            Err(FrameError::MsgTooLong(_))
        ));
        let h = Header {
            opcode: 2,
            flags: 0,
            request_id: 1,
            msg_len: 0,
            bulk_len: u32::MAX,
        };
        assert!(matches!(
            Header::decode(&h.encode()),
            Err(FrameError::BulkTooLong(_))
        ));
        let h = Header {
            opcode: 999,
            flags: 0,
            request_id: 1,
            msg_len: 0,
            bulk_len: 0,
        };
        assert!(matches!(
            Header::decode(&h.encode()),
            Err(FrameError::BadOpcode(999))
        ));
    }
}
