//! `peregrine-engine --config engine.yaml [--rank N --listen-addr IP ...]`

use clap::Parser;
use peregrine_engine::auth::{Authorized, Policy};
use peregrine_engine::config::{Config, Overrides};
use peregrine_engine::control::EngineService;
use peregrine_engine::ms::{MgmtService, AGGREGATION_LEASE, STATE_STOPPING};
use peregrine_engine::node::Node;
use peregrine_engine::tls::ControlTls;
use peregrine_proto::mgmt::engine_server::EngineServer;
use peregrine_proto::mgmt::mgmt_client::MgmtClient;
use peregrine_proto::mgmt::mgmt_server::MgmtServer;
use peregrine_proto::mgmt::{ContShardSnapshotsReq, JoinReq, JoinResp};
use peregrine_vos::StorageError;
use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

/// The index is millions of blocks of 16 to 128 bytes: glibc adds a header
/// to each and rounds it up in steps of 16; jemalloc's size classes hold them
/// tighter (10^6 files: 596 -> 549 B of RSS each, bench/mdscale.md).
#[global_allocator]
static ALLOC: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

#[derive(Parser)]
#[command(name = "peregrine-engine", version, about = "Peregrine storage engine")]
struct Args {
    /// Engine configuration (YAML).
    #[arg(long, short)]
    config: PathBuf,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 0.0.0.0:9464); off unless given.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<SocketAddr>,
    /// This engine's own values, over the configuration's (which engines
    /// of one system may then share).
    #[command(flatten)]
    overrides: Overrides,
}

/// How often an engine reports to the management service.
const HEARTBEAT_EVERY: Duration = Duration::from_secs(2);
/// How long in-flight control calls get to finish after SIGTERM.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);
/// How long a new control connection gets to send its first byte (the
/// HTTP/2 preface) before it is closed.
const FIRST_BYTE_TIMEOUT: Duration = Duration::from_secs(10);

/// The control service's connections (`control_plane` in the
/// configuration): at most `max` at once, one more is closed as soon as it
/// is accepted (with a warning); each with TCP keepalive, and closed if its
/// first byte does not come within `first_byte`.
struct CappedIncoming {
    listener: tokio::net::TcpListener,
    open: Arc<AtomicUsize>,
    max: usize,
    keepalive: Duration,
    first_byte: Duration,
}

impl tokio_stream::Stream for CappedIncoming {
    type Item = std::io::Result<Capped>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let (io, peer) = match this.listener.poll_accept(cx) {
                Poll::Pending => return Poll::Pending,
                // tonic logs and goes on.
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Ok(a)) => a,
            };
            if this.open.load(Ordering::Relaxed) >= this.max {
                tracing::warn!(
                    "control connection from {peer} closed: {} connections already open (control_plane.max_connections)",
                    this.max
                );
                continue;
            }
            let _ = io.set_nodelay(true);
            set_keepalive(&io, this.keepalive);
            this.open.fetch_add(1, Ordering::Relaxed);
            return Poll::Ready(Some(Ok(Capped {
                io,
                open: this.open.clone(),
                first: Some(Box::pin(tokio::time::sleep(this.first_byte))),
            })));
        }
    }
}

/// TCP keepalive probes after `idle` without traffic, every `idle` after.
fn set_keepalive(io: &tokio::net::TcpStream, idle: Duration) {
    use std::os::fd::AsRawFd;
    let secs = idle.as_secs().clamp(1, 3600) as libc::c_int;
    let set = |level, opt, v: libc::c_int| {
        // SAFETY: setsockopt of an int on a socket we hold.
        unsafe {
            libc::setsockopt(
                io.as_raw_fd(),
                level,
                opt,
                &v as *const _ as *const libc::c_void,
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, secs);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, secs);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
}

/// An error of one connection as one tonic's accept loop survives. With
/// TLS the handshake reads and writes the connection inside that loop, and
/// an error of another kind there (a timeout, a refused keepalive) would end
/// the whole control service, not this connection. After the handshake the
/// kind does not matter: hyper closes the connection on any error.
fn survivable(e: std::io::Error) -> std::io::Error {
    use std::io::ErrorKind::*;
    match e.kind() {
        ConnectionAborted | ConnectionReset | BrokenPipe | Interrupted | InvalidData
        | UnexpectedEof | WouldBlock => e,
        _ => std::io::Error::new(ConnectionAborted, e),
    }
}

/// One control connection, counted while it lives.
struct Capped {
    io: tokio::net::TcpStream,
    open: Arc<AtomicUsize>,
    /// Until the first byte arrives: when the connection is closed without one.
    first: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl Drop for Capped {
    fn drop(&mut self) {
        self.open.fetch_sub(1, Ordering::Relaxed);
    }
}

impl tonic::transport::server::Connected for Capped {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

impl tokio::io::AsyncRead for Capped {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let r = Pin::new(&mut this.io)
            .poll_read(cx, buf)
            .map_err(survivable);
        if let Some(first) = &mut this.first {
            match &r {
                Poll::Ready(Ok(())) if buf.filled().len() > before => this.first = None,
                Poll::Pending if first.as_mut().poll(cx).is_ready() => {
                    return Poll::Ready(Err(std::io::Error::new(
                        std::io::ErrorKind::ConnectionAborted,
                        "no TLS hello or HTTP/2 preface in time",
                    )))
                }
                _ => {}
            }
        }
        r
    }
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io)
            .poll_write(cx, buf)
            .map_err(survivable)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io)
            .poll_write_vectored(cx, bufs)
            .map_err(survivable)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

/// A gRPC service whose calls, with those of the other services sharing
/// `permits`, run at most `control_plane.max_concurrent_requests` at once:
/// one more is answered `ResourceExhausted` at once.
#[derive(Clone)]
struct Limited<S> {
    inner: S,
    permits: Arc<tokio::sync::Semaphore>,
}

impl<S> Limited<S> {
    fn new(inner: S, permits: &Arc<tokio::sync::Semaphore>) -> Self {
        Limited {
            inner,
            permits: permits.clone(),
        }
    }
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Limited<S> {
    const NAME: &'static str = S::NAME;
}

type BoxResponse = Pin<
    Box<
        dyn Future<
                Output = Result<
                    tonic::codegen::http::Response<tonic::body::BoxBody>,
                    std::convert::Infallible,
                >,
            > + Send,
    >,
>;

impl<S, B> tonic::codegen::Service<tonic::codegen::http::Request<B>> for Limited<S>
where
    S: tonic::codegen::Service<
        tonic::codegen::http::Request<B>,
        Response = tonic::codegen::http::Response<tonic::body::BoxBody>,
        Error = std::convert::Infallible,
    >,
    S::Future: Send + 'static,
{
    type Response = tonic::codegen::http::Response<tonic::body::BoxBody>;
    type Error = std::convert::Infallible;
    type Future = BoxResponse;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: tonic::codegen::http::Request<B>) -> Self::Future {
        let Ok(permit) = self.permits.clone().try_acquire_owned() else {
            let st = tonic::Status::resource_exhausted(
                "too many control calls at once (control_plane.max_concurrent_requests); retry",
            );
            return Box::pin(std::future::ready(Ok(st.into_http())));
        };
        let fut = self.inner.call(req);
        Box::pin(async move {
            let r = fut.await;
            drop(permit);
            r
        })
    }
}

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
            if let (Ok(ep), Ok(connector)) = (
                tonic::transport::Endpoint::from_shared(format!("http://{leader}")),
                peregrine_engine::tls::connector(),
            ) {
                let ep = ep
                    .connect_timeout(Duration::from_secs(2))
                    .timeout(Duration::from_secs(5));
                match connector.connect(ep).await {
                    Ok(ch) => client = Some(MgmtClient::new(ch)),
                    Err(e) if !warned => {
                        // A TLS refusal (wrong CA, a certificate of another
                        // system) would otherwise retry silently forever.
                        tracing::warn!("join management service at {leader}: {}", error_chain(&e));
                        warned = true;
                    }
                    Err(_) => {}
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
        let ep = tonic::transport::Endpoint::from_shared(format!("http://{leader}")).ok()?;
        let ch = peregrine_engine::tls::connector()
            .ok()?
            .connect(ep)
            .await
            .ok()?;
        MgmtClient::new(ch).join(req).await.ok()
    })
    .await;
    if !matches!(told, Ok(Some(_))) {
        tracing::warn!("could not tell the management service at {leader} that this engine stops");
    }
}

/// An error and its sources, for the log (tonic's own Display says only
/// "transport error").
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    msg
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

async fn run(
    node: Arc<Node>,
    tls: ControlTls,
    metrics_listen: Option<SocketAddr>,
) -> Result<(), String> {
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

    let policy = Arc::new(Policy {
        tls: tls.server.is_some(),
        system: cfg.name.clone(),
    });
    let cp = &cfg.control_plane;
    let max_msg = cp.max_message_bytes.0 as usize;
    let calls = Arc::new(tokio::sync::Semaphore::new(cp.max_concurrent_requests));
    let keepalive = Duration::from_secs(cp.keepalive_s);
    let mut server = tonic::transport::Server::builder();
    match tls.server {
        Some(t) => {
            server = server
                .tls_config(t)
                .map_err(|e| format!("tls_dir: {}", error_chain(&e)))?;
            if let Some(id) = &tls.identity {
                tracing::info!("control plane: mutual TLS as {id}");
            }
        }
        None => tracing::warn!("{}", peregrine_engine::tls::insecure_warning(&cfg)),
    }
    let mut router = server
        .concurrency_limit_per_connection(cp.concurrency_per_connection)
        .max_concurrent_streams(cp.concurrency_per_connection as u32)
        .timeout(Duration::from_secs(cp.request_timeout_s))
        .max_connection_age(Duration::from_secs(cp.max_connection_age_s))
        .http2_keepalive_interval(Some(keepalive))
        .http2_keepalive_timeout(Some(Duration::from_secs(cp.keepalive_timeout_s)))
        .http2_max_header_list_size(64 << 10)
        .http2_max_pending_accept_reset_streams(Some(64))
        .add_service(Limited::new(
            Authorized::new(
                EngineServer::new(EngineService { node: node.clone() })
                    .max_decoding_message_size(max_msg)
                    .max_encoding_message_size(max_msg),
                &policy,
            ),
            &calls,
        ));
    if cfg.hosts_mgmt() {
        let ms = MgmtService::new(node.clone())?;
        peregrine_engine::ms::spawn_pool_watch(ms.clone());
        peregrine_engine::ms::spawn_quota_watch(ms.clone());
        router = router.add_service(Limited::new(
            Authorized::new(
                MgmtServer::from_arc(ms)
                    .max_decoding_message_size(max_msg)
                    .max_encoding_message_size(max_msg),
                &policy,
            ),
            &calls,
        ));
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
    let incoming = CappedIncoming {
        listener: control,
        open: Arc::new(AtomicUsize::new(0)),
        max: cp.max_connections,
        keepalive,
        first_byte: FIRST_BYTE_TIMEOUT,
    };
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
    // The one place the engine reads its tuning from the environment: the
    // variables that set it before it was configuration, for the fields
    // the YAML leaves unset.
    let cfg = match Config::load_with(&args.config, &args.overrides)
        .and_then(|mut c| c.fill_from_env(|k| std::env::var(k).ok()).map(|()| c))
    {
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
    // Before the storage starts: a wrong certificate is a start-up error
    // naming the file, not a run of refused joins.
    let tls = match peregrine_engine::tls::load(&cfg) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("peregrine-engine: {e}");
            tracing::error!("{e}");
            std::process::exit(1);
        }
    };
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
    let result = rt.block_on(run(node.clone(), tls, args.metrics_listen));
    node.shutdown();
    if let Err(e) = result {
        eprintln!("peregrine-engine: {e}");
        tracing::error!("{e}");
        std::process::exit(1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::IpAddr;

    #[test]
    fn per_engine_flags_parse_into_overrides() {
        let a = Args::try_parse_from([
            "peregrine-engine",
            "--config",
            "/etc/peregrine/engine.yaml",
            "--rank",
            "3",
            "--listen-addr",
            "10.1.2.3",
            "--fault-domain",
            "/node-a",
            "--dns-name",
            "tank-3.tank.ns.svc",
            "--bdev-path",
            "/var/lib/peregrine/tank-nvme3.img",
        ])
        .unwrap();
        assert_eq!(
            a.overrides,
            Overrides {
                rank: Some(3),
                listen_addr: Some(IpAddr::from([10, 1, 2, 3])),
                fault_domain: Some("/node-a".into()),
                dns_name: Some("tank-3.tank.ns.svc".into()),
                bdev_path: Some("/var/lib/peregrine/tank-nvme3.img".into()),
            }
        );
        let a = Args::try_parse_from(["peregrine-engine", "-c", "e.yaml"]).unwrap();
        assert_eq!(a.overrides, Overrides::default());
        // Typed flags are refused by name, before any configuration is read.
        for (flag, bad) in [("--rank", "-1"), ("--listen-addr", "tank-0")] {
            let arg = format!("{flag}={bad}");
            let e = Args::try_parse_from(["peregrine-engine", "-c", "e.yaml", &arg])
                .err()
                .unwrap()
                .to_string();
            assert!(e.contains(flag), "{flag} {bad}: {e}");
        }
    }
}
