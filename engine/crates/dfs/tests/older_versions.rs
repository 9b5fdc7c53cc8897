//! The POSIX layer against real engines: what older clients left (entries
//! of older formats, renames half done) reads and is settled.

mod common;

use common::*;
use peregrine_dfs::*;

/// The names in `dir` (as a fresh reader sees them).
/// Renames left half done by clients of before transactions (an intent in
/// the source entry, maybe the destination written) are settled when read:
/// finished if the destination names the object, else standing until the
/// old lease passes, then undone. Never two names for one object.
#[test]
fn renames_left_by_older_clients_are_settled() {
    let c = cluster(1);
    let a = mount(&c, "cont", false);
    let root = a.root();
    let d1 = a.mkdir(&root, b"d1", 0o755, 0, 0).unwrap();
    let d2 = a.mkdir(&root, b"d2", 0o755, 0, 0).unwrap();
    let o1 = a.container().object(d1.oid()).unwrap();
    let o2 = a.container().object(d2.oid()).unwrap();
    let file = |dir: &Node, name: &[u8], data: &[u8]| {
        let (n, _) = a.create(dir, name, 0o644, 0, 0, true).unwrap();
        a.open(&n).unwrap().write_at(0, data).unwrap();
        a.setxattr(&n, b"user.tag", data, 0).unwrap();
        n
    };
    // What the old protocol wrote: the source's intent, the destination's origin.
    let intent = |n: &Node, to: &Node, to_name: &[u8], exchange: Option<(Entry, Xattrs)>| {
        let mut e = n.entry.clone();
        e.moving = Some(Box::new(Move {
            to_dir: to.oid(),
            to_name: to_name.to_vec(),
            since: now_ns(),
            exchange,
        }));
        e
    };
    let moved = |n: &Node, from: &Node, name: &[u8]| {
        let mut e = n.entry.clone();
        e.from = Some((from.oid(), name.to_vec()));
        e.encode()
    };

    // Committed (the destination names the object): finished on lookup.
    let src = file(&d1, b"src", b"one");
    o1.update_single(b"src", b"inode", &intent(&src, &d2, b"dst", None).encode())
        .unwrap();
    o2.update_single(b"dst", b"inode", &moved(&src, &d1, b"src"))
        .unwrap();
    o2.update_single(b"dst", b"x:user.tag", b"one").unwrap();
    let b = mount(&c, "cont", false);
    assert_eq!(code(b.lookup(&d1, b"src")), libc::ENOENT);
    let n = b.lookup(&d2, b"dst").unwrap();
    assert_eq!((n.oid(), read_all(&b, &n)), (src.oid(), b"one".to_vec()));
    // Removing the destination settles its source first (already done here).
    b.unlink(&d2, b"dst").unwrap();
    assert_eq!(names(&b, &d1), Vec::<Vec<u8>>::new());

    // Not committed: stands while the lease runs, undone after it.
    let src = file(&d1, b"src2", b"two");
    o1.update_single(
        b"src2",
        b"inode",
        &intent(&src, &d2, b"dst2", None).encode(),
    )
    .unwrap();
    assert!(b.lookup(&d1, b"src2").unwrap().entry.moving.is_some());
    b.set_rename_lease(std::time::Duration::ZERO);
    let n = b.lookup(&d1, b"src2").unwrap();
    assert!(n.entry.moving.is_none(), "abandoned rename undone");
    assert_eq!(read_all(&b, &n), b"two");
    assert_eq!(code(b.lookup(&d2, b"dst2")), libc::ENOENT);
    b.rename(&d1, b"src2", &d2, b"dst2", 0).unwrap();
    assert_eq!(read_all(&b, &b.lookup(&d2, b"dst2").unwrap()), b"two");

    // An exchange whose destination was written: the other entry and its
    // xattrs come back to the source.
    let x = file(&d1, b"x", b"ex");
    let y = file(&d2, b"y", b"why");
    let ex = Some((
        y.entry.clone(),
        vec![(b"x:user.tag".to_vec(), b"why".to_vec())],
    ));
    o1.update_single(b"x", b"inode", &intent(&x, &d2, b"y", ex).encode())
        .unwrap();
    o2.update_single(b"y", b"inode", &moved(&x, &d1, b"x"))
        .unwrap();
    o2.update_single(b"y", b"x:user.tag", b"ex").unwrap();
    let (at1, at2) = (b.lookup(&d1, b"x").unwrap(), b.lookup(&d2, b"y").unwrap());
    assert_eq!((at1.oid(), at2.oid()), (y.oid(), x.oid()));
    assert_eq!(b.getxattr(&at1, b"user.tag").unwrap(), b"why");
    assert_eq!(read_all(&b, &at1), b"why");
    assert_eq!(read_all(&b, &at2), b"ex");
    assert!(at1.entry.moving.is_none() && b.lookup(&d1, b"x").unwrap().entry.moving.is_none());
}

/// Entries written by builds before version 3 (no device number, no
/// subdirectory count) still read; such a directory reports `st_nlink` 1
/// ("not counted") and keeps doing so as subdirectories come and go.
#[test]
fn entries_of_older_versions_still_read() {
    let c = cluster(1);
    let fs = mount(&c, "cont", false);
    let root = fs.root();
    let d = fs.mkdir(&root, b"old", 0o750, 3, 4).unwrap();
    let f = fs.create(&root, b"oldf", 0o640, 3, 4, true).unwrap().0;
    let dir_obj = fs.container().object(root.oid()).unwrap();
    for (name, node) in [(&b"old"[..], &d), (b"oldf", &f)] {
        let v3 = node.entry.encode();
        assert_eq!(v3[0], 3);
        // Version 2: the same without the last 9 bytes (rdev, flags).
        let mut v2 = v3[..v3.len() - 9].to_vec();
        v2[0] = 2;
        // Version 1: without the rename fields either (two zero bytes).
        let mut v1 = v2[..v2.len() - 2].to_vec();
        v1[0] = 1;
        for old in [v1, v2] {
            let e = Entry::decode(&old).unwrap();
            assert_eq!((e.mode, e.uid, e.oid), (node.entry.mode, 3, node.entry.oid));
            assert_eq!((e.rdev, e.subdirs_counted), (0, false));
            dir_obj.update_single(name, b"inode", &old).unwrap();
            let n = fs.lookup(&root, name).unwrap();
            assert_eq!(n.entry.mode, node.entry.mode);
            assert_eq!(fs.getattr(&n).unwrap().1.nlink, 1);
        }
    }
    // Version 4 is not this build's.
    let mut v4 = f.entry.encode();
    v4[0] = 4;
    assert_eq!(code(Entry::decode(&v4)), libc::EIO);
    let d = fs.lookup(&root, b"old").unwrap();
    fs.mkdir(&d, b"sub", 0o755, 0, 0).unwrap();
    assert_eq!(fs.getattr(&d).unwrap().1.nlink, 1);
    // Rewritten by this build (chmod), it is still "not counted".
    let (d, st) = fs
        .setattr(
            &d,
            &SetAttr {
                mode: Some(0o755),
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!((st.nlink, d.entry.subdirs_counted), (1, false));
    let sub = fs.lookup(&d, b"sub").unwrap();
    assert_eq!(fs.getattr(&sub).unwrap().1.nlink, 2, "new ones are counted");
    fs.rmdir(&d, b"sub").unwrap();
    fs.rmdir(&root, b"old").unwrap();
}
