//! Data-plane requests other than fetches: each dispatched to its part
//! ([`Target::handle`]), addresses checked, and answered at once, or once
//! the batch gathering its change is written.

use super::*;

impl Target {
    pub(super) fn handle(&mut self, req: Request, tx: Responder) {
        let r = match req {
            Request::Update(u, bulk) => {
                if !self.flush.unsettled.is_empty() && self.alloc.free_blocks() < blocks_wanted(&u)
                {
                    self.settle_now();
                }
                let sync = u.sync;
                match self.prepare_update(u, bulk) {
                    Ok(admit) => return self.answer_staged(admit, sync, tx),
                    Err(e) => Err(e),
                }
            }
            Request::Punch(p) => {
                let sync = p.sync;
                match self.prepare_punch(p) {
                    Ok(admit) => return self.answer_staged(admit, sync, tx),
                    Err(e) => Err(e),
                }
            }
            Request::Flush(f) => match self.check_flush(&f.addr) {
                Ok(()) if self.flush.durable >= self.wal.seq => Ok((Answer::Done, Vec::new())),
                Ok(()) => {
                    // Answered after the next synchronous commit, whose
                    // fdatasync starts once everything acknowledged is written.
                    self.commit.open.sync = true;
                    self.commit.open.replies.push(tx);
                    return;
                }
                Err(e) => Err(e),
            },
            Request::Fetch(f) => {
                self.fetch.queued.push((f, tx, None));
                return;
            }
            Request::List(l) => self.list(l),
            Request::QuerySize(q) => self.query_size(q),
            Request::ListChanged(l) => self.list_changed(l),
            Request::ListRecords(l) => self.list_records(l),
            Request::DtxDecide(d) => {
                let decided = self.pool_addr(&d.addr, "dtx decide").and_then(|pool| {
                    dtx::decide(
                        &self.index,
                        self.in_flight(),
                        pool,
                        self.id,
                        &d,
                        dtx::now_ms(),
                    )
                });
                match decided {
                    Ok(ops) if ops.is_empty() => Ok((Answer::Done, Vec::new())),
                    Ok(ops) => return self.log_then_answer(ops, None, tx),
                    Err(e) => Err(e),
                }
            }
            Request::DtxQuery(q) => {
                let known = self.pool_addr(&q.addr, "dtx query").and_then(|pool| {
                    let me = (self.sb.rank, self.id);
                    dtx::query(&self.index, self.in_flight(), pool, me, &q, dtx::now_ms())
                });
                match known {
                    Ok((state, None)) => Ok((Answer::DtxState(state), Vec::new())),
                    Ok((state, Some(op))) => {
                        return self.log_then_answer(vec![op], Some(Answer::DtxState(state)), tx)
                    }
                    Err(e) => Err(e),
                }
            }
            Request::DtxPending(p) => self.pool_addr(&p.addr, "dtx pending").map(|pool| {
                let me = (self.sb.rank, self.id);
                let pending = dtx::pending(&self.index, &pool, me, &p, dtx::now_ms());
                (Answer::DtxPending(pending), Vec::new())
            }),
        };
        tx.send(r.map(|(resp, bulk)| (resp, Gather::from(bulk))));
    }

    /// The changes logged or gathered and not applied yet, in the order
    /// they will be applied.
    pub(super) fn in_flight(&self) -> impl Iterator<Item = &WalOp> + Clone {
        self.commit
            .commits
            .iter()
            .flat_map(|c| c.ops.iter())
            .chain(self.commit.open.ops.iter())
    }

    /// Answer an update or punch [`Self::prepare_update`] or
    /// [`Self::prepare_punch`] took: once its batch is written if it was
    /// staged; if there was nothing to store (a transaction's retry), at
    /// once if the index already holds what it asked for (and, with
    /// `sync`, that is flushed), else after the changes in flight.
    fn answer_staged(&mut self, admit: Admit, sync: bool, tx: Responder) {
        match admit {
            Admit::Known { durable: true } if !sync || self.flush.durable >= self.wal.seq => {
                tx.send(Ok((Answer::Done, Gather::default())));
            }
            Admit::Known { .. } => {
                // A batch with nothing to log commits only when synchronous.
                self.commit.open.sync |= sync || self.commit.open.ops.is_empty();
                self.commit.open.replies.push(tx);
            }
            Admit::Stage => {
                self.commit.open.sync |= sync;
                self.commit.open.replies.push(tx);
            }
        }
    }

    /// Gather `ops` (transaction decisions) into the open batch and answer
    /// once they are written: with `resp` if given, else a plain success.
    fn log_then_answer(&mut self, ops: Vec<WalOp>, resp: Option<Answer>, tx: Responder) {
        if let Some(e) = &self.broken {
            tx.send(Err(e.clone()));
            return;
        }
        self.commit.open.ops.extend(ops);
        let tx = match resp {
            None => tx,
            Some(resp) => Responder(Some(Box::new(move |r: crate::ReplyRef<'_>| {
                tx.send(r.map(|(_, bulk)| (resp, bulk)))
            }))),
        };
        self.commit.open.replies.push(tx);
    }

    /// Refuse a request that reached another target than its address names.
    fn check_target(&self, target: u32, op: &str) -> Result<(), Errno> {
        if target != self.id {
            return Err(Errno::inval(format!(
                "{op}: request for target {target} reached target {}",
                self.id
            )));
        }
        Ok(())
    }

    fn pool_here(&self, pool: &Uuid, op: &str) -> Result<(), Errno> {
        if !self.index.pools.contains_key(pool) {
            return Err(Errno::new(
                -libc::ENOENT,
                format!("{op}: pool {pool} not found on target {}", self.id),
            ));
        }
        Ok(())
    }

    /// The address's pool, container and object shard, checked: for this
    /// target, in a pool it holds.
    pub(super) fn addr(&self, a: &Address, op: &str) -> Result<(Uuid, Uuid, ObjKey), Errno> {
        self.check_target(a.target, op)?;
        self.pool_here(&a.pool, op)?;
        let obj = ObjKey {
            hi: a.oid.hi,
            lo: a.oid.lo,
            shard: a.shard,
        };
        Ok((a.pool, a.cont, obj))
    }

    /// [`Self::addr`] of a request that names a pool only.
    pub(super) fn pool_addr(&self, a: &PoolAddress, op: &str) -> Result<Uuid, Errno> {
        self.check_target(a.target, op)?;
        self.pool_here(&a.pool, op)?;
        Ok(a.pool)
    }

    /// A flush's pool is held here (its target is not checked).
    fn check_flush(&self, a: &PoolAddress) -> Result<(), Errno> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        if !self.index.pools.contains_key(&a.pool) {
            return Err(Errno::new(
                -libc::ENOENT,
                format!("flush: pool {} not found on target {}", a.pool, self.id),
            ));
        }
        Ok(())
    }
}
