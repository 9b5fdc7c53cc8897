//! Management commands: system, storage, pool and container, each one gRPC call
//! to the management service.

use crate::acl::{self, Access};
use crate::args::{
    AclEntries, ContCmd, ContCreateArgs, OwnerArgs, PoolCmd, PoolCreateArgs, SnapCmd, StorageCmd,
    SystemCmd,
};
use crate::output::{self as out, human_size, human_time, Table};
use crate::parse::props_map;
use anyhow::{anyhow, Context, Result};
use peregrine_proto::acl::Principal;
use peregrine_proto::mgmt::{self as pb, mgmt_client::MgmtClient};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;
use std::time::Duration;
use tonic::transport::{Channel, Endpoint};

/// A connection to the management service, remembering its address for messages.
pub struct Mgmt {
    client: MgmtClient<Channel>,
    addr: String,
    /// Plain HTTP/2 (`--insecure`): a TLS engine answers it with garbage.
    insecure: bool,
}

/// `host:port`, `host` (port 10001) or a full `http://` URI.
pub fn endpoint_uri(addr: &str) -> String {
    let addr = addr.trim();
    if addr.contains("://") {
        return addr.to_string();
    }
    // A bare IPv6 address has colons but no port; bracketed ones may carry one.
    let has_port = match addr.rfind(']') {
        Some(i) => addr[i..].contains(':'),
        None => addr.matches(':').count() == 1,
    };
    if has_port {
        format!("http://{addr}")
    } else if addr.contains(':') && !addr.starts_with('[') {
        format!("http://[{addr}]:{}", peregrine_proto::DEFAULT_CONTROL_PORT)
    } else {
        format!("http://{addr}:{}", peregrine_proto::DEFAULT_CONTROL_PORT)
    }
}

/// The reason under a transport failure, in the short lower-case form of the
/// one-line error (`connection refused`), found by walking the error's sources.
pub fn transport_reason(err: &(dyn std::error::Error + 'static)) -> String {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    let mut last = err.to_string();
    while let Some(e) = cur {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            return io_reason(io);
        }
        last = e.to_string();
        cur = e.source();
    }
    last
}

fn io_reason(io: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    match io.kind() {
        ConnectionRefused => "connection refused".into(),
        TimedOut => "timed out".into(),
        ConnectionReset => "connection reset".into(),
        NotFound => "address not found".into(),
        _ => {
            // "No route to host (os error 113)" -> "no route to host"
            let s = io.to_string();
            let s = s.split(" (os error").next().unwrap_or(&s).to_string();
            let mut c = s.chars();
            match c.next() {
                Some(f) => f.to_lowercase().chain(c).collect(),
                None => s,
            }
        }
    }
}

impl Mgmt {
    pub async fn connect(
        addr: &str,
        security: &peregrine::Security,
        timeout: Duration,
    ) -> Result<Self> {
        let unreachable =
            |reason: String| anyhow!("cannot reach management service at {addr}: {reason}");
        let connector = security
            .connector()
            .map_err(|e| anyhow!("control-plane TLS: {e}"))?;
        let ep = Endpoint::from_shared(endpoint_uri(addr))
            .map_err(|e| {
                anyhow!(
                    "bad management service address {addr:?}: {}",
                    transport_reason(&e)
                )
            })?
            .connect_timeout(timeout)
            .timeout(timeout);
        let channel = match tokio::time::timeout(timeout, connector.connect(ep)).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) => return Err(unreachable(transport_reason(&e))),
            Err(_) => return Err(unreachable(format!("timed out after {}", secs(timeout)))),
        };
        Ok(Mgmt {
            client: MgmtClient::new(channel),
            addr: addr.to_string(),
            insecure: !connector.is_tls(),
        })
    }

    /// Turn a gRPC status into the reason part of the one-line error: the
    /// service's own message, which names what failed (e.g. "no space on tier nvme").
    fn status(&self, s: tonic::Status) -> anyhow::Error {
        use tonic::Code;
        match s.code() {
            Code::Unavailable => {
                let reason = match std::error::Error::source(&s) {
                    Some(src) => transport_reason(src),
                    None if s.message().is_empty() => "unavailable".into(),
                    None => s.message().to_string(),
                };
                anyhow!("cannot reach management service at {}: {reason}", self.addr)
            }
            Code::DeadlineExceeded | Code::Cancelled
                if s.message().contains("Timeout") || s.message().is_empty() =>
            {
                anyhow!(
                    "no answer from management service at {}: timed out",
                    self.addr
                )
            }
            // What a TLS engine's answer to plain HTTP/2 looks like.
            _ if self.insecure && s.message().contains("h2 protocol error") => anyhow!(
                "{} (with --insecure: does the service require TLS? give --tls-dir DIR)",
                s.message().trim()
            ),
            _ if s.message().is_empty() => anyhow!("{}", s.code().description()),
            _ => anyhow!("{}", s.message().trim()),
        }
    }
}

fn secs(d: Duration) -> String {
    format!("{}s", d.as_secs_f64())
}

/// Run one RPC, mapping a failing status to `what: reason`.
macro_rules! call {
    ($m:expr, $method:ident, $req:expr, $what:expr) => {{
        let req = $req;
        match $m.client.$method(req).await {
            Ok(r) => r.into_inner(),
            Err(s) => return Err($m.status(s).context($what)),
        }
    }};
}

fn print_json(o: &mut impl Write, v: &Value) -> Result<()> {
    serde_json::to_writer_pretty(&mut *o, v)?;
    writeln!(o)?;
    Ok(())
}

// ---- system ----

pub async fn system(m: &mut Mgmt, cmd: SystemCmd, json: bool, o: &mut impl Write) -> Result<()> {
    match cmd {
        SystemCmd::Query => {
            let r = call!(m, system_query, pb::SystemQueryReq {}, "system query");
            if json {
                return print_json(
                    o,
                    &json!({
                        "system": r.system, "leader_rank": r.leader_rank, "map_version": r.map_version,
                        "members": r.members.iter().map(out::member_json).collect::<Vec<_>>(),
                    }),
                );
            }
            writeln!(
                o,
                "System {}: {} engine(s), leader rank {}, map version {}",
                out::dash(&r.system),
                r.members.len(),
                r.leader_rank,
                r.map_version
            )?;
            let mut t = Table::new(&[
                "RANK>",
                "STATE",
                "CONTROL",
                "DATA",
                "FAULT DOMAIN",
                "TARGETS>",
                "OUT>",
                "UUID",
            ]);
            let mut members = r.members;
            members.sort_by_key(|m| m.rank);
            for mb in members {
                t.row(vec![
                    mb.rank.to_string(),
                    out::dash(&out::member_state(mb.state)),
                    mb.control_addr,
                    mb.data_addr,
                    out::dash(&mb.fault_domain),
                    mb.targets.to_string(),
                    mb.targets_out.to_string(),
                    mb.uuid,
                ]);
            }
            t.write(o)?;
        }
    }
    Ok(())
}

// ---- storage ----

fn storage_table(ranks: &[pb::RankStorage], o: &mut impl Write) -> Result<()> {
    let mut t = Table::new(&[
        "RANK>",
        "STATE",
        "FORMATTED",
        "BDEV",
        "PATH",
        "NVME TOTAL>",
        "NVME FREE>",
        "SCM TOTAL>",
        "SCM FREE>",
        "UNFLUSHED>",
        "MESSAGE",
    ]);
    let mut ranks: Vec<&pb::RankStorage> = ranks.iter().collect();
    ranks.sort_by_key(|r| r.rank);
    for r in ranks {
        t.row(vec![
            r.rank.to_string(),
            out::dash(&out::storage_state(r.state)),
            if r.formatted {
                "yes".into()
            } else {
                "no".into()
            },
            out::dash(&r.bdev_class),
            out::dash(&r.bdev_path),
            human_size(r.bdev_bytes),
            human_size(r.nvme_free),
            human_size(r.scm_bytes),
            human_size(r.scm_free),
            r.unflushed_records.to_string(),
            out::dash(&r.message),
        ]);
    }
    t.write(o)?;
    Ok(())
}

pub async fn storage(m: &mut Mgmt, cmd: StorageCmd, json: bool, o: &mut impl Write) -> Result<()> {
    let ranks = match cmd {
        StorageCmd::Scan => call!(m, storage_scan, pb::StorageScanReq {}, "storage scan").ranks,
        StorageCmd::Format { force } => {
            call!(
                m,
                storage_format,
                pb::StorageFormatReq { force },
                "storage format"
            )
            .ranks
        }
    };
    if json {
        return print_json(
            o,
            &json!({"ranks": ranks.iter().map(out::rank_storage_json).collect::<Vec<_>>()}),
        );
    }
    storage_table(&ranks, o)
}

// ---- pools ----

fn pool_details(p: &pb::PoolInfo, o: &mut impl Write) -> Result<()> {
    out::write_fields(
        o,
        &[
            ("Pool", out::dash(&p.label)),
            ("UUID", p.uuid.clone()),
            ("State", out::dash(&out::pool_state(p.state))),
            ("Map version", p.map_version.to_string()),
            ("Ranks", out::ranks_text(&p.ranks)),
            (
                "Targets",
                format!(
                    "{} ({} disabled, {} reintegrating)",
                    p.total_targets, p.disabled_targets, p.reintegrating_targets
                ),
            ),
            ("Containers", p.containers.to_string()),
            ("Properties", out::props_text(&p.props)),
        ],
    )?;
    let mut t = Table::new(&["TIER", "TOTAL>", "FREE>", "USED>"]);
    for tier in &p.tiers {
        let used = if tier.total == 0 {
            "-".into()
        } else {
            format!(
                "{:.1}%",
                100.0 * tier.total.saturating_sub(tier.free) as f64 / tier.total as f64
            )
        };
        t.row(vec![
            tier.name.clone(),
            human_size(tier.total),
            human_size(tier.free),
            used,
        ]);
    }
    writeln!(o)?;
    t.write(o)?;
    Ok(())
}

pub async fn pool(m: &mut Mgmt, cmd: PoolCmd, json: bool, o: &mut impl Write) -> Result<()> {
    match cmd {
        PoolCmd::Create(a) => {
            let what = format!("pool create {:?}", a.label);
            let req = pool_create_req(a).context(what.clone())?;
            let p = call!(m, pool_create, req, what);
            if json {
                return print_json(o, &out::pool_json(&p));
            }
            writeln!(o, "Pool {:?} created\n", p.label)?;
            pool_details(&p, o)?;
        }
        PoolCmd::List => {
            let r = call!(m, pool_list, pb::PoolListReq {}, "pool list");
            if json {
                return print_json(
                    o,
                    &json!({"pools": r.pools.iter().map(out::pool_json).collect::<Vec<_>>()}),
                );
            }
            let mut t = Table::new(&[
                "LABEL",
                "UUID",
                "STATE",
                "RANKS",
                "TARGETS>",
                "SCM SIZE>",
                "SCM FREE>",
                "NVME SIZE>",
                "NVME FREE>",
                "CONTS>",
            ]);
            for p in &r.pools {
                let tier = |name: &str, free: bool| {
                    out::tier(&p.tiers, name)
                        .map(|t| human_size(if free { t.free } else { t.total }))
                        .unwrap_or_else(|| "-".into())
                };
                t.row(vec![
                    out::dash(&p.label),
                    p.uuid.clone(),
                    out::dash(&out::pool_state(p.state)),
                    out::ranks_text(&p.ranks),
                    p.total_targets.to_string(),
                    tier("scm", false),
                    tier("scm", true),
                    tier("nvme", false),
                    tier("nvme", true),
                    p.containers.to_string(),
                ]);
            }
            if r.pools.is_empty() {
                writeln!(o, "No pools")?;
            } else {
                t.write(o)?;
            }
        }
        PoolCmd::Query { id } => {
            let p = call!(
                m,
                pool_query,
                pb::PoolQueryReq { id: id.clone() },
                format!("pool query {id:?}")
            );
            if json {
                return print_json(o, &out::pool_json(&p));
            }
            pool_details(&p, o)?;
        }
        PoolCmd::Destroy { id, force } => {
            call!(
                m,
                pool_destroy,
                pb::PoolDestroyReq {
                    id: id.clone(),
                    force
                },
                format!("pool destroy {id:?}")
            );
            if json {
                return print_json(o, &json!({"destroyed": id}));
            }
            writeln!(o, "Pool {id:?} destroyed")?;
        }
        PoolCmd::SetProp { id, props } => {
            let what = format!("pool set-prop {id:?}");
            let props = props_map(&props)
                .map_err(|e| anyhow!(e))
                .context(what.clone())?;
            let p = call!(m, pool_set_prop, pb::PoolSetPropReq { id, props }, what);
            if json {
                return print_json(o, &out::pool_json(&p));
            }
            pool_details(&p, o)?;
        }
        PoolCmd::GetAcl { id } => access(m, Target::Pool(id), AclOp::Get, json, o).await?,
        PoolCmd::UpdateAcl { id, entries } => {
            access(m, Target::Pool(id), AclOp::Update(entries), json, o).await?
        }
        PoolCmd::DeleteAcl { id, principal } => {
            let op = AclOp::Delete(principal.principal);
            access(m, Target::Pool(id), op, json, o).await?
        }
        PoolCmd::SetOwner { id, owner } => {
            access(m, Target::Pool(id), AclOp::SetOwner(owner), json, o).await?
        }
        PoolCmd::Evict { id, handle } => {
            let which = match handle {
                Some(h) => format!("handle {h}"),
                None => "every handle".to_string(),
            };
            call!(
                m,
                pool_evict,
                pb::PoolEvictReq {
                    id: id.clone(),
                    handle: handle.map(|h| h.as_bytes().to_vec()).unwrap_or_default(),
                },
                format!("pool evict {which} of {id:?}")
            );
            if json {
                return print_json(
                    o,
                    &json!({"pool": id, "evicted": handle.map_or("all".to_string(), |h| h.to_string())}),
                );
            }
            match handle {
                Some(h) => writeln!(o, "Handle {h} of pool {id:?} evicted")?,
                None => writeln!(
                    o,
                    "Every handle of pool {id:?} evicted (new pool key): clients connect again"
                )?,
            }
        }
    }
    Ok(())
}

// ---- access: ACL, owner, group ----

/// The pool or container an ACL command acts on.
enum Target {
    Pool(String),
    Cont { pool: String, cont: String },
}

impl Target {
    /// `pool get-acl "tank"`, `cont get-acl "c" in pool "tank"`: the `what` of errors.
    fn what(&self, cmd: &str) -> String {
        match self {
            Target::Pool(id) => format!("pool {cmd} {id:?}"),
            Target::Cont { pool, cont } => format!("cont {cmd} {cont:?} in pool {pool:?}"),
        }
    }
}

enum AclOp {
    Get,
    Update(AclEntries),
    Delete(Principal),
    SetOwner(OwnerArgs),
}

/// The properties of `t`. A container is queried first without a
/// credential, so that an administrator (admin certificate, or an insecure
/// system) sees the ACL even if it grants the local user nothing (refusals
/// name `get-acl`); a `client` certificate must name its user, so a refusal
/// is asked again with this process's credential.
async fn props_of(m: &mut Mgmt, t: &Target, what: &str) -> Result<HashMap<String, String>> {
    Ok(match t {
        Target::Pool(id) => {
            call!(
                m,
                pool_query,
                pb::PoolQueryReq { id: id.clone() },
                what.to_string()
            )
            .props
        }
        Target::Cont { pool, cont } => {
            let req = |cred| pb::ContQueryReq {
                pool: pool.clone(),
                id: cont.clone(),
                cred,
                read_only: true,
            };
            match m.client.cont_query(req(None)).await {
                Ok(r) => r.into_inner().props,
                Err(s) if s.code() == tonic::Code::PermissionDenied => {
                    let cred = Some(peregrine::credential::of_process());
                    call!(m, cont_query, req(cred), what.to_string()).props
                }
                Err(s) => return Err(m.status(s).context(what.to_string())),
            }
        }
    })
}

/// The owner, group and ACL of `t` now.
async fn current(m: &mut Mgmt, t: &Target, what: &str) -> Result<Access> {
    let props = props_of(m, t, what).await?;
    Access::of_props(&props).map_err(|e| anyhow!(e).context(what.to_string()))
}

/// Set `props` on `t`; its properties after.
async fn set_props(
    m: &mut Mgmt,
    t: &Target,
    props: HashMap<String, String>,
    what: &str,
) -> Result<HashMap<String, String>> {
    Ok(match t {
        Target::Pool(id) => {
            call!(
                m,
                pool_set_prop,
                pb::PoolSetPropReq {
                    id: id.clone(),
                    props
                },
                what.to_string()
            )
            .props
        }
        Target::Cont { pool, cont } => {
            call!(
                m,
                cont_set_prop,
                pb::ContSetPropReq {
                    pool: pool.clone(),
                    id: cont.clone(),
                    props
                },
                what.to_string()
            )
            .props
        }
    })
}

/// get-acl, update-acl, delete-acl, set-owner: each prints the owner, group
/// and ACL the object has after it. update-acl and delete-acl read the ACL,
/// change it here and set it whole (two of them at once: the last one wins).
async fn access(m: &mut Mgmt, t: Target, op: AclOp, json: bool, o: &mut impl Write) -> Result<()> {
    let cmd = match op {
        AclOp::Get => "get-acl",
        AclOp::Update(_) => "update-acl",
        AclOp::Delete(_) => "delete-acl",
        AclOp::SetOwner(_) => "set-owner",
    };
    let what = t.what(cmd);
    let fail = |e: String| anyhow!(e).context(what.clone());
    let props = match op {
        AclOp::Get => None,
        AclOp::Update(e) => {
            let add = match &e.acl_file {
                Some(f) => acl::read_file(f),
                None => acl::join(&e.entry),
            }
            .map_err(fail)?;
            let cur = current(m, &t, &what).await?;
            let new = acl::updated(&cur.acl, &add).map_err(fail)?;
            Some(HashMap::from([("acl".to_string(), new.to_string())]))
        }
        AclOp::Delete(p) => {
            let cur = current(m, &t, &what).await?;
            let new = acl::removed(&cur.acl, &p).map_err(fail)?;
            Some(HashMap::from([("acl".to_string(), new.to_string())]))
        }
        AclOp::SetOwner(w) => {
            let mut props = HashMap::new();
            if let Some(u) = w.user {
                props.insert("owner".to_string(), u);
            }
            if let Some(g) = w.group {
                props.insert("group".to_string(), g);
            }
            Some(props)
        }
    };
    let after = match props {
        None => current(m, &t, &what).await?,
        Some(p) => {
            let props = set_props(m, &t, p, &what).await?;
            Access::of_props(&props).map_err(fail)?
        }
    };
    if json {
        return print_json(o, &after.json());
    }
    after.write(o)?;
    Ok(())
}

fn pool_create_req(a: PoolCreateArgs) -> Result<pb::PoolCreateReq> {
    let props = props_map(&a.props).map_err(|e| anyhow!(e))?;
    Ok(pb::PoolCreateReq {
        label: a.label,
        total_size: a.size.map_or(0, |s| s.0),
        tier_ratio: a.tier_ratio.unwrap_or(0.0),
        scm_size: a.scm_size.map_or(0, |s| s.0),
        nvme_size: a.nvme_size.map_or(0, |s| s.0),
        ranks: a.ranks.map(|r| r.0).unwrap_or_default(),
        props,
        // The creator owns the pool unless --prop owner=/group= say otherwise.
        cred: Some(peregrine::credential::of_process()),
    })
}

// ---- containers ----

fn cont_details(c: &pb::ContInfo, o: &mut impl Write) -> Result<()> {
    out::write_fields(
        o,
        &[
            ("Container", out::dash(&c.label)),
            ("UUID", c.uuid.clone()),
            ("Pool UUID", c.pool_uuid.clone()),
            ("Type", out::dash(&out::cont_type(c.r#type))),
            ("Object class", out::dash(&c.oclass)),
            ("Dir object class", out::dash(&c.dir_oclass)),
            ("Chunk size", human_size(c.chunk_size)),
            ("Redundancy factor", c.redundancy_factor.to_string()),
            ("Checksum", out::dash(&out::checksum(c.checksum))),
            ("Used", human_size(c.used_bytes)),
            (
                "Quota",
                if c.quota_bytes == 0 {
                    "-".into()
                } else {
                    format!(
                        "{} ({} used)",
                        human_size(c.quota_bytes),
                        human_size(c.quota_used_bytes)
                    )
                },
            ),
            ("Snapshots", c.snapshots.to_string()),
            ("Created at epoch", c.create_epoch.to_string()),
            ("Properties", out::props_text(&c.props)),
        ],
    )?;
    Ok(())
}

fn cont_create_req(a: ContCreateArgs) -> Result<pb::ContCreateReq> {
    Ok(pb::ContCreateReq {
        props: props_map(&a.props).map_err(|e| anyhow!(e))?,
        pool: a.pool,
        label: a.label,
        r#type: a.cont_type,
        oclass: a.oclass.unwrap_or_default(),
        dir_oclass: a.dir_oclass.unwrap_or_default(),
        chunk_size: a.chunk_size.map_or(0, |s| s.0),
        redundancy_factor: a.rf.unwrap_or(0),
        checksum: a.checksum.map(|c| c.name().to_string()).unwrap_or_default(),
        clone_from: a.clone_from.unwrap_or_default(),
        clone_epoch: a.clone_epoch.unwrap_or(0),
        cred: Some(peregrine::credential::of_process()),
    })
}

pub async fn cont(m: &mut Mgmt, cmd: ContCmd, json: bool, o: &mut impl Write) -> Result<()> {
    match cmd {
        ContCmd::Create(a) => {
            let what = format!("cont create {:?} in pool {:?}", a.label, a.pool);
            let req = cont_create_req(a).context(what.clone())?;
            let c = call!(m, cont_create, req, what);
            if json {
                return print_json(o, &out::cont_json(&c));
            }
            writeln!(o, "Container {:?} created\n", c.label)?;
            cont_details(&c, o)?;
        }
        ContCmd::List { pool } => {
            let r = call!(
                m,
                cont_list,
                pb::ContListReq { pool: pool.clone() },
                format!("cont list {pool:?}")
            );
            if json {
                return print_json(
                    o,
                    &json!({"containers": r.containers.iter().map(out::cont_json).collect::<Vec<_>>()}),
                );
            }
            if r.containers.is_empty() {
                writeln!(o, "No containers in pool {pool:?}")?;
                return Ok(());
            }
            let mut t = Table::new(&[
                "LABEL", "UUID", "TYPE", "OCLASS", "CHUNK>", "RF>", "CHECKSUM", "USED>", "SNAPS>",
            ]);
            for c in &r.containers {
                t.row(vec![
                    out::dash(&c.label),
                    c.uuid.clone(),
                    out::dash(&out::cont_type(c.r#type)),
                    out::dash(&c.oclass),
                    human_size(c.chunk_size),
                    c.redundancy_factor.to_string(),
                    out::dash(&out::checksum(c.checksum)),
                    human_size(c.used_bytes),
                    c.snapshots.to_string(),
                ]);
            }
            t.write(o)?;
        }
        ContCmd::Query { pool, cont } => {
            let what = format!("cont query {cont:?} in pool {pool:?}");
            let c = call!(
                m,
                cont_query,
                pb::ContQueryReq {
                    pool,
                    id: cont,
                    // Checked against the pool's and the container's ACLs
                    // (with an admin certificate, the certificate speaks).
                    cred: Some(peregrine::credential::of_process()),
                    read_only: true,
                },
                what
            );
            if json {
                return print_json(o, &out::cont_json(&c));
            }
            cont_details(&c, o)?;
        }
        ContCmd::Destroy { pool, cont, force } => {
            let what = format!("cont destroy {cont:?} in pool {pool:?}");
            call!(
                m,
                cont_destroy,
                pb::ContDestroyReq {
                    pool,
                    id: cont.clone(),
                    force
                },
                what
            );
            if json {
                return print_json(o, &json!({"destroyed": cont}));
            }
            writeln!(o, "Container {cont:?} destroyed")?;
        }
        ContCmd::SetProp { pool, cont, props } => {
            let what = format!("cont set-prop {cont:?} in pool {pool:?}");
            let props = props_map(&props)
                .map_err(|e| anyhow!(e))
                .context(what.clone())?;
            let c = call!(
                m,
                cont_set_prop,
                pb::ContSetPropReq {
                    pool,
                    id: cont,
                    props
                },
                what
            );
            if json {
                return print_json(o, &out::cont_json(&c));
            }
            cont_details(&c, o)?;
        }
        ContCmd::GetAcl { pool, cont } => {
            access(m, Target::Cont { pool, cont }, AclOp::Get, json, o).await?
        }
        ContCmd::UpdateAcl {
            pool,
            cont,
            entries,
        } => {
            access(
                m,
                Target::Cont { pool, cont },
                AclOp::Update(entries),
                json,
                o,
            )
            .await?
        }
        ContCmd::DeleteAcl {
            pool,
            cont,
            principal,
        } => {
            let op = AclOp::Delete(principal.principal);
            access(m, Target::Cont { pool, cont }, op, json, o).await?
        }
        ContCmd::SetOwner { pool, cont, owner } => {
            access(
                m,
                Target::Cont { pool, cont },
                AclOp::SetOwner(owner),
                json,
                o,
            )
            .await?
        }
        ContCmd::Snap(s) => snap(m, s, json, o).await?,
    }
    Ok(())
}

async fn snap(m: &mut Mgmt, cmd: SnapCmd, json: bool, o: &mut impl Write) -> Result<()> {
    match cmd {
        SnapCmd::Create { pool, cont, name } => {
            let what = format!("cont snap create {cont:?} in pool {pool:?}");
            let s = call!(
                m,
                snap_create,
                pb::SnapCreateReq {
                    pool,
                    cont,
                    name: name.unwrap_or_default()
                },
                what
            );
            if json {
                return print_json(o, &out::snapshot_json(&s));
            }
            match s.name.as_str() {
                "" => writeln!(o, "Snapshot created at epoch {}", s.epoch)?,
                n => writeln!(o, "Snapshot {n:?} created at epoch {}", s.epoch)?,
            }
        }
        SnapCmd::List { pool, cont } => {
            let what = format!("cont snap list {cont:?} in pool {pool:?}");
            let r = call!(m, snap_list, pb::SnapListReq { pool, cont }, what);
            if json {
                return print_json(
                    o,
                    &json!({"snapshots": r.snapshots.iter().map(out::snapshot_json).collect::<Vec<_>>()}),
                );
            }
            if r.snapshots.is_empty() {
                writeln!(o, "No snapshots")?;
                return Ok(());
            }
            let mut t = Table::new(&["EPOCH>", "NAME", "CREATED"]);
            for s in &r.snapshots {
                t.row(vec![
                    s.epoch.to_string(),
                    out::dash(&s.name),
                    human_time(s.created_unix),
                ]);
            }
            t.write(o)?;
        }
        SnapCmd::Destroy {
            pool,
            cont,
            epoch,
            name,
        } => {
            let which = match (&name, epoch) {
                (Some(n), _) => format!("{n:?}"),
                (None, e) => format!("at epoch {}", e.unwrap_or(0)),
            };
            let what = format!("cont snap destroy {which} of {cont:?} in pool {pool:?}");
            let req = pb::SnapDestroyReq {
                pool,
                cont,
                epoch: epoch.unwrap_or(0),
                name: name.unwrap_or_default(),
            };
            call!(m, snap_destroy, req, what);
            if json {
                return print_json(o, &json!({"destroyed": which}));
            }
            writeln!(o, "Snapshot {which} destroyed")?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses() {
        assert_eq!(endpoint_uri("127.0.0.1:10001"), "http://127.0.0.1:10001");
        assert_eq!(endpoint_uri("node1"), "http://node1:10001");
        assert_eq!(endpoint_uri("http://x:5"), "http://x:5");
        assert_eq!(endpoint_uri("[::1]:7"), "http://[::1]:7");
        assert_eq!(endpoint_uri("::1"), "http://[::1]:10001");
    }
}
