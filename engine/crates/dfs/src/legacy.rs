//! Renames left half done by clients of before transactions (see "Renames"
//! in the crate docs): their roll-forward protocol left an intent
//! ([`crate::Move`]) in the source entry and an origin (`Entry::from`) in
//! the destination until it finished. This build never writes either; it
//! only settles what such a client left, so that one object never keeps
//! two names (removing one would punch the object the other names).

use crate::{now_ns, Dfs, Entry, INODE};
use peregrine::{ObjectId, Result};
use std::sync::atomic::Ordering;

/// Akey of an old-protocol rename's claim on its source entry.
pub(crate) const RENAME_CLAIM: &[u8] = b"rename";

/// An intent older than this whose destination does not name its object
/// was abandoned by its client (the old protocol's lease): it is undone.
pub(crate) const RENAME_LEASE_NS: i64 = 30_000_000_000;

impl Dfs {
    /// Settle the old-protocol rename whose intent source entry `e` (at
    /// parent/name) holds. The destination naming the same object was that
    /// rename's commit point: then it is finished here (the source punched,
    /// or for an exchange the destination's old entry written to the
    /// source). Otherwise it is in progress (`e` stands) or, once its intent
    /// is older than the lease, abandoned: undone.
    pub(crate) fn settle(&self, parent: ObjectId, name: &[u8], e: Entry) -> Result<Option<Entry>> {
        let Some(m) = e.moving.as_deref() else {
            return Ok(Some(e));
        };
        let o = self.obj(parent)?;
        let dest = self.fetch_raw(m.to_dir, &m.to_name)?;
        if dest.is_some_and(|d| d.oid == e.oid) {
            return match &m.exchange {
                None => {
                    o.punch_dkey(name)?;
                    Ok(None)
                }
                Some((other, xs)) => {
                    let mut back = other.clone();
                    back.ctime = m.since;
                    let mut tx = self.container().transaction();
                    let old = self.xattrs(parent, name)?;
                    self.put_entry_in(&mut tx, &o, name, &back, xs, &old);
                    tx.punch_akeys(&o, name, &[RENAME_CLAIM]);
                    tx.commit()?;
                    self.dirs_moved();
                    Ok(Some(back))
                }
            };
        }
        let lease = self.inner.rename_lease_ns.load(Ordering::Relaxed);
        if now_ns().saturating_sub(m.since) < lease {
            return Ok(Some(e));
        }
        let mut back = e.clone();
        back.moving = None;
        let mut tx = self.container().transaction();
        tx.update_single(&o, name, INODE, &back.encode());
        tx.punch_akeys(&o, name, &[RENAME_CLAIM]);
        tx.commit()?;
        self.dirs_moved();
        Ok(Some(back))
    }

    /// Before entry `e` moves again or goes away: settle the old-protocol
    /// rename that put it where it is, if that rename's source still holds
    /// its intent (else the source would be undone once its lease ran out,
    /// and name an object removed here).
    pub(crate) fn settle_from(&self, e: &Entry) -> Result<()> {
        if let Some((dir, name)) = &e.from {
            self.fetch_entry(*dir, name)?;
        }
        Ok(())
    }

    /// Tests: how old an old-protocol rename's intent must be to count as
    /// abandoned.
    #[doc(hidden)]
    pub fn set_rename_lease(&self, lease: std::time::Duration) {
        self.inner
            .rename_lease_ns
            .store(lease.as_nanos() as i64, Ordering::Relaxed);
    }
}
