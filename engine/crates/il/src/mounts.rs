//! Which devices are Peregrine mounts, and where they are mounted
//! (`fuse.peregrine` in /proc/self/mountinfo).
//!
//! The table is reread when the kernel says the mount table changed: an
//! fd on /proc/self/mountinfo polls `POLLPRI` after every mount or unmount
//! in the namespace (one `poll` with a zero timeout per path-based call).
//! (Not a poll armed once in an io_uring, read without a system call: a
//! poll armed by a thread that has since exited never completes.)

use crate::real::{r_close, r_open, r_read};
use libc::{c_int, c_void};
use peregrine::sync::Mutex;
use std::ops::Range;

/// One `fuse.peregrine` mount.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Mnt {
    /// st_dev (major, minor).
    pub(crate) dev: (u32, u32),
    /// The mount id (mountinfo's first field; statx's `stx_mnt_id`).
    pub(crate) id: u64,
    /// Where the mount's root is in the container (`/` unless a bind
    /// mount of a subdirectory), as components.
    pub(crate) root: Vec<Vec<u8>>,
    /// Without `allow_other`, the kernel lets only the mounting user
    /// (`user_id=`) in: the library serves no one else.
    pub(crate) only: Option<u32>,
}

/// A mount point in mountinfo order; `pg` when it is a Peregrine mount.
#[derive(Debug)]
struct Point {
    comps: Vec<Vec<u8>>,
    pg: Option<Mnt>,
}

pub(crate) struct Mounts {
    /// st_dev (major, minor) of `fuse.peregrine` mounts.
    peregrine: Vec<(u32, u32)>,
    /// Anonymous devices known not to be Peregrine mounts.
    other: Vec<(u32, u32)>,
    loaded: bool,
    /// Every mount point (for path-based calls), in mountinfo order.
    points: Vec<Point>,
    /// The fd polled for changes (-1: none yet).
    watch: c_int,
}

pub(crate) static MOUNTS: Mutex<Mounts> = Mutex::new(Mounts {
    peregrine: Vec::new(),
    other: Vec::new(),
    loaded: false,
    points: Vec::new(),
    watch: -1,
});

/// /proc/self/mountinfo through the real open/read/close.
fn read_mountinfo() -> Vec<u8> {
    let mut out = Vec::new();
    // SAFETY: real calls on our own fd and buffer.
    unsafe {
        let fd = r_open()(
            c"/proc/self/mountinfo".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
            0,
        );
        if fd < 0 {
            return out;
        }
        let mut buf = [0u8; 16384];
        loop {
            let n = r_read()(fd, buf.as_mut_ptr() as *mut c_void, buf.len());
            if n <= 0 {
                break;
            }
            out.extend_from_slice(&buf[..n as usize]);
        }
        r_close()(fd);
    }
    out
}

/// mountinfo escapes space, tab, newline and backslash as `\ooo`.
fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = (s[i + 1] - b'0') as u32 * 64
                + (s[i + 2] - b'0') as u32 * 8
                + (s[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// The components of a path ("" and "/" have none).
fn comps(p: &[u8]) -> Vec<Vec<u8>> {
    p.split(|&c| c == b'/')
        .filter(|c| !c.is_empty())
        .map(|c| c.to_vec())
        .collect()
}

/// An absolute path and where its components are in it: split once, with
/// no copy of each (a path call is a few hundred nanoseconds).
pub(crate) struct AbsPath {
    bytes: Vec<u8>,
    comps: Vec<Range<usize>>,
}

impl AbsPath {
    pub(crate) fn new(bytes: Vec<u8>) -> AbsPath {
        let mut comps = Vec::with_capacity(8);
        let mut start = 0;
        for (i, &c) in bytes.iter().chain(std::iter::once(&b'/')).enumerate() {
            if c == b'/' {
                if i > start {
                    comps.push(start..i);
                }
                start = i + 1;
            }
        }
        AbsPath { bytes, comps }
    }

    pub(crate) fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// How many components it has.
    pub(crate) fn len(&self) -> usize {
        self.comps.len()
    }

    /// Component `i`.
    pub(crate) fn comp(&self, i: usize) -> &[u8] {
        &self.bytes[self.comps[i].clone()]
    }

    /// The path of its first `n` components, `/` before each.
    pub(crate) fn prefix(&self, n: usize) -> Vec<u8> {
        joined((0..n).map(|i| self.comp(i)))
    }
}

/// The absolute path of these components, `/` before each (`/` if none).
fn joined<'a>(comps: impl Iterator<Item = &'a [u8]>) -> Vec<u8> {
    let mut v = Vec::new();
    for c in comps {
        v.push(b'/');
        v.extend_from_slice(c);
    }
    if v.is_empty() {
        v.push(b'/');
    }
    v
}

/// `user_id` of a FUSE mount's super options unless `allow_other`.
fn only_user(opts: &[u8]) -> Option<u32> {
    let mut uid = None;
    for o in opts.split(|&c| c == b',') {
        if o == b"allow_other" {
            return None;
        }
        if let Some(v) = o.strip_prefix(b"user_id=") {
            uid = std::str::from_utf8(v).ok().and_then(|v| v.parse().ok());
        }
    }
    // Unreadable: nobody but root (uid 0 owns every mount made by mount(2)).
    Some(uid.unwrap_or(0))
}

/// The mount points of a mountinfo text.
fn parse(text: &[u8]) -> Vec<Point> {
    let mut v = Vec::new();
    for line in text.split(|&c| c == b'\n') {
        let f: Vec<&[u8]> = line.split(|&c| c == b' ').collect();
        let Some(sep) = f.iter().position(|x| *x == b"-") else {
            continue;
        };
        if f.len() < 5 || sep < 5 {
            continue;
        }
        let comps = comps(&unescape(f[4]));
        let pg = (f.get(sep + 1) == Some(&&b"fuse.peregrine"[..]))
            .then(|| {
                let (a, b) = std::str::from_utf8(f[2]).ok()?.split_once(':')?;
                Some(Mnt {
                    dev: (a.parse().ok()?, b.parse().ok()?),
                    id: std::str::from_utf8(f[0]).ok()?.parse().ok()?,
                    root: self::comps(&unescape(f[3])),
                    only: only_user(f.get(sep + 3).copied().unwrap_or(b"")),
                })
            })
            .flatten();
        v.push(Point { comps, pg });
    }
    v
}

impl Mounts {
    fn reload(&mut self) {
        self.points = parse(&read_mountinfo());
        self.peregrine = self
            .points
            .iter()
            .filter_map(|p| p.pg.as_ref().map(|m| m.dev))
            .collect();
        self.loaded = true;
    }

    /// Reread the table if the kernel reports a change (or on first use).
    /// The same poll looks at descriptors 0-2 too: true if one of them is
    /// closed (a served open must then leave the call to the kernel,
    /// place.rs), one system call for both questions.
    fn fresh(&mut self) -> bool {
        if self.watch < 0 {
            self.watch = watch();
            self.reload();
        }
        let mut p = [self.watch, 0, 1, 2].map(|fd| libc::pollfd {
            fd,
            events: 0,
            revents: 0,
        });
        p[0].events = libc::POLLPRI;
        // SAFETY: poll of our four pollfds with no wait.
        let n = unsafe { libc::poll(p.as_mut_ptr(), 4, 0) };
        // A closed descriptor answers POLLNVAL, whatever was asked.
        let std_free = n > 0 && p[1..].iter().any(|x| x.revents & libc::POLLNVAL != 0);
        if p[0].revents != 0 || !self.loaded {
            if p[0].revents & libc::POLLNVAL != 0 {
                // Closed by the program (closefrom): watch again.
                self.watch = -1;
                return self.fresh();
            }
            self.reload();
        }
        std_free
    }

    /// After fork: the child shares the parent's watch descriptor, whose
    /// change state is per open file; it gets its own.
    pub(crate) fn forget_watch(&mut self) {
        if self.watch >= 0 {
            // SAFETY: our own descriptor.
            unsafe { r_close()(self.watch) };
        }
        self.watch = -1;
        self.loaded = false;
    }
}

/// A new watch of /proc/self/mountinfo (-1: none), moved out of the way of
/// the program's low descriptors, its current state taken as seen.
fn watch() -> c_int {
    // SAFETY: real open of a proc file, fcntl and close of our own
    // descriptors, poll of it with no wait.
    unsafe {
        let fd = r_open()(
            c"/proc/self/mountinfo".as_ptr(),
            libc::O_RDONLY | libc::O_CLOEXEC,
            0,
        );
        if fd < 0 {
            return -1;
        }
        let hi = libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 800);
        let fd = if hi >= 0 {
            r_close()(fd);
            hi
        } else {
            fd
        };
        let mut p = libc::pollfd {
            fd,
            events: libc::POLLPRI,
            revents: 0,
        };
        libc::poll(&mut p, 1, 0);
        fd
    }
}

/// The Peregrine mount an absolute path leads to, the path's components,
/// and how many of them the mount point takes; None if the path's mount
/// (the longest mount point that is a prefix of it, the latest such
/// mount) is not a Peregrine mount. Lexical: a path through a symlink
/// into a mount is not recognised (the caller then uses the kernel path,
/// which is right). Also whether one of descriptors 0-2 is closed
/// ([`Mounts::fresh`]).
pub(crate) fn mount_of(path: &AbsPath) -> Option<(Mnt, usize, bool)> {
    let mut m = MOUNTS.lock();
    let std_free = m.fresh();
    if m.peregrine.is_empty() {
        return None;
    }
    pick(&m.points, path).map(|(mnt, below)| (mnt, below, std_free))
}

/// The Peregrine mount with device `dev`.
pub(crate) fn by_dev(dev: (u32, u32)) -> Option<Mnt> {
    let mut m = MOUNTS.lock();
    m.fresh();
    m.points
        .iter()
        .rev()
        .find_map(|p| p.pg.as_ref().filter(|g| g.dev == dev).cloned())
}

/// The paths of the Peregrine mount points, the latest mounted first.
pub(crate) fn peregrine_points() -> Vec<Vec<u8>> {
    let mut m = MOUNTS.lock();
    m.fresh();
    m.points
        .iter()
        .rev()
        .filter(|p| p.pg.is_some())
        .map(|p| joined(p.comps.iter().map(Vec::as_slice)))
        .collect()
}

/// The mount of `path` (components): the longest mount point that is a
/// prefix of it, the latest of equal ones (mounted on top); with the
/// number of components the mount point takes, if it is a Peregrine mount.
fn pick(points: &[Point], path: &AbsPath) -> Option<(Mnt, usize)> {
    let mut best: Option<&Point> = None;
    for p in points {
        if p.comps.len() <= path.len()
            && p.comps
                .iter()
                .enumerate()
                .all(|(i, c)| c[..] == *path.comp(i))
            && best.is_none_or(|b| p.comps.len() >= b.comps.len())
        {
            best = Some(p);
        }
    }
    let b = best?;
    Some((b.pg.clone()?, b.comps.len()))
}

/// Is `dev` a Peregrine mount? Reread mountinfo on a miss (once per
/// unknown anonymous device).
pub(crate) fn is_peregrine_dev(dev: (u32, u32)) -> bool {
    if dev.0 != 0 {
        // FUSE mounts use anonymous (major 0) devices.
        return false;
    }
    let mut m = MOUNTS.lock();
    if m.peregrine.contains(&dev) {
        return true;
    }
    if m.loaded && m.other.contains(&dev) {
        return false;
    }
    m.reload();
    if m.peregrine.contains(&dev) {
        m.other.retain(|d| *d != dev);
        return true;
    }
    if m.other.len() < 4096 {
        m.other.push(dev);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_devices() {
        let t = b"22 1 0:21 / /proc rw - proc proc rw\n\
                  99 30 0:77 / /mnt/a\\040b rw,nosuid - fuse.peregrine peregrine rw,user_id=0\n\
                  100 30 0:78 / /mnt/c rw - fuse.sshfs x rw\n\
                  101 99 0:79 / /mnt/a\\040b/t rw - tmpfs t rw\n\
                  102 30 0:80 /sub /mnt/d rw - fuse.peregrine peregrine rw\n";
        let p = parse(t);
        let devs: Vec<_> = p
            .iter()
            .filter_map(|p| p.pg.as_ref().map(|m| m.dev))
            .collect();
        assert_eq!(devs, vec![(0, 77), (0, 80)]);
        assert_eq!(p[1].comps, vec![b"mnt".to_vec(), b"a b".to_vec()]);
        assert_eq!(p[1].pg.as_ref().unwrap().id, 99);
        assert_eq!(p[4].pg.as_ref().unwrap().root, vec![b"sub".to_vec()]);
        assert_eq!(p[1].pg.as_ref().unwrap().only, Some(0));
        assert_eq!(
            only_user(b"rw,user_id=1000,group_id=1000,allow_other"),
            None
        );
        assert_eq!(only_user(b"rw,user_id=1000,group_id=1000"), Some(1000));
        assert_eq!(unescape(b"a\\134b\\011"), b"a\\b\t");
        let at = |x: &[u8]| pick(&p, &AbsPath::new(x.to_vec())).map(|(m, n)| (m.dev, n));
        assert_eq!(at(b"/mnt/a b/x/y"), Some(((0, 77), 2)));
        assert_eq!(at(b"/mnt/a b"), Some(((0, 77), 2)));
        // A tmpfs mounted inside the Peregrine mount shadows it.
        assert_eq!(at(b"/mnt/a b/t/y"), None);
        assert_eq!(at(b"/mnt/c/y"), None);
        assert_eq!(at(b"/etc"), None);
        assert_eq!(at(b"//mnt//d/"), Some(((0, 80), 2)));
    }

    #[test]
    fn a_path_splits_into_its_components() {
        let p = AbsPath::new(b"//mnt/a b//c/".to_vec());
        let c: Vec<&[u8]> = (0..p.len()).map(|i| p.comp(i)).collect();
        assert_eq!(c, [&b"mnt"[..], b"a b", b"c"]);
        assert_eq!(p.prefix(2), b"/mnt/a b");
        assert_eq!(p.prefix(0), b"/");
        assert_eq!(AbsPath::new(b"/".to_vec()).len(), 0);
        assert_eq!(AbsPath::new(b"/x".to_vec()).comp(0), b"x");
    }
}
