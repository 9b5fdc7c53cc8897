//! `peregrine-agent`: the node agent (as DAOS's daos_agent). It holds the
//! node's `client` certificate and serves a unix socket on which processes
//! without a certificate make their pool connects and container opens; each
//! call is forwarded with the caller's user and groups taken from the socket
//! (SO_PEERCRED and this node's user database), whatever the caller wrote,
//! so the ACLs see who really asks (peregrine::agent has the protocol).
//!
//! Bounds: requests of at most 64 KiB, `--max-connections` callers at once
//! (the next is told the agent is busy), and a connection idle for
//! `--idle-timeout` seconds is closed.
//!
//! It serves its socket at once and reaches the management service in the
//! background ([`Current`]): until then callers are told why it cannot act
//! for them; it connects again when its certificate files change.

use clap::Parser;
use peregrine::agent;
use peregrine::{tls, Error, Mgmt, Security};
use peregrine_proto::mgmt::*;
use prost::Message;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "peregrine-agent",
    about = "Peregrine's node agent: management calls of processes without a certificate, named by their uid"
)]
struct Args {
    /// The socket to serve (made 0666: anyone on the node may ask; the agent names them).
    #[arg(long, env = agent::ENV_SOCKET, default_value = agent::DEFAULT_SOCKET)]
    socket: PathBuf,
    /// The management service ("host:port").
    #[arg(long, env = "PEREGRINE_MGMT", default_value = "127.0.0.1:10001")]
    mgmt: String,
    /// The node's client certificate directory (`peregrine certs --client`).
    #[arg(long, env = peregrine::tls::ENV_TLS_DIR)]
    tls_dir: Option<PathBuf>,
    /// A management service started with allow_insecure (it believes any credential anyway).
    #[arg(long)]
    insecure: bool,
    /// Callers served at once.
    #[arg(long, default_value_t = 256)]
    max_connections: usize,
    /// Seconds a caller's connection may stay idle.
    #[arg(long, default_value_t = 300)]
    idle_timeout: u64,
}

fn main() {
    let args = Args::parse();
    if let Err(e) = run(args) {
        eprintln!("peregrine-agent: {e}");
        std::process::exit(1);
    }
}

fn run(args: Args) -> Result<(), String> {
    let security = Security::from_flags(args.tls_dir.clone(), args.insecure)?;
    if args.insecure {
        eprintln!(
            "peregrine-agent: insecure: the management service at {} has no TLS and believes \
             any caller's credential, the agent's included",
            args.mgmt
        );
    }
    if let Ok(m) = std::fs::symlink_metadata(&args.socket) {
        if !m.file_type().is_socket() {
            return Err(format!(
                "{} exists and is not a socket: not replacing it",
                args.socket.display()
            ));
        }
        std::fs::remove_file(&args.socket)
            .map_err(|e| format!("removing the old {}: {e}", args.socket.display()))?;
    }
    if let Some(dir) = args.socket.parent() {
        std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    let mgmt = Current::start(&args.mgmt, security);
    let listener =
        UnixListener::bind(&args.socket).map_err(|e| format!("{}: {e}", args.socket.display()))?;
    std::fs::set_permissions(&args.socket, std::fs::Permissions::from_mode(0o666))
        .map_err(|e| format!("{}: {e}", args.socket.display()))?;
    eprintln!(
        "peregrine-agent: serving {} for the management service at {}",
        args.socket.display(),
        args.mgmt
    );

    let active = Arc::new(AtomicUsize::new(0));
    let idle = Duration::from_secs(args.idle_timeout.max(1));
    for conn in listener.incoming() {
        let mut s = match conn {
            Ok(s) => s,
            Err(e) => {
                eprintln!("peregrine-agent: accept: {e}");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if active.fetch_add(1, Ordering::AcqRel) >= args.max_connections {
            active.fetch_sub(1, Ordering::AcqRel);
            let busy = Error::new(
                -libc::EAGAIN,
                format!("the agent serves {} callers already", args.max_connections),
            );
            let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = agent::write_reply(&mut s, &Err(busy));
            continue;
        }
        let (mgmt, active) = (mgmt.clone(), active.clone());
        std::thread::spawn(move || {
            serve(&mgmt, s, idle);
            active.fetch_sub(1, Ordering::AcqRel);
        });
    }
    Ok(())
}

/// How often the agent looks whether its certificates changed.
const TLS_CHECK: Duration = Duration::from_secs(30);
/// The longest wait between two attempts to reach the management service.
const CONNECT_BACKOFF_MAX: Duration = Duration::from_secs(10);

/// The management connection. A background thread makes it, for as long
/// as the service takes to come up (a node's agent may start before the
/// engines: a DaemonSet and a ServerSet installed together), and makes it
/// again when the certificate directory changes (the operator renews the
/// node's certificate two thirds into its life and rotates the CA; a
/// mounted Secret changes under a running pod).
struct Current {
    addr: String,
    state: RwLock<Conn>,
}

enum Conn {
    /// Not reached yet; the last attempt's error.
    Waiting(String),
    Up(Arc<Mgmt>),
}

impl Current {
    /// The first attempt is made before returning, so that an agent
    /// started beside a running service answers its first caller.
    fn start(addr: &str, security: Security) -> Arc<Current> {
        let this = Arc::new(Current {
            addr: addr.to_string(),
            state: RwLock::new(Conn::Waiting("not tried yet".into())),
        });
        let mut loaded = None;
        this.attempt(&security, &mut loaded);
        let keeper = this.clone();
        std::thread::spawn(move || keeper.keep(&security, loaded));
        this
    }

    /// The connection, or why there is none yet (the caller is told, not
    /// kept waiting).
    fn get(&self) -> Result<Arc<Mgmt>, Error> {
        match &*self.state.read().unwrap_or_else(|p| p.into_inner()) {
            Conn::Up(m) => Ok(m.clone()),
            Conn::Waiting(e) => Err(Error::new(
                -libc::EAGAIN,
                format!(
                    "the agent has not reached the management service at {} yet (it keeps \
                     trying): {e}",
                    self.addr
                ),
            )),
        }
    }

    /// Retry until connected, then reconnect whenever the certificates change.
    fn keep(&self, security: &Security, mut loaded: Option<Option<Vec<u8>>>) {
        let mut backoff = Duration::from_millis(500);
        loop {
            let wait = if loaded.is_some() { TLS_CHECK } else { backoff };
            backoff = (backoff * 2).min(CONNECT_BACKOFF_MAX);
            std::thread::sleep(wait);
            self.attempt(security, &mut loaded);
        }
    }

    /// Connect unless connected with the certificate files as they are now
    /// (`loaded`: those of the connection made, if one was).
    fn attempt(&self, security: &Security, loaded: &mut Option<Option<Vec<u8>>>) {
        let files = tls_files(security);
        if loaded.as_ref() == Some(&files) {
            return;
        }
        match Mgmt::connect(&self.addr, security) {
            Ok(m) => {
                // Every forwarded call names its caller; the agent itself is no one.
                m.set_credential(None);
                let how = match loaded {
                    Some(_) => "certificates changed: reconnected to",
                    None => "connected to",
                };
                eprintln!(
                    "peregrine-agent: {how} the management service at {}",
                    self.addr
                );
                // Calls in flight finish on the old connection.
                *self.state.write().unwrap_or_else(|p| p.into_inner()) = Conn::Up(Arc::new(m));
                *loaded = Some(files);
            }
            Err(e) => {
                let e = e.to_string();
                let mut state = self.state.write().unwrap_or_else(|p| p.into_inner());
                match &mut *state {
                    // Said once per reason, not at every attempt.
                    Conn::Waiting(last) if *last != e => {
                        eprintln!("peregrine-agent: {e}; trying again");
                        *last = e;
                    }
                    Conn::Waiting(_) => {}
                    // A working connection stays until a new one is made.
                    Conn::Up(_) => eprintln!(
                        "peregrine-agent: certificates changed, and connecting with them failed \
                         (the old connection stays; trying again): {e}"
                    ),
                }
            }
        }
    }
}

/// The bytes of the certificate directory's files (`None` without TLS).
fn tls_files(security: &Security) -> Option<Vec<u8>> {
    let Security::Tls { dir } = security else {
        return None;
    };
    let mut all = Vec::new();
    for f in [tls::CA_FILE, tls::CERT_FILE, tls::KEY_FILE] {
        // A file being replaced reads as missing: the next check sees it.
        all.extend(std::fs::read(dir.join(f)).unwrap_or_default());
        all.push(0);
    }
    Some(all)
}

/// One caller: its calls, one at a time, until it hangs up, idles out or
/// breaks the protocol (told why, then dropped).
fn serve(mgmt: &Current, mut s: UnixStream, idle: Duration) {
    let (uid, gid) = match peer_ids(&s) {
        Ok(ids) => ids,
        Err(e) => {
            eprintln!("peregrine-agent: SO_PEERCRED: {e}");
            return;
        }
    };
    if s.set_read_timeout(Some(idle)).is_err() || s.set_write_timeout(Some(idle)).is_err() {
        return;
    }
    let cred = peregrine::credential::of_peer(uid, gid);
    loop {
        let (rpc, req) = match agent::read_request(&mut s) {
            Ok(r) => r,
            Err(e) if e.code == -libc::EPROTO => {
                let _ = agent::write_reply(&mut s, &Err(e));
                return;
            }
            // Hung up or idle.
            Err(_) => return,
        };
        let reply = mgmt.get().and_then(|m| forward(&m, &cred, &rpc, &req));
        if agent::write_reply(&mut s, &reply).is_err() {
            return;
        }
    }
}

/// Forward one call for the user `cred` (the agent's side): only the
/// [`agent::FORWARDED`] calls, with the credential replaced by `cred`.
fn forward(
    mgmt: &Mgmt,
    cred: &peregrine_proto::mgmt::Credential,
    rpc: &str,
    req: &[u8],
) -> Result<Vec<u8>, Error> {
    fn decode<T: Message + Default>(rpc: &str, b: &[u8]) -> Result<T, Error> {
        T::decode(b).map_err(|e| Error::inval(format!("{rpc}: bad request: {e}")))
    }
    let cred = Some(cred.clone());
    Ok(match rpc {
        "system_query" => mgmt
            .system_query(decode::<SystemQueryReq>(rpc, req)?)?
            .encode_to_vec(),
        "pool_query" => mgmt
            .pool_query(decode::<PoolQueryReq>(rpc, req)?)?
            .encode_to_vec(),
        "pool_connect" => {
            let mut r: PoolConnectReq = decode(rpc, req)?;
            r.cred = cred;
            mgmt.pool_connect(r)?.encode_to_vec()
        }
        "cont_query" => {
            let mut r: ContQueryReq = decode(rpc, req)?;
            r.cred = cred;
            mgmt.cont_query(r)?.encode_to_vec()
        }
        _ => {
            return Err(Error::new(
                -libc::EACCES,
                format!(
                    "{rpc:?} is not a call the agent makes for users (only {}); it needs an \
                     administrator's certificate",
                    agent::FORWARDED.join(", ")
                ),
            ))
        }
    })
}

/// The connecting process's uid and gid, as the kernel recorded them at connect.
fn peer_ids(s: &UnixStream) -> std::io::Result<(u32, u32)> {
    let mut c = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: `c` and `len` are live out-parameters of the sizes given.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut c as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((c.uid, c.gid))
}
