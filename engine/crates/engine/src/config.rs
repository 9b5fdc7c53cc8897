//! The engine's YAML configuration, in the spirit of `daos_server.yml`.
//!
//! Parsing is strict: unknown keys and impossible values are rejected at
//! start with a message naming the key, so a typo never silently falls back
//! to a default.

use serde::Deserialize;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// System name; every engine of one system shares it.
    #[serde(default = "default_name")]
    pub name: String,
    pub rank: u32,
    #[serde(default = "default_fault_domain")]
    pub fault_domain: String,
    /// Address the engine binds and advertises to clients and peers.
    #[serde(default = "default_listen")]
    pub listen_addr: IpAddr,
    #[serde(default = "default_control_port")]
    pub control_port: u16,
    #[serde(default = "default_data_port")]
    pub data_port: u16,
    #[serde(default = "default_targets")]
    pub targets: u32,
    #[serde(default = "default_hugepages")]
    pub hugepages: bool,
    /// Longest an acknowledged update stays in the device's volatile write
    /// cache before its target flushes on its own (fsync and `sync=always`
    /// containers flush at once).
    #[serde(default = "default_flush_interval_ms")]
    pub flush_interval_ms: u64,
    /// Management service: how long the changes made while an engine is
    /// out stay reintegrable (the other engines hold their aggregation back
    /// for it). An engine out longer has its pool shards wiped and copied
    /// whole when it returns, and aggregation goes on meanwhile.
    #[serde(default = "default_reintegration_window_s")]
    pub reintegration_window_s: u64,
    pub scm: ScmConfig,
    pub bdev: BdevConfig,
    /// Control addresses of the management-service replicas; the first one
    /// hosts the service until Raft replication lands.
    #[serde(default)]
    pub mgmt_svc_replicas: Vec<String>,
    #[serde(default = "default_log_level")]
    pub log_level: String,
    #[serde(default)]
    pub log_file: Option<PathBuf>,
    /// Directory of the shared-memory data plane's unix socket
    /// (`peregrine-rank<N>.sock`); see [`Config::shm_socket`] for the default.
    #[serde(default)]
    pub shm_dir: Option<PathBuf>,
    /// Limits of the TCP data plane (see [`DataPlaneConfig`]).
    #[serde(default)]
    pub data_plane: DataPlaneConfig,
}

/// Limits of the TCP data plane, so that no client (or many) can hold the
/// engine's memory or connections for ever:
///
/// ```yaml
/// data_plane:
///   max_connections: 4096          # more are closed at once
///   read_timeout_ms: 30000         # a frame started must arrive whole by then
///   idle_timeout_s: 600            # a connection with nothing in flight; 0: none
///   max_unread_reply_bytes: 64MiB  # per connection; then no more requests are read
///   target_queue_depth: 1024       # requests queued per target
///   max_queued_request_bytes: 1GiB # request bytes queued on all targets
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DataPlaneConfig {
    /// Concurrent data-plane connections; one more is closed as soon as it
    /// is accepted.
    pub max_connections: usize,
    /// A frame whose first byte has arrived must arrive whole within this
    /// long, or its connection is closed.
    pub read_timeout_ms: u64,
    /// A connection with nothing in flight (no request being read, run or
    /// answered) is closed after this long; 0: never. Clients reconnect.
    pub idle_timeout_s: u64,
    /// Reply bytes a connection's client has not read yet (or that are about
    /// to come, by what its fetches ask for): past this, the engine reads no
    /// more requests from it until it drains them.
    pub max_unread_reply_bytes: Size,
    /// Data-plane requests queued on (or running in) one target at once;
    /// connection readers wait for room.
    pub target_queue_depth: usize,
    /// Bytes of data-plane requests queued on (or running in) all targets
    /// at once; connection readers wait for room.
    pub max_queued_request_bytes: Size,
}

impl Default for DataPlaneConfig {
    fn default() -> Self {
        DataPlaneConfig {
            max_connections: 4096,
            read_timeout_ms: 30_000,
            idle_timeout_s: 600,
            max_unread_reply_bytes: Size(64 << 20),
            target_queue_depth: 1024,
            max_queued_request_bytes: Size(1 << 30),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScmConfig {
    pub class: String,
    pub size: Size,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "class", rename_all = "lowercase", deny_unknown_fields)]
pub enum BdevConfig {
    /// A file of a given size: emulated NVMe.
    File { path: PathBuf, size: Size },
    /// A kernel block device: a loop device or an NVMe namespace.
    Kdev { device: PathBuf },
}

/// A byte count written as `4GiB`, `512MiB`, `4G`, `100M` or `4096`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Size(n)),
            Raw::S(s) => parse_size(&s).map(Size).map_err(serde::de::Error::custom),
        }
    }
}

/// Parse a size, naming the value in the error.
pub fn parse_size(s: &str) -> Result<u64, String> {
    peregrine_proto::size::parse_size(s).map_err(|e| format!("invalid size {s:?}: {e}"))
}

fn default_name() -> String {
    "peregrine".into()
}
fn default_fault_domain() -> String {
    "/".into()
}
fn default_listen() -> IpAddr {
    IpAddr::from([127, 0, 0, 1])
}
fn default_control_port() -> u16 {
    peregrine_proto::DEFAULT_CONTROL_PORT
}
fn default_data_port() -> u16 {
    10101
}
fn default_targets() -> u32 {
    1
}
fn default_hugepages() -> bool {
    true
}
fn default_flush_interval_ms() -> u64 {
    peregrine_vos::DEFAULT_FLUSH_INTERVAL.as_millis() as u64
}
fn default_reintegration_window_s() -> u64 {
    3600
}
fn default_log_level() -> String {
    "info".into()
}

fn default_shm_dir() -> PathBuf {
    PathBuf::from("/run/peregrine")
}
/// Most targets an engine runs (and reports when it joins).
pub const MAX_TARGETS: u32 = 64;
/// Longest unix socket path (`sun_path` less its terminating NUL).
pub const MAX_UNIX_PATH: usize = 107;

/// Smallest device that holds a superblock, the WAL and some data per target.
pub const MIN_BDEV_BYTES: u64 = 64 << 20;

impl Config {
    pub fn load(path: &Path) -> Result<Config, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("config {}: {e}", path.display()))?;
        Self::parse(&text).map_err(|e| format!("config {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Config, String> {
        let cfg: Config = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        cfg.validate()?;
        Ok(cfg)
    }

    fn validate(&self) -> Result<(), String> {
        if self.name.is_empty()
            || self.name.len() > 64
            || !self
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            return Err(format!(
                "name: {:?} must be 1-64 characters of [A-Za-z0-9_-]",
                self.name
            ));
        }
        if self.targets == 0 || self.targets > MAX_TARGETS {
            return Err(format!(
                "targets: {} is out of range 1..={MAX_TARGETS}",
                self.targets
            ));
        }
        if !(1..=60_000).contains(&self.flush_interval_ms) {
            return Err(format!(
                "flush_interval_ms: {} is out of range 1..=60000",
                self.flush_interval_ms
            ));
        }
        if !(10..=604_800).contains(&self.reintegration_window_s) {
            return Err(format!(
                "reintegration_window_s: {} is out of range 10..=604800 (10 s to a week)",
                self.reintegration_window_s
            ));
        }
        if self.control_port == 0 || self.data_port == 0 {
            return Err("control_port/data_port: port 0 is not allowed".into());
        }
        if self.control_port == self.data_port {
            return Err(format!(
                "data_port: {} is the same as control_port",
                self.data_port
            ));
        }
        if self.scm.class != "ram" {
            return Err(format!(
                "scm.class: {:?} is not supported (use ram)",
                self.scm.class
            ));
        }
        if self.scm.size.0 < (16 << 20) * self.targets as u64 {
            return Err(format!(
                "scm.size: {} bytes is too small (need at least 16 MiB per target)",
                self.scm.size.0
            ));
        }
        match &self.bdev {
            BdevConfig::File { path, size } => {
                if path.as_os_str().is_empty() {
                    return Err("bdev.path: must not be empty".into());
                }
                if size.0 < MIN_BDEV_BYTES * self.targets as u64 {
                    return Err(format!(
                        "bdev.size: {} bytes is too small for {} targets (need at least {} MiB per target)",
                        size.0,
                        self.targets,
                        MIN_BDEV_BYTES >> 20
                    ));
                }
            }
            BdevConfig::Kdev { device } => {
                if !device.starts_with("/dev/") {
                    return Err(format!(
                        "bdev.device: {} is not a device path under /dev",
                        device.display()
                    ));
                }
            }
        }
        for r in &self.mgmt_svc_replicas {
            if r.rsplit_once(':')
                .and_then(|(_, p)| p.parse::<u16>().ok())
                .is_none()
            {
                return Err(format!("mgmt_svc_replicas: {r:?} is not host:port"));
            }
        }
        if let Some(d) = &self.shm_dir {
            if !d.is_absolute() {
                return Err(format!("shm_dir: {} is not an absolute path", d.display()));
            }
            let sock = self.shm_socket();
            if sock.as_os_str().len() > MAX_UNIX_PATH {
                return Err(format!(
                    "shm_dir: socket path {} is longer than {MAX_UNIX_PATH} bytes",
                    sock.display()
                ));
            }
        }
        let dp = &self.data_plane;
        if !(1..=1 << 20).contains(&dp.max_connections) {
            return Err(format!(
                "data_plane.max_connections: {} is out of range 1..=1048576",
                dp.max_connections
            ));
        }
        if !(100..=3_600_000).contains(&dp.read_timeout_ms) {
            return Err(format!(
                "data_plane.read_timeout_ms: {} is out of range 100..=3600000",
                dp.read_timeout_ms
            ));
        }
        if dp.idle_timeout_s > 604_800 {
            return Err(format!(
                "data_plane.idle_timeout_s: {} is more than a week (604800); 0 is none",
                dp.idle_timeout_s
            ));
        }
        if dp.max_unread_reply_bytes.0 < 1 << 20 || dp.max_unread_reply_bytes.0 > 1 << 40 {
            return Err(format!(
                "data_plane.max_unread_reply_bytes: {} bytes is out of range 1MiB..=1TiB",
                dp.max_unread_reply_bytes.0
            ));
        }
        if !(1..=1 << 20).contains(&dp.target_queue_depth) {
            return Err(format!(
                "data_plane.target_queue_depth: {} is out of range 1..=1048576",
                dp.target_queue_depth
            ));
        }
        if dp.max_queued_request_bytes.0 < 1 << 20 || dp.max_queued_request_bytes.0 > 1 << 40 {
            return Err(format!(
                "data_plane.max_queued_request_bytes: {} bytes is out of range 1MiB..=1TiB",
                dp.max_queued_request_bytes.0
            ));
        }
        if !["error", "warn", "info", "debug", "trace"].contains(&self.log_level.as_str()) {
            return Err(format!(
                "log_level: {:?} is not one of error, warn, info, debug, trace",
                self.log_level
            ));
        }
        Ok(())
    }

    pub fn control_addr(&self) -> String {
        format!("{}:{}", self.listen_addr, self.control_port)
    }
    pub fn data_addr(&self) -> String {
        format!("{}:{}", self.listen_addr, self.data_port)
    }

    /// The directory of the shared-memory socket: `shm_dir`, else the bdev
    /// file's directory (class file), else `/run/peregrine`.
    pub fn shm_dir(&self) -> PathBuf {
        if let Some(d) = &self.shm_dir {
            return d.clone();
        }
        match &self.bdev {
            BdevConfig::File { path, .. } => match path.parent() {
                Some(p) if p.is_absolute() => p.to_path_buf(),
                _ => default_shm_dir(),
            },
            BdevConfig::Kdev { .. } => default_shm_dir(),
        }
    }

    /// The unix socket of the shared-memory data plane.
    pub fn shm_socket(&self) -> PathBuf {
        self.shm_dir()
            .join(peregrine_proto::shm::socket_name(self.rank))
    }

    /// The management service this engine reports to (itself when first in the list or none given).
    pub fn mgmt_leader(&self) -> String {
        self.mgmt_svc_replicas
            .first()
            .cloned()
            .unwrap_or_else(|| self.control_addr())
    }

    /// Whether this engine hosts the management service.
    pub fn hosts_mgmt(&self) -> bool {
        let me = self.control_addr();
        let leader = self.mgmt_leader();
        leader == me
            || (self.mgmt_svc_replicas.is_empty())
            || leader
                .rsplit_once(':')
                .map(|(h, p)| {
                    (h == "localhost" || h == "0.0.0.0") && p == self.control_port.to_string()
                })
                .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "
name: tank
rank: 1
control_port: 10002
targets: 2
scm: {class: ram, size: 1GiB}
bdev: {class: file, path: /tmp/nvme.img, size: 4GiB}
mgmt_svc_replicas: [\"127.0.0.1:10001\"]
";

    #[test]
    fn parses_good_config() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.rank, 1);
        assert_eq!(c.scm.size.0, 1 << 30);
        assert!(matches!(c.bdev, BdevConfig::File { ref size, .. } if size.0 == 4 << 30));
        assert!(!c.hosts_mgmt());
        assert_eq!(c.control_port, 10002);
    }

    #[test]
    fn rejects_with_the_key_named() {
        let cases = [
            (
                GOOD.replace("targets: 2", "targets: 2\ntargetz: 3"),
                "targetz",
            ),
            (GOOD.replace("targets: 2", "targets: 0"), "targets"),
            (GOOD.replace("size: 4GiB", "size: 4XB"), "4XB"),
            (GOOD.replace("size: 4GiB", "size: 1MiB"), "bdev.size"),
            (GOOD.replace("class: ram", "class: pmem"), "scm.class"),
            (GOOD.replace("class: file", "class: tape"), "tape"),
            (GOOD.replace("rank: 1", "rank: -1"), "rank"),
            (
                GOOD.replace("\"127.0.0.1:10001\"", "\"nohost\""),
                "mgmt_svc_replicas",
            ),
            (format!("{GOOD}log_level: loud\n"), "log_level"),
            (format!("{GOOD}shm_dir: run/x\n"), "shm_dir"),
            (format!("{GOOD}shm_dir: /{}\n", "x".repeat(120)), "shm_dir"),
            (
                format!("{GOOD}data_plane: {{max_connections: 0}}\n"),
                "data_plane.max_connections",
            ),
            (
                format!("{GOOD}data_plane: {{read_timeout_ms: 5}}\n"),
                "data_plane.read_timeout_ms",
            ),
            (
                format!("{GOOD}data_plane: {{max_unread_reply_bytes: 4KiB}}\n"),
                "data_plane.max_unread_reply_bytes",
            ),
            (
                format!("{GOOD}data_plane: {{idle_timeout: 5}}\n"),
                "idle_timeout",
            ),
        ];
        for (text, key) in cases {
            let err = Config::parse(&text).unwrap_err();
            assert!(err.contains(key), "error {err:?} does not name {key}");
        }
    }

    #[test]
    fn data_plane_limits() {
        let d = Config::parse(GOOD).unwrap().data_plane;
        assert_eq!(d.max_connections, 4096);
        assert_eq!(d.read_timeout_ms, 30_000);
        assert_eq!(d.idle_timeout_s, 600);
        assert_eq!(d.max_unread_reply_bytes.0, 64 << 20);
        let c = Config::parse(&format!(
            "{GOOD}data_plane:\n  max_connections: 8\n  idle_timeout_s: 0\n  max_unread_reply_bytes: 16MiB\n"
        ))
        .unwrap();
        assert_eq!(c.data_plane.max_connections, 8);
        assert_eq!(c.data_plane.idle_timeout_s, 0);
        assert_eq!(c.data_plane.max_unread_reply_bytes.0, 16 << 20);
        assert_eq!(c.data_plane.target_queue_depth, 1024);
    }

    #[test]
    fn shm_socket_defaults() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.shm_socket(), Path::new("/tmp/peregrine-rank1.sock"));
        let c = Config::parse(&format!("{GOOD}shm_dir: /run/prg\n")).unwrap();
        assert_eq!(c.shm_socket(), Path::new("/run/prg/peregrine-rank1.sock"));
        let c = Config::parse(&GOOD.replace(
            "{class: file, path: /tmp/nvme.img, size: 4GiB}",
            "{class: kdev, device: /dev/loop0}",
        ))
        .unwrap();
        assert_eq!(
            c.shm_socket(),
            Path::new("/run/peregrine/peregrine-rank1.sock")
        );
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("1.5GiB").unwrap(), 3 << 29);
        assert_eq!(parse_size("100M").unwrap(), 100 << 20);
        assert!(parse_size("12XB").is_err());
        assert!(parse_size("").is_err());
    }
}
