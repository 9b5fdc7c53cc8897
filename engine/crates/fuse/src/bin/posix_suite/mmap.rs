//! mmap mixed with write/pwrite/ftruncate: a mapping made after writes
//! holds them (data and size), and a MAP_SHARED mapping sees later writes
//! through its descriptor and through one opened while it is mapped, as
//! ext4 does. Under the interception library the writes before the mapping
//! went to the engines behind the kernel (SQLite's -shm file): a stale
//! kernel size makes the mapping fault (SIGBUS, the suite dies), stale
//! pages show as a FAIL line.

use crate::sys::*;
use crate::Suite;

const KIB: usize = 1024;

/// A mapping of `len` bytes of `fd` at 0, unmapped on drop.
struct Map {
    p: *mut u8,
    len: usize,
}

impl Map {
    fn new(fd: c_int, len: usize, prot: c_int, flags: c_int, v64: bool) -> R<Map> {
        // SAFETY: a new mapping at an address the kernel picks, so no existing memory is
        // affected; the result is checked against MAP_FAILED.
        let p = unsafe {
            if v64 {
                libc::mmap64(std::ptr::null_mut(), len, prot, flags, fd, 0)
            } else {
                libc::mmap(std::ptr::null_mut(), len, prot, flags, fd, 0)
            }
        };
        if p == libc::MAP_FAILED {
            return Err(last());
        }
        Ok(Map {
            p: p as *mut u8,
            len,
        })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `p` is our live mapping of `len` bytes (unmapped only on drop);
        // file pages past its end would SIGBUS, not alias Rust memory.
        unsafe { std::slice::from_raw_parts(self.p, self.len) }
    }

    fn put(&mut self, off: usize, b: &[u8]) {
        // SAFETY: `p` is our live mapping of `len` bytes and `&mut self` makes this the
        // only reference into it; the slice index panics if out of range.
        unsafe {
            std::slice::from_raw_parts_mut(self.p, self.len)[off..off + b.len()].copy_from_slice(b)
        }
    }

    fn sync(&self) -> R<()> {
        // SAFETY: `p`/`len` are exactly our live mapping.
        ok(unsafe { libc::msync(self.p as *mut c_void, self.len, libc::MS_SYNC) })
    }
}

impl Drop for Map {
    fn drop(&mut self) {
        // SAFETY: `p`/`len` are exactly the mapping made in `new`; no slice of it outlives `self`.
        unsafe { libc::munmap(self.p as *mut c_void, self.len) };
    }
}

/// `model` padded with zeros (or cut) to `len`: what a mapping of `len`
/// bytes shows.
fn padded(model: &[u8], len: usize) -> Vec<u8> {
    let mut v = model[..model.len().min(len)].to_vec();
    v.resize(len, 0);
    v
}

impl Suite {
    pub(crate) fn mmap(&mut self) {
        self.mmap_after_write();
        self.mmap_after_extending_pwrite();
        self.mmap_then_write();
    }

    /// write() then map (MAP_SHARED and MAP_PRIVATE, mmap and mmap64).
    fn mmap_after_write(&mut self) {
        let p = self.p("mm1");
        let Some(fd) = self.must(
            "mmap after write: open",
            open(&p, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644),
        ) else {
            return;
        };
        let model = pattern(41, 3 * 4096 + 100);
        self.check(
            "mmap after write: write 3 pages + 100",
            write_all(fd, &model),
            Ok(model.len()),
        );
        match Map::new(fd, 4 * 4096, libc::PROT_READ, libc::MAP_SHARED, false) {
            Ok(m) => self.check(
                "mmap after write: MAP_SHARED mapping holds the data, zeros past the end",
                fp(m.bytes()),
                fp(&padded(&model, 4 * 4096)),
            ),
            Err(e) => self.check("mmap after write: mmap", Err(e), Ok(())),
        }
        self.check("mmap after write: close", close(fd), Ok(()));
        // A second file: written through one descriptor that stays open,
        // mapped through another opened before the write.
        let p = self.p("mm2");
        let (Some(w), Some(r)) = (
            self.must(
                "mmap through another descriptor: open for writing",
                open(&p, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644),
            ),
            self.must(
                "mmap through another descriptor: open for reading",
                open(&p, libc::O_RDONLY, 0),
            ),
        ) else {
            return;
        };
        let mut model = pattern(42, 70 * KIB);
        self.check(
            "mmap through another descriptor: write 70 KiB",
            write_all(w, &model),
            Ok(model.len()),
        );
        match Map::new(r, 72 * KIB, libc::PROT_READ, libc::MAP_PRIVATE, true) {
            Ok(m) => self.check(
                "mmap through another descriptor: MAP_PRIVATE mmap64 holds the data",
                fp(m.bytes()),
                fp(&padded(&model, 72 * KIB)),
            ),
            Err(e) => self.check("mmap through another descriptor: mmap64", Err(e), Ok(())),
        }
        match Map::new(r, 72 * KIB, libc::PROT_READ, libc::MAP_SHARED, false) {
            Ok(m) => {
                self.check(
                    "mmap while mapped: pwrite through the writing descriptor",
                    pwrite(w, b"later", 1000),
                    Ok(5),
                );
                put(&mut model, 1000, b"later");
                self.check(
                    "mmap while mapped: the MAP_SHARED mapping shows it",
                    fp(m.bytes()),
                    fp(&padded(&model, 72 * KIB)),
                );
            }
            Err(e) => self.check("mmap while mapped: mmap", Err(e), Ok(())),
        }
        self.check("mmap through another descriptor: close w", close(w), Ok(()));
        self.check("mmap through another descriptor: close r", close(r), Ok(()));
        self.file_is(
            "mmap through another descriptor: after close",
            "mm2",
            &model,
        );
    }

    /// SQLite's -shm: a one-byte pwrite at the end of a 32 KiB region
    /// extends the file, the region is mapped read-write and used.
    fn mmap_after_extending_pwrite(&mut self) {
        let p = self.p("mm3");
        let Some(fd) = self.must(
            "mmap after extending pwrite: open",
            open(&p, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644),
        ) else {
            return;
        };
        let mut model = Vec::new();
        self.check(
            "mmap after extending pwrite: ftruncate to 3",
            // SAFETY: ftruncate takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::ftruncate(fd, 3) }),
            Ok(()),
        );
        model.resize(3, 0);
        self.check(
            "mmap after extending pwrite: pwrite a byte at 32 KiB - 1",
            pwrite(fd, &[0], (32 * KIB - 1) as i64),
            Ok(1),
        );
        put(&mut model, 32 * KIB - 1, &[0]);
        self.check(
            "mmap after extending pwrite: fstat size",
            fsize(fd),
            Ok(32 * KIB as i64),
        );
        match Map::new(
            fd,
            32 * KIB,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            false,
        ) {
            Ok(mut m) => {
                self.check(
                    "mmap after extending pwrite: the region reads zeros",
                    fp(m.bytes()),
                    fp(&model),
                );
                m.put(100, b"wal-index");
                put(&mut model, 100, b"wal-index");
                self.check(
                    "mmap after extending pwrite: pread sees stores into the mapping",
                    pread(fd, 9, 100),
                    Ok(b"wal-index".to_vec()),
                );
                self.check(
                    "mmap after extending pwrite: grow by another region",
                    pwrite(fd, &[0], (64 * KIB - 1) as i64),
                    Ok(1),
                );
                put(&mut model, 64 * KIB - 1, &[0]);
                match Map::new(
                    fd,
                    64 * KIB,
                    libc::PROT_READ | libc::PROT_WRITE,
                    libc::MAP_SHARED,
                    false,
                ) {
                    Ok(m2) => self.check(
                        "mmap after extending pwrite: a mapping of both regions",
                        fp(m2.bytes()),
                        fp(&model),
                    ),
                    Err(e) => self.check("mmap after extending pwrite: mmap 2", Err(e), Ok(())),
                }
                self.check("mmap after extending pwrite: msync", m.sync(), Ok(()));
            }
            Err(e) => self.check("mmap after extending pwrite: mmap", Err(e), Ok(())),
        }
        self.check("mmap after extending pwrite: close", close(fd), Ok(()));
        self.file_is("mmap after extending pwrite: after close", "mm3", &model);
    }

    /// ftruncate, map, then pwrite/write/ftruncate through the mapped
    /// descriptor and through one opened while mapped.
    fn mmap_then_write(&mut self) {
        let p = self.p("mm4");
        let Some(fd) = self.must(
            "mmap then write: open",
            open(&p, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644),
        ) else {
            return;
        };
        let len = 64 * KIB;
        let mut model = vec![0u8; len];
        self.check(
            "mmap then write: ftruncate to 64 KiB",
            // SAFETY: ftruncate takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::ftruncate(fd, len as i64) }),
            Ok(()),
        );
        let mut m = match Map::new(
            fd,
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            false,
        ) {
            Ok(m) => m,
            Err(e) => {
                self.check("mmap then write: mmap", Err(e), Ok(()));
                let _ = close(fd);
                return;
            }
        };
        self.check("mmap then write: zeros", fp(m.bytes()), fp(&model));
        let a = pattern(43, 4096);
        m.put(0, &a);
        put(&mut model, 0, &a);
        self.check(
            "mmap then write: pwrite through the mapped descriptor",
            pwrite(fd, b"hello", 100),
            Ok(5),
        );
        put(&mut model, 100, b"hello");
        self.check(
            "mmap then write: the mapping shows the pwrite",
            fp(m.bytes()),
            fp(&model),
        );
        self.check(
            "mmap then write: read() sees stores into the mapping",
            pread(fd, 4096, 0).map(|b| fp(&b)),
            Ok(fp(&model[..4096])),
        );
        self.check(
            "mmap then write: write() at the offset",
            lseek(fd, 200, libc::SEEK_SET).and_then(|_| write(fd, b"world")),
            Ok(5),
        );
        put(&mut model, 200, b"world");
        self.check(
            "mmap then write: the mapping shows the write",
            fp(m.bytes()),
            fp(&model),
        );
        let Some(fd2) = self.must(
            "mmap then write: open a second descriptor while mapped",
            open(&p, libc::O_RDWR, 0),
        ) else {
            let _ = close(fd);
            return;
        };
        let b = pattern(44, 10_000);
        self.check(
            "mmap then write: pwrite through the second descriptor",
            pwrite(fd2, &b, 30_000),
            Ok(b.len()),
        );
        put(&mut model, 30_000, &b);
        self.check(
            "mmap then write: the mapping shows it",
            fp(m.bytes()),
            fp(&model),
        );
        self.check(
            "mmap then write: ftruncate down to 32 KiB",
            // SAFETY: ftruncate takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::ftruncate(fd2, 32 * KIB as i64) }),
            Ok(()),
        );
        model.truncate(32 * KIB);
        self.check(
            "mmap then write: fstat size after ftruncate",
            fsize(fd),
            Ok(32 * KIB as i64),
        );
        self.check(
            "mmap then write: ftruncate up to 64 KiB",
            // SAFETY: ftruncate takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::ftruncate(fd, len as i64) }),
            Ok(()),
        );
        model.resize(len, 0);
        self.check(
            "mmap then write: the cut part reads zeros in the mapping",
            fp(m.bytes()),
            fp(&model),
        );
        self.check("mmap then write: msync", m.sync(), Ok(()));
        drop(m);
        self.check(
            "mmap then write: pwrite after munmap",
            pwrite(fd2, b"after", len as i64),
            Ok(5),
        );
        put(&mut model, len, b"after");
        self.check(
            "mmap then write: fstat size after munmap",
            fsize(fd),
            Ok(model.len() as i64),
        );
        self.check("mmap then write: close 2", close(fd2), Ok(()));
        self.check("mmap then write: close", close(fd), Ok(()));
        self.file_is("mmap then write: after close", "mm4", &model);
    }
}
