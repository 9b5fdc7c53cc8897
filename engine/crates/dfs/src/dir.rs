//! Directory listing: [`DirHandle`] (the names, snapshot at opendir) and
//! readdir.

use crate::{Dfs, Entry, Node, COUNT_DKEY, READDIR_PARALLEL};
use peregrine::{ObjectId, Result};

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

impl Dfs {
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
            if let Some(mut entry) = r? {
                if entry.linked {
                    // A hard link: the attributes are its record's.
                    entry = self.resolve(h.dir, &h.names[i], entry)?.entry;
                }
                out.push(DirEntry {
                    name: h.names[i].clone(),
                    cookie: i as u64 + 1,
                    entry,
                });
            }
        }
        Ok(out)
    }
}
