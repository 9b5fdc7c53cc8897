//! A leader tells the other shards of a transaction it committed: once its
//! decision is durable, the client has its answer and the engine sends the
//! outcome on, in batches (one request per shard for all the transactions
//! waiting for it). A read of a shard that has not heard yet answers
//! `-EINPROGRESS` and is retried; a shard the message misses (the leader's
//! engine dies first, a shard is away) asks the leader itself (see
//! `resolve`), so this is only the fast path.

use super::Maps;
use peregrine::placement::PoolMap;
use peregrine_proto::data::{self, DtxDecideReq, DtxId, DtxShard};
use peregrine_proto::frame::Opcode;
use peregrine_vos::Request;
use prost::Message;
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::time::Duration;
use uuid::Uuid;

/// How long a cached pool map serves to address shards.
const MAP_AGE: Duration = Duration::from_secs(1);
/// Most transactions one commit message carries (the engines' limit).
const BATCH: usize = 1024;

/// The commit of transaction `id` of `pool`, for `shards`.
pub struct Notice {
    pool: Uuid,
    id: DtxId,
    shards: Vec<DtxShard>,
}

pub struct Notifier {
    tx: mpsc::Sender<Notice>,
}

impl Notifier {
    /// Start the notifier's thread; `mgmt` is the management service.
    pub fn start(mgmt: String) -> Notifier {
        let (tx, rx) = mpsc::channel::<Notice>();
        let r = std::thread::Builder::new()
            .name("dtx-notify".into())
            .spawn(move || run(&mgmt, rx));
        if let Err(e) = r {
            tracing::error!(
                "transaction notifier not started (shards learn commits from their leader): {e}"
            );
        }
        Notifier { tx }
    }

    /// What to send on once `req` succeeds: a leader's commit that names
    /// the shards to tell.
    pub fn notice(req: &Request) -> Option<Vec<Notice>> {
        let Request::DtxDecide(d) = req else {
            return None;
        };
        if !(d.leader && d.commit) || d.notify.is_empty() {
            return None;
        }
        let pool = Uuid::from_slice(&d.addr.as_ref()?.pool).ok()?;
        Some(
            d.ids
                .iter()
                .map(|id| Notice {
                    pool,
                    id: *id,
                    shards: d.notify.clone(),
                })
                .collect(),
        )
    }

    /// Send the notices on (their commit is durable).
    pub fn send(&self, notices: Vec<Notice>) {
        for n in notices {
            let _ = self.tx.send(n);
        }
    }
}

fn run(mgmt: &str, rx: mpsc::Receiver<Notice>) {
    let mut maps = Maps::default();
    while let Ok(first) = rx.recv() {
        // Everything waiting goes out together: one request per shard.
        let mut to: BTreeMap<(Uuid, u32, u32), Vec<DtxId>> = BTreeMap::new();
        for n in std::iter::once(first).chain(rx.try_iter()) {
            for s in n.shards {
                to.entry((n.pool, s.rank, s.target)).or_default().push(n.id);
            }
        }
        for ((pool, rank, target), ids) in to {
            for chunk in ids.chunks(BATCH) {
                if let Err(e) = tell(&mut maps, mgmt, pool, rank, target, chunk) {
                    tracing::debug!(
                        "pool {pool}: telling rank {rank} target {target} of {} commits: {e} (it will ask)",
                        chunk.len()
                    );
                }
            }
        }
    }
}

fn tell(
    maps: &mut Maps,
    mgmt: &str,
    pool: Uuid,
    rank: u32,
    target: u32,
    ids: &[DtxId],
) -> Result<(), String> {
    let (map, client) = maps.map(mgmt, pool, MAP_AGE)?;
    let shard = DtxShard { rank, target };
    let t = peregrine::dtx::target_of(&map, &shard)
        .filter(|t| t.up)
        .ok_or_else(|| format!("not up in pool map version {}", map.version))?;
    let req = DtxDecideReq {
        addr: Some(address(&map, target)),
        ids: ids.to_vec(),
        commit: true,
        leader: false,
        notify: Vec::new(),
    };
    let reply = client
        .transport()
        .call(
            &t.addr,
            t.index,
            Opcode::DtxDecide,
            &req.encode_to_vec(),
            &[],
        )
        .map_err(|e| e.to_string())?;
    let resp = data::Response::decode(reply.msg.as_slice()).map_err(|e| e.to_string())?;
    match resp.status {
        Some(s) if s.code != 0 => Err(s.message),
        _ => Ok(()),
    }
}

fn address(map: &PoolMap, target: u32) -> data::Address {
    data::Address {
        pool: map.uuid.as_bytes().to_vec(),
        target,
        map_version: map.version,
        ..Default::default()
    }
}
