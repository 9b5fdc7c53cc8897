//! Crash test: a child process (this test binary re-executed with
//! `VOS_CRASH_DEV` set) writes a storm of updates from several threads and
//! prints one `ACK` line per acknowledged update; the parent SIGKILLs it at a
//! random moment, reopens the device and checks that every acknowledged update
//! is readable and intact, and that nothing present is torn. Eight rounds
//! with the WAL in the page cache (a device file's default), four with it
//! written O_DIRECT, four on a host file system that cannot reserve blocks.

mod common;

use common::*;
use peregrine_vos::*;
use rand::Rng;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use uuid::Uuid;

const THREADS: u64 = 4;

/// The WAL mode the child runs with, named in `VOS_CRASH_WAL`.
fn wal_name(wal: WalIo) -> &'static str {
    match wal {
        WalIo::Direct => "direct",
        WalIo::PageCache => "page_cache",
    }
}

/// What update `n` of thread `th` in round `round` writes: (akey, is_array, offset, bytes).
fn values(round: u64, th: u64, n: u64) -> Vec<(&'static str, bool, u64, Vec<u8>)> {
    let seed = (round << 40) | (th << 32) | n;
    match n % 4 {
        // Two akeys in one update: a large and a small value, atomically.
        0 => vec![
            (
                "a",
                false,
                0,
                pattern(seed, 4096 + (n as usize * 37) % 20_000),
            ),
            ("b", false, 0, pattern(seed ^ 1, 1 + n as usize % 3000)),
        ],
        1 => vec![("a", false, 0, pattern(seed, 1 + n as usize % 3000))],
        2 => vec![(
            "x",
            true,
            (n * 13) % 5000,
            pattern(seed, 5000 + n as usize % 3000),
        )],
        _ => vec![("x", true, n % 100, pattern(seed, 200))],
    }
}

fn obj(pool: Uuid, cont: Uuid, th: u64) -> Obj {
    Obj::new(pool, cont, th, (th % 2) as u32)
}

fn dkey(round: u64, n: u64) -> String {
    format!("r{round}-n{n:06}")
}

/// Check that update (round, th, n) is fully present (`Ok(true)`), fully absent
/// (`Ok(false)`) or torn/corrupt (`Err`).
fn check(
    st: &Storage,
    pool: Uuid,
    cont: Uuid,
    round: u64,
    th: u64,
    n: u64,
) -> Result<bool, String> {
    let o = obj(pool, cont, th);
    let dk = dkey(round, n);
    let mut present = Vec::new();
    for (akey, is_array, off, want) in values(round, th, n) {
        if is_array {
            let (got, size) = get_array(st, &o, u64::MAX, &dk, akey, off, want.len() as u64)
                .map_err(|s| format!("{dk}/{akey}: status {s}"))?;
            if size == 0 {
                present.push(false);
            } else if got == want && size == off + want.len() as u64 {
                present.push(true);
            } else {
                return Err(format!("{dk}/{akey}: array torn or wrong (size {size})"));
            }
        } else {
            match get_single(st, &o, u64::MAX, &dk, akey) {
                Err(s) if s == -libc::ENOENT => present.push(false),
                Err(s) => return Err(format!("{dk}/{akey}: status {s}")),
                Ok(got) if got == want => present.push(true),
                Ok(got) => return Err(format!("{dk}/{akey}: wrong value of {} bytes", got.len())),
            }
        }
    }
    if present.iter().all(|&p| p) {
        Ok(true)
    } else if present.iter().all(|&p| !p) {
        Ok(false)
    } else {
        Err(format!("{dk}: update partially applied {present:?}"))
    }
}

/// The child: runs only when re-executed by [`crash_rounds`].
#[test]
fn crash_child() {
    let Ok(dev) = std::env::var("VOS_CRASH_DEV") else {
        return;
    };
    let pool: Uuid = std::env::var("VOS_CRASH_POOL").unwrap().parse().unwrap();
    let cont: Uuid = std::env::var("VOS_CRASH_CONT").unwrap().parse().unwrap();
    let round: u64 = std::env::var("VOS_CRASH_ROUND").unwrap().parse().unwrap();
    let wal = std::env::var("VOS_CRASH_WAL").unwrap();
    let wal = [WalIo::Direct, WalIo::PageCache]
        .into_iter()
        .find(|w| wal_name(*w) == wal)
        .unwrap();
    let st = Storage::open(&StorageOptions {
        wal_io: wal,
        ..options(dev.as_ref(), 256, 2)
    })
    .unwrap();
    println!("READY");
    std::thread::scope(|s| {
        for th in 0..THREADS {
            let st = &st;
            s.spawn(move || {
                let o = obj(pool, cont, th);
                for n in 0.. {
                    let vals = values(round, th, n)
                        .into_iter()
                        .map(|(akey, is_array, off, v)| {
                            if is_array {
                                extent(akey, off, &v)
                            } else {
                                single(akey, &v)
                            }
                        })
                        .collect();
                    match update(st, &o, 1 + round * 1_000_000 + n, &dkey(round, n), vals) {
                        Ok(()) => println!("ACK {round} {th} {n}"),
                        // The storm writes until it is killed: how much fits
                        // before that depends on the machine's speed. A full
                        // pool ends this thread's storm with a clear error.
                        Err(e) if e.code == -libc::ENOSPC => {
                            println!("FULL {round} {th} {n} {e}");
                            return;
                        }
                        Err(e) => {
                            println!("ERR {round} {th} {n} {e}");
                            return;
                        }
                    }
                }
            });
        }
    });
}

#[test]
fn crash_after_kill_keeps_acknowledged_updates() {
    let dir = tempfile::tempdir().unwrap();
    let used = crash_rounds(dir.path(), WalIo::PageCache, 8);
    assert_eq!(used, WalIo::PageCache);
}

#[test]
fn crash_after_kill_keeps_acknowledged_updates_with_a_direct_wal() {
    let dir = tempfile::tempdir().unwrap();
    let used = crash_rounds(dir.path(), WalIo::Direct, 4);
    assert_eq!(used, WalIo::Direct);
}

/// A host file system that cannot reserve the WAL's blocks: the storage
/// asked for the page cache writes the WAL O_DIRECT instead (a record the
/// kernel held in a hole it could not fill would be lost at writeback), and
/// keeps every acknowledged update through kill -9.
#[test]
fn crash_after_kill_keeps_acknowledged_updates_on_a_host_that_cannot_reserve_blocks() {
    let Some(host) = ext2_host(400) else {
        return;
    };
    let used = crash_rounds(host.path(), WalIo::PageCache, 4);
    assert_eq!(used, WalIo::Direct, "fallocate fails on ext2");
}

/// `rounds` rounds of a storm killed at a random moment, on a device file
/// in `host`, the storage opened with `wal` in the child and in the
/// checks. Returns how the storage wrote its WAL.
fn crash_rounds(host: &std::path::Path, wal: WalIo, rounds: u64) -> WalIo {
    let path = host.join("crash.img");
    let opts = StorageOptions {
        wal_io: wal,
        ..options(&path, 256, 2)
    };
    format(&opts, "crash", 0, false).unwrap();
    let (pool, cont) = (Uuid::new_v4(), Uuid::new_v4());
    let st = Storage::open(&opts).unwrap();
    st.pool_create(pool, 7 * MIB, 64 * MIB).unwrap();
    let used = st.wal_io();
    st.close();
    let exe = std::env::current_exe().unwrap();
    let mut rng = rand::thread_rng();
    let mut acked: Vec<(u64, u64, u64)> = Vec::new();
    for round in 0..rounds {
        let mut child = Command::new(&exe)
            .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
            .env("VOS_CRASH_DEV", &path)
            .env("VOS_CRASH_POOL", pool.to_string())
            .env("VOS_CRASH_CONT", cont.to_string())
            .env("VOS_CRASH_ROUND", round.to_string())
            .env("VOS_CRASH_WAL", wal_name(wal))
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(host.join("child.err")).unwrap())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut lines = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let Ok(l) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
                let err = std::fs::read_to_string(host.join("child.err")).unwrap_or_default();
                panic!("round {round}: child never got READY: {lines:?}\n{err}");
            };
            let ready = l.ends_with("READY"); // the harness may prefix "test crash_child ... "
            lines.push(l);
            if ready {
                break;
            }
        }
        std::thread::sleep(Duration::from_millis(rng.gen_range(50..500)));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        reader.join().unwrap();
        lines.extend(rx.try_iter());
        let errors: Vec<_> = lines.iter().filter(|l| l.starts_with("ERR")).collect();
        assert!(errors.is_empty(), "child failed: {errors:?}");
        let before = acked.len();
        for l in &lines {
            let f: Vec<&str> = l.split_whitespace().collect();
            if f.len() == 4 && f[0] == "ACK" {
                acked.push((
                    f[1].parse().unwrap(),
                    f[2].parse().unwrap(),
                    f[3].parse().unwrap(),
                ));
            }
        }
        let st = Storage::open(&opts).unwrap();
        for &(r, th, n) in &acked {
            assert_eq!(
                check(&st, pool, cont, r, th, n),
                Ok(true),
                "acknowledged update ({r}, {th}, {n}) lost"
            );
        }
        // Whatever is present beyond the acknowledged updates is intact too.
        let mut present = 0;
        for th in 0..THREADS {
            for k in list_all(&st, &obj(pool, cont, th), u64::MAX, "", 1000) {
                let k = String::from_utf8(k).unwrap();
                let (r, n) = k[1..].split_once("-n").unwrap();
                let (r, n) = (r.parse().unwrap(), n.parse().unwrap());
                assert_eq!(check(&st, pool, cont, r, th, n), Ok(true), "{k}");
                present += 1;
            }
        }
        assert!(present >= acked.len());
        eprintln!(
            "round {round}: {} acknowledged, {present} present after kill",
            acked.len() - before
        );
        st.close();
    }
    assert!(
        acked.len() > 100,
        "the storm acknowledged only {} updates",
        acked.len()
    );
    used
}
