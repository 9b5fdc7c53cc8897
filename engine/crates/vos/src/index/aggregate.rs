//! Aggregation: what no read at a snapshot, or at any epoch from the
//! horizon on, can see is dropped, and its space given back.

use super::*;

impl TargetIndex {
    pub(super) fn aggregate(&mut self, pool: Uuid, upto: u64, rel: &mut Released) {
        if let Some(p) = self.pools.get_mut(&pool) {
            for c in p.conts.values_mut() {
                aggregate_cont(c, rel, upto);
            }
        }
    }
}

/// Drop what no read at a snapshot or at any epoch from `upto` on can see:
/// every version above `upto` stays, and so does what a read at `upto` sees
/// (a version hidden at `upto` is hidden at every later epoch too).
fn aggregate_cont(c: &mut ContTree, rel: &mut Released, upto: u64) {
    let mut reads = c.snapshots.clone();
    reads.push(upto);
    let mut gone = Released::default();
    c.objs.retain(|_, o| {
        let ObjTree {
            dkeys,
            punches: opunch,
        } = o;
        dkeys.retain(|_, d| {
            let DkeyTree {
                akeys,
                punches: dpunch,
            } = d;
            akeys.retain(|_, a| {
                let floors: Vec<Option<u64>> = reads
                    .iter()
                    .map(|&r| {
                        level_floor(opunch, r)
                            .max(level_floor(dpunch, r))
                            .max(level_floor(&a.punches, r))
                    })
                    .collect();
                let mut keep_single: BTreeSet<u64> =
                    a.singles.epochs().filter(|&e| e > upto).collect();
                let mut keep_ext: Vec<bool> = a.extents.iter().map(|x| x.epoch > upto).collect();
                for (&r, &f) in reads.iter().zip(&floors) {
                    if let Some(v) = a.visible_single(f, r) {
                        keep_single.insert(v.epoch);
                    }
                    let lo = a.extents.partition_point(|x| Some(x.epoch) <= f);
                    let hi = a.extents.partition_point(|x| x.epoch <= r).max(lo);
                    let mut cov = Covered::default();
                    for j in (lo..hi).rev() {
                        let x = &a.extents[j];
                        let gaps = cov.gaps(x.offset, x.offset + x.len);
                        if !gaps.is_empty() {
                            keep_ext[j] = true;
                            gaps.into_iter().for_each(|(s, e)| cov.add(s, e));
                        }
                    }
                }
                // Above `upto` everything stays but an extent covered whole by
                // extents of its own epoch applied after it: no read at any
                // epoch or snapshot sees it (of one epoch the later write wins)
                // and no record listing shows it. Reintegration wrote such
                // twins when it copied what a target held already, and with
                // aggregation capped for that copy they stayed until the
                // target was full.
                let mut j = a.extents.len();
                while j > 0 && a.extents[j - 1].epoch > upto {
                    let epoch = a.extents[j - 1].epoch;
                    let mut cov = Covered::default();
                    while j > 0 && a.extents[j - 1].epoch == epoch {
                        j -= 1;
                        let x = &a.extents[j];
                        if cov.gaps(x.offset, x.offset + x.len).is_empty() {
                            keep_ext[j] = false;
                        } else {
                            cov.add(x.offset, x.offset + x.len);
                        }
                    }
                }
                a.singles.retain(|v| {
                    let keep = keep_single.contains(&v.epoch);
                    if !keep {
                        gone.version(v);
                    }
                    keep
                });
                let mut keep_it = keep_ext.into_iter();
                a.extents.retain(|v| {
                    let keep = keep_it.next().unwrap_or(true);
                    if !keep {
                        gone.version(v);
                    }
                    keep
                });
                // A punch with nothing left at or below it hides nothing
                // now; above `upto` it stays all the same, for a version
                // below it may still come (a reintegration's copy, a
                // client's retry, a late commit).
                let min = a.min_epoch();
                a.punches.retain(|t| {
                    let keep = t.epoch > upto || min.is_some_and(|m| m <= t.epoch);
                    if !keep {
                        gone.tomb(t);
                    }
                    keep
                });
                !(a.singles.is_empty() && a.extents.is_empty() && a.punches.is_empty())
            });
            let min = akeys.values().filter_map(|a| a.min_epoch()).min();
            dpunch.retain(|t| {
                let keep = t.epoch > upto || min.is_some_and(|m| m <= t.epoch);
                if !keep {
                    gone.tomb(t);
                }
                keep
            });
            !(akeys.is_empty() && dpunch.is_empty())
        });
        let min = dkeys
            .values()
            .flat_map(|d| d.akeys.values())
            .filter_map(|a| a.min_epoch())
            .min();
        opunch.retain(|t| {
            let keep = t.epoch > upto || min.is_some_and(|m| m <= t.epoch);
            if !keep {
                gone.tomb(t);
            }
            keep
        });
        !(dkeys.is_empty() && opunch.is_empty())
    });
    c.scm_used -= gone.scm;
    c.nvme_used -= gone.nvme;
    rel.scm += gone.scm;
    rel.nvme += gone.nvme;
    rel.runs.extend(gone.runs);
}
