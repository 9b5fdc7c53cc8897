//! Path resolution for the path calls the library serves: which mount a
//! path is in, its components below the mount point, and the walk through
//! them with the kernel's permission checks (search permission on every
//! directory walked). Whatever the walk cannot settle as the kernel would
//! (a symlink on the way, `..` above the mount root, a relative path
//! against a directory fd, a permission the mode bits deny: capabilities
//! may still allow it) makes the caller use the kernel path: [`W::Fall`].

use crate::cache;
use crate::mounts::{mount_of, AbsPath};
use crate::ns::{self, Ns};
use libc::{c_char, c_int};
use peregrine_dfs::{Entry, Node};
use std::cell::OnceCell;
use std::sync::Arc;

/// What a step of a path call came to.
pub(crate) enum W<T> {
    /// Use the kernel path.
    Fall,
    /// Fail with this errno (what the kernel would answer).
    Err(c_int),
    Ok(T),
}

/// `?` for [`W`].
macro_rules! w {
    ($e:expr) => {
        match $e {
            $crate::walk::W::Ok(v) => v,
            $crate::walk::W::Fall => return $crate::walk::W::Fall,
            $crate::walk::W::Err(e) => return $crate::walk::W::Err(e),
        }
    };
}
pub(crate) use w;

/// Errors the library answers itself; any other (a transport or engine
/// failure) sends the call to the kernel path, or for a change that may
/// have happened, EIO.
pub(crate) fn posix(code: c_int) -> bool {
    matches!(
        code,
        libc::ENOENT
            | libc::EEXIST
            | libc::ENOTDIR
            | libc::EISDIR
            | libc::ENOTEMPTY
            | libc::ENAMETOOLONG
            | libc::EINVAL
            | libc::EROFS
            | libc::ENOSPC
            | libc::EDQUOT
            | libc::EACCES
            | libc::EPERM
            | libc::EXDEV
            | libc::EBUSY
    )
}

/// A path in a Peregrine mount the library serves.
pub(crate) struct Loc {
    pub(crate) ns: Arc<Ns>,
    /// The absolute path (lexical: no symlink on it resolved).
    path: AbsPath,
    /// Its first component below the mount point.
    below: usize,
    /// The path ends with `/`.
    pub(crate) slash: bool,
    /// The caller's effective uid, asked once per call.
    euid: u32,
}

fn cwd() -> Option<Vec<u8>> {
    let mut b = vec![0u8; 4096];
    // SAFETY: getcwd into our buffer (the system call: no interposer).
    let n = unsafe { libc::syscall(libc::SYS_getcwd, b.as_mut_ptr(), b.len()) };
    if n <= 0 || b[0] != b'/' {
        return None; // unreachable cwd ("(unreachable)/...") or error
    }
    b.truncate(n as usize - 1);
    Some(b)
}

/// Where `path` (relative to `dirfd`) lies, if in a Peregrine mount the
/// library can serve.
pub(crate) unsafe fn locate(dirfd: c_int, path: *const c_char) -> Option<Loc> {
    locate_any(dirfd, path, false)
}

/// [`locate`] for an open: None also if descriptor 0, 1 or 2 is closed.
/// An open must then return that descriptor, as the kernel's lowest free
/// one (`close(1); open(...)` redirects stdout), and the kernel opens it;
/// asked before the library's own work (connecting to the container)
/// could take the number first.
pub(crate) unsafe fn locate_open(dirfd: c_int, path: *const c_char) -> Option<Loc> {
    locate_any(dirfd, path, true)
}

unsafe fn locate_any(dirfd: c_int, path: *const c_char, open: bool) -> Option<Loc> {
    if path.is_null() {
        return None;
    }
    let p = std::ffi::CStr::from_ptr(path).to_bytes();
    if p.is_empty() || p.len() >= libc::PATH_MAX as usize {
        return None;
    }
    let abs = if p[0] == b'/' {
        p.to_vec()
    } else if dirfd == libc::AT_FDCWD {
        let mut a = cwd()?;
        a.push(b'/');
        a.extend_from_slice(p);
        a
    } else {
        return None;
    };
    let path = AbsPath::new(abs);
    let (mnt, below, std_free) = mount_of(&path)?;
    if open && std_free {
        return None;
    }
    let euid = libc::geteuid();
    if mnt.only.is_some_and(|uid| uid != euid) {
        return None;
    }
    let ns = ns::get(&mnt, || path.prefix(below))?;
    Some(Loc {
        ns,
        path,
        below,
        slash: p.ends_with(b"/"),
        euid,
    })
}

impl Loc {
    /// The absolute path (from the cwd if it was relative).
    pub(crate) fn abs(&self) -> &[u8] {
        self.path.bytes()
    }

    /// The mount point the path is under.
    pub(crate) fn mount_point(&self) -> Vec<u8> {
        self.path.prefix(self.below)
    }

    /// The caller's effective identity (fsuid and fsgid, as the kernel
    /// checks permissions).
    pub(crate) fn cred(&self) -> Cred {
        Cred {
            uid: self.euid,
            gid: OnceCell::new(),
            real: false,
        }
    }
}

/// The entry `name` of directory `dir` (None: no such entry).
pub(crate) fn lookup(ns: &Ns, dir: &Node, name: &[u8]) -> W<Option<Arc<Node>>> {
    if let Some(n) = cache::dent(ns.key(), dir.oid(), name) {
        return W::Ok(Some(n));
    }
    lookup_in_store(ns, dir, name)
}

/// As [`lookup`], for a caller that uses only the node's identity, type,
/// owner and mode ([`cache::dent_identity`]): a directory on the way, or
/// a name about to be removed.
pub(crate) fn lookup_identity(ns: &Ns, dir: &Node, name: &[u8]) -> W<Option<Arc<Node>>> {
    if let Some(n) = cache::dent_identity(ns.key(), dir.oid(), name) {
        return W::Ok(Some(n));
    }
    lookup_in_store(ns, dir, name)
}

fn lookup_in_store(ns: &Ns, dir: &Node, name: &[u8]) -> W<Option<Arc<Node>>> {
    match ns.dfs.lookup(dir, name) {
        Ok(n) => {
            let n = Arc::new(n);
            cache::put_dent(ns.key(), n.clone());
            W::Ok(Some(n))
        }
        Err(e) if -e.code == libc::ENOENT => W::Ok(None),
        Err(e) if -e.code == libc::ENAMETOOLONG => W::Err(libc::ENAMETOOLONG),
        Err(_) => W::Fall,
    }
}

/// The mount's root directory (the container's root, or the subdirectory
/// a bind mount shows). `current`: with its times as fresh as the cache
/// allows (a stat of the root); else as a walk through it needs it, its
/// identity and mode, which a create in the root (moving its times) leaves
/// alone, as [`lookup_identity`] for the directories below.
fn root(ns: &Ns, current: bool) -> W<Arc<Node>> {
    let r = &ns.root;
    let below = &ns.mnt.root;
    let cached = match current && below.is_empty() {
        true => cache::dent(ns.key(), r.parent, &r.name),
        false => cache::dent_identity(ns.key(), r.parent, &r.name),
    };
    let mut n = match cached {
        Some(n) => n,
        None => match ns.dfs.refresh(r) {
            Ok(n) => {
                let n = Arc::new(n);
                cache::put_dent(ns.key(), n.clone());
                n
            }
            Err(_) => return W::Fall,
        },
    };
    for (i, c) in below.iter().enumerate() {
        let found = match current && i + 1 == below.len() {
            true => lookup(ns, &n, c),
            false => lookup_identity(ns, &n, c),
        };
        n = match w!(found) {
            Some(x) if x.is_dir() => x,
            _ => return W::Fall,
        };
    }
    W::Ok(n)
}

/// The caller's identity for permission checks: effective ids (fsuid and
/// fsgid, as the kernel uses), or the real ones (access(2)).
pub(crate) struct Cred {
    uid: u32,
    /// Asked of the kernel when a check or a create first needs it: most
    /// calls walk directories their caller owns (one system call less).
    gid: OnceCell<u32>,
    real: bool,
}

impl Cred {
    pub(crate) fn real() -> Cred {
        Cred {
            // SAFETY: an id query.
            uid: unsafe { libc::getuid() },
            gid: OnceCell::new(),
            real: true,
        }
    }
    pub(crate) fn uid(&self) -> u32 {
        self.uid
    }
    pub(crate) fn gid(&self) -> u32 {
        // SAFETY: id queries.
        *self.gid.get_or_init(|| unsafe {
            match self.real {
                true => libc::getgid(),
                false => libc::getegid(),
            }
        })
    }

    fn in_group(&self, g: u32) -> bool {
        if g == self.gid() {
            return true;
        }
        let mut v = [0 as libc::gid_t; 256];
        // SAFETY: getgroups into our buffer.
        let n = unsafe { libc::getgroups(v.len() as c_int, v.as_mut_ptr()) };
        n > 0 && v[..n as usize].contains(&g)
    }

    /// Do the mode bits of `e` grant `mask` (4 read, 2 write, 1 search or
    /// execute)? No capability is assumed, root's included: a "no" sends
    /// the call to the kernel, which knows the capabilities.
    pub(crate) fn may(&self, e: &Entry, mask: u32) -> bool {
        let bits = if self.uid == e.uid {
            e.mode >> 6
        } else if self.in_group(e.gid) {
            e.mode >> 3
        } else {
            e.mode
        };
        bits & mask & 7 == mask
    }
}

/// Where a walk ended.
pub(crate) struct At {
    /// The directories from the mount root to the last one walked into
    /// (the parent of `name`, or the node itself when `name` is None).
    pub(crate) chain: Vec<Arc<Node>>,
    /// The last component when it is a name (not `.` or `..`).
    pub(crate) name: Option<Vec<u8>>,
}

impl At {
    pub(crate) fn dir(&self) -> &Node {
        self.chain.last().expect("the chain holds the mount root")
    }
}

/// Walk every component of `loc` but the last, checking search permission
/// on each directory walked into; the last is named, not looked up.
pub(crate) fn walk_parent(loc: &Loc, cred: &Cred) -> W<At> {
    let (ns, path) = (&*loc.ns, &loc.path);
    let mut chain = Vec::with_capacity(path.len() - loc.below + 1);
    chain.push(w!(root(ns, false)));
    if path.len() == loc.below {
        return W::Ok(At { chain, name: None });
    }
    let last = path.len() - 1;
    for i in loc.below..last {
        w!(step(ns, &mut chain, path.comp(i), cred));
    }
    match path.comp(last) {
        b"." => W::Ok(At { chain, name: None }),
        b".." => {
            if chain.len() < 2 {
                return W::Fall; // leaves the mount
            }
            chain.pop();
            W::Ok(At { chain, name: None })
        }
        name => {
            if !cred.may(&chain.last().unwrap().entry, 1) {
                return W::Fall;
            }
            W::Ok(At {
                chain,
                name: Some(name.to_vec()),
            })
        }
    }
}

fn step(ns: &Ns, chain: &mut Vec<Arc<Node>>, c: &[u8], cred: &Cred) -> W<()> {
    match c {
        b"." => W::Ok(()),
        b".." => {
            if chain.len() < 2 {
                return W::Fall;
            }
            chain.pop();
            W::Ok(())
        }
        _ => {
            let dir = chain.last().unwrap();
            if !cred.may(&dir.entry, 1) {
                return W::Fall;
            }
            // Only the directory's identity and mode matter on the way:
            // its times moving here (a create in it) needs no new lookup.
            match w!(lookup_identity(ns, dir, c)) {
                None => W::Err(libc::ENOENT),
                Some(n) if n.is_dir() => {
                    chain.push(n);
                    W::Ok(())
                }
                Some(n) if n.entry.is_symlink() => W::Fall,
                Some(_) => W::Err(libc::ENOTDIR),
            }
        }
    }
}

/// The walk's last directory with its times and all as the cache has
/// them (the walk took it whatever its times: [`lookup_identity`]); the
/// kernel's if its name now names another object.
fn current(ns: &Ns, at: &At) -> W<Arc<Node>> {
    let n = at.dir();
    let [.., parent, _] = at.chain.as_slice() else {
        return root(ns, true);
    };
    match w!(lookup(ns, parent, &n.name)) {
        Some(x) if x.oid() == n.oid() => W::Ok(x),
        _ => W::Fall,
    }
}

/// Resolve a whole path to its node: (the walk, the node). A symlink at
/// the end is the node itself when `follow` is false, else the kernel's.
pub(crate) fn resolve(loc: &Loc, follow: bool, cred: &Cred) -> W<(At, Arc<Node>)> {
    let at = w!(walk_parent(loc, cred));
    let node = match &at.name {
        None => w!(current(&loc.ns, &at)),
        Some(name) => match w!(lookup(&loc.ns, at.dir(), name)) {
            None => return W::Err(libc::ENOENT),
            Some(n) => n,
        },
    };
    if node.entry.is_symlink() && (follow || loc.slash) {
        return W::Fall;
    }
    if loc.slash && !node.is_dir() {
        return W::Err(libc::ENOTDIR);
    }
    W::Ok((at, node))
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine::ObjectId;

    fn effective() -> Cred {
        Cred {
            // SAFETY: an id query.
            uid: unsafe { libc::geteuid() },
            gid: OnceCell::new(),
            real: false,
        }
    }

    fn entry(uid: u32, gid: u32, mode: u32) -> Entry {
        Entry {
            mode: libc::S_IFDIR | mode,
            uid,
            gid,
            atime: 0,
            mtime: 0,
            ctime: 0,
            oid: ObjectId { hi: 1, lo: 2 },
            chunk_size: 0,
            size_hint: 0,
            child_class: 0,
            target: Vec::new(),
            moving: None,
            from: None,
            rdev: 0,
            linked: false,
            subdirs_counted: false,
        }
    }

    #[test]
    fn credentials_check_owner_group_and_others_bits() {
        // SAFETY: id queries.
        let (euid, egid, gid) = unsafe { (libc::geteuid(), libc::getegid(), libc::getgid()) };
        let c = effective();
        assert_eq!((c.uid(), c.gid()), (euid, egid));
        assert_eq!(Cred::real().gid(), gid);
        let other = euid.wrapping_add(1);
        let not_ours = (0..).find(|g| *g != egid && !c.in_group(*g)).unwrap();
        // The owner's bits, whatever the group's and others' say.
        assert!(effective().may(&entry(euid, not_ours, 0o500), 5));
        assert!(!effective().may(&entry(euid, egid, 0o077), 1));
        // Another owner: the group's bits when the group is ours (asked of
        // the kernel only then), else the others'.
        assert!(effective().may(&entry(other, egid, 0o070), 7));
        assert!(!effective().may(&entry(other, egid, 0o707), 1));
        assert!(effective().may(&entry(other, not_ours, 0o001), 1));
        assert!(!effective().may(&entry(other, not_ours, 0o770), 1));
    }
}
