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
//!   class, symlink target, rename intent and origin (written by clients
//!   of before transactions only, see `legacy.rs`), device number,
//!   flags (bit 0: subdirectories counted, bit 1: a hard link, see "Hard
//!   links"); version 3, versions 1 and 2 still read); xattrs are akeys
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
//! # Modules
//! `entry.rs` (an entry and its encoding), `node.rs` (the node and
//! attribute types), `mount.rs` (the superblock), `dfs.rs` (the core:
//! lookup, create, mkdir, unlink, rmdir, setattr, ...), `rename.rs`
//! ("Renames" below), `links.rs` ("Link counts" below), `times.rs`
//! (directory times), `xattr.rs`, `dir.rs` (listing), `file.rs` (file
//! data I/O), `hardlink.rs` ("Hard links" below) and `legacy.rs` (renames
//! of clients of before transactions).
//!
//! # Consistency (documented limits)
//! New directory entries (`create`, `mkdir`, `mknod`, `symlink`) are
//! written with a conditional insert
//! ([`Object::insert_single`](peregrine::Object::insert_single): the engine fails it with `EEXIST` if the
//! name's `"inode"` akey has a value), so they are atomic against other
//! clients too: of several mounts creating one name, exactly one wins and
//! the others get `EEXIST` (a non-exclusive `create` opens the winner's
//! file). The directory's first shard that is up and in arbitrates (see
//! [`Object::insert_single`](peregrine::Object::insert_single)), so creates go on while a replica is out.
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
//! count is changed after its entry change, not in the same transaction;
//! the engine has no atomic add): a client killed, or an engine failure,
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
//! # Hard links
//! A file with one name keeps everything in its entry (one fetch per
//! lookup, as before hard links existed). Its second name (`link`) moves
//! its attributes and xattrs to an **inode record** in the container's
//! inode table (the object of the superblock's class with id (0, 2); dkey
//! `"i"` + the file's object id, 16 bytes LE; akeys `"inode"` (the entry),
//! `"nlink"` (u64 LE) and the `"x:"` xattrs), and each name then holds a
//! *linked* entry (flag bit 1): the type and the object id only. Lookups
//! of a linked name return the record's node (parent: the inode table,
//! name: the record's dkey), so chmod, utimens, truncate and xattrs through
//! any name change the one record, and `st_nlink` is its count. link,
//! unlink, and a rename over a linked name are one transaction each that
//! expects the count (and the entries) as read: two mounts adding and
//! removing names of one file at once lose no count. The last name's
//! removal punches the record and (once closed) the data. A record keeps
//! serving a file whose count went back to 1. Inode numbers come from the
//! object id, so every name shows one inode.
//!
//! # Renames
//! A rename changes two entries, possibly in two directory objects on two
//! engines: it is one engine transaction ([`peregrine::Transaction`], as
//! DAOS DTX), all of it applied or none, whatever fails. It reads the source
//! entry and the destination entry (or their absence) with the epochs of
//! their versions, then commits the new destination (entry and xattrs; the
//! old occupant's other xattrs punched) and the source's removal (for
//! `RENAME_EXCHANGE`: the destination's old entry and xattrs written there)
//! expecting both entries unchanged since those epochs and a free
//! destination still free. The engines check that while preparing, and
//! refuse a change of an entry another transaction holds prepared, so of
//! several clients renaming one entry exactly one commits; the others read
//! again (the entry is gone: `ENOENT`). A client killed in the middle
//! leaves a transaction that the engines settle (committed if every shard
//! prepared it, else aborted). unlink and rmdir likewise remove an entry
//! only if it is the version they read, so they never punch an object
//! that a rename moved under them. Not covered: the xattrs moved are read
//! before the commit and not checked, so an xattr set by another client in
//! between can be lost (the entry itself cannot). Renames left half done by
//! clients of before transactions are settled when read (`legacy.rs`).
//!
//! Removal and the data: an unlink (or rmdir, or a rename over a file)
//! returns once the name is removed; the object behind it is punched after
//! (`Dfs::release_object`): the object is queued, and the mount's queue
//! sends the punches of up to `peregrine::DISCARD_BATCH` objects together,
//! one request per target, at most `peregrine::DISCARD_DELAY` later, and
//! everything queued when the last handle of the mount drops (the
//! interception library also at exit and before an exec). A punch that
//! fails is made again with the retries of a synchronous one, then logged:
//! no name reaches the object, so only space is at stake. A client killed
//! with objects queued or punches in flight leaves those objects unpunched.

mod dfs;
mod dir;
mod dirstat;
mod entry;
mod file;
mod hardlink;
mod legacy;
mod links;
mod mount;
mod node;
mod rename;
mod times;
mod xattr;

pub use dfs::Dfs;
pub use dir::{DirEntry, DirHandle};
pub use entry::{Entry, Move, Xattrs};
pub use file::{chunk_dkey, File};
pub use node::{Node, SetAttr, Stat, StatFs};
pub use times::DIR_TIME_TICK_NS;

use peregrine::Error;
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

/// 64 bits from the operating system, for values no other client (or
/// mount) may draw too: a forked child's thread RNG may hand out the bytes
/// it buffered before the fork, the same in every child.
fn unique_u64() -> u64 {
    use rand::RngCore;
    rand::rngs::OsRng.next_u64()
}

fn show(name: &[u8]) -> String {
    String::from_utf8_lossy(name).into_owned()
}
