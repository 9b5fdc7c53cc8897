//! Directory listings, READDIR and READDIRPLUS: ".", "..", then the entries
//! of the handle's snapshot from the cookie on. READDIRPLUS also answers
//! each entry's attributes, so `ls -l` or `find` need no lookup per entry;
//! the kernel counts each such entry as a lookup, and so does the inode
//! table here (not for "." and "..", which the kernel leaves alone).

use super::{kind_of, Handle, PeregrineFs};
use fuser::{FileAttr, FileHandle, FileType, INodeNo};
use peregrine::Error;
use peregrine_dfs::{DirEntry, Node, Stat};
use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

/// Entries read from the store per round.
const BATCH: usize = 128;

/// Offsets: 1 after ".", 2 after "..", 2 + c after snapshot cookie c.
const DOTS: u64 = 2;

impl PeregrineFs {
    /// Feed `add(ino, offset, kind, name, attributes)` the listing of the
    /// open directory `fh` (inode `ino`) from `offset` on, until `add`
    /// reports the reply full. With `plus`, the attributes are the entry's
    /// own (read from the store); without, only the inode and kind matter.
    pub(super) fn list(
        &self,
        ino: INodeNo,
        fh: FileHandle,
        offset: u64,
        plus: bool,
        mut add: impl FnMut(INodeNo, u64, FileType, &OsStr, &FileAttr) -> bool,
    ) -> Result<(), Error> {
        let h = self.handle(fh)?;
        let Handle::Dir(d) = &*h else {
            return Err(Error::new(-libc::ENOTDIR, "not a directory handle"));
        };
        let dir = self.node(ino)?;
        // "." and "..": the kernel takes neither's attributes from a listing.
        let stub = self.attr(&self.dfs.stat_of(&dir.entry, 4096));
        let parent = match ino.0 {
            1 => 1,
            _ => self.ino(dir.parent),
        };
        let dots = [(ino, "."), (INodeNo(parent), "..")];
        for (i, (n, name)) in dots.iter().enumerate().skip(offset as usize) {
            let attr = FileAttr { ino: *n, ..stub };
            if add(
                *n,
                i as u64 + 1,
                FileType::Directory,
                OsStr::new(name),
                &attr,
            ) {
                return Ok(());
            }
        }
        let mut cookie = offset.saturating_sub(DOTS);
        loop {
            let batch: Vec<(DirEntry, Option<(Node, Stat)>)> = match plus {
                true => (self.dfs.readdir_plus(d, cookie, BATCH)?.into_iter())
                    .map(|(e, n, st)| (e, Some((n, st))))
                    .collect(),
                false => (self.dfs.readdir(d, cookie, BATCH)?.into_iter())
                    .map(|e| (e, None))
                    .collect(),
            };
            let Some(last) = batch.last().map(|(e, _)| e.cookie) else {
                return Ok(());
            };
            for (e, read) in &batch {
                let (ino, kind) = (INodeNo(self.ino(e.entry.oid)), kind_of(e.entry.mode));
                let attr = match read {
                    Some((_, st)) => self.attr(st),
                    None => FileAttr { ino, kind, ..stub },
                };
                if add(
                    ino,
                    e.cookie + DOTS,
                    kind,
                    OsStr::from_bytes(&e.name),
                    &attr,
                ) {
                    return Ok(());
                }
                if let Some((node, _)) = read {
                    self.remember(node);
                }
            }
            cookie = last;
        }
    }
}
