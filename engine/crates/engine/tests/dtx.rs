//! Transactions whose client stopped driving them, and whose leader or
//! participant was killed in the middle: real engines settle them, and every
//! replica then reads the same, decided, value.
//!
//! The client's side is played by hand here (prepares and decisions sent
//! to each shard as the client library would, then "the client dies"), so
//! each test stops the protocol exactly where it wants.

mod common;
use common::*;
use peregrine::placement::{self, PoolMap, ShardLoc};
use peregrine_proto::data::{self, Dtx, DtxId, DtxShard, ValueKind};
use peregrine_proto::frame::Opcode;
use peregrine_proto::{ObjectClass, ObjectId, EPOCH_LATEST};
use prost::Message;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One engine set at a time: these tests kill engines and measure waits.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

const DKEY: &[u8] = b"d";
const AKEY: &[u8] = b"a";

struct Setup {
    c: Cluster,
    cont: peregrine::Container,
    oid: ObjectId,
}

/// Three engines, an RP_3G1 object (a replica on each) holding "v1".
fn setup() -> Setup {
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 1,
            device_mib: 256,
            scm_mib: 64,
        },
        384,
        "RP_3G1",
        "crc32c",
    );
    let cont = c.container();
    let oid = ObjectId::new(ObjectClass::Rp3G1, 7, 1);
    cont.object(oid)
        .unwrap()
        .update_single(DKEY, AKEY, b"v1")
        .unwrap();
    Setup { c, cont, oid }
}

impl Setup {
    fn map(&self) -> std::sync::Arc<PoolMap> {
        self.cont.pool().refresh().unwrap()
    }

    fn shards(&self) -> Vec<ShardLoc> {
        let map = self.map();
        placement::place(&map, self.oid, ObjectClass::Rp3G1, DKEY)
            .unwrap()
            .shards
    }

    fn rank_of(&self, loc: &ShardLoc) -> u32 {
        self.map().targets[loc.target].rank
    }

    fn addr(&self, map: &PoolMap, loc: &ShardLoc) -> data::Address {
        data::Address {
            pool: map.uuid.as_bytes().to_vec(),
            cont: self.cont.uuid().as_bytes().to_vec(),
            oid: Some(data::ObjectId {
                hi: self.oid.hi,
                lo: self.oid.lo,
            }),
            shard: loc.shard,
            target: map.targets[loc.target].index,
            map_version: map.version,
            handle: self.cont.handle().to_vec(),
        }
    }

    /// Send one request to one shard; the reply's status and body.
    fn call(
        &self,
        loc: &ShardLoc,
        op: Opcode,
        msg: &impl Message,
        bulk: &[&[u8]],
    ) -> data::Response {
        let map = self.map();
        let t = &map.targets[loc.target];
        let client = self.cont.pool().client();
        let r = client
            .transport()
            .call(&t.addr, t.index, op, &msg.encode_to_vec(), bulk)
            .unwrap_or_else(|e| panic!("{op:?} to rank {}: {e}", t.rank));
        data::Response::decode(r.msg.as_slice()).unwrap()
    }

    fn new_dtx(&self, shards: &[ShardLoc]) -> Dtx {
        let map = self.map();
        let (hi, lo) = uuid::Uuid::new_v4().as_u64_pair();
        Dtx {
            id: Some(DtxId { hi, lo }),
            shards: shards
                .iter()
                .map(|l| DtxShard {
                    rank: map.targets[l.target].rank,
                    target: map.targets[l.target].index,
                })
                .collect(),
        }
    }

    /// Prepare "v2" on every shard, as the client library does first.
    fn prepare_all(&self, dtx: &Dtx) {
        self.prepare_on(dtx, &self.shards());
    }

    /// Prepare "v2" on `locs` only (the client died before the others).
    fn prepare_on(&self, dtx: &Dtx, locs: &[ShardLoc]) {
        let map = self.map();
        let epoch = peregrine::hlc::now();
        for loc in locs {
            let req = data::UpdateReq {
                addr: Some(self.addr(&map, loc)),
                epoch,
                dkey: DKEY.to_vec(),
                iods: vec![data::Iod {
                    akey: AKEY.to_vec(),
                    kind: ValueKind::Single as i32,
                    len: 2,
                    ..Default::default()
                }],
                dtx: Some(dtx.clone()),
                ..Default::default()
            };
            let r = self.call(loc, Opcode::Update, &req, &[b"v2"]);
            assert_eq!(status(&r), 0, "prepare: {r:?}");
        }
    }

    fn decide(&self, loc: &ShardLoc, dtx: &Dtx, commit: bool, leader: bool) -> data::Response {
        let map = self.map();
        let req = data::DtxDecideReq {
            addr: Some(self.addr(&map, loc)),
            ids: vec![dtx.id.unwrap()],
            commit,
            leader,
        };
        self.call(loc, Opcode::DtxDecide, &req, &[])
    }

    /// The value one replica serves: Ok(bytes) or Err(status).
    fn read_replica(&self, loc: &ShardLoc) -> Result<Vec<u8>, i32> {
        let map = self.map();
        let req = data::FetchReq {
            addr: Some(self.addr(&map, loc)),
            epoch: EPOCH_LATEST,
            dkey: DKEY.to_vec(),
            iods: vec![data::Iod {
                akey: AKEY.to_vec(),
                kind: ValueKind::Single as i32,
                ..Default::default()
            }],
        };
        let map = self.map();
        let t = &map.targets[loc.target];
        let client = self.cont.pool().client();
        let r = client
            .transport()
            .call(&t.addr, t.index, Opcode::Fetch, &req.encode_to_vec(), &[])
            .map_err(|e| e.code)?;
        let resp = data::Response::decode(r.msg.as_slice()).unwrap();
        match status(&resp) {
            0 => Ok(r.bulk),
            c => Err(c),
        }
    }

    /// Wait until every replica in `locs` serves `want`; panics after `within`.
    fn expect_everywhere(&self, locs: &[ShardLoc], want: &[u8], within: Duration) -> Duration {
        let t0 = Instant::now();
        loop {
            let got: Vec<_> = locs.iter().map(|l| self.read_replica(l)).collect();
            if got.iter().all(|g| g.as_deref() == Ok(want)) {
                return t0.elapsed();
            }
            // Never the other value: only "in progress" or the decided one.
            for (l, g) in locs.iter().zip(&got) {
                if let Ok(v) = g {
                    assert_eq!(
                        v.as_slice(),
                        want,
                        "rank {} serves {:?} while the transaction's outcome is {:?}",
                        self.rank_of(l),
                        String::from_utf8_lossy(v),
                        String::from_utf8_lossy(want)
                    );
                }
            }
            assert!(
                t0.elapsed() < within,
                "replicas not settled to {:?} within {within:?}: {got:?}\n{}",
                String::from_utf8_lossy(want),
                self.c.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// The client library's read of the object.
    fn read(&self) -> Vec<u8> {
        self.cont
            .object(self.oid)
            .unwrap()
            .fetch_single(DKEY, AKEY)
            .unwrap()
            .unwrap()
    }
}

fn status(r: &data::Response) -> i32 {
    r.status.as_ref().map_or(0, |s| s.code)
}

/// The client library's way: acknowledged once every shard prepared, the
/// commits sent in the background; a reader in the same process sees the
/// update at once, and every replica serves it well before the engines
/// would have settled it themselves.
#[test]
fn the_client_commits_in_the_background() {
    let _serial = one_at_a_time();
    let s = setup();
    let obj = s.cont.object(s.oid).unwrap();
    obj.update_single(DKEY, AKEY, b"v2").unwrap();
    assert_eq!(s.read(), b"v2");
    let t = s.expect_everywhere(&s.shards(), b"v2", Duration::from_secs(15));
    assert!(
        t < Duration::from_millis(peregrine_vos::DTX_STALE_MS / 2),
        "replicas applied the commit after {t:?}: the engines settled it, the client did not send it"
    );
}

/// Prepared everywhere, then the client died: every shard prepared, so it
/// may have been acknowledged: the engines commit it.
#[test]
fn a_transaction_prepared_everywhere_is_committed_when_its_client_dies() {
    let _serial = one_at_a_time();
    let s = setup();
    let shards = s.shards();
    let dtx = s.new_dtx(&shards);
    s.prepare_all(&dtx);
    for l in &shards {
        assert_eq!(
            s.read_replica(l),
            Err(-libc::EINPROGRESS),
            "a prepared update is neither visible nor hidden"
        );
    }
    let t = s.expect_everywhere(&shards, b"v2", Duration::from_secs(30));
    assert!(
        t >= Duration::from_millis(peregrine_vos::DTX_STALE_MS - 500),
        "settled after {t:?}: before the client could have been given up on"
    );
    assert_eq!(s.read(), b"v2");
}

/// Prepared on some shards only, then the client died: it cannot have been
/// acknowledged; the engines abort it, and a prepare still on its way to a
/// shard that never saw it is refused.
#[test]
fn a_transaction_prepared_on_some_shards_is_aborted_when_its_client_dies() {
    let _serial = one_at_a_time();
    let s = setup();
    let shards = s.shards();
    // Missing on a participant; then missing on the leader.
    for missing in [2, 0] {
        let dtx = s.new_dtx(&shards);
        let some: Vec<ShardLoc> = (0..3)
            .filter(|&i| i != missing)
            .map(|i| shards[i])
            .collect();
        s.prepare_on(&dtx, &some);
        s.expect_everywhere(&shards, b"v1", Duration::from_secs(30));
        assert_eq!(s.read(), b"v1");
        let map = s.map();
        let late = data::UpdateReq {
            addr: Some(s.addr(&map, &shards[missing])),
            epoch: peregrine::hlc::now(),
            dkey: DKEY.to_vec(),
            iods: vec![data::Iod {
                akey: AKEY.to_vec(),
                kind: ValueKind::Single as i32,
                len: 2,
                ..Default::default()
            }],
            dtx: Some(dtx.clone()),
            ..Default::default()
        };
        let r = s.call(&shards[missing], Opcode::Update, &late, &[b"v3"]);
        assert_eq!(status(&r), -libc::ECANCELED, "late prepare: {r:?}");
    }
}

/// Committed at the leader only (the client died right after): the other
/// replicas ask the leader and apply it.
#[test]
fn a_commit_only_the_leader_heard_reaches_every_replica() {
    let _serial = one_at_a_time();
    let s = setup();
    let shards = s.shards();
    let dtx = s.new_dtx(&shards);
    s.prepare_all(&dtx);
    let r = s.decide(&shards[0], &dtx, true, true);
    assert_eq!(status(&r), 0, "{r:?}");
    assert_eq!(s.read_replica(&shards[0]), Ok(b"v2".to_vec()));
    s.expect_everywhere(&shards, b"v2", Duration::from_secs(15));
    assert_eq!(s.read(), b"v2");
}

/// The leader is killed after it committed, before the others heard, and
/// stays down: once the pool map counts it out, the first live replica
/// decides for it (every live one holds it prepared: commit), and after the
/// leader returns and is reintegrated all three serve the new value.
#[test]
fn a_leader_killed_after_its_commit_is_replaced() {
    let _serial = one_at_a_time();
    let mut s = setup();
    let shards = s.shards();
    let dtx = s.new_dtx(&shards);
    s.prepare_all(&dtx);
    let r = s.decide(&shards[0], &dtx, true, true);
    assert_eq!(status(&r), 0, "{r:?}");
    let leader = s.rank_of(&shards[0]) as usize;
    s.c.engines[leader].kill9();
    s.expect_everywhere(&shards[1..], b"v2", Duration::from_secs(30));
    s.c.restart(leader);
    wait_all_up_in(&s, Duration::from_secs(60));
    s.expect_everywhere(&shards, b"v2", Duration::from_secs(30));
}

/// The leader is killed after every shard prepared (the client may have
/// acknowledged it) and comes back at once: it still holds the transaction
/// (its log), settles it, committed, and so do the others.
#[test]
fn a_leader_killed_after_every_prepare_commits_after_its_return() {
    let _serial = one_at_a_time();
    let mut s = setup();
    let shards = s.shards();
    let dtx = s.new_dtx(&shards);
    s.prepare_all(&dtx);
    let leader = s.rank_of(&shards[0]) as usize;
    s.c.engines[leader].kill9();
    std::thread::sleep(Duration::from_secs(1));
    s.c.restart(leader);
    wait_all_up_in(&s, Duration::from_secs(60));
    s.expect_everywhere(&shards, b"v2", Duration::from_secs(30));
}

/// The leader is killed, and stays down, with one shard never prepared:
/// once the pool map counts it out, the first live shard settles it, finds
/// the unprepared one and aborts.
#[test]
fn a_leader_kept_down_with_a_shard_unprepared_is_replaced_and_aborts() {
    let _serial = one_at_a_time();
    let mut s = setup();
    let shards = s.shards();
    let dtx = s.new_dtx(&shards);
    s.prepare_on(&dtx, &shards[..2]);
    let leader = s.rank_of(&shards[0]) as usize;
    s.c.engines[leader].kill9();
    s.expect_everywhere(&shards[1..], b"v1", Duration::from_secs(30));
}

/// A participant is killed after it prepared; the client commits (leader,
/// then the live participant) and dies. The participant comes back with
/// the transaction still prepared in its log, asks the leader and applies it.
#[test]
fn a_participant_killed_after_its_prepare_applies_the_commit_on_return() {
    let _serial = one_at_a_time();
    let mut s = setup();
    let shards = s.shards();
    let dtx = s.new_dtx(&shards);
    s.prepare_all(&dtx);
    let victim = s.rank_of(&shards[2]) as usize;
    s.c.engines[victim].kill9();
    assert_eq!(status(&s.decide(&shards[0], &dtx, true, true)), 0);
    assert_eq!(status(&s.decide(&shards[1], &dtx, true, false)), 0);
    std::thread::sleep(Duration::from_secs(1));
    s.c.restart(victim);
    wait_all_up_in(&s, Duration::from_secs(60));
    s.expect_everywhere(&shards, b"v2", Duration::from_secs(30));
}

/// Every rank up and in the pool (none down or being reintegrated).
fn wait_all_up_in(s: &Setup, within: Duration) {
    let t0 = Instant::now();
    loop {
        let map = s.map();
        if map.targets.iter().all(|t| t.readable) {
            return;
        }
        assert!(
            t0.elapsed() < within,
            "pool not back to all up-and-in within {within:?}:\n{}",
            s.c.logs()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Changes of two objects in one transaction (what a rename does): applied
/// together; and when a shard of one of them cannot prepare (its engine is
/// dead), neither, even where the other's shards had prepared.
#[test]
fn a_transaction_over_two_objects_applies_both_or_neither() {
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
    let a = cont
        .object(ObjectId::new(ObjectClass::Rp2G1, 7, 1))
        .unwrap();
    let map = cont.pool().refresh().unwrap();
    let ranks = |o: ObjectId| -> Vec<u32> {
        placement::place(&map, o, ObjectClass::Rp2G1, b"x")
            .unwrap()
            .shards
            .iter()
            .map(|l| map.targets[l.target].rank)
            .collect()
    };
    // An object b whose replicas are not all where a's are (one group per
    // object: every dkey of an object has the same replicas).
    let ra = ranks(a.id());
    let (b, victim) = (2..64)
        .map(|i| ObjectId::new(ObjectClass::Rp2G1, 7, i))
        .find_map(|o| {
            let rb = ranks(o);
            ra.iter().find(|r| !rb.contains(r)).map(|&v| (o, v))
        })
        .expect("some object is placed apart from a");
    let b = cont.object(b).unwrap();
    let ybkey = b"y".to_vec();
    a.update_single(b"x", b"v", b"old-a").unwrap();
    b.update_single(&ybkey, b"v", b"old-b").unwrap();

    let mut tx = cont.transaction();
    tx.update_single(&a, b"x", b"v", b"new-a")
        .update_single(&b, &ybkey, b"v", b"new-b");
    tx.commit().unwrap();
    assert_eq!(a.fetch_single(b"x", b"v").unwrap().unwrap(), b"new-a");
    assert_eq!(b.fetch_single(&ybkey, b"v").unwrap().unwrap(), b"new-b");

    // The victim holds a replica of a's dkey only: b's shards prepare, a's
    // cannot; the transaction fails and neither change stays.
    cont.pool()
        .client()
        .set_retry_window(Duration::from_secs(1));
    c.engines[victim as usize].kill9();
    let mut tx = cont.transaction();
    tx.update_single(&a, b"x", b"v", b"lost-a")
        .update_single(&b, &ybkey, b"v", b"lost-b");
    let err = tx.commit().unwrap_err();
    eprintln!("commit with rank {victim} dead: {err}");
    c.restart(victim as usize);
    let cont = c.container();
    let (a, b) = (cont.object(a.id()).unwrap(), cont.object(b.id()).unwrap());
    assert_eq!(a.fetch_single(b"x", b"v").unwrap().unwrap(), b"new-a");
    assert_eq!(b.fetch_single(&ybkey, b"v").unwrap().unwrap(), b"new-b");
    // Through every replica of b's dkey too.
    let map = cont.pool().refresh().unwrap();
    for l in placement::place(&map, b.id(), ObjectClass::Rp2G1, &ybkey)
        .unwrap()
        .shards
    {
        let r = map.targets[l.target].rank as usize;
        c.engines[r].kill9();
        assert_eq!(
            b.fetch_single(&ybkey, b"v").unwrap().unwrap(),
            b"new-b",
            "with rank {r} stopped"
        );
        c.restart(r);
    }
}
