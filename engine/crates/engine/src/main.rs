//! `peregrine-engine --config engine.yaml`

use clap::Parser;
use peregrine_engine::config::Config;
use peregrine_engine::control::EngineService;
use peregrine_engine::ms::{MgmtService, AGGREGATION_LEASE, STATE_STOPPING};
use peregrine_engine::node::Node;
use peregrine_proto::mgmt::engine_server::EngineServer;
use peregrine_proto::mgmt::mgmt_client::MgmtClient;
use peregrine_proto::mgmt::mgmt_server::MgmtServer;
use peregrine_proto::mgmt::{ContShardSnapshotsReq, JoinReq, JoinResp};
use peregrine_vos::StorageError;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(name = "peregrine-engine", version, about = "Peregrine storage engine")]
struct Args {
    /// Engine configuration (YAML).
    #[arg(long, short)]
    config: PathBuf,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 0.0.0.0:9464); off unless given.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
}

/// How often an engine reports to the management service.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
/// How long in-flight control calls get to finish after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

fn init_logging(cfg: &Config) -> Result<(), String> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "{},h2=warn,tower=warn,hyper=warn",
            cfg.log_level
        ))
    });
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_target(false);
    match &cfg.log_file {
        Some(path) => {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)
                .map_err(|e| format!("log_file {}: {e}", path.display()))?;
            builder.with_ansi(false).with_writer(Arc::new(file)).init();
        }
        None => builder.with_writer(std::io::stderr).init(),
    }
    Ok(())
}

/// This engine's identity and addresses, in `state`.
fn join_req(node: &Node, state: &str) -> JoinReq {
    JoinReq {
        rank: node.cfg.rank,
        uuid: node.uuid().to_string(),
        control_addr: node.cfg.control_addr(),
        data_addr: node.cfg.data_addr(),
        fault_domain: node.cfg.fault_domain.clone(),
        targets: node.cfg.targets,
        system: node.cfg.name.clone(),
        state: state.into(),
        ..Default::default()
    }
}

/// Register with the management service and keep heartbeating.
async fn join_loop(node: Arc<Node>, shm_path: String) {
    let leader = node.cfg.mgmt_leader();
    let mut client: Option<MgmtClient<tonic::transport::Channel>> = None;
    let mut warned = false;
    // Whether the snapshot lists of the service are applied (then the
    // targets may aggregate on their own, for a lease per answered heartbeat).
    let mut lists_known = false;
    loop {
        if node.stopping.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        if client.is_none() {
            if let Ok(ep) = tonic::transport::Endpoint::from_shared(format!("http://{leader}")) {
                if let Ok(ch) = ep
                    .connect_timeout(Duration::from_secs(2))
                    .timeout(Duration::from_secs(5))
                    .connect()
                    .await
                {
                    client = Some(MgmtClient::new(ch));
                }
            }
        }
        if let Some(c) = client.as_mut() {
            let req = JoinReq {
                shm_path: shm_path.clone(),
                want_snapshots: !lists_known,
                ..join_req(&node, node.state())
            };
            let sent = Instant::now();
            match c.join(req).await {
                Ok(resp) => {
                    warned = false;
                    let resp = resp.into_inner();
                    apply_pool_maps(&node, &resp).await;
                    if !resp.snapshots.is_empty() || !lists_known {
                        lists_known = apply_snapshot_lists(&node, resp.snapshots).await;
                    }
                    if let (true, Ok(st)) = (lists_known, node.storage()) {
                        st.lease_aggregation(sent + AGGREGATION_LEASE);
                    }
                }
                Err(e) => {
                    if !warned {
                        tracing::warn!(
                            "join management service at {leader}: {:?}: {}",
                            e.code(),
                            e.message()
                        );
                        warned = true;
                    }
                    // Connect again, resolving the name again: in a cluster the
                    // service's pod may have come back at another address, and a
                    // channel to the old one only ever times out.
                    client = None;
                }
            }
        }
        tokio::select! {
            _ = tokio::time::sleep(HEARTBEAT_EVERY) => {}
            _ = node.heartbeat_now.notified() => {}
        }
    }
}

/// Tell the management service this engine is stopping, so that it
/// excludes its targets at once: updates then go on without them instead
/// of waiting out the heartbeat timeout (a rolling upgrade stops engines
/// this way). Best effort, bounded: a service that does not answer finds
/// out by the timeout.
async fn announce_stop(node: &Arc<Node>) {
    node.stopping
        .store(true, std::sync::atomic::Ordering::Release);
    if node.cfg.hosts_mgmt() {
        return; // the service stops with this engine: nobody to tell
    }
    let leader = node.cfg.mgmt_leader();
    let req = join_req(node, STATE_STOPPING);
    let told = tokio::time::timeout(SHUTDOWN_GRACE, async {
        let mut c = MgmtClient::connect(format!("http://{leader}")).await.ok()?;
        c.join(req).await.ok()
    })
    .await;
    if !matches!(told, Ok(Some(_))) {
        tracing::warn!("could not tell the management service at {leader} that this engine stops");
    }
}

/// Learn the pool maps of a join reply: until the first, the engine serves
/// no I/O (see `peregrine_engine::poolmap`).
async fn apply_pool_maps(node: &Arc<Node>, resp: &JoinResp) {
    if !resp.pool_maps_known {
        node.pool_maps.open_all();
        return;
    }
    match node.pool_maps.install_all(&resp.pool_maps) {
        Ok(true) => {
            let node = node.clone();
            let _ = tokio::task::spawn_blocking(move || node.drain_targets()).await;
        }
        Ok(false) => {}
        Err(e) => tracing::warn!("join reply: {e}"),
    }
}

/// Apply the snapshot lists of a join reply; false if one could not be
/// (the next join asks again). A pool this engine lacks has nothing to keep.
async fn apply_snapshot_lists(node: &Arc<Node>, lists: Vec<ContShardSnapshotsReq>) -> bool {
    let Ok(st) = node.storage() else {
        return false;
    };
    tokio::task::spawn_blocking(move || {
        lists.into_iter().all(|l| {
            let (Ok(pool), Ok(cont)) = (l.pool_uuid.parse(), l.cont_uuid.parse()) else {
                tracing::warn!(
                    "join reply: snapshot list of {}/{}: bad uuid",
                    l.pool_uuid,
                    l.cont_uuid
                );
                return true;
            };
            match st.set_snapshots(pool, cont, l.epochs, None) {
                Ok(()) => true,
                Err(StorageError::NotFound(_)) => true,
                Err(e) => {
                    tracing::warn!("snapshot list of container {cont} not applied: {e}");
                    false
                }
            }
        })
    })
    .await
    .unwrap_or(false)
}

async fn run(node: Arc<Node>, metrics_listen: Option<SocketAddr>) -> Result<(), String> {
    let cfg = node.cfg.clone();
    if let Some(addr) = metrics_listen {
        let l = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| format!("--metrics-listen {addr}: bind: {e}"))?;
        let registry = Arc::new(peregrine_engine::metrics::registry(node.clone()));
        tokio::spawn(peregrine_engine::metrics::http::serve(l, registry));
        tracing::info!("metrics on http://{addr}/metrics");
    }
    let data = tokio::net::TcpListener::bind((cfg.listen_addr, cfg.data_port))
        .await
        .map_err(|e| format!("data_port {}: bind {}: {e}", cfg.data_port, cfg.data_addr()))?;
    let control = tokio::net::TcpListener::bind((cfg.listen_addr, cfg.control_port))
        .await
        .map_err(|e| {
            format!(
                "control_port {}: bind {}: {e}",
                cfg.control_port,
                cfg.control_addr()
            )
        })?;

    let mut router = tonic::transport::Server::builder()
        .add_service(EngineServer::new(EngineService { node: node.clone() }));
    if cfg.hosts_mgmt() {
        let ms = MgmtService::new(node.clone())?;
        peregrine_engine::ms::spawn_pool_watch(ms.clone());
        peregrine_engine::ms::spawn_quota_watch(ms.clone());
        router = router.add_service(MgmtServer::from_arc(ms));
        tracing::info!("management service on {}", cfg.control_addr());
    }
    tokio::spawn(peregrine_engine::dataplane::serve(node.clone(), data));
    peregrine_engine::dtx::spawn(node.clone());
    // Shared memory for clients on this node; optional, TCP serves everyone.
    let shm = peregrine_engine::shm::serve(node.clone(), &cfg.shm_socket())
        .map_err(|e| tracing::warn!("shared-memory data plane disabled: {e}"))
        .ok();
    let shm_path = shm
        .as_ref()
        .map(|s| s.path().display().to_string())
        .unwrap_or_default();
    let incoming = tokio_stream::wrappers::TcpListenerStream::new(control);
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopping = node.clone();
    tokio::spawn(async move {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {},
            _ = tokio::signal::ctrl_c() => {},
        }
        tracing::info!("shutting down");
        announce_stop(&stopping).await;
        let _ = stop_tx.send(true);
    });
    tokio::spawn(join_loop(node.clone(), shm_path));
    tracing::info!(
        "rank {} {} (control {}, data {}, {} targets)",
        cfg.rank,
        node.state(),
        cfg.control_addr(),
        cfg.data_addr(),
        cfg.targets
    );
    println!("peregrine-engine: rank {} {}", cfg.rank, node.state());
    let mut graceful = stop_rx.clone();
    let serve = router.serve_with_incoming_shutdown(incoming, async move {
        let _ = graceful.wait_for(|s| *s).await;
    });
    // Peers keep management connections open; give them a moment, not forever.
    let mut deadline = stop_rx;
    let grace = async move {
        let _ = deadline.wait_for(|s| *s).await;
        tokio::time::sleep(SHUTDOWN_GRACE).await;
    };
    tokio::select! {
        r = serve => r.map_err(|e| format!("control service: {e}")),
        _ = grace => Ok(()),
    }
}

fn main() {
    let args = Args::parse();
    let cfg = match Config::load(&args.config) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("peregrine-engine: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = init_logging(&cfg) {
        eprintln!("peregrine-engine: {e}");
        std::process::exit(1);
    }
    let node = match Node::start(cfg) {
        Ok(n) => n,
        Err(e) => {
            eprintln!("peregrine-engine: {e}");
            tracing::error!("{e}");
            std::process::exit(1);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let result = rt.block_on(run(node.clone(), args.metrics_listen));
    node.shutdown();
    if let Err(e) = result {
        eprintln!("peregrine-engine: {e}");
        tracing::error!("{e}");
        std::process::exit(1);
    }
}
