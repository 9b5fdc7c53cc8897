//! The engine's YAML configuration, in the spirit of `daos_server.yml`.
//!
//! Parsing is strict: unknown keys and impossible values are rejected at
//! start with a message naming the key, so a typo never silently falls back
//! to a default.
//!
//! The limits (`data_plane`, `shm`, `control_plane`) and who may use the
//! shared-memory socket are described together in `docs/engine-limits.md`.
//!
//! What differs from one engine of a system to the next (its rank, address,
//! fault domain, DNS name, device file) may be given on the command line
//! instead ([`Overrides`]): many engines can then share one file (the
//! operator's ConfigMap). A flag wins over the file's key of the same name,
//! and the result is validated as one configuration.

use serde::Deserialize;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// System name; every engine of one system shares it.
    #[serde(default = "default_name")]
    pub name: String,
    /// This engine's rank: the YAML's `rank`, or `--rank`; one of them is
    /// required (see [`Config::parse_with`]).
    #[serde(skip)]
    pub rank: u32,
    /// `rank` as the YAML gives it, if it does.
    #[serde(default, rename = "rank")]
    yaml_rank: Option<u32>,
    /// Where the engine sits in the failure hierarchy (`/rack1/node3`):
    /// engines holding shards of one redundancy group are kept apart by it.
    #[serde(default = "default_fault_domain")]
    pub fault_domain: String,
    /// The DNS name other engines and clients reach this engine by (in
    /// Kubernetes, the pod's name behind the headless Service). An entry of
    /// `mgmt_svc_replicas` naming it with `control_port` is this engine, as
    /// one naming `listen_addr` is (see [`Config::hosts_mgmt`]).
    #[serde(default)]
    pub dns_name: Option<String>,
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
    /// How long a target keeps polling its shared-memory clients after
    /// taking a request from one, in microseconds, rather than sleep (a
    /// client answered within it needs no wake-up); 0: sleeps at once.
    /// Costs up to that much CPU time per request on an idle target.
    /// Unset: `PEREGRINE_VOS_POLL_US` from the engine's environment when it
    /// is set (read once at start, for compatibility), else 200.
    #[serde(default)]
    pub vos_poll_us: Option<u64>,
    /// How long a target polls for the completion of a lone read (a QD1
    /// fetch), in microseconds, before it sleeps in the kernel; 0: never
    /// polls. Unset: `PEREGRINE_VOS_SPIN_US` from the engine's environment
    /// when it is set (read once at start), else 150.
    #[serde(default)]
    pub vos_spin_us: Option<u64>,
    /// Bytes of stored extents each target's scrubber verifies per second
    /// (`8MiB` or `8388608`); 0: no scrubbing. Unset:
    /// `PEREGRINE_VOS_SCRUB_RATE` (bytes) from the engine's environment
    /// when it is set (read once at start), else 8 MiB.
    #[serde(default)]
    pub scrub_rate: Option<Size>,
    /// Values smaller than this (`1KiB`, `512`) stay in the targets' RAM
    /// (the SCM tier, made durable by the WAL); larger ones go to the
    /// device. 1 byte to 4 KiB; unset: 4 KiB. Lower it for namespaces of
    /// many small files: each file's data then takes a device block
    /// instead of its size in RAM (engine RAM per file at 10^6 files:
    /// bench/mdscale.md).
    #[serde(default)]
    pub scm_value_max: Option<Size>,
    /// How the targets write their WAL: `direct` (O_DIRECT: the device
    /// holds a record before its update is acknowledged) or `page_cache`
    /// (the kernel holds it, and writes it back by the next flush). Both
    /// survive a `kill -9` of the engine; a power cut loses what was not
    /// flushed either way (`flush_interval_ms`). Unset: `page_cache` for a
    /// `file` bdev, whose O_DIRECT writes pay the host disk's latency,
    /// `direct` for a `kdev`.
    #[serde(default)]
    pub wal_io: Option<peregrine_vos::WalIo>,
    pub scm: ScmConfig,
    pub bdev: BdevConfig,
    /// Control addresses of the management-service replicas (`host:port`,
    /// the host an IP address or a DNS name); the first one hosts the
    /// service until Raft replication lands.
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
    /// Access to and limits of the shared-memory data plane (see [`ShmConfig`]).
    #[serde(default)]
    pub shm: ShmConfig,
    /// Limits of the gRPC control service (see [`ControlPlaneConfig`]).
    #[serde(default)]
    pub control_plane: ControlPlaneConfig,
    /// The control plane's certificates (docs/tls.md): `ca.crt`, `tls.crt`
    /// (this engine's, `peregrine://<name>/engine/<rank>`), `tls.key`. The
    /// control service then takes only clients with a certificate from
    /// `ca.crt` and authorizes each call by the role in it.
    #[serde(default)]
    pub tls_dir: Option<PathBuf>,
    /// Serve the control plane without TLS: anyone reaching the control
    /// port may format, destroy pools or join as any rank. Only with this
    /// explicit choice (a loud warning at start), never as a fallback.
    #[serde(default)]
    pub allow_insecure: bool,
    /// Check the handle of every data-plane request against the pool's key
    /// (docs/access-control.md). Default: on with `tls_dir`, off with
    /// `allow_insecure` (where anyone may claim any user anyway); either
    /// may be chosen explicitly (the benchmark compares both). Read it
    /// through [`Config::access_checks`].
    #[serde(default)]
    pub access_checks: Option<bool>,
}

/// Who may use the shared-memory data plane's unix socket, and its limits:
///
/// ```yaml
/// shm:
///   socket_mode: "0660"     # quoted octal; the socket file's permissions
///   socket_group: peregrine # group name or number owning the socket; default: the engine's
///   allowed_uids: [0, 1000] # peers (SO_PEERCRED uid) allowed to connect; empty: any
///   max_connections: 256    # one thread each; more are closed at once
///   hello_timeout_ms: 10000 # a new connection must send its hello by then
/// ```
///
/// Connecting to a unix socket needs write permission on its file, so the
/// mode decides who gets as far as the engine's own checks: the peer's
/// uid (`allowed_uids`), then, for direct reads of the client's memory, the
/// pidfd taken when it connected (see `peregrine_engine::shm`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ShmConfig {
    pub socket_mode: Mode,
    pub socket_group: Option<String>,
    pub allowed_uids: Vec<u32>,
    pub max_connections: usize,
    pub hello_timeout_ms: u64,
}

impl Default for ShmConfig {
    fn default() -> Self {
        ShmConfig {
            socket_mode: Mode(0o660),
            socket_group: None,
            allowed_uids: Vec::new(),
            max_connections: 256,
            hello_timeout_ms: 10_000,
        }
    }
}

/// File permissions in octal, as a string: `"0660"` (or a bare `0660`,
/// which YAML reads as that string). A YAML number (`660`, `0o660`) is
/// refused rather than guessed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mode(pub u32);

impl<'de> Deserialize<'de> for Mode {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        let bad = |v: &dyn std::fmt::Display| {
            serde::de::Error::custom(format!(
                "invalid mode {v}: write it as a quoted octal string such as \"0660\""
            ))
        };
        match Raw::deserialize(d)? {
            Raw::N(n) => Err(bad(&n)),
            Raw::S(s) => {
                let digits = s.strip_prefix("0o").unwrap_or(&s);
                match u32::from_str_radix(digits, 8) {
                    Ok(m) if m <= 0o777 && !digits.is_empty() => Ok(Mode(m)),
                    _ => Err(bad(&format!("{s:?}"))),
                }
            }
        }
    }
}

/// Limits of the gRPC control service (management and engine services),
/// so that idle or greedy callers cannot hold its memory or tasks:
///
/// ```yaml
/// control_plane:
///   max_connections: 1024            # more are closed at once
///   max_message_bytes: 16MiB         # larger requests are refused (ResourceExhausted)
///   concurrency_per_connection: 64   # requests running at once on one connection
///   max_concurrent_requests: 1024    # requests running at once on all of them
///   request_timeout_s: 120           # a call still running then is cancelled
///   keepalive_s: 30                  # HTTP/2 ping and TCP keepalive interval
///   keepalive_timeout_s: 20          # a ping unanswered that long closes the connection
///   max_connection_age_s: 3600       # then the connection is closed gracefully (GOAWAY)
/// ```
///
/// A new connection must also send its first byte (the HTTP/2 preface)
/// within 10 s. Connections that completed it and stay idle are bounded by
/// `max_connections` and their age (peers answer keepalive pings; clients
/// reconnect after a GOAWAY).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ControlPlaneConfig {
    pub max_connections: usize,
    pub max_message_bytes: Size,
    pub concurrency_per_connection: usize,
    pub max_concurrent_requests: usize,
    pub request_timeout_s: u64,
    pub keepalive_s: u64,
    pub keepalive_timeout_s: u64,
    pub max_connection_age_s: u64,
}

impl Default for ControlPlaneConfig {
    fn default() -> Self {
        ControlPlaneConfig {
            max_connections: 1024,
            max_message_bytes: Size(16 << 20),
            concurrency_per_connection: 64,
            max_concurrent_requests: 1024,
            request_timeout_s: 120,
            keepalive_s: 30,
            keepalive_timeout_s: 20,
            max_connection_age_s: 3600,
        }
    }
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
    pub class: ScmClass,
    pub size: Size,
}

/// Where the SCM tier lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ScmClass {
    /// RAM, made durable by the write-ahead log on the bdev.
    Ram,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(tag = "class", rename_all = "lowercase", deny_unknown_fields)]
pub enum BdevConfig {
    /// A file of a given size: emulated NVMe. The path may be left to
    /// `--bdev-path` (it is per engine).
    File {
        #[serde(default)]
        path: PathBuf,
        size: Size,
    },
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
/// Longest `vos_poll_us` and `vos_spin_us` (a second of polling).
pub const MAX_POLL_US: u64 = 1_000_000;

/// Longest fault domain path (of the configuration, and of a join).
pub const MAX_FAULT_DOMAIN: usize = 256;
/// Longest DNS name.
pub const MAX_DNS_NAME: usize = 253;

/// The per-engine values of the command line, over the YAML's keys of the
/// same name, so that the engines of a system can share one file: each
/// engine passes its own. Applied before the configuration is validated,
/// by the same checks as the YAML's values.
#[derive(Debug, Clone, Default, PartialEq, Eq, clap::Args)]
pub struct Overrides {
    /// This engine's rank (over `rank`).
    #[arg(long, value_name = "N")]
    pub rank: Option<u32>,
    /// The address to bind and advertise (over `listen_addr`).
    #[arg(long, value_name = "IP")]
    pub listen_addr: Option<IpAddr>,
    /// This engine's fault domain, e.g. /node3 (over `fault_domain`).
    #[arg(long, value_name = "PATH")]
    pub fault_domain: Option<String>,
    /// The DNS name peers reach this engine by (over `dns_name`): an entry
    /// NAME:control_port of `mgmt_svc_replicas` is then this engine.
    #[arg(long, value_name = "NAME")]
    pub dns_name: Option<String>,
    /// The device file of `bdev: {class: file}` (over `bdev.path`).
    #[arg(long, value_name = "PATH")]
    pub bdev_path: Option<PathBuf>,
}

/// The environment variables [`Config::fill_from_env`] reads, by the field
/// each one stands in for when the YAML leaves it unset.
pub const ENV_FALLBACKS: [(&str, &str); 3] = [
    ("vos_poll_us", "PEREGRINE_VOS_POLL_US"),
    ("vos_spin_us", "PEREGRINE_VOS_SPIN_US"),
    ("scrub_rate", "PEREGRINE_VOS_SCRUB_RATE"),
];

impl Config {
    /// Whether data-plane requests are checked (see the field).
    pub fn access_checks(&self) -> bool {
        self.access_checks.unwrap_or(!self.allow_insecure)
    }

    pub fn load(path: &Path) -> Result<Config, String> {
        Self::load_with(path, &Overrides::default())
    }

    /// The file at `path` with the command line's `overrides` over it.
    pub fn load_with(path: &Path, overrides: &Overrides) -> Result<Config, String> {
        let text =
            std::fs::read_to_string(path).map_err(|e| format!("config {}: {e}", path.display()))?;
        Self::parse_with(&text, overrides).map_err(|e| format!("config {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<Config, String> {
        Self::parse_with(text, &Overrides::default())
    }

    /// The YAML `text` with `overrides` over it, validated as a whole (an
    /// override is checked as the key it replaces; an error names the key).
    pub fn parse_with(text: &str, overrides: &Overrides) -> Result<Config, String> {
        let mut cfg: Config = serde_yaml::from_str(text).map_err(|e| e.to_string())?;
        cfg.apply(overrides)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Put the command line's values over the YAML's.
    fn apply(&mut self, o: &Overrides) -> Result<(), String> {
        if let Some(r) = o.rank {
            self.yaml_rank = Some(r);
        }
        self.rank = self
            .yaml_rank
            .ok_or("rank: missing: give it in the configuration (rank: N) or as --rank N")?;
        if let Some(a) = o.listen_addr {
            self.listen_addr = a;
        }
        if let Some(f) = &o.fault_domain {
            self.fault_domain = f.clone();
        }
        if let Some(n) = &o.dns_name {
            self.dns_name = Some(n.clone());
        }
        if let Some(p) = &o.bdev_path {
            match &mut self.bdev {
                BdevConfig::File { path, .. } => *path = p.clone(),
                BdevConfig::Kdev { device } => {
                    let (p, d) = (p.display(), device.display());
                    return Err(format!(
                        "--bdev-path {p}: bdev class kdev has no path (its device: bdev.device {d})"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Fill the tuning fields the YAML left unset (`vos_poll_us`,
    /// `vos_spin_us`, `scrub_rate`) from the environment variables that set
    /// them before they were configuration ([`ENV_FALLBACKS`]). `var` looks
    /// one up; only the engine's start-up calls this, once, with the
    /// process environment: nothing below it reads the environment. A
    /// variable that is set must parse and be in range.
    pub fn fill_from_env(&mut self, var: impl Fn(&str) -> Option<String>) -> Result<(), String> {
        let [(_, poll), (_, spin), (_, scrub)] = ENV_FALLBACKS;
        let us = |name: &str| -> Result<Option<u64>, String> {
            let Some(v) = var(name) else { return Ok(None) };
            match v.trim().parse::<u64>() {
                Ok(n) if n <= MAX_POLL_US => Ok(Some(n)),
                _ => Err(format!(
                    "{name}={v:?}: expected microseconds in 0..={MAX_POLL_US}"
                )),
            }
        };
        if self.vos_poll_us.is_none() {
            self.vos_poll_us = us(poll)?;
        }
        if self.vos_spin_us.is_none() {
            self.vos_spin_us = us(spin)?;
        }
        if self.scrub_rate.is_none() {
            if let Some(v) = var(scrub) {
                let n = parse_size(v.trim()).map_err(|e| format!("{scrub}: {e}"))?;
                self.scrub_rate = Some(Size(n));
            }
        }
        Ok(())
    }

    /// [`Config::vos_poll_us`], or its default.
    pub fn vos_poll(&self) -> Duration {
        self.vos_poll_us
            .map_or(peregrine_vos::DEFAULT_POLL, Duration::from_micros)
    }

    /// [`Config::vos_spin_us`], or its default.
    pub fn vos_read_spin(&self) -> Duration {
        self.vos_spin_us
            .map_or(peregrine_vos::DEFAULT_READ_SPIN, Duration::from_micros)
    }

    /// [`Config::scm_value_max`] in bytes, or its default.
    pub fn scm_value_max(&self) -> usize {
        self.scm_value_max
            .map_or(peregrine_vos::SCM_VALUE_MAX, |s| s.0 as usize)
    }

    /// [`Config::scrub_rate`] in bytes per second, or its default.
    pub fn scrub_rate(&self) -> u64 {
        self.scrub_rate
            .map_or(peregrine_vos::DEFAULT_SCRUB_RATE, |s| s.0)
    }

    /// The fields, then the choice of control-plane security (last, so a
    /// typo elsewhere is reported as such).
    fn validate(&self) -> Result<(), String> {
        self.validate_fields()?;
        match (&self.tls_dir, self.allow_insecure) {
            (Some(_), false) | (None, true) => {}
            (None, false) => {
                return Err(
                    "tls_dir / allow_insecure: the control plane needs tls_dir: <dir> \
                     (ca.crt, tls.crt, tls.key; `peregrine certs` makes them) or, knowingly, \
                     allow_insecure: true"
                        .into(),
                )
            }
            (Some(d), true) => {
                return Err(format!(
                    "tls_dir ({}) and allow_insecure: true: give one, not both",
                    d.display()
                ))
            }
        }
        Ok(())
    }

    fn validate_fields(&self) -> Result<(), String> {
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
        if self.fault_domain.is_empty()
            || self.fault_domain.len() > MAX_FAULT_DOMAIN
            || self.fault_domain.chars().any(char::is_control)
        {
            return Err(format!(
                "fault_domain: {:?} must be 1-{MAX_FAULT_DOMAIN} bytes without control characters",
                self.fault_domain
            ));
        }
        if let Some(n) = &self.dns_name {
            let label_ok = |l: &str| {
                !l.is_empty()
                    && l.len() <= 63
                    && !l.starts_with('-')
                    && !l.ends_with('-')
                    && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
            };
            if n.len() > MAX_DNS_NAME || !n.split('.').all(label_ok) {
                return Err(format!("dns_name: {n:?} is not a DNS name"));
            }
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
        if let Some(Size(n)) = self.scm_value_max {
            let max = peregrine_vos::SCM_VALUE_MAX;
            if n == 0 || n > max as u64 {
                return Err(format!(
                    "scm_value_max: {n} is out of range 1..={max} bytes"
                ));
            }
        }
        for (key, v) in [
            ("vos_poll_us", self.vos_poll_us),
            ("vos_spin_us", self.vos_spin_us),
        ] {
            if v.is_some_and(|v| v > MAX_POLL_US) {
                return Err(format!(
                    "{key}: {} is out of range 0..={MAX_POLL_US}",
                    v.unwrap_or_default()
                ));
            }
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
        if self.scm.size.0 < (16 << 20) * self.targets as u64 {
            return Err(format!(
                "scm.size: {} bytes is too small (need at least 16 MiB per target)",
                self.scm.size.0
            ));
        }
        match &self.bdev {
            BdevConfig::File { path, size } => {
                if path.as_os_str().is_empty() {
                    return Err(
                        "bdev.path: missing: give it in the configuration or as --bdev-path".into(),
                    );
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
        let sh = &self.shm;
        if !(1..=65_536).contains(&sh.max_connections) {
            return Err(format!(
                "shm.max_connections: {} is out of range 1..=65536",
                sh.max_connections
            ));
        }
        if !(100..=600_000).contains(&sh.hello_timeout_ms) {
            return Err(format!(
                "shm.hello_timeout_ms: {} is out of range 100..=600000",
                sh.hello_timeout_ms
            ));
        }
        if sh.socket_mode.0 & 0o200 == 0 {
            return Err(format!(
                "shm.socket_mode: {:04o} leaves the owner unable to connect (needs 0200)",
                sh.socket_mode.0
            ));
        }
        if let Some(g) = &sh.socket_group {
            if g.is_empty() || g.len() > 64 {
                return Err(format!("shm.socket_group: {g:?} is not a group name or id"));
            }
        }
        let cp = &self.control_plane;
        for (key, v, max) in [
            ("max_connections", cp.max_connections, 1 << 20),
            (
                "concurrency_per_connection",
                cp.concurrency_per_connection,
                1 << 16,
            ),
            (
                "max_concurrent_requests",
                cp.max_concurrent_requests,
                1 << 20,
            ),
        ] {
            if !(1..=max).contains(&v) {
                return Err(format!(
                    "control_plane.{key}: {v} is out of range 1..={max}"
                ));
            }
        }
        if cp.max_message_bytes.0 < 1 << 20 || cp.max_message_bytes.0 > 1 << 30 {
            return Err(format!(
                "control_plane.max_message_bytes: {} bytes is out of range 1MiB..=1GiB",
                cp.max_message_bytes.0
            ));
        }
        for (key, v, lo, hi) in [
            ("request_timeout_s", cp.request_timeout_s, 1, 86_400),
            ("keepalive_s", cp.keepalive_s, 1, 3_600),
            ("keepalive_timeout_s", cp.keepalive_timeout_s, 1, 3_600),
            ("max_connection_age_s", cp.max_connection_age_s, 10, 604_800),
        ] {
            if !(lo..=hi).contains(&v) {
                return Err(format!(
                    "control_plane.{key}: {v} is out of range {lo}..={hi}"
                ));
            }
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

    /// How this engine's own gRPC clients (to the management service and to
    /// other engines) connect: with its certificate, or as insecure as it serves.
    pub fn security(&self) -> peregrine::Security {
        match &self.tls_dir {
            Some(d) => peregrine::Security::tls(d),
            None => peregrine::Security::Insecure,
        }
    }

    /// The management service this engine reports to: the first of
    /// `mgmt_svc_replicas`, or itself when there are none. When the first
    /// names this engine by its `dns_name`, its own control address instead
    /// (no name lookup to reach itself).
    pub fn mgmt_leader(&self) -> String {
        match self.mgmt_svc_replicas.first() {
            None => self.control_addr(),
            Some(first) if self.named_by_dns(first) => self.control_addr(),
            Some(first) => first.clone(),
        }
    }

    /// Whether this engine hosts the management service: it is named first
    /// in `mgmt_svc_replicas` (see [`Config::is_self`]), or none are given.
    pub fn hosts_mgmt(&self) -> bool {
        self.mgmt_svc_replicas
            .first()
            .is_none_or(|first| self.is_self(first))
    }

    /// Whether `addr` (`host:port`, an entry of `mgmt_svc_replicas`) is this
    /// engine: its `control_port`, and as host its `listen_addr`, its
    /// `dns_name`, `localhost` or `0.0.0.0`.
    pub fn is_self(&self, addr: &str) -> bool {
        let Some((host, port)) = addr.rsplit_once(':') else {
            return false;
        };
        if port.parse::<u16>() != Ok(self.control_port) {
            return false;
        }
        let host = host
            .strip_prefix('[')
            .and_then(|h| h.strip_suffix(']'))
            .unwrap_or(host);
        host == "localhost"
            || host == "0.0.0.0"
            || host.parse::<IpAddr>() == Ok(self.listen_addr)
            || self.named_by_dns(addr)
    }

    /// Whether `addr` is `dns_name:control_port` (DNS names compare without
    /// case, and a trailing dot).
    fn named_by_dns(&self, addr: &str) -> bool {
        let (Some(name), Some((host, port))) = (&self.dns_name, addr.rsplit_once(':')) else {
            return false;
        };
        let bare = |n: &str| n.strip_suffix('.').unwrap_or(n).to_ascii_lowercase();
        port.parse::<u16>() == Ok(self.control_port) && bare(host) == bare(name)
    }
}

#[cfg(test)]
mod tests;
