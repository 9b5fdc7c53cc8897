//! Checkpoints: the index written to the inactive slot once the WAL passes
//! half full (or at close), after which the WAL restarts at its beginning.

use super::*;

impl Target {
    pub(super) fn maybe_checkpoint(&mut self) {
        if self.wal.tail > self.sb.wal_bytes / 2 {
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
