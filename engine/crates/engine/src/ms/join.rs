//! What a Join may say. Every field of a `JoinReq` ends up in the
//! management state, which is stored whole in a slot of fixed size (see
//! `peregrine_vos::mgmt`), and in every pool map handed to clients: each
//! length and count is bounded here, before anything is kept, and a refusal
//! names the field.

use crate::config::{MAX_FAULT_DOMAIN, MAX_TARGETS, MAX_UNIX_PATH};
use peregrine_proto::mgmt::JoinReq;
use peregrine_proto::ms::EngineState;
use tonic::Status;

/// Longest `control_addr` / `data_addr` ("host:port"; a DNS name is at most
/// 253 bytes).
pub const MAX_JOIN_ADDR: usize = 262;
/// Longest system name (as `config::Config::validate` allows).
pub const MAX_SYSTEM_NAME: usize = 64;
/// Most members a system holds: with every field at its bound, their
/// records stay well inside the management state's slot (2 MiB).
pub const MAX_MEMBERS: usize = 1024;
/// The states an engine reports.
pub const JOIN_STATES: [&str; 3] = ["ready", "maintenance", super::STATE_STOPPING];

fn text(field: &str, v: &str, max: usize) -> Result<(), Status> {
    if v.len() > max {
        return Err(Status::invalid_argument(format!(
            "join: {field}: {} bytes, at most {max}",
            v.len()
        )));
    }
    if v.chars().any(|c| c.is_control()) {
        return Err(Status::invalid_argument(format!(
            "join: {field}: {:?} holds control characters",
            v.escape_debug().take(80).collect::<String>()
        )));
    }
    Ok(())
}

fn addr(field: &str, v: &str) -> Result<(), Status> {
    text(field, v, MAX_JOIN_ADDR)?;
    match v.rsplit_once(':') {
        Some((host, port))
            if !host.is_empty()
                && !host.contains(char::is_whitespace)
                && port.parse::<u16>().is_ok_and(|p| p != 0) =>
        {
            Ok(())
        }
        _ => Err(Status::invalid_argument(format!(
            "join: {field}: {v:?} is not host:port"
        ))),
    }
}

/// Check a Join against the limits and against `system`, the name of the
/// system this service runs (empty only for a state that never had one).
pub fn validate_join(j: &JoinReq, system: &str) -> Result<(), Status> {
    text("system", &j.system, MAX_SYSTEM_NAME)?;
    // Always: a service whose state never had a name would otherwise
    // take any rank of any system.
    if j.system.is_empty() {
        return Err(Status::invalid_argument(format!(
            "join: system: empty; rank {} must name its system ({system:?})",
            j.rank
        )));
    }
    if j.system != system {
        return Err(Status::permission_denied(format!(
            "rank {} belongs to system {:?}, this is {:?}",
            j.rank, j.system, system
        )));
    }
    if j.uuid.len() > 36 || uuid::Uuid::parse_str(&j.uuid).is_err() {
        return Err(Status::invalid_argument(format!(
            "join: uuid: {:?} is not a UUID",
            j.uuid.chars().take(40).collect::<String>()
        )));
    }
    if !JOIN_STATES.contains(&j.state.as_str()) {
        return Err(Status::invalid_argument(format!(
            "join: state: {:?} is not one of {}",
            j.state.chars().take(40).collect::<String>(),
            JOIN_STATES.join(", ")
        )));
    }
    addr("control_addr", &j.control_addr)?;
    addr("data_addr", &j.data_addr)?;
    text("fault_domain", &j.fault_domain, MAX_FAULT_DOMAIN)?;
    text("shm_path", &j.shm_path, MAX_UNIX_PATH)?;
    check_targets(j.rank, j.targets).map(|_| ())
}

/// The state a join keeps of a member, from the words of a join that
/// `validate_join` let through ("ready" or "maintenance"; a stopping engine
/// is not kept).
pub(super) fn engine_state(word: &str) -> EngineState {
    if word == "ready" {
        EngineState::Ready
    } else {
        EngineState::Maintenance
    }
}

/// A rank's target count, which a pool divides its space by: 1..=MAX_TARGETS.
pub fn check_targets(rank: u32, targets: u32) -> Result<u32, Status> {
    if targets == 0 || targets > MAX_TARGETS {
        return Err(Status::invalid_argument(format!(
            "rank {rank}: targets: {targets} is out of range 1..={MAX_TARGETS}"
        )));
    }
    Ok(targets)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn good() -> JoinReq {
        JoinReq {
            rank: 3,
            uuid: uuid::Uuid::new_v4().to_string(),
            control_addr: "10.0.0.3:10001".into(),
            data_addr: "engine-3.peregrine.svc.cluster.local:10002".into(),
            fault_domain: "/rack1/host3".into(),
            targets: 8,
            system: "tank".into(),
            state: "ready".into(),
            shm_path: "/run/peregrine/peregrine-rank3.sock".into(),
            want_snapshots: true,
        }
    }

    fn refused(j: JoinReq, field: &str) {
        let e = validate_join(&j, "tank").expect_err(field);
        assert!(e.message().contains(field), "{field}: {}", e.message());
    }

    #[test]
    fn every_field_is_bounded_and_named_when_refused() {
        validate_join(&good(), "tank").unwrap();
        validate_join(
            &JoinReq {
                control_addr: "::1:10001".into(),
                shm_path: String::new(),
                ..good()
            },
            "tank",
        )
        .unwrap();
        let huge = "x".repeat(3 << 20);
        refused(
            JoinReq {
                control_addr: format!("{huge}:1"),
                ..good()
            },
            "control_addr",
        );
        refused(
            JoinReq {
                data_addr: huge.clone(),
                ..good()
            },
            "data_addr",
        );
        refused(
            JoinReq {
                data_addr: "host".into(),
                ..good()
            },
            "data_addr",
        );
        refused(
            JoinReq {
                fault_domain: huge.clone(),
                ..good()
            },
            "fault_domain",
        );
        refused(
            JoinReq {
                shm_path: huge.clone(),
                ..good()
            },
            "shm_path",
        );
        refused(
            JoinReq {
                uuid: huge.clone(),
                ..good()
            },
            "uuid",
        );
        refused(
            JoinReq {
                state: huge.clone(),
                ..good()
            },
            "state",
        );
        refused(
            JoinReq {
                system: huge.clone(),
                ..good()
            },
            "system",
        );
        refused(
            JoinReq {
                fault_domain: "/a\n/b".into(),
                ..good()
            },
            "fault_domain",
        );
        refused(
            JoinReq {
                targets: 0,
                ..good()
            },
            "targets",
        );
        refused(
            JoinReq {
                targets: MAX_TARGETS + 1,
                ..good()
            },
            "targets",
        );
    }

    #[test]
    fn the_system_name_is_checked_even_when_empty() {
        let e = validate_join(
            &JoinReq {
                system: String::new(),
                ..good()
            },
            "tank",
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
        assert!(e.message().contains("system"), "{}", e.message());
        let e = validate_join(
            &JoinReq {
                system: "other".into(),
                ..good()
            },
            "tank",
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::PermissionDenied);
        // Also by a service whose state has no name.
        let e = validate_join(
            &JoinReq {
                system: String::new(),
                ..good()
            },
            "",
        )
        .unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument);
    }

    #[test]
    fn a_full_system_state_fits_its_slot() {
        // Every member at every bound, encoded as the state stores it.
        let mut s = super::super::MsState {
            system: "x".repeat(MAX_SYSTEM_NAME),
            ..Default::default()
        };
        for rank in 0..MAX_MEMBERS as u32 {
            s.members.insert(
                rank,
                super::super::MemberRec {
                    rank,
                    uuid: uuid::Uuid::new_v4().to_string(),
                    control_addr: "c".repeat(MAX_JOIN_ADDR),
                    data_addr: "d".repeat(MAX_JOIN_ADDR),
                    fault_domain: "f".repeat(MAX_FAULT_DOMAIN),
                    targets: MAX_TARGETS,
                    state: EngineState::Maintenance,
                    shm_path: String::new(),
                },
            );
        }
        let len = s.encode().len();
        assert!(len < 1 << 20, "{len} bytes");
    }
}
