//! Test harness shared by the integration tests of the engine, the POSIX
//! layer, the FUSE daemon and the interception library: real
//! `peregrine-engine` processes on file-backed emulated NVMe under a
//! temporary directory, driven through the management gRPC API and the
//! client library.
//!
//! Engines run with the control plane's mutual TLS (docs/tls.md): each
//! cluster makes a CA and certificates under its directory (`certs/`: one
//! per rank, `admin`, `client-test`) with the code of `peregrine certs`.
//! The harness itself (`mgmt()`, `client()`) speaks as `admin`; daemons a
//! test starts take [`Cluster::tls_args`] / [`Cluster::tls_env`], which
//! are the `client` certificate's. A test that gives `allow_insecure: true`
//! (or its own `tls_dir`) in `extra` gets no certificates.

use peregrine_proto::mgmt::mgmt_client::MgmtClient;
use peregrine_proto::mgmt::*;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The engine binary: `PEREGRINE_ENGINE_BIN`, else the one cargo built next
/// to the running test (`target/<profile>/deps/<test>` -> `target/<profile>`).
pub fn engine_bin() -> PathBuf {
    let p = match std::env::var_os("PEREGRINE_ENGINE_BIN") {
        Some(p) => PathBuf::from(p),
        None => {
            let exe = std::env::current_exe().expect("test executable path");
            exe.parent()
                .and_then(Path::parent)
                .expect("target/<profile>")
                .join("peregrine-engine")
        }
    };
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p peregrine-engine` first (make test does)",
        p.display()
    );
    p
}

/// Properties as the management API takes them (`acl`, `owner`, ...).
pub fn props(kv: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    kv.iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Builds the C program `crates/client/tests/c/<name>.c` against the
/// libperegrine.so next to the engine binary, into `out_dir` (made
/// executable by all, so tests may run it as other users). Returns the
/// program and the library's directory, for `LD_LIBRARY_PATH`.
pub fn build_c_program(name: &str, out_dir: &Path) -> (PathBuf, PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let lib_dir = engine_bin()
        .parent()
        .expect("target/<profile>")
        .to_path_buf();
    assert!(
        lib_dir.join("libperegrine.so").exists(),
        "libperegrine.so missing in {}: run `cargo build --workspace` first (make test does)",
        lib_dir.display()
    );
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let exe = out_dir.join(name);
    let cc = Command::new("cc")
        .args(["-std=c11", "-Wall", "-Wextra", "-Werror", "-o"])
        .arg(&exe)
        .arg(root.join(format!("crates/client/tests/c/{name}.c")))
        .arg("-I")
        .arg(root.join("include"))
        .arg("-L")
        .arg(&lib_dir)
        .arg("-lperegrine")
        .output()
        .expect("running cc");
    assert!(
        cc.status.success(),
        "cc {name}.c: {}",
        String::from_utf8_lossy(&cc.stderr)
    );
    std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    (exe, lib_dir)
}

/// A loopback port nothing listens on, never the same twice in this process:
/// the kernel may hand a just-released port out again, and two engines of one
/// cluster given the same port fail to start.
pub fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|e| e.into_inner());
    loop {
        let p = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        if !given.contains(&p) {
            given.push(p);
            return p;
        }
    }
}

pub struct EngineProc {
    pub rank: u32,
    pub config: PathBuf,
    pub device: PathBuf,
    pub log: PathBuf,
    pub control_port: u16,
    pub data_port: u16,
    /// Command-line arguments after `--config` (e.g. `--metrics-listen`).
    pub args: Vec<String>,
    pub child: Option<Child>,
}

impl EngineProc {
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "rank {} already running", self.rank);
        let out = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log.with_extension("out"))
            .unwrap();
        let child = Command::new(engine_bin())
            .arg("--config")
            .arg(&self.config)
            .args(&self.args)
            .stdout(Stdio::from(out.try_clone().unwrap()))
            .stderr(Stdio::from(out))
            .spawn()
            .expect("spawn peregrine-engine");
        self.child = Some(child);
    }

    /// SIGKILL: the crash case.
    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// SIGTERM and wait: the clean stop.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SAFETY: kill on the pid of our own child, not yet reaped (so not reused).
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                if Instant::now() > deadline {
                    let _ = c.kill();
                    let _ = c.wait();
                    panic!("rank {} did not stop within 20 s of SIGTERM", self.rank);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }

    pub fn log_text(&self) -> String {
        let mut s = std::fs::read_to_string(&self.log).unwrap_or_default();
        s.push_str(&std::fs::read_to_string(self.log.with_extension("out")).unwrap_or_default());
        s
    }
}

impl Drop for EngineProc {
    fn drop(&mut self) {
        self.kill9();
    }
}

pub struct Cluster {
    pub dir: tempfile::TempDir,
    pub engines: Vec<EngineProc>,
    pub rt: tokio::runtime::Runtime,
    /// The certificates' directory (`peregrine certs` layout); None: the
    /// engines run insecure (or with a test's own `tls_dir`).
    pub certs: Option<PathBuf>,
}

/// The system name of test clusters (the engines' `name`).
pub const SYSTEM: &str = "test";
/// The name of the `client` certificate a cluster makes.
pub const CLIENT: &str = "test";

pub struct ClusterSpec {
    pub engines: u32,
    pub targets: u32,
    pub device_mib: u64,
    pub scm_mib: u64,
}

impl Default for ClusterSpec {
    fn default() -> Self {
        ClusterSpec {
            engines: 1,
            targets: 2,
            device_mib: 256,
            scm_mib: 256,
        }
    }
}

impl Cluster {
    /// Start engines (not yet formatted) and wait until they have all joined.
    pub fn start(spec: ClusterSpec) -> Cluster {
        Cluster::start_configured(spec, "")
    }

    /// As [`Cluster::start`], with `extra` (YAML lines) added to every
    /// engine's configuration.
    pub fn start_configured(spec: ClusterSpec, extra: &str) -> Cluster {
        Cluster::start_with_args(spec, extra, |_| Vec::new())
    }

    /// As [`Cluster::start_configured`], with `args(rank)` added to each
    /// engine's command line.
    pub fn start_with_args(
        spec: ClusterSpec,
        extra: &str,
        args: impl Fn(u32) -> Vec<String>,
    ) -> Cluster {
        let dir = tempfile::tempdir().unwrap();
        // A test that chose its control-plane security keeps it.
        let chosen = extra.lines().any(|l| {
            let l = l.trim_start();
            l.starts_with("allow_insecure:") || l.starts_with("tls_dir:")
        });
        let certs = (!chosen).then(|| dir.path().join("certs"));
        if let Some(out) = &certs {
            let plan = peregrine::certs::Plan {
                system: SYSTEM.into(),
                ranks: spec.engines,
                admin: true,
                clients: vec![CLIENT.into()],
                hosts: vec!["localhost".into(), "127.0.0.1".into()],
            };
            peregrine::certs::generate(out, &plan).unwrap_or_else(|e| panic!("certs: {e}"));
        }
        let ports: Vec<(u16, u16)> = (0..spec.engines)
            .map(|_| (free_port(), free_port()))
            .collect();
        let ms = format!("127.0.0.1:{}", ports[0].0);
        let mut engines = vec![];
        for rank in 0..spec.engines {
            let (cp, dp) = ports[rank as usize];
            let device = dir.path().join(format!("nvme{rank}.img"));
            let log = dir.path().join(format!("engine{rank}.log"));
            let config = dir.path().join(format!("engine{rank}.yaml"));
            let security = match &certs {
                Some(out) => format!(
                    "tls_dir: {}\n",
                    peregrine::certs::engine_dir(out, rank).display()
                ),
                None => String::new(),
            };
            std::fs::write(
                &config,
                format!(
                    "name: {SYSTEM}\nrank: {rank}\nfault_domain: /host{rank}\ncontrol_port: {cp}\ndata_port: {dp}\ntargets: {}\nhugepages: false\n\
                     scm: {{class: ram, size: {}MiB}}\nbdev: {{class: file, path: {}, size: {}MiB}}\n\
                     mgmt_svc_replicas: [\"{ms}\"]\nlog_level: info\nlog_file: {}\n{security}{extra}",
                    spec.targets,
                    spec.scm_mib,
                    device.display(),
                    spec.device_mib,
                    log.display()
                ),
            )
            .unwrap();
            let mut e = EngineProc {
                rank,
                config,
                device,
                log,
                control_port: cp,
                data_port: dp,
                args: args(rank),
                child: None,
            };
            e.start();
            engines.push(e);
        }
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let c = Cluster {
            dir,
            engines,
            rt,
            certs,
        };
        c.wait_members(
            spec.engines as usize,
            &[MemberState::Maintenance, MemberState::Joined],
        );
        c
    }

    pub fn mgmt_addr(&self) -> String {
        format!("127.0.0.1:{}", self.engines[0].control_port)
    }

    /// The admin certificate's directory (None: insecure).
    pub fn admin_tls_dir(&self) -> Option<PathBuf> {
        self.certs.as_deref().map(peregrine::certs::admin_dir)
    }

    /// The `client` certificate's directory (None: insecure).
    pub fn client_tls_dir(&self) -> Option<PathBuf> {
        self.certs
            .as_deref()
            .map(|c| peregrine::certs::client_dir(c, CLIENT))
    }

    /// How the harness connects: as admin.
    pub fn security(&self) -> peregrine::Security {
        match self.admin_tls_dir() {
            Some(d) => peregrine::Security::tls(d),
            None => peregrine::Security::Insecure,
        }
    }

    /// How a mounting client connects: with the `client` certificate.
    pub fn client_security(&self) -> peregrine::Security {
        match self.client_tls_dir() {
            Some(d) => peregrine::Security::tls(d),
            None => peregrine::Security::Insecure,
        }
    }

    /// Flags of a daemon started as a client (`peregrine-fuse`): the
    /// `client` certificate, or `--insecure`.
    pub fn tls_args(&self) -> Vec<String> {
        match self.client_tls_dir() {
            Some(d) => vec!["--tls-dir".into(), d.display().to_string()],
            None => vec!["--insecure".into()],
        }
    }

    /// Environment of a program started as a client (C programs, `mount`
    /// helpers): `PEREGRINE_TLS_DIR` of the `client` certificate, or
    /// `PEREGRINE_INSECURE=1`.
    pub fn tls_env(&self) -> Vec<(String, String)> {
        Self::env_of(self.client_tls_dir())
    }

    /// As [`Cluster::tls_env`], with the admin certificate (the CLI).
    pub fn admin_env(&self) -> Vec<(String, String)> {
        Self::env_of(self.admin_tls_dir())
    }

    fn env_of(dir: Option<PathBuf>) -> Vec<(String, String)> {
        match dir {
            Some(d) => vec![(peregrine::tls::ENV_TLS_DIR.into(), d.display().to_string())],
            None => vec![(peregrine::tls::ENV_INSECURE.into(), "1".into())],
        }
    }

    /// A gRPC channel to `addr` ("host:port") with `security`.
    pub fn channel(
        &self,
        addr: &str,
        security: &peregrine::Security,
    ) -> Result<tonic::transport::Channel, String> {
        let connector = security.connector()?;
        let ep = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .map_err(|e| e.to_string())?
            .connect_timeout(Duration::from_secs(5));
        self.rt
            .block_on(connector.connect(ep))
            .map_err(|e| error_chain(&e))
    }

    /// The Engine service of rank `rank`, as admin.
    pub fn engine(
        &self,
        rank: usize,
    ) -> peregrine_proto::mgmt::engine_client::EngineClient<tonic::transport::Channel> {
        let addr = format!("127.0.0.1:{}", self.engines[rank].control_port);
        let ch = self
            .channel(&addr, &self.security())
            .unwrap_or_else(|e| panic!("engine at {addr}: {e}"));
        peregrine_proto::mgmt::engine_client::EngineClient::new(ch)
    }

    /// The management service as `security` says.
    pub fn mgmt_as(&self, security: &peregrine::Security) -> MgmtClient<tonic::transport::Channel> {
        let addr = self.mgmt_addr();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.channel(&addr, security) {
                Ok(ch) => return MgmtClient::new(ch),
                Err(e) if Instant::now() > deadline => {
                    panic!("management service at {addr}: {e}; logs:\n{}", self.logs())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    /// The management service, as admin.
    pub fn mgmt(&self) -> MgmtClient<tonic::transport::Channel> {
        self.mgmt_as(&self.security())
    }

    /// Aggregate pool `pool` up to now on every engine (as each does on
    /// its own when idle or short of space): versions under a newer one,
    /// and punches with what they hid, are dropped.
    pub fn aggregate(&self, pool: &str) {
        let q = PoolQueryReq { id: pool.into() };
        let uuid = self
            .rt
            .block_on(self.mgmt().pool_query(q))
            .unwrap_or_else(|e| panic!("pool query of {pool}: {e}"))
            .into_inner()
            .uuid;
        for rank in 0..self.engines.len() {
            let req = AggregateReq {
                pool_uuid: uuid.clone(),
            };
            self.rt
                .block_on(self.engine(rank).aggregate(req))
                .unwrap_or_else(|e| panic!("aggregation of {pool} on rank {rank}: {e}"));
        }
    }

    pub fn logs(&self) -> String {
        self.engines
            .iter()
            .map(|e| format!("--- rank {} ---\n{}", e.rank, e.log_text()))
            .collect()
    }

    /// Wait until `n` members are in one of `states`.
    pub fn wait_members(&self, n: usize, states: &[MemberState]) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut m = self.mgmt();
        loop {
            if let Ok(r) = self.rt.block_on(m.system_query(SystemQueryReq {})) {
                let ok = r
                    .get_ref()
                    .members
                    .iter()
                    .filter(|x| states.contains(&x.state()))
                    .count();
                if ok >= n {
                    return;
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "{n} engines not in {states:?} within 30 s; logs:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn format(&self) {
        let mut m = self.mgmt();
        self.rt
            .block_on(m.storage_format(StorageFormatReq { force: false }))
            .unwrap_or_else(|e| panic!("format: {e}\n{}", self.logs()));
        self.wait_members(self.engines.len(), &[MemberState::Joined]);
    }

    /// A formatted cluster with pool `pool` of `pool_mib` and container `cont`.
    pub fn with_pool(spec: ClusterSpec, pool_mib: u64, oclass: &str, checksum: &str) -> Cluster {
        let c = Cluster::start(spec);
        c.format();
        c.create_pool(pool_mib, oclass, checksum);
        c
    }

    /// Three engines of one target, formatted, with pool `pool` (RP_3G1)
    /// and the container `cont` names, its files and directories
    /// replicated on all three: the cluster of the tests that kill one
    /// engine of a replicated container and read after it returns.
    pub fn replicated(cont: ContCreateReq) -> Cluster {
        let spec = ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 256,
            scm_mib: 64,
        };
        let c = Cluster::with_pool(spec, 384, "RP_3G1", "crc32c");
        let mut m = c.mgmt();
        c.rt.block_on(m.cont_create(ContCreateReq {
            pool: "pool".into(),
            oclass: "RP_3G1".into(),
            dir_oclass: "RP_3G1".into(),
            ..cont
        }))
        .unwrap_or_else(|e| panic!("cont create: {e}"));
        c
    }

    /// Pool `pool` of `pool_mib` and container `cont` on a formatted cluster.
    pub fn create_pool(&self, pool_mib: u64, oclass: &str, checksum: &str) {
        let mut m = self.mgmt();
        self.rt
            .block_on(m.pool_create(PoolCreateReq {
                label: "pool".into(),
                total_size: pool_mib << 20,
                ..Default::default()
            }))
            .unwrap_or_else(|e| panic!("pool create: {e}\n{}", self.logs()));
        self.rt
            .block_on(m.cont_create(ContCreateReq {
                pool: "pool".into(),
                label: "cont".into(),
                oclass: oclass.into(),
                checksum: checksum.into(),
                ..Default::default()
            }))
            .unwrap_or_else(|e| panic!("cont create: {e}"));
    }

    /// (WAL records acknowledged and not yet flushed, device flushes) of
    /// rank `rank`, from `storage scan`.
    pub fn unflushed(&self, rank: u32) -> (u64, u64) {
        let mut m = self.mgmt();
        let r = self
            .rt
            .block_on(m.storage_scan(StorageScanReq {}))
            .unwrap_or_else(|e| panic!("storage scan: {e}"))
            .into_inner();
        let r = r
            .ranks
            .iter()
            .find(|r| r.rank == rank)
            .expect("rank scanned");
        (r.unflushed_records, r.flushes)
    }

    /// Restart a stopped engine and wait until the MS sees it ready.
    pub fn restart(&mut self, rank: usize) {
        self.engines[rank].start();
        self.wait_serving(rank);
        self.wait_members(self.engines.len(), &[MemberState::Joined]);
    }

    /// Wait until an engine answers a ping on its data port. (The management
    /// service may still report a just-killed engine as joined until its
    /// heartbeat times out, so membership alone does not prove it is back.)
    pub fn wait_serving(&self, rank: usize) {
        use peregrine_proto::frame::{self, Opcode};
        let addr = format!("127.0.0.1:{}", self.engines[rank].data_port);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(mut s) = std::net::TcpStream::connect(&addr) {
                let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
                if frame::write_frame(&mut s, Opcode::Ping, 0, 1, &[], &[]).is_ok() {
                    if let Ok(f) = frame::read_frame(&mut s) {
                        let resp: peregrine_proto::data::Response =
                            prost::Message::decode(f.msg.as_slice()).unwrap();
                        if resp.status.map(|s| s.code).unwrap_or(0) == 0 {
                            return;
                        }
                    }
                }
            }
            if Instant::now() > deadline {
                panic!(
                    "rank {rank} not serving within 30 s; logs:\n{}",
                    self.logs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// A client library connection, as admin, on the transport
    /// `PEREGRINE_TRANSPORT` names (auto by default), so that a whole
    /// suite can be run over TCP or shared memory alone.
    pub fn client(&self) -> peregrine::Client {
        let kind = peregrine::TransportKind::from_env()
            .unwrap_or_else(|e| panic!("{}: {e}", peregrine::transport::TRANSPORT_ENV));
        self.client_with(kind)
    }

    /// A client library connection with a chosen transport, as admin.
    pub fn client_with(&self, kind: peregrine::TransportKind) -> peregrine::Client {
        peregrine::Client::connect_with_transport(&self.mgmt_addr(), &self.security(), kind)
            .unwrap_or_else(|e| panic!("client connect: {e}"))
    }

    pub fn container(&self) -> peregrine::Container {
        let client = self.client();
        let pool = client.pool_connect("pool").unwrap();
        pool.cont_open("cont").unwrap()
    }
}

/// An error and its sources in one line (tonic's Display alone says
/// "transport error").
pub fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut msg = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        msg = format!("{msg}: {s}");
        src = s.source();
    }
    msg
}

/// Deterministic test data: `len` bytes derived from `seed`.
pub fn pattern(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

pub fn find_bytes(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

pub fn read_file(p: &Path) -> Vec<u8> {
    std::fs::read(p).unwrap()
}
