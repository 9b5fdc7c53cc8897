//! The POSIX layer against real engines: the namespace, file I/O,
//! readdir, special files and setgid directories.

mod common;

use common::*;
use peregrine::DISCARD_BATCH;
use peregrine_dfs::*;
use peregrine_proto::mgmt::{ContCreateReq, PoolCreateReq};

#[test]
fn namespace_operations() {
    let c = cluster(1);
    // Read-only mount of an empty container: nothing to mount.
    let client = c.client();
    let pool = client.pool_connect("pool").unwrap();
    let e = Dfs::mount(pool.cont_open("cont").unwrap(), false, true).unwrap_err();
    assert_eq!(e.code, -libc::ENOENT, "{e}");

    // Two first mounts racing agree on the root.
    let (a, b) = std::thread::scope(|s| {
        let h1 = s.spawn(|| mount(&c, "cont", false));
        let h2 = s.spawn(|| mount(&c, "cont", false));
        (h1.join().unwrap(), h2.join().unwrap())
    });
    assert_eq!(a.root().oid(), b.root().oid());
    let fs = a;
    let root = fs.root();
    assert!(root.is_dir());

    // create / O_EXCL / lookup
    let (f, created) = fs.create(&root, b"f", 0o644, 1, 2, true).unwrap();
    assert!(created);
    assert_eq!(
        code(fs.create(&root, b"f", 0o644, 1, 2, true)),
        libc::EEXIST
    );
    let (f2, created) = fs.create(&root, b"f", 0o644, 1, 2, false).unwrap();
    assert!(!created);
    assert_eq!(f2.oid(), f.oid());
    let l = b.lookup(&b.root(), b"f").unwrap();
    assert_eq!(l.entry, f.entry);
    assert_eq!(
        (l.entry.uid, l.entry.gid, l.entry.mode),
        (1, 2, libc::S_IFREG | 0o644)
    );
    assert_eq!(code(fs.lookup(&root, b"nope")), libc::ENOENT);
    assert_eq!(code(fs.lookup(&root, &[b'x'; 256])), libc::ENAMETOOLONG);
    assert_eq!(
        code(fs.create(&root, &[b'x'; 256], 0o644, 0, 0, true)),
        libc::ENAMETOOLONG
    );
    fs.create(&root, &[b'x'; 255], 0o644, 0, 0, true).unwrap();
    assert_eq!(code(fs.lookup(&f, b"x")), libc::ENOTDIR);
    assert_eq!(code(fs.link(&f, &root, b"f")), libc::EEXIST);

    // mkdir / rmdir / unlink
    let d = fs.mkdir(&root, b"d", 0o755, 0, 0).unwrap();
    assert_eq!(code(fs.mkdir(&root, b"d", 0o755, 0, 0)), libc::EEXIST);
    fs.create(&d, b"inner", 0o600, 0, 0, true).unwrap();
    assert_eq!(code(fs.rmdir(&root, b"d")), libc::ENOTEMPTY);
    assert_eq!(code(fs.rmdir(&root, b"f")), libc::ENOTDIR);
    assert_eq!(code(fs.unlink(&root, b"d")), libc::EISDIR);
    assert_eq!(
        code(fs.create(&root, b"d", 0o644, 0, 0, false)),
        libc::EISDIR
    );
    fs.unlink(&d, b"inner").unwrap();
    assert_eq!(code(fs.unlink(&d, b"inner")), libc::ENOENT);
    fs.rmdir(&root, b"d").unwrap();
    assert_eq!(code(fs.lookup(&root, b"d")), libc::ENOENT);

    // symlink / readlink
    let s = fs.symlink(&root, b"ln", b"../target/path", 0, 0).unwrap();
    assert_eq!(
        fs.readlink(&fs.lookup(&root, b"ln").unwrap()).unwrap(),
        b"../target/path"
    );
    assert_eq!(fs.getattr(&s).unwrap().1.size, 14);
    assert_eq!(code(fs.symlink(&root, b"ln", b"x", 0, 0)), libc::EEXIST);

    // chmod / chown / utimens
    let (_, st) = fs
        .setattr(
            &f,
            &SetAttr {
                mode: Some(0o600),
                uid: Some(7),
                gid: Some(8),
                atime: Some(1_000_000_123),
                mtime: Some(2_000_000_456),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(st.mode, libc::S_IFREG | 0o600);
    assert_eq!(
        (st.uid, st.gid, st.atime, st.mtime),
        (7, 8, 1_000_000_123, 2_000_000_456)
    );
    let (_, st) = b.getattr(&b.lookup(&b.root(), b"f").unwrap()).unwrap();
    assert_eq!(st.mode, libc::S_IFREG | 0o600);

    // xattrs (and they follow a rename)
    fs.setxattr(&f, b"user.a", b"1", 0).unwrap();
    fs.setxattr(&f, b"user.b", b"22", 0).unwrap();
    assert_eq!(
        code(fs.setxattr(&f, b"user.a", b"x", libc::XATTR_CREATE)),
        libc::EEXIST
    );
    assert_eq!(
        code(fs.setxattr(&f, b"user.c", b"x", libc::XATTR_REPLACE)),
        libc::ENODATA
    );
    assert_eq!(fs.getxattr(&f, b"user.b").unwrap(), b"22");
    assert_eq!(code(fs.getxattr(&f, b"user.zz")), libc::ENODATA);
    assert_eq!(
        fs.listxattr(&f).unwrap(),
        vec![b"user.a".to_vec(), b"user.b".to_vec()]
    );
    fs.removexattr(&f, b"user.a").unwrap();
    assert_eq!(code(fs.removexattr(&f, b"user.a")), libc::ENODATA);
    // xattrs on the root live in the superblock
    fs.setxattr(&root, b"user.r", b"root", 0).unwrap();
    assert_eq!(b.getxattr(&b.root(), b"user.r").unwrap(), b"root");

    // rename: plain, across directories, over a file, NOREPLACE, EXCHANGE
    let d1 = fs.mkdir(&root, b"d1", 0o755, 0, 0).unwrap();
    let d2 = fs.mkdir(&root, b"d2", 0o755, 0, 0).unwrap();
    fs.rename(&root, b"f", &d1, b"g", 0).unwrap();
    assert_eq!(code(fs.lookup(&root, b"f")), libc::ENOENT);
    let g = fs.lookup(&d1, b"g").unwrap();
    assert_eq!(g.oid(), f.oid());
    assert_eq!(fs.getxattr(&g, b"user.b").unwrap(), b"22");
    let (h, _) = fs.create(&d2, b"h", 0o644, 0, 0, true).unwrap();
    fs.open(&h).unwrap().write_at(0, b"hhh").unwrap();
    assert_eq!(
        code(fs.rename(&d1, b"g", &d2, b"h", RENAME_NOREPLACE)),
        libc::EEXIST
    );
    fs.rename(&d1, b"g", &d2, b"h", 0).unwrap();
    let h2 = fs.lookup(&d2, b"h").unwrap();
    assert_eq!(h2.oid(), f.oid());
    assert_eq!(fs.listxattr(&h2).unwrap(), vec![b"user.b".to_vec()]);
    assert_eq!(code(fs.lookup(&d1, b"g")), libc::ENOENT);
    // the replaced file's data is gone (its punch sent by the rename)
    fs.settle_discards().unwrap();
    let old = File::new(fs.container(), h.oid(), h.entry.chunk_size, false).unwrap();
    assert_eq!(old.size().unwrap(), 0);
    // exchange
    fs.symlink(&d1, b"s", b"tgt", 0, 0).unwrap();
    fs.rename(&d1, b"s", &d2, b"h", RENAME_EXCHANGE).unwrap();
    assert!(fs.lookup(&d2, b"h").unwrap().entry.is_symlink());
    assert_eq!(fs.lookup(&d1, b"s").unwrap().oid(), f.oid());
    assert_eq!(
        code(fs.rename(&d1, b"s", &d2, b"none", RENAME_EXCHANGE)),
        libc::ENOENT
    );
    // directories: over an empty dir works, over a non-empty one ENOTEMPTY,
    // dir over file ENOTDIR, file over dir EISDIR
    let e1 = fs.mkdir(&d1, b"e1", 0o755, 0, 0).unwrap();
    fs.create(&e1, b"child", 0o644, 0, 0, true).unwrap();
    fs.mkdir(&d2, b"empty", 0o755, 0, 0).unwrap();
    fs.rename(&d1, b"e1", &d2, b"empty", 0).unwrap();
    let moved = fs.lookup(&d2, b"empty").unwrap();
    assert_eq!(moved.oid(), e1.oid());
    fs.lookup(&moved, b"child").unwrap();
    fs.mkdir(&d1, b"e2", 0o755, 0, 0).unwrap();
    assert_eq!(
        code(fs.rename(&d1, b"e2", &d2, b"empty", 0)),
        libc::ENOTEMPTY
    );
    assert_eq!(code(fs.rename(&d1, b"e2", &d1, b"s", 0)), libc::ENOTDIR);
    assert_eq!(code(fs.rename(&d1, b"s", &d1, b"e2", 0)), libc::EISDIR);
    assert_eq!(code(fs.rename(&d1, b"missing", &d1, b"x", 0)), libc::ENOENT);

    // object class override by xattr, inherited by new entries
    assert_eq!(
        code(fs.setxattr(&d1, OCLASS_XATTR.as_bytes(), b"RP_9G9", 0)),
        libc::EINVAL
    );
    let e = fs
        .setxattr(&d1, OCLASS_XATTR.as_bytes(), b"RP_2G1", 0)
        .unwrap_err();
    assert_eq!(e.code, -libc::EINVAL, "one engine cannot hold RP_2G1: {e}");
    fs.setxattr(&d1, OCLASS_XATTR.as_bytes(), b"S2", 0).unwrap();
    let d1 = fs.lookup(&root, b"d1").unwrap();
    assert_eq!(fs.getxattr(&d1, OCLASS_XATTR.as_bytes()).unwrap(), b"S2");
    let (nf, _) = fs.create(&d1, b"classy", 0o644, 0, 0, true).unwrap();
    assert_eq!(nf.oid().class().unwrap().name(), "S2");
    let sub = fs.mkdir(&d1, b"sub", 0o755, 0, 0).unwrap();
    assert_eq!(sub.oid().class().unwrap().name(), "S2");
    let (nf2, _) = fs.create(&sub, b"deep", 0o644, 0, 0, true).unwrap();
    assert_eq!(nf2.oid().class().unwrap().name(), "S2");
    let (plain, _) = fs.create(&d2, b"plain", 0o644, 0, 0, true).unwrap();
    assert_eq!(plain.oid().class().unwrap().name(), "SX");

    // statfs from the pool
    let sf = fs.statfs().unwrap();
    assert!(sf.blocks > 0 && sf.bfree <= sf.blocks, "{sf:?}");
    assert_eq!(sf.namelen, 255);

    // read-only mount
    let ro = mount(&c, "cont", true);
    let rr = ro.root();
    assert_eq!(code(ro.create(&rr, b"new", 0o644, 0, 0, true)), libc::EROFS);
    assert_eq!(code(ro.mkdir(&rr, b"new", 0o755, 0, 0)), libc::EROFS);
    assert_eq!(code(ro.unlink(&d2, b"plain")), libc::EROFS);
    let pf = ro.lookup(&d2, b"plain").unwrap();
    assert_eq!(code(ro.open(&pf).unwrap().write_at(0, b"x")), libc::EROFS);
    assert_eq!(code(ro.setxattr(&pf, b"user.q", b"1", 0)), libc::EROFS);
    assert_eq!(code(ro.rename(&d2, b"plain", &d2, b"p2", 0)), libc::EROFS);
}

#[test]
fn file_io_sizes_and_truncate() {
    let c = cluster(2);
    let fs = mount(&c, "small", false);
    let fs2 = mount(&c, "small", false);
    let chunk = fs.chunk_size();
    assert_eq!(chunk, 64 << 10);
    let root = fs.root();
    let (n, _) = fs.create(&root, b"data", 0o644, 0, 0, true).unwrap();
    let f = fs.open(&n).unwrap();
    assert_eq!(f.size().unwrap(), 0);
    let mut buf = vec![0u8; 100];
    assert_eq!(f.read_at(0, &mut buf).unwrap(), 0);

    // A write across several chunks, read back whole and in odd pieces.
    let data = pattern(1, (3 * chunk + 1234) as usize);
    f.write_at(100, &data).unwrap();
    let total = 100 + data.len() as u64;
    assert_eq!(f.size().unwrap(), total);
    let mut back = vec![0u8; total as usize + 500];
    assert_eq!(f.read_at(0, &mut back).unwrap(), total as usize);
    assert_eq!(&back[..100], &[0u8; 100][..]);
    assert_eq!(&back[100..total as usize], &data[..]);
    let mut piece = vec![0u8; 777];
    assert_eq!(f.read_at(chunk - 5, &mut piece).unwrap(), 777);
    assert_eq!(
        &piece[..],
        &data[(chunk - 105) as usize..(chunk - 105 + 777) as usize]
    );

    // Two clients write disjoint ranges; each sees the other's data and
    // the same size, derived from the store.
    let n2 = fs2.lookup(&fs2.root(), b"data").unwrap();
    let g = fs2.open(&n2).unwrap();
    let far = pattern(2, 1000);
    g.write_at(10 * chunk + 3, &far).unwrap();
    let mut b2 = vec![0u8; 1000];
    assert_eq!(f.read_at(10 * chunk + 3, &mut b2).unwrap(), 1000);
    assert_eq!(b2, far);
    assert_eq!(f.size().unwrap(), 10 * chunk + 1003);
    assert_eq!(fs.getattr(&n).unwrap().1.size, 10 * chunk + 1003);
    let mut b3 = vec![0u8; 50];
    assert_eq!(g.read_at(100, &mut b3).unwrap(), 50);
    assert_eq!(&b3[..], &data[..50]);

    // Truncate down mid-chunk, to a chunk boundary, up (sparse), to 0.
    f.truncate(chunk + 10).unwrap();
    assert_eq!(g.size().unwrap(), chunk + 10);
    let mut all = vec![0u8; (chunk + 100) as usize];
    assert_eq!(g.read_at(0, &mut all).unwrap(), (chunk + 10) as usize);
    assert_eq!(
        &all[100..(chunk + 10) as usize],
        &data[..(chunk - 90) as usize]
    );
    f.write_at(5 * chunk, b"x").unwrap();
    f.truncate(2 * chunk).unwrap();
    assert_eq!(f.size().unwrap(), 2 * chunk);
    let mut tail = vec![1u8; 20];
    assert_eq!(f.read_at(2 * chunk - 20, &mut tail).unwrap(), 20);
    assert_eq!(tail, vec![0u8; 20]);
    fs.setattr(
        &n,
        &SetAttr {
            size: Some(7 * chunk + 3),
            ..Default::default()
        },
    )
    .unwrap();
    assert_eq!(g.size().unwrap(), 7 * chunk + 3);
    let mut hole = vec![1u8; 10];
    assert_eq!(g.read_at(7 * chunk - 7, &mut hole).unwrap(), 10);
    assert_eq!(hole, vec![0u8; 10]);
    f.truncate(0).unwrap();
    assert_eq!(g.size().unwrap(), 0);
    f.write_at(0, b"again").unwrap();
    assert_eq!(g.size().unwrap(), 5);

    // fallocate: mode 0 extends, others EOPNOTSUPP
    fs.fallocate(&n, 0, 0, 3 * chunk).unwrap();
    assert_eq!(f.size().unwrap(), 3 * chunk);
    fs.fallocate(&n, 0, 0, 10).unwrap();
    assert_eq!(f.size().unwrap(), 3 * chunk);
    assert_eq!(
        code(fs.fallocate(&n, libc::FALLOC_FL_PUNCH_HOLE | 1, 0, 10)),
        libc::EOPNOTSUPP
    );
    let mut head = vec![0u8; 5];
    f.read_at(0, &mut head).unwrap();
    assert_eq!(&head, b"again");

    // unlink punches the data (sent by the unlink; its replies are read by
    // a later removal, or here)
    fs.unlink(&root, b"data").unwrap();
    fs.settle_discards().unwrap();
    assert_eq!(g.size().unwrap(), 0);
}

#[test]
fn removed_files_data_is_punched_without_waiting_for_each() {
    let c = cluster(2);
    let fs = mount(&c, "cont", false);
    let root = fs.root();
    // More files than a batch of punches: two go out as they fill, the
    // rest when the last handle drops.
    let n = DISCARD_BATCH as u32 * 2 + 3;
    let mut files = Vec::new();
    for i in 0..n {
        let name = format!("f{i}");
        let (node, _) = fs
            .create(&root, name.as_bytes(), 0o644, 0, 0, true)
            .unwrap();
        let data = vec![i as u8 + 1; 70_000 + i as usize];
        fs.open(&node).unwrap().write_at(0, &data).unwrap();
        files.push((name, node));
    }
    let mkdir = fs.mkdir(&root, b"d", 0o755, 0, 0).unwrap();
    // A second mount reads the objects behind the names as they go.
    let other = mount(&c, "cont", false);
    let opened: Vec<_> = files.iter().map(|(_, n)| other.open(n).unwrap()).collect();
    for (name, _) in &files {
        fs.unlink(&root, name.as_bytes()).unwrap();
        assert_eq!(
            code(other.lookup(&other.root(), name.as_bytes())),
            libc::ENOENT
        );
    }
    fs.rmdir(&root, b"d").unwrap();
    drop(fs);
    // Every removed file's data is gone, and the directory's object.
    for (f, (name, _)) in opened.iter().zip(&files) {
        assert_eq!(f.size().unwrap(), 0, "{name}");
    }
    let d = other.container().object(mkdir.oid()).unwrap();
    assert!(d.list_dkeys().unwrap().is_empty());
}

#[test]
fn a_lone_removal_is_punched_soon_without_a_settle() {
    let c = cluster(1);
    let fs = mount(&c, "cont", false);
    let root = fs.root();
    let (node, _) = fs.create(&root, b"lone", 0o644, 0, 0, true).unwrap();
    fs.open(&node).unwrap().write_at(0, &[7; 50_000]).unwrap();
    let other = mount(&c, "cont", false);
    let f = other.open(&node).unwrap();
    fs.unlink(&root, b"lone").unwrap();
    // Nothing else is removed and the mount stays: the queue's own
    // thread sends it once it has waited its delay.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while f.size().unwrap() != 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "a removed file's data is still there after 10 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    drop(fs);
}

#[test]
fn removals_stay_removed_across_an_engine_kill_and_settle_after_its_return() {
    let mut c = cluster(1);
    let fs = mount(&c, "cont", false);
    let root = fs.root();
    let mut nodes = Vec::new();
    for i in 0..6u8 {
        let (n, _) = fs
            .create(&root, &[b'f', b'0' + i], 0o644, 0, 0, true)
            .unwrap();
        fs.open(&n).unwrap().write_at(0, &[i + 1; 9000]).unwrap();
        nodes.push(n);
    }
    // Removed, then the engine killed: punches whose replies were not read
    // yet meet a dead connection (a lost reply is made again once the
    // engine is back; here most are answered before the kill).
    for n in &nodes {
        fs.unlink(&root, &n.name).unwrap();
    }
    c.engines[0].kill9();
    c.restart(0);
    fs.settle_discards().unwrap();
    for n in &nodes {
        assert_eq!(fs.open(n).unwrap().size().unwrap(), 0, "{:?}", n.name);
        assert_eq!(code(fs.lookup(&root, &n.name)), libc::ENOENT);
    }
}

#[test]
fn readdir_stable_cookies() {
    // Metadata lives in the scm tier, which checkpoint slots bound: a large
    // (sparse) device and a large scm tier.
    let c = Cluster::start(ClusterSpec {
        device_mib: 2048,
        ..Default::default()
    });
    c.format();
    let mut m = c.mgmt();
    c.rt.block_on(m.pool_create(PoolCreateReq {
        label: "pool".into(),
        scm_size: 96 << 20,
        nvme_size: 32 << 20,
        ..Default::default()
    }))
    .unwrap_or_else(|e| panic!("pool create: {e}\n{}", c.logs()));
    c.rt.block_on(m.cont_create(ContCreateReq {
        pool: "pool".into(),
        label: "cont".into(),
        ..Default::default()
    }))
    .unwrap();
    let fs = mount(&c, "cont", false);
    let root = fs.root();
    let dir = fs.mkdir(&root, b"big", 0o755, 0, 0).unwrap();
    let n: usize = std::env::var("DFS_READDIR_ENTRIES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(100_000);
    let threads = 8;
    std::thread::scope(|s| {
        for t in 0..threads {
            let (fs, dir) = (&fs, &dir);
            s.spawn(move || {
                for i in (t..n).step_by(threads) {
                    fs.create(dir, format!("f{i:06}").as_bytes(), 0o644, 0, 0, true)
                        .unwrap();
                }
            });
        }
    });
    let start = std::time::Instant::now();
    let h = fs.opendir(&dir).unwrap();
    // Read in pages; between pages add and remove entries: cookies stay valid.
    let mut seen = Vec::new();
    let mut cookie = 0;
    let mut page = 0;
    loop {
        let es = fs.readdir(&h, cookie, 1000).unwrap();
        if es.is_empty() {
            break;
        }
        cookie = es.last().unwrap().cookie;
        seen.extend(es.into_iter().map(|e| e.name));
        if page == 2 {
            fs.create(&dir, b"a-new-first", 0o644, 0, 0, true).unwrap();
            fs.create(&dir, b"zzz-new-last", 0o644, 0, 0, true).unwrap();
            fs.unlink(&dir, format!("f{:06}", n - 1).as_bytes())
                .unwrap();
        }
        page += 1;
    }
    eprintln!("readdir of {n} entries: {:?}", start.elapsed());
    let want: Vec<Vec<u8>> = (0..n - 1)
        .map(|i| format!("f{i:06}").into_bytes())
        .collect();
    assert_eq!(
        seen, want,
        "every entry once, in order, removed one skipped"
    );
    // A resumed read from a mid cookie gives the same continuation.
    let es = fs.readdir(&h, 500, 3).unwrap();
    assert_eq!(es[0].name, b"f000500");
    assert_eq!(es[0].cookie, 501);
    // A new handle sees the new entries: n + 1 names, the last two these.
    let h2 = fs.opendir(&dir).unwrap();
    let names = |es: Vec<peregrine_dfs::DirEntry>| -> Vec<Vec<u8>> {
        es.into_iter().map(|e| e.name).collect()
    };
    let tail = names(fs.readdir(&h2, n as u64 - 1, 10).unwrap());
    let last = format!("f{:06}", n - 2).into_bytes();
    assert_eq!(tail, vec![last, b"zzz-new-last".to_vec()]);
    // A handle lists at its first read, not at open: a name made in
    // between is there.
    let h3 = fs.opendir(&dir).unwrap();
    fs.create(&dir, b"aa-after-open", 0o644, 0, 0, true)
        .unwrap();
    let head = names(fs.readdir(&h3, 0, 2).unwrap());
    assert_eq!(
        head,
        vec![b"a-new-first".to_vec(), b"aa-after-open".to_vec()]
    );
}

/// A set-group-ID directory (what a pod's fsGroup makes of a volume) gives
/// its group to new files, directories and symlinks, and its bit to new
/// directories; elsewhere the creator's group stays.
#[test]
fn setgid_directories_hand_down_their_group() {
    let c = cluster(1);
    let fs = mount(&c, "cont", false);
    let root = fs.root();
    let shared = fs.mkdir(&root, b"shared", 0o775, 0, 0).unwrap();
    let (shared, _) = fs
        .setattr(
            &shared,
            &peregrine_dfs::SetAttr {
                mode: Some(0o2775),
                gid: Some(1000),
                ..Default::default()
            },
        )
        .unwrap();
    let d = fs.mkdir(&shared, b"sub", 0o755, 0, 0).unwrap();
    assert_eq!(d.entry.gid, 1000);
    assert_eq!(d.entry.mode & 0o7777, 0o2755, "{:o}", d.entry.mode);
    let (f, _) = fs.create(&d, b"f", 0o644, 7, 7, true).unwrap();
    assert_eq!((f.entry.uid, f.entry.gid), (7, 1000));
    assert_eq!(f.entry.mode & 0o7777, 0o644, "files do not get the bit");
    let l = fs.symlink(&d, b"l", b"f", 7, 7).unwrap();
    assert_eq!(l.entry.gid, 1000);
    let plain = fs.mkdir(&root, b"plain", 0o755, 5, 6).unwrap();
    let (g, _) = fs.create(&plain, b"g", 0o644, 5, 6, true).unwrap();
    assert_eq!((plain.entry.gid, g.entry.gid), (6, 6));
    assert_eq!(plain.entry.mode & 0o7777, 0o755);
}

/// FIFOs, sockets and device nodes are entries with their type, mode and
/// device number, seen so by another mount; no object is behind them;
/// chmod, chown, rename and unlink work on them as on any entry.
#[test]
fn special_files_are_entries() {
    let c = cluster(1);
    let a = mount(&c, "cont", false);
    let b = mount(&c, "cont", false);
    let root = a.root();
    let d = a.mkdir(&root, b"sp", 0o755, 0, 0).unwrap();
    let dev = |ma, mi| libc::makedev(ma, mi);
    let kinds: [(&[u8], u32, u64); 4] = [
        (b"fifo", libc::S_IFIFO | 0o640, 0),
        (b"sock", libc::S_IFSOCK | 0o755, 0),
        (b"null", libc::S_IFCHR | 0o666, dev(1, 3)),
        (b"disk", libc::S_IFBLK | 0o660, dev(259, 1 << 16 | 7)),
    ];
    for (name, mode, rdev) in kinds {
        let n = a.mknod(&d, name, mode, rdev, 7, 8).unwrap();
        assert!(n.entry.is_special());
        assert_eq!(code(a.mknod(&d, name, mode, rdev, 7, 8)), libc::EEXIST);
        let db = b.lookup_path("/sp").unwrap();
        let l = b.lookup(&db, name).unwrap();
        assert_eq!((l.entry.mode, l.entry.rdev), (mode, rdev), "{name:?}");
        assert_eq!((l.entry.uid, l.entry.gid), (7, 8));
        let (_, st) = b.getattr(&l).unwrap();
        assert_eq!((st.mode, st.rdev, st.size, st.nlink), (mode, rdev, 0, 1));
        // No data: opening one is the kernel's business, not a file's.
        assert_eq!(code(b.open(&l)), libc::EINVAL);
        assert_eq!(
            code(b.setattr(
                &l,
                &SetAttr {
                    size: Some(1),
                    ..Default::default()
                }
            )),
            libc::EINVAL
        );
    }
    // A FIFO's "rdev" is not kept (only device nodes have one).
    let f = a
        .mknod(&d, b"fifo2", libc::S_IFIFO | 0o600, 99, 0, 0)
        .unwrap();
    assert_eq!(f.entry.rdev, 0);
    // mknod of a regular file makes an empty file; of a directory or a
    // symlink is refused.
    let r = a.mknod(&d, b"reg", libc::S_IFREG | 0o600, 0, 0, 0).unwrap();
    assert!(r.entry.is_file());
    assert_eq!(a.getattr(&r).unwrap().1.size, 0);
    for t in [libc::S_IFDIR, libc::S_IFLNK] {
        assert_eq!(code(a.mknod(&d, b"bad", t | 0o755, 0, 0, 0)), libc::EINVAL);
    }
    // readdir reports the types.
    let h = a.opendir(&d).unwrap();
    let mut got: Vec<(Vec<u8>, u32)> = a
        .readdir(&h, 0, 100)
        .unwrap()
        .into_iter()
        .map(|e| (e.name, e.entry.mode & libc::S_IFMT))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            (b"disk".to_vec(), libc::S_IFBLK),
            (b"fifo".to_vec(), libc::S_IFIFO),
            (b"fifo2".to_vec(), libc::S_IFIFO),
            (b"null".to_vec(), libc::S_IFCHR),
            (b"reg".to_vec(), libc::S_IFREG),
            (b"sock".to_vec(), libc::S_IFSOCK),
        ]
    );
    // chmod / chown keep the type and the device number.
    let n = a.lookup(&d, b"null").unwrap();
    let (n, st) = a
        .setattr(
            &n,
            &SetAttr {
                mode: Some(0o600),
                uid: Some(5),
                gid: Some(6),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(st.mode, libc::S_IFCHR | 0o600);
    assert_eq!((st.uid, st.gid, st.rdev), (5, 6, dev(1, 3)));
    // rename (to another directory, and over another special file) and unlink.
    let e = a.mkdir(&root, b"sp2", 0o755, 0, 0).unwrap();
    a.rename(&d, b"null", &e, b"null", 0).unwrap();
    a.rename(&e, b"null", &d, b"fifo2", 0).unwrap();
    let moved = b.lookup(&b.lookup_path("/sp").unwrap(), b"fifo2").unwrap();
    assert_eq!(moved.entry.oid, n.entry.oid);
    assert_eq!((moved.entry.mode, moved.entry.rdev), (st.mode, dev(1, 3)));
    for name in [&b"fifo"[..], b"sock", b"disk", b"fifo2", b"reg"] {
        a.unlink(&d, name).unwrap();
    }
    assert_eq!(code(a.unlink(&d, b"fifo")), libc::ENOENT);
    // A removed node whose name was made again (a descriptor still open on
    // it in the FUSE daemon) does not change the new entry.
    let (old, _) = a.create(&d, b"ghost", 0o644, 0, 0, true).unwrap();
    a.unlink(&d, b"ghost").unwrap();
    let (new, _) = b.create(&d, b"ghost", 0o600, 0, 0, true).unwrap();
    let chmod = SetAttr {
        mode: Some(0o777),
        ..Default::default()
    };
    assert_eq!(code(a.setattr(&old, &chmod)), libc::ENOENT);
    a.touch_written(&old, 12345).unwrap();
    let now = b.lookup(&d, b"ghost").unwrap();
    assert_eq!(now.entry, new.entry);
    a.unlink(&d, b"ghost").unwrap();
    a.rmdir(&root, b"sp").unwrap();
}
