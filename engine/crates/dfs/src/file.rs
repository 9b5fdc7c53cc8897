//! [`File`]: the file handle type (read_at, write_at, size, truncate) over
//! a file's array object of chunks.

use crate::{err, DATA_AKEY};
use peregrine::sync::Mutex;
use peregrine::{par_map, Container, Error, Object, ObjectId, Result};
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

/// The most a read that does not know the file's size fetches while it
/// asks where the file ends: every byte asked for comes back, zeros past
/// the end, so a guess beyond the usual small file costs more to move
/// than the round trip it saves (a 64 KiB read of a 3901-byte file was
/// slower this way than asking the size first).
const FIRST_READ_GUESS: usize = 16 << 10;

/// Chunk dkey of chunk `idx`.
pub fn chunk_dkey(idx: u64) -> [u8; 8] {
    idx.to_be_bytes()
}

fn chunk_index(dkey: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(dkey.try_into().ok()?))
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
        let size = match self.obj.last_sized(DATA_AKEY) {
            Ok(None) => 0,
            Ok(Some((d, s))) => match chunk_index(&d) {
                Some(idx) => idx * self.chunk + s,
                // A dkey that is not a chunk's sorts last: count chunks only.
                None => self.size_listed()?,
            },
            Err(e) if e.code == -libc::EOPNOTSUPP => self.size_listed()?,
            Err(e) => return Err(e),
        };
        self.cached.store(size, Ordering::Relaxed);
        Ok(size)
    }

    /// [`File::size`] from a listing of every dkey (engines that predate
    /// the query of the last sized dkey).
    fn size_listed(&self) -> Result<u64> {
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
        // Bytes at the start of `buf` read already.
        let mut have = 0;
        if off + buf.len() as u64 > size {
            // A read from the end this handle knows (the last read of a
            // read-to-EOF loop, a follower of a growing file) asks the
            // size alone: most find nothing more to fetch.
            let learnt = match off < size || size == 0 {
                true => self.read_learning_size(off, buf)?,
                false => None,
            };
            (size, have) = match learnt {
                Some(v) => v,
                None => (self.size()?, 0),
            };
        }
        if off >= size {
            return Ok(0);
        }
        let n = ((size - off) as usize).min(buf.len());
        if have < n {
            self.fetch_known(off + have as u64, &mut buf[have..n])?;
        }
        Ok(n)
    }

    /// Fetch `buf.len()` bytes at `off`, all below the file's end.
    fn fetch_known(&self, off: u64, buf: &mut [u8]) -> Result<()> {
        let pieces = self.pieces(off, buf.len());
        if pieces.len() == 1 {
            let (idx, within, _, _) = pieces[0];
            return self
                .obj
                .fetch_array_into(&chunk_dkey(idx), DATA_AKEY, within, buf);
        }
        let mut rest: &mut [u8] = buf;
        let mut slices = Vec::with_capacity(pieces.len());
        for &(idx, within, len, _) in &pieces {
            let (a, b) = rest.split_at_mut(len);
            slices.push((idx, within, a));
            rest = b;
        }
        // Each piece's buffer is its own; the mutex only lets a shared
        // item hand out its `&mut` (never contended).
        let slices: Vec<_> = slices
            .into_iter()
            .map(|(idx, within, b)| (idx, within, Mutex::new(b)))
            .collect();
        par_map(&slices, slices.len(), |(idx, within, b)| {
            let mut b = b.lock();
            self.obj
                .fetch_array_into(&chunk_dkey(*idx), DATA_AKEY, *within, &mut b[..])
        })
        .into_iter()
        .collect::<Result<()>>()
    }

    /// A read past the size this handle knows: its first bytes (at most
    /// [`FIRST_READ_GUESS`], within one chunk) and the file's end asked
    /// together, one round trip where [`File::size`] then the fetch took
    /// two. (The file's size, the bytes at the start of `buf` read), or
    /// `None` if they were not answered together, or if the fetch did not
    /// see as far as the end it would return (a write landed between the
    /// two answers: its bytes would read as zeros): the caller then reads
    /// knowing the size.
    fn read_learning_size(&self, off: u64, buf: &mut [u8]) -> Result<Option<(u64, usize)>> {
        let (idx, within) = (off / self.chunk, off % self.chunk);
        let guess = buf
            .len()
            .min(FIRST_READ_GUESS)
            .min((self.chunk - within) as usize);
        if guess == 0 {
            return Ok(None);
        }
        let Some(got) = self.obj.fetch_array_with_end(
            &chunk_dkey(idx),
            DATA_AKEY,
            within,
            &mut buf[..guess],
        )?
        else {
            return Ok(None);
        };
        let size = match got.last {
            None => 0,
            Some((d, s)) => match chunk_index(&d) {
                Some(last) => last * self.chunk + s,
                None => return Ok(None),
            },
        };
        self.cached.store(size, Ordering::Relaxed);
        let read = size.min(off + guess as u64).saturating_sub(off);
        if read > 0 && idx * self.chunk + got.seen < off + read {
            return Ok(None);
        }
        Ok(Some((size, read as usize)))
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
            par_map(&pieces, pieces.len(), |&(idx, within, len, at)| {
                self.obj
                    .update_array(&chunk_dkey(idx), DATA_AKEY, within, &data[at..at + len])
            })
            .into_iter()
            .collect::<Result<()>>()?;
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
