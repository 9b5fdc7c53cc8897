//! Block allocator of a target's data region: a map of free runs
//! (start block -> length), first fit, coalescing on free.
//!
//! It is never persisted: at open it is rebuilt from the index (every block an
//! extent in the index references is in use, all others are free), which is
//! why blocks allocated for an update that never became durable leak nothing.

use std::collections::BTreeMap;

#[derive(Debug, Clone)]
pub(crate) struct BlockAlloc {
    free: BTreeMap<u64, u64>,
    free_blocks: u64,
    total: u64,
}

impl BlockAlloc {
    pub(crate) fn new(total: u64) -> Self {
        let mut free = BTreeMap::new();
        if total > 0 {
            free.insert(0, total);
        }
        BlockAlloc {
            free,
            free_blocks: total,
            total,
        }
    }

    pub(crate) fn free_blocks(&self) -> u64 {
        self.free_blocks
    }

    /// First run of `n` contiguous free blocks.
    pub(crate) fn alloc(&mut self, n: u64) -> Option<u64> {
        if n == 0 {
            return Some(0);
        }
        let (&start, &len) = self.free.iter().find(|(_, &len)| len >= n)?;
        self.free.remove(&start);
        if len > n {
            self.free.insert(start + n, len - n);
        }
        self.free_blocks -= n;
        Some(start)
    }

    /// Return `[start, start + n)`, merging with neighbouring free runs.
    pub(crate) fn free(&mut self, start: u64, n: u64) {
        if n == 0 {
            return;
        }
        debug_assert!(start + n <= self.total);
        let (mut s, mut l) = (start, n);
        if let Some((&ps, &pl)) = self.free.range(..start).next_back() {
            debug_assert!(ps + pl <= start, "double free of block {start}");
            if ps + pl == start {
                self.free.remove(&ps);
                s = ps;
                l += pl;
            }
        }
        if let Some(&nl) = self.free.get(&(start + n)) {
            self.free.remove(&(start + n));
            l += nl;
        }
        self.free.insert(s, l);
        self.free_blocks += n;
    }

    /// Mark `[start, start + n)` in use while rebuilding; false if any block is not free.
    pub(crate) fn reserve(&mut self, start: u64, n: u64) -> bool {
        if n == 0 {
            return true;
        }
        let Some((&fs, &fl)) = self.free.range(..=start).next_back() else {
            return false;
        };
        if fs + fl < start + n {
            return false;
        }
        self.free.remove(&fs);
        if start > fs {
            self.free.insert(fs, start - fs);
        }
        if fs + fl > start + n {
            self.free.insert(start + n, fs + fl - start - n);
        }
        self.free_blocks -= n;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alloc_free_coalesce_reserve() {
        let mut a = BlockAlloc::new(100);
        let x = a.alloc(10).unwrap();
        let y = a.alloc(20).unwrap();
        let z = a.alloc(70).unwrap();
        assert_eq!((x, y, z), (0, 10, 30));
        assert!(a.alloc(1).is_none());
        a.free(y, 20);
        a.free(x, 10);
        assert_eq!(a.free_blocks(), 30);
        assert_eq!(a.alloc(30), Some(0), "freed runs coalesce");
        let mut b = BlockAlloc::new(50);
        assert!(b.reserve(10, 5));
        assert!(!b.reserve(12, 1), "already reserved");
        assert_eq!(b.free_blocks(), 45);
        assert_eq!(b.alloc(10), Some(0));
        assert_eq!(b.alloc(10), Some(15));
    }
}
