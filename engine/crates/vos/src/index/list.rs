//! Listings: the visible dkeys or akeys of an object ([`TargetIndex::list`]),
//! the keys changed since an epoch ([`TargetIndex::list_changed`]) and the
//! records of one dkey ([`TargetIndex::list_records`]) that a reintegration copies.

use super::*;
use crate::request::{Record, RecordKind};
use std::borrow::Borrow;

/// Whether a dkey holds a version or a punch (dkey or akey level) above `since`.
fn dkey_changed(d: &DkeyTree, since: u64) -> bool {
    d.punches.iter().any(|t| t.epoch > since) || d.akeys.values().any(|a| a.newest() > Some(since))
}

/// Epochs of `tombs` above `since`, ascending, each once.
fn tomb_epochs(tombs: &[Tomb], since: u64) -> Vec<u64> {
    let mut e: Vec<u64> = tombs
        .iter()
        .map(|t| t.epoch)
        .filter(|&e| e > since)
        .collect();
    e.sort_unstable();
    e.dedup();
    e
}

pub(super) fn punch_record(kind: RecordKind, epoch: u64, akey: &[u8]) -> Record {
    Record {
        kind,
        epoch,
        akey: akey.to_vec(),
        value_kind: Kind::Single,
        offset: 0,
        len: 0,
    }
}

/// A page of [`TargetIndex::list_changed`]: the keys found in the trees,
/// merged in order with the keys of held changes.
struct Page {
    keys: Vec<ChangedKey>,
    max: usize,
    /// Keys with held changes not listed yet, ascending.
    held: std::iter::Peekable<std::vec::IntoIter<ChangedKey>>,
}

impl Page {
    /// List `k` after the held keys before it. Ok(()) while more may come;
    /// Err(()) once a key beyond `max` turned up.
    fn push(&mut self, k: ChangedKey) -> Result<(), ()> {
        while let Some(h) = self.held.next_if(|h| *h <= k) {
            if h != k {
                self.add(h)?;
            }
        }
        self.add(k)
    }
    fn add(&mut self, k: ChangedKey) -> Result<(), ()> {
        if self.keys.len() == self.max {
            return Err(());
        }
        self.keys.push(k);
        Ok(())
    }
    /// The held keys after the last key of the trees; whether all fit.
    fn finish(mut self) -> (Vec<ChangedKey>, bool) {
        while let Some(h) = self.held.next() {
            if self.add(h).is_err() {
                return (self.keys, false);
            }
        }
        (self.keys, true)
    }
}

/// Keys of `map` strictly after `anchor` for which `visible` holds: up to
/// `max`, and whether the listing is complete.
fn list_keys<'a, K: Ord + Borrow<[u8]> + 'a, V: 'a>(
    map: &'a SmallMap<K, V>,
    anchor: &[u8],
    max: usize,
    visible: impl Fn(&V) -> bool,
) -> (Vec<Vec<u8>>, bool) {
    let start = if anchor.is_empty() {
        Bound::Unbounded
    } else {
        Bound::Excluded(anchor)
    };
    let mut keys = Vec::new();
    for (k, v) in map.range::<[u8], _>((start, Bound::Unbounded)) {
        if visible(v) {
            if keys.len() == max {
                return (keys, false);
            }
            keys.push(k.borrow().to_vec());
        }
    }
    (keys, true)
}

impl TargetIndex {
    /// List dkeys (`dkey` empty) or the akeys of `dkey` visible at `r`, strictly after `anchor`.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn list(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        anchor: &[u8],
        max: usize,
        r: u64,
    ) -> (Vec<Vec<u8>>, bool) {
        let Some(o) = self.cont(pool, cont).and_then(|c| c.objs.get(obj)) else {
            return (vec![], true);
        };
        let of = level_floor(&o.punches, r);
        if dkey.is_empty() {
            return list_keys(&o.dkeys, anchor, max, |d| dkey_exists(d, of, r));
        }
        let Some(d) = o.dkeys.get(dkey) else {
            return (vec![], true);
        };
        let df = of.max(level_floor(&d.punches, r));
        list_keys(&d.akeys, anchor, max, |a| {
            a.exists(df.max(level_floor(&a.punches, r)), r)
        })
    }

    /// Reintegration: the keys of `pool` strictly after `anchor`, in
    /// (container, object shard, dkey) order, whose dkey holds a version or
    /// a punch (dkey or akey level) above `since`, or whose object holds a
    /// punch above `since` (then every dkey of it counts; an object left
    /// with no dkeys is listed once, with an empty dkey). At most `max` keys
    /// (0: [`LIST_CHANGED_DEFAULT`], capped at [`LIST_CHANGED_MAX`]), and
    /// whether the listing is complete. An unknown pool lists nothing.
    /// Every key with a change held by a transaction is listed too, whatever
    /// its epoch (a held punch of an object: its empty dkey), so that
    /// reintegration comes back to it.
    ///
    /// It scans every dkey after the anchor until `max` keys are found
    /// (one comparison of epochs per version and punch): nothing is kept
    /// for it in the index.
    pub(crate) fn list_changed(
        &self,
        pool: &Uuid,
        since: u64,
        anchor: Option<&ChangedKey>,
        max: usize,
    ) -> (Vec<ChangedKey>, bool) {
        let max = match max {
            0 => LIST_CHANGED_DEFAULT,
            m => m.min(LIST_CHANGED_MAX),
        };
        let Some(p) = self.pools.get(pool) else {
            return (vec![], true);
        };
        let mut page = Page {
            keys: Vec::new(),
            max,
            held: self.dtx.held_keys(pool, anchor).into_iter().peekable(),
        };
        let from = anchor.map_or(Bound::Unbounded, |(c, _, _)| Bound::Included(*c));
        for (cid, c) in p.conts.range((from, Bound::Unbounded)) {
            let at = anchor.filter(|(ac, _, _)| ac == cid);
            let from = at.map_or(Bound::Unbounded, |(_, o, _)| Bound::Included(*o));
            for (ok, o) in c.objs.range((from, Bound::Unbounded)) {
                // The anchor's dkey, when the anchor is in this object.
                let after = at.filter(|(_, ao, _)| ao == ok).map(|(_, _, d)| d);
                let punched = o.punches.iter().any(|t| t.epoch > since);
                if o.dkeys.is_empty() {
                    // Its empty dkey sorts before any other: it is after
                    // the anchor only when the anchor is in another object.
                    if punched && after.is_none() && page.push((*cid, *ok, Vec::new())).is_err() {
                        return (page.keys, false);
                    }
                    continue;
                }
                let from = after.map_or(Bound::Unbounded, |d| Bound::Excluded(d.as_slice()));
                for (dk, d) in o.dkeys.range::<[u8], _>((from, Bound::Unbounded)) {
                    if (punched || dkey_changed(d, since))
                        && page.push((*cid, *ok, dk.to_vec())).is_err()
                    {
                        return (page.keys, false);
                    }
                }
            }
        }
        page.finish()
    }

    /// Reintegration: what one dkey holds above `since`. The object's
    /// punches (only these for an empty `dkey`), then the dkey's, then per
    /// akey (in key order) its punches and the versions still showing at
    /// least one byte at the latest epoch: the visible single value, and
    /// each array extent not wholly covered by newer ones (equal epochs:
    /// the later write covers). Each in ascending epoch order, extents of
    /// equal epoch in write order. More than [`MAX_RECORDS`] is `-E2BIG`.
    pub(crate) fn list_records(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        since: u64,
    ) -> Result<Vec<Record>, Errno> {
        use RecordKind as K;
        let Some(o) = self.cont(pool, cont).and_then(|c| c.objs.get(obj)) else {
            return Ok(vec![]);
        };
        let too_many = || {
            Errno::new(
                -libc::E2BIG,
                format!(
                    "list records: dkey {:?} holds more than {MAX_RECORDS} records above epoch {since}",
                    String::from_utf8_lossy(dkey)
                ),
            )
        };
        let mut out = Vec::new();
        let add = |out: &mut Vec<Record>, r: Record| {
            if out.len() == MAX_RECORDS {
                return Err(too_many());
            }
            out.push(r);
            Ok(())
        };
        for e in tomb_epochs(&o.punches, since) {
            add(&mut out, punch_record(K::PunchObject, e, b""))?;
        }
        let Some(d) = (!dkey.is_empty()).then(|| o.dkeys.get(dkey)).flatten() else {
            return Ok(out);
        };
        for e in tomb_epochs(&d.punches, since) {
            add(&mut out, punch_record(K::PunchDkey, e, b""))?;
        }
        let r = u64::MAX;
        let df = level_floor(&o.punches, r).max(level_floor(&d.punches, r));
        for (ak, a) in &d.akeys {
            if a.newest() <= Some(since) {
                continue;
            }
            for e in tomb_epochs(&a.punches, since) {
                add(&mut out, punch_record(K::PunchAkey, e, ak))?;
            }
            let f = df.max(level_floor(&a.punches, r));
            if let Some(v) = a.visible_single(f, r).filter(|v| v.epoch > since) {
                let rec = Record {
                    kind: K::Value,
                    epoch: v.epoch,
                    akey: ak.to_vec(),
                    value_kind: Kind::Single,
                    offset: 0,
                    len: v.len,
                };
                add(&mut out, rec)?;
            }
            // Newest first: what newer extents (and later writes of the
            // same epoch) cover is not visible.
            let mut cov = Covered::default();
            let mut shown = Vec::new();
            for x in a.visible_extents(f, r).iter().rev() {
                if x.epoch <= since {
                    break;
                }
                let (s, e) = (x.offset, x.offset + x.len);
                if cov.gaps(s, e).is_empty() {
                    continue;
                }
                cov.add(s, e);
                shown.push(x);
            }
            for x in shown.into_iter().rev() {
                let rec = Record {
                    kind: K::Value,
                    epoch: x.epoch,
                    akey: ak.to_vec(),
                    value_kind: Kind::Array,
                    offset: x.offset,
                    len: x.len,
                };
                add(&mut out, rec)?;
            }
        }
        Ok(out)
    }
}
