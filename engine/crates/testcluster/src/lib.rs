//! Test harness shared by the integration tests of the engine, the POSIX
//! layer, the FUSE daemon and the interception library: real
//! `peregrine-engine` processes on file-backed emulated NVMe under a
//! temporary directory, driven through the management gRPC API and the
//! client library.

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
}

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
            std::fs::write(
                &config,
                format!(
                    "name: test\nrank: {rank}\nfault_domain: /host{rank}\ncontrol_port: {cp}\ndata_port: {dp}\ntargets: {}\nhugepages: false\n\
                     scm: {{class: ram, size: {}MiB}}\nbdev: {{class: file, path: {}, size: {}MiB}}\n\
                     mgmt_svc_replicas: [\"{ms}\"]\nlog_level: info\nlog_file: {}\n{extra}",
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
        let c = Cluster { dir, engines, rt };
        c.wait_members(
            spec.engines as usize,
            &[MemberState::Maintenance, MemberState::Joined],
        );
        c
    }

    pub fn mgmt_addr(&self) -> String {
        format!("127.0.0.1:{}", self.engines[0].control_port)
    }

    pub fn mgmt(&self) -> MgmtClient<tonic::transport::Channel> {
        let addr = format!("http://{}", self.mgmt_addr());
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.rt.block_on(MgmtClient::connect(addr.clone())) {
                Ok(c) => return c,
                Err(e) if Instant::now() > deadline => {
                    panic!("management service at {addr}: {e}; logs:\n{}", self.logs())
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
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

    pub fn client(&self) -> peregrine::Client {
        peregrine::Client::connect(&self.mgmt_addr())
            .unwrap_or_else(|e| panic!("client connect: {e}"))
    }

    pub fn container(&self) -> peregrine::Container {
        let client = self.client();
        let pool = client.pool_connect("pool").unwrap();
        pool.cont_open("cont").unwrap()
    }
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
