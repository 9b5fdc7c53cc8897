//! The workload the outage tests run: one writer keeping each object's
//! history of versions, readers checking each read against it.

use super::*;

/// What an object held after each of its versions.
#[derive(Default)]
pub(crate) struct History {
    /// CRC32C of the array bytes [0, span) after version v (index v).
    pub(crate) states: Vec<u32>,
    /// CRC32C of each EC cell's bytes of the array after version v (to name
    /// the cell and the versions of a read that matches none).
    pub(crate) cells: Vec<Vec<u32>>,
    /// The highest version acknowledged.
    pub(crate) acked: usize,
    /// The highest version started (acknowledged or not yet).
    pub(crate) started: usize,
    /// The array bytes after the last acknowledged version.
    pub(crate) last: Vec<u8>,
}

pub(crate) struct Workload {
    pub(crate) class: ObjectClass,
    /// Bytes of the array each read covers: the longest write.
    pub(crate) span: usize,
    pub(crate) hist: Vec<Mutex<History>>,
    pub(crate) stop: AtomicBool,
    pub(crate) writes: AtomicU64,
    pub(crate) reads: AtomicU64,
    pub(crate) wrong: Mutex<Vec<String>>,
    /// Updates may fail (the writer's retry window is short): a failed one
    /// must have taken effect wholly or not at all, which the writer checks
    /// by reading the object back.
    pub(crate) failures: AtomicU64,
    pub(crate) tolerate_failures: bool,
}

impl Workload {
    pub(crate) fn new(class: ObjectClass) -> Arc<Workload> {
        Arc::new(Workload::build(class))
    }

    pub(crate) fn build(class: ObjectClass) -> Workload {
        let k = match class.redundancy() {
            Redundancy::ErasureCode { data, .. } => data as usize,
            _ => 2,
        };
        let span = k * EC_CELL_SIZE as usize;
        let hist = (0..OBJECTS)
            .map(|_| {
                Mutex::new(History {
                    states: vec![crc32c(&vec![0u8; span])],
                    cells: vec![cell_crcs(&vec![0u8; span])],
                    last: vec![0u8; span],
                    ..Default::default()
                })
            })
            .collect();
        Workload {
            class,
            span,
            hist,
            stop: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            wrong: Mutex::new(Vec::new()),
            failures: AtomicU64::new(0),
            tolerate_failures: false,
        }
    }

    /// Version `v` of an object: a punch, a 128 KiB overwrite of the start
    /// (a partial EC stripe) or a whole-span one (full stripes). `state`
    /// becomes what the array holds after it, before the I/O starts.
    pub(crate) fn apply(
        &self,
        obj: &peregrine::Object,
        v: usize,
        state: &mut [u8],
        started: impl FnOnce(&[u8]),
    ) -> peregrine::Result<()> {
        if v.is_multiple_of(7) {
            state.fill(0);
            started(state);
            obj.punch_akeys(b"d", &[b"a"])?;
        } else {
            let len = if v.is_multiple_of(3) {
                self.span
            } else {
                128 << 10
            };
            let data = pattern(v as u64 * 1000 + obj.id().lo, len);
            state[..len].copy_from_slice(&data);
            started(state);
            obj.update_array(b"d", b"a", 0, &data)?;
        }
        obj.update_single(b"d", b"v", &(v as u64).to_le_bytes())
    }

    pub(crate) fn writer(self: &Arc<Self>, cont: peregrine::Container) {
        let mut v = 0usize;
        while !self.stop.load(Ordering::Relaxed) {
            // Overwrites pile up while aggregation is capped (targets out):
            // a pace the test pools hold for a minute.
            std::thread::sleep(Duration::from_millis(4));
            v += 1;
            let i = (v as u64 * 5) % OBJECTS;
            let obj = cont.object(oid(self.class, i)).unwrap();
            let mut state = self.hist[i as usize].lock().unwrap().last.clone();
            let r = self.apply(&obj, v, &mut state, |s| {
                let mut h = self.hist[i as usize].lock().unwrap();
                h.states.push(crc32c(s));
                h.cells.push(cell_crcs(s));
                h.started = h.states.len() - 1;
            });
            let mut h = self.hist[i as usize].lock().unwrap();
            match r {
                Ok(()) => {
                    h.acked = h.states.len() - 1;
                    h.last = state;
                    self.writes.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if self.tolerate_failures => {
                    drop(h);
                    self.failures.fetch_add(1, Ordering::Relaxed);
                    self.settle_failed(&obj, i, v, state, &e);
                }
                Err(e) => self
                    .wrong
                    .lock()
                    .unwrap()
                    .push(format!("object {i} version {v}: write failed: {e}")),
            }
        }
    }

    /// Version `v` of object `i` failed: read the array back (degraded if
    /// an engine is away; a transaction still in doubt is waited for). It
    /// must be wholly the version before or wholly `v`; the history goes
    /// on from the one it is.
    pub(crate) fn settle_failed(
        &self,
        obj: &peregrine::Object,
        i: u64,
        v: usize,
        new: Vec<u8>,
        e: &peregrine::Error,
    ) {
        let got = obj.fetch_array(b"d", b"a", 0, self.span);
        let mut h = self.hist[i as usize].lock().unwrap();
        match got {
            Ok(d) if d == new => {
                h.acked = h.states.len() - 1;
                h.last = d;
            }
            Ok(d) if d == h.last => {}
            Ok(d) => self.wrong.lock().unwrap().push(format!(
                "object {i} version {v} failed ({e}) and left the array neither as it was nor as written (crc {:#x})",
                crc32c(&d)
            )),
            Err(r) => self.wrong.lock().unwrap().push(format!(
                "object {i} version {v} failed ({e}); reading it back failed too: {r}"
            )),
        }
    }

    /// One checked read of object `i`.
    pub(crate) fn check(&self, cont: &peregrine::Container, i: u64) {
        let obj = cont.object(oid(self.class, i)).unwrap();
        let floor = self.hist[i as usize].lock().unwrap().acked;
        let got = obj.fetch_array(b"d", b"a", 0, self.span);
        let single = obj.fetch_single(b"d", b"v");
        let h = self.hist[i as usize].lock().unwrap();
        let ceil = h.started;
        let problem = match (got, single) {
            (Err(e), _) | (_, Err(e)) => Some(format!("read failed: {e}")),
            (Ok(data), Ok(s)) => {
                let crc = crc32c(&data);
                let versions = floor..=ceil;
                // Version numbers of this object: the writer's global v
                // of each of its states is not kept, only the order, so
                // the single value is checked as "not older than acked".
                if !h.states[versions.clone()].contains(&crc) {
                    let older = h.states.iter().rposition(|&c| c == crc);
                    // Stored that way, or read that way (a race of the read)?
                    let again = obj.fetch_array(b"d", b"a", 0, self.span).map(|d| {
                        if crc32c(&d) == crc {
                            "the same"
                        } else {
                            "other"
                        }
                    });
                    let map = cont.pool().map();
                    let ranks = peregrine::placement::group_layout(&map, obj.id(), self.class, 0)
                        .map(|g| {
                            g.shards
                                .iter()
                                .map(|l| map.targets[l.target].rank)
                                .collect::<Vec<_>>()
                        });
                    Some(format!(
                        "array matches no version in {versions:?} (of {}){} ({}; shards on ranks {ranks:?}) at {} (pool map version {}); read again: {again:?} bytes",
                        h.states.len() - 1,
                        older.map_or(String::new(), |v| format!(", it is version {v}")),
                        cells_matching(&h, &data),
                        now_utc(),
                        map.version
                    ))
                } else if floor > 0 && s.is_none() {
                    Some("single value missing".into())
                } else {
                    None
                }
            }
        };
        self.reads.fetch_add(1, Ordering::Relaxed);
        if let Some(p) = problem {
            self.wrong.lock().unwrap().push(format!("object {i}: {p}"));
        }
    }

    pub(crate) fn reader(self: &Arc<Self>, cont: peregrine::Container) {
        let mut n = 0u64;
        while !self.stop.load(Ordering::Relaxed) {
            n += 1;
            self.check(&cont, (n * 3) % OBJECTS);
        }
    }

    /// Every object reads as its last acknowledged version, exactly.
    pub(crate) fn verify_final(&self, cont: &peregrine::Container, how: &str) {
        for i in 0..OBJECTS {
            let obj = cont.object(oid(self.class, i)).unwrap();
            let want = self.hist[i as usize].lock().unwrap().last.clone();
            match obj.fetch_array(b"d", b"a", 0, self.span) {
                Ok(got) if got == want => {}
                Ok(_) => self.wrong.lock().unwrap().push(format!(
                    "{how}: object {i}: not its last acknowledged version"
                )),
                Err(e) => self
                    .wrong
                    .lock()
                    .unwrap()
                    .push(format!("{how}: object {i}: {e}")),
            }
        }
    }

    pub(crate) fn assert_clean(&self, what: &str) {
        let wrong = self.wrong.lock().unwrap();
        assert!(
            wrong.is_empty(),
            "{what}: {} wrong reads or failed writes (of {} writes, {} reads):\n{}",
            wrong.len(),
            self.writes.load(Ordering::Relaxed),
            self.reads.load(Ordering::Relaxed),
            wrong[..wrong.len().min(20)].join("\n")
        );
    }
}

pub(crate) fn cell_crcs(b: &[u8]) -> Vec<u32> {
    b.chunks(EC_CELL_SIZE as usize).map(crc32c).collect()
}

/// For each cell of `got`: the versions of the history whose cell it is.
pub(crate) fn cells_matching(h: &History, got: &[u8]) -> String {
    cell_crcs(got)
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let v: Vec<usize> = (0..h.cells.len())
                .filter(|&v| h.cells[v].get(i) == Some(c))
                .collect();
            let tail = &v[v.len().saturating_sub(4)..];
            format!("cell {i}: versions {tail:?}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

pub(crate) fn oid(class: ObjectClass, i: u64) -> ObjectId {
    ObjectId::new(class, 7, i)
}
