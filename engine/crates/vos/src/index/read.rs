//! What a read at an epoch sees (see "Visibility" in [`super`]): the
//! visible versions of an akey, and the plan of a fetch or a size query
//! over them (inline bytes in place, device extents still to read).

use super::*;
use crate::request::{Answer, LastSized};
use std::borrow::Borrow;

/// Newest punch at or below `r`.
pub(super) fn level_floor(p: &[Tomb], r: u64) -> Option<u64> {
    p.iter().map(|t| t.epoch).filter(|&e| e <= r).max()
}

/// Sorted, disjoint half-open intervals already covered by newer extents.
#[derive(Default)]
pub(super) struct Covered(pub(super) Vec<(u64, u64)>);

impl Covered {
    /// Parts of `[s, e)` not yet covered.
    pub(super) fn gaps(&self, s: u64, e: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut cur = s;
        for &(cs, ce) in &self.0 {
            if ce <= cur {
                continue;
            }
            if cs >= e {
                break;
            }
            if cs > cur {
                out.push((cur, cs.min(e)));
            }
            cur = cur.max(ce);
            if cur >= e {
                break;
            }
        }
        if cur < e {
            out.push((cur, e));
        }
        out
    }
    pub(super) fn add(&mut self, s: u64, e: u64) {
        if s >= e {
            return;
        }
        let mut ns = s;
        let mut ne = e;
        self.0.retain(|&(cs, ce)| {
            if ce < ns || cs > ne {
                true
            } else {
                ns = ns.min(cs);
                ne = ne.max(ce);
                false
            }
        });
        let pos = self.0.partition_point(|&(cs, _)| cs < ns);
        self.0.insert(pos, (ns, ne));
    }
}

/// Where fetched bytes come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Src {
    Inline(Vec<u8>),
    Dev {
        ext: DevRun,
        value_len: u64,
        value_off: u64,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Seg {
    pub out_off: u64,
    pub len: u64,
    pub src: Src,
}

/// What a fetch of one iod returns, before the device reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    pub status: i32,
    pub len: u64,
    pub size: u64,
    pub has_crc: bool,
    /// The bytes returned are exactly one value as written, whose client
    /// checksum (verified when it was stored) this is: no need to compute it.
    pub stored_crc: Option<u32>,
    pub segs: Vec<Seg>,
    /// Nothing of the iod's kind is visible at the epoch read (never
    /// written, or punched): an ARRAY's zeros are then not written zeros.
    pub absent: bool,
    /// The newest epoch of the versions the bytes come from, or of the
    /// punch hiding older ones, if later (0: none).
    pub epoch: u64,
}

impl AkeyTree {
    pub(super) fn visible_single(&self, floor: Option<u64>, r: u64) -> Option<&Version> {
        let v = self.singles.at(r)?;
        (Some(v.epoch) > floor).then_some(v)
    }
    /// Extents visible at `r` (oldest first): epochs in `(floor, r]`.
    pub(super) fn visible_extents(&self, floor: Option<u64>, r: u64) -> &[Version] {
        let lo = self.extents.partition_point(|x| Some(x.epoch) <= floor);
        let hi = self.extents.partition_point(|x| x.epoch <= r);
        &self.extents[lo..hi.max(lo)]
    }
    fn array_size(&self, floor: Option<u64>, r: u64) -> u64 {
        self.visible_extents(floor, r)
            .iter()
            .filter(|x| x.len > 0)
            .map(|x| x.offset + x.len)
            .max()
            .unwrap_or(0)
    }
    /// What `QuerySize` answers: the array's size, else the single
    /// value's length, else 0.
    fn value_size(&self, floor: Option<u64>, r: u64) -> u64 {
        match self.array_size(floor, r) {
            0 => self.visible_single(floor, r).map_or(0, |v| v.len),
            arr => arr,
        }
    }
    pub(super) fn exists(&self, floor: Option<u64>, r: u64) -> bool {
        self.visible_single(floor, r).is_some() || !self.visible_extents(floor, r).is_empty()
    }
    /// Newest epoch of any of its versions or punches.
    pub(super) fn newest(&self) -> Option<u64> {
        let s = self.singles.last().map(|v| v.epoch);
        // Extents are sorted by epoch.
        let x = self.extents.last().map(|x| x.epoch);
        s.max(x).max(self.punches.iter().map(|t| t.epoch).max())
    }
    pub(super) fn min_epoch(&self) -> Option<u64> {
        let s = self.singles.first().map(|v| v.epoch);
        let x = self.extents.first().map(|x| x.epoch);
        s.into_iter().chain(x).min()
    }
}

pub(super) fn dkey_exists(d: &DkeyTree, obj_floor: Option<u64>, r: u64) -> bool {
    let df = obj_floor.max(level_floor(&d.punches, r));
    d.akeys
        .values()
        .any(|a| a.exists(df.max(level_floor(&a.punches, r)), r))
}

impl TargetIndex {
    /// The akey at `r` with its effective punch floor.
    fn akey_at(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        akey: &[u8],
        r: u64,
    ) -> Option<(&AkeyTree, Option<u64>)> {
        let o = self.cont(pool, cont)?.objs.get(obj)?;
        let d = o.dkeys.get(dkey)?;
        let a = d.akeys.get(akey)?;
        let floor = level_floor(&o.punches, r)
            .max(level_floor(&d.punches, r))
            .max(level_floor(&a.punches, r));
        Some((a, floor))
    }

    /// What decides whether an akey has a visible value at the latest
    /// epoch: the newest epoch of any of its versions and the newest punch
    /// covering it (object, dkey or akey level). It is visible at the latest
    /// epoch exactly when the first is above the second (a punch hides its
    /// own epoch). Both only grow as changes apply, so the state after
    /// further changes is the maximum of each.
    pub(crate) fn akey_latest(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        akey: &[u8],
    ) -> (Option<u64>, Option<u64>) {
        let Some(o) = self.cont(pool, cont).and_then(|c| c.objs.get(obj)) else {
            return (None, None);
        };
        let r = u64::MAX;
        let of = level_floor(&o.punches, r);
        let Some(d) = o.dkeys.get(dkey) else {
            return (None, of);
        };
        let df = of.max(level_floor(&d.punches, r));
        let Some(a) = d.akeys.get(akey) else {
            return (None, df);
        };
        let newest = a
            .singles
            .last()
            .map(|v| v.epoch)
            .max(a.extents.iter().map(|x| x.epoch).max());
        (newest, df.max(level_floor(&a.punches, r)))
    }

    #[allow(clippy::too_many_arguments)]
    pub(crate) fn plan_fetch(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        akey: &[u8],
        kind: Kind,
        offset: u64,
        len: u64,
        r: u64,
    ) -> Plan {
        let found = self.akey_at(pool, cont, obj, dkey, akey, r);
        match kind {
            Kind::Single => match found.and_then(|(a, f)| a.visible_single(f, r)) {
                None => Plan {
                    status: -libc::ENOENT,
                    len: 0,
                    size: 0,
                    has_crc: false,
                    stored_crc: None,
                    segs: vec![],
                    absent: true,
                    epoch: 0,
                },
                Some(v) => Plan {
                    status: 0,
                    len: v.len,
                    size: v.len,
                    has_crc: v.crc().is_some(),
                    stored_crc: v.crc(),
                    segs: vec![Seg {
                        out_off: 0,
                        len: v.len,
                        src: src_of(v, 0, v.len),
                    }],
                    absent: false,
                    epoch: v.epoch,
                },
            },
            Kind::Array => {
                let mut plan = Plan {
                    status: 0,
                    len,
                    size: 0,
                    has_crc: false,
                    stored_crc: None,
                    segs: vec![],
                    absent: true,
                    epoch: 0,
                };
                let Some((a, f)) = found else { return plan };
                // A punch is a change too (see `newest_extent`).
                plan.epoch = f.unwrap_or(0);
                if len == 0 {
                    // No bytes: the newest change of the whole akey.
                    let newest = a
                        .extents
                        .iter()
                        .filter(|x| x.epoch <= r)
                        .map(|x| x.epoch)
                        .max();
                    plan.epoch = plan.epoch.max(newest.unwrap_or(0));
                }
                plan.absent = a.visible_extents(f, r).is_empty();
                plan.size = a.array_size(f, r);
                let end = offset.saturating_add(len);
                let mut cov = Covered::default();
                let mut all_crc = true;
                let mut exact: Option<Option<u32>> = None;
                for x in a.visible_extents(f, r).iter().rev() {
                    let (s, e) = (x.offset.max(offset), (x.offset + x.len).min(end));
                    if s >= e {
                        continue;
                    }
                    for (gs, ge) in cov.gaps(s, e) {
                        all_crc &= x.crc().is_some();
                        plan.epoch = plan.epoch.max(x.epoch);
                        // The newest piece is the whole request as written (and
                        // then the only piece), or the crc must be computed.
                        if exact.is_none() {
                            exact = Some(
                                (x.offset == offset && x.len == len)
                                    .then_some(x.crc())
                                    .flatten(),
                            );
                        }
                        plan.segs.push(Seg {
                            out_off: gs - offset,
                            len: ge - gs,
                            src: src_of(x, gs - x.offset, ge - gs),
                        });
                        cov.add(gs, ge);
                    }
                }
                plan.has_crc = all_crc && !plan.segs.is_empty();
                plan.stored_crc = exact.flatten();
                plan
            }
        }
    }

    /// Array size (or single value size) of an akey at `r`, and whether
    /// nothing of it is visible there (then the size is 0).
    pub(crate) fn query_size(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        akey: &[u8],
        r: u64,
    ) -> (u64, bool) {
        match self.akey_at(pool, cont, obj, dkey, akey, r) {
            None => (0, true),
            Some((a, f)) => (a.value_size(f, r), !a.exists(f, r)),
        }
    }

    /// The last dkey before `before` (empty: of all) whose `akey` has a
    /// non-zero size at `r`, and that size, scanning at most
    /// `scan_max` dkeys from the end down ([`Answer::Last`]: where
    /// to go on when the bound stopped it). A file's size is the end of its
    /// last chunk holding data: without this its reader listed every chunk
    /// of the file and asked each from the last down.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn last_sized(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        akey: &[u8],
        before: &[u8],
        r: u64,
        scan_max: usize,
    ) -> Answer {
        let none = Answer::Last(LastSized::Nothing);
        let Some(o) = self.cont(pool, cont).and_then(|c| c.objs.get(obj)) else {
            return none;
        };
        let of = level_floor(&o.punches, r);
        let end = match before.is_empty() {
            true => Bound::Unbounded,
            false => Bound::Excluded(before),
        };
        let mut last_seen = None;
        for (i, (k, d)) in o
            .dkeys
            .range::<[u8], _>((Bound::Unbounded, end))
            .rev()
            .enumerate()
        {
            if i == scan_max {
                return Answer::Last(last_seen.map_or(LastSized::Nothing, LastSized::Below));
            }
            let k: &[u8] = k.borrow();
            if let Some(a) = d.akeys.get(akey) {
                let f = of
                    .max(level_floor(&d.punches, r))
                    .max(level_floor(&a.punches, r));
                let size = a.value_size(f, r);
                if size > 0 {
                    return Answer::Last(LastSized::Found {
                        dkey: k.to_vec(),
                        size,
                    });
                }
            }
            last_seen = Some(k.to_vec());
        }
        none
    }

    /// The newest change of bytes `[start, end)` of an array akey: the
    /// newest epoch of its extents overlapping them, visible or not, or of
    /// a punch covering it, if later. At the latest epoch this is what a
    /// fetch of the range reports as its epoch ([`Plan::epoch`]): the newest
    /// overlapping extent is visible there unless a later punch hides it.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn newest_extent(
        &self,
        pool: &Uuid,
        cont: &Uuid,
        obj: &ObjKey,
        dkey: &[u8],
        akey: &[u8],
        start: u64,
        end: u64,
    ) -> Option<u64> {
        let (a, floor) =
            self.akey_at(pool, cont, obj, dkey, akey, peregrine_proto::EPOCH_LATEST)?;
        a.extents
            .iter()
            .filter(|x| x.offset < end && start < x.offset + x.len)
            .map(|x| x.epoch)
            .max()
            .max(floor)
    }
}

fn src_of(v: &Version, value_off: u64, len: u64) -> Src {
    match &v.payload {
        Payload::Inline(b) => {
            Src::Inline(b[value_off as usize..(value_off + len) as usize].to_vec())
        }
        Payload::Device(ext) => Src::Dev {
            ext: ext.clone(),
            value_len: v.len,
            value_off,
        },
    }
}
