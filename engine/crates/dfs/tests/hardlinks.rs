//! Hard links in the POSIX layer against real engines: names sharing one
//! inode record (attributes, xattrs, link count), removed one by one, moved
//! and replaced, changed from two mounts at once, and after a restart.

mod common;

use common::*;
use peregrine_dfs::*;

fn stat(fs: &Dfs, path: &str) -> Stat {
    fs.getattr(&fs.lookup_path(path).unwrap()).unwrap().1
}

#[test]
fn names_share_one_inode_until_the_last_goes() {
    let mut c = cluster(1);
    let (a, b) = (mount(&c, "cont", false), mount(&c, "cont", false));
    let root = a.root();
    let d1 = a.mkdir(&root, b"d1", 0o755, 0, 0).unwrap();
    let d2 = a.mkdir(&root, b"d2", 0o755, 0, 0).unwrap();
    let (f, _) = a.create(&d1, b"f", 0o640, 7, 8, true).unwrap();
    a.open(&f).unwrap().write_at(0, b"shared bytes").unwrap();
    a.setxattr(&f, b"user.tag", b"before", 0).unwrap();
    assert_eq!(stat(&a, "/d1/f").nlink, 1);

    // A second name: one inode, count 2, everywhere.
    let g = a.link(&f, &d2, b"g").unwrap();
    assert_eq!(g.oid(), f.oid());
    for (fs, p) in [(&a, "/d1/f"), (&a, "/d2/g"), (&b, "/d1/f"), (&b, "/d2/g")] {
        let st = stat(fs, p);
        assert_eq!(
            (st.nlink, st.oid, st.mode, st.uid, st.gid),
            (2, f.oid(), libc::S_IFREG | 0o640, 7, 8),
            "{p}"
        );
        assert_eq!(read_all(fs, &fs.lookup_path(p).unwrap()), b"shared bytes");
    }
    // Attributes and xattrs through one name show through the other, even
    // through a node read before the link.
    assert_eq!(
        b.getxattr(&b.lookup_path("/d2/g").unwrap(), b"user.tag")
            .unwrap(),
        b"before"
    );
    assert_eq!(
        a.getxattr(&f, b"user.tag").unwrap(),
        b"before",
        "node from before the link"
    );
    let chmod = SetAttr {
        mode: Some(0o600),
        ..Default::default()
    };
    b.setattr(&b.lookup_path("/d2/g").unwrap(), &chmod).unwrap();
    assert_eq!(stat(&a, "/d1/f").mode, libc::S_IFREG | 0o600);
    a.setxattr(&a.lookup_path("/d1/f").unwrap(), b"user.tag", b"after", 0)
        .unwrap();
    assert_eq!(
        b.getxattr(&b.lookup_path("/d2/g").unwrap(), b"user.tag")
            .unwrap(),
        b"after"
    );
    let listed: Vec<_> = a.readdir(&a.opendir(&d2).unwrap(), 0, 10).unwrap();
    assert_eq!(
        listed[0].entry.mode,
        libc::S_IFREG | 0o600,
        "a listing shows the inode's attributes"
    );

    // A third name, through the second; refusals.
    a.link(&a.lookup_path("/d2/g").unwrap(), &root, b"h")
        .unwrap();
    assert_eq!(stat(&b, "/h").nlink, 3);
    assert_eq!(code(a.link(&f, &d2, b"g")), libc::EEXIST);
    assert_eq!(code(a.link(&d1, &root, b"dirlink")), libc::EPERM);
    assert_eq!(code(a.link(&f, &f, b"x")), libc::ENOTDIR);

    // The count survives a kill -9 of the engine.
    c.engines[0].kill9();
    c.restart(0);
    let a = mount(&c, "cont", false);
    assert_eq!(stat(&a, "/d1/f").nlink, 3);

    // Removing names counts down; the data stays while a name is left.
    a.unlink(&d1, b"f").unwrap();
    assert_eq!(code(a.lookup_path("/d1/f")), libc::ENOENT);
    assert_eq!(stat(&a, "/h").nlink, 2);
    // Renaming one name onto another of the same file does nothing.
    a.rename(&root, b"h", &d2, b"g", 0).unwrap();
    assert_eq!((stat(&a, "/h").nlink, stat(&a, "/d2/g").nlink), (2, 2));
    // Renaming over a name replaces that name only: one link less.
    let (x, _) = a.create(&root, b"x", 0o644, 0, 0, true).unwrap();
    a.rename(&root, b"x", &d2, b"g", 0).unwrap();
    assert_eq!(stat(&a, "/d2/g").oid, x.oid());
    assert_eq!(stat(&a, "/h").nlink, 1);
    assert_eq!(read_all(&a, &a.lookup_path("/h").unwrap()), b"shared bytes");
    // The last name goes: so do the record and the data.
    a.unlink(&root, b"h").unwrap();
    a.settle_discards().unwrap();
    let gone = File::new(a.container(), f.oid(), f.entry.chunk_size, false).unwrap();
    assert_eq!(gone.size().unwrap(), 0, "data punched with the last name");
    assert_eq!(names(&a, &root), vec![b"d1".to_vec(), b"d2".to_vec()]);
}

/// Two mounts adding and removing names of one file at once: no count is
/// lost, and the file keeps its data until its last name goes.
#[test]
fn concurrent_links_keep_the_count() {
    let c = cluster(1);
    let (a, b) = (mount(&c, "cont", false), mount(&c, "cont", false));
    let root = a.root();
    let (f, _) = a.create(&root, b"f", 0o644, 0, 0, true).unwrap();
    a.open(&f).unwrap().write_at(0, b"data").unwrap();
    const N: usize = 12;
    let each = |fs: &Dfs, tag: &str, work: &dyn Fn(&Dfs, &[u8])| {
        for i in 0..N {
            work(fs, format!("{tag}{i}").as_bytes());
        }
    };
    let link = |fs: &Dfs, name: &[u8]| {
        let n = fs.lookup(&fs.root(), b"f").unwrap();
        fs.link(&n, &fs.root(), name).unwrap();
    };
    std::thread::scope(|s| {
        s.spawn(|| each(&a, "a", &link));
        s.spawn(|| each(&b, "b", &link));
    });
    assert_eq!(stat(&a, "/f").nlink as usize, 1 + 2 * N);
    let unlink = |fs: &Dfs, name: &[u8]| fs.unlink(&fs.root(), name).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| each(&a, "a", &unlink));
        s.spawn(|| each(&b, "b", &unlink));
    });
    let st = stat(&b, "/f");
    assert_eq!((st.nlink, st.oid), (1, f.oid()));
    assert_eq!(read_all(&b, &b.lookup_path("/f").unwrap()), b"data");
    assert_eq!(names(&a, &root), vec![b"f".to_vec()]);
}

/// Names added and removed while an engine of a replicated container is
/// down, the engine then back: the count and the names are as written
/// during the outage, read through a new mount after the return.
#[test]
fn links_made_during_an_engine_outage_hold_after_it_returns() {
    use peregrine_proto::mgmt::ContCreateReq;
    let mut c = Cluster::replicated(ContCreateReq {
        label: "rp".into(),
        ..Default::default()
    });
    let a = mount(&c, "rp", false);
    let root = a.root();
    let (f, _) = a.create(&root, b"f", 0o644, 0, 0, true).unwrap();
    a.open(&f).unwrap().write_at(0, b"kept").unwrap();
    a.link(&f, &root, b"g").unwrap();
    c.engines[2].kill9();
    // During the outage: one name more, one less.
    let n = a.lookup(&root, b"g").unwrap();
    a.link(&n, &root, b"h").unwrap();
    a.unlink(&root, b"f").unwrap();
    c.restart(2);
    let b = mount(&c, "rp", false);
    assert_eq!(names(&b, &b.root()), vec![b"g".to_vec(), b"h".to_vec()]);
    assert_eq!(stat(&b, "/g").nlink, 2);
    assert_eq!(read_all(&b, &b.lookup_path("/h").unwrap()), b"kept");
}

/// link(2) stamps the new name's directory after its transaction; the
/// directory entry's lock may share a stripe with the locks the link held,
/// which once hung the daemon one link in a few hundred. 600 links in one
/// directory make such a collision all but certain (2 of 256 stripes per
/// link); each must return.
#[test]
fn many_links_in_one_directory_all_return() {
    let c = cluster(1);
    let fs = mount(&c, "cont", false);
    let root = fs.root();
    let d = fs.mkdir(&root, b"objects", 0o755, 0, 0).unwrap();
    let (f, _) = fs.create(&root, b"f", 0o644, 0, 0, true).unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let worker = std::thread::spawn(move || {
        for i in 0..600 {
            fs.link(&f, &d, format!("l{i}").as_bytes()).unwrap();
            tx.send(i).unwrap();
        }
    });
    let mut done = 0;
    while done < 600 {
        match rx.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(_) => done += 1,
            Err(e) => panic!("link {done} did not return in 30 s ({e})"),
        }
    }
    worker.join().unwrap();
    drop(c);
}
