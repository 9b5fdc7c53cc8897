//! A container cloned from a snapshot, mounted: it holds the files as the
//! source's mount had them when the snapshot was taken (what a PVC restored
//! from a VolumeSnapshot must hold).

mod common;

use common::mount::{fuse_available, FuseMount as Mount};
use common::*;
use peregrine_proto::mgmt::*;

#[test]
fn clone_of_a_snapshot_holds_the_files_as_of_the_snapshot() {
    if !fuse_available() {
        return;
    }
    let c = Cluster::with_pool(
        ClusterSpec {
            engines: 3,
            targets: 2,
            device_mib: 512,
            scm_mib: 64,
        },
        768,
        "EC_2P1G1",
        "crc32c",
    );
    let tmp = tempfile::tempdir().unwrap();
    let src = Mount::start(&c, "cont", &tmp.path().join("src"), &[]);
    let wrote = sh(
        &src.dir,
        "set -e; mkdir -p snap/dir && cd snap
dd if=/dev/urandom of=a.bin bs=1M count=16 status=none
dd if=/dev/urandom of=b.bin bs=64k count=100 status=none
echo 'as of the snapshot' > dir/note
for i in $(seq 20); do echo 'small file '$i > s$i; done
sha256sum a.bin b.bin dir/note s* > ../at-snapshot.sha256
cat ../at-snapshot.sha256",
    );
    let files_at_snapshot = sh(&src.dir.join("snap"), "find . -type f | sort");
    let mut m = c.mgmt();
    let epoch =
        c.rt.block_on(m.snap_create(SnapCreateReq {
            pool: "pool".into(),
            cont: "cont".into(),
            name: "s1".into(),
        }))
        .unwrap()
        .into_inner()
        .epoch;
    sh(
        &src.dir,
        "set -e; cd snap
dd if=/dev/urandom of=a.bin bs=1M count=4 seek=6 conv=notrunc status=none
dd if=/dev/urandom bs=64k count=10 status=none >> b.bin
echo 'after the snapshot' > dir/note
dd if=/dev/urandom of=c.bin bs=1M count=2 status=none",
    );
    c.rt.block_on(m.cont_create(ContCreateReq {
        pool: "pool".into(),
        label: "copy".into(),
        clone_from: "cont".into(),
        clone_epoch: epoch,
        ..Default::default()
    }))
    .unwrap();
    let copy = Mount::start(&c, "copy", &tmp.path().join("copy"), &[]);
    let read = sh(
        &copy.dir,
        "cat at-snapshot.sha256; cd snap && sha256sum -c ../at-snapshot.sha256 >&2 && sha256sum a.bin b.bin dir/note s*; find . -type f | sort",
    );
    assert_eq!(
        read,
        format!("{wrote}{wrote}{}", files_at_snapshot),
        "the clone's files"
    );
}
