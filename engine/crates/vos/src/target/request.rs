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
            Request::Flush(f) => match self.check_flush(&f) {
                Ok(()) if self.flush.durable >= self.wal.seq => Ok((ok_response(None), Vec::new())),
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
                let decided = self
                    .pool_addr(d.addr.as_ref(), "dtx decide")
                    .and_then(|pool| {
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
                    Ok(ops) if ops.is_empty() => Ok((ok_response(None), Vec::new())),
                    Ok(ops) => return self.log_then_answer(ops, None, tx),
                    Err(e) => Err(e),
                }
            }
            Request::DtxQuery(q) => {
                let known = self
                    .pool_addr(q.addr.as_ref(), "dtx query")
                    .and_then(|pool| {
                        let me = (self.sb.rank, self.id);
                        dtx::query(&self.index, self.in_flight(), pool, me, &q, dtx::now_ms())
                    });
                match known {
                    Ok((state, None)) => Ok((dtx_state_response(state), Vec::new())),
                    Ok((state, Some(op))) => {
                        return self.log_then_answer(vec![op], Some(dtx_state_response(state)), tx)
                    }
                    Err(e) => Err(e),
                }
            }
            Request::DtxPending(p) => self.pool_addr(p.addr.as_ref(), "dtx pending").map(|pool| {
                let me = (self.sb.rank, self.id);
                let pending = dtx::pending(&self.index, &pool, me, &p, dtx::now_ms());
                let body = data::response::Body::DtxPending(pending);
                (ok_response(Some(body)), Vec::new())
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
                tx.send(Ok((ok_response(None), Gather::default())));
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
    fn log_then_answer(&mut self, ops: Vec<WalOp>, resp: Option<data::Response>, tx: Responder) {
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

    /// The address's pool, checked: present, for this target, a uuid.
    fn addr_pool<'a>(
        &self,
        a: Option<&'a data::Address>,
        op: &str,
    ) -> Result<(&'a data::Address, Uuid), Errno> {
        let a = a.ok_or_else(|| Errno::inval(format!("{op}: missing address")))?;
        if a.target != self.id {
            return Err(Errno::inval(format!(
                "{op}: request for target {} reached target {}",
                a.target, self.id
            )));
        }
        let pool = peregrine_proto::uuid_from_bytes("pool", &a.pool)
            .map_err(|e| Errno::inval(format!("{op}: {e}")))?;
        Ok((a, pool))
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

    pub(super) fn addr(
        &self,
        a: Option<&data::Address>,
        op: &str,
    ) -> Result<(Uuid, Uuid, ObjKey), Errno> {
        let (a, pool) = self.addr_pool(a, op)?;
        let cont = peregrine_proto::uuid_from_bytes("cont", &a.cont)
            .map_err(|e| Errno::inval(format!("{op}: {e}")))?;
        let oid = a
            .oid
            .as_ref()
            .ok_or_else(|| Errno::inval(format!("{op}: missing object id")))?;
        self.pool_here(&pool, op)?;
        Ok((
            pool,
            cont,
            ObjKey {
                hi: oid.hi,
                lo: oid.lo,
                shard: a.shard,
            },
        ))
    }

    /// [`Self::addr`] of a request that names a pool only (its container
    /// and object, if any, are not read).
    pub(super) fn pool_addr(&self, a: Option<&data::Address>, op: &str) -> Result<Uuid, Errno> {
        let (_, pool) = self.addr_pool(a, op)?;
        self.pool_here(&pool, op)?;
        Ok(pool)
    }

    fn check_flush(&self, f: &data::FlushReq) -> Result<(), Errno> {
        if let Some(e) = &self.broken {
            return Err(e.clone());
        }
        let a = f
            .addr
            .as_ref()
            .ok_or_else(|| Errno::inval("flush: missing address"))?;
        let pool = peregrine_proto::uuid_from_bytes("pool", &a.pool)
            .map_err(|e| Errno::inval(format!("flush: {e}")))?;
        if !self.index.pools.contains_key(&pool) {
            return Err(Errno::new(
                -libc::ENOENT,
                format!("flush: pool {pool} not found on target {}", self.id),
            ));
        }
        Ok(())
    }
}
