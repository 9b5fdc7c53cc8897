//! The tables: the state of each tracked descriptor, indexed by fd, the
//! files mapped in this process and the connections to containers.

use crate::handle::Handle;
use crate::real::set_errno;
use crate::report::{enabled, env_on, note_failure, Busy};
use libc::c_int;
use peregrine::sync::{Mutex, RwLock};
use peregrine_dfs::File;
use std::collections::BTreeSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

// Here rather than in lib.rs: the module list is another change's.
#[path = "daemon.rs"]
pub(crate) mod daemon;

/// State shared by all fds of one open file description.
pub(crate) struct Shared {
    pub(crate) h: Handle,
    /// The file (st_dev, st_ino): finds every descriptor of a file that
    /// gets mapped.
    pub(crate) key: Key,
    /// O_RDONLY / O_WRONLY / O_RDWR.
    pub(crate) acc: c_int,
    pub(crate) append: AtomicBool,
    /// Written through the library since the last invalidation.
    pub(crate) dirty: AtomicBool,
    /// Handed back to the kernel path because the file was mapped (no
    /// longer in the table; a call already under way finishes on the
    /// store, then invalidates again).
    pub(crate) retired: AtomicBool,
    /// Opened O_SYNC or O_DSYNC: every write is flushed before it returns.
    pub(crate) sync: bool,
    /// Serializes offset-moving calls (read of the kernel offset, I/O,
    /// update of the kernel offset).
    pub(crate) io: Mutex<()>,
    pub(crate) file: Mutex<Option<Arc<File>>>,
    /// A placeholder descriptor opened by the library (place.rs).
    pub(crate) ph: Option<Arc<crate::place::Placeholder>>,
}

impl Shared {
    pub(crate) fn fresh_copy(&self) -> Shared {
        Shared {
            h: self.h.clone(),
            key: self.key,
            acc: self.acc,
            append: AtomicBool::new(self.append.load(Ordering::Relaxed)),
            dirty: AtomicBool::new(self.dirty.load(Ordering::Relaxed)),
            retired: AtomicBool::new(self.retired.load(Ordering::Relaxed)),
            sync: self.sync,
            io: Mutex::new(()),
            file: Mutex::new(None),
            ph: self.ph.clone(),
        }
    }

    /// The file's I/O object (reconnecting after a fork).
    pub(crate) fn file(&self) -> Result<Arc<File>, c_int> {
        if let Some(f) = self.file.lock().as_ref() {
            return Ok(f.clone());
        }
        let cont = container(&self.h, true)?;
        let f = Arc::new(
            File::new(&cont, self.h.oid, self.h.chunk, self.h.read_only).map_err(|e| err_of(&e))?,
        );
        let mut g = self.file.lock();
        Ok(g.get_or_insert(f).clone())
    }
}

pub(crate) static FDS: RwLock<Vec<Option<Arc<Shared>>>> = RwLock::new(Vec::new());
pub(crate) static NTRACKED: AtomicUsize = AtomicUsize::new(0);

/// A file: (major, minor) of its st_dev, and its st_ino.
pub(crate) type Key = (u32, u32, u64);

/// Files of Peregrine mounts this process has mapped: left to the kernel
/// path for the rest of the process (see `before_map`). Locked after
/// [`FDS`] when both are.
pub(crate) static MAPPED: Mutex<BTreeSet<Key>> = Mutex::new(BTreeSet::new());

type ContKey = (String, [u8; 16], [u8; 16]);
/// Open containers, each with whether this process is known to reach its
/// engines ([`container`]'s probe).
pub(crate) static CONTS: Mutex<Vec<(ContKey, peregrine::Container, bool)>> = Mutex::new(Vec::new());

pub(crate) fn err_of(e: &peregrine::Error) -> c_int {
    if e.code < 0 {
        -e.code
    } else {
        libc::EIO
    }
}

fn uuid_str(b: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*b).to_string()
}

/// Whether `h`'s container is open in this process.
pub(crate) fn is_open(h: &Handle) -> bool {
    let key = (h.mgmt.clone(), h.pool, h.cont);
    CONTS.lock().iter().any(|(k, _, _)| *k == key)
}

/// The shared-memory settings of this process's containers: the defaults
/// with `PEREGRINE_SHM_SPIN_US` and `PEREGRINE_SHM_DIRECT` from the
/// program's environment, read once.
fn shm_config() -> peregrine::shm::ShmConfig {
    static SHM: std::sync::OnceLock<peregrine::shm::ShmConfig> = std::sync::OnceLock::new();
    SHM.get_or_init(|| peregrine::shm::ShmConfig::default().with_vars(|k| std::env::var(k).ok()))
        .clone()
}

/// `h`'s container, opened through the FUSE daemon (`daemon.rs`): never
/// through the control port, which takes only certificate holders.
/// `probe`: make sure this process reaches the engines (`handoff::probe`,
/// a ping) before the container is used, for a caller whose next step
/// would fail rather than fall back. A namespace's mount needs none (it
/// reads the superblock at once, and tells [`reached`] when that worked):
/// a ping would cost a connection to a target the process may never use.
pub(crate) fn container(h: &Handle, probe: bool) -> Result<peregrine::Container, c_int> {
    let key = (h.mgmt.clone(), h.pool, h.cont);
    let mut t = CONTS.lock();
    let found = t.iter().position(|(k, _, _)| *k == key);
    let i = match found {
        Some(i) => i,
        None => {
            let c = (|| {
                let client = peregrine::Client::connect_via_with_shm(
                    &h.mgmt,
                    Arc::new(daemon::DaemonSource::new(h)),
                    peregrine::TransportKind::from_env()?,
                    shm_config(),
                );
                let pool = client.pool_connect(&uuid_str(&h.pool))?;
                pool.cont_open(&uuid_str(&h.cont))
            })()
            .map_err(|e| failed(h, &e))?;
            t.push((key, c, false));
            t.len() - 1
        }
    };
    let (_, c, reached) = &mut t[i];
    if probe && !*reached {
        peregrine::handoff::probe(c).map_err(|e| failed(h, &e))?;
        *reached = true;
    }
    Ok(c.clone())
}

/// `h`'s container reached the engines (its namespace's mount read from
/// them): no probe for it.
pub(crate) fn reached(h: &Handle) {
    let key = (h.mgmt.clone(), h.pool, h.cont);
    if let Some((_, _, r)) = CONTS.lock().iter_mut().find(|(k, _, _)| *k == key) {
        *r = true;
    }
}

/// Say why `h`'s container cannot be used (the report's first failure).
fn failed(h: &Handle, e: &peregrine::Error) -> c_int {
    let m = format!("container via {}: {e}", h.mgmt);
    if env_on(b"PEREGRINE_IL_DEBUG\0") {
        let line = format!("peregrine-il: {m}\n");
        // SAFETY: raw write of an owned buffer.
        unsafe { libc::syscall(libc::SYS_write, 2, line.as_ptr(), line.len()) };
    }
    note_failure(m);
    err_of(e)
}

pub(crate) fn lookup(fd: c_int) -> Option<Arc<Shared>> {
    if fd < 0 || NTRACKED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    FDS.read().get(fd as usize).and_then(|s| s.clone())
}

/// Track `fd` as `s`, unless its file has been mapped (checked under the
/// table's lock, so that a concurrent mmap retires it or it is not
/// inserted).
pub(crate) fn insert(fd: c_int, s: Arc<Shared>) -> bool {
    if fd < 0 {
        return false;
    }
    let mut t = FDS.write();
    if MAPPED.lock().contains(&s.key) {
        return false;
    }
    let i = fd as usize;
    if t.len() <= i {
        t.resize(i + 1, None);
    }
    if t[i].replace(s).is_none() {
        NTRACKED.fetch_add(1, Ordering::Relaxed);
    }
    true
}

pub(crate) fn remove(fd: c_int) -> Option<Arc<Shared>> {
    if fd < 0 || NTRACKED.load(Ordering::Relaxed) == 0 {
        return None;
    }
    let mut t = FDS.write();
    let r = t.get_mut(fd as usize).and_then(|s| s.take());
    if r.is_some() {
        NTRACKED.fetch_sub(1, Ordering::Relaxed);
    }
    r
}

/// A tracked fd, with the re-entrancy flag held.
pub(crate) fn tracked(fd: c_int) -> Option<(Busy, Arc<Shared>)> {
    if NTRACKED.load(Ordering::Relaxed) == 0 || !enabled() {
        return None;
    }
    let b = Busy::enter()?;
    let s = lookup(fd)?;
    if s.ph.is_some() {
        crate::stray::adopt(fd, &s);
    }
    Some((b, s))
}

/// Run `f`; a panic becomes errno EIO and `fail`.
pub(crate) fn guarded<R>(fail: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => {
            set_errno(libc::EIO);
            fail
        }
    }
}
