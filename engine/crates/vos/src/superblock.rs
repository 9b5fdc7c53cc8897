//! The superblock, the device layout it records, and `scan` / `format`.
//!
//! Layout (every offset a multiple of 1 MiB):
//! ```text
//! 0        superblock, copy A (one 4 KiB block; the first 64 KiB are checked for foreign signatures)
//! 512 KiB  superblock, copy B (the same block)
//! 1 MiB    management blob, slot A (2 MiB) and slot B (2 MiB)
//! 8 MiB    target 0 region: WAL | checkpoint slot 0 | checkpoint slot 1 | data blocks
//!          target 1 region ...
//! ```
//! The regions split the rest of the device evenly; the superblock stores the
//! resulting sizes so that a later change of the sizing rule cannot misread a device.
//!
//! Two copies of the superblock, each with a generation (header bytes
//! 20..28, its CRC32C at 28..32; the body's CRC does not cover it): reading
//! takes the valid copy of the highest generation, and opening rewrites a
//! copy that is damaged, missing or older from it ([`repair`]), reporting
//! what it did. Devices formatted with one copy (generation 0, copy B all
//! zeros) open as before and get their second copy at the first open.
//! A change writes copy A, flushes, then copy B: a crash in between leaves
//! one copy of the newer generation, which wins.

use crate::error::StorageError;
use crate::{BdevClass, BdevSpec, StorageOptions};
use serde::{Deserialize, Serialize};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::FileExt;
use uuid::Uuid;

pub(crate) const BLOCK: u64 = 4096;
const MIB: u64 = 1 << 20;
const SB_MAGIC: &[u8; 8] = b"PRGNVOS1";
/// Version 2: data extents carry one CRC32C per 4 KiB block (version 1: per 32 KiB).
const SB_VERSION: u32 = 2;
/// Versions this code opens.
const SB_VERSIONS: [u32; 2] = [1, 2];
/// Bytes at the start of a device inspected for signatures before formatting.
const PROBE_BYTES: usize = 64 * 1024;
/// Device offsets of the two copies of the superblock.
const SB_COPIES: [u64; 2] = [0, 512 * 1024];
/// Generation of the superblock a format writes.
const FIRST_GEN: u64 = 1;
pub(crate) const MGMT_OFFSET: u64 = MIB;
pub(crate) const MGMT_SLOT_BYTES: u64 = 2 * MIB;
const TARGETS_OFFSET: u64 = 8 * MIB;
/// Smallest per-target region we accept: room for a WAL, two checkpoints and some data.
const MIN_TARGET_BYTES: u64 = 8 * MIB;

/// What a formatted device says about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Superblock {
    pub system: String,
    pub rank: u32,
    /// Identity of the engine that formatted the device (new on every format).
    pub engine_uuid: Uuid,
    /// Identity of this format of the device; every WAL record and checkpoint
    /// carries it, so records from an earlier format are never replayed.
    pub device_uuid: Uuid,
    pub targets: u32,
    pub device_bytes: u64,
    pub version: u32,
    pub mgmt_offset: u64,
    pub mgmt_slot_bytes: u64,
    /// Offset of target 0's region; target t starts at `target_offset + t * target_bytes`.
    pub target_offset: u64,
    pub target_bytes: u64,
    /// Per target: WAL bytes, bytes of each of the two checkpoint slots, data bytes.
    pub wal_bytes: u64,
    pub ckpt_bytes: u64,
    pub data_bytes: u64,
}

impl Superblock {
    pub(crate) fn wal_offset(&self, t: u32) -> u64 {
        self.target_offset + t as u64 * self.target_bytes
    }
    pub(crate) fn ckpt_offset(&self, t: u32, slot: usize) -> u64 {
        self.wal_offset(t) + self.wal_bytes + slot as u64 * self.ckpt_bytes
    }
    pub(crate) fn data_offset(&self, t: u32) -> u64 {
        self.wal_offset(t) + self.wal_bytes + 2 * self.ckpt_bytes
    }
    /// Bytes of value covered by each stored data checksum: one block, so a
    /// 4 KiB read reads and verifies exactly 4 KiB (devices formatted by
    /// version 1 keep their 32 KiB chunks).
    pub(crate) fn csum_chunk(&self) -> u64 {
        if self.version == 1 {
            32 * 1024
        } else {
            BLOCK
        }
    }
    pub(crate) fn data_blocks(&self) -> u64 {
        self.data_bytes / BLOCK
    }

    fn encode(&self, gen: u64) -> Vec<u8> {
        let body = bincode::serialize(self).expect("superblock serializes");
        let mut b = vec![0u8; BLOCK as usize];
        b[..8].copy_from_slice(SB_MAGIC);
        b[8..12].copy_from_slice(&SB_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&(body.len() as u32).to_le_bytes());
        b[16..20].copy_from_slice(&peregrine_isal::crc32c(&body).to_le_bytes());
        b[20..28].copy_from_slice(&gen.to_le_bytes());
        let gcrc = peregrine_isal::crc32c(&b[20..28]);
        b[28..32].copy_from_slice(&gcrc.to_le_bytes());
        b[32..32 + body.len()].copy_from_slice(&body);
        b
    }

    /// Decode one copy; `Err` says what is wrong with a block that has our magic.
    fn decode(b: &[u8]) -> Result<Superblock, String> {
        Self::decode_gen(b).map(|(sb, _)| sb)
    }

    /// Decode one copy with its generation (0: written before there were
    /// two copies).
    fn decode_gen(b: &[u8]) -> Result<(Superblock, u64), String> {
        if b.len() < BLOCK as usize {
            return Err("truncated Peregrine superblock".into());
        }
        let le32 = |o: usize| u32::from_le_bytes(b[o..o + 4].try_into().unwrap());
        let gen = u64::from_le_bytes(b[20..28].try_into().unwrap());
        let gcrc = le32(28);
        let gen = match (gen, gcrc) {
            (0, 0) => 0,
            (g, c) if peregrine_isal::crc32c(&b[20..28]) == c => g,
            _ => return Err("Peregrine superblock with bad generation CRC".into()),
        };
        let version = le32(8);
        if !SB_VERSIONS.contains(&version) {
            return Err(format!("Peregrine superblock of unknown version {version}"));
        }
        let len = le32(12) as usize;
        if len > BLOCK as usize - 32 {
            return Err(format!("Peregrine superblock with bad length {len}"));
        }
        let body = &b[32..32 + len];
        if peregrine_isal::crc32c(body) != le32(16) {
            return Err("Peregrine superblock with bad CRC".into());
        }
        bincode::deserialize(body)
            .map(|sb| (sb, gen))
            .map_err(|e| format!("Peregrine superblock undecodable: {e}"))
    }
}

/// One copy as read: the superblock and its generation, or what is wrong.
type Copy = Result<(Superblock, u64), String>;

/// The copy to trust: the valid one of the highest generation.
fn newest(copies: &[Copy]) -> Option<(usize, &Superblock, u64)> {
    copies
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.as_ref().ok().map(|(sb, g)| (i, sb, *g)))
        .max_by_key(|&(i, _, g)| (g, std::cmp::Reverse(i)))
}

/// What copy B's block holds.
fn read_copy(f: &File, i: usize) -> std::io::Result<Copy> {
    let mut b = vec![0u8; BLOCK as usize];
    let mut got = 0;
    while got < b.len() {
        match f.read_at(&mut b[got..], SB_COPIES[i] + got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    Ok(if b[..8] == SB_MAGIC[..] {
        Superblock::decode_gen(&b)
    } else if b.iter().all(|&x| x == 0) {
        Err("missing (zeros)".into())
    } else {
        Err("not a Peregrine superblock".into())
    })
}

/// Make both copies hold the newest valid one (`sb`, found by [`scan`]):
/// rewrite a copy that is damaged, missing or older, and flush. Returns
/// one line per copy rewritten, saying what was wrong with it.
pub(crate) fn repair(f: &File, name: &str) -> Result<Vec<String>, StorageError> {
    let io = |what: &str, e| StorageError::io(format!("device {name}: superblock: {what}"), e);
    let copies = (0..2)
        .map(|i| read_copy(f, i))
        .collect::<std::io::Result<Vec<Copy>>>()
        .map_err(|e| io("read", e))?;
    let Some((from, sb, gen)) = newest(&copies) else {
        return Err(StorageError::Corrupt(format!(
            "device {name}: no valid superblock copy"
        )));
    };
    let good = sb.encode(gen.max(FIRST_GEN));
    let mut done = Vec::new();
    for (i, c) in copies.iter().enumerate() {
        let why = match c {
            Err(why) => why.clone(),
            Ok((_, g)) if *g < gen => format!("generation {g}, older than {gen}"),
            Ok((_, 0)) => "written before superblocks had two copies".into(),
            Ok(_) => continue,
        };
        f.write_all_at(&good, SB_COPIES[i])
            .map_err(|e| io("rewrite a copy", e))?;
        let line = format!(
            "device {name}: superblock copy at offset {} was {why}; rewritten from the copy at offset {}",
            SB_COPIES[i], SB_COPIES[from]
        );
        tracing::warn!("{line}");
        done.push(line);
    }
    if !done.is_empty() {
        f.sync_data().map_err(|e| io("flush", e))?;
    }
    Ok(done)
}

/// What `scan` found on a device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanState {
    /// Missing file or all zeros in the probed area.
    Unformatted,
    Formatted(Superblock),
    /// Something else: e.g. "ext4 superblock (magic 0xEF53 at byte 1080)" or "non-zero data at offset 0".
    Foreign(String),
}

/// Size of a device: a file's length, or a block device's size (seek to its end).
pub(crate) fn device_size(f: &mut File, path: &std::path::Path) -> Result<u64, StorageError> {
    f.seek(SeekFrom::End(0))
        .map_err(|e| StorageError::io(format!("device {}: size", path.display()), e))
}

/// What the probed start of a device and the block of copy B say: the
/// newest valid copy wins, unless the start holds another file system's
/// signature (the device was reused: the copy B left is stale).
fn classify_copies(probe: &[u8], copy_b: Copy) -> ScanState {
    let a = if probe.len() >= 8 && &probe[..8] == SB_MAGIC {
        Superblock::decode_gen(probe)
    } else {
        Err(String::new())
    };
    // Another file system's signature (not damage to ours: a damaged copy A
    // or stray bytes leave copy B in charge).
    let foreign = match classify(probe) {
        ScanState::Foreign(what) if a.is_err() && !probe.starts_with(SB_MAGIC) => {
            (!what.starts_with("non-zero data")).then_some(what)
        }
        _ => None,
    };
    let copies = [a, copy_b];
    match newest(&copies) {
        Some((_, sb, _)) if foreign.is_none() => ScanState::Formatted(sb.clone()),
        _ => classify(probe),
    }
}

fn classify(probe: &[u8]) -> ScanState {
    if probe.len() >= 8 && &probe[..8] == SB_MAGIC {
        return match Superblock::decode(probe) {
            Ok(sb) => ScanState::Formatted(sb),
            Err(e) => ScanState::Foreign(e),
        };
    }
    if probe.len() >= 4 && &probe[..4] == b"XFSB" {
        return ScanState::Foreign("xfs superblock (\"XFSB\" at byte 0)".into());
    }
    if probe.len() >= 1082 && probe[1080] == 0x53 && probe[1081] == 0xEF {
        return ScanState::Foreign("ext4 superblock (magic 0xEF53 at byte 1080)".into());
    }
    match probe.iter().position(|&b| b != 0) {
        None => ScanState::Unformatted,
        Some(off) => ScanState::Foreign(format!("non-zero data at offset {off}")),
    }
}

/// Look at a device without changing it.
pub fn scan(bdev: &BdevSpec) -> Result<ScanState, StorageError> {
    let f = match File::open(&bdev.path) {
        Ok(f) => f,
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                && matches!(bdev.class, BdevClass::File) =>
        {
            return Ok(ScanState::Unformatted)
        }
        Err(e) => {
            return Err(StorageError::io(
                format!("device {}: open", bdev.path.display()),
                e,
            ))
        }
    };
    let mut probe = vec![0u8; PROBE_BYTES];
    let mut got = 0;
    while got < probe.len() {
        match f.read_at(&mut probe[got..], got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => {
                return Err(StorageError::io(
                    format!("device {}: read superblock", bdev.path.display()),
                    e,
                ))
            }
        }
    }
    probe.truncate(got);
    let copy_b = read_copy(&f, 1).map_err(|e| {
        StorageError::io(
            format!("device {}: read superblock copy B", bdev.path.display()),
            e,
        )
    })?;
    Ok(classify_copies(&probe, copy_b))
}

/// Compute the layout of a device of `bytes` split over `targets`.
fn layout(bytes: u64, targets: u32, path: &str) -> Result<(u64, u64, u64, u64), StorageError> {
    if targets == 0 {
        return Err(StorageError::Invalid("targets: must be at least 1".into()));
    }
    let target_bytes = (bytes.saturating_sub(TARGETS_OFFSET) / targets as u64) / MIB * MIB;
    if target_bytes < MIN_TARGET_BYTES {
        return Err(StorageError::Invalid(format!(
            "device {path}: {bytes} bytes is too small for {targets} targets (need at least {} bytes)",
            TARGETS_OFFSET + MIN_TARGET_BYTES * targets as u64
        )));
    }
    // WAL and each checkpoint slot take an eighth of the region (at most 1 GiB):
    // a checkpoint must hold the target's RAM index, the WAL must absorb the
    // updates between two checkpoints.
    let meta = (target_bytes / 8 / MIB * MIB).clamp(MIB, 1 << 30);
    let data = target_bytes - 3 * meta;
    Ok((target_bytes, meta, meta, data))
}

pub(crate) fn open_rw(path: &std::path::Path) -> Result<File, StorageError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .map_err(|e| StorageError::io(format!("device {}: open", path.display()), e))
}

/// Format a device for `system` / `rank`. Refuses a device holding a foreign
/// signature or an existing Peregrine format unless `force`.
pub fn format(
    opts: &StorageOptions,
    system: &str,
    rank: u32,
    force: bool,
) -> Result<Superblock, StorageError> {
    let bdev = &opts.bdev;
    let name = bdev.path.display().to_string();
    match scan(bdev)? {
        ScanState::Unformatted => {}
        ScanState::Foreign(what) if !force => {
            return Err(StorageError::Refused(format!(
                "device {name} holds {what}; refusing to format it without force"
            )))
        }
        ScanState::Formatted(sb) if !force => {
            return Err(StorageError::Refused(format!(
                "device {name} is already formatted (system {}, rank {}); refusing to reformat without force",
                sb.system, sb.rank
            )))
        }
        _ => {}
    }
    if matches!(bdev.class, BdevClass::File) {
        let f = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&bdev.path)
            .map_err(|e| StorageError::io(format!("device {name}: create"), e))?;
        let len = f
            .metadata()
            .map_err(|e| StorageError::io(format!("device {name}: stat"), e))?
            .len();
        if len < bdev.size {
            f.set_len(bdev.size).map_err(|e| {
                StorageError::io(format!("device {name}: extend to {} bytes", bdev.size), e)
            })?;
        }
    }
    let mut f = open_rw(&bdev.path)?;
    let bytes = device_size(&mut f, &bdev.path)?;
    let (target_bytes, wal_bytes, ckpt_bytes, data_bytes) = layout(bytes, opts.targets, &name)?;
    let sb = Superblock {
        system: system.to_string(),
        rank,
        engine_uuid: Uuid::new_v4(),
        device_uuid: Uuid::new_v4(),
        targets: opts.targets,
        device_bytes: bytes,
        version: SB_VERSION,
        mgmt_offset: MGMT_OFFSET,
        mgmt_slot_bytes: MGMT_SLOT_BYTES,
        target_offset: TARGETS_OFFSET,
        target_bytes,
        wal_bytes,
        ckpt_bytes,
        data_bytes,
    };
    let io = |what: &str, e| StorageError::io(format!("device {name}: format: {what}"), e);
    let zero = vec![0u8; BLOCK as usize];
    // First invalidate the old superblock (both copies) so a crash
    // mid-format leaves an unformatted device, never an old superblock
    // over new regions.
    for off in SB_COPIES {
        f.write_all_at(&zero, off)
            .map_err(|e| io("clear superblock", e))?;
    }
    f.sync_data().map_err(|e| io("sync", e))?;
    // Clear every slot header a previous format may have left: the management
    // slots, each target's WAL head and checkpoint headers. (Stale records
    // further on are rejected by their device uuid.)
    for slot in 0..2 {
        f.write_all_at(&zero, MGMT_OFFSET + slot * MGMT_SLOT_BYTES)
            .map_err(|e| io("clear management slots", e))?;
    }
    for t in 0..opts.targets {
        for off in [sb.wal_offset(t), sb.ckpt_offset(t, 0), sb.ckpt_offset(t, 1)] {
            f.write_all_at(&zero, off)
                .map_err(|e| io("clear target regions", e))?;
        }
    }
    f.sync_data().map_err(|e| io("sync", e))?;
    // Copy A, then copy B: a crash between leaves A, and the next open
    // writes B from it.
    let block = sb.encode(FIRST_GEN);
    for off in SB_COPIES {
        f.write_all_at(&block, off)
            .map_err(|e| io("write superblock", e))?;
        f.sync_data().map_err(|e| io("sync", e))?;
    }
    tracing::info!(device = %name, system, rank, targets = opts.targets, bytes, "formatted");
    Ok(sb)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classify_signatures() {
        let mut b = vec![0u8; PROBE_BYTES];
        assert_eq!(classify(&b), ScanState::Unformatted);
        b[1080] = 0x53;
        b[1081] = 0xEF;
        assert!(matches!(classify(&b), ScanState::Foreign(s) if s.contains("ext4")));
        let mut b = vec![0u8; PROBE_BYTES];
        b[..4].copy_from_slice(b"XFSB");
        assert!(matches!(classify(&b), ScanState::Foreign(s) if s.contains("xfs")));
        let mut b = vec![0u8; PROBE_BYTES];
        b[5000] = 1;
        assert_eq!(
            classify(&b),
            ScanState::Foreign("non-zero data at offset 5000".into())
        );
    }

    #[test]
    fn superblock_round_trip_and_crc() {
        let (tb, w, c, d) = layout(64 << 20, 2, "x").unwrap();
        let sb = Superblock {
            system: "s".into(),
            rank: 3,
            engine_uuid: Uuid::new_v4(),
            device_uuid: Uuid::new_v4(),
            targets: 2,
            device_bytes: 64 << 20,
            version: SB_VERSION,
            mgmt_offset: MGMT_OFFSET,
            mgmt_slot_bytes: MGMT_SLOT_BYTES,
            target_offset: TARGETS_OFFSET,
            target_bytes: tb,
            wal_bytes: w,
            ckpt_bytes: c,
            data_bytes: d,
        };
        assert!(sb.data_offset(1) + d <= 64 << 20);
        let mut b = sb.encode(FIRST_GEN);
        assert_eq!(classify(&b), ScanState::Formatted(sb.clone()));
        // Two copies: the newest valid wins; a foreign file system at the
        // start makes copy B stale, a damaged copy A does not.
        let gen = |b: &[u8], g: u64| {
            let mut b = b.to_vec();
            b[20..28].copy_from_slice(&g.to_le_bytes());
            let c = peregrine_isal::crc32c(&b[20..28]);
            b[28..32].copy_from_slice(&c.to_le_bytes());
            b
        };
        let newer = Superblock {
            rank: 4,
            ..sb.clone()
        };
        let b2 = gen(&newer.encode(FIRST_GEN), 2);
        assert_eq!(
            classify_copies(&b, Superblock::decode_gen(&b2)),
            ScanState::Formatted(newer.clone())
        );
        let mut damaged = b.clone();
        damaged[40] ^= 1;
        assert_eq!(
            classify_copies(&damaged, Superblock::decode_gen(&b)),
            ScanState::Formatted(sb.clone())
        );
        let mut ext4 = vec![0u8; PROBE_BYTES];
        ext4[1080] = 0x53;
        ext4[1081] = 0xEF;
        assert!(matches!(
            classify_copies(&ext4, Superblock::decode_gen(&b)),
            ScanState::Foreign(s) if s.contains("ext4")
        ));
        let mut legacy = b.clone();
        legacy[20..32].fill(0);
        assert_eq!(Superblock::decode_gen(&legacy).unwrap().1, 0);
        let mut bad_gen = b.clone();
        bad_gen[21] ^= 1;
        assert!(Superblock::decode_gen(&bad_gen).is_err());
        b[40] ^= 1;
        assert!(matches!(classify(&b), ScanState::Foreign(s) if s.contains("CRC")));
        assert!(layout(9 << 20, 1, "x").is_err());
    }
}
