//! [`Transaction`]: changes of several dkeys, of any objects of one
//! container, that take effect all together or not at all, and only if the
//! keys they were decided on are as the client read them (what a rename or
//! a hard link of the POSIX layer needs). One distributed transaction
//! ([`crate::dtx`]) over every shard the changes touch, at one epoch.
//!
//! Conditions ([`Expect`]) are checked by every shard a change of their
//! dkey goes to, as part of its prepare: a condition that fails there fails
//! the prepare, so the transaction aborts and nothing is applied anywhere.
//! A shard refuses a prepare touching an akey another transaction holds
//! prepared (`-EBUSY`), so of two transactions that check one key, at most
//! one commits: the other retries after re-reading, or gives up.

use crate::error::{fmt_key, Error, Result};
use crate::object::{check_keys, size_akey, Object};
use crate::placement::ShardLoc;
use peregrine_proto::data::{self, condition, ValueKind};
use peregrine_proto::frame::Opcode;

/// What a condition of a [`Transaction`] expects of an akey.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Expect {
    /// No visible value; else the commit fails with `-EEXIST`.
    Absent,
    /// No version or punch newer than this epoch (the one
    /// [`Object::fetch_single_versioned`] reported); else `-EBUSY`.
    UnchangedSince(u64),
    /// A visible value, the version written at exactly this epoch (the one
    /// [`Object::insert_single`] returned); else `-EBUSY`, also when nothing
    /// is there. An engine older than this condition refuses it
    /// (`-EINVAL`) and stores nothing.
    WrittenAt(u64),
}

enum Kind {
    /// SINGLE values (akey, value) of the dkey.
    Update(Vec<(Vec<u8>, Vec<u8>)>),
    /// These akeys of the dkey; none: the whole dkey.
    Punch(Vec<Vec<u8>>),
}

/// One change of a [`Transaction`]: one request to each shard of its dkey.
struct Change {
    obj: Object,
    dkey: Vec<u8>,
    kind: Kind,
}

struct Condition {
    obj: Object,
    dkey: Vec<u8>,
    akey: Vec<u8>,
    expect: Expect,
}

/// Changes of several dkeys that take effect all together or not at all;
/// see the module docs.
pub struct Transaction {
    changes: Vec<Change>,
    conditions: Vec<Condition>,
}

impl crate::Container {
    /// An empty transaction; [`Transaction::commit`] applies it.
    pub fn transaction(&self) -> Transaction {
        Transaction {
            changes: Vec::new(),
            conditions: Vec::new(),
        }
    }
}

fn same(o: &Object, dkey: &[u8], obj: &Object, d: &[u8]) -> bool {
    o.id() == obj.id() && dkey == d
}

impl Transaction {
    /// Set SINGLE value `akey` of `dkey` of `obj` (values of one dkey go in
    /// one request).
    pub fn update_single(
        &mut self,
        obj: &Object,
        dkey: &[u8],
        akey: &[u8],
        value: &[u8],
    ) -> &mut Self {
        let v = (akey.to_vec(), value.to_vec());
        match self
            .changes
            .iter_mut()
            .find(|c| same(&c.obj, &c.dkey, obj, dkey) && matches!(c.kind, Kind::Update(_)))
        {
            Some(Change {
                kind: Kind::Update(vs),
                ..
            }) => vs.push(v),
            _ => self.changes.push(Change {
                obj: obj.clone(),
                dkey: dkey.to_vec(),
                kind: Kind::Update(vec![v]),
            }),
        }
        self
    }

    /// Punch `dkey` of `obj` and everything under it.
    pub fn punch_dkey(&mut self, obj: &Object, dkey: &[u8]) -> &mut Self {
        self.punch(obj, dkey, Vec::new())
    }

    /// Punch some akeys of `dkey` of `obj` (none: nothing).
    pub fn punch_akeys(&mut self, obj: &Object, dkey: &[u8], akeys: &[&[u8]]) -> &mut Self {
        if akeys.is_empty() {
            return self;
        }
        let mut all: Vec<Vec<u8>> = akeys.iter().map(|a| a.to_vec()).collect();
        if obj.rs.is_some() {
            all.extend(akeys.iter().map(|a| size_akey(a)));
        }
        self.punch(obj, dkey, all)
    }

    fn punch(&mut self, obj: &Object, dkey: &[u8], akeys: Vec<Vec<u8>>) -> &mut Self {
        self.changes.push(Change {
            obj: obj.clone(),
            dkey: dkey.to_vec(),
            kind: Kind::Punch(akeys),
        });
        self
    }

    /// Commit only if `akey` of `dkey` of `obj` is as `expect` says on
    /// every shard the transaction changes that dkey on. The transaction
    /// must change `dkey` (the condition travels with that change).
    pub fn expect(&mut self, obj: &Object, dkey: &[u8], akey: &[u8], expect: Expect) -> &mut Self {
        self.conditions.push(Condition {
            obj: obj.clone(),
            dkey: dkey.to_vec(),
            akey: akey.to_vec(),
            expect,
        });
        self
    }

    /// Check the changes and conditions; the wire conditions of each change.
    fn check(&self) -> Result<Vec<Vec<data::Condition>>> {
        for c in &self.changes {
            match &c.kind {
                Kind::Update(vs) => vs
                    .iter()
                    .try_for_each(|(a, v)| c.obj.check_single(&c.dkey, a, v))?,
                Kind::Punch(akeys) => {
                    check_keys(&c.dkey, None)?;
                    akeys
                        .iter()
                        .try_for_each(|a| check_keys(&c.dkey, Some(a)))?;
                }
            }
        }
        for k in &self.conditions {
            check_keys(&k.dkey, Some(&k.akey))?;
            if !self
                .changes
                .iter()
                .any(|c| same(&c.obj, &c.dkey, &k.obj, &k.dkey))
            {
                return Err(Error::inval(format!(
                    "transaction: a condition on {} akey {} but no change of that dkey",
                    k.obj.what(&k.dkey),
                    fmt_key(&k.akey)
                )));
            }
        }
        Ok(self
            .changes
            .iter()
            .map(|c| {
                self.conditions
                    .iter()
                    .filter(|k| same(&c.obj, &c.dkey, &k.obj, &k.dkey))
                    .map(|k| data::Condition {
                        akey: k.akey.clone(),
                        expect: Some(match k.expect {
                            Expect::Absent => condition::Expect::Absent(true),
                            Expect::UnchangedSince(e) => condition::Expect::UnchangedSince(e),
                            Expect::WrittenAt(e) => condition::Expect::WrittenAt(e),
                        }),
                    })
                    .collect()
            })
            .collect())
    }

    /// Apply every change, or none: retried under a newer pool map as
    /// single updates are, at one epoch. A condition that does not hold
    /// fails it with its error (`-EEXIST`, `-EBUSY`), and so does a key
    /// that another transaction is changing (`-EBUSY`).
    pub fn commit(self) -> Result<()> {
        let Some(first) = self.changes.first().map(|c| c.obj.clone()) else {
            return Ok(());
        };
        let conds = self.check()?;
        let epoch = crate::hlc::now();
        let attempt = || self.commit_at(&first, &conds, epoch);
        match attempt() {
            // Maybe a change of this process's own that its shards hold
            // until they hear its commit, which is still in the queue.
            Err(e) if e.code == -libc::EBUSY => {
                first.container().pool().client().committer().flush();
                attempt()
            }
            r => r,
        }
    }

    fn commit_at(&self, first: &Object, conds: &[Vec<data::Condition>], epoch: u64) -> Result<()> {
        first.with_map(|map| {
            // Every live shard of every change; the transaction's shards
            // are the targets they reach (leader: the first).
            let mut jobs: Vec<(usize, ShardLoc)> = Vec::new();
            let mut shards: Vec<ShardLoc> = Vec::new();
            for (i, c) in self.changes.iter().enumerate() {
                let g = c.obj.group(map, &c.dkey)?;
                c.obj.check_redundancy(map, &g)?;
                for l in g.shards.iter().filter(|l| map.targets[l.target].up) {
                    jobs.push((i, *l));
                    if !shards.iter().any(|s| s.target == l.target) {
                        shards.push(*l);
                    }
                }
            }
            first.run_dtx(
                map,
                &shards,
                &jobs,
                |(_, l)| l.target,
                |(i, loc), tx| {
                    let c = &self.changes[*i];
                    let (o, dkey) = (&c.obj, c.dkey.as_slice());
                    let conditions = conds[*i].clone();
                    match &c.kind {
                        Kind::Update(vs) => {
                            let iods = vs
                                .iter()
                                .map(|(a, v)| o.iod(a, ValueKind::Single, 0, &[v]))
                                .collect();
                            let bulk: Vec<&[u8]> = vs.iter().map(|(_, v)| v.as_slice()).collect();
                            let req = data::UpdateReq {
                                conditions,
                                ..o.update_req(map, loc, tx, epoch, dkey, iods)
                            };
                            o.call(map, loc, Opcode::Update, &req, &bulk).map(|_| ())
                        }
                        Kind::Punch(akeys) => {
                            let req = data::PunchReq {
                                conditions,
                                ..o.punch_req(map, loc, tx, epoch, dkey, akeys)
                            };
                            o.call(map, loc, Opcode::Punch, &req, &[]).map(|_| ())
                        }
                    }
                },
            )
        })
    }
}
