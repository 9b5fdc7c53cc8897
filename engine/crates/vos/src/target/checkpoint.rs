//! Checkpoints: the index written to the inactive slot once the WAL has
//! grown enough ([`Target::checkpoint_due`]) or at close, after which the
//! WAL restarts at its beginning.

use super::*;

/// WAL bytes a checkpoint waits for at least: with a small index, replay
/// after a crash reads no more than this (~160,000 packed records of a
/// create, ~0.5 s).
const CKPT_WAL_FLOOR: u64 = 64 << 20;

impl Target {
    /// Whether the WAL has grown enough for a checkpoint: past twice the
    /// last checkpoint's size, at least [`CKPT_WAL_FLOOR`], at most half
    /// the WAL (no batch is larger than the other half). A checkpoint
    /// stops its target while it encodes the whole index, so waiting in
    /// proportion to the index keeps its cost per update the same however
    /// large the namespace grows (with a fixed threshold it grows with the
    /// namespace), and replay reads at most twice the checkpoint's bytes.
    pub(super) fn checkpoint_due(&self) -> bool {
        let at = (2 * self.wal.ckpt_bytes)
            .max(CKPT_WAL_FLOOR)
            .min(self.sb.wal_bytes / 2);
        self.wal.tail > at
    }

    pub(super) fn maybe_checkpoint(&mut self) {
        if self.checkpoint_due() {
            if let Err(e) = self.checkpoint() {
                tracing::warn!(target = self.id, error = %e, "checkpoint failed; WAL keeps growing");
            }
        }
    }

    /// Write the index to the inactive slot, fsync, then restart the WAL.
    /// The index holds exactly the durable state here (changes are applied
    /// only after their record is durable), stamped with the last record's seq.
    pub(super) fn checkpoint(&mut self) -> Result<(), StorageError> {
        let t0 = Instant::now();
        self.index.repack();
        let encode_err =
            |e| StorageError::Corrupt(format!("target {}: encode checkpoint: {e}", self.id));
        // Sized first: the record is one buffer of exactly its size (the
        // index of a target can take hundreds of MiB encoded), and one too
        // large for its slot is refused before any of it is made.
        let len = bincode::serialized_size(&self.index).map_err(encode_err)?;
        if wal::round_up(wal::HDR as u64 + len) > self.sb.ckpt_bytes {
            return Err(StorageError::Invalid(format!(
                "target {}: checkpoint of {} bytes exceeds its slot of {} bytes (metadata budget too large for this device)",
                self.id,
                wal::HDR as u64 + len,
                self.sb.ckpt_bytes
            )));
        }
        let mut rec = wal::with_room(len);
        bincode::serialize_into(&mut rec, &self.index).map_err(encode_err)?;
        let rec = wal::seal(CKPT_MAGIC, self.sb.device_uuid, self.wal.seq, 0, rec);
        let off = self.sb.ckpt_offset(self.id, self.wal.next_ckpt);
        self.dev
            .write(&[(off, &rec)], true)
            .map_err(|e| self.io_err("write checkpoint", e))?;
        // Its time grows with the index (the target serves nothing meanwhile).
        tracing::info!(
            target = self.id,
            slot = self.wal.next_ckpt,
            seq = self.wal.seq,
            bytes = rec.len(),
            ms = t0.elapsed().as_millis() as u64,
            "checkpoint"
        );
        self.wal.next_ckpt ^= 1;
        self.wal.ckpt_bytes = rec.len() as u64;
        self.wal.tail = 0;
        self.wal.seq_started = self.wal.seq;
        self.wal.checkpoints += 1;
        self.counters.checkpoint();
        // Replay starts from here: every record so far counts as flushed and checked.
        self.flush.durable = self.wal.seq;
        self.flush.dirty_since = None;
        self.flush.stamps.clear();
        self.flush.settled = self.wal.seq;
        self.settle();
        Ok(())
    }
}
