//! The target's thread: its queue ([`Mailbox`], [`Inbox`]) and the event
//! loop over it, its sources and its ring (see the module docs of
//! [`super`]): drain the queue, start what can start, reap the device's
//! completions and hand them to the fetch or commit they belong to, sleep
//! in the ring when idle.

use super::*;

/// The sources the target polls besides its queue (local clients), and
/// for how long it keeps polling them rather than sleep.
pub(super) struct Polling {
    /// Sources polled between the other work (local clients).
    pub(super) sources: Vec<Box<dyn Source>>,
    /// How long it keeps polling its sources after taking a request
    /// ([`crate::StorageOptions::poll`]).
    pub(super) poll: Duration,
    /// Keep polling, rather than sleep, until then: a source's next request
    /// usually follows its reply closely.
    pub(super) until: Option<Instant>,
    /// When the target last took a client's data-plane request: it
    /// aggregates once idle for [`IDLE_AGGREGATE`].
    pub(super) last_request: Instant,
}

pub(crate) enum Msg {
    Data(Request, Responder),
    /// A source of requests the target polls from now on.
    Attach(Box<dyn Source>),
    Ctl(Ctl, SyncSender<Result<CtlOut, StorageError>>),
    Stop,
    /// Stop without the closing checkpoint (tests: leaves the WAL to replay).
    Halt,
}

/// The receiving end of a target's queue, with its wake-up eventfd.
pub(crate) struct Inbox {
    rx: Receiver<Msg>,
    wake: Arc<Wake>,
}

/// The sending end of a target's queue: a send wakes the target if it
/// sleeps in its ring (waiting for device completions) rather than on the queue.
#[derive(Clone)]
pub(crate) struct Mailbox {
    tx: Sender<Msg>,
    wake: Arc<Wake>,
}

pub(crate) struct Wake {
    /// The eventfd a read of which the target keeps in its ring.
    pub(crate) fd: OwnedFd,
    /// The page whose first word is non-zero while the target is about to
    /// sleep, or sleeps, in its ring: local clients that poke the target
    /// directly ([`crate::Source`]) map it read-only and write `fd` only then.
    pub(crate) page_fd: OwnedFd,
    page: Mapping,
}

impl Wake {
    fn asleep(&self) -> &AtomicU64 {
        self.page.word(0).expect("word 0 of the target page")
    }
}

pub(crate) fn mailbox(id: u32) -> std::io::Result<(Mailbox, Inbox)> {
    // SAFETY: eventfd takes no pointers; the result is checked below.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // Safety: a fresh descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let (page_fd, page) =
        shm::memfd_published(&format!("peregrine-target-{id}"), shm::TARGET_PAGE_LEN)?;
    let wake = Arc::new(Wake { fd, page_fd, page });
    let (tx, rx) = crossbeam_channel::unbounded();
    Ok((
        Mailbox {
            tx,
            wake: wake.clone(),
        },
        Inbox { rx, wake },
    ))
}

impl Mailbox {
    pub(crate) fn wake(&self) -> &Wake {
        &self.wake
    }

    /// A refused message comes back whole, so that its sender can answer it.
    #[allow(clippy::result_large_err)]
    pub(crate) fn send(&self, m: Msg) -> Result<(), crossbeam_channel::SendError<Msg>> {
        self.tx.send(m)?;
        // Pairs with the fence in Target::going_to_sleep: either the target sees the
        // message before it sleeps, or this sees it asleep and wakes it.
        fence(Ordering::SeqCst);
        if self.wake.asleep().swap(0, Ordering::SeqCst) != 0 {
            let one = 1u64.to_ne_bytes();
            // SAFETY: 8 bytes from the live `one` to the eventfd `self.wake` owns.
            unsafe { libc::write(self.wake.fd.as_raw_fd(), one.as_ptr().cast(), 8) };
        }
        Ok(())
    }
}

impl Target {
    pub(crate) fn run(mut self, inbox: Inbox) {
        if let Err(e) = self.dev.set_wake(inbox.wake.fd.as_raw_fd()) {
            tracing::warn!(target = self.id, error = %e, "wake-up read not armed; requests wait for device completions");
        }
        let mut halt = false;
        let mut stopping = false;
        let mut spun = false;
        loop {
            self.complete();
            self.publish(false);
            if !stopping {
                let mut n = 0;
                while n < MAX_BATCH && self.commit.open.data < BATCH_DATA {
                    let m = match inbox.rx.try_recv() {
                        Ok(m) => m,
                        Err(TryRecvError::Empty) => break,
                        Err(TryRecvError::Disconnected) => {
                            stopping = true;
                            break;
                        }
                    };
                    match m {
                        Msg::Data(req, tx) => self.take(req, tx, None),
                        Msg::Attach(src) => self.polling.sources.push(src),
                        Msg::Ctl(c, tx) => {
                            // Control ops see (and log after) everything queued before them.
                            self.drain();
                            let _ = tx.send(self.control(c));
                        }
                        Msg::Stop => stopping = true,
                        Msg::Halt => (stopping, halt) = (true, true),
                    }
                    n += 1;
                    if stopping {
                        break;
                    }
                }
                if !stopping {
                    self.poll_sources();
                }
            }
            self.pump();
            for pool in self.filling() {
                self.aggregate_for_room(pool, "nvme usage above 80%");
            }
            if !self.busy() {
                if stopping {
                    break;
                }
                if self.polling.until.is_some_and(|t| Instant::now() < t) {
                    // Polling for a source's next request: let others have the core meanwhile.
                    std::thread::yield_now();
                    continue;
                }
                self.polling.until = None;
                if self.stamp_due() {
                    self.commit.open.ops.push(WalOp::Flushed {
                        through: self.flush.durable,
                    });
                    continue;
                }
                if self.scrub_due() {
                    self.scrub_step();
                    continue;
                }
                self.publish(true);
                self.sleep_idle(&inbox);
                // Idle means no data-plane request: the management service's
                // measurements and quota pushes (every second), flush stamps
                // and the scrubber wake the target too, and must not keep it
                // from ever reclaiming what removals and overwrites freed.
                let idle = self.polling.last_request.elapsed() >= IDLE_AGGREGATE;
                if idle && !self.dirty.is_empty() && self.lease.valid() {
                    let dirty: Vec<Uuid> = self.dirty.iter().copied().collect();
                    for pool in dirty {
                        self.auto_aggregate(pool, "idle");
                    }
                }
                continue;
            }
            if self.dev.in_flight() == 0 || self.dev.completed() {
                self.submit();
                continue;
            }
            // A lone read in flight (QD1): poll for a short while rather
            // than sleep, a wake-up less on the way back.
            let spin = self.dev.spin;
            let lone = self.dev.in_flight() == 1 && self.fetch.jobs.len() == 1;
            if !spin.is_zero() && !spun && lone && inbox.rx.is_empty() {
                spun = true;
                self.wait(&inbox, Some(spin));
            } else {
                spun = false;
                self.wait(&inbox, None);
            }
        }
        if halt {
            return;
        }
        let p = &self.prof;
        tracing::info!(
            target = self.id,
            commits = p.commits,
            ops_per_commit = p.committed_ops as f64 / p.commits.max(1) as f64,
            us_per_commit = p.commit_ns / 1000 / p.commits.max(1),
            us_writing = p.write_ns / 1000 / p.commits.max(1),
            flushes = p.flushes,
            fetch_rounds = p.fetch_rounds,
            fetches_per_round = p.fetches as f64 / p.fetch_rounds.max(1) as f64,
            reads_per_round = p.read_pieces as f64 / p.fetch_rounds.max(1) as f64,
            "target closing"
        );
        // A checkpoint at close makes the next open fast; failure is harmless.
        if self.wal.tail > 0 && self.refused.is_none() {
            if let Err(e) = self.checkpoint() {
                tracing::warn!(target = self.id, error = %e, "checkpoint at close failed");
            }
        }
    }

    /// Refresh the space the metrics read, if due ([`crate::counters`]).
    fn publish(&mut self, idle: bool) {
        if self.published.due(self.wal.seq, idle) {
            let (scm, data) = (self.scm_budget, self.sb.data_bytes);
            self.published
                .publish(&self.counters, self.wal.seq, &self.index, scm, data);
        }
    }

    /// Start (fetches: queue) one data-plane request.
    fn take(&mut self, req: Request, tx: Responder, area: Option<ReplyArea>) {
        // The engine's own round of questions about held transactions
        // comes every second whatever the clients do: not activity.
        if !matches!(req, Request::DtxPending(_)) {
            self.polling.last_request = Instant::now();
        }
        if let Some(e) = &self.refused {
            return tx.send(Err(e.clone()));
        }
        if let Err(e) = crate::check_request(&req) {
            return tx.send(Err(e));
        }
        match req {
            Request::Fetch(f) => self.fetch.queued.push((f, tx, area)),
            req => self.handle(req, tx),
        }
    }

    /// Take the request each source has waiting; forget closed sources.
    fn poll_sources(&mut self) {
        let mut i = 0;
        while i < self.polling.sources.len() {
            match self.polling.sources[i].poll() {
                Polled::Idle => i += 1,
                Polled::Request(req, reply, area) => {
                    self.polling.until = Some(Instant::now() + self.polling.poll);
                    self.take(req, Responder(Some(reply)), area);
                    i += 1;
                }
                Polled::Closed => {
                    self.polling.sources.swap_remove(i);
                }
            }
        }
    }

    /// Mark the target asleep and sleep in the ring until a message, a
    /// source's request, a flush is due or [`IDLE_AGGREGATE`].
    fn sleep_idle(&mut self, inbox: &Inbox) {
        if !self.going_to_sleep(inbox) {
            return;
        }
        let timeout = match self.flush.dirty_since {
            Some(t) if self.flush_wanted() => self
                .flush
                .interval
                .saturating_sub(t.elapsed())
                .clamp(Duration::from_millis(1), IDLE_AGGREGATE),
            _ => IDLE_AGGREGATE,
        };
        let timeout = match self.stamp_wanted() {
            true => timeout.min(
                self.flush
                    .interval
                    .saturating_sub(self.flush.flushed_at.elapsed())
                    .max(Duration::from_millis(1)),
            ),
            false => timeout,
        };
        let timeout = match self.scrub_wait() {
            Some(d) if self.refused.is_none() => timeout.min(d.max(Duration::from_millis(1))),
            _ => timeout,
        };
        let r = self.dev.wait_idle(inbox.wake.fd.as_raw_fd(), timeout);
        inbox.wake.asleep().store(0, Ordering::SeqCst);
        if let Err(e) = r {
            tracing::error!(target = self.id, error = %e, "waiting for requests failed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Publish that the target sleeps; false (and awake again) if a message
    /// or a source's request arrived meanwhile.
    fn going_to_sleep(&self, inbox: &Inbox) -> bool {
        inbox.wake.asleep().store(1, Ordering::SeqCst);
        // Pairs with the fence of a sender (Mailbox::send, a source's client):
        // either the target sees its work now, or the sender sees it asleep.
        fence(Ordering::SeqCst);
        if !inbox.rx.is_empty() || self.polling.sources.iter().any(|s| s.pending()) {
            inbox.wake.asleep().store(0, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Sleep in the ring until a device completion or a new message (or
    /// poll for `spin`).
    fn wait(&mut self, inbox: &Inbox, spin: Option<Duration>) {
        if spin.is_none() && !self.going_to_sleep(inbox) {
            return;
        }
        let r = self.dev.wait(spin);
        inbox.wake.asleep().store(0, Ordering::SeqCst);
        if let Err(e) = r {
            tracing::error!(target = self.id, error = %e, "waiting for device completions failed");
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// Whether anything is gathered, queued or in flight.
    fn busy(&self) -> bool {
        !self.commit.open.ops.is_empty()
            || self.commit.open.sync
            || !self.commit.ahead.is_empty()
            || !self.fetch.queued.is_empty()
            || !self.commit.commits.is_empty()
            || !self.fetch.jobs.is_empty()
    }

    /// Start what can start: a due checkpoint once nothing is in flight,
    /// the queued fetches, the gathered batch.
    fn pump(&mut self) {
        if self.wal.ckpt_due && self.dev.in_flight() == 0 {
            self.wal.ckpt_due = false;
            self.commit.open.unstage(&mut self.dev);
            if let Err(e) = self.checkpoint() {
                tracing::warn!(target = self.id, error = %e, "checkpoint failed; WAL keeps growing");
            }
        }
        if self.flush_wanted() {
            let since = *self.flush.dirty_since.get_or_insert_with(Instant::now);
            if since.elapsed() >= self.flush.interval {
                self.commit.open.sync = true;
            }
        }
        if !self.wal.ckpt_due {
            self.start_fetches();
            self.start_commit();
        }
    }

    /// Finish everything gathered, queued and in flight (before a control
    /// operation, which runs alone).
    pub(super) fn drain(&mut self) {
        loop {
            self.pump();
            if !self.busy() && !self.wal.ckpt_due {
                return;
            }
            if self.dev.in_flight() > 0 && !self.dev.completed() {
                if let Err(e) = self.dev.wait(None) {
                    tracing::error!(target = self.id, error = %e, "waiting for device completions failed");
                }
            } else {
                self.submit();
            }
            self.complete();
        }
    }

    pub(super) fn submit(&mut self) {
        if let Err(e) = self.dev.submit() {
            tracing::error!(target = self.id, error = %e, "submitting device operations failed");
        }
    }

    /// Take the device's completions and finish what they complete.
    fn complete(&mut self) {
        let mut done = Vec::new();
        if let Err(e) = self.dev.reap(&mut done) {
            tracing::error!(target = self.id, error = %e, "reaping device completions failed");
        }
        for d in done {
            if let Some(job) = self.fetch.jobs.get_mut(&d.tag) {
                let (dst, into) = job.reads[d.idx];
                let res = d.res.map(|()| match into {
                    ReadInto::Region(buf, off) => self.dev.bytes(buf, off, dst.len),
                    ReadInto::Area(a) => area_bytes(a, dst.len),
                });
                if let Some((iod, at, from, len)) =
                    absorb_piece(self.id, self.chunk, &mut job.plans, dst, res)
                {
                    let piece = match into {
                        ReadInto::Region(buf, off) => Piece::Region(buf, off + from, len),
                        ReadInto::Area(a) => Piece::InArea(a + from, len),
                    };
                    if let Ok(iods) = &mut job.plans[dst.fetch] {
                        iods[iod].out.push((at, piece));
                    }
                }
                job.left[dst.fetch] -= 1;
                let answer = match job.left[dst.fetch] {
                    0 => job.take(dst.fetch),
                    _ => None,
                };
                if job.left.iter().all(|&n| n == 0) {
                    self.fetch.jobs.remove(&d.tag);
                }
                if let Some(done) = answer {
                    // The reply borrows the regions: released once it is sent.
                    let (f, tx, _) = done.queued;
                    tx.send(done.plan.map(|iods| self.assemble(&f, iods)));
                    release_reads(&mut self.dev, &done.reads);
                    self.release_deferred();
                }
            } else if let Some(w) = self.commit.ahead.remove(&d.tag) {
                self.dev.release(w.buf);
                self.written(w.batch, d.res);
            } else if let Some(i) = self
                .commit
                .commits
                .iter()
                .position(|c| (c.tag..c.tag + 2).contains(&d.tag))
            {
                let c = &mut self.commit.commits[i];
                let ok = d.res.is_ok();
                if let Err(e) = d.res {
                    c.err.get_or_insert(e);
                }
                if d.tag == c.tag {
                    self.dev.release(c.regions[d.idx]);
                    self.write_done(i);
                } else {
                    c.done = true;
                    let seq = c.seq;
                    if ok {
                        self.flushed(seq);
                    }
                }
            }
        }
        self.start_syncs();
        self.retire_commits();
    }
}
