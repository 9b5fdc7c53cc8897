//! Open file handles: the handle table, what an open tells the kernel to
//! cache, and the ioctls on an open file (its handle bytes, invalidation)
//! or directory (directories another process changed).

use super::{
    DataCache, Handle, PeregrineFs, HANDLE_FLAG_RDONLY, HANDLE_MGMT_MAX, HANDLE_SIZE,
    HANDLE_VERSION,
};
use fuser::{FileHandle, FopenFlags, INodeNo};
use peregrine::{Error, ObjectId};
use peregrine_dfs::{File, Node};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

impl PeregrineFs {
    pub(super) fn handle(&self, fh: FileHandle) -> Result<Arc<Handle>, Error> {
        self.handles
            .lock()
            .get(&fh.0)
            .cloned()
            .ok_or_else(|| Error::new(-libc::EBADF, "unknown file handle"))
    }

    pub(super) fn add_handle(&self, h: Handle) -> u64 {
        let fh = self.next_fh.fetch_add(1, Ordering::Relaxed);
        self.handles.lock().insert(fh, Arc::new(h));
        fh
    }

    pub(super) fn open_flags(&self, ino: u64) -> FopenFlags {
        match self.opts.data_cache {
            DataCache::Off => FopenFlags::FOPEN_DIRECT_IO,
            DataCache::On => FopenFlags::FOPEN_KEEP_CACHE,
            DataCache::For(d) => {
                let mut t = self.inodes.lock();
                let Some(i) = t.get_mut(&ino) else {
                    return FopenFlags::empty();
                };
                let now = Instant::now();
                match i.cache_stamp {
                    Some(s) if now.duration_since(s) < d => FopenFlags::FOPEN_KEEP_CACHE,
                    _ => {
                        i.cache_stamp = Some(now);
                        FopenFlags::empty()
                    }
                }
            }
        }
    }

    /// Open `n` for I/O; `made_at`: the mtime it was made with, when the
    /// caller's create made it.
    pub(super) fn open_file(
        &self,
        n: &Node,
        made_at: Option<i64>,
        reply_fn: impl FnOnce(u64, FopenFlags),
    ) -> Result<(), Error> {
        let file = self.dfs.open(n)?;
        let ino = self.ino(n.oid());
        if let Some(i) = self.inodes.lock().get_mut(&ino) {
            i.open += 1;
        }
        let flags = self.open_flags(ino);
        let fh = self.add_handle(Handle::File {
            ino,
            file,
            written: AtomicBool::new(false),
            made_at,
        });
        reply_fn(fh, flags);
        Ok(())
    }

    /// `struct peregrine_fuse_handle` for object `oid` (a file's, with its
    /// chunk size, or a directory's with `HANDLE_FLAG_DIR`).
    pub(super) fn handle_bytes(&self, oid: ObjectId, chunk_size: u64, kind: u32) -> Vec<u8> {
        let cont = self.dfs.container();
        let mut b = Vec::with_capacity(HANDLE_SIZE);
        b.extend_from_slice(&HANDLE_VERSION.to_ne_bytes());
        let flags = kind
            | if self.opts.read_only {
                HANDLE_FLAG_RDONLY
            } else {
                0
            };
        b.extend_from_slice(&flags.to_ne_bytes());
        b.extend_from_slice(cont.pool().uuid().as_bytes());
        b.extend_from_slice(cont.uuid().as_bytes());
        b.extend_from_slice(&oid.hi.to_ne_bytes());
        b.extend_from_slice(&oid.lo.to_ne_bytes());
        b.extend_from_slice(&chunk_size.to_ne_bytes());
        b.extend_from_slice(&[0u8; 16]);
        let mut m = [0u8; HANDLE_MGMT_MAX];
        let a = self.opts.mgmt.as_bytes();
        let n = a.len().min(HANDLE_MGMT_MAX - 1);
        m[..n].copy_from_slice(&a[..n]);
        b.extend_from_slice(&m);
        debug_assert_eq!(b.len(), HANDLE_SIZE);
        b
    }

    /// `PEREGRINE_IOC_INVALIDATE_DIRS`: another process changed `dir`
    /// through the store (entries, times, link count): forget what this
    /// mount keeps of its attributes, then drop the kernel's.
    pub(super) fn dir_changed_elsewhere(&self, dir: ObjectId) -> Result<(), Error> {
        self.dfs.dir_changed_elsewhere(dir);
        self.drop_kernel_inode(self.ino(dir))
    }

    /// Drop the kernel's cached attributes and pages of inode `ino`.
    fn drop_kernel_inode(&self, ino: u64) -> Result<(), Error> {
        if let Some(nt) = self.notifier.get() {
            // offset 0, len 0: every page; attributes always.
            if let Err(e) = nt.inval_inode(INodeNo(ino), 0, 0) {
                // ENOENT: the kernel no longer caches the inode: nothing to do.
                if e.raw_os_error() != Some(libc::ENOENT) {
                    return Err(Error::new(-libc::EIO, format!("inval_inode: {e}")));
                }
            }
        }
        Ok(())
    }

    /// `PEREGRINE_IOC_INVALIDATE`: size from the store into the entry (with
    /// a new mtime), then drop the kernel's attributes and pages.
    pub(super) fn invalidate(&self, ino: u64, file: &File) -> Result<(), Error> {
        let size = file.size()?;
        let node = self.inodes.lock().get(&ino).map(|i| i.node.clone());
        if let Some(n) = node {
            self.dfs.touch_written(&n, size)?;
        }
        self.drop_kernel_inode(ino)
    }
}
