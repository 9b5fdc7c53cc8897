//! Peregrine DFS: POSIX files and directories over Peregrine objects (as
//! DAOS DFS). Used by `peregrine-fuse` and, for file I/O, by the
//! interception library ([`File`] needs only a container, an object id and
//! a chunk size).
//!
//! # Layout (version [`LAYOUT_VERSION`])
//! - **Superblock**: object `(dir_oclass, hi 0, lo 0)`. dkey `"sb"` akey
//!   `"layout"` = `"PRGDFS"` + version (u32 LE) + root OID (hi, lo LE).
//!   dkey `"/"` akey `"inode"` is the root directory's [`Entry`] (its
//!   xattrs are `"x:"` akeys of that dkey), so the root is addressed like
//!   any other entry: (parent = superblock, name = `"/"`). Mounting probes
//!   the container's current `dir_oclass` first, then every other class,
//!   so a later `dir_oclass` change does not lose the file system.
//! - **Root OID** is fixed, `(dir_oclass, 0, 1)`: two first mounts racing
//!   write the same layout value and the same root OID; each then reads
//!   the superblock back and adopts what the store holds (at worst the
//!   root's timestamps of the later writer).
//! - **Directory**: an object with one dkey per entry name. akey `"inode"`
//!   holds the entry ([`Entry::encode`]: mode, uid, gid, a/m/ctime ns,
//!   object id, chunk size, size hint (not authoritative), inherited object
//!   class, symlink target, rename intent and origin, device number,
//!   flags; version 3, versions 1 and 2 still read); xattrs are akeys
//!   `"x:" + name` of the same dkey. A directory's own attributes live in its parent's entry;
//!   creating, removing or renaming an entry in a directory sets the
//!   directory's mtime and ctime there (one read and one write of that
//!   entry after the operation, last writer wins).
//! - **File**: an array object; byte `o` is in dkey = chunk index
//!   `o / chunk_size` (8 bytes big-endian, so dkeys sort in file order)
//!   akey `"d"` at offset `o % chunk_size`; chunks spread over the class's
//!   groups by dkey hash. The size is derived from the store every time it
//!   matters: highest chunk dkey with data, times chunk size, plus that
//!   chunk's array size (engine: highest byte written + 1). Several writers
//!   on several clients therefore agree without a shared counter. A file
//!   extended without data (truncate up, fallocate) gets one zero byte at
//!   `size - 1`; a shrink punches whole chunks past the size and rewrites
//!   the kept prefix of the last chunk.
//! - **OID allocation**: each mount draws a random non-zero 56-bit `hi`
//!   and counts `lo` up from 1; the class byte is the top byte of `hi`
//!   (ObjectId::new). No central counter, no round trip; two mounts collide
//!   only if they draw the same 56-bit number (p ~ n^2 / 2^57). `hi = 0` is
//!   reserved for the superblock and the root.
//! - **Special files**: FIFOs, sockets and character and block device
//!   nodes ([`Dfs::mknod`]) are entries with their type and mode, and a
//!   device node's number in [`Entry::rdev`]; no object is behind them
//!   (the id is unique, for inode numbers). What opening one does is the
//!   kernel's (a pipe, a socket, a device driver): FUSE serves it once
//!   lookup and getattr report the type and device number.
//! - **Subdirectory count**: a directory's own object holds, in dkey `"."`
//!   (never an entry name; listings leave it out), akey `"n"` = the number
//!   of its subdirectories (u64 LE; absent = 0) and akey `"lock"` while a
//!   client changes it (see "Link counts").
//! - **Object classes**: files use the container's `oclass`, directories
//!   its `dir_oclass`; a directory's xattr `user.peregrine.oclass` (stored
//!   in its entry, shown as an xattr) overrides both for new entries below
//!   it, and new subdirectories inherit the override.
//!
//! # Consistency (documented limits)
//! New directory entries (`create`, `mkdir`, `symlink`, the destination of
//! `rename(NOREPLACE)`) are written with a conditional insert
//! ([`Object::insert_single`]: the engine fails it with `EEXIST` if the
//! name's `"inode"` akey has a value), so they are atomic against other
//! clients too: of several mounts creating one name, exactly one wins and
//! the others get `EEXIST` (a non-exclusive `create` opens the winner's
//! file). The directory's first shard that is up and in arbitrates (see
//! [`Object::insert_single`]), so creates go on while a replica is out.
//! Threads of one [`Dfs`] are also
//! serialized by striped locks by parent and name. Rename of a directory
//! into its own subtree is not checked here (the kernel checks it for FUSE).
//!
//! # Link counts
//! A directory reports `st_nlink` = 2 + its subdirectories, as Linux file
//! systems do (`find` and other tools use it); anything else reports 1
//! (the FUSE daemon reports 0 for a file removed while open). The count
//! is kept, not computed: listing a directory to count its subdirectories
//! would make every stat of a large directory cost a read of all its
//! entries. It lives in the directory's own object (see "Layout"), not in
//! its entry, for three reasons: the entry is rewritten by unlocked
//! read-modify-writes (directory times, chmod, renames) whose last writer
//! wins, which would lose counts; a rename of the directory does not move
//! it; and stat stays one entry fetch plus one fetch of the count,
//! whatever the directory holds. mkdir, rmdir and renames of directories
//! change it after their entry change: a locked read-modify-write, the
//! lock a conditional insert (akey `"lock"`), so two mounts making or
//! removing subdirectories of one directory at once serialize on it and
//! lose no counts; changes within one mount are summed and applied
//! together. What can still drift, documented rather than prevented (the
//! engine has no atomic add or compare-and-swap, and a transaction cannot
//! hold a conditional insert): a client killed, or an engine failure,
//! between an entry change and its count change leaves the count off by
//! that change (the count is never made negative: it stops at 0); a
//! client that stalls for longer than the lock's lease (5 s) between
//! taking the lock and writing the count can overwrite a change another
//! client made after taking the lock over; a client killed holding the
//! lock delays that directory's count changes until the lease passes.
//! Only `st_nlink` of that directory is then wrong (by the changes lost),
//! never the namespace; a count too low could make a tool that trusts it
//! (find's leaf optimization, where find enables it) miss a subdirectory,
//! which is why the windows are only these: a crash or a failed write in
//! the middle of an operation, or a stall past the lease. Directories
//! made before counts existed (entries of version 1 and 2) report 1, the
//! "not counted" value tools recognise (find does not optimize below 2),
//! and keep doing so.
//!
//! # Renames
//! A rename changes two entries, possibly in two directory objects on two
//! engines, and the engine makes only single-value updates atomic. So a
//! rename is a small roll-forward protocol whose every step is one atomic
//! update, and a client killed between any two steps leaves one name per
//! object, never two (removing one of two names would punch the object the
//! other still names):
//! 0. the source entry is claimed by a conditional insert (of several
//!    clients renaming one entry, one wins; the others get `EBUSY`);
//! 1. the source entry gets an intent ([`Move`]: where it goes, when, and
//!    for `RENAME_EXCHANGE` the destination's entry and xattrs);
//! 2. the destination is written: the entry, its xattrs, and `from` naming
//!    the source. The destination naming the source's object is the
//!    rename's commit point (object ids are unique and never hard-linked);
//! 3. the source is punched (exchange: the destination's old entry is
//!    written there, and the claim removed).
//!
//! Whoever reads an entry with an intent settles it first (`Dfs::settle`):
//! committed, it finishes step 3; not committed, the entry stands as it
//! was (the rename is in flight), and once the intent is older than the
//! lease (30 s) the rename counts as abandoned and the intent is removed.
//! Before an entry with `from` is removed, replaced or renamed again, its
//! source is settled, so an abandoned source can never come back naming an
//! object that is gone. What is still not atomic across clients: a rename
//! whose client stalls for longer than the lease (30 s) between its steps
//! can be undone or taken over under it, and a client killed after step 0
//! leaves the entry unrenamable (`EBUSY`) until the lease passes. Closing
//! those needs multi-object transactions in the engine (as DAOS DTX).

use parking_lot::{Condvar, Mutex, MutexGuard};
use peregrine::{Container, Error, Object, ObjectClass, ObjectId, Result};
use peregrine_proto::mgmt::{ContQueryReq, PoolQueryReq};
use peregrine_proto::oclass::ALL_CLASSES;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

pub const LAYOUT_VERSION: u32 = 1;
/// Longest entry name, as Linux NAME_MAX.
pub const NAME_MAX: usize = 255;
/// Longest xattr value stored.
pub const XATTR_SIZE_MAX: usize = 64 << 10;
/// The xattr naming a directory's object class for new entries.
pub const OCLASS_XATTR: &str = "user.peregrine.oclass";
pub const DEFAULT_CHUNK_SIZE: u64 = 1 << 20;

const SB_DKEY: &[u8] = b"sb";
const SB_LAYOUT: &[u8] = b"layout";
const SB_MAGIC: &[u8] = b"PRGDFS";
const ROOT_NAME: &[u8] = b"/";
const INODE: &[u8] = b"inode";
/// Akey of a rename's claim on its source entry (when it started, ns):
/// written by conditional insert, so one of several clients renaming one
/// entry wins it.
const RENAME_CLAIM: &[u8] = b"rename";
const XPREFIX: &[u8] = b"x:";
/// The akey of file data in each chunk dkey.
pub const DATA_AKEY: &[u8] = b"d";
const LOCKS: usize = 256;
/// The dkey of a directory's own object that holds its subdirectory count
/// (akey [`SUBDIRS`]) and the count's lock (akey [`SUBDIRS_LOCK`]): "." is
/// no entry's name, and listings of the directory leave it out.
const COUNT_DKEY: &[u8] = b".";
const SUBDIRS: &[u8] = b"n";
const SUBDIRS_LOCK: &[u8] = b"lock";
/// A subdirectory-count lock older than this is taken as left by a client
/// that died holding it, and taken over.
const COUNT_LOCK_LEASE_NS: i64 = 5_000_000_000;
const READDIR_PARALLEL: usize = 8;

pub const RENAME_NOREPLACE: u32 = libc::RENAME_NOREPLACE;
pub const RENAME_EXCHANGE: u32 = libc::RENAME_EXCHANGE;

fn err(code: i32, msg: impl Into<String>) -> Error {
    Error::new(-code, msg)
}

/// Nanoseconds since the Unix epoch, now.
pub fn now_ns() -> i64 {
    match SystemTime::now().duration_since(UNIX_EPOCH) {
        Ok(d) => d.as_nanos() as i64,
        Err(e) => -(e.duration().as_nanos() as i64),
    }
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}

/// One directory entry (the inode of whatever it names).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// File type and permission bits (`S_IFDIR | 0o755`, ...).
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    /// Times in nanoseconds since the Unix epoch.
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    /// The file's array object or the directory's object (symlinks get a
    /// unique id with no object, for inode numbers).
    pub oid: ObjectId,
    /// Chunk size of a file (copied from the container at creation).
    pub chunk_size: u64,
    /// Size last recorded by a client; NOT authoritative (see [`File::size`]).
    pub size_hint: u64,
    /// Directories: object class id for new entries below (0 = container default).
    pub child_class: u8,
    /// Symlink target.
    pub target: Vec<u8>,
    /// Set while a rename moves this entry away (see "Renames" in the
    /// module docs): the rename is done once the destination names the
    /// same object.
    pub moving: Option<Box<Move>>,
    /// Where a rename moved this entry from: that source entry may still
    /// hold the rename's intent, to be settled before this one goes away.
    pub from: Option<(ObjectId, Vec<u8>)>,
    /// Character and block devices: the device number (`st_rdev`, as
    /// `makedev` encodes it); 0 for everything else.
    pub rdev: u64,
    /// Directories: the directory keeps a count of its subdirectories
    /// (see "Link counts" in the module docs). False for directories made
    /// before counts existed (entry versions 1 and 2): they report
    /// `st_nlink` 1, "not counted", as file systems without counts do.
    pub subdirs_counted: bool,
}

/// An entry's xattrs: (akey with the "x:" prefix, value).
pub type Xattrs = Vec<(Vec<u8>, Vec<u8>)>;

/// A rename's intent, kept in its source entry until the rename is done.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    pub to_dir: ObjectId,
    pub to_name: Vec<u8>,
    /// When the rename started (ns); also the ctime it gives.
    pub since: i64,
    /// RENAME_EXCHANGE: the destination's entry and xattrs, which come here.
    pub exchange: Option<(Entry, Xattrs)>,
}

/// Version 1 entries end after the symlink target; version 2 adds the
/// rename fields; version 3 adds the device number and a flags byte (bit
/// 0: [`Entry::subdirs_counted`]). All three are read; version 3 is
/// written (a build that reads only versions 1 and 2 refuses version 3
/// entries as corrupt instead of misreading them).
const ENTRY_VERSION: u8 = 3;
const ENTRY_SUBDIRS_COUNTED: u8 = 1;
/// A rename whose intent is older than this and whose destination does not
/// name its object is taken as abandoned (its client died) and undone.
const RENAME_LEASE_NS: i64 = 30_000_000_000;

impl Entry {
    pub fn is_dir(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFDIR
    }
    pub fn is_file(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFREG
    }
    pub fn is_symlink(&self) -> bool {
        self.mode & libc::S_IFMT == libc::S_IFLNK
    }
    /// A FIFO, a socket, or a character or block device node: an entry
    /// with no object behind it (the kernel serves what opening it does).
    pub fn is_special(&self) -> bool {
        is_special_mode(self.mode)
    }

    /// Little-endian, versioned encoding stored in akey `"inode"`.
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(80 + self.target.len());
        b.push(ENTRY_VERSION);
        b.extend_from_slice(&self.mode.to_le_bytes());
        b.extend_from_slice(&self.uid.to_le_bytes());
        b.extend_from_slice(&self.gid.to_le_bytes());
        b.extend_from_slice(&self.atime.to_le_bytes());
        b.extend_from_slice(&self.mtime.to_le_bytes());
        b.extend_from_slice(&self.ctime.to_le_bytes());
        put_oid(&mut b, self.oid);
        b.extend_from_slice(&self.chunk_size.to_le_bytes());
        b.extend_from_slice(&self.size_hint.to_le_bytes());
        b.push(self.child_class);
        put_bytes(&mut b, &self.target);
        match &self.moving {
            None => b.push(0),
            Some(m) => {
                b.push(1);
                put_oid(&mut b, m.to_dir);
                put_bytes(&mut b, &m.to_name);
                b.extend_from_slice(&m.since.to_le_bytes());
                match &m.exchange {
                    None => b.push(0),
                    Some((e, xs)) => {
                        b.push(1);
                        put_bytes(&mut b, &e.encode());
                        b.extend_from_slice(&(xs.len() as u32).to_le_bytes());
                        for (k, v) in xs {
                            put_bytes(&mut b, k);
                            put_bytes(&mut b, v);
                        }
                    }
                }
            }
        }
        match &self.from {
            None => b.push(0),
            Some((dir, name)) => {
                b.push(1);
                put_oid(&mut b, *dir);
                put_bytes(&mut b, name);
            }
        }
        b.extend_from_slice(&self.rdev.to_le_bytes());
        b.push(if self.subdirs_counted {
            ENTRY_SUBDIRS_COUNTED
        } else {
            0
        });
        b
    }

    pub fn decode(b: &[u8]) -> Result<Entry> {
        let bad = || {
            err(
                libc::EIO,
                format!("corrupt directory entry ({} bytes)", b.len()),
            )
        };
        let version = *b.first().ok_or_else(bad)?;
        if !(1..=ENTRY_VERSION).contains(&version) {
            return Err(bad());
        }
        let mut r = Reader(&b[1..]);
        let mut fields = || -> Option<Entry> {
            let mut e = Entry {
                mode: r.u32()?,
                uid: r.u32()?,
                gid: r.u32()?,
                atime: r.u64()? as i64,
                mtime: r.u64()? as i64,
                ctime: r.u64()? as i64,
                oid: r.oid()?,
                chunk_size: r.u64()?,
                size_hint: r.u64()?,
                child_class: r.u8()?,
                target: r.bytes()?,
                moving: None,
                from: None,
                rdev: 0,
                subdirs_counted: false,
            };
            if version >= 2 {
                (e.moving, e.from) = decode_rename_fields(&mut r)?;
            }
            if version >= 3 {
                e.rdev = r.u64()?;
                let flags = r.u8()?;
                if flags & !ENTRY_SUBDIRS_COUNTED != 0 {
                    return None;
                }
                e.subdirs_counted = flags & ENTRY_SUBDIRS_COUNTED != 0;
            }
            r.0.is_empty().then_some(e)
        };
        fields().ok_or_else(bad)
    }
}

fn put_bytes(b: &mut Vec<u8>, v: &[u8]) {
    b.extend_from_slice(&(v.len() as u32).to_le_bytes());
    b.extend_from_slice(v);
}

fn put_oid(b: &mut Vec<u8>, o: ObjectId) {
    b.extend_from_slice(&o.hi.to_le_bytes());
    b.extend_from_slice(&o.lo.to_le_bytes());
}

type RenameFields = (Option<Box<Move>>, Option<(ObjectId, Vec<u8>)>);

/// Reads the fields of an encoded entry; None past the end.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (h, t) = (self.0.get(..n)?, self.0.get(n..)?);
        self.0 = t;
        Some(h)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = self.u32()? as usize;
        Some(self.take(n)?.to_vec())
    }
    fn oid(&mut self) -> Option<ObjectId> {
        Some(ObjectId {
            hi: self.u64()?,
            lo: self.u64()?,
        })
    }
}

/// The fields version 2 adds: the rename intent and origin.
fn decode_rename_fields(r: &mut Reader<'_>) -> Option<RenameFields> {
    let moving = match r.u8()? {
        0 => None,
        1 => {
            let to_dir = r.oid()?;
            let to_name = r.bytes()?;
            let since = r.u64()? as i64;
            let exchange = match r.u8()? {
                0 => None,
                1 => {
                    let e = Entry::decode(&r.bytes()?).ok()?;
                    let n = r.u32()? as usize;
                    let mut xs = Vec::with_capacity(n.min(1024));
                    for _ in 0..n {
                        xs.push((r.bytes()?, r.bytes()?));
                    }
                    Some((e, xs))
                }
                _ => return None,
            };
            Some(Box::new(Move {
                to_dir,
                to_name,
                since,
                exchange,
            }))
        }
        _ => return None,
    };
    let from = match r.u8()? {
        0 => None,
        1 => Some((r.oid()?, r.bytes()?)),
        _ => return None,
    };
    Some((moving, from))
}

fn is_special_mode(mode: u32) -> bool {
    matches!(
        mode & libc::S_IFMT,
        libc::S_IFIFO | libc::S_IFSOCK | libc::S_IFCHR | libc::S_IFBLK
    )
}

/// A named entry: where it lives (parent directory object + name) and what
/// it was when last read. Cheap to clone; the FUSE daemon keeps one per
/// inode and updates it on rename.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    pub parent: ObjectId,
    pub name: Vec<u8>,
    pub entry: Entry,
}

impl Node {
    pub fn oid(&self) -> ObjectId {
        self.entry.oid
    }
    pub fn is_dir(&self) -> bool {
        self.entry.is_dir()
    }
}

/// Attributes as `stat` reports them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stat {
    pub mode: u32,
    pub uid: u32,
    pub gid: u32,
    pub size: u64,
    pub blocks: u64,
    pub atime: i64,
    pub mtime: i64,
    pub ctime: i64,
    pub oid: ObjectId,
    pub chunk_size: u64,
    /// Link count: 1 for a non-directory (0 is the caller's to report for
    /// a file removed while open), 2 + subdirectories for a directory
    /// whose subdirectories are counted, 1 for one made before counts.
    pub nlink: u32,
    /// Device number of a character or block device node.
    pub rdev: u64,
}

/// What [`Dfs::setattr`] changes; `None` leaves a field alone.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub mode: Option<u32>,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub size: Option<u64>,
    pub atime: Option<i64>,
    pub mtime: Option<i64>,
}

impl SetAttr {
    /// Set the mode bits, owner and times asked for on `e` (the size is
    /// the caller's: it lives in the file's object); `now` becomes its ctime.
    pub fn apply_to(&self, e: &mut Entry, now: i64) {
        if let Some(m) = self.mode {
            e.mode = (e.mode & libc::S_IFMT) | (m & 0o7777);
        }
        if let Some(u) = self.uid {
            e.uid = u;
        }
        if let Some(g) = self.gid {
            e.gid = g;
        }
        if let Some(t) = self.atime {
            e.atime = t;
        }
        if let Some(t) = self.mtime {
            e.mtime = t;
        }
        e.ctime = now;
    }
}

/// File system figures for `statfs`.
#[derive(Clone, Debug)]
pub struct StatFs {
    pub bsize: u32,
    pub blocks: u64,
    pub bfree: u64,
    pub bavail: u64,
    pub files: u64,
    pub ffree: u64,
    pub namelen: u32,
}

/// A snapshot of a directory's names taken at open: cookies are positions
/// in it (1-based; 0 = start), so they stay valid while entries are added
/// or removed (added ones are not shown, removed ones are skipped).
#[derive(Debug)]
pub struct DirHandle {
    pub dir: ObjectId,
    names: Vec<Vec<u8>>,
}

impl DirHandle {
    pub fn len(&self) -> usize {
        self.names.len()
    }
    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }
}

/// One entry returned by [`Dfs::readdir`].
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub name: Vec<u8>,
    /// Pass this cookie to resume after this entry.
    pub cookie: u64,
    pub entry: Entry,
}

struct Inner {
    cont: Container,
    sb: ObjectId,
    root: Node,
    read_only: bool,
    file_class: ObjectClass,
    dir_class: ObjectClass,
    chunk_size: u64,
    oid_hi: u64,
    next_lo: AtomicU64,
    locks: Vec<Mutex<()>>,
    /// Directory time updates in progress, by directory ([`Dfs::touch_dir`]).
    touches: Mutex<HashMap<ObjectId, Arc<Touch>>>,
    /// Subdirectory count changes in progress, by directory ([`Dfs::adjust_subdirs`]).
    counts: Mutex<HashMap<ObjectId, Arc<CountBatch>>>,
    /// [`RENAME_LEASE_NS`]; tests shorten it.
    rename_lease_ns: std::sync::atomic::AtomicI64,
    /// Tests: the rename step after which renames stop, as a killed client would.
    stop_rename_after: Mutex<Option<&'static str>>,
}

/// Granularity of directory times set by entry changes (as Linux's coarse
/// clock for file times at HZ=250): one stamp per directory and tick.
pub const DIR_TIME_TICK_NS: i64 = 4_000_000;

/// The time updates of one directory: requests are numbered; a round
/// stamps the directory once for every request made before it started
/// (group commit), and a round started in the current tick covers every
/// request of that tick.
#[derive(Default)]
struct Touch {
    st: Mutex<TouchState>,
    done: Condvar,
}

/// The subdirectory count changes of one directory: changes made while a
/// round runs are summed and applied by the next round (one locked
/// read-modify-write of the count for all of them).
#[derive(Default)]
struct CountBatch {
    st: Mutex<CountState>,
    done: Condvar,
}

#[derive(Default)]
struct CountState {
    pending: i64,
    requested: u64,
    covered: u64,
    running: bool,
}

#[derive(Default)]
struct TouchState {
    requested: u64,
    /// Requests up to this number are covered by a finished round.
    covered: u64,
    running: bool,
    /// Tick in which the last finished round started (0: none).
    tick: i64,
}

/// A mounted POSIX namespace in one container. Cheap to clone.
#[derive(Clone)]
pub struct Dfs {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Dfs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dfs")
            .field("cont", &self.inner.cont.uuid())
            .field("read_only", &self.inner.read_only)
            .finish()
    }
}

fn parse_class(field: &str, v: &str, dflt: ObjectClass) -> Result<ObjectClass> {
    if v.is_empty() {
        return Ok(dflt);
    }
    v.parse::<ObjectClass>()
        .map_err(|e| Error::inval(format!("container property {field}: {e}")))
}

fn layout_value(root: ObjectId) -> Vec<u8> {
    let mut v = SB_MAGIC.to_vec();
    v.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
    v.extend_from_slice(&root.hi.to_le_bytes());
    v.extend_from_slice(&root.lo.to_le_bytes());
    v
}

fn parse_layout(v: &[u8]) -> Result<ObjectId> {
    if v.len() != SB_MAGIC.len() + 20 || !v.starts_with(SB_MAGIC) {
        return Err(err(libc::EIO, "superblock: bad magic or length"));
    }
    let p = SB_MAGIC.len();
    let ver = u32::from_le_bytes(v[p..p + 4].try_into().unwrap());
    if ver != LAYOUT_VERSION {
        return Err(err(
            libc::EPROTO,
            format!("superblock: layout version {ver}, this build reads {LAYOUT_VERSION}"),
        ));
    }
    let hi = u64::from_le_bytes(v[p + 4..p + 12].try_into().unwrap());
    let lo = u64::from_le_bytes(v[p + 12..p + 20].try_into().unwrap());
    Ok(ObjectId { hi, lo })
}

/// Chunk dkey of chunk `idx`.
pub fn chunk_dkey(idx: u64) -> [u8; 8] {
    idx.to_be_bytes()
}

fn chunk_index(dkey: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(dkey.try_into().ok()?))
}

fn check_name(name: &[u8]) -> Result<()> {
    if name.len() > NAME_MAX {
        return Err(err(
            libc::ENAMETOOLONG,
            format!("name of {} bytes exceeds {NAME_MAX}", name.len()),
        ));
    }
    if name.is_empty() || name.contains(&b'/') || name.contains(&0) || name == b"." || name == b".."
    {
        return Err(Error::inval(format!("invalid entry name {:?}", show(name))));
    }
    Ok(())
}

fn xattr_akey(name: &[u8]) -> Vec<u8> {
    [XPREFIX, name].concat()
}

impl Dfs {
    /// Mount the POSIX namespace of `cont`; create it when absent and
    /// `create` is set (idempotent, safe for racing first mounts).
    pub fn mount(cont: Container, create: bool, read_only: bool) -> Result<Dfs> {
        let info = cont.info().clone();
        let file_class = parse_class("oclass", &info.oclass, ObjectClass::SX)?;
        let dir_class = parse_class("dir_oclass", &info.dir_oclass, ObjectClass::S1)?;
        let chunk_size = if info.chunk_size == 0 {
            DEFAULT_CHUNK_SIZE
        } else {
            info.chunk_size
        };
        let what = |e: Error| e.context(format!("container {:?}", cont.label()));
        // Find the superblock: current dir class first, then the others.
        let mut candidates = vec![dir_class];
        candidates.extend(ALL_CLASSES.iter().copied().filter(|c| *c != dir_class));
        let mut found = None;
        for c in candidates {
            let oid = ObjectId::new(c, 0, 0);
            let Ok(obj) = cont.object(oid) else { continue };
            if let Some(v) = obj.fetch_single(SB_DKEY, SB_LAYOUT).map_err(what)? {
                found = Some((oid, parse_layout(&v).map_err(what)?));
                break;
            }
        }
        let (sb, root_oid) = match found {
            Some(f) => f,
            None if !create || read_only => {
                return Err(what(err(
                    libc::ENOENT,
                    "no file system in this container (mount with create to make one)",
                )))
            }
            None => {
                let sb = ObjectId::new(dir_class, 0, 0);
                let root = ObjectId::new(dir_class, 0, 1);
                let obj = cont.object(sb).map_err(what)?;
                let t = now_ns();
                let e = Entry {
                    mode: libc::S_IFDIR | 0o755,
                    uid: unsafe { libc::geteuid() },
                    gid: unsafe { libc::getegid() },
                    atime: t,
                    mtime: t,
                    ctime: t,
                    oid: root,
                    chunk_size,
                    size_hint: 0,
                    child_class: 0,
                    target: vec![],
                    moving: None,
                    from: None,
                    rdev: 0,
                    subdirs_counted: true,
                };
                // Root entry first: a superblock never points at nothing.
                if obj.fetch_single(ROOT_NAME, INODE).map_err(what)?.is_none() {
                    obj.update_single(ROOT_NAME, INODE, &e.encode())
                        .map_err(what)?;
                }
                obj.update_single(SB_DKEY, SB_LAYOUT, &layout_value(root))
                    .map_err(what)?;
                // Adopt whatever the store holds now.
                let v = obj
                    .fetch_single(SB_DKEY, SB_LAYOUT)
                    .map_err(what)?
                    .ok_or_else(|| what(err(libc::EIO, "superblock vanished after writing it")))?;
                (sb, parse_layout(&v).map_err(what)?)
            }
        };
        let sb_obj = cont.object(sb).map_err(what)?;
        let root_entry = match sb_obj.fetch_single(ROOT_NAME, INODE).map_err(what)? {
            Some(v) => Entry::decode(&v).map_err(what)?,
            None => return Err(what(err(libc::EIO, "superblock without a root entry"))),
        };
        if root_entry.oid != root_oid {
            return Err(what(err(
                libc::EIO,
                format!(
                    "superblock names root {root_oid} but the root entry holds {}",
                    root_entry.oid
                ),
            )));
        }
        let oid_hi = loop {
            let h: u64 = rand::random::<u64>() & 0x00FF_FFFF_FFFF_FFFF;
            if h != 0 {
                break h;
            }
        };
        Ok(Dfs {
            inner: Arc::new(Inner {
                cont,
                sb,
                root: Node {
                    parent: sb,
                    name: ROOT_NAME.to_vec(),
                    entry: root_entry,
                },
                read_only,
                file_class,
                dir_class,
                chunk_size,
                oid_hi,
                next_lo: AtomicU64::new(1),
                locks: (0..LOCKS).map(|_| Mutex::new(())).collect(),
                touches: Mutex::new(HashMap::new()),
                counts: Mutex::new(HashMap::new()),
                rename_lease_ns: RENAME_LEASE_NS.into(),
                stop_rename_after: Mutex::new(None),
            }),
        })
    }

    pub fn container(&self) -> &Container {
        &self.inner.cont
    }
    pub fn read_only(&self) -> bool {
        self.inner.read_only
    }
    pub fn chunk_size(&self) -> u64 {
        self.inner.chunk_size
    }
    pub fn superblock(&self) -> ObjectId {
        self.inner.sb
    }
    /// The root as read at mount.
    pub fn root(&self) -> Node {
        self.inner.root.clone()
    }

    fn obj(&self, oid: ObjectId) -> Result<Object> {
        self.inner.cont.object(oid)
    }

    fn check_rw(&self) -> Result<()> {
        if self.inner.read_only {
            return Err(err(libc::EROFS, "file system mounted read-only"));
        }
        Ok(())
    }

    fn alloc_oid(&self, class: ObjectClass) -> ObjectId {
        let lo = self.inner.next_lo.fetch_add(1, Ordering::Relaxed);
        ObjectId::new(class, self.inner.oid_hi, lo)
    }

    fn lock_idx(parent: ObjectId, name: &[u8]) -> usize {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ parent.hi ^ parent.lo.rotate_left(17);
        for &b in name {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        (h % LOCKS as u64) as usize
    }

    /// Lock (parent, name) pairs in index order (deadlock-free).
    fn lock(&self, keys: &[(ObjectId, &[u8])]) -> Vec<MutexGuard<'_, ()>> {
        let mut idx: Vec<usize> = keys.iter().map(|(p, n)| Self::lock_idx(*p, n)).collect();
        idx.sort_unstable();
        idx.dedup();
        idx.into_iter()
            .map(|i| self.inner.locks[i].lock())
            .collect()
    }

    /// The entry at (parent, name), with any rename it is the source of
    /// settled ([`Dfs::settle`]).
    fn fetch_entry(&self, parent: ObjectId, name: &[u8]) -> Result<Option<Entry>> {
        match self.fetch_raw(parent, name)? {
            Some(e) if e.moving.is_some() => self.settle(parent, name, e),
            e => Ok(e),
        }
    }

    /// The entry at (parent, name) as stored.
    fn fetch_raw(&self, parent: ObjectId, name: &[u8]) -> Result<Option<Entry>> {
        match self.obj(parent)?.fetch_single(name, INODE)? {
            Some(v) => Entry::decode(&v)
                .map(Some)
                .map_err(|e| e.context(format!("entry {:?} of directory {parent}", show(name)))),
            None => Ok(None),
        }
    }

    fn put_entry(&self, parent: ObjectId, name: &[u8], e: &Entry) -> Result<()> {
        self.obj(parent)?.update_single(name, INODE, &e.encode())
    }

    /// Write a new entry only if the name is free (conditional insert,
    /// atomic across clients); `EEXIST` otherwise.
    fn insert_entry(&self, parent: ObjectId, name: &[u8], e: &Entry) -> Result<()> {
        self.obj(parent)?
            .insert_single(name, INODE, &e.encode())
            .map_err(|x| {
                if x.code == -libc::EEXIST {
                    err(libc::EEXIST, format!("{:?} exists", show(name)))
                } else {
                    x
                }
            })
    }

    fn class_for(&self, parent: &Node, dir: bool) -> ObjectClass {
        match ObjectClass::from_id(parent.entry.child_class) {
            Some(c) => c,
            None if dir => self.inner.dir_class,
            None => self.inner.file_class,
        }
    }

    fn need_dir(node: &Node) -> Result<()> {
        if !node.is_dir() {
            return Err(err(
                libc::ENOTDIR,
                format!("{:?} is not a directory", show(&node.name)),
            ));
        }
        Ok(())
    }

    /// Look `name` up in directory `parent`.
    pub fn lookup(&self, parent: &Node, name: &[u8]) -> Result<Node> {
        Self::need_dir(parent)?;
        check_name(name)?;
        match self.fetch_entry(parent.oid(), name)? {
            Some(entry) => Ok(Node {
                parent: parent.oid(),
                name: name.to_vec(),
                entry,
            }),
            None => Err(err(
                libc::ENOENT,
                format!("{:?}: no such entry", show(name)),
            )),
        }
    }

    /// Walk an absolute or root-relative path ("/a/b", "a/b").
    pub fn lookup_path(&self, path: &str) -> Result<Node> {
        let mut n = self.root();
        for c in path.split('/').filter(|c| !c.is_empty() && *c != ".") {
            n = self.lookup(&n, c.as_bytes())?;
        }
        Ok(n)
    }

    /// The entry as the store holds it now (ENOENT if removed).
    pub fn refresh(&self, node: &Node) -> Result<Node> {
        match self.fetch_entry(node.parent, &node.name)? {
            Some(entry) => Ok(Node {
                parent: node.parent,
                name: node.name.clone(),
                entry,
            }),
            None => Err(err(
                libc::ENOENT,
                format!("{:?}: entry removed", show(&node.name)),
            )),
        }
    }

    /// Attributes of `node`, re-read from the store (size from the file's
    /// chunks for regular files).
    pub fn getattr(&self, node: &Node) -> Result<(Node, Stat)> {
        let n = self.refresh(node)?;
        let st = self.stat_node(&n)?;
        Ok((n, st))
    }

    /// Attributes of a node as it was read (no second read of its entry):
    /// a file's size from its chunks, a directory's link count from its
    /// subdirectory count (one fetch from the directory's object, whatever
    /// the directory's size).
    pub fn stat_node(&self, n: &Node) -> Result<Stat> {
        let e = &n.entry;
        let size = if e.is_file() {
            File::new(&self.inner.cont, n.oid(), e.chunk_size, true)?.size()?
        } else if e.is_symlink() {
            e.target.len() as u64
        } else if e.is_dir() {
            4096
        } else {
            0
        };
        let mut st = self.stat_of(e, size);
        if e.is_dir() && e.subdirs_counted {
            st.nlink = 2u64
                .saturating_add(self.subdirs(e.oid)?)
                .min(u32::MAX as u64) as u32;
        }
        Ok(st)
    }

    /// The subdirectory count of directory object `dir` (0 if none recorded).
    fn subdirs(&self, dir: ObjectId) -> Result<u64> {
        Ok(self
            .obj(dir)?
            .fetch_single(COUNT_DKEY, SUBDIRS)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map(u64::from_le_bytes)
            .unwrap_or(0))
    }

    /// A [`Stat`] from an entry and a known size; `nlink` is 1 (see
    /// [`Dfs::stat_node`] for a directory's count).
    pub fn stat_of(&self, e: &Entry, size: u64) -> Stat {
        Stat {
            mode: e.mode,
            uid: e.uid,
            gid: e.gid,
            size,
            blocks: size.div_ceil(512),
            atime: e.atime,
            mtime: e.mtime,
            ctime: e.ctime,
            oid: e.oid,
            chunk_size: e.chunk_size,
            nlink: 1,
            rdev: e.rdev,
        }
    }

    /// A new entry in `parent`. A set-group-ID directory hands its group
    /// to what is made in it, and its set-group-ID bit to new directories
    /// (POSIX; what a pod's fsGroup relies on for directories the kubelet
    /// or the application makes after the group was applied).
    fn new_entry(&self, parent: &Node, mode: u32, uid: u32, gid: u32, oid: ObjectId) -> Entry {
        let t = now_ns();
        let (mut mode, mut gid) = (mode, gid);
        if parent.entry.mode & libc::S_ISGID != 0 {
            gid = parent.entry.gid;
            if mode & libc::S_IFMT == libc::S_IFDIR {
                mode |= libc::S_ISGID;
            }
        }
        Entry {
            mode,
            uid,
            gid,
            atime: t,
            mtime: t,
            ctime: t,
            oid,
            chunk_size: self.inner.chunk_size,
            size_hint: 0,
            child_class: 0,
            target: vec![],
            moving: None,
            from: None,
            rdev: 0,
            subdirs_counted: mode & libc::S_IFMT == libc::S_IFDIR,
        }
    }

    /// Create (or with `excl` = false, open an existing) regular file.
    /// Returns the node and whether it was created.
    pub fn create(
        &self,
        parent: &Node,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
        excl: bool,
    ) -> Result<(Node, bool)> {
        let r = self.create_locked(parent, name, mode, uid, gid, excl)?;
        if r.1 {
            self.touch_dir(parent);
        }
        Ok(r)
    }

    fn create_locked(
        &self,
        parent: &Node,
        name: &[u8],
        mode: u32,
        uid: u32,
        gid: u32,
        excl: bool,
    ) -> Result<(Node, bool)> {
        Self::need_dir(parent)?;
        check_name(name)?;
        let _g = self.lock(&[(parent.oid(), name)]);
        // Another client may create (or remove) the name between our look
        // and our insert: a lost insert race opens the winner's file
        // (without O_EXCL), so try a few rounds before giving up.
        let mut tries = 0;
        loop {
            tries += 1;
            if let Some(e) = self.fetch_entry(parent.oid(), name)? {
                if excl {
                    return Err(err(libc::EEXIST, format!("{:?} exists", show(name))));
                }
                if e.is_dir() {
                    return Err(err(
                        libc::EISDIR,
                        format!("{:?} is a directory", show(name)),
                    ));
                }
                let n = Node {
                    parent: parent.oid(),
                    name: name.to_vec(),
                    entry: e,
                };
                return Ok((n, false));
            }
            self.check_rw()?;
            let oid = self.alloc_oid(self.class_for(parent, false));
            let e = self.new_entry(parent, libc::S_IFREG | (mode & 0o7777), uid, gid, oid);
            match self.insert_entry(parent.oid(), name, &e) {
                Ok(()) => {
                    return Ok((
                        Node {
                            parent: parent.oid(),
                            name: name.to_vec(),
                            entry: e,
                        },
                        true,
                    ))
                }
                Err(x) if x.code == -libc::EEXIST && !excl && tries < 5 => continue,
                Err(x) => return Err(x),
            }
        }
    }

    fn add_new(&self, parent: &Node, name: &[u8], e: Entry) -> Result<Node> {
        let n = self.add_new_locked(parent, name, e)?;
        self.touch_dir(parent);
        Ok(n)
    }

    fn add_new_locked(&self, parent: &Node, name: &[u8], e: Entry) -> Result<Node> {
        Self::need_dir(parent)?;
        check_name(name)?;
        self.check_rw()?;
        let _g = self.lock(&[(parent.oid(), name)]);
        self.insert_entry(parent.oid(), name, &e)?;
        Ok(Node {
            parent: parent.oid(),
            name: name.to_vec(),
            entry: e,
        })
    }

    pub fn mkdir(&self, parent: &Node, name: &[u8], mode: u32, uid: u32, gid: u32) -> Result<Node> {
        let oid = self.alloc_oid(self.class_for(parent, true));
        let mut e = self.new_entry(parent, libc::S_IFDIR | (mode & 0o7777), uid, gid, oid);
        e.child_class = parent.entry.child_class;
        let n = self.add_new(parent, name, e)?;
        self.adjust_subdirs(parent, 1);
        Ok(n)
    }

    /// mknod(2): a FIFO, a socket, or a character or block device node
    /// (`mode` says which; `rdev` is the device number of a device node,
    /// ignored for the others), as an entry with no object behind it
    /// (its id is unique, for inode numbers). A regular file type (or
    /// none) makes an empty regular file, as mknod(2) does.
    #[allow(clippy::too_many_arguments)]
    pub fn mknod(
        &self,
        parent: &Node,
        name: &[u8],
        mode: u32,
        rdev: u64,
        uid: u32,
        gid: u32,
    ) -> Result<Node> {
        let kind = mode & libc::S_IFMT;
        if kind == 0 || kind == libc::S_IFREG {
            return self
                .create(parent, name, mode & 0o7777, uid, gid, true)
                .map(|(n, _)| n);
        }
        if !is_special_mode(kind) {
            return Err(Error::inval(format!(
                "mknod of {:?}: file type {kind:#o} (directories: mkdir, symlinks: symlink)",
                show(name)
            )));
        }
        let oid = self.alloc_oid(self.inner.file_class);
        let mut e = self.new_entry(parent, kind | (mode & 0o7777), uid, gid, oid);
        if matches!(kind, libc::S_IFCHR | libc::S_IFBLK) {
            e.rdev = rdev;
        }
        self.add_new(parent, name, e)
    }

    pub fn symlink(
        &self,
        parent: &Node,
        name: &[u8],
        target: &[u8],
        uid: u32,
        gid: u32,
    ) -> Result<Node> {
        if target.is_empty() || target.len() > 4095 {
            return Err(err(
                if target.is_empty() {
                    libc::ENOENT
                } else {
                    libc::ENAMETOOLONG
                },
                format!("symlink target of {} bytes", target.len()),
            ));
        }
        let oid = self.alloc_oid(self.inner.file_class);
        let mut e = self.new_entry(parent, libc::S_IFLNK | 0o777, uid, gid, oid);
        e.target = target.to_vec();
        self.add_new(parent, name, e)
    }

    pub fn readlink(&self, node: &Node) -> Result<Vec<u8>> {
        if !node.entry.is_symlink() {
            return Err(Error::inval(format!(
                "{:?} is not a symlink",
                show(&node.name)
            )));
        }
        Ok(node.entry.target.clone())
    }

    /// Hard links are not supported (as DAOS DFS).
    pub fn link(&self, _node: &Node, _parent: &Node, _name: &[u8]) -> Result<Node> {
        Err(err(libc::EOPNOTSUPP, "hard links are not supported"))
    }

    /// Remove a non-directory and punch its data.
    pub fn unlink(&self, parent: &Node, name: &[u8]) -> Result<()> {
        let e = self.unlink_deferred(parent, name)?;
        self.release_object(&e)
    }

    /// Remove a non-directory's entry and return it; its data stays until
    /// [`Dfs::release_object`] (for files still open).
    pub fn unlink_deferred(&self, parent: &Node, name: &[u8]) -> Result<Entry> {
        let e = self.unlink_locked(parent, name)?;
        self.touch_dir(parent);
        Ok(e)
    }

    fn unlink_locked(&self, parent: &Node, name: &[u8]) -> Result<Entry> {
        Self::need_dir(parent)?;
        check_name(name)?;
        self.check_rw()?;
        let _g = self.lock(&[(parent.oid(), name)]);
        let e = self
            .fetch_entry(parent.oid(), name)?
            .ok_or_else(|| err(libc::ENOENT, format!("{:?}: no such entry", show(name))))?;
        if e.is_dir() {
            return Err(err(
                libc::EISDIR,
                format!("{:?} is a directory", show(name)),
            ));
        }
        self.settle_from(&e)?;
        self.obj(parent.oid())?.punch_dkey(name)?;
        Ok(e)
    }

    /// Punch the object behind a removed entry (files and directories).
    pub fn release_object(&self, e: &Entry) -> Result<()> {
        if e.is_file() || e.is_dir() {
            self.obj(e.oid)?.punch()?;
        }
        Ok(())
    }

    /// ENOTDIR unless `e` (named `name`) is a directory, ENOTEMPTY unless it is empty.
    fn check_empty_dir(&self, e: &Entry, name: &[u8]) -> Result<()> {
        if !e.is_dir() {
            return Err(err(
                libc::ENOTDIR,
                format!("{:?} is not a directory", show(name)),
            ));
        }
        if !self.dir_is_empty(e.oid)? {
            return Err(err(
                libc::ENOTEMPTY,
                format!("directory {:?} is not empty", show(name)),
            ));
        }
        Ok(())
    }

    fn dir_is_empty(&self, dir: ObjectId) -> Result<bool> {
        Ok(self.obj(dir)?.list_dkeys()?.iter().all(|k| k == COUNT_DKEY))
    }

    pub fn rmdir(&self, parent: &Node, name: &[u8]) -> Result<()> {
        self.rmdir_locked(parent, name)?;
        self.touch_dir(parent);
        self.adjust_subdirs(parent, -1);
        Ok(())
    }

    fn rmdir_locked(&self, parent: &Node, name: &[u8]) -> Result<()> {
        Self::need_dir(parent)?;
        check_name(name)?;
        self.check_rw()?;
        let _g = self.lock(&[(parent.oid(), name)]);
        let e = self
            .fetch_entry(parent.oid(), name)?
            .ok_or_else(|| err(libc::ENOENT, format!("{:?}: no such entry", show(name))))?;
        self.check_empty_dir(&e, name)?;
        self.settle_from(&e)?;
        self.obj(parent.oid())?.punch_dkey(name)?;
        self.release_object(&e)
    }

    /// The xattr akeys of an entry ("x:..." names, with prefix).
    fn xattr_keys(&self, parent: ObjectId, name: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(self
            .obj(parent)?
            .list_akeys(name)?
            .into_iter()
            .filter(|k| k.starts_with(XPREFIX))
            .collect())
    }

    fn xattrs(&self, parent: ObjectId, name: &[u8]) -> Result<Xattrs> {
        let o = self.obj(parent)?;
        let mut out = Vec::new();
        for k in self.xattr_keys(parent, name)? {
            if let Some(v) = o.fetch_single(name, &k)? {
                out.push((k, v));
            }
        }
        Ok(out)
    }

    /// Write entry `e` with xattrs `xs` at (dir, name), replacing what is
    /// there (stale xattrs of the old occupant are punched). With
    /// `noreplace` the entry goes first, as a conditional insert (`EEXIST`
    /// and nothing written if the name is taken), then its xattrs.
    fn install(
        &self,
        dir: ObjectId,
        name: &[u8],
        e: &Entry,
        xs: &[(Vec<u8>, Vec<u8>)],
        had_entry: bool,
        noreplace: bool,
    ) -> Result<()> {
        let o = self.obj(dir)?;
        if noreplace {
            self.insert_entry(dir, name, e)?;
            for (k, v) in xs {
                o.update_single(name, k, v)?;
            }
            return Ok(());
        }
        if had_entry {
            let old = self.xattr_keys(dir, name)?;
            let stale: Vec<&[u8]> = old
                .iter()
                .filter(|k| !xs.iter().any(|(n, _)| n == *k))
                .map(|k| k.as_slice())
                .collect();
            o.punch_akeys(name, &stale)?;
        }
        for (k, v) in xs {
            o.update_single(name, k, v)?;
        }
        o.update_single(name, INODE, &e.encode())
    }

    /// rename(2)/renameat2(2): `flags` 0, [`RENAME_NOREPLACE`] or
    /// [`RENAME_EXCHANGE`]. A replaced file's data is punched.
    pub fn rename(
        &self,
        sp: &Node,
        sname: &[u8],
        dp: &Node,
        dname: &[u8],
        flags: u32,
    ) -> Result<()> {
        if let Some(e) = self.rename_deferred(sp, sname, dp, dname, flags)? {
            self.release_object(&e)?;
        }
        Ok(())
    }

    /// Like [`Dfs::rename`]; returns the replaced entry without punching
    /// its object (the caller calls [`Dfs::release_object`] when the file
    /// is no longer open).
    pub fn rename_deferred(
        &self,
        sp: &Node,
        sname: &[u8],
        dp: &Node,
        dname: &[u8],
        flags: u32,
    ) -> Result<Option<Entry>> {
        let (r, (ds, dd)) = self.rename_locked(sp, sname, dp, dname, flags)?;
        if sp.oid() != dp.oid() || sname != dname {
            self.touch_dir(sp);
            if dp.oid() != sp.oid() {
                self.touch_dir(dp);
            }
        }
        if sp.oid() == dp.oid() {
            self.adjust_subdirs(sp, ds + dd);
        } else {
            self.adjust_subdirs(sp, ds);
            self.adjust_subdirs(dp, dd);
        }
        Ok(r)
    }

    /// Returns the replaced entry and how the subdirectory counts of the
    /// source and destination directories change.
    fn rename_locked(
        &self,
        sp: &Node,
        sname: &[u8],
        dp: &Node,
        dname: &[u8],
        flags: u32,
    ) -> Result<(Option<Entry>, (i64, i64))> {
        Self::need_dir(sp)?;
        Self::need_dir(dp)?;
        check_name(sname)?;
        check_name(dname)?;
        self.check_rw()?;
        if flags & !(RENAME_NOREPLACE | RENAME_EXCHANGE) != 0
            || flags == RENAME_NOREPLACE | RENAME_EXCHANGE
        {
            return Err(Error::inval(format!("rename flags {flags:#x}")));
        }
        let (s, d) = (sp.oid(), dp.oid());
        let _g = self.lock(&[(s, sname), (d, dname)]);
        let se = self
            .fetch_entry(s, sname)?
            .ok_or_else(|| err(libc::ENOENT, format!("{:?}: no such entry", show(sname))))?;
        let de = self.fetch_entry(d, dname)?;
        if s == d && sname == dname {
            return if flags & RENAME_NOREPLACE != 0 {
                Err(err(libc::EEXIST, format!("{:?} exists", show(dname))))
            } else {
                Ok((None, (0, 0)))
            };
        }
        let (sdir, ddir) = (
            se.is_dir() as i64,
            de.as_ref().is_some_and(|e| e.is_dir()) as i64,
        );
        if se.oid == d || de.as_ref().is_some_and(|x| x.oid == s) {
            return Err(Error::inval(
                "rename would make a directory its own ancestor",
            ));
        }
        for (e, n) in [(Some(&se), sname), (de.as_ref(), dname)] {
            if e.is_some_and(|e| e.moving.is_some()) {
                return Err(err(
                    libc::EBUSY,
                    format!("{:?} is being renamed by another client", show(n)),
                ));
            }
        }
        // Every check that can refuse the rename comes before the claim.
        let exchange = flags & RENAME_EXCHANGE != 0;
        match &de {
            None if exchange => {
                return Err(err(
                    libc::ENOENT,
                    format!("{:?}: no such entry", show(dname)),
                ))
            }
            Some(_) if flags & RENAME_NOREPLACE != 0 => {
                return Err(err(libc::EEXIST, format!("{:?} exists", show(dname))));
            }
            Some(de) if !exchange && se.is_dir() => self.check_empty_dir(de, dname)?,
            Some(de) if !exchange && de.is_dir() => {
                return Err(err(
                    libc::EISDIR,
                    format!("{:?} is a directory", show(dname)),
                ))
            }
            _ => {}
        }
        // Both entries are about to move or go: finish the renames that put them here.
        self.settle_from(&se)?;
        if let Some(de) = &de {
            self.settle_from(de)?;
        }
        self.claim_rename(s, sname)?;
        // A rename that won the claim before this one may have finished since
        // the source was read: it must still be there, unchanged.
        if self.fetch_raw(s, sname)?.map(|e| e.oid) != Some(se.oid) {
            self.obj(s)?.punch_akeys(sname, &[RENAME_CLAIM])?;
            return Err(err(
                libc::ENOENT,
                format!("{:?}: renamed or removed meanwhile", show(sname)),
            ));
        }
        self.rename_step("claim")?;
        let sx = self.xattrs(s, sname)?;
        let since = now_ns();
        let mut moved = se.clone();
        moved.ctime = since;
        moved.from = Some((s, sname.to_vec()));
        if let (true, Some(de)) = (exchange, &de) {
            let dx = self.xattrs(d, dname)?;
            let intent = self.put_intent(s, sname, &se, d, dname, since, Some((de.clone(), dx)))?;
            self.rename_step("exchange intent")?;
            self.install(d, dname, &moved, &sx, true, false)?;
            self.rename_step("exchange destination")?;
            self.settle(s, sname, intent)?;
            return Ok((None, (ddir - sdir, sdir - ddir)));
        }
        self.put_intent(s, sname, &se, d, dname, since, None)?;
        self.rename_step("intent")?;
        let noreplace = flags & RENAME_NOREPLACE != 0;
        if let Err(e) = self.install(d, dname, &moved, &sx, de.is_some(), noreplace) {
            // Nothing moved (e.g. a NOREPLACE destination another client just
            // created): withdraw the intent and the claim (or leave them to the lease).
            if self.put_entry(s, sname, &se).is_ok() {
                let _ = self.obj(s)?.punch_akeys(sname, &[RENAME_CLAIM]);
            }
            return Err(e);
        }
        self.rename_step("destination")?;
        self.obj(s)?.punch_dkey(sname)?;
        Ok((de, (-sdir, sdir - ddir)))
    }

    /// Step 1 of a rename: record in the source entry where it goes (and,
    /// for an exchange, what comes back). Returns the entry as written.
    #[allow(clippy::too_many_arguments)]
    fn put_intent(
        &self,
        s: ObjectId,
        sname: &[u8],
        se: &Entry,
        d: ObjectId,
        dname: &[u8],
        since: i64,
        exchange: Option<(Entry, Xattrs)>,
    ) -> Result<Entry> {
        let mut intent = se.clone();
        intent.moving = Some(Box::new(Move {
            to_dir: d,
            to_name: dname.to_vec(),
            since,
            exchange,
        }));
        self.put_entry(s, sname, &intent)?;
        Ok(intent)
    }

    /// Settle the rename whose intent source entry `e` (at parent/name)
    /// holds. The destination naming the same object is the rename's commit
    /// point: then the rename is finished here (the source punched, or for
    /// an exchange the destination's old entry written to the source) and
    /// the result returned. Otherwise the rename is in progress (`e` stands,
    /// intent and all) or, once its intent is older than the lease,
    /// abandoned by a client that died: undone.
    fn settle(&self, parent: ObjectId, name: &[u8], e: Entry) -> Result<Option<Entry>> {
        let Some(m) = e.moving.as_deref() else {
            return Ok(Some(e));
        };
        let dest = self.fetch_raw(m.to_dir, &m.to_name)?;
        if dest.is_some_and(|d| d.oid == e.oid) {
            return match &m.exchange {
                None => {
                    self.obj(parent)?.punch_dkey(name)?;
                    Ok(None)
                }
                Some((other, xs)) => {
                    let mut back = other.clone();
                    back.ctime = m.since;
                    self.install(parent, name, &back, xs, true, false)?;
                    self.obj(parent)?.punch_akeys(name, &[RENAME_CLAIM])?;
                    Ok(Some(back))
                }
            };
        }
        let lease = self.inner.rename_lease_ns.load(Ordering::Relaxed);
        if now_ns().saturating_sub(m.since) < lease {
            return Ok(Some(e));
        }
        let mut back = e.clone();
        back.moving = None;
        self.put_entry(parent, name, &back)?;
        self.obj(parent)?.punch_akeys(name, &[RENAME_CLAIM])?;
        Ok(Some(back))
    }

    /// Step 0 of a rename: claim the source entry by conditional insert, so
    /// that of several clients renaming it one goes on and the others get
    /// `EBUSY`. A claim older than the lease is a rename whose client died
    /// before it wrote its intent: it is taken over.
    fn claim_rename(&self, dir: ObjectId, name: &[u8]) -> Result<()> {
        let o = self.obj(dir)?;
        let busy = || {
            err(
                libc::EBUSY,
                format!("{:?} is being renamed by another client", show(name)),
            )
        };
        let claim = |o: &Object| match o.insert_single(name, RENAME_CLAIM, &now_ns().to_le_bytes())
        {
            Err(e) if e.code == -libc::EEXIST => Err(busy()),
            r => r,
        };
        match claim(&o) {
            Err(e) if e.code == -libc::EBUSY => {}
            r => return r,
        }
        let since = o
            .fetch_single(name, RENAME_CLAIM)?
            .and_then(|v| <[u8; 8]>::try_from(v.as_slice()).ok())
            .map(i64::from_le_bytes);
        // No claim to read: it is still being committed (a conditional
        // insert sees those, a fetch does not yet) or was just released.
        // Either way somebody else's rename is under way.
        let lease = self.inner.rename_lease_ns.load(Ordering::Relaxed);
        match since {
            Some(t) if now_ns().saturating_sub(t) >= lease => {
                o.punch_akeys(name, &[RENAME_CLAIM])?;
                claim(&o)
            }
            _ => Err(busy()),
        }
    }

    /// Before entry `e` moves again or goes away: settle the rename that
    /// put it where it is, if that rename's source still holds its intent
    /// (else, e.g., the source would be undone once its lease ran out, and
    /// name an object removed here).
    fn settle_from(&self, e: &Entry) -> Result<()> {
        if let Some((dir, name)) = &e.from {
            self.fetch_entry(*dir, name)?;
        }
        Ok(())
    }

    fn rename_step(&self, step: &'static str) -> Result<()> {
        if *self.inner.stop_rename_after.lock() == Some(step) {
            return Err(err(
                libc::EIO,
                format!("rename stopped after its {step} (test)"),
            ));
        }
        Ok(())
    }

    /// Tests: renames stop after `step` ("claim", "intent", "destination",
    /// "exchange intent", "exchange destination"), as if their client died there.
    #[doc(hidden)]
    pub fn stop_renames_after(&self, step: Option<&'static str>) {
        *self.inner.stop_rename_after.lock() = step;
    }

    /// Tests: how old a rename's intent must be to count as abandoned.
    #[doc(hidden)]
    pub fn set_rename_lease(&self, lease: std::time::Duration) {
        self.inner
            .rename_lease_ns
            .store(lease.as_nanos() as i64, Ordering::Relaxed);
    }

    /// chmod / chown / utimens / truncate in one call; returns the new
    /// node and its attributes.
    pub fn setattr(&self, node: &Node, a: &SetAttr) -> Result<(Node, Stat)> {
        self.check_rw()?;
        let _g = self.lock(&[(node.parent, &node.name)]);
        let mut n = self.refresh(node)?;
        if n.oid() != node.oid() {
            // Removed, and the name made again: not this node's to change.
            return Err(err(
                libc::ENOENT,
                format!(
                    "{:?}: entry removed (its name now names another)",
                    show(&n.name)
                ),
            ));
        }
        if let Some(size) = a.size {
            if n.entry.is_dir() {
                return Err(err(
                    libc::EISDIR,
                    format!("{:?} is a directory", show(&n.name)),
                ));
            }
            if !n.entry.is_file() {
                return Err(Error::inval(format!(
                    "{:?} is not a regular file",
                    show(&n.name)
                )));
            }
            self.open(&n)?.truncate(size)?;
            n.entry.size_hint = size;
            n.entry.mtime = now_ns();
        }
        a.apply_to(&mut n.entry, now_ns());
        self.put_entry(n.parent, &n.name, &n.entry)?;
        drop(_g);
        if n.is_dir() {
            self.forget_touch(n.oid());
        }
        self.getattr(&n)
    }

    /// Add `delta` to the subdirectory count of directory `dir` (after a
    /// mkdir, rmdir or rename there; see "Link counts" in the module
    /// docs). Concurrent changes of one directory in this process share
    /// rounds (their sum is applied in one locked read-modify-write). Like
    /// the directory's times, a failure (a full pool, an engine down)
    /// neither undoes nor fails the operation, which has happened: it is
    /// reported on stderr and the count is off by the change.
    fn adjust_subdirs(&self, dir: &Node, delta: i64) {
        if delta == 0 || !dir.is_dir() || !dir.entry.subdirs_counted {
            return;
        }
        let b = {
            let mut m = self.inner.counts.lock();
            if m.len() > 4096 {
                m.retain(|_, b| Arc::strong_count(b) > 1);
            }
            m.entry(dir.oid()).or_default().clone()
        };
        let mut st = b.st.lock();
        st.pending += delta;
        st.requested += 1;
        let me = st.requested;
        while st.covered < me {
            if st.running {
                b.done.wait(&mut st);
                continue;
            }
            st.running = true;
            let round = st.requested;
            let d = std::mem::take(&mut st.pending);
            drop(st);
            if let Err(e) = self.apply_subdirs(dir.oid(), d) {
                eprintln!(
                    "peregrine-dfs: subdirectory count of {:?} ({}) not changed by {d}: {e}",
                    show(&dir.name),
                    dir.oid()
                );
            }
            st = b.st.lock();
            st.running = false;
            st.covered = round;
            b.done.notify_all();
        }
    }

    /// One locked read-modify-write of a directory's subdirectory count.
    fn apply_subdirs(&self, dir: ObjectId, delta: i64) -> Result<()> {
        if delta == 0 {
            return Ok(());
        }
        let o = self.obj(dir)?;
        self.lock_count(&o)?;
        let r = (|| {
            let cur = self.subdirs(dir)?;
            // Below zero: a count that drifted (see "Link counts"); 0 is
            // the nearest truth.
            let new = (cur as i64).saturating_add(delta).max(0) as u64;
            o.update_single(COUNT_DKEY, SUBDIRS, &new.to_le_bytes())
        })();
        let unlock = o.punch_akeys(COUNT_DKEY, &[SUBDIRS_LOCK]);
        r.and(unlock)
    }

    /// Take the subdirectory-count lock of directory object `o`: a
    /// conditional insert of (now, a random token); of several clients,
    /// one wins; the others wait and retry. The winner reads the lock back:
    /// an insert whose epoch is below the punch that released the lock
    /// before it (sent earlier, arrived later) succeeds but stays hidden
    /// under that punch, and does not hold the lock. A lock older than
    /// [`COUNT_LOCK_LEASE_NS`] was left by a client that died holding it:
    /// it is taken over.
    fn lock_count(&self, o: &Object) -> Result<()> {
        let mut pause = std::time::Duration::from_micros(100);
        let since = |v: &[u8]| {
            v.get(..8)
                .map(|t| i64::from_le_bytes(t.try_into().unwrap()))
        };
        loop {
            let mut mine = now_ns().to_le_bytes().to_vec();
            mine.extend_from_slice(&rand::random::<u64>().to_le_bytes());
            let held = match o.insert_single(COUNT_DKEY, SUBDIRS_LOCK, &mine) {
                Ok(()) => None,
                Err(e) if e.code == -libc::EEXIST => Some(()),
                Err(e) => return Err(e),
            };
            let now = o.fetch_single(COUNT_DKEY, SUBDIRS_LOCK)?;
            if held.is_none() && now.as_deref() == Some(&mine[..]) {
                return Ok(());
            }
            if let Some(t) = now.as_deref().and_then(since) {
                if now_ns().saturating_sub(t) >= COUNT_LOCK_LEASE_NS {
                    o.punch_akeys(COUNT_DKEY, &[SUBDIRS_LOCK])?;
                    continue;
                }
            }
            // Jittered backoff, so that waiters on several clients do not
            // retry in step.
            let jitter = rand::random::<u64>() % (pause.as_micros() as u64 + 1);
            std::thread::sleep(pause + std::time::Duration::from_micros(jitter));
            pause = (pause * 2).min(std::time::Duration::from_millis(5));
        }
    }

    /// POSIX: an entry created, removed or renamed in directory `dir`
    /// moves the directory's mtime and ctime to now: a read and a write of
    /// the directory's own entry (in its parent), after the operation and
    /// outside its locks. Cheap by sharing: concurrent operations in one
    /// directory share rounds (group commit), and one round per
    /// [`DIR_TIME_TICK_NS`] serves a directory (the times have that
    /// granularity, as with a coarse clock). Across clients the last
    /// writer wins. A failure (a full pool, an engine down) neither undoes
    /// nor fails the operation, which has happened.
    fn touch_dir(&self, dir: &Node) {
        let t = {
            let mut m = self.inner.touches.lock();
            if m.len() > 4096 {
                // Forget directories idle for a tick or more.
                let now = now_ns() / DIR_TIME_TICK_NS;
                m.retain(|_, t| Arc::strong_count(t) > 1 || t.st.lock().tick == now);
            }
            m.entry(dir.oid()).or_default().clone()
        };
        let mut st = t.st.lock();
        st.requested += 1;
        let me = st.requested;
        while st.covered < me && st.tick != now_ns() / DIR_TIME_TICK_NS {
            if st.running {
                t.done.wait(&mut st);
                continue;
            }
            st.running = true;
            let round = st.requested;
            drop(st);
            let tick = now_ns() / DIR_TIME_TICK_NS;
            let ok = self.touch_dir_once(dir).is_ok();
            st = t.st.lock();
            st.running = false;
            st.covered = round;
            if ok {
                st.tick = tick;
            }
            t.done.notify_all();
        }
    }

    /// After an explicit change of a directory's attributes, the next entry
    /// change stamps it again even within the tick.
    fn forget_touch(&self, dir: ObjectId) {
        if let Some(t) = self.inner.touches.lock().get(&dir) {
            t.st.lock().tick = 0;
        }
    }

    fn touch_dir_once(&self, dir: &Node) -> Result<()> {
        let _g = self.lock(&[(dir.parent, &dir.name)]);
        match self.fetch_entry(dir.parent, &dir.name)? {
            // Still this directory (not renamed away and replaced).
            Some(mut e) if e.oid == dir.oid() => {
                let t = now_ns();
                e.mtime = t;
                e.ctime = t;
                self.put_entry(dir.parent, &dir.name, &e)
            }
            _ => Ok(()),
        }
    }

    /// Record a size hint and mtime after writes (called on close).
    pub fn touch_written(&self, node: &Node, size: u64) -> Result<()> {
        if self.inner.read_only {
            return Ok(());
        }
        let _g = self.lock(&[(node.parent, &node.name)]);
        let mut n = match self.refresh(node) {
            // The name now names another file: this one was removed.
            Ok(n) if n.oid() != node.oid() => return Ok(()),
            Ok(n) => n,
            Err(e) if e.code == -libc::ENOENT => return Ok(()),
            Err(e) => return Err(e),
        };
        let t = now_ns();
        n.entry.mtime = t;
        n.entry.ctime = t;
        n.entry.size_hint = size;
        self.put_entry(n.parent, &n.name, &n.entry)
    }

    /// fallocate(2): mode 0 extends the size to `off + len` if larger;
    /// other modes are EOPNOTSUPP.
    pub fn fallocate(&self, node: &Node, mode: i32, off: u64, len: u64) -> Result<()> {
        self.check_rw()?;
        if mode != 0 {
            return Err(err(libc::EOPNOTSUPP, format!("fallocate mode {mode:#x}")));
        }
        if !node.entry.is_file() {
            return Err(err(libc::ENODEV, "fallocate on a non-regular file"));
        }
        self.open(node)?.extend_to(off.saturating_add(len))
    }

    /// Space of the pool (nvme tier if it has one, else scm).
    pub fn statfs(&self) -> Result<StatFs> {
        let pool = self.inner.cont.pool();
        let info = pool.client().mgmt().pool_query(PoolQueryReq {
            id: pool.uuid().to_string(),
        })?;
        let tier = info
            .tiers
            .iter()
            .find(|t| t.name == "nvme" && t.total > 0)
            .or_else(|| info.tiers.iter().find(|t| t.total > 0));
        let (mut total, mut free) = tier.map(|t| (t.total, t.free)).unwrap_or((0, 0));
        // A container with a quota is a file system of that size.
        let cont = pool.client().mgmt().cont_query(ContQueryReq {
            pool: pool.uuid().to_string(),
            id: self.inner.cont.uuid().to_string(),
        })?;
        if cont.quota_bytes > 0 {
            total = cont.quota_bytes;
            free = free.min(cont.quota_bytes.saturating_sub(cont.quota_used_bytes));
        }
        let bsize = 4096u64;
        Ok(StatFs {
            bsize: bsize as u32,
            blocks: total / bsize,
            bfree: free / bsize,
            bavail: free / bsize,
            files: u32::MAX as u64,
            ffree: u32::MAX as u64,
            namelen: NAME_MAX as u32,
        })
    }

    // ---- xattrs ----

    /// setxattr(2): `flags` XATTR_CREATE (1) / XATTR_REPLACE (2).
    pub fn setxattr(&self, node: &Node, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        self.check_rw()?;
        check_xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(err(
                libc::E2BIG,
                format!("xattr value of {} bytes", value.len()),
            ));
        }
        let _g = self.lock(&[(node.parent, &node.name)]);
        let mut n = self.refresh(node)?;
        if name == OCLASS_XATTR.as_bytes() {
            if !n.is_dir() {
                return Err(Error::inval(format!(
                    "{OCLASS_XATTR} applies to directories only"
                )));
            }
            let s = std::str::from_utf8(value)
                .unwrap_or("")
                .trim_end_matches('\0');
            let class = s
                .parse::<ObjectClass>()
                .map_err(|e| Error::inval(format!("{OCLASS_XATTR}: {e}")))?;
            // Usable in this pool?
            self.obj(ObjectId::new(class, 0, 0))
                .map_err(|e| Error::inval(format!("{OCLASS_XATTR} {class}: {}", e.msg)))?;
            let exists = n.entry.child_class != 0;
            xattr_flags_check(flags, exists, name)?;
            n.entry.child_class = class.id();
            n.entry.ctime = now_ns();
            return self.put_entry(n.parent, &n.name, &n.entry);
        }
        let o = self.obj(n.parent)?;
        let key = xattr_akey(name);
        if flags != 0 {
            let exists = o.fetch_single(&n.name, &key)?.is_some();
            xattr_flags_check(flags, exists, name)?;
        }
        o.update_single(&n.name, &key, value)
    }

    pub fn getxattr(&self, node: &Node, name: &[u8]) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        if name == OCLASS_XATTR.as_bytes() {
            let n = self.refresh(node)?;
            return match ObjectClass::from_id(n.entry.child_class) {
                Some(c) => Ok(c.name().as_bytes().to_vec()),
                None => Err(err(libc::ENODATA, format!("no xattr {OCLASS_XATTR}"))),
            };
        }
        self.obj(node.parent)?
            .fetch_single(&node.name, &xattr_akey(name))?
            .ok_or_else(|| err(libc::ENODATA, format!("no xattr {:?}", show(name))))
    }

    pub fn listxattr(&self, node: &Node) -> Result<Vec<Vec<u8>>> {
        let n = self.refresh(node)?;
        let mut out: Vec<Vec<u8>> = self
            .xattr_keys(n.parent, &n.name)?
            .into_iter()
            .map(|k| k[XPREFIX.len()..].to_vec())
            .collect();
        if n.entry.child_class != 0 {
            out.push(OCLASS_XATTR.as_bytes().to_vec());
        }
        Ok(out)
    }

    pub fn removexattr(&self, node: &Node, name: &[u8]) -> Result<()> {
        self.check_rw()?;
        check_xattr_name(name)?;
        let _g = self.lock(&[(node.parent, &node.name)]);
        let mut n = self.refresh(node)?;
        if name == OCLASS_XATTR.as_bytes() {
            if n.entry.child_class == 0 {
                return Err(err(libc::ENODATA, format!("no xattr {OCLASS_XATTR}")));
            }
            n.entry.child_class = 0;
            return self.put_entry(n.parent, &n.name, &n.entry);
        }
        let o = self.obj(n.parent)?;
        let key = xattr_akey(name);
        if o.fetch_single(&n.name, &key)?.is_none() {
            return Err(err(libc::ENODATA, format!("no xattr {:?}", show(name))));
        }
        o.punch_akeys(&n.name, &[&key])
    }

    // ---- directories ----

    /// Snapshot the names of directory `node` (sorted byte-wise).
    pub fn opendir(&self, node: &Node) -> Result<DirHandle> {
        Self::need_dir(node)?;
        Ok(DirHandle {
            dir: node.oid(),
            names: {
                let mut names = self.obj(node.oid())?.list_dkeys()?;
                names.retain(|k| k != COUNT_DKEY);
                names
            },
        })
    }

    /// Up to `max` entries after `cookie` (0 = from the start); entries
    /// removed since opendir are skipped. Entries are fetched in parallel.
    pub fn readdir(&self, h: &DirHandle, cookie: u64, max: usize) -> Result<Vec<DirEntry>> {
        let start = (cookie as usize).min(h.names.len());
        let end = start.saturating_add(max).min(h.names.len());
        let idx: Vec<usize> = (start..end).collect();
        let fetched: Vec<Result<Option<Entry>>> = if idx.len() <= 1 {
            idx.iter()
                .map(|&i| self.fetch_entry(h.dir, &h.names[i]))
                .collect()
        } else {
            let per = idx.len().div_ceil(READDIR_PARALLEL);
            std::thread::scope(|s| {
                let hs: Vec<_> = idx
                    .chunks(per)
                    .map(|part| {
                        s.spawn(move || {
                            part.iter()
                                .map(|&i| self.fetch_entry(h.dir, &h.names[i]))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                hs.into_iter()
                    .flat_map(|j| j.join().unwrap_or_else(|p| std::panic::resume_unwind(p)))
                    .collect()
            })
        };
        let mut out = Vec::with_capacity(idx.len());
        for (i, r) in idx.into_iter().zip(fetched) {
            if let Some(entry) = r? {
                out.push(DirEntry {
                    name: h.names[i].clone(),
                    cookie: i as u64 + 1,
                    entry,
                });
            }
        }
        Ok(out)
    }

    /// Make what was written to `node` (its data, its entry) survive a
    /// power cut, as fsync: flush the node's object and its directory.
    /// Updates are acknowledged once written (they survive the crash of any
    /// process) unless the container says `sync=always`.
    pub fn fsync(&self, node: &Node) -> Result<()> {
        let cont = &self.inner.cont;
        cont.object(node.oid())?.flush()?;
        cont.object(node.parent)?.flush()
    }

    // ---- files ----

    /// Open a regular file for I/O.
    pub fn open(&self, node: &Node) -> Result<File> {
        if node.is_dir() {
            return Err(err(
                libc::EISDIR,
                format!("{:?} is a directory", show(&node.name)),
            ));
        }
        if !node.entry.is_file() {
            return Err(Error::inval(format!(
                "{:?} is not a regular file",
                show(&node.name)
            )));
        }
        File::new(
            &self.inner.cont,
            node.oid(),
            node.entry.chunk_size,
            self.inner.read_only,
        )
    }
}

fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(err(
            libc::ERANGE,
            format!("xattr name of {} bytes", name.len()),
        ));
    }
    Ok(())
}

fn xattr_flags_check(flags: i32, exists: bool, name: &[u8]) -> Result<()> {
    if flags & libc::XATTR_CREATE != 0 && exists {
        return Err(err(libc::EEXIST, format!("xattr {:?} exists", show(name))));
    }
    if flags & libc::XATTR_REPLACE != 0 && !exists {
        return Err(err(libc::ENODATA, format!("no xattr {:?}", show(name))));
    }
    Ok(())
}

/// An open regular file: the per-file I/O API (also for the interception
/// library, which knows the object id and chunk size from the FUSE ioctl).
pub struct File {
    obj: Object,
    chunk: u64,
    read_only: bool,
    /// Size last seen or produced by this handle (a cache; see [`File::size`]).
    cached: AtomicU64,
}

impl std::fmt::Debug for File {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("File")
            .field("oid", &self.obj.id().to_string())
            .field("chunk", &self.chunk)
            .finish()
    }
}

impl File {
    /// Open file object `oid` of `cont` with its chunk size.
    pub fn new(cont: &Container, oid: ObjectId, chunk_size: u64, read_only: bool) -> Result<File> {
        if chunk_size == 0 {
            return Err(Error::inval(format!("file {oid}: chunk size 0")));
        }
        let f = File {
            obj: cont.object(oid)?,
            chunk: chunk_size,
            read_only,
            cached: AtomicU64::new(0),
        };
        Ok(f)
    }

    pub fn oid(&self) -> ObjectId {
        self.obj.id()
    }
    pub fn chunk_size(&self) -> u64 {
        self.chunk
    }
    /// Make what was written to the file survive a power cut (fdatasync).
    pub fn sync(&self) -> Result<()> {
        self.obj.flush()
    }
    /// The size this handle last saw (no round trip).
    pub fn cached_size(&self) -> u64 {
        self.cached.load(Ordering::Relaxed)
    }

    fn check_rw(&self) -> Result<()> {
        if self.read_only {
            return Err(err(libc::EROFS, "file system mounted read-only"));
        }
        Ok(())
    }

    /// The file's size from the store (and refresh the cache): the highest
    /// chunk holding data, times the chunk size, plus its array size.
    pub fn size(&self) -> Result<u64> {
        let dkeys = self.obj.list_dkeys()?;
        let mut size = 0;
        for d in dkeys.iter().rev() {
            let Some(idx) = chunk_index(d) else { continue };
            let s = self.obj.array_size(d, DATA_AKEY)?;
            if s > 0 {
                size = idx * self.chunk + s;
                break;
            }
        }
        self.cached.store(size, Ordering::Relaxed);
        Ok(size)
    }

    /// Split [off, off+len) into (chunk index, offset in chunk, len, position in buffer).
    fn pieces(&self, off: u64, len: usize) -> Vec<(u64, u64, usize, usize)> {
        let mut v = Vec::new();
        let mut done = 0usize;
        while done < len {
            let o = off + done as u64;
            let (idx, within) = (o / self.chunk, o % self.chunk);
            let n = ((self.chunk - within) as usize).min(len - done);
            v.push((idx, within, n, done));
            done += n;
        }
        v
    }

    /// Read at `off` into `buf`; returns bytes read (short at end of file).
    pub fn read_at(&self, off: u64, buf: &mut [u8]) -> Result<usize> {
        let mut size = self.cached_size();
        if off + buf.len() as u64 > size {
            size = self.size()?;
        }
        if off >= size {
            return Ok(0);
        }
        let n = ((size - off) as usize).min(buf.len());
        let pieces = self.pieces(off, n);
        if pieces.len() == 1 {
            let (idx, within, len, at) = pieces[0];
            self.obj.fetch_array_into(
                &chunk_dkey(idx),
                DATA_AKEY,
                within,
                &mut buf[at..at + len],
            )?;
        } else {
            let mut rest: &mut [u8] = &mut buf[..n];
            let mut slices = Vec::with_capacity(pieces.len());
            for &(idx, within, len, _) in &pieces {
                let (a, b) = rest.split_at_mut(len);
                slices.push((idx, within, a));
                rest = b;
            }
            std::thread::scope(|s| -> Result<()> {
                let hs: Vec<_> = slices
                    .into_iter()
                    .map(|(idx, within, b)| {
                        s.spawn(move || {
                            self.obj
                                .fetch_array_into(&chunk_dkey(idx), DATA_AKEY, within, b)
                        })
                    })
                    .collect();
                for h in hs {
                    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
                }
                Ok(())
            })?;
        }
        Ok(n)
    }

    /// Write `data` at `off`; returns bytes written (all of them).
    pub fn write_at(&self, off: u64, data: &[u8]) -> Result<usize> {
        self.check_rw()?;
        if data.is_empty() {
            return Ok(0);
        }
        let pieces = self.pieces(off, data.len());
        if pieces.len() == 1 {
            self.obj
                .update_array(&chunk_dkey(pieces[0].0), DATA_AKEY, pieces[0].1, data)?;
        } else {
            std::thread::scope(|s| -> Result<()> {
                let hs: Vec<_> = pieces
                    .iter()
                    .map(|&(idx, within, len, at)| {
                        s.spawn(move || {
                            self.obj.update_array(
                                &chunk_dkey(idx),
                                DATA_AKEY,
                                within,
                                &data[at..at + len],
                            )
                        })
                    })
                    .collect();
                for h in hs {
                    h.join().unwrap_or_else(|p| std::panic::resume_unwind(p))?;
                }
                Ok(())
            })?;
        }
        self.cached
            .fetch_max(off + data.len() as u64, Ordering::Relaxed);
        Ok(data.len())
    }

    /// Make the size at least `size` (a zero byte at `size - 1` if it lies
    /// past the current end: reads of the hole give zeros).
    pub fn extend_to(&self, size: u64) -> Result<()> {
        self.check_rw()?;
        if size == 0 || self.size()? >= size {
            return Ok(());
        }
        self.write_at(size - 1, &[0]).map(|_| ())
    }

    /// Set the size to `size`: punch chunks wholly past it, trim the last
    /// kept chunk, or extend.
    pub fn truncate(&self, size: u64) -> Result<()> {
        self.check_rw()?;
        let cur = self.size()?;
        if size >= cur {
            return self.extend_to(size);
        }
        if size == 0 {
            self.obj.punch()?;
            self.cached.store(0, Ordering::Relaxed);
            return Ok(());
        }
        let dkeys: BTreeSet<u64> = self
            .obj
            .list_dkeys()?
            .iter()
            .filter_map(|d| chunk_index(d))
            .collect();
        let first_gone = size.div_ceil(self.chunk);
        for &idx in dkeys.range(first_gone..) {
            self.obj.punch_dkey(&chunk_dkey(idx))?;
        }
        let keep = size % self.chunk;
        let last = size / self.chunk;
        if keep != 0 && dkeys.contains(&last) {
            let dk = chunk_dkey(last);
            let have = self.obj.array_size(&dk, DATA_AKEY)?;
            if have > keep {
                let prefix = self.obj.fetch_array(&dk, DATA_AKEY, 0, keep as usize)?;
                self.obj.punch_akeys(&dk, &[DATA_AKEY])?;
                self.obj.update_array(&dk, DATA_AKEY, 0, &prefix)?;
            }
        }
        self.cached.store(0, Ordering::Relaxed);
        self.extend_to(size)?;
        self.cached.store(size, Ordering::Relaxed);
        Ok(())
    }
}
