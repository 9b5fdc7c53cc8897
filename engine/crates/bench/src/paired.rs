//! The small-value test on two containers in alternating blocks
//! (`--tests small-paired`, `--pair-pool`, `--pair-cont`): what
//! `bench/access-paired.sh` uses to compare two engines of one system
//! that differ in one setting (access checks on one, off on the other).
//!
//! Runs of their own on this 2-vCPU VM move by 10-30% from one to the next
//! (fresh engines, other placements, the host's load), far more than the
//! few percent such a setting may cost. Here both engines run throughout,
//! and the same threads switch between the two containers every block of
//! a few tens of milliseconds, in the order A B B A A B ...: a change of the
//! machine's speed lasting longer than a block weighs on both sides alike.

use crate::report::SmallPaired;
use crate::tests::{cerr, on_threads, small_value as value};
use anyhow::{bail, Context, Result};
use peregrine::{Container, Object, ObjectClass, ObjectId};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// Seconds each side took, block by block, for `op(side, thread, key)`
/// over `per_block` keys per thread and block.
fn alternate(
    blocks: u64,
    per_block: u64,
    threads: usize,
    op: impl Fn(usize, usize, u64) -> Result<()> + Sync,
) -> Result<[Vec<f64>; 2]> {
    let stop = AtomicBool::new(false);
    let mut secs = [Vec::new(), Vec::new()];
    for blk in 0..blocks {
        // A B, B A, A B, ...: each side goes first as often as the other.
        let order = if blk % 2 == 0 { [0, 1] } else { [1, 0] };
        for side in order {
            let start = Instant::now();
            on_threads(threads, &stop, |t| {
                for i in blk * per_block..(blk + 1) * per_block {
                    op(side, t, i)?;
                }
                Ok(())
            })?;
            secs[side].push(start.elapsed().as_secs_f64());
        }
    }
    Ok(secs)
}

#[allow(clippy::too_many_arguments)]
pub fn small_paired(
    conts: [&Container; 2],
    class: ObjectClass,
    run_id: u32,
    threads: usize,
    ops: u64,
    size: usize,
    blocks: u64,
) -> Result<SmallPaired> {
    let blocks = blocks.max(1);
    let per_block = (ops / threads as u64 / blocks).max(1);
    let objects: Vec<Vec<Object>> = conts
        .iter()
        .map(|c| {
            (0..threads)
                .map(|t| {
                    c.object(ObjectId::new(
                        class,
                        u64::from(run_id),
                        2_000_000 + t as u64,
                    ))
                    .map_err(cerr)
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<_>>()?;

    let updates = alternate(blocks, per_block, threads, |side, t, i| {
        objects[side][t]
            .update_single(format!("k{i}").as_bytes(), b"v", &value(t, i, size))
            .map_err(cerr)
            .context("small update")
    })?;
    let fetches = alternate(blocks, per_block, threads, |side, t, i| {
        let v = objects[side][t]
            .fetch_single(format!("k{i}").as_bytes(), b"v")
            .map_err(cerr)
            .context("small fetch")?;
        if v.as_deref() != Some(&value(t, i, size)[..]) {
            bail!(
                "small fetch: side {side} object {t} key k{i}: value differs from what was written"
            );
        }
        Ok(())
    })?;
    for o in objects.iter().flatten() {
        o.punch()
            .map_err(cerr)
            .context("removing the small values")?;
    }
    let per_side = per_block * threads as u64 * blocks;
    let rate = |s: &[f64]| per_side as f64 / s.iter().sum::<f64>().max(1e-9);
    // Side A's rate over side B's, block by block (the same ops on each).
    let ratios = |s: &[Vec<f64>; 2]| {
        s[1].iter()
            .zip(&s[0])
            .map(|(b, a)| b / a.max(1e-12))
            .collect()
    };
    Ok(SmallPaired {
        value_bytes: size,
        threads,
        blocks,
        ops_per_side: per_side,
        update_ops: [rate(&updates[0]), rate(&updates[1])],
        fetch_ops: [rate(&fetches[0]), rate(&fetches[1])],
        update_ratio_per_block: ratios(&updates),
        fetch_ratio_per_block: ratios(&fetches),
    })
}
