//! Engines that go away and come back while clients write: every read
//! returns a version that was written and is not older than the last one
//! acknowledged before the read began; after the return every object reads
//! back as its last acknowledged version through every replica (each
//! engine stopped in turn).
//!
//! The writer keeps one history per object (single writer, so versions are
//! ordered): version `v` overwrites a prefix of an ARRAY value with a
//! pattern, or punches it (every 7th), and sets a SINGLE value to `v`.
//! Readers check each read against the versions that were acknowledged
//! before it began or started before it ended.

mod common;
use common::*;
use peregrine_isal::crc32c;
use peregrine_proto::mgmt::{PoolQueryReq, SystemQueryReq};
use peregrine_proto::oclass::EC_CELL_SIZE;
use peregrine_proto::{ObjectClass, ObjectId, Redundancy};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const OBJECTS: u64 = 16;

/// These tests run one at a time (each starts three to six engines and
/// kills some; two at once on a 2-core machine stretch the timings they
/// exercise).
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
/// Longer than the management service's failure detection (6 s).
const LONG: Duration = Duration::from_secs(9);
/// Shorter than it: the engine is back before anyone notices.
const SHORT: Duration = Duration::from_secs(2);

/// What an object held after each of its versions.
#[derive(Default)]
struct History {
    /// CRC32C of the array bytes [0, span) after version v (index v).
    states: Vec<u32>,
    /// CRC32C of each EC cell's bytes of the array after version v (to name
    /// the cell and the versions of a read that matches none).
    cells: Vec<Vec<u32>>,
    /// The highest version acknowledged.
    acked: usize,
    /// The highest version started (acknowledged or not yet).
    started: usize,
    /// The array bytes after the last acknowledged version.
    last: Vec<u8>,
}

struct Workload {
    class: ObjectClass,
    /// Bytes of the array each read covers: the longest write.
    span: usize,
    hist: Vec<Mutex<History>>,
    stop: AtomicBool,
    writes: AtomicU64,
    reads: AtomicU64,
    wrong: Mutex<Vec<String>>,
    /// Updates may fail (the writer's retry window is short): a failed one
    /// must have taken effect wholly or not at all, which the writer checks
    /// by reading the object back.
    failures: AtomicU64,
    tolerate_failures: bool,
}

fn cell_crcs(b: &[u8]) -> Vec<u32> {
    b.chunks(EC_CELL_SIZE as usize).map(crc32c).collect()
}

/// For each cell of `got`: the versions of the history whose cell it is.
fn cells_matching(h: &History, got: &[u8]) -> String {
    cell_crcs(got)
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let v: Vec<usize> = (0..h.cells.len())
                .filter(|&v| h.cells[v].get(i) == Some(c))
                .collect();
            let tail = &v[v.len().saturating_sub(4)..];
            format!("cell {i}: versions {tail:?}")
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn oid(class: ObjectClass, i: u64) -> ObjectId {
    ObjectId::new(class, 7, i)
}

impl Workload {
    fn new(class: ObjectClass) -> Arc<Workload> {
        Arc::new(Workload::build(class))
    }

    fn build(class: ObjectClass) -> Workload {
        let k = match class.redundancy() {
            Redundancy::ErasureCode { data, .. } => data as usize,
            _ => 2,
        };
        let span = k * EC_CELL_SIZE as usize;
        let hist = (0..OBJECTS)
            .map(|_| {
                Mutex::new(History {
                    states: vec![crc32c(&vec![0u8; span])],
                    cells: vec![cell_crcs(&vec![0u8; span])],
                    last: vec![0u8; span],
                    ..Default::default()
                })
            })
            .collect();
        Workload {
            class,
            span,
            hist,
            stop: AtomicBool::new(false),
            writes: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            wrong: Mutex::new(Vec::new()),
            failures: AtomicU64::new(0),
            tolerate_failures: false,
        }
    }

    /// Version `v` of an object: a punch, a 128 KiB overwrite of the start
    /// (a partial EC stripe) or a whole-span one (full stripes). `state`
    /// becomes what the array holds after it, before the I/O starts.
    fn apply(
        &self,
        obj: &peregrine::Object,
        v: usize,
        state: &mut [u8],
        started: impl FnOnce(&[u8]),
    ) -> peregrine::Result<()> {
        if v.is_multiple_of(7) {
            state.fill(0);
            started(state);
            obj.punch_akeys(b"d", &[b"a"])?;
        } else {
            let len = if v.is_multiple_of(3) {
                self.span
            } else {
                128 << 10
            };
            let data = pattern(v as u64 * 1000 + obj.id().lo, len);
            state[..len].copy_from_slice(&data);
            started(state);
            obj.update_array(b"d", b"a", 0, &data)?;
        }
        obj.update_single(b"d", b"v", &(v as u64).to_le_bytes())
    }

    fn writer(self: &Arc<Self>, cont: peregrine::Container) {
        let mut v = 0usize;
        while !self.stop.load(Ordering::Relaxed) {
            // Overwrites pile up while aggregation is capped (targets out):
            // a pace the test pools hold for a minute.
            std::thread::sleep(Duration::from_millis(4));
            v += 1;
            let i = (v as u64 * 5) % OBJECTS;
            let obj = cont.object(oid(self.class, i)).unwrap();
            let mut state = self.hist[i as usize].lock().unwrap().last.clone();
            let r = self.apply(&obj, v, &mut state, |s| {
                let mut h = self.hist[i as usize].lock().unwrap();
                h.states.push(crc32c(s));
                h.cells.push(cell_crcs(s));
                h.started = h.states.len() - 1;
            });
            let mut h = self.hist[i as usize].lock().unwrap();
            match r {
                Ok(()) => {
                    h.acked = h.states.len() - 1;
                    h.last = state;
                    self.writes.fetch_add(1, Ordering::Relaxed);
                }
                Err(e) if self.tolerate_failures => {
                    drop(h);
                    self.failures.fetch_add(1, Ordering::Relaxed);
                    self.settle_failed(&obj, i, v, state, &e);
                }
                Err(e) => self
                    .wrong
                    .lock()
                    .unwrap()
                    .push(format!("object {i} version {v}: write failed: {e}")),
            }
        }
    }

    /// Version `v` of object `i` failed: read the array back (degraded if
    /// an engine is away; a transaction still in doubt is waited for). It
    /// must be wholly the version before or wholly `v`; the history goes
    /// on from the one it is.
    fn settle_failed(
        &self,
        obj: &peregrine::Object,
        i: u64,
        v: usize,
        new: Vec<u8>,
        e: &peregrine::Error,
    ) {
        let got = obj.fetch_array(b"d", b"a", 0, self.span);
        let mut h = self.hist[i as usize].lock().unwrap();
        match got {
            Ok(d) if d == new => {
                h.acked = h.states.len() - 1;
                h.last = d;
            }
            Ok(d) if d == h.last => {}
            Ok(d) => self.wrong.lock().unwrap().push(format!(
                "object {i} version {v} failed ({e}) and left the array neither as it was nor as written (crc {:#x})",
                crc32c(&d)
            )),
            Err(r) => self.wrong.lock().unwrap().push(format!(
                "object {i} version {v} failed ({e}); reading it back failed too: {r}"
            )),
        }
    }

    /// One checked read of object `i`.
    fn check(&self, cont: &peregrine::Container, i: u64) {
        let obj = cont.object(oid(self.class, i)).unwrap();
        let floor = self.hist[i as usize].lock().unwrap().acked;
        let got = obj.fetch_array(b"d", b"a", 0, self.span);
        let single = obj.fetch_single(b"d", b"v");
        let h = self.hist[i as usize].lock().unwrap();
        let ceil = h.started;
        let problem = match (got, single) {
            (Err(e), _) | (_, Err(e)) => Some(format!("read failed: {e}")),
            (Ok(data), Ok(s)) => {
                let crc = crc32c(&data);
                let versions = floor..=ceil;
                // Version numbers of this object: the writer's global v
                // of each of its states is not kept, only the order, so
                // the single value is checked as "not older than acked".
                if !h.states[versions.clone()].contains(&crc) {
                    let older = h.states.iter().rposition(|&c| c == crc);
                    // Stored that way, or read that way (a race of the read)?
                    let again = obj.fetch_array(b"d", b"a", 0, self.span).map(|d| {
                        if crc32c(&d) == crc {
                            "the same"
                        } else {
                            "other"
                        }
                    });
                    let map = cont.pool().map();
                    let ranks = peregrine::placement::group_layout(&map, obj.id(), self.class, 0)
                        .map(|g| {
                            g.shards
                                .iter()
                                .map(|l| map.targets[l.target].rank)
                                .collect::<Vec<_>>()
                        });
                    Some(format!(
                        "array matches no version in {versions:?} (of {}){} ({}; shards on ranks {ranks:?}) at {} (pool map version {}); read again: {again:?} bytes",
                        h.states.len() - 1,
                        older.map_or(String::new(), |v| format!(", it is version {v}")),
                        cells_matching(&h, &data),
                        now_utc(),
                        map.version
                    ))
                } else if floor > 0 && s.is_none() {
                    Some("single value missing".into())
                } else {
                    None
                }
            }
        };
        self.reads.fetch_add(1, Ordering::Relaxed);
        if let Some(p) = problem {
            self.wrong.lock().unwrap().push(format!("object {i}: {p}"));
        }
    }

    fn reader(self: &Arc<Self>, cont: peregrine::Container) {
        let mut n = 0u64;
        while !self.stop.load(Ordering::Relaxed) {
            n += 1;
            self.check(&cont, (n * 3) % OBJECTS);
        }
    }

    /// Every object reads as its last acknowledged version, exactly.
    fn verify_final(&self, cont: &peregrine::Container, how: &str) {
        for i in 0..OBJECTS {
            let obj = cont.object(oid(self.class, i)).unwrap();
            let want = self.hist[i as usize].lock().unwrap().last.clone();
            match obj.fetch_array(b"d", b"a", 0, self.span) {
                Ok(got) if got == want => {}
                Ok(_) => self.wrong.lock().unwrap().push(format!(
                    "{how}: object {i}: not its last acknowledged version"
                )),
                Err(e) => self
                    .wrong
                    .lock()
                    .unwrap()
                    .push(format!("{how}: object {i}: {e}")),
            }
        }
    }

    fn assert_clean(&self, what: &str) {
        let wrong = self.wrong.lock().unwrap();
        assert!(
            wrong.is_empty(),
            "{what}: {} wrong reads or failed writes (of {} writes, {} reads):\n{}",
            wrong.len(),
            self.writes.load(Ordering::Relaxed),
            self.reads.load(Ordering::Relaxed),
            wrong[..wrong.len().min(20)].join("\n")
        );
    }
}

/// (map version, targets not up-and-in) of pool "pool", and the sum of
/// `targets_out` over the members.
fn pool_out(c: &Cluster) -> (u64, u32, u32) {
    let mut m = c.mgmt();
    let Ok(p) =
        c.rt.block_on(m.pool_query(PoolQueryReq { id: "pool".into() }))
    else {
        return (0, u32::MAX, u32::MAX);
    };
    let p = p.into_inner();
    let members =
        c.rt.block_on(m.system_query(SystemQueryReq {}))
            .map(|r| r.into_inner().members.iter().map(|m| m.targets_out).sum())
            .unwrap_or(u32::MAX);
    (
        p.map_version,
        p.disabled_targets + p.reintegrating_targets,
        members,
    )
}

/// Wall-clock time as the engines' logs print it (seconds of the day, UTC).
fn now_utc() -> String {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap();
    let d = t.as_secs() % 86400;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        d / 3600,
        d / 60 % 60,
        d % 60,
        t.subsec_millis()
    )
}

/// The management service's pool map changes, from the logs (to tell what
/// a failure happened next to).
fn pool_map_events(c: &Cluster) -> String {
    c.logs()
        .lines()
        .filter(|l| l.contains("pool ") && (l.contains("rank") || l.contains("map version")))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Wait until every target is up and in again.
fn wait_reintegrated(c: &Cluster, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let (_, out, members) = pool_out(c);
        if out == 0 && members == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "targets still out after {within:?} ({out} in the pool, {members} by members); logs:\n{}",
            c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Start a writer and a reader on `class` objects.
fn start(c: &Cluster, w: &Arc<Workload>) -> Vec<std::thread::JoinHandle<()>> {
    let (wc, rc) = (c.container(), c.container());
    let (w1, w2) = (w.clone(), w.clone());
    vec![
        std::thread::spawn(move || w1.writer(wc)),
        std::thread::spawn(move || w2.reader(rc)),
    ]
}

/// Every object through every replica: each engine stopped in turn
/// (briefly: it is never excluded), the objects read, the engine restarted.
fn verify_each_missing(c: &mut Cluster, w: &Workload) {
    let cont = c.container();
    w.verify_final(&cont, "all engines up");
    for r in 0..c.engines.len() {
        c.engines[r].kill9();
        w.verify_final(&cont, &format!("rank {r} stopped"));
        c.restart(r);
    }
    wait_reintegrated(c, Duration::from_secs(60));
}

fn outage(class: ObjectClass, engines: u32, victim: usize, down: Duration) {
    let _serial = one_at_a_time();
    let mut c = Cluster::with_pool(
        ClusterSpec {
            engines,
            targets: 1,
            device_mib: 1024,
            scm_mib: 64,
        },
        640 * engines as u64,
        class.name(),
        "crc32c",
    );
    let w = Workload::new(class);
    let threads = start(&c, &w);
    std::thread::sleep(Duration::from_secs(2));
    let (v0, _, _) = pool_out(&c);
    c.engines[victim].kill9();
    std::thread::sleep(down);
    // (The management service is the victim's: nobody to ask.)
    let excluded = victim != 0 && pool_out(&c).1 > 0;
    c.restart(victim);
    wait_reintegrated(&c, Duration::from_secs(60));
    let (v1, _, _) = pool_out(&c);
    std::thread::sleep(Duration::from_secs(1));
    w.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    if down > Duration::from_secs(7) && victim != 0 {
        // Excluded, back as reintegrating, in again: three map versions.
        assert!(excluded, "rank {victim} was never excluded");
        assert!(v1 >= v0 + 3, "pool map version {v0} -> {v1}");
    }
    assert!(
        w.writes.load(Ordering::Relaxed) > 10,
        "the writer made no progress"
    );
    if !w.wrong.lock().unwrap().is_empty() {
        eprintln!("{}", pool_map_events(&c));
    }
    w.assert_clean(&format!("{class}, rank {victim} down {down:?}"));
    verify_each_missing(&mut c, &w);
    w.assert_clean(&format!("{class} after rank {victim} came back"));
    eprintln!(
        "{class}: rank {victim} down {down:?}: {} writes, {} reads, 0 wrong; map {v0} -> {v1}",
        w.writes.load(Ordering::Relaxed),
        w.reads.load(Ordering::Relaxed),
    );
}

#[test]
fn rp_2g1_engine_down_past_detection() {
    outage(ObjectClass::Rp2G1, 3, 2, LONG);
}

#[test]
fn rp_2g1_management_engine_down_briefly() {
    outage(ObjectClass::Rp2G1, 3, 0, SHORT);
}

#[test]
fn rp_3g1_engine_down_past_detection() {
    outage(ObjectClass::Rp3G1, 3, 1, LONG);
}

#[test]
fn rp_3g1_engine_down_briefly() {
    outage(ObjectClass::Rp3G1, 3, 2, SHORT);
}

#[test]
fn ec_4p2g1_engine_down_briefly() {
    outage(ObjectClass::Ec4P2G1, 6, 3, SHORT);
}

#[test]
fn ec_2p1g1_engine_down_past_detection() {
    outage(ObjectClass::Ec2P1G1, 3, 1, LONG);
}

#[test]
fn ec_2p1g1_engine_down_briefly() {
    outage(ObjectClass::Ec2P1G1, 3, 2, SHORT);
}

#[test]
fn ec_2p1g1_management_engine_down_past_detection() {
    outage(ObjectClass::Ec2P1G1, 3, 0, LONG);
}

#[test]
fn ec_4p2g1_engine_down_past_detection() {
    outage(ObjectClass::Ec4P2G1, 6, 4, LONG);
}

/// Updates that fail (the writer gives up after 1 s, while an engine is
/// dead but not yet excluded) take effect wholly or not at all: read back
/// at once (degraded) and after the return with each engine missing in turn.
fn failed_updates(class: ObjectClass, engines: u32) {
    let _serial = one_at_a_time();
    let mut c = Cluster::with_pool(
        ClusterSpec {
            engines,
            targets: 1,
            device_mib: 1024,
            scm_mib: 64,
        },
        640 * engines as u64,
        class.name(),
        "crc32c",
    );
    let w = Arc::new(Workload {
        tolerate_failures: true,
        ..Workload::build(class)
    });
    let wc = c.container();
    wc.pool().client().set_retry_window(Duration::from_secs(1));
    let (w1, w2) = (w.clone(), w.clone());
    let rc = c.container();
    let threads = vec![
        std::thread::spawn(move || w1.writer(wc)),
        std::thread::spawn(move || w2.reader(rc)),
    ];
    // An outage fails the updates made before the engine is excluded,
    // unless the writer spends that time waiting on something else (a
    // transaction its engine led, in doubt until then): a few tries.
    for _ in 0..3 {
        std::thread::sleep(Duration::from_secs(2));
        c.engines[1].kill9();
        std::thread::sleep(LONG);
        c.restart(1);
        wait_reintegrated(&c, Duration::from_secs(60));
        if w.failures.load(Ordering::Relaxed) > 0 {
            break;
        }
    }
    std::thread::sleep(Duration::from_secs(1));
    w.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let failed = w.failures.load(Ordering::Relaxed);
    w.assert_clean(&format!("{class}: {failed} failed updates"));
    assert!(
        failed > 0,
        "{class}: no update failed; the test tested nothing"
    );
    verify_each_missing(&mut c, &w);
    w.assert_clean(&format!("{class} after the return"));
    eprintln!(
        "{class}: {failed} failed updates, each wholly applied or not; {} writes, {} reads",
        w.writes.load(Ordering::Relaxed),
        w.reads.load(Ordering::Relaxed)
    );
}

#[test]
fn failed_rp_updates_are_all_or_nothing() {
    failed_updates(ObjectClass::Rp2G1, 3);
}

#[test]
fn failed_ec_updates_are_all_or_nothing() {
    failed_updates(ObjectClass::Ec2P1G1, 3);
}

/// A reader of an EC object never sees part of an update in flight: its
/// cells become visible together (one transaction), and a read of several
/// cells is fenced by the stripe's version.
#[test]
fn ec_reads_see_no_update_in_flight() {
    let _serial = one_at_a_time();
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 256,
            scm_mib: 64,
        },
        384,
        "EC_2P1G1",
        "crc32c",
    );
    let w = Workload::new(ObjectClass::Ec2P1G1);
    let threads = start(&c, &w);
    std::thread::sleep(Duration::from_secs(6));
    w.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    w.assert_clean("EC_2P1G1 under a writer");
}

/// What a rolling upgrade does: every engine in turn stopped, held down past
/// failure detection (so it is excluded and reintegrated; the management
/// service's own engine is not, nobody excludes it), restarted, and the
/// next one taken down only once it is back in every pool.
#[test]
fn rolling_restart_under_a_writer() {
    let _serial = one_at_a_time();
    let class = ObjectClass::Ec2P1G1;
    let mut c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 1024,
            scm_mib: 64,
        },
        1920,
        class.name(),
        "crc32c",
    );
    let w = Workload::new(class);
    let threads = start(&c, &w);
    for victim in [1, 2, 0] {
        std::thread::sleep(Duration::from_secs(1));
        c.engines[victim].kill9();
        std::thread::sleep(Duration::from_secs(7));
        c.restart(victim);
        wait_reintegrated(&c, Duration::from_secs(60));
    }
    std::thread::sleep(Duration::from_secs(1));
    w.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    if !w.wrong.lock().unwrap().is_empty() {
        eprintln!("{}", pool_map_events(&c));
    }
    w.assert_clean("rolling restart");
    verify_each_missing(&mut c, &w);
    w.assert_clean("rolling restart, each engine missing in turn");
}

/// An engine stopped cleanly (SIGTERM, as Kubernetes stops a pod) tells the
/// management service, which excludes it at once: updates go on degraded
/// within about a second instead of waiting out the 6 s heartbeat timeout.
#[test]
fn clean_stop_is_excluded_at_once() {
    let _serial = one_at_a_time();
    let class = ObjectClass::Rp2G1;
    let mut c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 1024,
            scm_mib: 64,
        },
        1920,
        class.name(),
        "crc32c",
    );
    let w = Workload::new(class);
    let threads = start(&c, &w);
    std::thread::sleep(Duration::from_secs(1));
    let (v0, _, _) = pool_out(&c);
    c.engines[2].stop();
    let stopped = Instant::now();
    while pool_out(&c).0 == v0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(3),
            "rank 2 not excluded within 3 s of its exit; events:\n{}",
            pool_map_events(&c)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let before = w.writes.load(Ordering::Relaxed);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        w.writes.load(Ordering::Relaxed) > before + 10,
        "updates did not go on degraded"
    );
    c.restart(2);
    wait_reintegrated(&c, Duration::from_secs(60));
    w.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    w.assert_clean("clean stop");
    verify_each_missing(&mut c, &w);
    w.assert_clean("clean stop, each engine missing in turn");
}

/// Directory entries are conditional inserts: one replica of each group
/// arbitrates. With an engine out, names whose first replica it held are
/// arbitrated by the next one: creates go on (a pod creating files while an
/// engine pod restarts), a name still wins once, and every name reads back
/// through each replica once the engine is back.
#[test]
fn conditional_inserts_go_on_while_a_replica_is_out() {
    let _serial = one_at_a_time();
    let mut c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 256,
            scm_mib: 64,
        },
        384,
        "RP_2G1",
        "crc32c",
    );
    let cont = c.container();
    let dir = cont.object(oid(ObjectClass::Rp2G1, 100)).unwrap();
    let (v0, _, _) = pool_out(&c);
    c.engines[2].stop();
    let stopped = Instant::now();
    while pool_out(&c).0 == v0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "rank 2 not excluded"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let names: Vec<Vec<u8>> = (0..32).map(|i| format!("file.{i}").into_bytes()).collect();
    for n in &names {
        dir.insert_single(n, b"inode", n).unwrap_or_else(|e| {
            panic!(
                "create {:?} with rank 2 out: {e}",
                String::from_utf8_lossy(n)
            )
        });
        let e = dir.insert_single(n, b"inode", b"again").unwrap_err();
        assert_eq!(e.code, -libc::EEXIST, "{e}");
    }
    c.restart(2);
    wait_reintegrated(&c, Duration::from_secs(60));
    // All up first: the client takes the current map while the management
    // service (rank 0) is there to give it.
    for n in &names {
        assert_eq!(
            dir.fetch_single(n, b"inode").unwrap().as_deref(),
            Some(&n[..])
        );
    }
    for r in 0..3 {
        c.engines[r].kill9();
        for n in &names {
            let got = dir.fetch_single(n, b"inode").unwrap();
            assert_eq!(got.as_deref(), Some(&n[..]), "rank {r} down");
        }
        c.restart(r);
    }
}

/// A returning engine is not sent again what it took before it went away.
/// The copy starts 90 s below the engine's last heartbeat, so it meets every
/// update of that span; written again at their epochs they took their space
/// a second time (one epoch's array extents are not merged before
/// aggregation, which waits for the copy), and a copy that failed and
/// started over took it once more each time. On a cluster, an engine pod
/// deleted a minute after 1 GiB was written filled its target that way:
/// writers got ENOSPC and the copy never ended.
#[test]
fn reintegration_writes_only_what_the_returning_engine_missed() {
    let _serial = one_at_a_time();
    let class = ObjectClass::Ec2P1G1;
    let mut c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 1024,
            scm_mib: 64,
        },
        1920,
        class.name(),
        "crc32c",
    );
    let cont = c.container();
    // Before the outage: 32 MiB in 1 MiB dkeys, as a file is stored. Every
    // object of a G1 class has a shard on each of the three targets.
    const MIB: usize = 1 << 20;
    let big = cont.object(ObjectId::new(class, 9, 1)).unwrap();
    let before = pattern(1, 32 * MIB);
    for (i, chunk) in before.chunks(MIB).enumerate() {
        big.update_array(format!("d{i}").as_bytes(), b"a", 0, chunk)
            .unwrap();
    }
    let (v0, _, _) = pool_out(&c);
    c.engines[2].stop();
    let stopped = Instant::now();
    while pool_out(&c).0 == v0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "rank 2 not excluded; events:\n{}",
            pool_map_events(&c)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // While it is away: 1 MiB it misses (512 KiB of cells on its target).
    let small = cont.object(ObjectId::new(class, 9, 2)).unwrap();
    let during = pattern(2, MIB);
    small.update_array(b"d0", b"a", 0, &during).unwrap();
    c.restart(2);
    wait_reintegrated(&c, Duration::from_secs(60));

    let logs = c.logs();
    let summary = logs
        .lines()
        .find(|l| l.contains("reintegrated in"))
        .unwrap_or_else(|| panic!("no reintegration summary in the logs:\n{logs}"));
    let number_before = |what: &str| -> u64 {
        let head = &summary[..summary
            .find(what)
            .unwrap_or_else(|| panic!("{what:?} not in {summary:?}"))];
        let digits = head.trim_end().rsplit(' ').next().unwrap_or("");
        digits
            .trim_start_matches('(')
            .parse()
            .unwrap_or_else(|_| panic!("no number before {what:?} in {summary:?}"))
    };
    let (bytes, held) = (number_before(" bytes"), number_before(" already held"));
    eprintln!("{summary}");
    assert!(
        bytes <= MIB as u64,
        "the copy wrote {bytes} bytes for 512 KiB missed: it wrote again what rank 2 held ({summary})"
    );
    assert!(held >= 32, "nothing counted as held already ({summary})");

    // All of it reads back, through each shard in turn (the handles opened
    // before: with rank 0 stopped there is no management service to ask).
    for r in [None, Some(0), Some(1), Some(2)] {
        if let Some(r) = r {
            c.engines[r].kill9();
        }
        for (i, chunk) in before.chunks(MIB).enumerate() {
            let got = big
                .fetch_array(format!("d{i}").as_bytes(), b"a", 0, MIB)
                .unwrap();
            assert!(got == chunk, "dkey d{i} differs with rank {r:?} stopped");
        }
        let got = small.fetch_array(b"d0", b"a", 0, MIB).unwrap();
        assert!(
            got == during,
            "the update made during the outage differs with rank {r:?} stopped"
        );
        if let Some(r) = r {
            c.restart(r);
            wait_reintegrated(&c, Duration::from_secs(60));
        }
    }
}

/// Three engines whose reintegration window is 10 s (an hour by default), so
/// that a test can outlast it; a pool of `class` on them.
fn short_window_cluster(class: ObjectClass) -> Cluster {
    let c = Cluster::start_configured(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 1024,
            scm_mib: 64,
        },
        "reintegration_window_s: 10\n",
    );
    c.format();
    c.create_pool(1920, class.name(), "crc32c");
    c
}

/// A rank stopped cleanly is excluded from when it was last heard of, not
/// from when the management service started: its word that it stops ends
/// its heartbeats, and counting from the service's start made the copy cover
/// everything since then, and once the service had run longer than the
/// reintegration window (10 s here, an hour by default) it wiped the rank
/// whole on its return: any engine pod deleted after the first hour.
#[test]
fn clean_stop_long_after_the_service_started_is_not_copied_whole() {
    let _serial = one_at_a_time();
    let class = ObjectClass::Ec2P1G1;
    let mut c = short_window_cluster(class);
    let cont = c.container();
    let obj = cont.object(ObjectId::new(class, 9, 3)).unwrap();
    let data = pattern(3, 1 << 20);
    obj.update_array(b"d0", b"a", 0, &data).unwrap();
    // Longer than the window since the service started.
    std::thread::sleep(Duration::from_secs(12));
    let (v0, _, _) = pool_out(&c);
    c.engines[2].stop();
    let stopped = Instant::now();
    while pool_out(&c).0 == v0 {
        assert!(
            stopped.elapsed() < Duration::from_secs(10),
            "rank 2 not excluded; events:\n{}",
            pool_map_events(&c)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Rounds of the pool watch, which marks a rank out past the window.
    std::thread::sleep(Duration::from_secs(2));
    c.restart(2);
    wait_reintegrated(&c, Duration::from_secs(60));
    let events = pool_map_events(&c);
    assert!(
        !events.contains("longer than the reintegration window") && !events.contains("wiped"),
        "rank 2, out for seconds, was copied whole:\n{events}"
    );
    // Read back with another engine away (a handle with the current map:
    // without rank 0 there is no service to refresh it from).
    let obj = c.container().object(ObjectId::new(class, 9, 3)).unwrap();
    c.engines[0].kill9();
    assert!(obj.fetch_array(b"d0", b"a", 0, 1 << 20).unwrap() == data);
}

/// An engine out longer than the reintegration window (10 s here; an
/// hour by default) no longer holds the others' aggregation back; when it
/// returns its pool shards are wiped and copied whole.
#[test]
fn engine_out_past_the_reintegration_window_is_copied_whole() {
    let _serial = one_at_a_time();
    let class = ObjectClass::Ec2P1G1;
    let mut c = short_window_cluster(class);
    let w = Workload::new(class);
    let threads = start(&c, &w);
    std::thread::sleep(Duration::from_secs(1));
    c.engines[1].kill9();
    // The margin (90 s) plus the window must pass; `since` is set 90 s
    // before the last heartbeat, so 10 s after it the window is over.
    std::thread::sleep(Duration::from_secs(14));
    c.restart(1);
    wait_reintegrated(&c, Duration::from_secs(90));
    std::thread::sleep(Duration::from_secs(1));
    w.stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let events = pool_map_events(&c);
    assert!(
        events.contains("longer than the reintegration window") && events.contains("wiped"),
        "rank 1 was not copied whole:\n{events}"
    );
    if !w.wrong.lock().unwrap().is_empty() {
        eprintln!("engine logs:\n{}", c.logs());
    }
    w.assert_clean("out past the reintegration window");
    verify_each_missing(&mut c, &w);
    w.assert_clean("out past the reintegration window, each engine missing in turn");
}

/// The long version, by hand: `PEREGRINE_RESTARTS=100 cargo test -p
/// peregrine-engine --test outage many_restarts -- --ignored --nocapture`.
/// Random victims (the management service's engine among them), down for
/// 1 to 9 s, RP_2G1 and EC_2P1G1 in turn.
#[test]
#[ignore = "long: minutes per ten restarts"]
fn many_restarts() {
    let _serial = one_at_a_time();
    let restarts: u64 = std::env::var("PEREGRINE_RESTARTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100);
    let mut seed = 0x5eed_u64;
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let started = Instant::now();
    let per_class = restarts.div_ceil(2);
    let mut done = 0;
    for class in [ObjectClass::Rp2G1, ObjectClass::Ec2P1G1] {
        let mut c = Cluster::with_pool(
            ClusterSpec {
                engines: 3,
                targets: 1,
                device_mib: 1024,
                scm_mib: 128,
            },
            1920,
            class.name(),
            "crc32c",
        );
        let w = Workload::new(class);
        let threads = start(&c, &w);
        for _ in 0..per_class.min(restarts - done) {
            let victim = (rand() % 3) as usize;
            let down = Duration::from_millis(1000 + rand() % 8000);
            c.engines[victim].kill9();
            std::thread::sleep(down);
            c.restart(victim);
            wait_reintegrated(&c, Duration::from_secs(120));
            done += 1;
            eprintln!(
                "restart {done}: {class} rank {victim} down {down:?}; {} writes, {} reads, {} wrong so far ({:?})",
                w.writes.load(Ordering::Relaxed),
                w.reads.load(Ordering::Relaxed),
                w.wrong.lock().unwrap().len(),
                started.elapsed()
            );
        }
        w.stop.store(true, Ordering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
        verify_each_missing(&mut c, &w);
        w.assert_clean(&format!("{class}: many restarts"));
    }
}

/// A client whose pool map is older than the system's reads on when the
/// other replica goes away. It learnt that rank 2 was excluded, then rank 2
/// came back and was reintegrated while the client sent nothing (so no
/// engine told it its map was old), then rank 1 died: by its map, the
/// object's only copies are unreachable or down. It asks for the map again
/// and reads the returned replica, instead of failing (a FUSE daemon
/// answered EIO there).
#[test]
fn a_reader_with_an_old_map_reads_the_replica_that_came_back() {
    let _serial = one_at_a_time();
    let mut c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 256,
            scm_mib: 64,
        },
        384,
        "RP_2G1",
        "crc32c",
    );
    let cont = c.container();
    let full = cont.pool().map();
    let ranks = |i: u64| -> Vec<u32> {
        let l = peregrine::placement::layout(&full, oid(ObjectClass::Rp2G1, i), ObjectClass::Rp2G1)
            .unwrap();
        let mut r: Vec<u32> = l[0]
            .shards
            .iter()
            .map(|s| full.targets[s.target].rank)
            .collect();
        r.sort_unstable();
        r
    };
    let i = (0..1000)
        .find(|&i| ranks(i) == [1, 2])
        .expect("an object on ranks 1 and 2");
    let obj = cont.object(oid(ObjectClass::Rp2G1, i)).unwrap();
    obj.update_single(b"d", b"a", b"before").unwrap();

    let (v0, _, _) = pool_out(&c);
    c.engines[2].kill9();
    let killed = Instant::now();
    while !matches!(pool_out(&c), (v, out, _) if v > v0 && out > 0 && out != u32::MAX) {
        assert!(
            killed.elapsed() < Duration::from_secs(30),
            "rank 2 not excluded"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = cont.pool().refresh().unwrap();
    assert!(out.version > v0, "the client has the map without rank 2");
    obj.update_single(b"d", b"a", b"during").unwrap();

    c.restart(2);
    wait_reintegrated(&c, Duration::from_secs(60));
    assert_eq!(
        cont.pool().map().version,
        out.version,
        "the client asked nothing meanwhile"
    );
    c.engines[1].kill9();
    let got = obj
        .fetch_single(b"d", b"a")
        .unwrap_or_else(|e| panic!("read with rank 1 down and an old map: {e}"));
    assert_eq!(got.as_deref(), Some(&b"during"[..]));
    assert!(
        cont.pool().map().version > out.version,
        "the read took the new map"
    );
}
