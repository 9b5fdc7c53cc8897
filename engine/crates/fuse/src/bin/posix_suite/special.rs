//! Special files (FIFOs, unix sockets, character and block device nodes)
//! and link counts (directories: 2 + subdirectories; every directory of
//! the tree checked at the end).

use crate::sys::*;
use crate::Suite;

fn mknod(p: &CStr, mode: u32, dev: u64) -> R<()> {
    // SAFETY: `p` is a NUL-terminated C string alive for the call.
    ok(unsafe { libc::mknod(p.as_ptr(), mode, dev) })
}

fn mkfifo(p: &CStr, mode: u32) -> R<()> {
    // SAFETY: `p` is a NUL-terminated C string alive for the call.
    ok(unsafe { libc::mkfifo(p.as_ptr(), mode) })
}

fn kind(st: &libc::stat) -> &'static str {
    match st.st_mode & libc::S_IFMT {
        libc::S_IFIFO => "fifo",
        libc::S_IFSOCK => "socket",
        libc::S_IFCHR => "char device",
        libc::S_IFBLK => "block device",
        libc::S_IFREG => "file",
        libc::S_IFDIR => "directory",
        libc::S_IFLNK => "symlink",
        _ => "unknown",
    }
}

/// Type, permission bits, link count, size and (for devices) major:minor.
fn shape(p: &CStr) -> R<String> {
    let st = lstat(p)?;
    let mut s = format!(
        "{} {:o} nlink {} size {}",
        kind(&st),
        st.st_mode & 0o7777,
        st.st_nlink,
        st.st_size
    );
    if matches!(st.st_mode & libc::S_IFMT, libc::S_IFCHR | libc::S_IFBLK) {
        s += &format!(
            " dev {}:{}",
            libc::major(st.st_rdev),
            libc::minor(st.st_rdev)
        );
    }
    Ok(s)
}

fn nlink(p: &CStr) -> R<u64> {
    lstat(p).map(|s| s.st_nlink)
}

fn is_root() -> bool {
    // SAFETY: geteuid takes no arguments and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

/// A unix stream socket bound to `path` (relative to the current directory).
fn bound_socket(path: &str) -> R<c_int> {
    // SAFETY: socket takes only integers.
    let fd = okv(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) })?;
    let (addr, len) = sun(path);
    // SAFETY: `addr` is a live sockaddr_un and `len` is no larger than it (see `sun`).
    if let Err(e) = ok(unsafe { libc::bind(fd, &addr as *const _ as *const libc::sockaddr, len) }) {
        let _ = close(fd);
        return Err(e);
    }
    Ok(fd)
}

fn sun(path: &str) -> (libc::sockaddr_un, libc::socklen_t) {
    // SAFETY: `libc::sockaddr_un` is plain integers, for which all zeroes is valid.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, s) in addr.sun_path.iter_mut().zip(path.as_bytes()) {
        *d = *s as c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + path.len() + 1;
    (addr, len as libc::socklen_t)
}

fn connect(path: &str) -> R<c_int> {
    // SAFETY: socket takes only integers.
    let fd = okv(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0) })?;
    let (addr, len) = sun(path);
    // SAFETY: `addr` is a live sockaddr_un and `len` is no larger than it (see `sun`).
    match ok(unsafe { libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) }) {
        Ok(()) => Ok(fd),
        Err(e) => {
            let _ = close(fd);
            Err(e)
        }
    }
}

impl Suite {
    pub(crate) fn special_files(&mut self) {
        let d = self.p("special");
        if self.must("special: mkdir", mkdir(&d, 0o755)).is_none() {
            return;
        }
        // FIFOs: mkfifo and mknod, and the kernel's rules for opening one.
        let fifo = self.p("special/fifo");
        self.check("mkfifo", mkfifo(&fifo, 0o640), Ok(()));
        self.check(
            "mkfifo: lstat",
            shape(&fifo),
            Ok("fifo 640 nlink 1 size 0".into()),
        );
        self.check(
            "mkfifo: an existing name",
            mkfifo(&fifo, 0o640),
            Err(E(libc::EEXIST)),
        );
        self.check(
            "fifo: O_WRONLY|O_NONBLOCK without a reader",
            open(&fifo, libc::O_WRONLY | libc::O_NONBLOCK, 0).map(|_| ()),
            Err(E(libc::ENXIO)),
        );
        if let Some(r) = self.must(
            "fifo: open the read end",
            open(&fifo, libc::O_RDONLY | libc::O_NONBLOCK, 0),
        ) {
            self.check(
                "fifo: read end, no writer yet: end of file",
                read(r, 16),
                Ok(vec![]),
            );
            if let Some(w) = self.must(
                "fifo: open the write end",
                open(&fifo, libc::O_WRONLY | libc::O_NONBLOCK, 0),
            ) {
                self.check(
                    "fifo: fstat of the write end",
                    fstat(w).map(|s| (s.st_mode & libc::S_IFMT, s.st_nlink)),
                    Ok((libc::S_IFIFO, 1)),
                );
                self.check("fifo: write", write(w, b"through the fifo"), Ok(16));
                self.check(
                    "fifo: lstat size stays 0",
                    lstat(&fifo).map(|s| s.st_size),
                    Ok(0),
                );
                self.check("fifo: read", read(r, 64), Ok(b"through the fifo".to_vec()));
                self.check("fifo: close the write end", close(w), Ok(()));
            }
            self.check("fifo: end of file", read(r, 16), Ok(vec![]));
            self.check("fifo: close the read end", close(r), Ok(()));
        }
        let fifo2 = self.p("special/fifo2");
        self.check(
            "mknod S_IFIFO",
            mknod(&fifo2, libc::S_IFIFO | 0o600, 0),
            Ok(()),
        );
        self.check(
            "mknod S_IFIFO: lstat",
            shape(&fifo2),
            Ok("fifo 600 nlink 1 size 0".into()),
        );
        let reg = self.p("special/reg");
        self.check(
            "mknod S_IFREG",
            mknod(&reg, libc::S_IFREG | 0o644, 0),
            Ok(()),
        );
        self.check(
            "mknod S_IFREG: lstat",
            shape(&reg),
            Ok("file 644 nlink 1 size 0".into()),
        );

        // Device nodes: CAP_MKNOD's (the kernel checks it); opening one is
        // refused on a nodev mount (peregrine-fuse mounts nodev, as FUSE does).
        let (chr, blk) = (self.p("special/null"), self.p("special/loop7"));
        let want = if is_root() {
            Ok(())
        } else {
            Err(E(libc::EPERM))
        };
        let made = mknod(&chr, libc::S_IFCHR | 0o666, libc::makedev(1, 3));
        self.check("mknod S_IFCHR 1:3", made, want);
        let made_b = mknod(&blk, libc::S_IFBLK | 0o660, libc::makedev(7, 0x10007));
        self.check("mknod S_IFBLK 7:65543", made_b, want);
        if is_root() {
            self.check(
                "char device: lstat",
                shape(&chr),
                Ok("char device 644 nlink 1 size 0 dev 1:3".into()),
            );
            self.check(
                "block device: lstat",
                shape(&blk),
                Ok("block device 640 nlink 1 size 0 dev 7:65543".into()),
            );
            self.check(
                "char device: open on a nodev mount",
                open(&chr, libc::O_RDONLY, 0).map(|_| ()),
                Err(E(libc::EACCES)),
            );
        } else {
            println!("device nodes: not root (EPERM checked)");
        }

        // A unix socket bound in the mount; a client connects through it.
        let mut cwd = vec![0u8; 4096];
        // SAFETY: `cwd` is a live buffer of the length passed; NULL comes back on failure.
        let here = unsafe { libc::getcwd(cwd.as_mut_ptr() as *mut c_char, cwd.len()) };
        if self
            // SAFETY: `d` is a NUL-terminated C string alive for the call.
            .must("socket: chdir", ok(unsafe { libc::chdir(d.as_ptr()) }))
            .is_some()
        {
            if let Some(srv) = self.must("socket: bind", bound_socket("sock")) {
                {
                    self.check(
                        "socket: lstat",
                        shape(&self.p("special/sock")),
                        Ok("socket 755 nlink 1 size 0".into()),
                    );
                    self.check(
                        "socket: bind an existing name",
                        bound_socket("sock").map(|fd| {
                            let _ = close(fd);
                        }),
                        Err(E(libc::EADDRINUSE)),
                    );
                    self.check(
                        "socket: listen",
                        // SAFETY: listen takes only integers (a bad descriptor is an error, not UB).
                        ok(unsafe { libc::listen(srv, 4) }),
                        Ok(()),
                    );
                    if let Some(cl) = self.must("socket: connect", connect("sock")) {
                        // SAFETY: NULL address and length: accept returns no peer address.
                        let acc = okv(unsafe {
                            libc::accept(srv, std::ptr::null_mut(), std::ptr::null_mut())
                        });
                        self.check("socket: accept", acc.map(|_| ()), Ok(()));
                        if let Ok(a) = acc {
                            self.check("socket: send", write(cl, b"over the socket"), Ok(15));
                            self.check(
                                "socket: receive",
                                read(a, 64),
                                Ok(b"over the socket".to_vec()),
                            );
                            let _ = close(a);
                        }
                        let _ = close(cl);
                    }
                    self.check(
                        "socket: open(2) of a socket",
                        open(&self.p("special/sock"), libc::O_RDONLY, 0).map(|_| ()),
                        Err(E(libc::ENXIO)),
                    );
                    let _ = close(srv);
                    self.check(
                        "socket: connect after the server closed",
                        connect("sock").map(|fd| {
                            let _ = close(fd);
                        }),
                        Err(E(libc::ECONNREFUSED)),
                    );
                }
            }
            if !here.is_null() {
                // SAFETY: `here` is non-NULL, so it points into `cwd`, NUL-terminated by getcwd.
                let _ = unsafe { libc::chdir(here) };
            }
        }

        // readdir reports the types.
        let mut types = list_dir(&d).map(|(v, _)| v).unwrap_or_default();
        types.sort();
        let want_types: Vec<(String, u8)> = [
            ("fifo", libc::DT_FIFO),
            ("fifo2", libc::DT_FIFO),
            ("loop7", libc::DT_BLK),
            ("null", libc::DT_CHR),
            ("reg", libc::DT_REG),
            ("sock", libc::DT_SOCK),
        ]
        .into_iter()
        .filter(|(n, _)| is_root() || !matches!(*n, "null" | "loop7"))
        .map(|(n, t)| (n.to_string(), t))
        .collect();
        self.check("special: readdir d_type", types, want_types);

        // chmod, chown, utimes, rename and unlink as for any entry.
        self.check(
            "fifo: chmod",
            // SAFETY: `fifo` is a NUL-terminated C string alive for the call.
            ok(unsafe { libc::chmod(fifo.as_ptr(), 0o604) }),
            Ok(()),
        );
        let (uid, gid) = if is_root() {
            (4321, 4322)
        } else {
            // SAFETY: geteuid/getegid take no arguments and cannot fail.
            unsafe { (libc::geteuid(), libc::getegid()) }
        };
        self.check(
            "fifo: chown",
            // SAFETY: `fifo` is a NUL-terminated C string alive for the call.
            ok(unsafe { libc::lchown(fifo.as_ptr(), uid, gid) }),
            Ok(()),
        );
        self.check(
            "fifo: after chmod and chown",
            lstat(&fifo).map(|s| (shape(&fifo), s.st_uid == uid, s.st_gid == gid)),
            Ok((Ok("fifo 604 nlink 1 size 0".into()), true, true)),
        );
        self.check(
            "fifo: utimes",
            utimens(&fifo, (1000, 0), (2000, 0), libc::AT_SYMLINK_NOFOLLOW)
                .and_then(|_| lstat(&fifo))
                .map(|s| mtime(&s)),
            Ok((2000, 0)),
        );
        let moved = self.p("special/fifo.moved");
        self.check("fifo: rename", rename(&fifo, &moved), Ok(()));
        self.check(
            "fifo: renamed",
            (shape(&moved), lstat(&fifo).map(|_| ())),
            (Ok("fifo 604 nlink 1 size 0".into()), Err(E(libc::ENOENT))),
        );
        self.check(
            "fifo: rename over another fifo",
            rename(&moved, &fifo2),
            Ok(()),
        );
        self.check(
            "fifo: the replaced one",
            shape(&fifo2),
            Ok("fifo 604 nlink 1 size 0".into()),
        );
        let dir = self.p("special.d");
        self.check(
            "fifo: rename onto a directory",
            mkdir(&dir, 0o755).and_then(|_| rename(&fifo2, &dir)),
            Err(E(libc::EISDIR)),
        );
        if is_root() {
            let chr2 = self.p("special/null.moved");
            self.check("char device: rename", rename(&chr, &chr2), Ok(()));
            self.check(
                "char device: renamed",
                shape(&chr2),
                Ok("char device 644 nlink 1 size 0 dev 1:3".into()),
            );
            self.check("char device: unlink", unlink(&chr2), Ok(()));
        }
        self.check("fifo: unlink", unlink(&fifo2), Ok(()));
        self.check(
            "fifo: unlinked",
            lstat(&fifo2).map(|_| ()),
            Err(E(libc::ENOENT)),
        );
        self.check(
            "special: left in the tree",
            names(&d),
            Ok(if is_root() {
                vec!["loop7".into(), "reg".into(), "sock".into()]
            } else {
                vec!["reg".into(), "sock".into()]
            }),
        );
        // One FIFO stays for the tree comparison (and tools walking it).
        self.check("fifo: one to keep", mkfifo(&fifo, 0o644), Ok(()));
    }

    pub(crate) fn link_counts(&mut self) {
        let d = self.p("nl");
        if self.must("nlink: mkdir", mkdir(&d, 0o755)).is_none() {
            return;
        }
        self.check("nlink: an empty directory", nlink(&d), Ok(2));
        for s in ["a", "b", "c"] {
            let _ = mkdir(&self.p(&format!("nl/{s}")), 0o755);
        }
        let _ = write_file(&self.p("nl/f"), b"f");
        let _ = symlink("a", &self.p("nl/l"));
        let _ = mkfifo(&self.p("nl/p"), 0o644);
        self.check("nlink: 3 subdirectories", nlink(&d), Ok(5));
        self.check("nlink: a file", nlink(&self.p("nl/f")), Ok(1));
        self.check("nlink: a symlink", nlink(&self.p("nl/l")), Ok(1));
        self.check("nlink: a fifo", nlink(&self.p("nl/p")), Ok(1));
        self.check(
            "nlink: through the symlink",
            stat(&self.p("nl/l")).map(|s| s.st_nlink),
            Ok(2),
        );
        if let Ok(fd) = open(&d, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
            self.check(
                "nlink: fstat of the directory",
                fstat(fd).map(|s| s.st_nlink),
                Ok(5),
            );
            let _ = close(fd);
        }
        self.check("nlink: rmdir", rmdir(&self.p("nl/c")), Ok(()));
        self.check("nlink: after rmdir", nlink(&d), Ok(4));
        self.check(
            "nlink: rename within",
            rename(&self.p("nl/a"), &self.p("nl/a2")),
            Ok(()),
        );
        self.check("nlink: after rename within", nlink(&d), Ok(4));
        let e = self.p("nl2");
        let _ = mkdir(&e, 0o755);
        self.check(
            "nlink: rename to another directory",
            rename(&self.p("nl/b"), &self.p("nl2/b")),
            Ok(()),
        );
        self.check(
            "nlink: after rename across",
            (nlink(&d), nlink(&e)),
            (Ok(3), Ok(3)),
        );
        let _ = mkdir(&self.p("nl/empty"), 0o755);
        self.check(
            "nlink: rename over an empty directory",
            rename(&self.p("nl2/b"), &self.p("nl/empty")),
            Ok(()),
        );
        self.check(
            "nlink: after rename over a directory",
            (nlink(&d), nlink(&e)),
            (Ok(4), Ok(2)),
        );
        self.check(
            "nlink: exchange a directory and a file",
            renameat2(&self.p("nl/empty"), &self.p("nl/f"), libc::RENAME_EXCHANGE)
                .and_then(|_| renameat2(&self.p("nl/f"), &self.p("nl2/f"), 0)),
            Ok(()),
        );
        self.check(
            "nlink: after exchange and move",
            (nlink(&d), nlink(&e)),
            (Ok(3), Ok(3)),
        );
        self.check(
            "nlink: a file and a fifo moved",
            rename(&self.p("nl/p"), &self.p("nl2/p"))
                .and_then(|_| rename(&self.p("nl/empty"), &self.p("nl2/g"))),
            Ok(()),
        );
        self.check(
            "nlink: files do not count",
            (nlink(&d), nlink(&e)),
            (Ok(3), Ok(3)),
        );
    }

    /// Every directory of the tree reports 2 + its subdirectories (run
    /// last, over what every section left).
    pub(crate) fn tree_link_counts(&mut self) {
        let mut bad = Vec::new();
        let mut dirs = 0;
        let mut stack = vec![self.base.clone()];
        while let Some(p) = stack.pop() {
            dirs += 1;
            let c = cs(&p);
            let subs: Vec<PathBuf> = list_dir(&c)
                .map(|(v, _)| v)
                .unwrap_or_default()
                .into_iter()
                .filter(|(_, t)| *t == libc::DT_DIR)
                .map(|(n, _)| p.join(n))
                .collect();
            let want = 2 + subs.len() as u64;
            let got = nlink(&c);
            if got != Ok(want) {
                bad.push(format!("{}: {got:?}, want {want}", p.display()));
            }
            stack.extend(subs);
        }
        self.truth(
            "nlink: every directory of the tree is 2 + subdirectories",
            bad.is_empty() && dirs > 10,
            (dirs, bad),
        );
    }
}
