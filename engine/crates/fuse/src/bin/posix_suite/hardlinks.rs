//! Hard links: several names of one inode (link, linkat), what changes
//! through one name shows through the others, link counts as names come
//! and go, and the refusals (EEXIST, EPERM for directories).

use crate::sys::*;
use crate::Suite;

fn link(a: &CStr, b: &CStr) -> R<()> {
    // SAFETY: `a` and `b` are NUL-terminated C strings alive for the call.
    ok(unsafe { libc::link(a.as_ptr(), b.as_ptr()) })
}

/// (inode number equal to `ino`, link count, permission bits) of `p`.
fn id(p: &CStr, ino: u64) -> R<(bool, u64, u32)> {
    stat(p).map(|s| (s.st_ino == ino, s.st_nlink, s.st_mode & 0o7777))
}

impl Suite {
    pub(crate) fn hard_links(&mut self) {
        let (a, b, c) = (self.p("hl.a"), self.p("hl.b"), self.p("hl.c"));
        let body = pattern(41, 3000);
        if self.must("link: create", write_file(&a, &body)).is_none() {
            return;
        }
        let Some(ino) = self.must("link: stat", stat(&a)).map(|s| s.st_ino) else {
            return;
        };
        self.check("link", link(&a, &b), Ok(()));
        self.check(
            "link: one inode, 2 links",
            id(&b, ino),
            Ok((true, 2, 0o644)),
        );
        self.check(
            "linkat",
            // SAFETY: `b` and `c` are NUL-terminated C strings alive for the call.
            ok(unsafe { libc::linkat(libc::AT_FDCWD, b.as_ptr(), libc::AT_FDCWD, c.as_ptr(), 0) }),
            Ok(()),
        );
        self.check("linkat: 3 links", id(&a, ino), Ok((true, 3, 0o644)));
        self.check(
            "link: the data through another name",
            read_file(&c).map(|d| fp(&d)),
            Ok(fp(&body)),
        );
        // Changes through one name show through the others.
        let more = pattern(42, 700);
        if let Some(fd) = self.must(
            "link: open a name",
            open(&b, libc::O_WRONLY | libc::O_APPEND, 0),
        ) {
            self.check(
                "link: append through a name",
                write_all(fd, &more),
                Ok(more.len()),
            );
            self.check("link: close", close(fd), Ok(()));
        }
        let mut model = body.clone();
        model.extend_from_slice(&more);
        self.check(
            "link: appended, read through another",
            read_file(&a).map(|d| fp(&d)),
            Ok(fp(&model)),
        );
        self.check(
            "link: chmod a name",
            // SAFETY: `c` is a NUL-terminated C string alive for the call.
            ok(unsafe { libc::chmod(c.as_ptr(), 0o600) }),
            Ok(()),
        );
        self.check(
            "link: mode through another",
            id(&a, ino),
            Ok((true, 3, 0o600)),
        );
        // Refusals.
        self.check(
            "link: onto an existing name",
            link(&a, &c),
            Err(E(libc::EEXIST)),
        );
        let d = self.p("hl.dir");
        if self.must("link: mkdir", mkdir(&d, 0o755)).is_some() {
            self.check(
                "link: a directory",
                link(&d, &self.p("hl.dirlink")),
                Err(E(libc::EPERM)),
            );
            self.check("link: rmdir", rmdir(&d), Ok(()));
        }
        self.check(
            "link: a missing file",
            link(&self.p("hl.none"), &self.p("hl.x")),
            Err(E(libc::ENOENT)),
        );
        // Names go one by one; renaming one name onto another of the same
        // file does nothing (POSIX).
        self.check(
            "link: rename onto another name of it",
            rename(&b, &c),
            Ok(()),
        );
        self.check(
            "link: both names stay",
            (id(&b, ino), id(&c, ino)),
            (Ok((true, 3, 0o600)), Ok((true, 3, 0o600))),
        );
        self.check("link: unlink one", unlink(&a), Ok(()));
        self.check("link: 2 left", id(&b, ino), Ok((true, 2, 0o600)));
        let fd = self.must("link: open the last but one", open(&c, libc::O_RDONLY, 0));
        self.check("link: unlink another", unlink(&b), Ok(()));
        self.check(
            "link: 1 left, data intact",
            (id(&c, ino), read_file(&c).map(|d| fp(&d))),
            (Ok((true, 1, 0o600)), Ok(fp(&model))),
        );
        self.check("link: unlink the last", unlink(&c), Ok(()));
        if let Some(fd) = fd {
            self.check(
                "link: open after the last name went: 0 links, data readable",
                (
                    fstat(fd).map(|s| s.st_nlink),
                    pread(fd, model.len(), 0).map(|d| fp(&d)),
                ),
                (Ok(0), Ok(fp(&model))),
            );
            self.check("link: close the orphan", close(fd), Ok(()));
        }
        self.check(
            "link: every name gone",
            stat(&c).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
    }
}
