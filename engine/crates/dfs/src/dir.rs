//! Directory listing: [`DirHandle`] (the names, snapshot at the first
//! read) and readdir.

use crate::{Dfs, Entry, Node, Stat, COUNT_DKEY, READDIR_PARALLEL};
use peregrine::{par_map, ObjectId, Result};
use std::sync::OnceLock;

/// A snapshot of a directory's names taken at the first read: cookies are
/// positions in it (1-based; 0 = start), so they stay valid while entries
/// are added or removed (added ones are not shown, removed ones are
/// skipped). Not at open: a directory is opened far more often than it is
/// listed (fchdir, fstat, `openat` relative to it, the interception
/// library's ioctls), and listing a large one costs a query of every shard.
#[derive(Debug)]
pub struct DirHandle {
    pub dir: ObjectId,
    names: OnceLock<Vec<Vec<u8>>>,
}

/// One entry returned by [`Dfs::readdir`].
#[derive(Clone, Debug)]
pub struct DirEntry {
    pub name: Vec<u8>,
    /// Pass this cookie to resume after this entry.
    pub cookie: u64,
    pub entry: Entry,
}

impl Dfs {
    /// Snapshot the names of directory `node` (sorted byte-wise).
    pub fn opendir(&self, node: &Node) -> Result<DirHandle> {
        Self::need_dir(node)?;
        Ok(DirHandle {
            dir: node.oid(),
            names: OnceLock::new(),
        })
    }

    /// The names of `h`, listed at its first read.
    fn names<'h>(&self, h: &'h DirHandle) -> Result<&'h [Vec<u8>]> {
        if let Some(n) = h.names.get() {
            return Ok(n);
        }
        let mut names = self.obj(h.dir)?.list_dkeys()?;
        names.retain(|k| k != COUNT_DKEY);
        // Two first reads at once: one listing is kept, both read it.
        let _ = h.names.set(names);
        Ok(h.names.get().expect("set just now"))
    }

    /// Up to `max` entries after `cookie` (0 = from the start); entries
    /// removed since the first read are skipped. Entries are fetched in parallel;
    /// a hard link shows its inode record's attributes.
    pub fn readdir(&self, h: &DirHandle, cookie: u64, max: usize) -> Result<Vec<DirEntry>> {
        Ok(self
            .readdir_nodes(h, cookie, max)?
            .into_iter()
            .map(|(cookie, name, node)| DirEntry {
                name,
                cookie,
                entry: node.entry,
            })
            .collect())
    }

    /// Like [`Dfs::readdir`], each entry with its node and attributes (as
    /// [`Dfs::lookup`] and [`Dfs::stat_node`] give them): what
    /// READDIRPLUS answers, so a listing needs no lookup per entry. The
    /// attributes (a file's size is a query of its object) are read in
    /// parallel.
    pub fn readdir_plus(
        &self,
        h: &DirHandle,
        cookie: u64,
        max: usize,
    ) -> Result<Vec<(DirEntry, Node, Stat)>> {
        let nodes = self.readdir_nodes(h, cookie, max)?;
        let stats = par_chunks(&nodes, |(_, _, n)| self.stat_node(n));
        nodes
            .into_iter()
            .zip(stats)
            .map(|((cookie, name, node), st)| {
                let e = DirEntry {
                    name,
                    cookie,
                    entry: node.entry.clone(),
                };
                Ok((e, node, st?))
            })
            .collect()
    }

    /// (cookie, name, node) of up to `max` entries after `cookie`, fetched
    /// in parallel; a hard link resolved to its inode record (each node as
    /// [`Dfs::lookup`] gives it, without the attributes' queries).
    pub fn readdir_nodes(
        &self,
        h: &DirHandle,
        cookie: u64,
        max: usize,
    ) -> Result<Vec<(u64, Vec<u8>, Node)>> {
        let names = self.names(h)?;
        let start = (cookie as usize).min(names.len());
        let end = start.saturating_add(max).min(names.len());
        let idx: Vec<usize> = (start..end).collect();
        let fetched = par_chunks(&idx, |&i| self.fetch_entry(h.dir, &names[i]));
        let mut out = Vec::with_capacity(idx.len());
        for (i, r) in idx.into_iter().zip(fetched) {
            if let Some(entry) = r? {
                let node = self.resolve(h.dir, &names[i], entry)?;
                out.push((i as u64 + 1, names[i].clone(), node));
            }
        }
        Ok(out)
    }
}

/// `f` over `items`, in up to [`READDIR_PARALLEL`] parts side by side,
/// results in order.
fn par_chunks<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> R + Sync) -> Vec<R> {
    if items.len() <= 1 {
        return items.iter().map(&f).collect();
    }
    let parts: Vec<&[T]> = items
        .chunks(items.len().div_ceil(READDIR_PARALLEL))
        .collect();
    par_map(&parts, READDIR_PARALLEL, |part| {
        part.iter().map(&f).collect::<Vec<_>>()
    })
    .into_iter()
    .flatten()
    .collect()
}
