//! Opening a device: the options a [`Storage`] is opened with and
//! [`Storage::open`], which replays every target and starts its thread.

use crate::target::{self, Target};
use crate::{
    mgmt, scan, superblock, AggregationLease, ScanState, Storage, StorageError, TargetCounters,
};
use parking_lot::Mutex;
use std::path::PathBuf;
use std::sync::mpsc;

/// Kind of block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BdevClass {
    /// A regular file, created or extended to `size` at format (emulated NVMe).
    File,
    /// A kernel block device (loop device, NVMe namespace); its size is read from it.
    Kdev,
}

/// How a target writes its write-ahead log. Either way an update is
/// acknowledged once its record is written (it survives the crash or
/// `kill -9` of any process) and survives a power cut once flushed
/// ([`StorageOptions::flush_interval`], fsync, `sync=always`): what
/// differs is only where the acknowledged record waits for the flush.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WalIo {
    /// O_DIRECT, as the data: the device holds the record (in its volatile
    /// write cache) before the update is acknowledged. For NVMe, where
    /// such a write takes 10-20 µs.
    Direct,
    /// Through the kernel's page cache: the kernel holds the record and
    /// writes it back (at the latest at the next flush). For a device
    /// that is a file on a host file system (emulated NVMe), where an
    /// O_DIRECT write takes the host disk's latency (~70-100 µs on a
    /// cloud VM's disk) and a metadata update is little else.
    PageCache,
}

impl WalIo {
    /// The default for a kind of device: the page cache for a file,
    /// O_DIRECT for a block device.
    pub fn default_for(class: BdevClass) -> WalIo {
        match class {
            BdevClass::File => WalIo::PageCache,
            BdevClass::Kdev => WalIo::Direct,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BdevSpec {
    pub class: BdevClass,
    pub path: PathBuf,
    /// File: bytes to create/extend to. Kdev: ignored.
    pub size: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StorageOptions {
    pub bdev: BdevSpec,
    /// RAM budget for metadata and small values, split evenly over targets.
    pub scm_bytes: u64,
    pub targets: u32,
    pub hugepages: bool,
    /// The longest an acknowledged update stays in the device's volatile
    /// write cache before its target flushes on its own (a power cut may
    /// lose it until then; any process may crash meanwhile).
    pub flush_interval: std::time::Duration,
    /// How long a target keeps polling its sources ([`Storage::attach`])
    /// after taking a request from one, rather than sleep (zero: sleeps at
    /// once). Costs up to that much CPU time per request on an idle target.
    pub poll: std::time::Duration,
    /// How long a target polls for the completion of a lone read (a QD1
    /// fetch) before it sleeps in the kernel (zero: never polls).
    pub read_spin: std::time::Duration,
    /// Bytes of stored extents each target's scrubber verifies per second
    /// (0: off); [`Storage::set_scrub_rate`] changes it at run time.
    pub scrub_rate: u64,
    /// Values smaller than this stay in the target's RAM (the SCM tier,
    /// made durable by the WAL and checkpoints); values of this size and
    /// larger go to data blocks on the device. Lower it to bound the RAM a
    /// namespace of many small files takes (a file's data then costs a
    /// block of the device, not its size in RAM); 1 to [`SCM_VALUE_MAX`].
    pub scm_value_max: usize,
    /// How the targets write their WAL ([`WalIo::default_for`] the device
    /// unless configured).
    pub wal_io: WalIo,
}

/// [`StorageOptions::flush_interval`] unless configured.
pub const DEFAULT_FLUSH_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);
/// [`StorageOptions::poll`] unless configured.
pub const DEFAULT_POLL: std::time::Duration = std::time::Duration::from_micros(200);
/// [`StorageOptions::scm_value_max`] unless configured, and its upper
/// bound: a value below one block never takes a block of its own.
pub const SCM_VALUE_MAX: usize = peregrine_proto::DATA_THRESHOLD;
/// [`StorageOptions::read_spin`] unless configured.
pub const DEFAULT_READ_SPIN: std::time::Duration = std::time::Duration::from_micros(150);

impl Storage {
    /// Open a formatted device: replay every target's checkpoint and WAL and
    /// start `opts.targets` target threads.
    pub fn open(opts: &StorageOptions) -> Result<Storage, StorageError> {
        let name = opts.bdev.path.display().to_string();
        let sb = match scan(&opts.bdev)? {
            ScanState::Formatted(sb) => sb,
            ScanState::Unformatted => {
                return Err(StorageError::NotFound(format!(
                    "device {name} is not formatted"
                )))
            }
            ScanState::Foreign(what) => {
                return Err(StorageError::Refused(format!(
                    "device {name} is not a Peregrine device: it holds {what}"
                )))
            }
        };
        if opts.targets != sb.targets {
            return Err(StorageError::Invalid(format!(
                "targets: options ask for {} but device {name} was formatted for {}",
                opts.targets, sb.targets
            )));
        }
        let mut f = superblock::open_rw(&opts.bdev.path)?;
        let repairs = superblock::repair(&f, &name)?;
        let size = superblock::device_size(&mut f, &opts.bdev.path)?;
        if size < sb.device_bytes {
            return Err(StorageError::Invalid(format!(
                "device {name}: {size} bytes, but it was formatted with {} bytes",
                sb.device_bytes
            )));
        }
        let mut opts = opts.clone();
        if opts.bdev.class == BdevClass::File && !reserve_wals(&f, &sb, &name)? {
            if opts.wal_io == WalIo::PageCache {
                // A record the kernel holds in a hole it cannot fill would
                // be lost at writeback: write the WAL O_DIRECT, so that a
                // full host fails the commit instead.
                tracing::warn!(device = %name, "the WAL's blocks are not reserved: writing it O_DIRECT, not through the page cache");
            }
            opts.wal_io = WalIo::Direct;
        }
        let opts = &opts;
        // Checkpoints make the SCM tier durable, so a target may hold no more
        // metadata than a checkpoint slot can take (half of it: the encoded
        // index is larger than the accounted bytes). Past that, updates get a
        // clean ENOSPC instead of failing checkpoints and a WAL that fills.
        let configured = opts.scm_bytes / sb.targets as u64;
        let scm_budget = configured.min(sb.ckpt_bytes / 2);
        if scm_budget < configured {
            tracing::warn!(
                "scm.size {} gives {configured} bytes per target, but this device's checkpoint slots hold {} bytes; using {scm_budget} bytes per target (a larger device raises it)",
                opts.scm_bytes,
                sb.ckpt_bytes
            );
        }
        let mut senders = Vec::new();
        let mut faults = Vec::new();
        let mut counters = Vec::new();
        let mut threads = Vec::new();
        let mut ready = Vec::new();
        let lease = std::sync::Arc::<AggregationLease>::default();
        for t in 0..sb.targets {
            let (tx, rx) = target::mailbox(t)
                .map_err(|e| StorageError::io(format!("target {t}: eventfd"), e))?;
            let (rtx, rrx) = mpsc::channel();
            let (sb2, opts2) = (sb.clone(), opts.clone());
            let fault = std::sync::Arc::new(Mutex::new(None));
            faults.push(fault.clone());
            let lease = lease.clone();
            let tc = std::sync::Arc::new(TargetCounters::default());
            counters.push(tc.clone());
            let h = std::thread::Builder::new()
                .name(format!("vos-target-{t}"))
                .spawn(
                    move || match Target::open(sb2, &opts2, t, scm_budget, fault, lease) {
                        Ok(mut target) => {
                            target.counters = tc;
                            let _ = rtx.send(Ok(()));
                            target.run(rx);
                        }
                        Err(e) => {
                            let _ = rtx.send(Err(e));
                        }
                    },
                )
                .map_err(|e| StorageError::io(format!("target {t}: spawn thread"), e))?;
            senders.push(tx);
            threads.push(h);
            ready.push(rrx);
        }
        let mut storage = Storage {
            mgmt: Mutex::new(mgmt::MgmtSlots::new(f, sb.clone())),
            sb,
            senders,
            faults,
            counters,
            threads,
            lease,
            repairs,
            wal_io: opts.wal_io,
        };
        for (t, r) in ready.into_iter().enumerate() {
            let res = r.recv().unwrap_or_else(|_| {
                Err(StorageError::Shutdown(format!(
                    "target {t}: thread died while opening"
                )))
            });
            if let Err(e) = res {
                storage.stop();
                return Err(e);
            }
        }
        // Where each target's data blocks are (offset+bytes): benchmarks
        // write the raw device where the targets do.
        let data_regions = (0..storage.sb.targets)
            .map(|t| format!("{}+{}", storage.sb.data_offset(t), storage.sb.data_bytes))
            .collect::<Vec<_>>()
            .join(",");
        tracing::info!(device = %name, targets = storage.sb.targets, data_regions = %data_regions, wal_io = ?storage.wal_io, "storage open");
        Ok(storage)
    }
}

/// Give every target's WAL its blocks in the host file system of a
/// file-backed device, which is sparse when made. A write into a hole makes
/// the host allocate blocks first: on ext4 that tripled the latency of a
/// small commit (about 230 us against 95 us for the same WAL write into
/// reserved blocks), and on a host file system that fills up it would fail
/// the commit (the target then refuses updates). Reserved, the WAL is never
/// short of space: a full host fails the opening with a clear error instead.
/// Blocks already reserved, or written, are left as they are. False when
/// the host file system cannot reserve them.
fn reserve_wals(
    f: &std::fs::File,
    sb: &superblock::Superblock,
    name: &str,
) -> Result<bool, StorageError> {
    use std::os::fd::AsRawFd;
    for t in 0..sb.targets {
        let (off, len) = (sb.wal_offset(t), sb.wal_bytes);
        // SAFETY: fallocate takes no pointers; `f` is an open descriptor for
        // the whole call and the range lies inside the formatted device.
        let r =
            unsafe { libc::fallocate(f.as_raw_fd(), 0, off as libc::off_t, len as libc::off_t) };
        if r == 0 {
            continue;
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::EOPNOTSUPP) {
            tracing::warn!(device = %name, "the host file system cannot reserve blocks (fallocate); WAL writes allocate them as they go");
            return Ok(false);
        }
        return Err(StorageError::io(
            format!(
                "device {name}: reserve the {len} bytes of target {t}'s WAL in the host file system"
            ),
            e,
        ));
    }
    Ok(true)
}
