//! What the outage tests ask of the cluster: the pool map, waiting for
//! reintegration, stopping each engine in turn to read through every replica.

use super::*;

/// `engines` engines of one target on `device_mib` devices (64 MiB of SCM
/// each), formatted, with pool "pool" of `pool_mib` and container "cont" of
/// `class`, checksums on: what every outage test starts from.
pub(crate) fn one_target_engines(
    engines: u32,
    device_mib: u64,
    pool_mib: u64,
    class: &str,
) -> Cluster {
    Cluster::with_pool(
        ClusterSpec {
            engines,
            targets: 1,
            device_mib,
            scm_mib: 64,
        },
        pool_mib,
        class,
        "crc32c",
    )
}

/// (map version, targets not up-and-in) of pool "pool", and the sum of
/// `targets_out` over the members.
pub(crate) fn pool_out(c: &Cluster) -> (u64, u32, u32) {
    let mut m = c.mgmt();
    let Ok(p) =
        c.rt.block_on(m.pool_query(PoolQueryReq { id: "pool".into() }))
    else {
        return (0, u32::MAX, u32::MAX);
    };
    let p = p.into_inner();
    let members =
        c.rt.block_on(m.system_query(SystemQueryReq {}))
            .map(|r| r.into_inner().members.iter().map(|m| m.targets_out).sum())
            .unwrap_or(u32::MAX);
    (
        p.map_version,
        p.disabled_targets + p.reintegrating_targets,
        members,
    )
}

/// Wall-clock time as the engines' logs print it (seconds of the day, UTC).
pub(crate) fn now_utc() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let d = t.as_secs() % 86400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        d / 3600,
        d / 60 % 60,
        d % 60,
        t.subsec_millis()
    )
}

/// The management service's pool map changes, from the logs (to tell what
/// a failure happened next to).
pub(crate) fn pool_map_events(c: &Cluster) -> String {
    c.logs()
        .lines()
        .filter(|l| l.contains("pool ") && (l.contains("rank") || l.contains("map version")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Wait until every target is up and in again.
pub(crate) fn wait_reintegrated(c: &Cluster, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (_, out, members) = pool_out(c);
        if out == 0 && members == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "targets still out after {within:?} ({out} in the pool, {members} by members); logs:\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Start a writer and a reader on `class` objects.
pub(crate) fn start(c: &Cluster, w: &Arc<Workload>) -> Vec<std::thread::JoinHandle<()>> {
    let (wc, rc) = (c.container(), c.container());
    let (w1, w2) = (w.clone(), w.clone());
    vec![
        std::thread::spawn(move || w1.writer(wc)),
        std::thread::spawn(move || w2.reader(rc)),
    ]
}

/// Every object through every replica: each engine stopped in turn
/// (briefly: it is never excluded), the objects read, the engine restarted.
pub(crate) fn verify_each_missing(c: &mut Cluster, w: &Workload) {
    let cont = c.container();
    w.verify_final(&cont, "all engines up");
    for r in 0..c.engines.len() {
        c.engines[r].kill9();
        w.verify_final(&cont, &format!("rank {r} stopped"));
        c.restart(r);
    }
    wait_reintegrated(c, Duration::from_secs(60));
}
