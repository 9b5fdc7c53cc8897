//! Attributes: chmod/chown/utimens, truncate/fallocate, statfs, xattrs.

use crate::sys::*;
use crate::{Suite, MIB};

impl Suite {
    pub(crate) fn attrs(&mut self) {
        let p = self.p("attr");
        // Closed a clock tick after it was made, so that the close records a
        // new mtime (the interception library caches it: a chmod must not
        // show an older one).
        if let Ok(fd) = open(&p, libc::O_CREAT | libc::O_TRUNC | libc::O_WRONLY, 0o644) {
            let _ = write_all(fd, b"attributes");
            pause();
            let _ = close(fd);
        }
        let before = stat(&p);
        pause();
        self.check(
            "chmod 0600",
            // SAFETY: `p` is a NUL-terminated C string alive for the call.
            ok(unsafe { libc::chmod(p.as_ptr(), 0o600) }),
            Ok(()),
        );
        let after = stat(&p);
        self.check("chmod: mode", after.map(|s| s.st_mode & 0o7777), Ok(0o600));
        if let (Ok(b), Ok(a)) = (before, after) {
            self.truth(
                "chmod: ctime advanced",
                ctime(&a) > ctime(&b),
                (ctime(&b), ctime(&a)),
            );
            self.truth(
                "chmod: mtime unchanged",
                mtime(&a) == mtime(&b),
                (mtime(&b), mtime(&a)),
            );
        }
        if let Some(fd) = self.must("fchmod: open", open(&p, libc::O_RDONLY, 0)) {
            self.check(
                "fchmod 0640",
                // SAFETY: fchmod takes only integers (a bad descriptor is an error, not UB).
                ok(unsafe { libc::fchmod(fd, 0o640) }),
                Ok(()),
            );
            self.check(
                "fchmod: fstat mode",
                fstat(fd).map(|s| s.st_mode & 0o7777),
                Ok(0o640),
            );
            let _ = close(fd);
        }
        let _ = mkdir(&self.p("sticky"), 0o755);
        self.check(
            "chmod a directory 01777",
            // SAFETY: the temporary CString of `self.p("sticky")` lives to the end of the statement, past the call.
            ok(unsafe { libc::chmod(self.p("sticky").as_ptr(), 0o1777) })
                .and_then(|_| mode(&self.p("sticky"))),
            Ok(libc::S_IFDIR | 0o1777),
        );
        self.check(
            "chmod a missing name",
            // SAFETY: the temporary CString of `self.p("missing")` lives to the end of the statement, past the call.
            ok(unsafe { libc::chmod(self.p("missing").as_ptr(), 0o600) }),
            Err(E(libc::ENOENT)),
        );
        // SAFETY: geteuid takes no arguments and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            self.check(
                "chown",
                // SAFETY: `p` is a NUL-terminated C string alive for the call.
                ok(unsafe { libc::chown(p.as_ptr(), 1234, 5678) }),
                Ok(()),
            );
            self.check(
                "chown: owner",
                stat(&p).map(|s| (s.st_uid, s.st_gid)),
                Ok((1234, 5678)),
            );
            if let Some(fd) = self.must("fchown: open", open(&p, libc::O_RDONLY, 0)) {
                self.check(
                    "fchown uid only",
                    // SAFETY: fchown takes only integers (a bad descriptor is an error, not UB).
                    ok(unsafe { libc::fchown(fd, 4321, u32::MAX) }),
                    Ok(()),
                );
                self.check(
                    "fchown: owner",
                    fstat(fd).map(|s| (s.st_uid, s.st_gid)),
                    Ok((4321, 5678)),
                );
                let _ = close(fd);
            }
            let l = self.p("attr-link");
            let _ = symlink("attr", &l);
            self.check(
                "lchown a symlink",
                // SAFETY: `l` is a NUL-terminated C string alive for the call.
                ok(unsafe { libc::lchown(l.as_ptr(), 99, 98) }),
                Ok(()),
            );
            self.check(
                "lchown: the link",
                lstat(&l).map(|s| (s.st_uid, s.st_gid)),
                Ok((99, 98)),
            );
            self.check(
                "lchown: not the target",
                stat(&p).map(|s| (s.st_uid, s.st_gid)),
                Ok((4321, 5678)),
            );
            self.check(
                "chown -1 -1 changes nothing",
                // SAFETY: `p` is a NUL-terminated C string alive for the call.
                ok(unsafe { libc::chown(p.as_ptr(), u32::MAX, u32::MAX) })
                    .and_then(|_| stat(&p).map(|s| (s.st_uid, s.st_gid))),
                Ok((4321, 5678)),
            );
        } else {
            println!("chown: skipped (not root)");
        }
        // utimensat with nanoseconds, UTIME_OMIT, UTIME_NOW; futimens.
        self.check(
            "utimensat",
            utimens(&p, (1_000_000_000, 123), (1_234_567_890, 456_789), 0),
            Ok(()),
        );
        let st = stat(&p);
        self.check(
            "utimensat: atime",
            st.map(|s| atime(&s)),
            Ok((1_000_000_000, 123)),
        );
        self.check(
            "utimensat: mtime",
            st.map(|s| mtime(&s)),
            Ok((1_234_567_890, 456_789)),
        );
        self.check(
            "utimensat: UTIME_OMIT atime",
            utimens(&p, (0, libc::UTIME_OMIT), (1_500_000_000, 0), 0),
            Ok(()),
        );
        let st = stat(&p);
        self.check(
            "utimensat: atime kept",
            st.map(|s| atime(&s)),
            Ok((1_000_000_000, 123)),
        );
        self.check(
            "utimensat: mtime set",
            st.map(|s| mtime(&s)),
            Ok((1_500_000_000, 0)),
        );
        self.check(
            "utimensat: UTIME_NOW",
            utimens(&p, (0, libc::UTIME_OMIT), (0, libc::UTIME_NOW), 0),
            Ok(()),
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs() as i64;
        self.check(
            "utimensat: mtime is now",
            stat(&p).map(|s| (s.st_mtime - now).abs() <= 5),
            Ok(true),
        );
        if let Some(fd) = self.must("futimens: open", open(&p, libc::O_RDONLY, 0)) {
            let ts = [
                libc::timespec {
                    tv_sec: 0,
                    tv_nsec: libc::UTIME_OMIT,
                },
                libc::timespec {
                    tv_sec: 1_600_000_000,
                    tv_nsec: 7,
                },
            ];
            self.check(
                "futimens",
                // SAFETY: `ts` is a live array of the two timespecs futimens reads.
                ok(unsafe { libc::futimens(fd, ts.as_ptr()) }),
                Ok(()),
            );
            self.check(
                "futimens: mtime",
                fstat(fd).map(|s| mtime(&s)),
                Ok((1_600_000_000, 7)),
            );
            let _ = close(fd);
        }
        let l = self.p("time-link");
        let _ = symlink("attr", &l);
        self.check(
            "utimensat AT_SYMLINK_NOFOLLOW",
            utimens(&l, (5, 0), (6, 0), libc::AT_SYMLINK_NOFOLLOW),
            Ok(()),
        );
        self.check(
            "utimensat: the link's mtime",
            lstat(&l).map(|s| mtime(&s)),
            Ok((6, 0)),
        );
        self.check(
            "utimensat: not the target's",
            stat(&p).map(|s| mtime(&s)),
            Ok((1_600_000_000, 7)),
        );
    }

    pub(crate) fn truncate_fallocate(&mut self) {
        let p = self.p("tr");
        let mut model = pattern(7, 10_000);
        let _ = write_file(&p, &model);
        self.check(
            "truncate: shrink",
            // SAFETY: `p` is a NUL-terminated C string alive for the call.
            ok(unsafe { libc::truncate(p.as_ptr(), 5000) }),
            Ok(()),
        );
        model.truncate(5000);
        self.file_is("truncate: shrunk", "tr", &model);
        self.check(
            "truncate: extend to 2 MiB",
            // SAFETY: `p` is a NUL-terminated C string alive for the call.
            ok(unsafe { libc::truncate(p.as_ptr(), 2 * MIB as i64) }),
            Ok(()),
        );
        model.resize(2 * MIB, 0);
        self.file_is("truncate: extended", "tr", &model);
        self.check(
            "truncate: a directory",
            // SAFETY: the temporary CString of `self.p("r1")` lives to the end of the statement, past the call.
            ok(unsafe { libc::truncate(self.p("r1").as_ptr(), 0) }),
            Err(E(libc::EISDIR)),
        );
        self.check(
            "truncate: a missing name",
            // SAFETY: the temporary CString of `self.p("missing")` lives to the end of the statement, past the call.
            ok(unsafe { libc::truncate(self.p("missing").as_ptr(), 0) }),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "truncate: negative",
            // SAFETY: `p` is a NUL-terminated C string alive for the call.
            ok(unsafe { libc::truncate(p.as_ptr(), -1) }),
            Err(E(libc::EINVAL)),
        );
        let fa = self.p("fa");
        let Some(fd) = self.must(
            "fallocate: open",
            open(&fa, libc::O_CREAT | libc::O_RDWR | libc::O_TRUNC, 0o644),
        ) else {
            return;
        };
        self.check(
            "fallocate mode 0 extends",
            // SAFETY: fallocate takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::fallocate(fd, 0, 0, 3 * MIB as i64) }),
            Ok(()),
        );
        self.check("fallocate: size", fsize(fd), Ok(3 * MIB as i64));
        self.check(
            "fallocate inside the file",
            // SAFETY: fallocate takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::fallocate(fd, 0, 10, 10) }).and_then(|_| fsize(fd)),
            Ok(3 * MIB as i64),
        );
        self.check(
            "fallocate: reads zeros",
            pread(fd, 4096, (3 * MIB - 4096) as i64)
                .map(|b| b.len() == 4096 && b.iter().all(|&x| x == 0)),
            Ok(true),
        );
        self.check(
            "fallocate KEEP_SIZE",
            // SAFETY: fallocate takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe { libc::fallocate(fd, libc::FALLOC_FL_KEEP_SIZE, 0, 4 * MIB as i64) }),
            Err(E(libc::EOPNOTSUPP)),
        );
        self.check(
            "fallocate PUNCH_HOLE",
            // SAFETY: fallocate takes only integers (a bad descriptor is an error, not UB).
            ok(unsafe {
                libc::fallocate(
                    fd,
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    0,
                    10,
                )
            }),
            Err(E(libc::EOPNOTSUPP)),
        );
        self.check(
            "posix_fallocate",
            // SAFETY: posix_fallocate takes only integers (a bad descriptor is an error, not UB).
            unsafe { libc::posix_fallocate(fd, 0, 4 * MIB as i64) },
            0,
        );
        self.check("posix_fallocate: size", fsize(fd), Ok(4 * MIB as i64));
        self.check("fallocate: close", close(fd), Ok(()));
        self.check("fallocate: size by path", size(&fa), Ok(4 * MIB as i64));
    }

    pub(crate) fn statfs(&mut self) {
        let p = cs(&self.base);
        // SAFETY: `libc::statvfs` is plain integers, for which all zeroes is valid.
        let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
        self.check(
            "statvfs",
            // SAFETY: `p` is a NUL-terminated C string and `sv` a live local statvfs.
            ok(unsafe { libc::statvfs(p.as_ptr(), &mut sv) }),
            Ok(()),
        );
        self.check("statvfs: f_bsize", sv.f_bsize, 4096);
        self.check("statvfs: f_namemax", sv.f_namemax, 255);
        self.truth("statvfs: f_blocks > 0", sv.f_blocks > 0, sv.f_blocks);
        self.truth(
            "statvfs: f_bavail <= f_bfree <= f_blocks",
            sv.f_bavail <= sv.f_bfree && sv.f_bfree <= sv.f_blocks,
            (sv.f_bavail, sv.f_bfree, sv.f_blocks),
        );
        self.check("statvfs: not read-only", sv.f_flag & libc::ST_RDONLY, 0);
        // SAFETY: `libc::statfs` is plain integers, for which all zeroes is valid.
        let mut sf: libc::statfs = unsafe { std::mem::zeroed() };
        self.check(
            "statfs",
            // SAFETY: `p` is a NUL-terminated C string and `sf` a live local statfs.
            ok(unsafe { libc::statfs(p.as_ptr(), &mut sf) }),
            Ok(()),
        );
        self.check("statfs: FUSE magic", sf.f_type, 0x6573_5546);
        if let Some(fd) = self.must("fstatvfs: open", open(&self.p("data"), libc::O_RDONLY, 0)) {
            // SAFETY: `libc::statvfs` is plain integers, for which all zeroes is valid.
            let mut sv2: libc::statvfs = unsafe { std::mem::zeroed() };
            self.check(
                "fstatvfs",
                // SAFETY: `sv2` is a live local statvfs the kernel fills.
                ok(unsafe { libc::fstatvfs(fd, &mut sv2) }),
                Ok(()),
            );
            self.truth(
                "fstatvfs: same size",
                sv2.f_blocks == sv.f_blocks,
                (sv2.f_blocks, sv.f_blocks),
            );
            let _ = close(fd);
        }
    }

    pub(crate) fn xattrs(&mut self) {
        let p = self.p("xa");
        let _ = write_file(&p, b"xattrs");
        self.check("setxattr", setxattr(&p, "user.k", b"v1", 0), Ok(()));
        self.check("getxattr", getxattr(&p, "user.k", 64), Ok(b"v1".to_vec()));
        self.check(
            "getxattr: size query",
            getxattr(&p, "user.k", 0).map(|v| v.len()),
            Ok(2),
        );
        self.check(
            "getxattr: buffer too small",
            getxattr(&p, "user.k", 1),
            Err(E(libc::ERANGE)),
        );
        self.check(
            "setxattr XATTR_CREATE of an existing one",
            setxattr(&p, "user.k", b"x", libc::XATTR_CREATE),
            Err(E(libc::EEXIST)),
        );
        self.check(
            "setxattr XATTR_REPLACE of a missing one",
            setxattr(&p, "user.none", b"x", libc::XATTR_REPLACE),
            Err(E(libc::ENODATA)),
        );
        self.check(
            "setxattr XATTR_REPLACE",
            setxattr(&p, "user.k", b"v2", libc::XATTR_REPLACE),
            Ok(()),
        );
        self.check(
            "getxattr: replaced",
            getxattr(&p, "user.k", 64),
            Ok(b"v2".to_vec()),
        );
        let big = pattern(8, 4000);
        self.check(
            "setxattr 4000 bytes",
            setxattr(&p, "user.big", &big, 0),
            Ok(()),
        );
        self.check(
            "getxattr 4000 bytes",
            getxattr(&p, "user.big", 8192).map(|v| fp(&v)),
            Ok(fp(&big)),
        );
        self.check(
            "setxattr empty value",
            setxattr(&p, "user.empty", b"", 0),
            Ok(()),
        );
        self.check(
            "getxattr empty value",
            getxattr(&p, "user.empty", 64),
            Ok(vec![]),
        );
        self.check(
            "listxattr",
            listxattr(&p),
            Ok(vec![
                "user.big".into(),
                "user.empty".into(),
                "user.k".into(),
            ]),
        );
        self.check(
            "listxattr: size query",
            // SAFETY: `p` is a NUL-terminated C string; size 0 with NULL only asks for the length.
            okn(unsafe { libc::listxattr(p.as_ptr(), std::ptr::null_mut(), 0) }),
            Ok("user.big\0user.empty\0user.k\0".len()),
        );
        self.check(
            "getxattr of a missing one",
            getxattr(&p, "user.none", 64),
            Err(E(libc::ENODATA)),
        );
        self.check("removexattr", removexattr(&p, "user.k"), Ok(()));
        self.check(
            "getxattr: removed",
            getxattr(&p, "user.k", 64),
            Err(E(libc::ENODATA)),
        );
        self.check(
            "removexattr of a missing one",
            removexattr(&p, "user.k"),
            Err(E(libc::ENODATA)),
        );
        let long_name = format!("user.{}", "n".repeat(251));
        self.check(
            "setxattr: a 256-byte name",
            setxattr(&p, &long_name, b"x", 0),
            Err(E(libc::ERANGE)),
        );
        self.check(
            "getxattr on a missing file",
            getxattr(&self.p("missing"), "user.k", 64),
            Err(E(libc::ENOENT)),
        );
        // f*xattr on a descriptor.
        if let Some(fd) = self.must("fsetxattr: open", open(&p, libc::O_RDWR, 0)) {
            self.check(
                "fsetxattr",
                // SAFETY: C string literals for the name, 3 bytes of a static literal for the value.
                ok(unsafe {
                    libc::fsetxattr(
                        fd,
                        c"user.fd".as_ptr(),
                        b"fdv".as_ptr() as *const c_void,
                        3,
                        0,
                    )
                }),
                Ok(()),
            );
            let mut b = [0u8; 16];
            self.check(
                "fgetxattr",
                // SAFETY: a static C string for the name; `b` is a live 16-byte buffer, as passed.
                okn(unsafe {
                    libc::fgetxattr(fd, c"user.fd".as_ptr(), b.as_mut_ptr() as *mut c_void, 16)
                })
                .map(|n| b[..n].to_vec()),
                Ok(b"fdv".to_vec()),
            );
            let mut l = vec![0u8; 4096];
            self.check(
                "flistxattr",
                // SAFETY: `l` is a live buffer of 4096 bytes, as passed.
                okn(unsafe { libc::flistxattr(fd, l.as_mut_ptr() as *mut c_char, 4096) })
                    .map(|n| split_names(&l[..n])),
                Ok(vec![
                    "user.big".into(),
                    "user.empty".into(),
                    "user.fd".into(),
                ]),
            );
            self.check(
                "fremovexattr",
                // SAFETY: C string literals are static.
                ok(unsafe { libc::fremovexattr(fd, c"user.fd".as_ptr()) }),
                Ok(()),
            );
            let _ = close(fd);
        }
        // Directories; symlinks (user.* is refused on them by the kernel).
        let d = self.p("xdir");
        let _ = mkdir(&d, 0o755);
        self.check(
            "setxattr on a directory",
            setxattr(&d, "user.d", b"dv", 0),
            Ok(()),
        );
        self.check(
            "getxattr on a directory",
            getxattr(&d, "user.d", 64),
            Ok(b"dv".to_vec()),
        );
        let l = self.p("xlink");
        let _ = symlink("xa", &l);
        let n = cstr("user.l");
        self.check(
            "lsetxattr user.* on a symlink",
            // SAFETY: `l` and `n` are NUL-terminated CStrings alive for the call; the value
            // is 1 byte of a static literal.
            ok(unsafe {
                libc::lsetxattr(l.as_ptr(), n.as_ptr(), b"1".as_ptr() as *const c_void, 1, 0)
            }),
            Err(E(libc::EPERM)),
        );
        // The object class of new entries, by directory xattr.
        self.check(
            "oclass xattr: a bad class",
            setxattr(&d, "user.peregrine.oclass", b"BOGUS", 0),
            Err(E(libc::EINVAL)),
        );
        self.check(
            "oclass xattr: S2",
            setxattr(&d, "user.peregrine.oclass", b"S2", 0),
            Ok(()),
        );
        self.check(
            "oclass xattr: read back",
            getxattr(&d, "user.peregrine.oclass", 64),
            Ok(b"S2".to_vec()),
        );
        let data = pattern(9, 3 * MIB);
        self.check(
            "oclass xattr: a file below it",
            write_file(&self.p("xdir/s2file"), &data)
                .and_then(|_| read_file(&self.p("xdir/s2file")).map(|b| fp(&b))),
            Ok(fp(&data)),
        );
        self.check(
            "oclass xattr: a subdirectory inherits it",
            mkdir(&self.p("xdir/sub"), 0o755)
                .and_then(|_| getxattr(&self.p("xdir/sub"), "user.peregrine.oclass", 64)),
            Ok(b"S2".to_vec()),
        );
    }
}
