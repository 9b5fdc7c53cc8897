//! The POSIX layer against real engines: a directory's times follow its
//! entries, and its link count its subdirectories.

mod common;

use common::*;
use peregrine_dfs::*;

/// POSIX: creating, removing or renaming an entry moves the directory's
/// mtime and ctime; other changes to entries (chmod, writes) and a rename
/// onto itself do not. Seen by another mount too (the times are stored).
#[test]
fn directory_times_follow_its_entries() {
    let c = cluster(1);
    let fs = mount(&c, "cont", false);
    let other = mount(&c, "cont", false);
    let root = fs.root();
    let a = fs.mkdir(&root, b"a", 0o755, 0, 0).unwrap();
    let b = fs.mkdir(&root, b"b", 0o755, 0, 0).unwrap();
    let times = |d: &Node| {
        let st = other.getattr(d).unwrap().1;
        (st.mtime, st.ctime)
    };
    let step = |what: &str, dirs: &[&Node], changes: bool, op: &dyn Fn()| {
        let before: Vec<(i64, i64)> = dirs.iter().map(|d| times(d)).collect();
        std::thread::sleep(std::time::Duration::from_millis(10));
        op();
        for (d, (m0, c0)) in dirs.iter().zip(before) {
            let (m1, c1) = times(d);
            let name = String::from_utf8_lossy(&d.name).into_owned();
            if changes {
                assert!(m1 > m0 && c1 > c0, "{what}: {name} times did not advance");
            } else {
                assert_eq!((m1, c1), (m0, c0), "{what}: {name} times changed");
            }
        }
    };
    step("mkdir in the root", &[&root], true, &|| {
        fs.mkdir(&root, b"c", 0o755, 0, 0).unwrap();
    });
    step("create", &[&a], true, &|| {
        fs.create(&a, b"f", 0o644, 0, 0, true).unwrap();
    });
    step("open of an existing file", &[&a], false, &|| {
        fs.create(&a, b"f", 0o644, 0, 0, false).unwrap();
    });
    step("write and chmod of an entry", &[&a], false, &|| {
        let f = fs.lookup(&a, b"f").unwrap();
        fs.open(&f).unwrap().write_at(0, b"data").unwrap();
        fs.touch_written(&f, 4).unwrap();
        fs.setattr(
            &f,
            &SetAttr {
                mode: Some(0o600),
                ..Default::default()
            },
        )
        .unwrap();
    });
    step("symlink", &[&a], true, &|| {
        fs.symlink(&a, b"l", b"f", 0, 0).unwrap();
    });
    step("rename within", &[&a], true, &|| {
        fs.rename(&a, b"f", &a, b"g", 0).unwrap();
    });
    step("rename onto itself", &[&a], false, &|| {
        fs.rename(&a, b"g", &a, b"g", 0).unwrap();
    });
    step("rename across", &[&a, &b], true, &|| {
        fs.rename(&a, b"g", &b, b"g", 0).unwrap();
    });
    step("exchange across", &[&a, &b], true, &|| {
        fs.rename(&b, b"g", &a, b"l", RENAME_EXCHANGE).unwrap();
    });
    step("unlink", &[&b], true, &|| fs.unlink(&b, b"g").unwrap());
    step("rmdir", &[&root], true, &|| fs.rmdir(&root, b"c").unwrap());
    step("a failed unlink", &[&a], false, &|| {
        assert_eq!(code(fs.unlink(&a, b"missing")), libc::ENOENT);
    });
    // The directory's other attributes survive the updates.
    let st = other.getattr(&a).unwrap().1;
    assert_eq!(st.mode, libc::S_IFDIR | 0o755);
    // A renamed directory: its new name is updated, nothing at the old.
    fs.rename(&root, b"a", &root, b"a2", 0).unwrap();
    let a2 = fs.lookup(&root, b"a2").unwrap();
    step("create in a renamed directory", &[&a2], true, &|| {
        fs.create(&a2, b"h", 0o644, 0, 0, true).unwrap();
    });
    assert_eq!(code(fs.lookup(&root, b"a")), libc::ENOENT);
}

/// A directory's link count is 2 + its subdirectories through mkdir,
/// rmdir and every kind of rename, as another mount sees it; two mounts
/// making and removing subdirectories of one directory at once lose no
/// counts; a lock left by a dead client is taken over after its lease.
#[test]
fn directory_link_counts() {
    let c = cluster(2);
    let a = mount(&c, "cont", false);
    let b = mount(&c, "cont", false);
    let root = a.root();
    assert_eq!(nlink(&a, "/"), 2);
    let p = a.mkdir(&root, b"p", 0o755, 0, 0).unwrap();
    assert_eq!((nlink(&a, "/"), nlink(&b, "/p")), (3, 2));
    let q = a.mkdir(&root, b"q", 0o755, 0, 0).unwrap();
    for n in [&b"d1"[..], b"d2", b"d3"] {
        a.mkdir(&p, n, 0o755, 0, 0).unwrap();
    }
    a.create(&p, b"f", 0o644, 0, 0, true).unwrap();
    a.symlink(&p, b"l", b"d1", 0, 0).unwrap();
    a.mknod(&p, b"fifo", libc::S_IFIFO | 0o644, 0, 0, 0)
        .unwrap();
    assert_eq!(
        (nlink(&b, "/"), nlink(&b, "/p"), nlink(&b, "/p/d1")),
        (4, 5, 2)
    );
    assert_eq!(nlink(&b, "/p/f"), 1);
    // The count's record is not an entry: not listed, not counted as one.
    assert_eq!(names(&b, &b.lookup_path("/p").unwrap()).len(), 6);
    // rmdir
    a.rmdir(&p, b"d3").unwrap();
    assert_eq!(nlink(&b, "/p"), 4);
    // rename of a directory to another directory, within one, and over an
    // empty directory (there and across directories)
    a.rename(&p, b"d2", &q, b"d2", 0).unwrap();
    assert_eq!((nlink(&b, "/p"), nlink(&b, "/q")), (3, 3));
    a.rename(&q, b"d2", &q, b"d2b", 0).unwrap();
    assert_eq!(nlink(&b, "/q"), 3);
    a.mkdir(&q, b"empty", 0o755, 0, 0).unwrap();
    assert_eq!(nlink(&b, "/q"), 4);
    a.rename(&q, b"d2b", &q, b"empty", 0).unwrap();
    assert_eq!(nlink(&b, "/q"), 3);
    a.mkdir(&q, b"empty2", 0o755, 0, 0).unwrap();
    a.rename(&p, b"d1", &q, b"empty2", 0).unwrap();
    assert_eq!((nlink(&b, "/p"), nlink(&b, "/q")), (2, 4));
    // A file over a file, a file moved: no change.
    a.rename(&p, b"f", &q, b"f", 0).unwrap();
    assert_eq!((nlink(&b, "/p"), nlink(&b, "/q")), (2, 4));
    // RENAME_EXCHANGE of a directory and a file across directories.
    a.rename(&q, b"empty", &p, b"fifo", RENAME_EXCHANGE)
        .unwrap();
    assert_eq!((nlink(&b, "/p"), nlink(&b, "/q")), (3, 3));
    // ... and of two directories: no change.
    a.mkdir(&q, b"x", 0o755, 0, 0).unwrap();
    a.rename(&q, b"x", &p, b"fifo", RENAME_EXCHANGE).unwrap();
    assert_eq!((nlink(&b, "/p"), nlink(&b, "/q")), (3, 4));
    // A directory whose subdirectories are all gone is empty again.
    let pb = b.lookup_path("/p").unwrap();
    b.rmdir(&pb, b"fifo").unwrap();
    assert_eq!(nlink(&a, "/p"), 2);
    for n in names(&b, &pb) {
        b.unlink(&pb, &n).unwrap();
    }
    b.rmdir(&b.root(), b"p").unwrap();
    assert_eq!(nlink(&a, "/"), 3);

    // Two mounts, two threads each, make 30 subdirectories apiece in one
    // directory at once, then remove them at once.
    let r = a.mkdir(&root, b"race", 0o755, 0, 0).unwrap();
    let each = 30;
    std::thread::scope(|s| {
        for (i, fs) in [&a, &a, &b, &b].into_iter().enumerate() {
            s.spawn(move || {
                let d = fs.lookup_path("/race").unwrap();
                for k in 0..each {
                    fs.mkdir(&d, format!("t{i}-{k}").as_bytes(), 0o755, 0, 0)
                        .unwrap();
                }
            });
        }
    });
    assert_eq!(nlink(&b, "/race"), 2 + 4 * each);
    std::thread::scope(|s| {
        for (i, fs) in [&a, &b, &a, &b].into_iter().enumerate() {
            s.spawn(move || {
                let d = fs.lookup_path("/race").unwrap();
                for k in 0..each {
                    fs.rmdir(&d, format!("t{i}-{k}").as_bytes()).unwrap();
                }
            });
        }
    });
    assert_eq!(nlink(&a, "/race"), 2);

    // A count lock left by a client that died is taken over once its lease
    // (5 s) has passed; a fresh one is waited for.
    let o = a.container().object(r.oid()).unwrap();
    let old = now_ns() - 6_000_000_000;
    o.update_single(b".", b"lock", &[old.to_le_bytes(), [7; 8]].concat())
        .unwrap();
    let t = std::time::Instant::now();
    a.mkdir(&r, b"after", 0o755, 0, 0).unwrap();
    assert!(
        t.elapsed() < std::time::Duration::from_secs(3),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(nlink(&b, "/race"), 3);
    let young = now_ns() - 4_000_000_000;
    o.update_single(b".", b"lock", &young.to_le_bytes())
        .unwrap();
    let t = std::time::Instant::now();
    b.mkdir(&b.lookup_path("/race").unwrap(), b"after2", 0o755, 0, 0)
        .unwrap();
    assert!(
        t.elapsed() >= std::time::Duration::from_millis(500),
        "{:?}",
        t.elapsed()
    );
    assert_eq!(nlink(&a, "/race"), 4);
}

/// `getattr_within` answers a directory's attributes from what this mount
/// read, with its own changes applied: after every kind of change made here
/// it answers what a fresh read by another mount finds, without reading
/// again; another mount's change shows once the age given has passed.
#[test]
fn directory_attributes_kept_with_this_mounts_changes() {
    let c = cluster(1);
    let fs = mount(&c, "cont", false);
    let other = mount(&c, "cont", false);
    let root = fs.root();
    let d = fs.mkdir(&root, b"d", 0o755, 0, 0).unwrap();
    let e = fs.mkdir(&root, b"e", 0o755, 0, 0).unwrap();
    let long = std::time::Duration::from_secs(60);
    let seen = |fs: &Dfs, d: &Node, age| {
        let st = fs.getattr_within(d, age).unwrap().1;
        (st.mode, st.nlink, st.mtime, st.ctime)
    };
    let stored = |d: &Node| seen(&other, d, std::time::Duration::ZERO);
    let kept = |d: &Node| seen(&fs, d, long);
    assert_eq!(kept(&d), stored(&d));
    let step = |what: &str, op: &dyn Fn()| {
        // Past the tick of the last stamp: each change stamps the times.
        std::thread::sleep(std::time::Duration::from_millis(5));
        op();
        for dir in [&d, &e] {
            assert_eq!(kept(dir), stored(dir), "after {what}");
        }
    };
    step("create", &|| {
        fs.create(&d, b"f", 0o644, 0, 0, true).unwrap();
    });
    step("mkdir", &|| {
        fs.mkdir(&d, b"sub", 0o755, 0, 0).unwrap();
    });
    step("symlink", &|| {
        fs.symlink(&d, b"l", b"f", 0, 0).unwrap();
    });
    step("mknod", &|| {
        fs.mknod(&d, b"p", libc::S_IFIFO | 0o644, 0, 0, 0).unwrap();
    });
    step("hard link", &|| {
        let f = fs.lookup(&d, b"f").unwrap();
        fs.link(&f, &e, b"f2").unwrap();
    });
    step("rename of a file across", &|| {
        fs.rename(&d, b"l", &e, b"l", 0).unwrap();
    });
    step("rename of a directory across", &|| {
        fs.rename(&d, b"sub", &e, b"sub", 0).unwrap();
    });
    step("unlink", &|| fs.unlink(&d, b"f").unwrap());
    step("rmdir", &|| fs.rmdir(&e, b"sub").unwrap());
    step("chmod", &|| {
        let a = SetAttr {
            mode: Some(0o700),
            ..Default::default()
        };
        fs.setattr(&d, &a).unwrap();
    });
    step("object class xattr", &|| {
        fs.setxattr(&d, OCLASS_XATTR.as_bytes(), b"SX", 0).unwrap();
    });
    // Another mount's change is not seen before the age given passes ...
    let before = kept(&d);
    std::thread::sleep(std::time::Duration::from_millis(5));
    other.create(&d, b"theirs", 0o644, 0, 0, true).unwrap();
    assert_eq!(kept(&d), before, "read again before its time");
    assert_ne!(stored(&d), before);
    // ... and is once it has.
    let short = std::time::Duration::from_millis(300);
    seen(&fs, &d, std::time::Duration::ZERO);
    std::thread::sleep(std::time::Duration::from_millis(5));
    other.create(&d, b"theirs2", 0o644, 0, 0, true).unwrap();
    std::thread::sleep(short);
    assert_eq!(seen(&fs, &d, short), stored(&d));
}
