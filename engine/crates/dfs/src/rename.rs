//! Renames: the roll-forward protocol (see "Renames" in the crate docs).

use crate::dfs::check_name;
use crate::{
    err, now_ns, show, Dfs, Entry, Move, Node, Xattrs, INODE, RENAME_CLAIM, RENAME_EXCHANGE,
    RENAME_NOREPLACE,
};
use peregrine::{Error, Object, ObjectId, Result};
use std::sync::atomic::Ordering;

/// A rename whose intent is older than this and whose destination does not
/// name its object is taken as abandoned (its client died) and undone.
pub(crate) const RENAME_LEASE_NS: i64 = 30_000_000_000;

impl Dfs {
    /// Write entry `e` with xattrs `xs` at (dir, name), replacing what is
    /// there (stale xattrs of the old occupant are punched). With
    /// `noreplace` the entry goes first, as a conditional insert (`EEXIST`
    /// and nothing written if the name is taken), then its xattrs.
    fn install(
        &self,
        dir: ObjectId,
        name: &[u8],
        e: &Entry,
        xs: &[(Vec<u8>, Vec<u8>)],
        had_entry: bool,
        noreplace: bool,
    ) -> Result<()> {
        let o = self.obj(dir)?;
        if noreplace {
            self.insert_entry(dir, name, e)?;
            for (k, v) in xs {
                o.update_single(name, k, v)?;
            }
            return Ok(());
        }
        if had_entry {
            let old = self.xattr_keys(dir, name)?;
            let stale: Vec<&[u8]> = old
                .iter()
                .filter(|k| !xs.iter().any(|(n, _)| n == *k))
                .map(|k| k.as_slice())
                .collect();
            o.punch_akeys(name, &stale)?;
        }
        for (k, v) in xs {
            o.update_single(name, k, v)?;
        }
        o.update_single(name, INODE, &e.encode())
    }

    /// rename(2)/renameat2(2): `flags` 0, [`RENAME_NOREPLACE`] or
    /// [`RENAME_EXCHANGE`]. A replaced file's data is punched.
    pub fn rename(
        &self,
        sp: &Node,
        sname: &[u8],
        dp: &Node,
        dname: &[u8],
        flags: u32,
    ) -> Result<()> {
        if let Some(e) = self.rename_deferred(sp, sname, dp, dname, flags)? {
            self.release_object(&e)?;
        }
        Ok(())
    }

    /// Like [`Dfs::rename`]; returns the replaced entry without punching
    /// its object (the caller calls [`Dfs::release_object`] when the file
    /// is no longer open).
    pub fn rename_deferred(
        &self,
        sp: &Node,
        sname: &[u8],
        dp: &Node,
        dname: &[u8],
        flags: u32,
    ) -> Result<Option<Entry>> {
        let (r, (ds, dd)) = self.rename_locked(sp, sname, dp, dname, flags)?;
        if sp.oid() != dp.oid() || sname != dname {
            self.touch_dir(sp);
            if dp.oid() != sp.oid() {
                self.touch_dir(dp);
            }
        }
        if sp.oid() == dp.oid() {
            self.adjust_subdirs(sp, ds + dd);
        } else {
            self.adjust_subdirs(sp, ds);
            self.adjust_subdirs(dp, dd);
        }
        Ok(r)
    }

    /// Returns the replaced entry and how the subdirectory counts of the
    /// source and destination directories change.
    fn rename_locked(
        &self,
        sp: &Node,
        sname: &[u8],
        dp: &Node,
        dname: &[u8],
        flags: u32,
    ) -> Result<(Option<Entry>, (i64, i64))> {
        Self::need_dir(sp)?;
        Self::need_dir(dp)?;
        check_name(sname)?;
        check_name(dname)?;
        self.check_rw()?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        {
            return Err(Error::inval(format!("rename flags {flags:#x}")));
        }
        let (s, d) = (sp.oid(), dp.oid());
        let _g = self.lock(&[(s, sname), (d, dname)]);
        let se = self
            .fetch_entry(s, sname)?
            .ok_or_else(|| err(libc::ENOENT, format!("{:?}: no such entry", show(sname))))?;
        let de = self.fetch_entry(d, dname)?;
        if s == d && sname == dname {
            return if flags & RENAME_NOREPLACE != 0 {
                Err(err(libc::EEXIST, format!("{:?} exists", show(dname))))
            } else {
                Ok((None, (0, 0)))
            };
        }
        let (sdir, ddir) = (
            se.is_dir() as i64,
            de.as_ref().is_some_and(|e| e.is_dir()) as i64,
        );
        if se.oid == d || de.as_ref().is_some_and(|x| x.oid == s) {
            return Err(Error::inval(
                "rename would make a directory its own ancestor",
            ));
        }
        for (e, n) in [(Some(&se), sname), (de.as_ref(), dname)] {
            if e.is_some_and(|e| e.moving.is_some()) {
                return Err(err(
                    libc::EBUSY,
                    format!("{:?} is being renamed by another client", show(n)),
                ));
            }
        }
        // Every check that can refuse the rename comes before the claim.
        let exchange = flags & RENAME_EXCHANGE != 0;
        match &de {
            None if exchange => {
                return Err(err(
                    libc::ENOENT,
                    format!("{:?}: no such entry", show(dname)),
                ))
            }
            Some(_) if flags & RENAME_NOREPLACE != 0 => {
                return Err(err(libc::EEXIST, format!("{:?} exists", show(dname))));
            }
            Some(de) if !exchange && se.is_dir() => self.check_empty_dir(de, dname)?,
            Some(de) if !exchange && de.is_dir() => {
                return Err(err(
                    libc::EISDIR,
                    format!("{:?} is a directory", show(dname)),
                ))
            }
            _ => {}
        }
        // Both entries are about to move or go: finish the renames that put them here.
        self.settle_from(&se)?;
        if let Some(de) = &de {
            self.settle_from(de)?;
        }
        self.claim_rename(s, sname)?;
        // A rename that won the claim before this one may have finished since
        // the source was read: it must still be there, unchanged.
        if self.fetch_raw(s, sname)?.map(|e| e.oid) != Some(se.oid) {
            self.obj(s)?.punch_akeys(sname, &[RENAME_CLAIM])?;
            return Err(err(
                libc::ENOENT,
                format!("{:?}: renamed or removed meanwhile", show(sname)),
            ));
        }
        self.rename_step("claim")?;
        let sx = self.xattrs(s, sname)?;
        let since = now_ns();
        let mut moved = se.clone();
        moved.ctime = since;
        moved.from = Some((s, sname.to_vec()));
        if let (true, Some(de)) = (exchange, &de) {
            let dx = self.xattrs(d, dname)?;
            let intent = self.put_intent(s, sname, &se, d, dname, since, Some((de.clone(), dx)))?;
            self.rename_step("exchange intent")?;
            self.install(d, dname, &moved, &sx, true, false)?;
            self.rename_step("exchange destination")?;
            self.settle(s, sname, intent)?;
            return Ok((None, (ddir - sdir, sdir - ddir)));
        }
        self.put_intent(s, sname, &se, d, dname, since, None)?;
        self.rename_step("intent")?;
        let noreplace = flags & RENAME_NOREPLACE != 0;
        if let Err(e) = self.install(d, dname, &moved, &sx, de.is_some(), noreplace) {
            // Nothing moved (e.g. a NOREPLACE destination another client just
            // created): withdraw the intent and the claim (or leave them to the lease).
            if self.put_entry(s, sname, &se).is_ok() {
                let _ = self.obj(s)?.punch_akeys(sname, &[RENAME_CLAIM]);
            }
            return Err(e);
        }
        self.rename_step("destination")?;
        self.obj(s)?.punch_dkey(sname)?;
        Ok((de, (-sdir, sdir - ddir)))
    }

    /// Step 1 of a rename: record in the source entry where it goes (and,
    /// for an exchange, what comes back). Returns the entry as written.
    #[allow(clippy::too_many_arguments)]
    fn put_intent(
        &self,
        s: ObjectId,
        sname: &[u8],
        se: &Entry,
        d: ObjectId,
        dname: &[u8],
        since: i64,
        exchange: Option<(Entry, Xattrs)>,
    ) -> Result<Entry> {
        let mut intent = se.clone();
        intent.moving = Some(Box::new(Move {
            to_dir: d,
            to_name: dname.to_vec(),
            since,
            exchange,
        }));
        self.put_entry(s, sname, &intent)?;
        Ok(intent)
    }

    /// Settle the rename whose intent source entry `e` (at parent/name)
    /// holds. The destination naming the same object is the rename's commit
    /// point: then the rename is finished here (the source punched, or for
    /// an exchange the destination's old entry written to the source) and
    /// the result returned. Otherwise the rename is in progress (`e` stands,
    /// intent and all) or, once its intent is older than the lease,
    /// abandoned by a client that died: undone.
    pub(crate) fn settle(&self, parent: ObjectId, name: &[u8], e: Entry) -> Result<Option<Entry>> {
        let Some(m) = e.moving.as_deref() else {
            return Ok(Some(e));
        };
        let dest = self.fetch_raw(m.to_dir, &m.to_name)?;
        if dest.is_some_and(|d| d.oid == e.oid) {
            return match &m.exchange {
                None => {
                    self.obj(parent)?.punch_dkey(name)?;
                    Ok(None)
                }
                Some((other, xs)) => {
                    let mut back = other.clone();
                    back.ctime = m.since;
                    self.install(parent, name, &back, xs, true, false)?;
                    self.obj(parent)?.punch_akeys(name, &[RENAME_CLAIM])?;
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
        self.put_entry(parent, name, &back)?;
        self.obj(parent)?.punch_akeys(name, &[RENAME_CLAIM])?;
        Ok(Some(back))
    }

    /// Step 0 of a rename: claim the source entry by conditional insert, so
    /// that of several clients renaming it one goes on and the others get
    /// `EBUSY`. A claim older than the lease is a rename whose client died
    /// before it wrote its intent: it is taken over.
    fn claim_rename(&self, dir: ObjectId, name: &[u8]) -> Result<()> {
        let o = self.obj(dir)?;
        let busy = || {
            err(
                libc::EBUSY,
                format!("{:?} is being renamed by another client", show(name)),
            )
        };
        let claim = |o: &Object| match o.insert_single(name, RENAME_CLAIM, &now_ns().to_le_bytes())
        {
            Err(e) if e.code == -libc::EEXIST => Err(busy()),
            r => r,
        };
        match claim(&o) {
            Err(e) if e.code == -libc::EBUSY => {}
            r => return r,
        }
        let since = o
            .fetch_single(name, RENAME_CLAIM)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map(i64::from_le_bytes);
        // No claim to read: it is still being committed (a conditional
        // insert sees those, a fetch does not yet) or was just released.
        // Either way somebody else's rename is under way.
        let lease = self.inner.rename_lease_ns.load(Ordering::Relaxed);
        match since {
            Some(t) if now_ns().saturating_sub(t) >= lease => {
                o.punch_akeys(name, &[RENAME_CLAIM])?;
                claim(&o)
            }
            _ => Err(busy()),
        }
    }

    /// Before entry `e` moves again or goes away: settle the rename that
    /// put it where it is, if that rename's source still holds its intent
    /// (else, e.g., the source would be undone once its lease ran out, and
    /// name an object removed here).
    pub(crate) fn settle_from(&self, e: &Entry) -> Result<()> {
        if let Some((dir, name)) = &e.from {
            self.fetch_entry(*dir, name)?;
        }
        Ok(())
    }

    fn rename_step(&self, step: &'static str) -> Result<()> {
        if *self.inner.stop_rename_after.lock() == Some(step) {
            return Err(err(
                libc::EIO,
                format!("rename stopped after its {step} (test)"),
            ));
        }
        Ok(())
    }

    /// Tests: renames stop after `step` ("claim", "intent", "destination",
    /// "exchange intent", "exchange destination"), as if their client died there.
    #[doc(hidden)]
    pub fn stop_renames_after(&self, step: Option<&'static str>) {
        *self.inner.stop_rename_after.lock() = step;
    }

    /// Tests: how old a rename's intent must be to count as abandoned.
    #[doc(hidden)]
    pub fn set_rename_lease(&self, lease: std::time::Duration) {
        self.inner
            .rename_lease_ns
            .store(lease.as_nanos() as i64, Ordering::Relaxed);
    }
}
