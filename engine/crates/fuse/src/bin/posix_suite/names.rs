//! Names: error codes of path calls, renames, symlinks, readdir, directory times.

use crate::sys::*;
use crate::Suite;

impl Suite {
    pub(crate) fn errors(&mut self) {
        // ENAMETOOLONG
        let n256 = "x".repeat(256);
        let n255 = "y".repeat(255);
        let long = self.p(&n256);
        self.check(
            "ENAMETOOLONG: create a 256-byte name",
            open(&long, libc::O_CREAT | libc::O_WRONLY, 0o644).map(|_| ()),
            Err(E(libc::ENAMETOOLONG)),
        );
        self.check(
            "ENAMETOOLONG: mkdir",
            mkdir(&long, 0o755),
            Err(E(libc::ENAMETOOLONG)),
        );
        self.check(
            "ENAMETOOLONG: stat",
            stat(&long).map(|_| ()),
            Err(E(libc::ENAMETOOLONG)),
        );
        self.check(
            "ENAMETOOLONG: symlink",
            symlink("data", &long),
            Err(E(libc::ENAMETOOLONG)),
        );
        self.check(
            "ENAMETOOLONG: rename to it",
            rename(&self.p("creat"), &long),
            Err(E(libc::ENAMETOOLONG)),
        );
        let ok255 = self.p(&n255);
        self.check(
            "NAME_MAX: a 255-byte name",
            write_file(&ok255, b"255"),
            Ok(()),
        );
        self.check("NAME_MAX: read it", read_file(&ok255), Ok(b"255".to_vec()));
        self.check("NAME_MAX: unlink it", unlink(&ok255), Ok(()));
        let deep = format!("{}/{}", self.base.display(), "a/".repeat(2100));
        self.check(
            "ENAMETOOLONG: a path over PATH_MAX",
            stat(&cstr(&deep)).map(|_| ()),
            Err(E(libc::ENAMETOOLONG)),
        );
        // ENOTDIR
        let data = self.p("data");
        self.check(
            "ENOTDIR: mkdir below a file",
            mkdir(&self.p("data/sub"), 0o755),
            Err(E(libc::ENOTDIR)),
        );
        self.check(
            "ENOTDIR: stat below a file",
            stat(&self.p("data/x")).map(|_| ()),
            Err(E(libc::ENOTDIR)),
        );
        self.check("ENOTDIR: rmdir a file", rmdir(&data), Err(E(libc::ENOTDIR)));
        self.check(
            "ENOTDIR: opendir a file",
            list_dir(&data).map(|_| ()),
            Err(E(libc::ENOTDIR)),
        );
        // EEXIST
        let _ = mkdir(&self.p("edir"), 0o755);
        self.check(
            "EEXIST: mkdir an existing directory",
            mkdir(&self.p("edir"), 0o755),
            Err(E(libc::EEXIST)),
        );
        self.check(
            "EEXIST: mkdir over a file",
            mkdir(&data, 0o755),
            Err(E(libc::EEXIST)),
        );
        self.check(
            "EEXIST: symlink over a file",
            symlink("x", &data),
            Err(E(libc::EEXIST)),
        );
        // ENOTEMPTY
        let _ = write_file(&self.p("edir/f"), b"f");
        self.check(
            "ENOTEMPTY: rmdir a non-empty directory",
            rmdir(&self.p("edir")),
            Err(E(libc::ENOTEMPTY)),
        );
        self.check(
            "ENOTEMPTY: its file is intact",
            read_file(&self.p("edir/f")),
            Ok(b"f".to_vec()),
        );
        // EISDIR, ENOENT, EINVAL
        self.check(
            "EISDIR: unlink a directory",
            unlink(&self.p("edir")),
            Err(E(libc::EISDIR)),
        );
        self.check(
            "ENOENT: unlink a missing name",
            unlink(&self.p("missing")),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "ENOENT: rmdir a missing name",
            rmdir(&self.p("missing")),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "ENOENT: mkdir in a missing directory",
            mkdir(&self.p("missing/sub"), 0o755),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "ENOENT: stat a missing name",
            stat(&self.p("missing")).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "EINVAL: rmdir dir/.",
            rmdir(&self.p("edir/.")),
            Err(E(libc::EINVAL)),
        );
        let _ = mkdir(&self.p("empty"), 0o755);
        self.check("rmdir: an empty directory", rmdir(&self.p("empty")), Ok(()));
        self.check(
            "rmdir: it is gone",
            stat(&self.p("empty")).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        self.check("unlink: a file", unlink(&self.p("edir/f")), Ok(()));
        self.check("rmdir: now empty", rmdir(&self.p("edir")), Ok(()));
        self.check(
            "mkdir: mode under umask 022",
            mkdir(&self.p("mdir"), 0o777).and_then(|_| mode(&self.p("mdir"))),
            Ok(libc::S_IFDIR | 0o755),
        );
    }

    pub(crate) fn renames(&mut self) {
        let p = |s: &Self, r: &str| s.p(r);
        let _ = mkdir(&p(self, "r1"), 0o755);
        let _ = mkdir(&p(self, "r2"), 0o755);
        let _ = write_file(&p(self, "r1/a"), b"A");
        self.check(
            "rename: within a directory",
            rename(&p(self, "r1/a"), &p(self, "r1/b")),
            Ok(()),
        );
        self.check(
            "rename: old name gone",
            stat(&p(self, "r1/a")).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "rename: new name",
            read_file(&p(self, "r1/b")),
            Ok(b"A".to_vec()),
        );
        self.check(
            "rename: across directories",
            rename(&p(self, "r1/b"), &p(self, "r2/c")),
            Ok(()),
        );
        self.check(
            "rename: arrived",
            read_file(&p(self, "r2/c")),
            Ok(b"A".to_vec()),
        );
        self.check("rename: left", names(&p(self, "r1")), Ok(vec![]));
        let _ = write_file(&p(self, "r2/d"), b"DDDD");
        self.check(
            "rename: over an existing file",
            rename(&p(self, "r2/c"), &p(self, "r2/d")),
            Ok(()),
        );
        self.check(
            "rename: replaced content",
            read_file(&p(self, "r2/d")),
            Ok(b"A".to_vec()),
        );
        self.check(
            "rename: one entry left",
            names(&p(self, "r2")),
            Ok(vec!["d".to_string()]),
        );
        self.check(
            "rename: onto itself",
            rename(&p(self, "r2/d"), &p(self, "r2/d")),
            Ok(()),
        );
        self.check(
            "rename: onto itself keeps it",
            read_file(&p(self, "r2/d")),
            Ok(b"A".to_vec()),
        );
        self.check(
            "RENAME_NOREPLACE to a free name",
            renameat2(&p(self, "r2/d"), &p(self, "r1/e"), libc::RENAME_NOREPLACE),
            Ok(()),
        );
        let _ = write_file(&p(self, "r2/f"), b"F");
        self.check(
            "RENAME_NOREPLACE over a file",
            renameat2(&p(self, "r1/e"), &p(self, "r2/f"), libc::RENAME_NOREPLACE),
            Err(E(libc::EEXIST)),
        );
        self.check(
            "RENAME_NOREPLACE: source kept",
            read_file(&p(self, "r1/e")),
            Ok(b"A".to_vec()),
        );
        self.check(
            "RENAME_NOREPLACE: target kept",
            read_file(&p(self, "r2/f")),
            Ok(b"F".to_vec()),
        );
        self.check(
            "RENAME_EXCHANGE two files",
            renameat2(&p(self, "r1/e"), &p(self, "r2/f"), libc::RENAME_EXCHANGE),
            Ok(()),
        );
        self.check(
            "RENAME_EXCHANGE: one",
            read_file(&p(self, "r1/e")),
            Ok(b"F".to_vec()),
        );
        self.check(
            "RENAME_EXCHANGE: other",
            read_file(&p(self, "r2/f")),
            Ok(b"A".to_vec()),
        );
        self.check(
            "RENAME_EXCHANGE with a missing target",
            renameat2(
                &p(self, "r1/e"),
                &p(self, "r2/missing"),
                libc::RENAME_EXCHANGE,
            ),
            Err(E(libc::ENOENT)),
        );
        let _ = mkdir(&p(self, "r2/sd"), 0o755);
        let _ = write_file(&p(self, "r2/sd/in"), b"in");
        self.check(
            "RENAME_EXCHANGE a file and a directory",
            renameat2(&p(self, "r1/e"), &p(self, "r2/sd"), libc::RENAME_EXCHANGE),
            Ok(()),
        );
        self.check(
            "RENAME_EXCHANGE: the directory moved",
            read_file(&p(self, "r1/e/in")),
            Ok(b"in".to_vec()),
        );
        self.check(
            "RENAME_EXCHANGE: the file moved",
            read_file(&p(self, "r2/sd")),
            Ok(b"F".to_vec()),
        );
        self.check(
            "rename flags NOREPLACE|EXCHANGE",
            renameat2(
                &p(self, "r2/sd"),
                &p(self, "r2/f"),
                libc::RENAME_NOREPLACE | libc::RENAME_EXCHANGE,
            ),
            Err(E(libc::EINVAL)),
        );
        let _ = mkdir(&p(self, "r1/empty"), 0o755);
        let _ = mkdir(&p(self, "r2/full"), 0o755);
        let _ = write_file(&p(self, "r2/full/x"), b"x");
        self.check(
            "rename: a directory over an empty one",
            rename(&p(self, "r2/full"), &p(self, "r1/empty")),
            Ok(()),
        );
        self.check(
            "rename: its content came",
            read_file(&p(self, "r1/empty/x")),
            Ok(b"x".to_vec()),
        );
        let _ = mkdir(&p(self, "r2/g"), 0o755);
        self.check(
            "rename: a directory over a non-empty one",
            rename(&p(self, "r2/g"), &p(self, "r1/empty")),
            Err(E(libc::ENOTEMPTY)),
        );
        self.check(
            "rename: a directory over a file",
            rename(&p(self, "r2/g"), &p(self, "r2/f")),
            Err(E(libc::ENOTDIR)),
        );
        self.check(
            "rename: a file over a directory",
            rename(&p(self, "r2/f"), &p(self, "r2/g")),
            Err(E(libc::EISDIR)),
        );
        self.check(
            "rename: a directory into itself",
            rename(&p(self, "r1"), &p(self, "r1/empty/sub")),
            Err(E(libc::EINVAL)),
        );
        self.check(
            "rename: a missing source",
            rename(&p(self, "r1/missing"), &p(self, "r1/z")),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "rename: a directory to another parent",
            rename(&p(self, "r1/empty"), &p(self, "r2/moved")),
            Ok(()),
        );
        self.check(
            "rename: children follow",
            read_file(&p(self, "r2/moved/x")),
            Ok(b"x".to_vec()),
        );
        self.check(
            "rename: new files in the moved directory",
            write_file(&p(self, "r2/moved/y"), b"y").and_then(|_| names(&p(self, "r2/moved"))),
            Ok(vec!["x".to_string(), "y".to_string()]),
        );
        let _ = setxattr(&p(self, "r2/f"), "user.t", b"1", 0);
        self.check(
            "rename: with an xattr",
            rename(&p(self, "r2/f"), &p(self, "r2/f2")),
            Ok(()),
        );
        self.check(
            "rename: the xattr follows",
            getxattr(&p(self, "r2/f2"), "user.t", 64),
            Ok(b"1".to_vec()),
        );
        self.check(
            "rename: final tree r1",
            names(&p(self, "r1")),
            Ok(vec!["e".to_string()]),
        );
        self.check(
            "rename: final tree r2",
            names(&p(self, "r2")),
            Ok(["f2", "g", "moved", "sd"]
                .iter()
                .map(|s| s.to_string())
                .collect()),
        );
    }

    pub(crate) fn symlinks(&mut self) {
        let ln = self.p("ln");
        self.check("symlink: create", symlink("data", &ln), Ok(()));
        self.check("readlink", readlink(&ln, 4096), Ok("data".to_string()));
        self.check(
            "symlink: lstat type and size",
            lstat(&ln).map(|s| (s.st_mode & libc::S_IFMT, s.st_size)),
            Ok((libc::S_IFLNK, 4)),
        );
        let target = size(&self.p("data"));
        self.check("symlink: stat follows it", size(&ln), target);
        let content = read_file(&self.p("data")).map(|b| fp(&b));
        self.check(
            "symlink: open follows it",
            read_file(&ln).map(|b| fp(&b)),
            content,
        );
        self.check(
            "readlink: short buffer",
            readlink(&ln, 2),
            Ok("da".to_string()),
        );
        self.check(
            "readlink: a regular file",
            readlink(&self.p("data"), 100),
            Err(E(libc::EINVAL)),
        );
        self.check(
            "readlink: a missing name",
            readlink(&self.p("missing"), 100),
            Err(E(libc::ENOENT)),
        );
        let dl = self.p("dangling");
        self.check("symlink: dangling", symlink("no/such/target", &dl), Ok(()));
        self.check(
            "symlink: stat of a dangling link",
            stat(&dl).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "symlink: lstat of it",
            lstat(&dl).map(|s| s.st_size),
            Ok(14),
        );
        self.check(
            "symlink: empty target",
            symlink("", &self.p("empty-link")),
            Err(E(libc::ENOENT)),
        );
        let t1000 = "t".repeat(1000);
        self.check(
            "symlink: 1000-byte target",
            symlink(&t1000, &self.p("longlink")),
            Ok(()),
        );
        self.check(
            "readlink: 1000-byte target",
            readlink(&self.p("longlink"), 4096),
            Ok(t1000),
        );
        let _ = mkdir(&self.p("sdir"), 0o755);
        let _ = write_file(&self.p("sdir/in"), b"in");
        self.check(
            "symlink: to a directory",
            symlink("sdir", &self.p("dlink")),
            Ok(()),
        );
        self.check(
            "symlink: through it",
            read_file(&self.p("dlink/in")),
            Ok(b"in".to_vec()),
        );
        self.check(
            "symlink: list through it",
            names(&self.p("dlink")),
            Ok(vec!["in".to_string()]),
        );
        // symlinkat / readlinkat relative to a directory descriptor.
        if let Some(dfd) = self.must(
            "symlinkat: open the directory",
            open(&self.p("sdir"), libc::O_RDONLY | libc::O_DIRECTORY, 0),
        ) {
            self.check(
                "symlinkat",
                // SAFETY: C string literals are static.
                ok(unsafe { libc::symlinkat(c"in".as_ptr(), dfd, c"rel".as_ptr()) }),
                Ok(()),
            );
            let mut b = [0u8; 64];
            // SAFETY: a static C string for the name; `b` is a live 64-byte buffer, as passed.
            let n = okn(unsafe {
                libc::readlinkat(dfd, c"rel".as_ptr(), b.as_mut_ptr() as *mut c_char, 64)
            });
            self.check("readlinkat", n.map(|n| b[..n].to_vec()), Ok(b"in".to_vec()));
            let _ = close(dfd);
        }
        self.check("symlink: unlink the link", unlink(&self.p("dlink")), Ok(()));
        self.check(
            "symlink: the target stays",
            read_file(&self.p("sdir/in")),
            Ok(b"in".to_vec()),
        );
    }

    pub(crate) fn readdir(&mut self, n: usize) {
        let d = self.p("many");
        if self.must("readdir: mkdir", mkdir(&d, 0o755)).is_none() {
            return;
        }
        let mut want: Vec<(String, u8)> = Vec::new();
        for i in 0..n {
            let name = format!("e{i:05}");
            if let Err(e) = write_file(&self.p(&format!("many/{name}")), b"") {
                self.must::<()>(&format!("readdir: create {name}"), Err(e));
                return;
            }
            want.push((name, libc::DT_REG));
        }
        for i in 0..3 {
            let name = format!("sd{i}");
            let _ = mkdir(&self.p(&format!("many/{name}")), 0o755);
            want.push((name, libc::DT_DIR));
        }
        for i in 0..2 {
            let name = format!("ln{i}");
            let _ = symlink("e00000", &self.p(&format!("many/{name}")));
            want.push((name, libc::DT_LNK));
        }
        want.sort();
        let Some((got, dots)) = self.must("readdir: list", list_dir(&d)) else {
            return;
        };
        self.check("readdir: . and ..", dots, true);
        self.check("readdir: entry count", got.len(), want.len());
        let mut sorted = got.clone();
        sorted.sort();
        self.truth(
            "readdir: every name once, with its d_type",
            sorted == want,
            (sorted.len(), want.len()),
        );
        self.check("readdir: the order is sorted", got == sorted, true);
        let again = list_dir(&d).map(|(v, _)| v);
        self.truth(
            "readdir: same order twice",
            again.as_ref() == Ok(&got),
            "order changed",
        );
        // telldir / seekdir / rewinddir.
        // SAFETY: `d` is a NUL-terminated CString; `dir` is used only between a
        // successful opendir and its closedir, and each dirent only before the
        // next readdir on it (`dirent`'s requirement).
        unsafe {
            let dir = libc::opendir(d.as_ptr());
            if dir.is_null() {
                self.must::<()>("readdir: opendir", Err(last()));
                return;
            }
            let next = |dir: *mut libc::DIR| -> Option<String> {
                let e = libc::readdir(dir);
                (!e.is_null()).then(|| dirent(e).0)
            };
            let first = next(dir);
            for _ in 0..100 {
                next(dir);
            }
            let pos = libc::telldir(dir);
            let a: Vec<Option<String>> = (0..10).map(|_| next(dir)).collect();
            libc::seekdir(dir, pos);
            let b: Vec<Option<String>> = (0..10).map(|_| next(dir)).collect();
            self.truth(
                "readdir: seekdir to a telldir position",
                a == b && a.iter().all(|x| x.is_some()),
                (&a, &b),
            );
            libc::rewinddir(dir);
            self.check("readdir: rewinddir", next(dir), first);
            libc::closedir(dir);
        }
        // Entries removed during a listing: every remaining one exactly once.
        // SAFETY: `d` is a NUL-terminated CString; `dir` is used only between a
        // successful opendir and its closedir, and each dirent only before the
        // next readdir on it (`dirent`'s requirement).
        unsafe {
            let dir = libc::opendir(d.as_ptr());
            if dir.is_null() {
                self.must::<()>("readdir: opendir 2", Err(last()));
                return;
            }
            let mut seen = Vec::new();
            for _ in 0..10 {
                let e = libc::readdir(dir);
                if !e.is_null() {
                    seen.push(dirent(e).0);
                }
            }
            let mut removed = Vec::new();
            for i in (n / 2..n).step_by(7) {
                let name = format!("e{i:05}");
                if unlink(&self.p(&format!("many/{name}"))).is_ok() {
                    removed.push(name);
                }
            }
            loop {
                let e = libc::readdir(dir);
                if e.is_null() {
                    break;
                }
                seen.push(dirent(e).0);
            }
            libc::closedir(dir);
            let mut uniq = seen.clone();
            uniq.sort();
            uniq.dedup();
            // How many of the removed names a listing still shows is up to
            // the implementation (POSIX leaves it open): only that none
            // shows twice is checked, not the count.
            self.truth(
                "readdir: no duplicates while removing",
                uniq.len() == seen.len(),
                (uniq.len(), seen.len()),
            );
            let missing: Vec<&(String, u8)> = want
                .iter()
                .filter(|(w, _)| !removed.contains(w) && !seen.contains(w))
                .collect();
            self.check("readdir: no remaining entry skipped", missing.len(), 0);
            self.check(
                "readdir: removed",
                removed.len(),
                (n / 2..n).step_by(7).count(),
            );
        }
    }

    /// POSIX: creating, removing or renaming an entry updates the
    /// directory's mtime and ctime; writing into a file does not.
    pub(crate) fn dir_times(&mut self) {
        let t = self.p("times");
        let u = self.p("times2");
        if self
            .must(
                "dir times: mkdir",
                mkdir(&t, 0o755).and_then(|_| mkdir(&u, 0o755)),
            )
            .is_none()
        {
            return;
        }
        type Op<'a> = Box<dyn Fn() -> R<()> + 'a>;
        let f = self.p("times/f");
        let g = self.p("times/g");
        let sub = self.p("times/sub");
        let ln = self.p("times/ln");
        let far = self.p("times2/far");
        let steps: Vec<(&str, Op, Vec<&CStr>, bool)> = vec![
            ("create", Box::new(|| write_file(&f, b"f")), vec![&t], true),
            (
                "write into an existing file",
                Box::new(|| {
                    let fd = open(&f, libc::O_WRONLY | libc::O_APPEND, 0)?;
                    write(fd, b"more")?;
                    close(fd)
                }),
                vec![&t],
                false,
            ),
            (
                "chmod of an entry",
                // SAFETY: `f` is a NUL-terminated C string alive for the call.
                Box::new(|| ok(unsafe { libc::chmod(f.as_ptr(), 0o600) })),
                vec![&t],
                false,
            ),
            ("mkdir", Box::new(|| mkdir(&sub, 0o755)), vec![&t], true),
            ("symlink", Box::new(|| symlink("f", &ln)), vec![&t], true),
            ("rename within", Box::new(|| rename(&f, &g)), vec![&t], true),
            (
                "rename out of it (source)",
                Box::new(|| rename(&g, &far)),
                vec![&t, &u],
                true,
            ),
            (
                "rename back (target)",
                Box::new(|| rename(&far, &g)),
                vec![&t, &u],
                true,
            ),
            (
                "create in the other directory",
                Box::new(|| write_file(&far, b"far")),
                vec![&u],
                true,
            ),
            (
                "RENAME_EXCHANGE across directories",
                Box::new(|| renameat2(&g, &far, libc::RENAME_EXCHANGE)),
                vec![&t, &u],
                true,
            ),
            ("unlink", Box::new(|| unlink(&ln)), vec![&t], true),
            ("rmdir", Box::new(|| rmdir(&sub)), vec![&t], true),
        ];
        for (what, op, dirs, changes) in steps {
            let before: Vec<R<libc::stat>> = dirs.iter().map(|d| stat(d)).collect();
            pause();
            if let Err(e) = op() {
                self.must::<()>(&format!("dir times: {what}"), Err(e));
                continue;
            }
            for (i, d) in dirs.iter().enumerate() {
                let name = if *d == t.as_c_str() {
                    "times"
                } else {
                    "times2"
                };
                // The directory reached as a walk's last step, first (the
                // library walks through a directory whatever its times).
                let dot = std::ffi::CString::new([d.to_bytes(), b"/."].concat()).unwrap();
                let by_dot = stat(&dot).map(|s| mtime(&s));
                let (Ok(b), Ok(a)) = (before[i], stat(d)) else {
                    self.must::<()>(&format!("dir times: stat {name}"), Err(E(libc::EIO)));
                    continue;
                };
                if changes {
                    self.truth(
                        &format!("dir times: {what}: {name} mtime advanced"),
                        mtime(&a) > mtime(&b),
                        (mtime(&b), mtime(&a)),
                    );
                    self.truth(
                        &format!("dir times: {what}: {name}/. has them too"),
                        by_dot == Ok(mtime(&a)),
                        (mtime(&a), by_dot),
                    );
                    self.truth(
                        &format!("dir times: {what}: {name} ctime advanced"),
                        ctime(&a) > ctime(&b),
                        (ctime(&b), ctime(&a)),
                    );
                } else {
                    self.truth(
                        &format!("dir times: {what}: {name} mtime unchanged"),
                        mtime(&a) == mtime(&b),
                        (mtime(&b), mtime(&a)),
                    );
                }
            }
        }
    }
}
