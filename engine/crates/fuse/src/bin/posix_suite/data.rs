//! Data calls: read/write and their vector, positioned and 64-bit forms, seeks, truncation, O_APPEND, descriptor duplication, access modes, stdio, open flags, files unlinked while open.

use crate::sys::*;
use crate::{Suite, MIB};

impl Suite {
    pub(crate) fn data_calls(&mut self) {
        let p = self.p("data");
        let Some(fd) = self.must(
            "data: open O_CREAT|O_EXCL|O_RDWR",
            open(&p, libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o644),
        ) else {
            return;
        };
        let a = pattern(1, 3 * MIB + 17);
        let mut model = Vec::new();
        // Two writes, the first ending just short of a chunk boundary.
        self.check(
            "data: write 1 MiB - 5",
            write_all(fd, &a[..MIB - 5]),
            Ok(MIB - 5),
        );
        self.check(
            "data: write the rest",
            write_all(fd, &a[MIB - 5..]),
            Ok(a.len() - (MIB - 5)),
        );
        put(&mut model, 0, &a);
        self.check(
            "data: offset after writes",
            lseek(fd, 0, libc::SEEK_CUR),
            Ok(a.len() as i64),
        );
        self.check("data: fstat size", fsize(fd), Ok(a.len() as i64));
        self.check("data: rewind", lseek(fd, 0, libc::SEEK_SET), Ok(0));
        self.check(
            "data: read back in odd pieces",
            read_full(fd, a.len(), 256 * 1024 + 3).map(|b| fp(&b)),
            Ok(fp(&a)),
        );
        self.check(
            "data: read at end of file",
            read(fd, 10).map(|b| b.len()),
            Ok(0),
        );
        self.check(
            "data: pread across a chunk boundary",
            pread(fd, 20, (MIB - 10) as i64).map(|b| fp(&b)),
            Ok(fp(&a[MIB - 10..MIB + 10])),
        );
        self.check(
            "data: pread64 across a chunk boundary",
            pread64(fd, 4096, (2 * MIB - 3) as i64).map(|b| fp(&b)),
            Ok(fp(&a[2 * MIB - 3..2 * MIB - 3 + 4096])),
        );
        self.check(
            "data: pread short at end of file",
            pread(fd, 100, (a.len() - 7) as i64).map(|b| fp(&b)),
            Ok(fp(&a[a.len() - 7..])),
        );
        self.check(
            "data: pread past end of file",
            pread(fd, 100, (a.len() + 1000) as i64).map(|b| b.len()),
            Ok(0),
        );
        self.check(
            "data: pread at a negative offset",
            pread(fd, 10, -1).map(|b| b.len()),
            Err(E(libc::EINVAL)),
        );
        self.check(
            "data: pwrite past the end",
            pwrite(fd, b"tail", 5 * MIB as i64),
            Ok(4),
        );
        put(&mut model, 5 * MIB, b"tail");
        self.check(
            "data: offset unchanged by pread/pwrite",
            lseek(fd, 0, libc::SEEK_CUR),
            Ok(a.len() as i64),
        );
        self.check(
            "data: fstat size after pwrite",
            fsize(fd),
            Ok(model.len() as i64),
        );
        self.check(
            "data: the hole reads as zeros",
            pread(fd, 1000, (4 * MIB) as i64).map(|b| b.iter().all(|&x| x == 0) && b.len() == 1000),
            Ok(true),
        );
        self.check("data: pwrite64 at 0", pwrite64(fd, b"HEAD", 0), Ok(4));
        put(&mut model, 0, b"HEAD");
        self.check(
            "data: pread64 of it",
            pread64(fd, 8, 0).map(|b| fp(&b)),
            Ok(fp(&model[..8])),
        );
        // SAFETY: fsync takes only integers (a bad descriptor is an error, not UB).
        self.check("data: fsync", ok(unsafe { libc::fsync(fd) }), Ok(()));
        self.check(
            "data: fdatasync",
            // SAFETY: fdatasync takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::fdatasync(fd) }),
            Ok(()),
        );
        // A second descriptor sees the data at once (before close).
        if let Some(fd2) = self.must("data: second open", open(&p, libc::O_RDONLY, 0)) {
            self.check(
                "data: read through a second descriptor before close",
                read_full(fd2, usize::MAX, MIB).map(|b| fp(&b)),
                Ok(fp(&model)),
            );
            self.check("data: close second", close(fd2), Ok(()));
        }
        self.check(
            "data: stat by path after fsync",
            size(&p),
            Ok(model.len() as i64),
        );
        self.check("data: close", close(fd), Ok(()));
        self.file_is("data: after close", "data", &model);
        self.check(
            "data: fstat type and mode",
            stat(&p).map(|s| (s.st_mode & libc::S_IFMT, s.st_mode & 0o7777)),
            Ok((libc::S_IFREG, 0o644)),
        );
        self.check(
            "data: owner is the caller",
            stat(&p).map(|s| (s.st_uid, s.st_gid)),
            // SAFETY: geteuid/getegid take no arguments and cannot fail.
            Ok(unsafe { (libc::geteuid(), libc::getegid()) }),
        );
    }

    pub(crate) fn vectored(&mut self) {
        let p = self.p("vec");
        let Some(fd) = self.must(
            "vec: open",
            open(&p, libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC, 0o644),
        ) else {
            return;
        };
        let mid = pattern(2, 70000);
        let mut model = Vec::new();
        self.check(
            "vec: writev three buffers",
            writev(fd, &[b"alpha-", &mid, b"-omega"]),
            Ok(6 + mid.len() + 6),
        );
        put(&mut model, 0, b"alpha-");
        put(&mut model, 6, &mid);
        put(&mut model, 6 + mid.len(), b"-omega");
        self.check("vec: rewind", lseek(fd, 0, libc::SEEK_SET), Ok(0));
        self.check(
            "vec: readv into three buffers",
            readv(fd, &[3, 100000, 10]).map(|v| fp(&v.concat())),
            Ok(fp(&model)),
        );
        self.check(
            "vec: readv at end of file",
            readv(fd, &[10, 10]).map(|v| v.concat().len()),
            Ok(0),
        );
        self.check(
            "vec: pwritev",
            pwritev_(fd, &[b"XX", b"YY"], 2, false),
            Ok(4),
        );
        put(&mut model, 2, b"XXYY");
        self.check(
            "vec: preadv",
            preadv_(fd, &[3, 3], 0, false).map(|v| v.concat()),
            Ok(model[..6].to_vec()),
        );
        self.check(
            "vec: pwritev64 across a chunk boundary",
            pwritev_(fd, &[b"ab", b"cd"], (MIB - 2) as i64, true),
            Ok(4),
        );
        put(&mut model, MIB - 2, b"abcd");
        self.check(
            "vec: preadv64 across it",
            preadv_(fd, &[1, 5], (MIB - 3) as i64, true).map(|v| v.concat()),
            Ok(model[MIB - 3..MIB + 2].to_vec()),
        );
        // preadv2/pwritev2 with offset -1: at and moving the file offset.
        self.check("vec: seek to 10", lseek(fd, 10, libc::SEEK_SET), Ok(10));
        let iov = iov_of(&[b"v2"]);
        self.check(
            "vec: pwritev2 at the file offset",
            // SAFETY: `iov` holds one iovec over the static b"v2", alive for the call.
            okn(unsafe { libc::pwritev2(fd, iov.as_ptr(), 1, -1, 0) }),
            Ok(2),
        );
        put(&mut model, 10, b"v2");
        self.check("vec: offset moved", lseek(fd, 0, libc::SEEK_CUR), Ok(12));
        let mut b = [0u8; 4];
        let iov = [libc::iovec {
            iov_base: b.as_mut_ptr() as *mut c_void,
            iov_len: 4,
        }];
        self.check(
            "vec: preadv2 at an offset",
            // SAFETY: `iov` holds one iovec over the live local `b` (4 bytes, writable).
            okn(unsafe { libc::preadv2(fd, iov.as_ptr(), 1, 9, 0) }),
            Ok(4),
        );
        self.check("vec: preadv2 data", b.to_vec(), model[9..13].to_vec());
        self.check("vec: close", close(fd), Ok(()));
        self.file_is("vec: after close", "vec", &model);
    }

    pub(crate) fn seeks(&mut self) {
        let p = self.p("seek");
        let data = pattern(3, 300_000);
        if self.must("seek: create", write_file(&p, &data)).is_none() {
            return;
        }
        let Some(fd) = self.must("seek: open", open(&p, libc::O_RDONLY, 0)) else {
            return;
        };
        let n = data.len() as i64;
        self.check("seek: SEEK_END", lseek(fd, 0, libc::SEEK_END), Ok(n));
        self.check(
            "seek: SEEK_END -4",
            lseek(fd, -4, libc::SEEK_END),
            Ok(n - 4),
        );
        self.check(
            "seek: read the last 4",
            read(fd, 100).map(|b| fp(&b)),
            Ok(fp(&data[data.len() - 4..])),
        );
        self.check(
            "seek: SEEK_CUR -2",
            lseek(fd, -2, libc::SEEK_CUR),
            Ok(n - 2),
        );
        self.check(
            "seek: negative SEEK_SET",
            lseek(fd, -1, libc::SEEK_SET),
            Err(E(libc::EINVAL)),
        );
        self.check(
            "seek: SEEK_CUR before 0",
            lseek(fd, -(n + 1), libc::SEEK_CUR),
            Err(E(libc::EINVAL)),
        );
        self.check("seek: bad whence", lseek(fd, 0, 42), Err(E(libc::EINVAL)));
        self.check("seek: SEEK_DATA 0", lseek(fd, 0, libc::SEEK_DATA), Ok(0));
        self.check("seek: SEEK_HOLE 0", lseek(fd, 0, libc::SEEK_HOLE), Ok(n));
        self.check(
            "seek: SEEK_DATA at the end",
            lseek(fd, n, libc::SEEK_DATA),
            Err(E(libc::ENXIO)),
        );
        self.check(
            "seek: lseek64 past the end",
            lseek64(fd, 10 * MIB as i64, libc::SEEK_SET),
            Ok(10 * MIB as i64),
        );
        self.check(
            "seek: read past the end",
            read(fd, 10).map(|b| b.len()),
            Ok(0),
        );
        self.check(
            "seek: lseek64 SEEK_SET 1000",
            lseek64(fd, 1000, libc::SEEK_SET),
            Ok(1000),
        );
        self.check(
            "seek: read at 1000",
            read(fd, 16).map(|b| fp(&b)),
            Ok(fp(&data[1000..1016])),
        );
        self.check("seek: close", close(fd), Ok(()));
    }

    pub(crate) fn ftruncate(&mut self) {
        let p = self.p("trunc");
        let Some(fd) = self.must(
            "ftruncate: open",
            open(&p, libc::O_CREAT | libc::O_RDWR, 0o644),
        ) else {
            return;
        };
        let mut model = pattern(4, 2 * MIB + 100);
        self.check(
            "ftruncate: write 2 MiB + 100",
            write_all(fd, &model),
            Ok(model.len()),
        );
        self.check(
            "ftruncate: shrink to 1000",
            // SAFETY: ftruncate takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::ftruncate(fd, 1000) }),
            Ok(()),
        );
        model.truncate(1000);
        self.check("ftruncate: fstat size", fsize(fd), Ok(1000));
        self.check(
            "ftruncate: data kept",
            pread(fd, 5000, 0).map(|b| fp(&b)),
            Ok(fp(&model)),
        );
        self.check(
            "ftruncate: extend to 3 MiB",
            // SAFETY: ftruncate takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::ftruncate(fd, 3 * MIB as i64) }),
            Ok(()),
        );
        model.resize(3 * MIB, 0);
        self.check("ftruncate: size 3 MiB", fsize(fd), Ok(3 * MIB as i64));
        self.check(
            "ftruncate: old data past the cut is gone",
            pread(fd, 4096, (2 * MIB) as i64).map(|b| b.iter().all(|&x| x == 0)),
            Ok(true),
        );
        self.check(
            "ftruncate64 to 1 MiB + 1",
            // SAFETY: ftruncate64 takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::ftruncate64(fd, MIB as i64 + 1) }),
            Ok(()),
        );
        model.truncate(MIB + 1);
        self.check(
            "ftruncate: negative length",
            // SAFETY: ftruncate takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::ftruncate(fd, -1) }),
            Err(E(libc::EINVAL)),
        );
        self.check("ftruncate: close", close(fd), Ok(()));
        self.file_is("ftruncate: after close", "trunc", &model);
        if let Some(rd) = self.must("ftruncate: open read-only", open(&p, libc::O_RDONLY, 0)) {
            self.check(
                "ftruncate on a read-only descriptor",
                // SAFETY: ftruncate takes only integers (a bad descriptor is an error, not UB).
                ok(unsafe { libc::ftruncate(rd, 0) }),
                Err(E(libc::EINVAL)),
            );
            let _ = close(rd);
        }
        self.check("ftruncate: size unchanged", size(&p), Ok(MIB as i64 + 1));
    }

    pub(crate) fn append(&mut self) {
        let p = self.p("app");
        let Some(fd) = self.must(
            "append: open O_APPEND",
            open(&p, libc::O_CREAT | libc::O_WRONLY | libc::O_APPEND, 0o644),
        ) else {
            return;
        };
        let mut model = Vec::new();
        self.check("append: write one", write(fd, b"one\n"), Ok(4));
        model.extend_from_slice(b"one\n");
        self.check("append: seek to 0", lseek(fd, 0, libc::SEEK_SET), Ok(0));
        self.check("append: write two", write(fd, b"two\n"), Ok(4));
        model.extend_from_slice(b"two\n");
        self.check(
            "append: offset at the end",
            lseek(fd, 0, libc::SEEK_CUR),
            Ok(8),
        );
        // Linux: pwrite on an O_APPEND descriptor appends.
        self.check(
            "append: pwrite at 0 appends",
            pwrite(fd, b"three\n", 0),
            Ok(6),
        );
        model.extend_from_slice(b"three\n");
        self.check("append: close", close(fd), Ok(()));
        self.file_is("append: after close", "app", &model);
        // O_APPEND switched on and off with fcntl(F_SETFL).
        let Some(fd) = self.must("append: open O_RDWR", open(&p, libc::O_RDWR, 0)) else {
            return;
        };
        self.check(
            "append: F_SETFL O_APPEND",
            fcntl(fd, libc::F_SETFL, libc::O_APPEND).map(|_| ()),
            Ok(()),
        );
        self.check(
            "append: F_GETFL shows it",
            fcntl(fd, libc::F_GETFL, 0).map(|f| f & libc::O_APPEND != 0),
            Ok(true),
        );
        self.check("append: write four", write(fd, b"four\n"), Ok(5));
        model.extend_from_slice(b"four\n");
        self.check(
            "append: F_SETFL 0",
            fcntl(fd, libc::F_SETFL, 0).map(|_| ()),
            Ok(()),
        );
        self.check("append: seek 0", lseek(fd, 0, libc::SEEK_SET), Ok(0));
        self.check("append: overwrite at 0", write(fd, b"O"), Ok(1));
        model[0] = b'O';
        self.check("append: close 2", close(fd), Ok(()));
        self.file_is("append: after F_SETFL", "app", &model);
    }

    pub(crate) fn dups(&mut self) {
        let p = self.p("dup");
        let po = self.p("dup-other");
        let Some(fd) = self.must(
            "dup: open",
            open(&p, libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC, 0o644),
        ) else {
            return;
        };
        let Some(other) = self.must(
            "dup: open other",
            open(&po, libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC, 0o644),
        ) else {
            return;
        };
        self.check("dup: write other", write(other, b"other-data"), Ok(10));
        self.check("dup: write aaa", write(fd, b"aaa"), Ok(3));
        // SAFETY: dup takes only integers (a bad descriptor is an error, not UB).
        let d1 = unsafe { libc::dup(fd) };
        self.truth("dup: dup", d1 >= 0, last());
        self.check("dup: write bbb through the dup", write(d1, b"bbb"), Ok(3));
        self.check(
            "dup: the offset is shared",
            lseek(fd, 0, libc::SEEK_CUR),
            Ok(6),
        );
        let d2 = fcntl(fd, libc::F_DUPFD, 100);
        self.check("dup: F_DUPFD >= 100", d2.map(|d| d >= 100), Ok(true));
        let d2 = d2.unwrap_or(-1);
        self.check("dup: write ccc through F_DUPFD", write(d2, b"ccc"), Ok(3));
        let d3 = fcntl(fd, libc::F_DUPFD_CLOEXEC, 0).unwrap_or(-1);
        self.check(
            "dup: F_DUPFD_CLOEXEC sets FD_CLOEXEC",
            fcntl(d3, libc::F_GETFD, 0),
            Ok(libc::FD_CLOEXEC),
        );
        self.check(
            "dup: dup2 over another open file",
            // SAFETY: dup2 takes only integers (a bad descriptor is an error, not UB).
            okv(unsafe { libc::dup2(fd, other) }).map(|r| r == other),
            Ok(true),
        );
        self.check("dup: write ddd through it", write(other, b"ddd"), Ok(3));
        self.check("dup: close the original", close(fd), Ok(()));
        self.check("dup: write eee through the dup", write(d1, b"eee"), Ok(3));
        self.check(
            "dup: dup3 O_CLOEXEC",
            // SAFETY: dup3 takes only integers (a bad descriptor is an error, not UB).
            okv(unsafe { libc::dup3(d1, d2, libc::O_CLOEXEC) }).map(|r| r == d2),
            Ok(true),
        );
        self.check(
            "dup: dup3 sets FD_CLOEXEC",
            fcntl(d2, libc::F_GETFD, 0),
            Ok(libc::FD_CLOEXEC),
        );
        self.check("dup: write fff through dup3", write(d2, b"fff"), Ok(3));
        self.check(
            "dup: dup3 onto itself",
            // SAFETY: dup3 takes only integers (a bad descriptor is an error, not UB).
            okv(unsafe { libc::dup3(d1, d1, 0) }).map(|_| ()),
            Err(E(libc::EINVAL)),
        );
        self.check(
            "dup: dup2 onto itself",
            // SAFETY: dup2 takes only integers (a bad descriptor is an error, not UB).
            okv(unsafe { libc::dup2(d1, d1) }).map(|r| r == d1),
            Ok(true),
        );
        self.check(
            "dup: dup of a closed descriptor",
            // SAFETY: dup takes only integers (a bad descriptor is an error, not UB).
            okv(unsafe { libc::dup(fd) }).map(|_| ()),
            Err(E(libc::EBADF)),
        );
        self.check("dup: seek one", lseek(d1, 0, libc::SEEK_SET), Ok(0));
        self.check(
            "dup: read another",
            read(d3, 100),
            Ok(b"aaabbbcccdddeeefff".to_vec()),
        );
        for (n, d) in [("d1", d1), ("d2", d2), ("d3", d3), ("other", other)] {
            self.check(&format!("dup: close {n}"), close(d), Ok(()));
        }
        self.file_is("dup: file", "dup", b"aaabbbcccdddeeefff");
        self.file_is("dup: the file dup2 closed", "dup-other", b"other-data");
    }

    pub(crate) fn access_modes(&mut self) {
        let p = self.p("data");
        if let Some(rd) = self.must("modes: open O_RDONLY", open(&p, libc::O_RDONLY, 0)) {
            self.check(
                "modes: write on O_RDONLY",
                write(rd, b"x"),
                Err(E(libc::EBADF)),
            );
            self.check(
                "modes: pwrite on O_RDONLY",
                pwrite(rd, b"x", 0),
                Err(E(libc::EBADF)),
            );
            self.check(
                "modes: fallocate on O_RDONLY",
                // SAFETY: fallocate takes only integers (a bad descriptor is an error, not UB).
                ok(unsafe { libc::fallocate(rd, 0, 0, 10) }),
                Err(E(libc::EBADF)),
            );
            let _ = close(rd);
        }
        if let Some(wr) = self.must("modes: open O_WRONLY", open(&p, libc::O_WRONLY, 0)) {
            self.check(
                "modes: read on O_WRONLY",
                read(wr, 1).map(|b| b.len()),
                Err(E(libc::EBADF)),
            );
            self.check(
                "modes: pread on O_WRONLY",
                pread(wr, 1, 0).map(|b| b.len()),
                Err(E(libc::EBADF)),
            );
            let _ = close(wr);
        }
        self.check(
            "modes: read on a closed descriptor",
            read(9999, 1).map(|b| b.len()),
            Err(E(libc::EBADF)),
        );
    }

    pub(crate) fn stdio(&mut self) {
        let p = self.p("stdio.txt");
        let big = pattern(5, 100_000);
        let mut model = Vec::new();
        // SAFETY: `p` and the mode are NUL-terminated C strings; `f` is used only between
        // a successful fopen and its fclose; each fwrite/fputs reads a live slice
        // or static literal of the length passed.
        unsafe {
            let f = libc::fopen(p.as_ptr(), c"w".as_ptr());
            if f.is_null() {
                self.must::<()>("stdio: fopen w", Err(last()));
                return;
            }
            let mut ok_all = true;
            for part in big.chunks(4096 + 7) {
                ok_all &=
                    libc::fwrite(part.as_ptr() as *const c_void, 1, part.len(), f) == part.len();
            }
            model.extend_from_slice(&big);
            self.truth("stdio: fwrite in pieces", ok_all, "short fwrite");
            self.check(
                "stdio: fputs between fwrites",
                libc::fputs(c"-line\n".as_ptr(), f) >= 0,
                true,
            );
            model.extend_from_slice(b"-line\n");
            self.check(
                "stdio: fwrite end",
                libc::fwrite(b"end".as_ptr() as *const c_void, 1, 3, f),
                3,
            );
            model.extend_from_slice(b"end");
            self.check(
                "stdio: ftell after writes",
                libc::ftell(f),
                model.len() as i64,
            );
            self.check("stdio: fclose w", libc::fclose(f), 0);
        }
        self.file_is("stdio: written", "stdio.txt", &model);
        // SAFETY: `p` and the modes are NUL-terminated C strings; each `f` is
        // used only between a successful fopen and its fclose; every fread
        // writes at most the length of the live local `b` it is given, every
        // fwrite reads a static literal of the length passed.
        unsafe {
            let f = libc::fopen(p.as_ptr(), c"r".as_ptr());
            if f.is_null() {
                self.must::<()>("stdio: fopen r", Err(last()));
                return;
            }
            let mut b = vec![0u8; 50];
            self.check(
                "stdio: fread 50",
                libc::fread(b.as_mut_ptr() as *mut c_void, 1, 50, f),
                50,
            );
            self.check("stdio: fread data", fp(&b), fp(&model[..50]));
            self.check("stdio: ftell", libc::ftell(f), 50);
            self.check("stdio: fseek 1000", libc::fseek(f, 1000, libc::SEEK_SET), 0);
            let mut b = vec![0u8; 10];
            self.check(
                "stdio: fread 10 records of 1",
                libc::fread(b.as_mut_ptr() as *mut c_void, 1, 10, f),
                10,
            );
            self.check("stdio: fread after fseek", fp(&b), fp(&model[1000..1010]));
            self.check(
                "stdio: fseek SEEK_END -3",
                libc::fseek(f, -3, libc::SEEK_END),
                0,
            );
            let mut b = vec![0u8; 10];
            self.check(
                "stdio: short fread at the end",
                libc::fread(b.as_mut_ptr() as *mut c_void, 1, 10, f),
                3,
            );
            self.check("stdio: the last bytes", b[..3].to_vec(), b"end".to_vec());
            self.check("stdio: feof", libc::feof(f) != 0, true);
            self.check("stdio: ferror", libc::ferror(f), 0);
            self.check("stdio: fclose r", libc::fclose(f), 0);

            let f = libc::fopen(p.as_ptr(), c"a".as_ptr());
            if !f.is_null() {
                self.check(
                    "stdio: fwrite in mode a",
                    libc::fwrite(b"++".as_ptr() as *const c_void, 1, 2, f),
                    2,
                );
                model.extend_from_slice(b"++");
                self.check("stdio: fclose a", libc::fclose(f), 0);
            } else {
                self.must::<()>("stdio: fopen a", Err(last()));
            }
            let f = libc::fopen(p.as_ptr(), c"r+".as_ptr());
            if !f.is_null() {
                self.check("stdio: fseek 10", libc::fseek(f, 10, libc::SEEK_SET), 0);
                self.check(
                    "stdio: fwrite in mode r+",
                    libc::fwrite(b"MID".as_ptr() as *const c_void, 1, 3, f),
                    3,
                );
                put(&mut model, 10, b"MID");
                self.check("stdio: rewind", libc::fseek(f, 0, libc::SEEK_SET), 0);
                let mut b = vec![0u8; 4];
                self.check(
                    "stdio: fread 1 record of 4",
                    libc::fread(b.as_mut_ptr() as *mut c_void, 4, 1, f),
                    1,
                );
                self.check("stdio: fread r+", fp(&b), fp(&model[..4]));
                self.check("stdio: fclose r+", libc::fclose(f), 0);
            } else {
                self.must::<()>("stdio: fopen r+", Err(last()));
            }
            let f = libc::fopen64(p.as_ptr(), c"r".as_ptr());
            if !f.is_null() {
                let mut b = vec![0u8; model.len() + 100];
                self.check(
                    "stdio: fopen64 + fread of everything",
                    libc::fread(b.as_mut_ptr() as *mut c_void, 1, b.len(), f),
                    model.len(),
                );
                b.truncate(model.len());
                self.check("stdio: everything", fp(&b), fp(&model));
                self.check("stdio: fclose fopen64", libc::fclose(f), 0);
            } else {
                self.must::<()>("stdio: fopen64", Err(last()));
            }
            let missing = self.p("stdio-missing");
            let f = libc::fopen(missing.as_ptr(), c"r".as_ptr());
            self.check(
                "stdio: fopen of a missing file",
                if f.is_null() { Err(last()) } else { Ok(()) },
                Err(E(libc::ENOENT)),
            );
        }
        self.file_is("stdio: final", "stdio.txt", &model);
    }

    pub(crate) fn opens(&mut self) {
        let data = self.p("data");
        self.check(
            "open: missing file",
            open(&self.p("missing"), libc::O_RDONLY, 0).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "open: O_CREAT|O_EXCL of an existing file",
            open(&data, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY, 0o644).map(|_| ()),
            Err(E(libc::EEXIST)),
        );
        self.check(
            "open: below a file",
            open(&self.p("data/x"), libc::O_RDONLY, 0).map(|_| ()),
            Err(E(libc::ENOTDIR)),
        );
        self.check(
            "open: O_CREAT below a file",
            open(&self.p("data/x"), libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ()),
            Err(E(libc::ENOTDIR)),
        );
        let _ = mkdir(&self.p("odir"), 0o755);
        self.check(
            "open: a directory O_WRONLY",
            open(&self.p("odir"), libc::O_WRONLY, 0).map(|_| ()),
            Err(E(libc::EISDIR)),
        );
        self.check(
            "open: a directory O_RDWR",
            open(&self.p("odir"), libc::O_RDWR, 0).map(|_| ()),
            Err(E(libc::EISDIR)),
        );
        self.check(
            "open: a file O_DIRECTORY",
            open(&data, libc::O_RDONLY | libc::O_DIRECTORY, 0).map(|_| ()),
            Err(E(libc::ENOTDIR)),
        );
        self.check(
            "open: O_CREAT in a missing directory",
            open(&self.p("nodir/f"), libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        // O_CREAT without O_EXCL keeps an existing file; O_TRUNC empties it.
        let p = self.p("otrunc");
        let _ = write_file(&p, b"0123456789");
        if let Some(fd) = self.must(
            "open: O_CREAT existing",
            open(&p, libc::O_CREAT | libc::O_RDWR, 0o600),
        ) {
            self.check("open: O_CREAT keeps the data", fsize(fd), Ok(10));
            let _ = close(fd);
        }
        if let Some(fd) = self.must("open: O_TRUNC", open(&p, libc::O_TRUNC | libc::O_WRONLY, 0)) {
            self.check("open: O_TRUNC empties", fsize(fd), Ok(0));
            let _ = close(fd);
        }
        self.check("open: size after O_TRUNC", size(&p), Ok(0));
        self.check(
            "open: mode from the first create",
            mode(&p).map(|m| m & 0o7777),
            Ok(0o644),
        );
        // creat() and the umask.
        let c = self.p("creat");
        // SAFETY: `c` is a NUL-terminated C string alive for the call.
        let fd = okv(unsafe { libc::creat(c.as_ptr(), 0o666) });
        self.check("creat: new", fd.map(|_| ()), Ok(()));
        if let Ok(fd) = fd {
            self.check("creat: write", write(fd, b"creat"), Ok(5));
            self.check(
                "creat: is O_WRONLY",
                fcntl(fd, libc::F_GETFL, 0).map(|f| f & libc::O_ACCMODE),
                Ok(libc::O_WRONLY),
            );
            let _ = close(fd);
        }
        self.check(
            "creat: mode under umask 022",
            mode(&c).map(|m| m & 0o7777),
            Ok(0o644),
        );
        // SAFETY: `c` is a NUL-terminated C string alive for the call.
        if let Ok(fd) = okv(unsafe { libc::creat(c.as_ptr(), 0o600) }) {
            self.check("creat: of an existing file truncates", fsize(fd), Ok(0));
            let _ = close(fd);
        }
        // openat relative to a directory descriptor.
        if let Some(dfd) = self.must(
            "openat: open the directory",
            open(&self.p("odir"), libc::O_RDONLY | libc::O_DIRECTORY, 0),
        ) {
            // SAFETY: `dfd` is a directory we opened; the name is a static C string literal.
            let fd = okv(unsafe {
                libc::openat(
                    dfd,
                    c"rel".as_ptr(),
                    libc::O_CREAT | libc::O_RDWR,
                    0o640 as c_uint,
                )
            });
            self.check("openat: create", fd.map(|_| ()), Ok(()));
            if let Ok(fd) = fd {
                self.check("openat: write", write(fd, b"relative"), Ok(8));
                let _ = close(fd);
            }
            let _ = close(dfd);
            self.file_is("openat: the file", "odir/rel", b"relative");
            self.check(
                "openat: mode",
                mode(&self.p("odir/rel")).map(|m| m & 0o7777),
                Ok(0o640),
            );
        }
    }

    pub(crate) fn unlinked_open_file(&mut self) {
        let p = self.p("ghost");
        let Some(fd) = self.must(
            "unlinked: open",
            open(&p, libc::O_CREAT | libc::O_RDWR, 0o644),
        ) else {
            return;
        };
        let mut model = pattern(6, 300_000);
        self.check("unlinked: write", write_all(fd, &model), Ok(model.len()));
        self.check(
            "unlinked: fstat nlink before",
            fstat(fd).map(|s| s.st_nlink),
            Ok(1),
        );
        self.check("unlinked: unlink while open", unlink(&p), Ok(()));
        self.check("unlinked: gone by name", size(&p), Err(E(libc::ENOENT)));
        self.check(
            "unlinked: fstat nlink 0",
            fstat(fd).map(|s| s.st_nlink),
            Ok(0),
        );
        self.check(
            "unlinked: still readable",
            pread(fd, model.len(), 0).map(|b| fp(&b)),
            Ok(fp(&model)),
        );
        self.check(
            "unlinked: still writable",
            pwrite(fd, b"more", 300_000),
            Ok(4),
        );
        model.extend_from_slice(b"more");
        self.check("unlinked: fstat size", fsize(fd), Ok(model.len() as i64));
        self.check(
            "unlinked: read it back",
            pread(fd, 10, 299_998).map(|b| fp(&b)),
            Ok(fp(&model[299_998..])),
        );
        self.check(
            "unlinked: ftruncate",
            // SAFETY: ftruncate takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::ftruncate(fd, 1000) }),
            Ok(()),
        );
        model.truncate(1000);
        self.check("unlinked: size after ftruncate", fsize(fd), Ok(1000));
        self.check(
            "unlinked: data after ftruncate",
            pread(fd, 2000, 0).map(|b| fp(&b)),
            Ok(fp(&model)),
        );
        self.check(
            "unlinked: fchmod",
            // SAFETY: fchmod takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::fchmod(fd, 0o600) }),
            Ok(()),
        );
        self.check(
            "unlinked: fstat mode",
            fstat(fd).map(|s| s.st_mode & 0o7777),
            Ok(0o600),
        );
        // The name made again names another file: the descriptor still
        // shows its own, unlinked one.
        self.check("unlinked: the name again", write_file(&p, b"new"), Ok(()));
        self.check(
            "unlinked: fstat after the name is reused",
            fstat(fd).map(|s| (s.st_nlink, s.st_size, s.st_mode & 0o7777)),
            Ok((0, 1000, 0o600)),
        );
        self.check(
            "unlinked: the new file",
            stat(&p).map(|s| (s.st_nlink, s.st_size)),
            Ok((1, 3)),
        );
        self.check("unlinked: close", close(fd), Ok(()));
        self.check(
            "unlinked: the new file stays",
            read_file(&p),
            Ok(b"new".to_vec()),
        );
        self.check("unlinked: remove the new file", unlink(&p), Ok(()));
        self.check(
            "unlinked: names",
            names(&cs(&self.base)).map(|n| n.contains(&"ghost".to_string())),
            Ok(false),
        );
        // Rename while open: the descriptor follows the file.
        let a = self.p("moving");
        let b = self.p("moved");
        let Some(fd) = self.must(
            "renamed: open",
            open(&a, libc::O_CREAT | libc::O_RDWR, 0o644),
        ) else {
            return;
        };
        self.check("renamed: write before", write(fd, b"before-"), Ok(7));
        self.check("renamed: rename while open", rename(&a, &b), Ok(()));
        self.check("renamed: write after", write(fd, b"after"), Ok(5));
        self.check("renamed: close", close(fd), Ok(()));
        self.file_is("renamed: the file", "moved", b"before-after");
        self.check("renamed: the old name", size(&a), Err(E(libc::ENOENT)));
    }
}
