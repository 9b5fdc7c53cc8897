//! The POSIX layer against real engines: mounts racing on one name
//! (exclusive creates, renames of one entry).

mod common;

use common::*;
use peregrine_dfs::*;
use peregrine_proto::mgmt::ContCreateReq;

/// Two mounts (two clients, as two FUSE daemons on two nodes) racing to
/// create the same names: the conditional insert lets exactly one win each.
#[test]
fn exclusive_creates_race_across_mounts() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let c = cluster(2);
    let mut m = c.mgmt();
    // Replicated directories: the insert is arbitrated by the first shard.
    c.rt.block_on(m.cont_create(ContCreateReq {
        pool: "pool".into(),
        label: "race".into(),
        oclass: "SX".into(),
        dir_oclass: "RP_2G1".into(),
        ..Default::default()
    }))
    .unwrap();
    let a = mount(&c, "race", false);
    let b = mount(&c, "race", false);
    for dir in [false, true] {
        let names: Vec<Vec<u8>> = (0..200)
            .map(|i| format!("{}{i:03}", if dir { "d" } else { "f" }).into_bytes())
            .collect();
        let (wins, lost) = (AtomicUsize::new(0), AtomicUsize::new(0));
        std::thread::scope(|s| {
            for fs in [&a, &a, &b, &b] {
                let (names, wins, lost) = (&names, &wins, &lost);
                s.spawn(move || {
                    let root = fs.root();
                    for n in names {
                        let r = if dir {
                            fs.mkdir(&root, n, 0o755, 0, 0).map(|_| ())
                        } else {
                            fs.create(&root, n, 0o644, 0, 0, true).map(|_| ())
                        };
                        match r {
                            Ok(()) => wins.fetch_add(1, Ordering::Relaxed),
                            Err(e) if e.code == -libc::EEXIST => {
                                lost.fetch_add(1, Ordering::Relaxed)
                            }
                            Err(e) => panic!("{:?}: {e}", String::from_utf8_lossy(n)),
                        };
                    }
                });
            }
        });
        let what = if dir { "mkdir" } else { "create" };
        assert_eq!(wins.into_inner(), 200, "{what}: each name created once");
        assert_eq!(lost.into_inner(), 600, "{what}: the losers get EEXIST");
        // Four threads on two mounts counted every subdirectory once.
        let want = if dir { 202 } else { 2 };
        assert_eq!(a.getattr(&a.root()).unwrap().1.nlink, want, "{what}");
        assert_eq!(b.getattr(&b.root()).unwrap().1.nlink, want, "{what}");
        for n in &names {
            let (x, y) = (
                a.lookup(&a.root(), n).unwrap(),
                b.lookup(&b.root(), n).unwrap(),
            );
            assert_eq!(x.entry, y.entry, "both mounts see the one winner");
            assert_eq!(x.is_dir(), dir);
        }
    }
    // Without O_EXCL, a create of a taken name opens it; RENAME_NOREPLACE
    // onto a taken name fails and leaves both.
    let (f, created) = b.create(&b.root(), b"f000", 0o644, 0, 0, false).unwrap();
    assert!(!created);
    assert_eq!(f.entry, a.lookup(&a.root(), b"f000").unwrap().entry);
    assert_eq!(
        code(a.rename(&a.root(), b"f001", &a.root(), b"f002", RENAME_NOREPLACE)),
        libc::EEXIST
    );
    a.rename(&a.root(), b"f001", &a.root(), b"g001", RENAME_NOREPLACE)
        .unwrap();
    assert_eq!(code(b.lookup(&b.root(), b"f001")), libc::ENOENT);
    b.lookup(&b.root(), b"g001").unwrap();
    assert_eq!(
        code(b.symlink(&b.root(), b"g001", b"/x", 0, 0)),
        libc::EEXIST
    );
}

/// Two clients renaming one entry at the same moment: one rename wins, the
/// other fails (ENOENT once it reads again after the winner's commit, or
/// EBUSY if it kept losing for the retry window), and the object has
/// exactly one name.
#[test]
fn concurrent_renames_of_one_entry_leave_one_name() {
    let c = cluster(1);
    let (a, b) = (mount(&c, "cont", false), mount(&c, "cont", false));
    let root = a.root();
    let d = a.mkdir(&root, b"race", 0o755, 0, 0).unwrap();
    for i in 0..60 {
        let (src, _) = a.create(&d, b"src", 0o644, 0, 0, true).unwrap();
        let barrier = std::sync::Barrier::new(2);
        let (d, barrier) = (&d, &barrier);
        let go = move |tag: &'static str, who: &Dfs| {
            barrier.wait();
            who.rename(d, b"src", d, format!("{tag}{i}").as_bytes(), 0)
        };
        let (ra, rb) = std::thread::scope(|s| {
            let ha = s.spawn(|| go("a", &a));
            let hb = s.spawn(|| go("b", &b));
            (ha.join().unwrap(), hb.join().unwrap())
        });
        for r in [&ra, &rb] {
            if let Err(e) = r {
                assert!(
                    e.code == -libc::EBUSY || e.code == -libc::ENOENT,
                    "round {i}: {e}"
                );
            }
        }
        assert_eq!(
            [&ra, &rb].iter().filter(|r| r.is_ok()).count(),
            1,
            "round {i}: {ra:?} {rb:?}"
        );
        let h = a.opendir(d).unwrap();
        let named: Vec<_> = a
            .readdir(&h, 0, usize::MAX)
            .unwrap()
            .into_iter()
            .filter(|e| e.entry.oid == src.oid())
            .map(|e| e.name)
            .collect();
        assert_eq!(named.len(), 1, "round {i}: names {named:?}");
        a.unlink(d, &named[0]).unwrap();
    }
}

/// A mount removing a file it created by the version its create wrote
/// (`unlink_written_at`, no read of the entry first, as the interception
/// library and the daemon do for their own files): removed, data and all,
/// while nobody changed it. Renamed away by another mount, also once the
/// engines have aggregated that rename's punch away, the remover gets
/// ENOENT and the file lives on under its new name. Replaced by another
/// mount, the name's new file is removed, as unlink(2) of the name would.
#[test]
fn unlinks_by_the_created_version_remove_only_what_the_name_holds() {
    let c = cluster(2);
    let (a, b) = (mount(&c, "cont", false), mount(&c, "cont", false));
    let (ra, rb) = (a.root(), b.root());
    let create = |name: &[u8], data: &[u8]| {
        let (n, at) = a.create_versioned(&ra, name, 0o644, 0, 0, true).unwrap();
        a.open(&n).unwrap().write_at(0, data).unwrap();
        (n, at.expect("made by this create"))
    };

    let (n, at) = create(b"plain", b"data");
    a.unlink_written_at(&ra, &n, at).unwrap();
    a.settle_discards().unwrap();
    assert_eq!(code(b.lookup(&rb, b"plain")), libc::ENOENT);
    assert_eq!(b.open(&n).unwrap().size().unwrap(), 0, "its data punched");

    for (name, kept, aggregate) in [("moved", "kept", false), ("moved2", "kept2", true)] {
        let (n, at) = create(name.as_bytes(), b"keep me");
        b.rename(&rb, name.as_bytes(), &rb, kept.as_bytes(), 0)
            .unwrap();
        if aggregate {
            c.aggregate("pool");
        }
        assert_eq!(code(a.unlink_written_at(&ra, &n, at)), libc::ENOENT);
        a.settle_discards().unwrap();
        let k = b.lookup(&rb, kept.as_bytes()).unwrap();
        assert_eq!(k.oid(), n.oid());
        assert_eq!(read_all(&b, &k), b"keep me", "{kept}");
    }

    let (n, at) = create(b"replaced", b"mine");
    b.unlink(&rb, b"replaced").unwrap();
    let (theirs, _) = b.create(&rb, b"replaced", 0o644, 0, 0, true).unwrap();
    b.open(&theirs).unwrap().write_at(0, b"theirs").unwrap();
    a.unlink_written_at(&ra, &n, at).unwrap();
    assert_eq!(code(b.lookup(&rb, b"replaced")), libc::ENOENT);
}

/// Unlinks by the created version while an engine of a replicated
/// container is down (the removal reaches the replicas that are up), the
/// engine then back: through a new mount the removed names stay removed
/// and the others read as written, whichever replica answers.
#[test]
fn unlinks_by_the_created_version_during_an_engine_outage_hold_after_it_returns() {
    let mut c = Cluster::replicated(ContCreateReq {
        label: "rp".into(),
        ..Default::default()
    });
    let a = mount(&c, "rp", false);
    let root = a.root();
    let mut made = Vec::new();
    for i in 0..6u8 {
        let name = [b'f', b'0' + i];
        let (n, at) = a.create_versioned(&root, &name, 0o644, 0, 0, true).unwrap();
        a.open(&n).unwrap().write_at(0, &[i + 1; 5000]).unwrap();
        made.push((n, at.expect("made by this create")));
    }
    c.engines[2].kill9();
    for (n, at) in made.iter().step_by(2) {
        a.unlink_written_at(&root, n, *at).unwrap();
    }
    a.settle_discards().unwrap();
    c.restart(2);
    let b = mount(&c, "rp", false);
    assert_eq!(
        names(&b, &b.root()),
        vec![b"f1".to_vec(), b"f3".to_vec(), b"f5".to_vec()]
    );
    for (n, _) in made.iter().skip(1).step_by(2) {
        let got = read_all(&b, &b.lookup(&b.root(), &n.name).unwrap());
        assert_eq!(got, vec![n.name[1] - b'0' + 1; 5000]);
    }
    for (n, _) in made.iter().step_by(2) {
        assert_eq!(code(b.lookup(&b.root(), &n.name)), libc::ENOENT);
    }
}
