//! Opening a container without the control port (docs/tls.md): workload
//! processes have no control-plane certificate, so the library asks the
//! FUSE daemon, which has one, for the pool map and the container's
//! description (`PEREGRINE_IOC_GET_CONT`, include/peregrine_fuse.h) on an
//! open file of the mount: first on the file being opened ([`prime`]),
//! later (pool-map refreshes) on any tracked descriptor of the container,
//! or, with none open (a process that only creates and removes files
//! through the library holds none between calls), on the root directory
//! of a mount of it, opened for the question.

use crate::handle::Handle;
use crate::real::ioctl_raw;
use libc::{c_int, c_ulong, c_void};
use peregrine::handoff;
use peregrine::sync::Mutex;
use peregrine::{Error, Result};
use std::sync::atomic::{AtomicU64, Ordering};

type ContKey = ([u8; 16], [u8; 16]);

/// Descriptions fetched at open, until the container's open takes them.
static PRIMED: Mutex<Vec<(ContKey, Vec<u8>)>> = Mutex::new(Vec::new());

/// Most descriptors tried for one refresh.
const TRIES: usize = 4;

/// The whole description, through `fd`; `stale`: the generation of the
/// one found stale (0: none).
fn fetch(fd: c_int, stale: u64) -> Result<Vec<u8>> {
    handoff::fetch(stale, |b| {
        // SAFETY: the ioctl reads and writes CONT_SIZE bytes of b.
        let r = unsafe {
            ioctl_raw(
                fd,
                handoff::IOC_GET_CONT as c_ulong,
                b.as_mut_ptr() as *mut c_void,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        Err(Error::new(
            -e.raw_os_error().unwrap_or(libc::EIO),
            format!("PEREGRINE_IOC_GET_CONT: {e} (a peregrine-fuse from before it?)"),
        ))
    })
}

/// At the open of `fd` (a file of `h`'s container): fetch the description
/// now, while a descriptor surely exists, unless the container is open.
pub(crate) fn prime(fd: c_int, h: &Handle, open: bool) {
    if open {
        return;
    }
    if let Ok(d) = fetch(fd, 0) {
        let mut p = PRIMED.lock();
        p.retain(|(k, _)| *k != (h.pool, h.cont));
        p.push(((h.pool, h.cont), d));
    }
}

/// The management calls of one container, answered by the daemon.
pub(crate) struct DaemonSource {
    key: ContKey,
    /// The generation of the description last taken: a later call is a
    /// refresh, which the daemon must answer afresh, not from what it keeps.
    taken: AtomicU64,
}

impl DaemonSource {
    pub(crate) fn new(h: &Handle) -> DaemonSource {
        DaemonSource {
            key: (h.pool, h.cont),
            taken: AtomicU64::new(0),
        }
    }

    /// The description: the primed one at open (`take`: the last call of
    /// the open), else a fresh one through a tracked descriptor.
    fn description(&self, take: bool) -> Result<Vec<u8>> {
        let d = self.description_from_daemon(take)?;
        self.taken.store(handoff::generation(&d), Ordering::Relaxed);
        Ok(d)
    }

    fn description_from_daemon(&self, take: bool) -> Result<Vec<u8>> {
        {
            let mut p = PRIMED.lock();
            if let Some(i) = p.iter().position(|(k, _)| *k == self.key) {
                return Ok(if take {
                    p.swap_remove(i).1
                } else {
                    p[i].1.clone()
                });
            }
        }
        let fds: Vec<c_int> = crate::table::FDS
            .read()
            .iter()
            .enumerate()
            .filter_map(|(fd, s)| {
                let s = s.as_ref()?;
                let mine = (s.h.pool, s.h.cont) == self.key
                    // A placeholder converted (before a fork) is a file of
                    // the daemon's now.
                    && crate::place::of(s).is_none()
                    && !s.retired.load(std::sync::atomic::Ordering::Relaxed);
                mine.then_some(fd as c_int)
            })
            .take(TRIES)
            .collect();
        let mut last = Error::new(
            -libc::ENOTCONN,
            "no open file of the container to ask the FUSE daemon through".to_string(),
        );
        let stale = self.taken.load(Ordering::Relaxed);
        for fd in fds {
            match fetch(fd, stale) {
                Ok(d) => return Ok(d),
                Err(e) => last = e,
            }
        }
        for root in crate::mounts::peregrine_points().iter().take(TRIES) {
            let fd = crate::ns::sys_open(root, libc::O_RDONLY | libc::O_DIRECTORY);
            if fd < 0 {
                continue;
            }
            let got = fetch(fd, stale);
            // SAFETY: our own descriptor.
            unsafe { libc::syscall(libc::SYS_close, fd) };
            match got {
                // Another container's mount answers about that one.
                Ok(d) if self.describes(&d) => return Ok(d),
                Ok(_) => {}
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// Whether description `d` is of this source's container.
    fn describes(&self, d: &[u8]) -> bool {
        handoff::decode(d).is_ok_and(|(map, info)| {
            map.uuid == uuid_str(&self.key.0) && info.uuid == uuid_str(&self.key.1)
        })
    }
}

fn uuid_str(b: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*b).to_string()
}

impl peregrine::mgmt::ControlSource for DaemonSource {
    fn call(&self, rpc: &str, _req: Vec<u8>) -> Result<Vec<u8>> {
        let take = match rpc {
            "pool_connect" => false,
            "cont_query" => true,
            _ => {
                return Err(Error::new(
                    -libc::ENOTSUP,
                    format!("{rpc}: not available to the interception library"),
                ))
            }
        };
        let (map, info) = handoff::decode(&self.description(take)?)?;
        // A descriptor may have been closed and reused for another file
        // since it was picked: the answer must be about this container.
        let (pool, cont) = (uuid_str(&self.key.0), uuid_str(&self.key.1));
        if map.uuid != pool || info.uuid != cont {
            return Err(Error::new(
                -libc::ESTALE,
                format!(
                    "the daemon described container {}/{}, not {pool}/{cont}",
                    map.uuid, info.uuid
                ),
            ));
        }
        Ok(match take {
            false => handoff::to_bytes(&map),
            true => handoff::to_bytes(&info),
        })
    }
}
