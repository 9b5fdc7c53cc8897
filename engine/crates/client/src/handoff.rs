//! What a FUSE daemon hands the interception library so that the library
//! never uses the control port (docs/tls.md: workload pods have no
//! certificate): the pool map and the container's description, through
//! `ioctl(PEREGRINE_IOC_GET_CONT)` on a file of the mount
//! (include/peregrine_fuse.h). The daemon fetches the map afresh for each
//! call, so the library's pool-map refreshes go through it too.
//!
//! `struct peregrine_fuse_cont` (native endian), in and out:
//!
//! ```text
//!  0 u32 version      in: CONT_VERSION
//!  4 u32 offset       in: first byte of the description wanted
//!  8 u32 total        out: bytes of the whole description
//! 12 u32 len          out: bytes of it in data
//! 16 u64 generation   out: a hash of the whole description; a caller that
//!                     sees it change between pieces starts again.
//!                     in (offset 0): the generation of a description the
//!                     caller found stale, or 0; a daemon that keeps the
//!                     last description a short while (one per process
//!                     start otherwise costs a management round trip)
//!                     fetches afresh when it keeps that one
//! 24 u8  data[CONT_CHUNK]
//! ```
//!
//! The description: u32 length of the PoolMap, the PoolMap, the ContInfo
//! (protobuf messages of mgmt.proto).

use crate::error::{Error, Result};
use peregrine_proto::mgmt::{ContInfo, PoolMap};
use prost::Message;

/// Version of the structure.
pub const CONT_VERSION: u32 = 1;
/// Bytes of description per call: the structure stays under the 16 KiB
/// that an ioctl number can describe (and a FUSE ioctl may move).
pub const CONT_CHUNK: usize = 16000;
/// Size of `struct peregrine_fuse_cont`.
pub const CONT_SIZE: usize = 24 + CONT_CHUNK;
/// `_IOWR('P', 3, struct peregrine_fuse_cont)`.
pub const IOC_GET_CONT: u32 = (3 << 30) | ((CONT_SIZE as u32) << 16) | ((b'P' as u32) << 8) | 3;
/// Longest description taken (a map of some 100,000 targets).
pub const MAX_DESCRIPTION: usize = 16 << 20;

/// FNV-1a: the same on both sides whatever they were built with.
pub fn generation(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &c| {
        (h ^ c as u64).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// The description of a pool map and a container.
pub fn encode(map: &PoolMap, info: &ContInfo) -> Vec<u8> {
    let m = map.encode_to_vec();
    let mut b = Vec::with_capacity(4 + m.len() + info.encoded_len());
    b.extend_from_slice(&(m.len() as u32).to_ne_bytes());
    b.extend_from_slice(&m);
    info.encode(&mut b).expect("a Vec grows");
    b
}

/// The pool map and container of a description.
pub fn decode(b: &[u8]) -> Result<(PoolMap, ContInfo)> {
    let bad = |what: String| Error::new(-libc::EPROTO, format!("container description: {what}"));
    let n = b
        .get(..4)
        .map(|l| u32::from_ne_bytes(l.try_into().expect("4 bytes")) as usize)
        .ok_or_else(|| bad("short".into()))?;
    let m = b
        .get(4..4 + n)
        .ok_or_else(|| bad(format!("pool map of {n} bytes past the end")))?;
    let map = PoolMap::decode(m).map_err(|e| bad(format!("pool map: {e}")))?;
    let info = ContInfo::decode(&b[4 + n..]).map_err(|e| bad(format!("container: {e}")))?;
    Ok((map, info))
}

/// A message's protobuf bytes (for callers without prost of their own).
pub fn to_bytes(m: &impl Message) -> Vec<u8> {
    m.encode_to_vec()
}

/// Whether this process reaches the data plane of `cont`'s pool: a ping of
/// one of its engines (over shared memory where the engine offers it, else
/// TCP). Opening through a daemon proves nothing about the network, which
/// opening through the control port used to: a caller that cannot reach
/// the engines finds out here, at open, rather than at its first read.
pub fn probe(cont: &crate::Container) -> Result<()> {
    let map = cont.pool().map();
    let Some(t) = map
        .targets
        .iter()
        .find(|t| t.readable)
        .or(map.targets.first())
    else {
        return Err(Error::new(-libc::ENXIO, "the pool map has no target"));
    };
    cont.pool()
        .client()
        .transport()
        .call(
            &t.addr,
            t.index,
            peregrine_proto::frame::Opcode::Ping,
            &[],
            &[],
        )
        .map(|_| ())
        .map_err(|e| e.context(format!("rank {} ({})", t.rank, t.addr)))
}

/// The request of the piece at `offset`; `stale`: the generation of a
/// description the caller found stale (0: none).
pub fn request(offset: u32, stale: u64) -> Vec<u8> {
    let mut b = vec![0u8; CONT_SIZE];
    b[0..4].copy_from_slice(&CONT_VERSION.to_ne_bytes());
    b[4..8].copy_from_slice(&offset.to_ne_bytes());
    b[16..24].copy_from_slice(&stale.to_ne_bytes());
    b
}

/// The daemon's side: what request `req` asks for (None: another version).
pub fn asked(req: &[u8]) -> Option<Asked> {
    let u32_at = |o: usize| {
        req.get(o..o + 4)
            .map(|x| u32::from_ne_bytes(x.try_into().unwrap()))
    };
    if u32_at(0)? != CONT_VERSION {
        return None;
    }
    let stale = u64::from_ne_bytes(req.get(16..24)?.try_into().unwrap());
    Some(Asked {
        offset: u32_at(4)?,
        stale,
    })
}

/// A request, as the daemon reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Asked {
    pub offset: u32,
    /// The generation the caller found stale (0: none).
    pub stale: u64,
}

/// The daemon's side: the reply to request `req` about `description`
/// (None: a request of another version or past the end).
pub fn reply(req: &[u8], description: &[u8]) -> Option<Vec<u8>> {
    let off = asked(req)?.offset as usize;
    if off > description.len() {
        return None;
    }
    let piece = &description[off..description.len().min(off + CONT_CHUNK)];
    let mut b = vec![0u8; CONT_SIZE];
    b[0..4].copy_from_slice(&CONT_VERSION.to_ne_bytes());
    b[4..8].copy_from_slice(&(off as u32).to_ne_bytes());
    b[8..12].copy_from_slice(&(description.len() as u32).to_ne_bytes());
    b[12..16].copy_from_slice(&(piece.len() as u32).to_ne_bytes());
    b[16..24].copy_from_slice(&generation(description).to_ne_bytes());
    b[24..24 + piece.len()].copy_from_slice(piece);
    Some(b)
}

/// The caller's side: the whole description, asking `ask(request)` for
/// each piece (an ioctl), starting again if it changed meanwhile;
/// `stale`: the generation of the one the caller found stale (0: none).
pub fn fetch(stale: u64, mut ask: impl FnMut(&mut [u8]) -> Result<()>) -> Result<Vec<u8>> {
    let bad = |what: &str| Error::new(-libc::EPROTO, format!("container description: {what}"));
    'again: for _ in 0..8 {
        let mut out = Vec::new();
        let mut gen = None;
        loop {
            let mut b = request(out.len() as u32, stale);
            ask(&mut b)?;
            let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap()) as usize;
            let (total, len) = (u32_at(8), u32_at(12));
            let g = u64::from_ne_bytes(b[16..24].try_into().unwrap());
            if u32_at(0) != CONT_VERSION as usize || len > CONT_CHUNK || total > MAX_DESCRIPTION {
                return Err(bad("a reply of another version or size"));
            }
            if gen.is_some_and(|x| x != g) {
                continue 'again;
            }
            gen = Some(g);
            out.extend_from_slice(&b[24..24 + len]);
            if out.len() >= total || len == 0 {
                if out.len() != total || generation(&out) != g {
                    continue 'again;
                }
                return Ok(out);
            }
        }
    }
    Err(bad("kept changing while read"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_large_description_travels_in_pieces() {
        let map = PoolMap {
            uuid: "u".into(),
            version: 7,
            targets: (0..2000)
                .map(|i| peregrine_proto::mgmt::PoolTarget {
                    rank: i,
                    data_addr: format!("10.0.0.{}:10101", i % 250),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        let info = ContInfo {
            label: "c".into(),
            ..Default::default()
        };
        let d = encode(&map, &info);
        assert!(d.len() > 2 * CONT_CHUNK);
        let mut calls = 0;
        let got = fetch(0, |b| {
            calls += 1;
            b.copy_from_slice(&reply(b, &d).unwrap());
            Ok(())
        })
        .unwrap();
        assert_eq!(calls, d.len().div_ceil(CONT_CHUNK));
        assert_eq!(decode(&got).unwrap(), (map, info));
        assert!(reply(&request(d.len() as u32 + 1, 0), &d).is_none());
        assert_eq!(
            asked(&request(5, 9)),
            Some(Asked {
                offset: 5,
                stale: 9
            })
        );
        assert_eq!(IOC_GET_CONT, 0xfe98_5003);
    }
}
