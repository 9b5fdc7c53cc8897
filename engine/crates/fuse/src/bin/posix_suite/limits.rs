//! Limits: a read-only mount (EROFS) and a full pool (ENOSPC).

use crate::sys::*;
use crate::{Suite, MIB};

impl Suite {
    /// `ro` is `self.base` seen through a read-only mount.
    pub(crate) fn read_only(&mut self, ro: &Path) {
        let data = pattern(10, 10_000);
        let setup = (|| {
            mkdir(&self.p("ro"), 0o755)?;
            write_file(&self.p("ro/file"), &data)?;
            mkdir(&self.p("ro/dir"), 0o755)?;
            symlink("file", &self.p("ro/ln"))?;
            setxattr(&self.p("ro/file"), "user.r", b"1", 0)
        })();
        if self
            .must("EROFS: setup through the read-write mount", setup)
            .is_none()
        {
            return;
        }
        let r = |rel: &str| cs(&ro.join("ro").join(rel));
        let (file, dir, ln) = (r("file"), r("dir"), r("ln"));
        let rofs = Err(E(libc::EROFS));
        self.check(
            "read-only: read",
            read_file(&file).map(|b| fp(&b)),
            Ok(fp(&data)),
        );
        self.check("read-only: readlink", readlink(&ln, 100), Ok("file".into()));
        self.check(
            "read-only: getxattr",
            getxattr(&file, "user.r", 64),
            Ok(b"1".to_vec()),
        );
        self.check(
            "read-only: readdir",
            names(&r("")),
            Ok(vec!["dir".into(), "file".into(), "ln".into()]),
        );
        for (what, flags) in [
            ("O_WRONLY", libc::O_WRONLY),
            ("O_RDWR", libc::O_RDWR),
            ("O_RDONLY|O_TRUNC", libc::O_RDONLY | libc::O_TRUNC),
        ] {
            self.check(
                &format!("EROFS: open {what}"),
                open(&file, flags, 0).map(|_| ()),
                rofs,
            );
        }
        self.check(
            "EROFS: create",
            open(&r("new"), libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ()),
            rofs,
        );
        self.check("EROFS: mkdir", mkdir(&r("newdir"), 0o755), rofs);
        self.check("EROFS: rmdir", rmdir(&dir), rofs);
        self.check("EROFS: unlink", unlink(&file), rofs);
        self.check("EROFS: rename", rename(&file, &r("file2")), rofs);
        self.check("EROFS: symlink", symlink("x", &r("ln2")), rofs);
        self.check(
            "EROFS: link",
            // SAFETY: `file` is a NUL-terminated C string alive for the call; the temporary CString of `r("hl")` lives to the end of the statement, past the call.
            ok(unsafe { libc::link(file.as_ptr(), r("hl").as_ptr()) }),
            rofs,
        );
        self.check(
            "EROFS: chmod",
            // SAFETY: `file` is a NUL-terminated C string alive for the call.
            ok(unsafe { libc::chmod(file.as_ptr(), 0o600) }),
            rofs,
        );
        // SAFETY: geteuid takes no arguments and cannot fail.
        if unsafe { libc::geteuid() } == 0 {
            self.check(
                "EROFS: chown",
                // SAFETY: `file` is a NUL-terminated C string alive for the call.
                ok(unsafe { libc::chown(file.as_ptr(), 1, 1) }),
                rofs,
            );
        }
        self.check("EROFS: utimensat", utimens(&file, (1, 0), (1, 0), 0), rofs);
        self.check(
            "EROFS: truncate",
            // SAFETY: `file` is a NUL-terminated C string alive for the call.
            ok(unsafe { libc::truncate(file.as_ptr(), 0) }),
            rofs,
        );
        self.check("EROFS: setxattr", setxattr(&file, "user.w", b"1", 0), rofs);
        self.check("EROFS: removexattr", removexattr(&file, "user.r"), rofs);
        self.check(
            "EROFS: access W_OK",
            // SAFETY: `file` is a NUL-terminated C string alive for the call.
            ok(unsafe { libc::access(file.as_ptr(), libc::W_OK) }),
            rofs,
        );
        self.check(
            "read-only: access R_OK",
            // SAFETY: `file` is a NUL-terminated C string alive for the call.
            ok(unsafe { libc::access(file.as_ptr(), libc::R_OK) }),
            Ok(()),
        );
        // SAFETY: `libc::statvfs` is plain integers, for which all zeroes is valid.
        let mut sv: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `file` is a NUL-terminated CString and `sv` a live local statvfs.
        let _ = unsafe { libc::statvfs(file.as_ptr(), &mut sv) };
        self.check(
            "read-only: statvfs ST_RDONLY",
            sv.f_flag & libc::ST_RDONLY != 0,
            true,
        );
        if let Some(fd) = self.must("read-only: open O_RDONLY", open(&file, libc::O_RDONLY, 0)) {
            self.check(
                "read-only: pread",
                pread(fd, 100, 5000).map(|b| fp(&b)),
                Ok(fp(&data[5000..5100])),
            );
            self.check("read-only: write", write(fd, b"x"), Err(E(libc::EBADF)));
            self.check(
                "read-only: ftruncate",
                // SAFETY: ftruncate takes only integers (a bad descriptor is an error, not UB).
                ok(unsafe { libc::ftruncate(fd, 0) }),
                Err(E(libc::EINVAL)),
            );
            let _ = close(fd);
        }
        self.check(
            "read-only: data unchanged",
            read_file(&self.p("ro/file")).map(|b| fp(&b)),
            Ok(fp(&data)),
        );
    }

    /// `full` is a directory on a small pool.
    pub(crate) fn enospc(&mut self, full: &Path) {
        let p = cs(&full.join("fill"));
        let Some(fd) = self.must(
            "ENOSPC: open",
            open(&p, libc::O_CREAT | libc::O_WRONLY | libc::O_TRUNC, 0o644),
        ) else {
            return;
        };
        let chunk = pattern(11, MIB);
        let mut written = 0usize;
        let mut err = Ok(());
        // Bounded: the pool is far smaller than 1 GiB.
        for _ in 0..1024 {
            match write(fd, &chunk) {
                Ok(n) if n > 0 => written += n,
                Ok(_) => {
                    err = Err(E(libc::EIO));
                    break;
                }
                Err(e) => {
                    err = Err(e);
                    break;
                }
            }
        }
        self.check("ENOSPC: write to a full pool", err, Err(E(libc::ENOSPC)));
        self.truth("ENOSPC: after at least 8 MiB", written >= 8 * MIB, written);
        self.check("ENOSPC: close", close(fd), Ok(()));
        self.check("ENOSPC: unlink on the full pool", unlink(&p), Ok(()));
        self.check("ENOSPC: gone", stat(&p).map(|_| ()), Err(E(libc::ENOENT)));
    }
}
