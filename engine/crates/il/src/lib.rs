//! `libperegrine_il.so`: the Peregrine interception library (as DAOS libioil).
//!
//! `LD_PRELOAD=libperegrine_il.so prog ...`: when `prog` opens a regular
//! file in a Peregrine FUSE mount (`fuse.peregrine` in
//! /proc/self/mountinfo), the library asks the daemon for the file's object
//! handle (`ioctl(PEREGRINE_IOC_GET_HANDLE)`, include/peregrine_fuse.h) and
//! from then on moves the file's *data* straight between the program and the
//! engines through the client library ([`peregrine_dfs::File`]). Like
//! DAOS's libpil4dfs it also serves path-based metadata calls on files of
//! a Peregrine mount (stat, access, mkdir, unlink, rmdir, rename) straight
//! through the POSIX layer ([`peregrine_dfs::Dfs`]) with a per-process
//! cache; see "Path calls" below. Anything it does not handle falls back
//! to the kernel path.
//!
//! # What is intercepted
//! * open, open64, openat, openat64, creat, creat64, `__open_2` & co.,
//!   fopen, fopen64: after the real call, a regular file whose device is a
//!   Peregrine mount is *tracked* if the ioctl answers and the container can
//!   be opened (else: kernel path, unchanged).
//! * On tracked descriptors: read, write, pread(64), pwrite(64), readv,
//!   writev, preadv(64), pwritev(64), preadv2, pwritev2, preadv64v2,
//!   pwritev64v2, `__read_chk`, `__pread(64)_chk`, lseek(64)
//!   (SEEK_END/DATA/HOLE from the store), fsync, fdatasync, ftruncate(64),
//!   fstat(64) (+ `__fxstat(64)`; size from the store), close, dup, dup2,
//!   dup3, fcntl(64) F_DUPFD/F_DUPFD_CLOEXEC (and F_SETFL for O_APPEND),
//!   copy_file_range and sendfile (emulated with reads and writes when
//!   either side is tracked).
//! * mmap, mmap64 of a file in a Peregrine mount (tracked or not): the file
//!   is handed to the kernel path first, see "mmap" below.
//! * stdio on a `FILE*` whose descriptor is tracked (whatever opened it:
//!   fopen, fdopen, freopen, stdout after dup2): fread, fwrite,
//!   `fread_unlocked`, `fwrite_unlocked`, `__fread_chk`, fseek, fseeko(64),
//!   ftell, ftello(64), fclose. glibc owns the `FILE`; each intercepted call
//!   first flushes glibc's buffer (`fflush`, which for input streams also
//!   moves the kernel offset back to the logical position), then does
//!   unbuffered I/O through the store. Other stdio calls (fgets, fprintf,
//!   getc, ...) keep using glibc's buffer and the kernel path; that stays
//!   consistent because of the offset rule below.
//!
//! # Path calls (metadata)
//! * Served: stat, stat64, lstat, lstat64, fstatat(64), statx, `__xstat`,
//!   `__lxstat`, `__fxstatat` (and 64), access, faccessat, euidaccess,
//!   eaccess, mkdir, mkdirat, unlink, unlinkat, rmdir, rename, renameat,
//!   renameat2 (NOREPLACE), and opens (below). The answers are the kernel's for
//!   the same path through the mount: same st_dev, the daemon's inode
//!   numbers (`stat::ino_of`), link counts, block size, statx mask and
//!   attributes, the same errnos (tests/meta.rs compares them field by
//!   field).
//! * Which paths: absolute, or relative to the cwd (`getcwd` each call),
//!   whose longest mount point prefix in /proc/self/mountinfo is a
//!   `fuse.peregrine` mount (reread when the kernel signals a change of
//!   the mount table). The walk below the mount point is the library's
//!   (`walk.rs`): `.` and `..` are handled; a symlink on the way, `..`
//!   above the mount root, paths relative to a directory fd, flags it does
//!   not know, trailing slashes on changes: the kernel path. Permission
//!   checks are the kernel's (search on each directory, write+search on
//!   the parent, the sticky bit, write on a directory moved elsewhere);
//!   what the mode bits deny goes to the kernel, which may still allow it
//!   (capabilities), so the library never grants or denies differently.
//!   Mounts without `allow_other` serve only their owner.
//! * The container: the daemon hands it out for an open file or
//!   directory of the mount, so the library learns a mount's container
//!   from the first regular file the process opens there through the
//!   kernel, or from the mount's root directory (`ns.rs`; with an older
//!   daemon, which answers on regular files only, from one it finds in
//!   the mount's first directories: an empty mount is then served on the
//!   kernel path until a file exists).
//! * The cache (`cache.rs`): directory entries and attributes (sizes
//!   included), each kept for at most `PEREGRINE_IL_CACHE_MS` (default
//!   1000 ms, the daemon's default `--attr-timeout`/`--dentry-timeout`;
//!   0 turns it off). **Bound:** another client's change (another process
//!   on this node included: each process has its own cache) is seen by a
//!   path call through the library at most that long after it happened,
//!   as the kernel's own caches do on the FUSE path; this process's own
//!   changes are seen at once (the library updates or drops what it
//!   touched; its writes through tracked fds drop the file's attributes;
//!   chmod, chown, truncate, utimes, link, symlink, mknod and any change
//!   it hands to the kernel drop the whole cache). No negative entries:
//!   a name made elsewhere is seen at once.
//! * The kernel's caches: the library changes the namespace behind the
//!   kernel's back, so kernel-path calls (of this process or others on the
//!   node) can see the kernel's older view for up to the daemon's
//!   timeouts, the same bound as a change made by another client: a
//!   directory's attributes (mtime, link count) for `--attr-timeout`, and
//!   for `--dentry-timeout` an entry the kernel still holds for a name
//!   another client removed and the library made again. The directories
//!   this process changed are made fresh in the kernel before it forks,
//!   execs, spawns or exits (`exit` and `_exit`; `dirs_changed.rs`), so the
//!   programs it starts and those that run after it (a shell's next
//!   command) see their new attributes at once; the bound is left for
//!   processes that run beside it. Removals are kept
//!   to names the kernel cannot hold (below), because a stale entry left
//!   by a removal would make a kernel-path open of the name open the
//!   removed file. (Closing this needs the daemon: `notify_inval_entry`
//!   behind an ioctl that takes a directory and a name, or ESTALE from
//!   OPEN of an inode whose entry is gone, which makes the kernel look the
//!   name up again; `PEREGRINE_IOC_INVALIDATE` drops an open file's
//!   attributes and pages only.)
//! * Opens (`place.rs`): open, open64, openat(64), creat(64), `__open_2`
//!   & co. of a file they create write-only (O_CREAT on a free name,
//!   O_WRONLY; read-write creates go to the kernel, see place.rs) or of
//!   an existing regular file read-only are served with no
//!   kernel or daemon round trip; the descriptor is a *placeholder*, a
//!   memfd the library serves wholly (a created file's has its own,
//!   whose offset the kernel keeps; a file opened for reading gets a dup
//!   of one shared, sealed, read-only memfd, whose offset the library
//!   keeps for it and its dups; fstat, statx and fstatat with
//!   AT_EMPTY_PATH and F_GETFL answer for the file). It becomes the real
//!   file (opened through the mount by its path, at the same offset, on
//!   the same descriptor numbers) before fork (all: parent and child then
//!   share the kernel's open file, whatever the child execs), exec
//!   (execve, execv, execvp, execvpe, fexecve: those not close-on-exec;
//!   posix_spawn(p), system, popen: all), mmap, fcntl locks/leases/seals, flock, ioctl, fchmod,
//!   fchown, futimens, f*xattr, fstatfs, fstatvfs, fallocate,
//!   posix_fallocate, splice, tee, syncfs, readahead. Writes to an
//!   existing file, O_TRUNC of one, O_PATH, O_DIRECTORY, O_TMPFILE,
//!   directories, symlinks and special files: the kernel. A written
//!   placeholder records size and mtime in the entry at close, fsync and
//!   fstat (a file made and written within one 4 ms clock tick keeps the
//!   mtime it was made with, as Linux's coarse file times would). Reads
//!   and fstat of a placeholder ask the store for the size, as for tracked
//!   descriptors (the cache's bound is for path calls): processes sharing
//!   a file through the library see each other's writes at once. The one
//!   exception: a small file (up to 64 KiB) this process created and wrote
//!   through a placeholder is read back from its memory within
//!   `PEREGRINE_IL_CACHE_MS` of its close, as a local file from the page
//!   cache (`data_cache.rs`; `PEREGRINE_IL_DATA_CACHE_MB`, default 64, 0
//!   off). Its own later changes (writes and truncates through the library,
//!   any kernel-path write, fallocate, splice, mmap, a spawned program)
//!   drop what is kept at once; another process's rewrite of such a file is read within the
//!   path cache's bound.
//!   Writes that reach the memfd around the interposers (glibc's stdio
//!   flushing a stream with its internal write, dprintf, raw system
//!   calls) are moved into the file before the library serves it again,
//!   at close and at exit (`stray.rs`); placeholders never sit on
//!   descriptors 0-2 (stdin, stdout and stderr are glibc's streams) or
//!   under `fdopen`, and an open while one of 0-2 is closed goes to the
//!   kernel, which returns that number. Not covered: exec through execl,
//!   execlp and execle and glibc's internal spawns (variadic, or inside
//!   glibc) without a fork before them: a placeholder inherited that way
//!   is an empty memfd in the new program; `/proc/self/fd/N` of a
//!   placeholder names the memfd; reads around the interposers see the
//!   empty memfd, and zeros written around them over bytes the library
//!   wrote are not seen (`stray.rs`).
//!   vfork is a fork (convert.rs explains why), so that shells that
//!   redirect in the parent and vfork (dash) hand the real file over.
//! * Removals (unlink, rmdir, the source of a rename) are served only for
//!   names this process made through the library and never opened on the
//!   kernel path: the kernel cannot hold a directory entry for those. A
//!   removal behind the kernel's back of a name it holds would leave that
//!   entry pointing at the removed object for up to `--dentry-timeout`,
//!   and a kernel-path open of the name (in any process of the node)
//!   would open the removed file instead of making a new one. So other
//!   removals, and renames onto an existing name, go to the kernel.
//! * Removing or renaming a file this process has open (tracked or a
//!   placeholder, which becomes the real file first) or mapped goes to the
//!   kernel, so that the daemon keeps its data until the last close; a
//!   file open in *another* process is punched at once by a removal
//!   through the library (as with two clients of DFS).
//! * On by default; `PEREGRINE_IL_METADATA=0` sends path calls to the
//!   kernel while data calls are still intercepted. Changes this process
//!   makes on the kernel path (opens that create or truncate, chmod,
//!   removals and renames it does not serve...) drop the cache, and
//!   removals and renames handed to the kernel first make every live
//!   placeholder a real file (the name removed may be one of a
//!   hard-linked file's). Counted in the report as `path_stats`,
//!   `path_access`, `mkdirs`, `unlinks`, `rmdirs`, `renames`,
//!   `path_opens`, `path_creates` (served; served opens count in `opens`
//!   too) and `path_fallbacks` (paths in a served mount handed to the
//!   kernel).
//! * fork: placeholders become real files first; the child keeps the
//!   cache and the mounts' containers (as handles) and reconnects on first
//!   use; exec starts afresh.
//!
//! # Design
//! * A global `RwLock<Vec<Option<Arc<Shared>>>>` indexed by fd; dup'ed fds
//!   point at one `table::Shared` (the object handle, the [`peregrine_dfs::File`],
//!   access mode, O_APPEND, a dirty flag and a mutex serializing
//!   offset-moving calls). An atomic count of tracked fds keeps untracked
//!   programs at one atomic load per call.
//! * **The kernel's file offset is the offset.** read/write/readv/writev
//!   read it with `lseek(fd, 0, SEEK_CUR)` and move it with
//!   `lseek(fd, off + n, SEEK_SET)` (local in FUSE: no daemon round trip).
//!   So dup'ed fds share it, a forked child and its parent share it (as
//!   POSIX wants), a program exec'ed with an inherited fd continues where
//!   the library left off, and glibc's stdio (`ftell`, buffered `fgets`)
//!   agrees with intercepted calls. (Read-only placeholders keep their
//!   own, see place.rs: they become the real file, at that offset, before
//!   a fork, an exec or a stream could share it.)
//! * Coherence: writes mark the file dirty; on close, fsync, fstat and
//!   ftruncate of a dirty file the library sends
//!   `ioctl(PEREGRINE_IOC_INVALIDATE)` (added to peregrine-fuse for this):
//!   the daemon records size and mtime and drops the kernel's attributes
//!   and page cache for the inode (`notify_inval_inode`). Other processes
//!   then stat the new size and read the new data.
//! * mmap: a mapping's pages are the kernel's page cache, which the
//!   library's writes bypass, and its page faults check the kernel's idea
//!   of the size (beyond it: SIGBUS). So before a file of a Peregrine mount
//!   is mapped, every descriptor of that file (same st_dev and st_ino) in
//!   this process leaves the table, dirty ones are invalidated
//!   (`IOC_INVALIDATE`: the kernel drops pages and attributes) and a forced
//!   statx makes the kernel fetch the size; the mmap then goes ahead. The
//!   file is then on the kernel path *for the rest of the process*:
//!   descriptors opened later (and dups) are not tracked, and munmap does
//!   not bring it back (a mapping outlives its descriptor and can be split,
//!   moved by mremap and inherited by fork; the set is kept across fork,
//!   dropped at exec). Reads, writes, ftruncate and fallocate of the file
//!   then go through the page cache the mapping shares, as on ext4. A call
//!   through the library already under way when the file is mapped (another
//!   thread) finishes on the store and invalidates again. Counted as
//!   `mmaps` in the report (mappings of Peregrine files).
//! * Connections: one [`peregrine::Container`] per (mgmt, pool, container),
//!   made on the first tracked open. They are not fork-safe: the
//!   `pthread_atfork` child handler forgets (leaks, never drops: their
//!   locks and threads belong to the parent) every container and every
//!   `File`, and gives each tracked fd fresh locks; the child reconnects
//!   lazily on its first I/O.
//! * exec: LD_PRELOAD is inherited, the library starts afresh in the new
//!   image; inherited fds are plain kernel-path fds there until the program
//!   opens files itself (correct, only not accelerated: offsets are right
//!   because the kernel offset is the offset, data is right because
//!   dirty files were invalidated... on their close; an fd written by the
//!   library and then inherited without close is invalidated when the
//!   parent closes it).
//! * Re-entrancy: a thread-local flag is set while the library works; its
//!   own calls (sockets of the client library, mountinfo reads, stderr)
//!   that land in these interposers go straight to the real functions.
//!   Helper threads spawned by the client library see untracked fds and
//!   pass through too. No lock of the library is held across I/O.
//! * Panics never cross the C boundary: `catch_unwind` -> errno EIO, -1.
//! * `PEREGRINE_IL_DISABLE=1`: every interposer calls the real function.
//!   `PEREGRINE_IL_REPORT=1`: counts printed to stderr at exit (atexit), one
//!   line per process (`peregrine-il[pid]: ...`); a forked child starts at 0.
//!   When a file fell back to the kernel path (`fallbacks`) or the store
//!   could not be reached, the line ends with the first reason
//!   (`first_failure="..."`).
//!   Processes leaving with `_exit` (fio's job processes without
//!   `--thread`, dash) print nothing.
//! * Variadic `open`/`openat`/`fcntl`: stable Rust cannot define C-variadic
//!   functions; they are defined with a fixed trailing `mode: c_uint` (or
//!   `arg: c_ulong`). On x86-64 (System V) variadic and fixed arguments are
//!   passed in the same registers, so the callee reads the third/fourth
//!   integer register, which holds the mode when the caller passed one and
//!   junk the real function ignores when it did not. Not portable to ABIs
//!   that pass variadics differently (aarch64 Apple); fine on x86-64 and
//!   aarch64 Linux.
//!
//! # Layout
//! * `real.rs`: the real functions (dlsym RTLD_NEXT, the `real!` macro).
//! * `report.rs`: the switches, the re-entrancy flag and the counters.
//! * `handle.rs`: the daemon's object handle and the ioctl numbers.
//! * `table.rs`: the tracked descriptors, mapped files and connections.
//! * `mounts.rs`: which devices are Peregrine mounts, and where.
//! * `track.rs`: taking a file onto the library's path after an open.
//! * `mmap.rs`: handing a file back to the kernel path before a mapping.
//! * `io.rs`: reads, writes, seeks, stat, truncate and sync through the store.
//! * `interpose.rs`: the open, read, write, seek, sync, truncate and stat
//!   interposers; `fd.rs`: close, dup, fcntl, copy_file_range, sendfile;
//!   `stdio.rs`: the `FILE*` ones.
//! * Path calls: `ns.rs` (a mount's [`peregrine_dfs::Dfs`]), `cache.rs`,
//!   `walk.rs` (locating and walking paths, permissions), `stat.rs` (stat
//!   and access), `nsops.rs` (mkdir, unlink, rmdir, rename, umask, and
//!   the calls that drop the cache), `dirs_changed.rs` (the directories
//!   changed, named to the daemon before fork, exec and exit; `_exit`).
//! * `init.rs`: the constructor, fork handlers and exit flush.
//!
//! # Not handled (kernel path, documented)
//! splice, io_uring/libaio, statx/fstatat(AT_EMPTY_PATH) (FUSE answers,
//! after the invalidation points above), fds closed by
//! `close_range`/`closefrom` (the stale entry is dropped when that fd
//! number is opened again). Static and Go binaries do not load LD_PRELOAD
//! libraries: they simply use FUSE.
//!
//! mmap across processes follows the same rules as read: a mapping in
//! process B sees process A's library writes after A's invalidation points
//! (close, fsync, fstat, ftruncate); stores into B's MAP_SHARED mapping
//! reach the engines when the kernel writes the pages back (msync, munmap,
//! writeback), and A reads them through the library after that. A process
//! without the library that maps a file another process has just grown
//! through the library faults beyond the old size until its kernel
//! refetches the attributes (any stat of the file does; attribute timeout).
//! mmap calls the C library makes internally (the dynamic loader's, for
//! instance) do not pass through the interposer; they are of files the
//! library does not write.

#![allow(clippy::missing_safety_doc)]
// The interposers are `unsafe extern "C"` replacements of glibc functions:
// their contract is the C prototype of the function they replace (see the
// "SAFETY (all interposers)" note in interpose.rs), and their bodies
// forward the caller's pointers to the real function or to the helpers
// (`slice`, `stream`, `stat_at`, ...) whose requirements are exactly that
// contract. An `unsafe {}` block with a comment around each of the ~300
// such forwards would repeat that one sentence; unsafe code that is not a
// forward of the caller's pointers is still in commented `unsafe {}`
// blocks (clippy::undocumented_unsafe_blocks applies crate-wide).
#![allow(unsafe_op_in_unsafe_fn)]

#[macro_use]
mod real;

mod cache;
mod convert;
mod data_cache;
mod dirs;
mod dirs_changed;
mod fd;
mod handle;
mod init;
mod interpose;
mod io;
mod mmap;
mod mounts;
mod ns;
mod nsops;
mod place;
mod probe;
mod report;
mod stat;
mod stdio;
mod stray;
mod table;
mod track;
mod walk;
