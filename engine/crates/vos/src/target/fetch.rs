//! The read side of a target: a fetch planned over the index, its pieces
//! read from the device (or copied from RAM), assembled into the reply.

use super::*;
use crate::request::{FetchReq, FetchedValue};

/// The fetches waiting to start and those whose reads are in flight.
#[derive(Default)]
pub(super) struct Fetches {
    /// Fetches waiting to start (for buffers, or for a checkpoint).
    pub(super) queued: Vec<Queued>,
    pub(super) jobs: HashMap<u64, InFetch>,
}

/// A fetch waiting to start, and where its source would take its bytes.
pub(super) type Queued = (FetchReq, Responder, Option<ReplyArea>);

/// Fetches whose device reads are in flight, started together. Each is
/// answered as soon as its own reads are done (a slow read delays only its
/// fetch), and the regions it read into released with its reply.
pub(super) struct InFetch {
    /// `None` once answered.
    pub(super) fetches: Vec<Option<Queued>>,
    pub(super) plans: Vec<Result<Vec<IodRead>, Errno>>,
    /// Per device op: where its bytes go, and where it reads them into.
    pub(super) reads: Vec<(PieceDst, ReadInto)>,
    /// Per fetch: its reads still in flight (the job is done when none is).
    pub(super) left: Vec<usize>,
}

/// A fetch of an [`InFetch`] whose reads are done: what its answer needs.
pub(super) struct Done {
    pub(super) queued: Queued,
    pub(super) plan: Result<Vec<IodRead>, Errno>,
    /// The regions its reads landed in: released once its reply is sent.
    pub(super) reads: Vec<(PieceDst, ReadInto)>,
}

impl InFetch {
    /// Take fetch `i`, whose reads are done (`None` if answered already).
    pub(super) fn take(&mut self, i: usize) -> Option<Done> {
        let queued = self.fetches[i].take()?;
        let plan = std::mem::replace(&mut self.plans[i], Ok(Vec::new()));
        let reads = self
            .reads
            .iter()
            .filter(|(dst, _)| dst.fetch == i)
            .copied()
            .collect();
        Some(Done {
            queued,
            plan,
            reads,
        })
    }
}

/// Where a fetch's device read lands.
#[derive(Clone, Copy)]
pub(super) enum ReadInto {
    /// A region of the registered buffers: (buffer, offset).
    Region(usize, usize),
    /// The source's reply area, at this address.
    Area(usize),
}

/// Give back the regions fetch reads landed in.
pub(super) fn release_reads(dev: &mut DeviceIo, reads: &[(PieceDst, ReadInto)]) {
    for (_, into) in reads {
        if let ReadInto::Region(buf, _) = *into {
            dev.release(buf);
        }
    }
}

/// `len` bytes the device read into a source's reply area at `addr`.
pub(super) fn area_bytes<'a>(addr: usize, len: usize) -> &'a [u8] {
    // SAFETY: the read completed, and the area stays mapped and untouched by
    // the engine until the fetch's reply has been sent (see ReplyArea).
    unsafe { std::slice::from_raw_parts(addr as *const u8, len) }
}

/// Where the bytes of one device read of a fetch go: (fetch, iod, seg,
/// start of the piece in the value, bytes wanted).
#[derive(Clone, Copy)]
pub(super) struct PieceDst {
    pub(super) fetch: usize,
    pub(super) iod: usize,
    pub(super) seg: usize,
    pub(super) start: u64,
    pub(super) len: usize,
}

/// Where some of a fetch's bytes are.
pub(super) enum Piece {
    Bytes(Vec<u8>),
    /// In a region of the registered buffers: (buffer, offset, length).
    Region(usize, usize, usize),
    /// In the source's reply area: (address, length).
    InArea(usize, usize),
}

/// One iod of a fetch being served.
pub(super) struct IodRead {
    pub(super) fv: FetchedValue,
    pub(super) has_crc: bool,
    /// The bytes returned (`fv.len` of them): pieces at their offsets, zeros
    /// between them.
    pub(super) out: Vec<(u64, Piece)>,
    /// Device segments still to read into `out`.
    pub(super) segs: Vec<Seg>,
    /// The client's checksum of exactly the bytes returned, if stored.
    pub(super) stored_crc: Option<u32>,
    /// A checksum failure of one of its chunks: the iod fails with it.
    pub(super) bad: Option<Errno>,
}

impl Target {
    /// Plan one fetch against the index: its iods, with inline bytes already
    /// in place; device segments still to read.
    pub(super) fn plan(&self, f: &FetchReq) -> Result<Vec<IodRead>, Errno> {
        let (pool, cont, obj) = self.addr(&f.addr, "fetch")?;
        // Planned after every change acknowledged before the fetch was taken.
        self.index
            .dtx
            .check_read("fetch", &pool, &cont, &obj, Some(&f.dkey), f.epoch)?;
        // What the ARRAY iods ask for is bounded already (`check_request`);
        // the SINGLE values' sizes are known once planned, before any read.
        let mut iods = Vec::with_capacity(f.iods.len());
        let mut total = 0u64;
        for iod in &f.iods {
            let (kind, offset) = (iod.kind.value_kind(), iod.kind.offset());
            let plan = self.index.plan_fetch(
                &pool, &cont, &obj, &f.dkey, &iod.akey, kind, offset, iod.len, f.epoch,
            );
            let mut r = IodRead {
                fv: FetchedValue {
                    status: plan.status,
                    size: plan.size,
                    absent: plan.absent,
                    epoch: plan.epoch,
                    ..Default::default()
                },
                has_crc: plan.has_crc,
                stored_crc: plan.stored_crc,
                out: Vec::new(),
                segs: Vec::new(),
                bad: None,
            };
            if plan.status == 0 {
                r.fv.len = plan.len;
                for s in plan.segs {
                    match s.src {
                        Src::Inline(b) => r.out.push((s.out_off, Piece::Bytes(b))),
                        Src::Dev { .. } if s.len > 0 => r.segs.push(s),
                        Src::Dev { .. } => {}
                    }
                }
                total = total.saturating_add(plan.len);
                if total > peregrine_proto::MAX_IO_BYTES {
                    return Err(Errno::inval(format!(
                        "fetch: dkey {:?}: its values come to more than {total} bytes, more than the limit of {} bytes per request (MAX_IO_BYTES); fetch them in several requests",
                        show(&f.dkey),
                        peregrine_proto::MAX_IO_BYTES
                    )));
                }
            }
            iods.push(r);
        }
        Ok(iods)
    }

    /// The device reads a planned batch of fetches needs: whole checksum
    /// chunks, at most one buffer each.
    pub(super) fn pieces(&self, plans: &[Result<Vec<IodRead>, Errno>]) -> Vec<(u64, PieceDst)> {
        let chunk = self.chunk;
        let mut pieces = Vec::new();
        for (fi, p) in plans.iter().enumerate() {
            let Ok(iods) = p else { continue };
            for (ii, r) in iods.iter().enumerate() {
                for (si, s) in r.segs.iter().enumerate() {
                    let Src::Dev {
                        ext,
                        value_len,
                        value_off,
                    } = &s.src
                    else {
                        continue;
                    };
                    let start = value_off / chunk * chunk;
                    let end = (value_off + s.len).div_ceil(chunk) * chunk;
                    let end = end.min(*value_len);
                    let mut ps = start;
                    while ps < end {
                        let pe = (ps + BUF_BYTES as u64).min(end);
                        let dst = PieceDst {
                            fetch: fi,
                            iod: ii,
                            seg: si,
                            start: ps,
                            len: (pe - ps) as usize,
                        };
                        pieces.push((self.data_off(ext.block) + ps, dst));
                        ps = pe;
                    }
                }
            }
        }
        pieces
    }

    /// Start the queued fetches: plan them all against the index, then
    /// submit all their device reads at once, packed into the registered
    /// buffers; each is verified, assembled and answered when its reads
    /// complete. Without room in the buffers they wait for completions.
    pub(super) fn start_fetches(&mut self) {
        if self.fetch.queued.is_empty() {
            return;
        }
        let fetches = std::mem::take(&mut self.fetch.queued);
        let plans: Vec<Result<Vec<IodRead>, Errno>> =
            fetches.iter().map(|(f, _, _)| self.plan(f)).collect();
        let pieces = self.pieces(&plans);
        let areas: Vec<Option<(usize, u64)>> = fetches
            .iter()
            .zip(&plans)
            .map(|((_, _, area), p)| area.and_then(|a| self.direct_into(a, p)))
            .collect();
        let mut ops = Vec::with_capacity(pieces.len());
        let mut reads = Vec::with_capacity(pieces.len());
        for &(off, dst) in &pieces {
            if let Some((addr, value_off)) = areas[dst.fetch] {
                let at = addr + (dst.start - value_off) as usize;
                let padded = dst.len.div_ceil(BLOCK as usize) * BLOCK as usize;
                ops.push(Op::read_into(off, at, padded));
                reads.push((dst, ReadInto::Area(at)));
                continue;
            }
            let Some(r) = self.dev.region(dst.len) else {
                release_reads(&mut self.dev, &reads);
                if self.dev.in_flight() == 0 && self.dev.regions_idle() {
                    // Larger than the buffers: the blocking path reads it in groups.
                    self.fetch_sync(fetches, plans, &pieces);
                } else {
                    self.fetch.queued = fetches;
                }
                return;
            };
            ops.push(Op::read(off, r));
            reads.push((dst, ReadInto::Region(r.0, r.1)));
        }
        self.prof.fetch_rounds += 1;
        self.prof.fetches += fetches.len() as u64;
        self.prof.read_pieces += pieces.len() as u64;
        if ops.is_empty() {
            for ((f, tx, _), p) in fetches.into_iter().zip(plans) {
                tx.send(p.map(|iods| self.assemble(&f, iods)));
            }
            return;
        }
        let tag = self.next_tag;
        self.next_tag += 1;
        if let Err(e) = self.dev.start(tag, &ops) {
            release_reads(&mut self.dev, &reads);
            let e = Errno::new(-libc::EIO, format!("target {}: submit reads: {e}", self.id));
            for (_, tx, _) in fetches {
                tx.send(Err(e.clone()));
            }
            return;
        }
        let mut left = vec![0; fetches.len()];
        for (dst, _) in &reads {
            left[dst.fetch] += 1;
        }
        let mut job = InFetch {
            fetches: fetches.into_iter().map(Some).collect(),
            plans,
            reads,
            left,
        };
        // Fetches served from RAM alone need not wait for the others' reads.
        for i in 0..job.left.len() {
            if job.left[i] == 0 {
                let d = job.take(i).expect("not answered yet");
                let (f, tx, _) = d.queued;
                tx.send(d.plan.map(|iods| self.assemble(&f, iods)));
            }
        }
        self.fetch.jobs.insert(tag, job);
    }

    /// Whether a planned fetch can be read from the device straight into
    /// its source's area: one iod whose bytes are all of one extent,
    /// starting on a checksum chunk (its reads are whole chunks, so they
    /// start exactly where the bytes go), that fits the area with the
    /// reads' padding. Returns the area's address and the value offset that
    /// lands at its start.
    pub(super) fn direct_into(
        &self,
        area: ReplyArea,
        plan: &Result<Vec<IodRead>, Errno>,
    ) -> Option<(usize, u64)> {
        let Ok([r]) = plan.as_deref() else {
            return None;
        };
        let [s] = r.segs.as_slice() else {
            return None;
        };
        let Src::Dev {
            value_off,
            value_len,
            ..
        } = &s.src
        else {
            return None;
        };
        let whole = r.fv.status == 0 && r.out.is_empty() && s.out_off == 0 && s.len == r.fv.len;
        let end = (value_off + s.len).div_ceil(self.chunk) * self.chunk;
        let span = wal::round_up(end.min(*value_len) - value_off);
        let fits = span <= area.len as u64 && area.addr.is_multiple_of(BLOCK as usize);
        (whole && value_off.is_multiple_of(self.chunk) && fits).then_some((area.addr, *value_off))
    }

    /// Serve planned fetches with blocking reads (nothing else in flight):
    /// for rounds larger than the registered buffers.
    pub(super) fn fetch_sync(
        &mut self,
        fetches: Vec<Queued>,
        mut plans: Vec<Result<Vec<IodRead>, Errno>>,
        pieces: &[(u64, PieceDst)],
    ) {
        let (id, chunk) = (self.id, self.chunk);
        let offs: Vec<(u64, usize)> = pieces.iter().map(|&(o, d)| (o, d.len)).collect();
        let ring = self.dev.read_many(&offs, |k, res| {
            let dst = pieces[k].1;
            let bytes = res.as_ref().ok().copied();
            if let Some((iod, at, from, len)) = absorb_piece(id, chunk, &mut plans, dst, res) {
                let part =
                    bytes.expect("a part of a read that succeeded")[from..from + len].to_vec();
                if let Ok(iods) = &mut plans[dst.fetch] {
                    iods[iod].out.push((at, Piece::Bytes(part)));
                }
            }
        });
        if let Err(e) = ring {
            let e = Errno::new(-libc::EIO, format!("target {id}: read: {e}"));
            for p in plans.iter_mut() {
                *p = Err(e.clone());
            }
        }
        for ((f, tx, _), p) in fetches.into_iter().zip(plans) {
            tx.send(p.map(|iods| self.assemble(&f, iods)));
        }
    }

    /// The reply of a fetch whose reads are done: its bytes in order, the
    /// pieces read borrowed from the registered buffers.
    pub(super) fn assemble(&self, f: &FetchReq, iods: Vec<IodRead>) -> (Answer, Gather<'_>) {
        let mut values = Vec::with_capacity(iods.len());
        let mut bulk = Gather::default();
        for (r, iod) in iods.into_iter().zip(&f.iods) {
            let mut fv = r.fv;
            if let Some(e) = r.bad {
                tracing::error!(target = self.id, dkey = %show(&f.dkey), akey = %show(&iod.akey), "{}", e.msg);
                fv.status = e.code;
                fv.len = 0;
            } else if fv.status == 0 {
                let mut out = r.out;
                out.sort_unstable_by_key(|(at, _)| *at);
                let in_area = |p: &Piece| match *p {
                    Piece::InArea(a, len) => Some(area_bytes(a, len)),
                    _ => None,
                };
                if !out.is_empty() && out.iter().all(|(_, p)| in_area(p).is_some()) {
                    // Read straight into the area (only for a fetch of one iod).
                    if r.has_crc {
                        fv.crc = Some(r.stored_crc.unwrap_or_else(|| {
                            out.iter().fold(0, |c, (_, p)| {
                                peregrine_isal::crc32c_append(c, in_area(p).expect("in area"))
                            })
                        }));
                    }
                    bulk = Gather::in_place(fv.len as usize);
                    values.push(fv);
                    continue;
                }
                let mut value = Gather::default();
                let mut at = 0u64;
                for (off, piece) in out {
                    value.push(Cow::Owned(vec![0u8; (off - at) as usize]));
                    let bytes = match piece {
                        Piece::Bytes(v) => Cow::Owned(v),
                        Piece::Region(buf, o, len) => Cow::Borrowed(self.dev.bytes(buf, o, len)),
                        Piece::InArea(..) => unreachable!("a fetch in its area is in it whole"),
                    };
                    at = off + bytes.len() as u64;
                    value.push(bytes);
                }
                value.push(Cow::Owned(vec![0u8; (fv.len - at) as usize]));
                // Only values written with a checksum are returned with one.
                if r.has_crc {
                    fv.crc = Some(r.stored_crc.unwrap_or_else(|| value.crc32c()));
                }
                bulk.append(value);
            }
            values.push(fv);
        }
        (Answer::Fetch(values), bulk)
    }
}

/// Check a completed device read of a fetch against its chunk checksums;
/// returns the part the caller asked for: (iod, offset in the iod's bytes,
/// offset in the piece, length), or nothing if the iod or its fetch failed.
pub(super) fn absorb_piece(
    id: u32,
    chunk: u64,
    plans: &mut [Result<Vec<IodRead>, Errno>],
    dst: PieceDst,
    res: std::io::Result<&[u8]>,
) -> Option<(usize, u64, usize, usize)> {
    let Ok(iods) = &mut plans[dst.fetch] else {
        return None;
    };
    let r = &mut iods[dst.iod];
    let s = &r.segs[dst.seg];
    let Src::Dev { ext, value_off, .. } = &s.src else {
        return None;
    };
    let bytes = match res {
        Ok(b) => b,
        Err(e) => {
            let e = Errno::new(
                -libc::EIO,
                format!("target {id}: read block {}: {e}", ext.block),
            );
            plans[dst.fetch] = Err(e);
            return None;
        }
    };
    let ps = dst.start;
    let c0 = (ps / chunk) as usize;
    for (i, b) in bytes.chunks(chunk as usize).enumerate() {
        let c = c0 + i;
        if ext.csums().get(c).copied() != Some(peregrine_isal::crc32c(b)) {
            r.bad.get_or_insert(Errno::new(
                -peregrine_proto::CSUM_ERRNO,
                format!(
                    "target {id}: checksum mismatch in chunk {c} ({chunk} bytes) of the extent at data block {} (device corruption)",
                    ext.block
                ),
            ));
            return None;
        }
    }
    // The part of the piece the caller asked for.
    let (from, to) = (
        ps.max(*value_off),
        (ps + bytes.len() as u64).min(value_off + s.len),
    );
    (from < to).then(|| {
        (
            dst.iod,
            s.out_off + from - value_off,
            (from - ps) as usize,
            (to - from) as usize,
        )
    })
}
