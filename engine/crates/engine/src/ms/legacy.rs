//! Management states written before the protobuf encoding (see `persist`),
//! in bincode: "PRGMS\x02" and [`State`], or, first of all, the fields of
//! [`First`] with no prefix (every target up-and-in). Read once, at start,
//! and written back in the current encoding.
//!
//! Frozen: these types are the layout those services wrote, field for field
//! and in order (bincode has neither names nor optional fields). Never edit
//! them; `persist`'s tests load states they wrote.

use super::pool_map::{OutState, RankOut};
use super::{ContRec, MemberRec, MsState, PoolRec, SnapRec};
use peregrine_proto::mgmt::{Checksum, ContType};
use peregrine_proto::ms::EngineState;
use serde::Deserialize;
use std::collections::BTreeMap;
use uuid::Uuid;

const MAGIC_V2: &[u8] = b"PRGMS\x02";

#[derive(Deserialize)]
struct Member {
    rank: u32,
    uuid: String,
    control_addr: String,
    data_addr: String,
    fault_domain: String,
    targets: u32,
    /// "ready" or "maintenance".
    state: String,
}

#[derive(Deserialize)]
struct Cont {
    uuid: Uuid,
    label: String,
    /// "POSIX".
    kind: String,
    oclass: String,
    dir_oclass: String,
    chunk_size: u64,
    rf: u32,
    /// "crc32c" or "off".
    checksum: String,
    props: BTreeMap<String, String>,
    snapshots: Vec<Snap>,
    create_epoch: u64,
}

#[derive(Deserialize)]
struct Snap {
    epoch: u64,
    name: String,
    created_unix: u64,
}

#[derive(Deserialize)]
struct Pool {
    uuid: Uuid,
    label: String,
    ranks: Vec<u32>,
    targets: Vec<u32>,
    scm_per_target: u64,
    nvme_per_target: u64,
    props: BTreeMap<String, String>,
    map_version: u64,
    conts: BTreeMap<Uuid, Cont>,
}

#[derive(Deserialize)]
enum OutV2 {
    Down,
    Up,
    DownOut,
}

#[derive(Deserialize)]
struct Rank {
    state: OutV2,
    since: u64,
    full: bool,
}

#[derive(Deserialize)]
struct State {
    system: String,
    map_version: u64,
    members: BTreeMap<u32, Member>,
    pools: BTreeMap<Uuid, Pool>,
    pool_out: BTreeMap<Uuid, BTreeMap<u32, Rank>>,
}

type First = (String, u64, BTreeMap<u32, Member>, BTreeMap<Uuid, Pool>);

pub(super) fn decode(blob: &[u8]) -> Result<MsState, String> {
    let st = match blob.strip_prefix(MAGIC_V2) {
        Some(rest) => bincode::deserialize::<State>(rest),
        None => {
            bincode::deserialize::<First>(blob).map(|(system, map_version, members, pools)| State {
                system,
                map_version,
                members,
                pools,
                pool_out: BTreeMap::new(),
            })
        }
    }
    .map_err(|e| format!("bincode: {e}"))?;
    Ok(convert(st))
}

fn convert(st: State) -> MsState {
    MsState {
        system: st.system,
        map_version: st.map_version,
        members: st
            .members
            .into_iter()
            .map(|(rank, m)| {
                let state = if m.state == "ready" {
                    EngineState::Ready
                } else {
                    EngineState::Maintenance
                };
                let rec = MemberRec {
                    rank: m.rank,
                    uuid: m.uuid,
                    control_addr: m.control_addr,
                    data_addr: m.data_addr,
                    fault_domain: m.fault_domain,
                    targets: m.targets,
                    state,
                    shm_path: String::new(),
                };
                (rank, rec)
            })
            .collect(),
        pools: st
            .pools
            .into_iter()
            .map(|(u, p)| {
                let rec = PoolRec {
                    uuid: p.uuid,
                    label: p.label,
                    ranks: p.ranks,
                    targets: p.targets,
                    scm_per_target: p.scm_per_target,
                    nvme_per_target: p.nvme_per_target,
                    props: p.props,
                    map_version: p.map_version,
                    conts: p.conts.into_iter().map(|(u, c)| (u, cont(c))).collect(),
                    access: super::access::new_access(),
                };
                (u, rec)
            })
            .collect(),
        pool_out: st
            .pool_out
            .into_iter()
            .map(|(u, ranks)| {
                let ranks = ranks
                    .into_iter()
                    .map(|(rank, o)| {
                        let state = match o.state {
                            OutV2::Down => OutState::Down,
                            OutV2::Up => OutState::Up,
                            OutV2::DownOut => OutState::DownOut,
                        };
                        let out = RankOut {
                            state,
                            since: o.since,
                            full: o.full,
                        };
                        (rank, out)
                    })
                    .collect();
                (u, ranks)
            })
            .collect(),
    }
}

fn cont(c: Cont) -> ContRec {
    ContRec {
        uuid: c.uuid,
        label: c.label,
        // The only type there was.
        kind: if c.kind == "POSIX" {
            ContType::Posix
        } else {
            ContType::Unspecified
        },
        oclass: c.oclass,
        dir_oclass: c.dir_oclass,
        chunk_size: c.chunk_size,
        rf: c.rf,
        checksum: if c.checksum == "off" {
            Checksum::Off
        } else {
            Checksum::Crc32c
        },
        props: c.props,
        snapshots: c
            .snapshots
            .into_iter()
            .map(|x| SnapRec {
                epoch: x.epoch,
                name: x.name,
                created_unix: x.created_unix,
            })
            .collect(),
        create_epoch: c.create_epoch,
    }
}
