//! A target's pool of 2 MiB I/O buffers: hugepages when asked for and
//! available, else page-aligned memory locked with `mlock`. The buffers are
//! registered with the target's io_uring ring, so device I/O uses
//! ReadFixed/WriteFixed and the kernel does not pin pages per request.

use std::ptr;

/// Size of one buffer: one 2 MiB hugepage.
pub(crate) const BUF_BYTES: usize = 2 << 20;
const MAP_HUGE_2MB: i32 = 21 << libc::MAP_HUGE_SHIFT;

pub(crate) struct BufPool {
    base: *mut u8,
    count: usize,
}

// SAFETY: the pool is owned by exactly one target thread; the raw pointer is only
// dereferenced by that thread (or the kernel on its behalf).
unsafe impl Send for BufPool {}

impl BufPool {
    pub(crate) fn new(count: usize, hugepages: bool, target: u32) -> std::io::Result<BufPool> {
        let bytes = count * BUF_BYTES;
        let mut base = libc::MAP_FAILED;
        if hugepages {
            // SAFETY: an anonymous private mapping at an address the kernel picks; no
            // existing memory is touched. The result is checked against MAP_FAILED.
            base = unsafe {
                libc::mmap(
                    ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_HUGETLB | MAP_HUGE_2MB,
                    -1,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                tracing::warn!(
                    target,
                    bytes,
                    error = %std::io::Error::last_os_error(),
                    "hugepages requested but not available (see /proc/meminfo HugePages_Free); using locked ordinary pages"
                );
            }
        }
        let huge = base != libc::MAP_FAILED;
        if !huge {
            // SAFETY: an anonymous private mapping at an address the kernel picks; no
            // existing memory is touched. The result is checked against MAP_FAILED.
            base = unsafe {
                libc::mmap(
                    ptr::null_mut(),
                    bytes,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                    -1,
                    0,
                )
            };
            if base == libc::MAP_FAILED {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: `base` is our fresh mapping of `bytes` bytes (not MAP_FAILED).
            if unsafe { libc::mlock(base, bytes) } != 0 {
                tracing::warn!(target, bytes, error = %std::io::Error::last_os_error(), "mlock of I/O buffers failed; continuing unlocked");
            }
        }
        // Pre-fault every page now rather than on the first I/O.
        let base = base as *mut u8;
        for off in (0..bytes).step_by(4096) {
            // SAFETY: `off < bytes`: inside our fresh, writable mapping.
            unsafe { base.add(off).write_volatile(0) };
        }
        Ok(BufPool { base, count })
    }

    pub(crate) fn count(&self) -> usize {
        self.count
    }

    pub(crate) fn ptr(&self, i: usize) -> *mut u8 {
        assert!(i < self.count);
        // SAFETY: `i < count` (asserted): the offset is inside the mapping of
        // `count * BUF_BYTES` bytes.
        unsafe { self.base.add(i * BUF_BYTES) }
    }

    pub(crate) fn slice_mut(&mut self, i: usize) -> &mut [u8] {
        // SAFETY: buffer `i` is BUF_BYTES of our live mapping (`ptr` checks `i`);
        // `&mut self` makes this the only reference to it.
        unsafe { std::slice::from_raw_parts_mut(self.ptr(i), BUF_BYTES) }
    }

    pub(crate) fn slice(&self, i: usize) -> &[u8] {
        // SAFETY: buffer `i` is BUF_BYTES of our live mapping (`ptr` checks `i`);
        // no `&mut` to it can exist while `self` is borrowed.
        unsafe { std::slice::from_raw_parts(self.ptr(i), BUF_BYTES) }
    }

    pub(crate) fn iovecs(&self) -> Vec<libc::iovec> {
        (0..self.count)
            .map(|i| libc::iovec {
                iov_base: self.ptr(i) as *mut libc::c_void,
                iov_len: BUF_BYTES,
            })
            .collect()
    }
}

impl Drop for BufPool {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, with its length; nothing uses it after drop.
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.count * BUF_BYTES) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn falls_back_when_hugepages_are_missing() {
        // Works with or without hugepages configured on the machine.
        let mut p = BufPool::new(2, true, 0).unwrap();
        assert_eq!(p.ptr(1) as usize - p.ptr(0) as usize, BUF_BYTES);
        assert_eq!(p.ptr(0) as usize % 4096, 0, "page aligned for O_DIRECT");
        p.slice_mut(1)[BUF_BYTES - 1] = 7;
        assert_eq!(p.slice(1)[BUF_BYTES - 1], 7);
        assert_eq!(p.iovecs().len(), 2);
    }
}
