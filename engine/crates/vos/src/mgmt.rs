//! The management-service state blob: two slots (A/B) after the superblock.
//! A store writes the slot NOT holding the newest copy, with sequence + 1,
//! and fsyncs; load takes the valid slot with the highest sequence. A torn
//! write therefore loses at most the blob being written, never the previous one.
//!
//! Slot header (first 4 KiB): magic "PRGNMGMT", device uuid, sequence (u64),
//! length (u64), blob CRC32C, header CRC32C; the blob follows at 4 KiB.

use crate::error::StorageError;
use crate::superblock::{Superblock, BLOCK};
use std::fs::File;
use std::os::unix::fs::FileExt;

const MAGIC: &[u8; 8] = b"PRGNMGMT";

pub(crate) struct MgmtSlots {
    file: File,
    sb: Superblock,
}

struct Slot {
    seq: u64,
    blob: Vec<u8>,
}

impl MgmtSlots {
    pub(crate) fn new(file: File, sb: Superblock) -> Self {
        MgmtSlots { file, sb }
    }

    fn max_blob(&self) -> u64 {
        self.sb.mgmt_slot_bytes - BLOCK
    }

    fn read_slot(&self, i: u64) -> Result<Option<Slot>, StorageError> {
        let off = self.sb.mgmt_offset + i * self.sb.mgmt_slot_bytes;
        let mut h = [0u8; 48];
        self.file
            .read_exact_at(&mut h, off)
            .map_err(|e| StorageError::io(format!("management slot {i}: read"), e))?;
        if &h[0..8] != MAGIC || &h[8..24] != self.sb.device_uuid.as_bytes() {
            return Ok(None);
        }
        if peregrine_isal::crc32c(&h[0..44]) != u32::from_le_bytes(h[44..48].try_into().unwrap()) {
            return Ok(None);
        }
        let seq = u64::from_le_bytes(h[24..32].try_into().unwrap());
        let len = u64::from_le_bytes(h[32..40].try_into().unwrap());
        if len > self.max_blob() {
            return Ok(None);
        }
        let mut blob = vec![0u8; len as usize];
        self.file
            .read_exact_at(&mut blob, off + BLOCK)
            .map_err(|e| StorageError::io(format!("management slot {i}: read"), e))?;
        if peregrine_isal::crc32c(&blob) != u32::from_le_bytes(h[40..44].try_into().unwrap()) {
            return Ok(None);
        }
        Ok(Some(Slot { seq, blob }))
    }

    /// (index of the newest valid slot, its content)
    fn newest(&self) -> Result<Option<(u64, Slot)>, StorageError> {
        let mut best: Option<(u64, Slot)> = None;
        for i in 0..2 {
            if let Some(s) = self.read_slot(i)? {
                if best.as_ref().is_none_or(|(_, b)| s.seq > b.seq) {
                    best = Some((i, s));
                }
            }
        }
        Ok(best)
    }

    pub(crate) fn load(&self) -> Result<Option<Vec<u8>>, StorageError> {
        Ok(self.newest()?.map(|(_, s)| s.blob))
    }

    pub(crate) fn store(&self, blob: &[u8]) -> Result<(), StorageError> {
        if blob.len() as u64 > self.max_blob() {
            return Err(StorageError::Invalid(format!(
                "management blob of {} bytes exceeds its slot ({} bytes)",
                blob.len(),
                self.max_blob()
            )));
        }
        let (slot, seq) = match self.newest()? {
            Some((i, s)) => (i ^ 1, s.seq + 1),
            None => (0, 1),
        };
        let off = self.sb.mgmt_offset + slot * self.sb.mgmt_slot_bytes;
        let mut h = vec![0u8; BLOCK as usize];
        h[0..8].copy_from_slice(MAGIC);
        h[8..24].copy_from_slice(self.sb.device_uuid.as_bytes());
        h[24..32].copy_from_slice(&seq.to_le_bytes());
        h[32..40].copy_from_slice(&(blob.len() as u64).to_le_bytes());
        h[40..44].copy_from_slice(&peregrine_isal::crc32c(blob).to_le_bytes());
        let hcrc = peregrine_isal::crc32c(&h[0..44]);
        h[44..48].copy_from_slice(&hcrc.to_le_bytes());
        h.extend_from_slice(blob);
        self.file
            .write_all_at(&h, off)
            .and_then(|()| self.file.sync_data())
            .map_err(|e| StorageError::io(format!("management slot {slot}: write"), e))
    }
}
