//! Renames: one engine transaction each (see "Renames" in the crate docs).

use crate::dfs::{check_name, retry_changed};
use crate::{
    err, now_ns, show, Dfs, Entry, Node, Xattrs, INODE, RENAME_EXCHANGE, RENAME_NOREPLACE,
};
use peregrine::{Error, Expect, Object, ObjectId, Result, Transaction};

impl Dfs {
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
        let renamed = self.rename_locked(sp, sname, dp, dname, flags);
        self.dirs_moved();
        let (r, (ds, dd)) = renamed?;
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
        retry_changed(|| self.rename_once(s, sname, d, dname, flags))
    }

    /// One try: read both entries, check, and commit the change as one
    /// transaction that expects both entries as read.
    fn rename_once(
        &self,
        s: ObjectId,
        sname: &[u8],
        d: ObjectId,
        dname: &[u8],
        flags: u32,
    ) -> Result<(Option<Entry>, (i64, i64))> {
        let (se, s_epoch) = self
            .fetch_versioned(s, sname)?
            .ok_or_else(|| err(libc::ENOENT, format!("{:?}: no such entry", show(sname))))?;
        let de = self.fetch_versioned(d, dname)?;
        if s == d && sname == dname {
            return if flags & RENAME_NOREPLACE != 0 {
                Err(err(libc::EEXIST, format!("{:?} exists", show(dname))))
            } else {
                Ok((None, (0, 0)))
            };
        }
        // Two names of one hard-linked file: nothing to do (POSIX).
        if de
            .as_ref()
            .is_some_and(|(x, _)| x.linked && se.linked && x.oid == se.oid)
        {
            return Ok((None, (0, 0)));
        }
        let (sdir, ddir) = (
            se.is_dir() as i64,
            de.as_ref().is_some_and(|(e, _)| e.is_dir()) as i64,
        );
        if se.oid == d || de.as_ref().is_some_and(|(x, _)| x.oid == s) {
            return Err(Error::inval(
                "rename would make a directory its own ancestor",
            ));
        }
        let exchange = flags & RENAME_EXCHANGE != 0;
        let noreplace = flags & RENAME_NOREPLACE != 0;
        match &de {
            None if exchange => {
                return Err(err(
                    libc::ENOENT,
                    format!("{:?}: no such entry", show(dname)),
                ))
            }
            Some(_) if noreplace => {
                return Err(err(libc::EEXIST, format!("{:?} exists", show(dname))));
            }
            Some((de, _)) if !exchange && se.is_dir() => self.check_empty_dir(de, dname)?,
            Some((de, _)) if !exchange && de.is_dir() => {
                return Err(err(
                    libc::EISDIR,
                    format!("{:?} is a directory", show(dname)),
                ))
            }
            _ => {}
        }
        // Both entries move or go: finish old-protocol renames that put them here.
        self.settle_from(&se)?;
        if let Some((de, _)) = &de {
            self.settle_from(de)?;
        }
        let (so, dob) = (self.obj(s)?, self.obj(d)?);
        let sx = self.xattrs(s, sname)?;
        let dx = match &de {
            Some(_) => self.xattrs(d, dname)?,
            None => Vec::new(),
        };
        let since = now_ns();
        let mut tx = self.container().transaction();
        tx.expect(&so, sname, INODE, Expect::UnchangedSince(s_epoch));
        tx.expect(
            &dob,
            dname,
            INODE,
            match &de {
                Some((_, epoch)) => Expect::UnchangedSince(*epoch),
                None => Expect::Absent,
            },
        );
        let mut moved = se.clone();
        moved.ctime = since;
        moved.from = None;
        self.put_entry_in(&mut tx, &dob, dname, &moved, &sx, &dx);
        // What the rename replaces: the destination's file, unless it is a
        // hard link with other names left (its count goes down instead).
        let mut replaced = de.as_ref().map(|(e, _)| e.clone());
        if let (Some((x, _)), false) = (&de, exchange) {
            if x.linked {
                replaced = self.unlink_record_in(&mut tx, x.oid)?;
            }
        }
        match (&de, exchange) {
            (Some((other, _)), true) => {
                let mut back = other.clone();
                back.ctime = since;
                back.from = None;
                self.put_entry_in(&mut tx, &so, sname, &back, &dx, &sx);
            }
            _ => {
                tx.punch_dkey(&so, sname);
            }
        }
        match tx.commit() {
            Ok(()) => {}
            // Taken since it was read free: EEXIST for NOREPLACE, else read
            // again and replace what is there now.
            Err(e) if e.code == -libc::EEXIST && !noreplace => {
                return Err(Error::new(-libc::EBUSY, e.msg))
            }
            Err(e) if e.code == -libc::EEXIST => {
                return Err(err(libc::EEXIST, format!("{:?} exists", show(dname))))
            }
            Err(e) => return Err(e),
        }
        if exchange {
            Ok((None, (ddir - sdir, sdir - ddir)))
        } else {
            Ok((replaced, (-sdir, sdir - ddir)))
        }
    }

    /// Add to `tx`: entry `e` with xattrs `xs` at `name` of directory `o`,
    /// and the punch of the xattrs of `old` (its occupant's) that `xs` lacks.
    pub(crate) fn put_entry_in(
        &self,
        tx: &mut Transaction,
        o: &Object,
        name: &[u8],
        e: &Entry,
        xs: &Xattrs,
        old: &Xattrs,
    ) {
        for (k, v) in xs {
            tx.update_single(o, name, k, v);
        }
        tx.update_single(o, name, INODE, &e.encode());
        let stale: Vec<&[u8]> = old
            .iter()
            .map(|(k, _)| k.as_slice())
            .filter(|k| !xs.iter().any(|(n, _)| n == k))
            .collect();
        tx.punch_akeys(o, name, &stale);
    }
}
