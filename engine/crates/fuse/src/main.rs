//! `peregrine-fuse`: mount one Peregrine POSIX container (as dfuse).
//!
//! ```text
//! peregrine-fuse --mgmt ADDR --pool P --cont C --mountpoint DIR [--threads N]
//!     (--tls-dir DIR | --insecure)
//!     [--attr-timeout S] [--dentry-timeout S] [--data-cache on|off|DURATION]
//!     [--read-only] [--foreground]
//! peregrine-fuse [SOURCE] DIR -o pool=P,cont=C,mgmt=ADDR,tls_dir=DIR[,ro][,threads=N]...
//! ```
//! The control plane's security (docs/tls.md): a certificate directory
//! (`--tls-dir`, `-o tls_dir=`, env PEREGRINE_TLS_DIR; a `client`
//! certificate is enough) or, against insecure engines only, `--insecure`
//! (`-o insecure`, env PEREGRINE_INSECURE=1).
//! The second form is the mount-helper convention (what mount.fuse3
//! runs): with the helper script `mount.fuse.peregrine` (in this crate)
//! installed as /sbin/mount.fuse.peregrine, `mount -t fuse.peregrine -o
//! pool=P,cont=C[,mgmt=ADDR] peregrine DIR` and fstab lines work (the
//! helper goes through mount.fuse3 because mount.fuse3 alone would run
//! `peregrine`, the admin CLI). SOURCE may be `POOL/CONT`; `-t TYPE`, `-n`,
//! `-s`, `-v` from mount(8) are accepted and ignored, so a plain symlink
//! `/sbin/mount.fuse.peregrine -> peregrine-fuse` works too. Without
//! `--foreground` the daemon detaches once the mount is ready (errors
//! before that are reported by the parent's exit status).
//! SIGTERM/SIGINT/SIGHUP unmount (lazily if busy) and exit 0.
//!
//! As root the daemon mounts with mount(2); as any other user through the
//! setuid `fusermount3` (package fuse3; the user must be able to open
//! /dev/fuse), which then also unmounts: the mount belongs to that user,
//! and only that user can use it.

mod ctl;
mod fs;

use clap::Parser;
use fs::{DataCache, Options, PeregrineFs};
use fuser::{Config, MountOption, Session, SessionACL};
use std::ffi::CString;
use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// How long a busy, lazily detached mount is served after SIGTERM.
const UNMOUNT_GRACE: Duration = Duration::from_secs(5);

#[derive(Parser, Debug)]
#[command(name = "peregrine-fuse", about = "Mount a Peregrine POSIX container")]
struct Args {
    /// Management service address (host:port); env PEREGRINE_MGMT.
    #[arg(long)]
    mgmt: Option<String>,
    /// Pool label or UUID.
    #[arg(long)]
    pool: Option<String>,
    /// Container label or UUID.
    #[arg(long)]
    cont: Option<String>,
    #[arg(long)]
    mountpoint: Option<PathBuf>,
    /// Request-serving threads (default: the CPUs this process may use,
    /// 4 to 16).
    #[arg(long)]
    threads: Option<usize>,
    /// FUSE over io_uring: `auto` (when the kernel offers it:
    /// /sys/module/fuse/parameters/enable_uring), `on` (turn that parameter on,
    /// as root, and fail without it) or `off`.
    #[arg(long, value_name = "auto|on|off")]
    io_uring: Option<String>,
    /// Attribute cache timeout in seconds (or 500ms, 2s, ...).
    #[arg(long)]
    attr_timeout: Option<String>,
    /// Directory entry cache timeout.
    #[arg(long)]
    dentry_timeout: Option<String>,
    /// on | off | DURATION (keep the page cache for opens within DURATION).
    #[arg(long)]
    data_cache: Option<String>,
    #[arg(long)]
    read_only: bool,
    #[arg(long)]
    foreground: bool,
    /// The control plane's certificate directory (ca.crt, tls.crt, tls.key);
    /// env PEREGRINE_TLS_DIR.
    #[arg(long, value_name = "DIR")]
    tls_dir: Option<PathBuf>,
    /// Talk to engines started with allow_insecure (no TLS); env PEREGRINE_INSECURE=1.
    #[arg(long)]
    insecure: bool,
    /// Comma-separated options (pool=,cont=,mgmt=,ro,threads=,...).
    #[arg(short = 'o', action = clap::ArgAction::Append)]
    options: Vec<String>,
    /// Ignored (mount helper flags).
    #[arg(short = 'n', hide = true)]
    _no_mtab: bool,
    #[arg(short = 's', hide = true)]
    _sloppy: bool,
    #[arg(short = 'v', hide = true)]
    _verbose: bool,
    /// Ignored (mount(8) passes the file system type to helpers).
    #[arg(short = 't', hide = true)]
    _fstype: Option<String>,
    /// [SOURCE] MOUNTPOINT (mount helper form).
    positional: Vec<String>,
}

/// How the daemon takes requests from the kernel (`--io-uring`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum IoUring {
    /// FUSE over io_uring if the kernel offers it, else /dev/fuse.
    Auto,
    /// FUSE over io_uring, its kernel parameter turned on if need be; no mount without it.
    On,
    /// /dev/fuse only.
    Off,
}

/// The fuse module's switch for FUSE over io_uring (Linux 6.14+, CONFIG_FUSE_IO_URING).
const ENABLE_URING: &str = "/sys/module/fuse/parameters/enable_uring";

/// `--io-uring on`: the kernel parameter on (it is the machine's, for every FUSE mount; off
/// by default in the kernels that have it).
fn enable_uring() -> Result<(), String> {
    match std::fs::read_to_string(ENABLE_URING) {
        Ok(v) if v.trim() == "Y" => Ok(()),
        Ok(_) => std::fs::write(ENABLE_URING, "Y")
            .map_err(|e| format!("--io-uring on: turning on {ENABLE_URING}: {e}")),
        Err(e) => Err(format!(
            "--io-uring on: {ENABLE_URING}: {e} (FUSE over io_uring needs Linux 6.14+ built with CONFIG_FUSE_IO_URING)"
        )),
    }
}

struct Cfg {
    mgmt: String,
    security: peregrine::Security,
    pool: String,
    cont: String,
    mountpoint: PathBuf,
    threads: usize,
    io_uring: IoUring,
    attr: Duration,
    dentry: Duration,
    data_cache: DataCache,
    read_only: bool,
    foreground: bool,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let (num, mul) = if let Some(n) = s.strip_suffix("ms") {
        (n, 0.001)
    } else if let Some(n) = s.strip_suffix('s') {
        (n, 1.0)
    } else if let Some(n) = s.strip_suffix('m') {
        (n, 60.0)
    } else if let Some(n) = s.strip_suffix('h') {
        (n, 3600.0)
    } else {
        (s, 1.0)
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("bad duration {s:?} (e.g. 1, 0.5, 500ms, 2s, 1m)"))?;
    if !(0.0..1e9).contains(&v) {
        return Err(format!("bad duration {s:?}"));
    }
    Ok(Duration::from_secs_f64(v * mul))
}

fn parse_cache(s: &str) -> Result<DataCache, String> {
    match s.to_ascii_lowercase().as_str() {
        "on" | "true" | "yes" => Ok(DataCache::On),
        "off" | "false" | "no" => Ok(DataCache::Off),
        d => parse_duration(d).map(DataCache::For),
    }
}

/// Request threads unless configured: one per CPU this process may use
/// (its cgroup's quota counts), at least 4 and at most 16. Fewer than 4
/// starve parallel readers (4 fio jobs of 4 KiB reads through the mount:
/// 21k IOPS with 2 threads, 30k with 4, on 2 CPUs); on a node of 2 CPUs 2
/// threads would create files faster (9k/s against 6-8.6k/s: a thread
/// waiting on an engine polls for its reply for a while, and more threads
/// than CPUs take CPU time from the callers and the engines), so
/// `--threads` is the knob there (bench/posix-il.md).
fn default_threads() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get().clamp(4, 16))
}

fn config(a: Args) -> Result<Cfg, String> {
    let mut mgmt = a.mgmt;
    let mut pool = a.pool;
    let mut cont = a.cont;
    let mut threads = a.threads;
    let mut io_uring = a.io_uring;
    let mut attr = a.attr_timeout;
    let mut dentry = a.dentry_timeout;
    let mut cache = a.data_cache;
    let mut ro = a.read_only;
    let mut fg = a.foreground;
    let mut tls_dir = a.tls_dir;
    let mut insecure = a.insecure;
    for o in a.options.iter().flat_map(|o| o.split(',')) {
        let (k, v) = o.split_once('=').unwrap_or((o, ""));
        match k {
            "pool" => pool = Some(v.into()),
            "cont" | "container" => cont = Some(v.into()),
            "mgmt" => mgmt = Some(v.into()),
            "threads" => threads = Some(v.parse().map_err(|_| format!("-o threads={v}"))?),
            "io_uring" | "io-uring" => io_uring = Some(v.into()),
            "attr_timeout" | "attr-timeout" => attr = Some(v.into()),
            "dentry_timeout" | "dentry-timeout" => dentry = Some(v.into()),
            "data_cache" | "data-cache" => cache = Some(v.into()),
            "ro" | "read_only" | "read-only" => ro = true,
            "rw" => ro = false,
            "foreground" => fg = true,
            "tls_dir" | "tls-dir" => tls_dir = Some(v.into()),
            "insecure" => insecure = true,
            // Generic mount options that do not concern the daemon.
            _ => {}
        }
    }
    let mut mountpoint = a.mountpoint;
    match a.positional.len() {
        0 => {}
        1 => mountpoint = mountpoint.or(Some(a.positional[0].clone().into())),
        2 => {
            if let Some((p, c)) = a.positional[0].split_once('/') {
                pool = pool.or(Some(p.into()));
                cont = cont.or(Some(c.into()));
            }
            mountpoint = mountpoint.or(Some(a.positional[1].clone().into()));
        }
        _ => return Err("too many arguments: expected [SOURCE] MOUNTPOINT".into()),
    }
    let mgmt = mgmt
        .or_else(|| std::env::var("PEREGRINE_MGMT").ok())
        .unwrap_or_else(|| format!("127.0.0.1:{}", peregrine_proto::DEFAULT_CONTROL_PORT));
    // Flags first; the environment only when neither flag is given.
    if tls_dir.is_none() && !insecure {
        tls_dir = std::env::var_os(peregrine::tls::ENV_TLS_DIR)
            .filter(|d| !d.is_empty())
            .map(PathBuf::from);
        insecure = tls_dir.is_none() && peregrine::tls::env_insecure();
    }
    let security = peregrine::Security::from_flags(tls_dir, insecure)?;
    Ok(Cfg {
        mgmt,
        security,
        pool: pool.ok_or("no pool (--pool or -o pool=)")?,
        cont: cont.ok_or("no container (--cont or -o cont=)")?,
        mountpoint: mountpoint.ok_or("no mount point (--mountpoint or positional)")?,
        threads: threads.unwrap_or_else(default_threads).clamp(1, 256),
        io_uring: match io_uring.as_deref().unwrap_or("auto") {
            "auto" => IoUring::Auto,
            "on" => IoUring::On,
            "off" => IoUring::Off,
            v => return Err(format!("--io-uring {v}: expected auto, on or off")),
        },
        attr: parse_duration(attr.as_deref().unwrap_or("1"))?,
        dentry: parse_duration(dentry.as_deref().unwrap_or("1"))?,
        data_cache: parse_cache(cache.as_deref().unwrap_or("1s"))?,
        read_only: ro,
        foreground: fg,
    })
}

fn cpath(p: &Path) -> CString {
    CString::new(p.as_os_str().as_bytes()).expect("path without NUL")
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// What a mount whose daemon is gone answers: ENOTCONN once the connection is
/// aborted. Over FUSE over io_uring the abort comes only after the dead
/// daemon's rings are torn down, asynchronously, and until then a request
/// ends with ECONNABORTED (caught by the abort) or ECANCELED (handed to a ring
/// entry whose task is dead: the kernel's `fuse_uring_send_in_task`).
fn is_stale(e: &std::io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ENOTCONN | libc::ECONNABORTED | libc::ECANCELED)
    )
}

/// A mount left by a killed daemon (see [`is_stale`]): detach it.
fn clean_stale(mp: &Path) {
    if let Err(e) = std::fs::metadata(mp) {
        if is_stale(&e) {
            eprintln!(
                "peregrine-fuse: {} is a stale FUSE mount ({e}); unmounting it lazily",
                mp.display()
            );
            let ok = std::process::Command::new("fusermount3")
                .arg("-uz")
                .arg(mp)
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if !ok {
                // SAFETY: a NUL-terminated path that outlives the call.
                unsafe { libc::umount2(cpath(mp).as_ptr(), libc::MNT_DETACH) };
            }
        }
    }
}

fn unmount(mp: &Path) {
    if is_root() {
        let c = cpath(mp);
        // SAFETY: `c` is a NUL-terminated path that outlives the call.
        if unsafe { libc::umount2(c.as_ptr(), 0) } != 0 {
            let e = std::io::Error::last_os_error();
            eprintln!(
                "peregrine-fuse: unmount {}: {e}; detaching lazily",
                mp.display()
            );
            // SAFETY: as above.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    } else {
        let _ = std::process::Command::new("fusermount3")
            .arg("-uz")
            .arg(mp)
            .status();
    }
}

/// Mount with mount(2) (root): type `fuse.peregrine`, source `peregrine`.
fn mount_root(mp: &Path, ro: bool) -> std::io::Result<OwnedFd> {
    // SAFETY: a static NUL-terminated path.
    let fd = unsafe { libc::open(c"/dev/fuse".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened here and is owned by nothing else.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = std::fs::metadata(mp)?;
    use std::os::unix::fs::MetadataExt;
    let opts = format!(
        "fd={fd},rootmode={:o},user_id=0,group_id=0,allow_other,default_permissions",
        st.mode() & libc::S_IFMT
    );
    let mut flags = libc::MS_NOSUID | libc::MS_NODEV;
    if ro {
        flags |= libc::MS_RDONLY;
    }
    let (src, ty, o) = (
        CString::new("peregrine").unwrap(),
        CString::new("fuse.peregrine").unwrap(),
        CString::new(opts).unwrap(),
    );
    // SAFETY: source, target, type and options are NUL-terminated strings that outlive the call.
    let r = unsafe {
        libc::mount(
            src.as_ptr(),
            cpath(mp).as_ptr(),
            ty.as_ptr(),
            flags,
            o.as_ptr() as *const libc::c_void,
        )
    };
    if r != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(owned)
}

/// Detach: fork; the parent waits for the child's "ready" over a pipe and
/// exits with its verdict. Returns the write end in the child.
fn daemonize() -> std::fs::File {
    let mut fds = [0; 2];
    // SAFETY: `fds` has room for the two descriptors pipe2 writes.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        eprintln!("peregrine-fuse: pipe: {}", std::io::Error::last_os_error());
        std::process::exit(1);
    }
    // SAFETY: called before any other thread is started (see main).
    match unsafe { libc::fork() } {
        -1 => {
            eprintln!("peregrine-fuse: fork: {}", std::io::Error::last_os_error());
            std::process::exit(1);
        }
        0 => {
            // SAFETY: the child closes the pipe's read end it does not use, and starts a session.
            unsafe {
                libc::close(fds[0]);
                libc::setsid();
            }
            // SAFETY: the pipe's write end, owned by this process alone from here on.
            unsafe { std::fs::File::from_raw_fd(fds[1]) }
        }
        _ => {
            // SAFETY: the parent's copy of the write end, used nowhere else.
            unsafe { libc::close(fds[1]) };
            // SAFETY: the pipe's read end, owned here alone.
            let mut r = unsafe { std::fs::File::from_raw_fd(fds[0]) };
            let mut s = String::new();
            let _ = r.read_to_string(&mut s);
            if s.starts_with("OK") {
                std::process::exit(0);
            }
            let msg = s.strip_prefix("ERR ").unwrap_or(&s);
            eprintln!(
                "peregrine-fuse: {}",
                if msg.is_empty() {
                    "daemon exited before mounting"
                } else {
                    msg.trim_end()
                }
            );
            std::process::exit(1);
        }
    }
}

fn block_signals() -> libc::sigset_t {
    // SAFETY: a zeroed sigset_t is a valid argument to sigemptyset, which initializes it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// fuser's warnings and errors (its `log` records) on the daemon's standard error, where the
/// rest of its messages go: a refused FUSE over io_uring, a request it could not parse.
struct StderrLog;

impl log::Log for StderrLog {
    fn enabled(&self, m: &log::Metadata) -> bool {
        m.level() <= log::Level::Warn
    }
    fn log(&self, r: &log::Record) {
        if self.enabled(r.metadata()) {
            eprintln!("peregrine-fuse: {}: {}", r.target(), r.args());
        }
    }
    fn flush(&self) {}
}

fn main() {
    if log::set_logger(&StderrLog).is_ok() {
        log::set_max_level(log::LevelFilter::Warn);
    }
    let cfg = match config(Args::parse()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("peregrine-fuse: {e}");
            std::process::exit(2);
        }
    };
    // Fork before any thread exists.
    let mut ready = if cfg.foreground {
        None
    } else {
        Some(daemonize())
    };
    let fail = |ready: &mut Option<std::fs::File>, msg: String| -> ! {
        eprintln!("peregrine-fuse: {msg}");
        if let Some(w) = ready.as_mut() {
            let _ = writeln!(w, "ERR {msg}");
        }
        std::process::exit(1);
    };
    let sigs = block_signals();
    let mp = match cfg.mountpoint.canonicalize() {
        Ok(p) => p,
        Err(e) if is_stale(&e) => {
            clean_stale(&cfg.mountpoint);
            cfg.mountpoint
                .canonicalize()
                .unwrap_or_else(|e| fail(&mut ready, format!("{}: {e}", cfg.mountpoint.display())))
        }
        Err(e) => fail(&mut ready, format!("{}: {e}", cfg.mountpoint.display())),
    };
    clean_stale(&mp);

    let dfs = (|| {
        // The daemon's environment, read here once: the transport
        // (`PEREGRINE_TRANSPORT`) and its shared-memory settings.
        let shm = peregrine::shm::ShmConfig::default().with_vars(|k| std::env::var(k).ok());
        let kind = peregrine::TransportKind::from_env()?;
        let client = peregrine::Client::connect_with_shm(&cfg.mgmt, &cfg.security, kind, shm)?;
        let pool = client.pool_connect(&cfg.pool)?;
        // A read-only mount holds a read-only handle: the interception
        // library, which takes the daemon's, cannot write through it either.
        let cont = if cfg.read_only {
            pool.cont_open_read_only(&cfg.cont)?
        } else {
            pool.cont_open(&cfg.cont)?
        };
        peregrine_dfs::Dfs::mount(cont, !cfg.read_only, cfg.read_only)
    })()
    .unwrap_or_else(|e| fail(&mut ready, format!("mount {}/{}: {e}", cfg.pool, cfg.cont)));

    let fs = PeregrineFs::new(
        dfs,
        Options {
            attr_ttl: cfg.attr,
            entry_ttl: cfg.dentry,
            data_cache: cfg.data_cache,
            mgmt: cfg.mgmt.clone(),
            read_only: cfg.read_only,
        },
    );
    let notifier = fs.notifier_slot();
    let mut fcfg = Config::default();
    fcfg.n_threads = Some(cfg.threads);
    if cfg.io_uring == IoUring::On {
        if let Err(e) = enable_uring() {
            fail(&mut ready, e);
        }
    }
    if cfg.io_uring != IoUring::Off {
        fcfg.io_uring = Some(cfg.threads);
    }
    let session = if is_root() {
        let fd = mount_root(&mp, cfg.read_only)
            .unwrap_or_else(|e| fail(&mut ready, format!("mount {}: {e}", mp.display())));
        Session::from_fd(fs, fd, SessionACL::All, fcfg)
    } else {
        let mut o = vec![
            MountOption::FSName("peregrine".into()),
            MountOption::Subtype("peregrine".into()),
            MountOption::DefaultPermissions,
        ];
        if cfg.read_only {
            o.push(MountOption::RO);
        }
        fcfg.mount_options = o;
        // fuser: mount(2) if permitted (a user namespace), else through
        // the setuid fusermount3.
        Session::new(fs, &mp, &fcfg)
    };
    let session = session.unwrap_or_else(|e| {
        unmount(&mp);
        fail(&mut ready, format!("FUSE session on {}: {e}", mp.display()))
    });
    let _ = notifier.set(session.notifier());
    if cfg.io_uring == IoUring::On && !session.io_uring() {
        unmount(&mp);
        fail(
            &mut ready,
            format!("--io-uring on: FUSE over io_uring is not available (the kernel did not offer it, {ENABLE_URING}, or io_uring_setup is refused: see the warning above)"),
        );
    }
    eprintln!(
        "peregrine-fuse: mounted {}/{} on {} ({} threads, {})",
        cfg.pool,
        cfg.cont,
        mp.display(),
        cfg.threads,
        if session.io_uring() {
            "FUSE over io_uring"
        } else {
            "/dev/fuse"
        }
    );
    if let Some(mut w) = ready.take() {
        let _ = writeln!(w, "OK");
        drop(w);
        // Detached: no terminal output from here on.
        if let Ok(null) = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")
        {
            use std::os::fd::AsRawFd;
            for fd in 0..3 {
                // SAFETY: both descriptors are open; 0-2 are replaced on purpose.
                unsafe { libc::dup2(null.as_raw_fd(), fd) };
            }
        }
    }
    let mp2 = mp.clone();
    std::thread::spawn(move || loop {
        let mut sig = 0;
        // SAFETY: `sigs` is an initialized set, `sig` a valid out-parameter.
        if unsafe { libc::sigwait(&sigs, &mut sig) } == 0 {
            eprintln!("peregrine-fuse: signal {sig}: unmounting {}", mp2.display());
            unmount(&mp2);
            // A lazily detached mount lives on while files are open; give
            // the session a grace period, then exit (closing /dev/fuse
            // aborts the connection: those files then see ENOTCONN).
            std::thread::sleep(UNMOUNT_GRACE);
            eprintln!(
                "peregrine-fuse: {} still in use {UNMOUNT_GRACE:?} after unmount; exiting",
                mp2.display()
            );
            std::process::exit(0);
        }
    });
    match session.run() {
        Ok(()) => {
            eprintln!("peregrine-fuse: {} unmounted", mp.display());
        }
        Err(e) => {
            eprintln!("peregrine-fuse: session ended: {e}");
            unmount(&mp);
            std::process::exit(1);
        }
    }
}
