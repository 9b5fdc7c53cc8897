//! The management state as stored: "PRGMS\x03" and one protobuf `MsState`
//! (`proto/ms_state.proto`), which grows fields the protobuf way (new
//! numbers; what an older record lacks takes its default). The Raft log and
//! snapshots that replace the single host carry the same messages. States
//! of earlier services (bincode) decode through [`super::legacy`], once: the
//! service writes them back in this encoding as it starts.

use super::legacy;
use super::pool_map::{OutState, RankOut};
use super::{ContRec, MemberRec, MsState, PoolRec, SnapRec};
use peregrine_proto::mgmt::{Checksum, ContType};
use peregrine_proto::ms as pb;
use prost::Message;
use std::collections::BTreeMap;
use uuid::Uuid;

/// "PRGMS" and the encoding's version: 3, protobuf (2: bincode with pool
/// map states; none: the first bincode record).
const STATE_MAGIC: &[u8] = b"PRGMS\x03";

/// Whether a stored state is in the current encoding.
pub(super) fn is_current(blob: &[u8]) -> bool {
    blob.starts_with(STATE_MAGIC)
}

impl MsState {
    pub(super) fn encode(&self) -> Vec<u8> {
        let m = to_pb(self);
        let mut blob = Vec::with_capacity(STATE_MAGIC.len() + m.encoded_len());
        blob.extend_from_slice(STATE_MAGIC);
        m.encode(&mut blob).expect("a Vec has room");
        blob
    }

    pub(super) fn decode(blob: &[u8]) -> Result<MsState, String> {
        match blob.strip_prefix(STATE_MAGIC) {
            Some(rest) => from_pb(pb::MsState::decode(rest).map_err(|e| format!("protobuf: {e}"))?),
            None => legacy::decode(blob),
        }
    }
}

fn out_state(s: OutState) -> pb::OutState {
    match s {
        OutState::Down => pb::OutState::Down,
        OutState::Up => pb::OutState::Up,
        OutState::DownOut => pb::OutState::DownOut,
    }
}

fn to_pb(s: &MsState) -> pb::MsState {
    pb::MsState {
        system: s.system.clone(),
        map_version: s.map_version,
        members: s
            .members
            .values()
            .map(|m| pb::Member {
                rank: m.rank,
                uuid: m.uuid.clone(),
                control_addr: m.control_addr.clone(),
                data_addr: m.data_addr.clone(),
                fault_domain: m.fault_domain.clone(),
                targets: m.targets,
                state: m.state.into(),
            })
            .collect(),
        pools: s.pools.values().map(pool_to_pb).collect(),
        pool_out: s
            .pool_out
            .iter()
            .map(|(pool, ranks)| pb::PoolOut {
                pool_uuid: pool.to_string(),
                ranks: ranks
                    .iter()
                    .map(|(&rank, o)| pb::RankOut {
                        rank,
                        state: out_state(o.state).into(),
                        since: o.since,
                        full: o.full,
                    })
                    .collect(),
            })
            .collect(),
    }
}

fn pool_to_pb(p: &PoolRec) -> pb::Pool {
    pb::Pool {
        uuid: p.uuid.to_string(),
        label: p.label.clone(),
        ranks: p.ranks.clone(),
        targets: p.targets.clone(),
        scm_per_target: p.scm_per_target,
        nvme_per_target: p.nvme_per_target,
        props: p.props.clone(),
        map_version: p.map_version,
        access: Some(p.access.clone()),
        containers: p
            .conts
            .values()
            .map(|c| pb::Container {
                uuid: c.uuid.to_string(),
                label: c.label.clone(),
                r#type: c.kind.into(),
                oclass: c.oclass.clone(),
                dir_oclass: c.dir_oclass.clone(),
                chunk_size: c.chunk_size,
                redundancy_factor: c.rf,
                checksum: c.checksum.into(),
                props: c.props.clone(),
                snapshots: c
                    .snapshots
                    .iter()
                    .map(|x| pb::Snapshot {
                        epoch: x.epoch,
                        name: x.name.clone(),
                        created_unix: x.created_unix,
                    })
                    .collect(),
                create_epoch: c.create_epoch,
            })
            .collect(),
    }
}

fn uuid(what: &str, v: &str) -> Result<Uuid, String> {
    Uuid::parse_str(v).map_err(|e| format!("{what} {v:?}: {e}"))
}

/// An enum field: a value this service does not know is refused (it was
/// written by a newer service, whose meaning this one cannot keep).
fn known<E: TryFrom<i32>>(what: &str, v: i32) -> Result<E, String> {
    E::try_from(v).map_err(|_| format!("{what}: unknown value {v}"))
}

fn from_pb(m: pb::MsState) -> Result<MsState, String> {
    let mut s = MsState {
        system: m.system,
        map_version: m.map_version,
        ..Default::default()
    };
    for x in m.members {
        s.members.insert(
            x.rank,
            MemberRec {
                rank: x.rank,
                uuid: x.uuid,
                control_addr: x.control_addr,
                data_addr: x.data_addr,
                fault_domain: x.fault_domain,
                targets: x.targets,
                state: known("member state", x.state)?,
                shm_path: String::new(),
            },
        );
    }
    for p in m.pools {
        let mut conts = BTreeMap::new();
        for c in p.containers {
            let u = uuid("container", &c.uuid)?;
            conts.insert(
                u,
                ContRec {
                    uuid: u,
                    label: c.label,
                    kind: known::<ContType>("container type", c.r#type)?,
                    oclass: c.oclass,
                    dir_oclass: c.dir_oclass,
                    chunk_size: c.chunk_size,
                    rf: c.redundancy_factor,
                    checksum: known::<Checksum>("checksum", c.checksum)?,
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
                },
            );
        }
        let u = uuid("pool", &p.uuid)?;
        s.pools.insert(
            u,
            PoolRec {
                uuid: u,
                label: p.label,
                ranks: p.ranks,
                targets: p.targets,
                scm_per_target: p.scm_per_target,
                nvme_per_target: p.nvme_per_target,
                props: p.props,
                map_version: p.map_version,
                conts,
                // Pools recorded before handles existed get their key now.
                access: p.access.unwrap_or_else(super::access::new_access),
            },
        );
    }
    for o in m.pool_out {
        let ranks = s.pool_out.entry(uuid("pool", &o.pool_uuid)?).or_default();
        for r in o.ranks {
            let state = match known("target state", r.state)? {
                pb::OutState::Down => OutState::Down,
                pb::OutState::Up => OutState::Up,
                pb::OutState::DownOut => OutState::DownOut,
                pb::OutState::Unspecified => return Err("target state: unspecified".into()),
            };
            ranks.insert(
                r.rank,
                RankOut {
                    state,
                    since: r.since,
                    full: r.full,
                },
            );
        }
    }
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;
    use peregrine_proto::mgmt::PoolAccess;
    use peregrine_proto::ms::EngineState;

    fn unhex(s: &str) -> Vec<u8> {
        let s = s.trim();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    /// The state the fixtures hold, written by the service before this
    /// encoding (testdata/state-v1.hex: the first record, no prefix;
    /// state-v2.hex: "PRGMS\x02" and the record with pool map states).
    fn fixture(with_out: bool) -> MsState {
        let pool = Uuid::from_u128(0x1111_2222_3333_4444_5555_6666_7777_8888);
        let cont = Uuid::from_u128(0x9999_aaaa_bbbb_cccc_dddd_eeee_ffff_0000);
        let mut s = MsState {
            system: "tank".into(),
            map_version: 7,
            ..Default::default()
        };
        for (rank, state) in [(0u32, EngineState::Ready), (1, EngineState::Maintenance)] {
            s.members.insert(
                rank,
                MemberRec {
                    rank,
                    uuid: format!("engine-{rank}"),
                    control_addr: format!("10.0.0.{rank}:10001"),
                    data_addr: format!("10.0.0.{rank}:10002"),
                    fault_domain: format!("/rack/{rank}"),
                    targets: 2,
                    state,
                    shm_path: String::new(),
                },
            );
        }
        let c = ContRec {
            uuid: cont,
            label: "data".into(),
            kind: ContType::Posix,
            oclass: "RP_2G1".into(),
            dir_oclass: "S1".into(),
            chunk_size: 1 << 20,
            rf: 1,
            checksum: Checksum::Off,
            props: [("sync".to_string(), "always".to_string())].into(),
            snapshots: vec![SnapRec {
                epoch: 123,
                name: "snap".into(),
                created_unix: 456,
            }],
            create_epoch: 99,
        };
        s.pools.insert(
            pool,
            PoolRec {
                uuid: pool,
                label: "pool".into(),
                ranks: vec![0, 1],
                targets: vec![2, 2],
                scm_per_target: 1 << 20,
                nvme_per_target: 8 << 20,
                props: [("rf".to_string(), "1".to_string())].into(),
                map_version: 3,
                conts: [(cont, c)].into(),
                access: fixture_access(),
            },
        );
        if with_out {
            s.pool_out.entry(pool).or_default().insert(
                1,
                RankOut {
                    state: OutState::Up,
                    since: 42,
                    full: true,
                },
            );
        }
        s
    }

    fn fixture_access() -> PoolAccess {
        PoolAccess {
            key: vec![7; 32],
            key_version: 2,
            revoked: vec![vec![1; 16]],
        }
    }

    /// A state of an encoding from before pool keys: each pool got a new
    /// key at load, here replaced by the fixture's to compare the rest.
    fn keyed(mut s: MsState) -> MsState {
        for p in s.pools.values_mut() {
            assert_eq!((p.access.key.len(), p.access.key_version), (32, 1));
            p.access = fixture_access();
        }
        s
    }

    #[test]
    fn states_of_earlier_encodings_load() {
        let v1 = unhex(include_str!("testdata/state-v1.hex"));
        let v2 = unhex(include_str!("testdata/state-v2.hex"));
        assert!(!is_current(&v1) && !is_current(&v2));
        assert_eq!(keyed(MsState::decode(&v1).unwrap()), fixture(false));
        assert_eq!(keyed(MsState::decode(&v2).unwrap()), fixture(true));
        // Loaded once, written back in the current encoding, keys kept.
        let again = MsState::decode(&v2).unwrap().encode();
        assert!(is_current(&again));
        assert_eq!(
            MsState::decode(&again).unwrap(),
            MsState::decode(&again).unwrap()
        );
        assert_eq!(keyed(MsState::decode(&again).unwrap()), fixture(true));
        assert!(MsState::decode(b"PRGMS\x02garbage").is_err());
        assert!(MsState::decode(b"PRGMS\x03garbage").is_err());
    }

    #[test]
    fn the_encoding_grows_fields() {
        let s = fixture(true);
        let blob = s.encode();
        // A field a later service adds (an unknown number) is skipped.
        let mut grown = blob.clone();
        // field 99, wire type 2 (length-delimited): tag 99 << 3 | 2 as a varint.
        grown.extend_from_slice(&[0x9a, 0x06, 3, b'n', b'e', b'w']);
        assert_eq!(MsState::decode(&grown).unwrap(), s);
        // A record without a field this service knows (an older one) takes
        // its default: here, no pool map states.
        let mut m = pb::MsState::decode(&blob[STATE_MAGIC.len()..]).unwrap();
        m.pool_out.clear();
        let mut older = STATE_MAGIC.to_vec();
        m.encode(&mut older).unwrap();
        assert!(MsState::decode(&older).unwrap().pool_out.is_empty());
        // A value of an enum this service does not know is refused, not guessed.
        m.members[0].state = 77;
        let mut newer = STATE_MAGIC.to_vec();
        m.encode(&mut newer).unwrap();
        let e = MsState::decode(&newer).unwrap_err();
        assert!(e.contains("member state: unknown value 77"), "{e}");
    }
}
