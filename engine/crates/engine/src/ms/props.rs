//! Properties of pools and containers: labels, the property names each
//! takes, and a new container's record resolved from its request.

use super::{ContRec, PoolRec};
use peregrine_proto::mgmt::{Checksum, ContCreateReq, ContType, MemberState};
use peregrine_proto::{epoch_now, ObjectClass};
use std::collections::{BTreeMap, HashMap};
use tonic::Status;
use uuid::Uuid;

pub(super) fn validate_label(what: &str, label: &str) -> Result<(), Status> {
    if label.is_empty() || label.len() > 127 {
        return Err(Status::invalid_argument(format!(
            "{what} label {label:?}: must be 1-127 characters"
        )));
    }
    if Uuid::parse_str(label).is_ok() {
        return Err(Status::invalid_argument(format!(
            "{what} label {label:?}: must not be a UUID"
        )));
    }
    if !label
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || "-_.:".contains(c))
    {
        return Err(Status::invalid_argument(format!(
            "{what} label {label:?}: only [A-Za-z0-9-_.:] allowed"
        )));
    }
    Ok(())
}

pub(super) fn props_map(p: &BTreeMap<String, String>) -> HashMap<String, String> {
    p.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
}

const POOL_PROPS: &[&str] = &["rf", "reclaim", "acl", "owner", "group", "scrub"];

pub(super) fn validate_pool_props(props: &HashMap<String, String>) -> Result<(), Status> {
    for (k, v) in props {
        if !POOL_PROPS.contains(&k.as_str()) && !k.starts_with("user.") {
            return Err(Status::invalid_argument(format!(
                "pool property {k:?}: unknown (known: {}, or user.*)",
                POOL_PROPS.join(", ")
            )));
        }
        if k == "rf" && !matches!(v.parse::<u32>(), Ok(0..=4)) {
            return Err(Status::invalid_argument(format!(
                "pool property rf={v:?}: must be 0-4"
            )));
        }
        if k == "reclaim" && !["delete", "retain", "lazy", "time", "disabled"].contains(&v.as_str())
        {
            return Err(Status::invalid_argument(format!(
                "pool property reclaim={v:?}: must be delete, retain, lazy, time or disabled"
            )));
        }
    }
    Ok(())
}

/// A checksum type as users name it ("crc32c" or "off", any case).
pub(super) fn parse_checksum(v: &str) -> Option<Checksum> {
    match v.to_ascii_lowercase().as_str() {
        "crc32c" => Some(Checksum::Crc32c),
        "off" => Some(Checksum::Off),
        _ => None,
    }
}

/// How users name a checksum type.
pub(super) fn checksum_name(c: Checksum) -> &'static str {
    match c {
        Checksum::Crc32c => "crc32c",
        Checksum::Off => "off",
        Checksum::Unspecified => "",
    }
}

/// How a message names a member state.
pub(super) fn member_state_word(s: MemberState) -> &'static str {
    match s {
        MemberState::Joined => "joined",
        MemberState::Stopped => "stopped",
        MemberState::Maintenance => "maintenance",
        MemberState::Unspecified => "unknown",
    }
}

pub(super) const CONT_PROPS: &[&str] = &[
    "oclass",
    "dir_oclass",
    "rf",
    "checksum",
    "sync",
    "acl",
    "owner",
    "group",
    "label",
    "quota",
];

/// Container property `sync`: `standard` (an update is acknowledged once
/// written and flushed by fsync, as POSIX) or `always` (every update is
/// flushed before it is acknowledged).
pub(super) fn sync_mode(v: &str) -> Result<String, Status> {
    let v = v.to_ascii_lowercase();
    if v != "standard" && v != "always" {
        return Err(Status::invalid_argument(format!(
            "container property sync={v:?}: must be standard or always"
        )));
    }
    Ok(v)
}

/// Resolve a container's properties, filling defaults and checking them
/// against each other and the pool.
pub(super) fn cont_record(
    req: &ContCreateReq,
    pool: &PoolRec,
    engines: usize,
) -> Result<ContRec, Status> {
    if !req.r#type.is_empty() && !req.r#type.eq_ignore_ascii_case("POSIX") {
        return Err(Status::invalid_argument(format!(
            "container type {:?}: only POSIX is supported",
            req.r#type
        )));
    }
    let parse_class = |field: &str, v: &str, dflt: &str| -> Result<ObjectClass, Status> {
        let v = if v.is_empty() { dflt } else { v };
        v.parse::<ObjectClass>()
            .map_err(|e| Status::invalid_argument(format!("{field}: {e}")))
    };
    let oclass = parse_class("oclass", &req.oclass, "SX")?;
    let dir_oclass = parse_class(
        "dir_oclass",
        &req.dir_oclass,
        oclass.default_dir_class().name(),
    )?;
    for c in [oclass, dir_oclass] {
        if c.group_size() as usize > engines {
            return Err(Status::invalid_argument(format!(
                "object class {c} needs {} engines, pool {:?} has {engines}",
                c.group_size(),
                pool.label
            )));
        }
        if c.fault_tolerance() < req.redundancy_factor {
            return Err(Status::invalid_argument(format!(
                "object class {c} tolerates {} engine failures, below the container's redundancy factor {}",
                c.fault_tolerance(),
                req.redundancy_factor
            )));
        }
    }
    if let Some(prf) = pool.props.get("rf").and_then(|v| v.parse::<u32>().ok()) {
        if req.redundancy_factor > prf {
            return Err(Status::invalid_argument(format!(
                "redundancy factor {} exceeds the pool's ({prf})",
                req.redundancy_factor
            )));
        }
    }
    let chunk_size = if req.chunk_size == 0 {
        1 << 20
    } else {
        req.chunk_size
    };
    if !(4096..=(64 << 20)).contains(&chunk_size) || !chunk_size.is_power_of_two() {
        return Err(Status::invalid_argument(format!(
            "chunk_size {chunk_size}: must be a power of two from 4 KiB to 64 MiB"
        )));
    }
    let checksum = if req.checksum.is_empty() {
        Checksum::Crc32c
    } else {
        parse_checksum(&req.checksum).ok_or_else(|| {
            Status::invalid_argument(format!(
                "checksum {:?}: must be crc32c or off",
                req.checksum
            ))
        })?
    };
    let mut props: BTreeMap<String, String> = req.props.clone().into_iter().collect();
    if let Some(v) = props.get_mut("sync") {
        *v = sync_mode(v)?;
    }
    if let Some(v) = props.remove("quota") {
        if let Some(q) = super::quota::parse(&v)? {
            props.insert("quota".into(), q);
        }
    }
    Ok(ContRec {
        uuid: Uuid::new_v4(),
        label: req.label.clone(),
        kind: ContType::Posix,
        oclass: oclass.name().into(),
        dir_oclass: dir_oclass.name().into(),
        chunk_size,
        rf: req.redundancy_factor,
        checksum,
        props,
        snapshots: vec![],
        create_epoch: epoch_now(),
    })
}
