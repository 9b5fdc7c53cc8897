//! What a POSIX file costs the index in RAM (issue 19, point 7). A counting
//! allocator measures the bytes held after N file-like updates, as the DFS
//! layer makes them: a directory entry (dkey = the name, akey "inode", a
//! ~90-byte single value, all in one directory object) and a file object
//! with one chunk (dkey 8 bytes, akey "d", an array extent). The live bytes
//! of N more files, divided by N, are the cost per file: the fixed costs of
//! the target (buffers, rings, WAL) cancel out.
//!
//! `cargo test -p peregrine-vos --release --test md_footprint -- --nocapture`
//! prints the figures; the test asserts the bounds the index keeps.

mod common;

use common::*;
use peregrine_vos::*;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicIsize, Ordering};
use std::time::Instant;

struct Counting;

static LIVE: AtomicIsize = AtomicIsize::new(0);

// SAFETY: every method forwards to `System` unchanged (it only counts
// bytes), so `System`'s guarantees are this allocator's.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's `l` obligations (non-zero size) are passed on as they are.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from this allocator, i.e. from `System`, with layout `l`.
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        // SAFETY: the caller's `l` obligations (non-zero size) are passed on as they are.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, n: usize) -> *mut u8 {
        LIVE.fetch_add(n as isize - l.size() as isize, Ordering::Relaxed);
        // SAFETY: `p` came from `System` with layout `l`; the caller's
        // obligations on `n` are passed on as they are.
        unsafe { System.realloc(p, l, n) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

/// A 90-byte entry, as `Entry::encode` makes for a regular file.
fn entry(i: u64) -> Vec<u8> {
    let mut v = vec![0u8; 90];
    v[..8].copy_from_slice(&i.to_le_bytes());
    v
}

fn name(i: u64) -> String {
    format!("file.mdtest.0.{i}")
}

/// Files `from..to`: the entry in directory object `dir`, and, when
/// `data` is not empty, the file object's first chunk.
fn create(st: &Storage, dir: &Obj, from: u64, to: u64, data: &[u8]) {
    for i in from..to {
        let e = 10 + 2 * i;
        update(st, dir, e, &name(i), vec![single("inode", &entry(i))]).unwrap();
        if !data.is_empty() {
            let f = Obj::new(dir.pool, dir.cont, 1000 + i, 0);
            update(
                st,
                &f,
                e + 1,
                "\0\0\0\0\0\0\0\0",
                vec![extent("d", 0, data)],
            )
            .unwrap();
        }
    }
}

/// Bytes held per file over files `n..2n` (after `0..n` warmed the target up).
fn per_file(n: u64, data: &[u8]) -> (f64, Env, Storage, Obj) {
    // A sparse 4 GiB device: checkpoint slots of 512 MiB, room for the
    // 45,000 inline 3901-byte values in the SCM budget.
    let mut e = env(4096, 1);
    e.opts.scm_bytes = 256 * MIB;
    let st = Storage::open(&e.opts).unwrap();
    let pool = uuid::Uuid::new_v4();
    st.pool_create(pool, 240 * MIB, 256 * MIB).unwrap();
    let dir = Obj::new(pool, uuid::Uuid::new_v4(), 1, 0);
    create(&st, &dir, 0, n, data);
    let before = live();
    create(&st, &dir, n, 2 * n, data);
    let after = live();
    ((after - before) as f64 / n as f64, e, st, dir)
}

#[test]
fn a_file_costs_the_index_little() {
    let n = 20_000;
    let (dirent, _e, st, _) = per_file(n, b"");
    st.close();
    let data = vec![7u8; 3901];
    let (file, e, st, dir) = per_file(n, &data);
    let meta = file - data.len() as f64;
    println!(
        "index bytes per file: entry only {dirent:.0}; entry + 3901-byte file {file:.0} (metadata {meta:.0} + data 3901)"
    );
    // Restart: from the checkpoint written at close, and after a crash
    // (no closing checkpoint: the WAL since the last one is replayed).
    st.close();
    let t = Instant::now();
    let st = Storage::open(&e.opts).unwrap();
    let clean = t.elapsed();
    assert_eq!(
        get_single(&st, &dir, u64::MAX, &name(2 * n - 1), "inode").unwrap(),
        entry(2 * n - 1)
    );
    create(&st, &dir, 2 * n, 2 * n + 5000, &data);
    st.abandon();
    let t = Instant::now();
    let st = Storage::open(&e.opts).unwrap();
    let crash = t.elapsed();
    println!(
        "reopen with {} files: after close {clean:?}, after a crash {crash:?}",
        2 * n + 5000
    );
    assert_eq!(
        get_single(&st, &dir, u64::MAX, &name(2 * n + 4999), "inode").unwrap(),
        entry(2 * n + 4999)
    );
    st.close();
    assert!(dirent <= 512.0, "a directory entry costs {dirent:.0} bytes");
    assert!(meta <= 1024.0, "a file's metadata costs {meta:.0} bytes");
}
