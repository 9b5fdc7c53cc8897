//! The shared harness (crates/testcluster) and what the POSIX layer's
//! tests share: a cluster with containers, mounts, and readers.
#![allow(unused_imports, dead_code)]
use peregrine_dfs::{Dfs, Node};
use peregrine_proto::mgmt::ContCreateReq;
pub use peregrine_testcluster::*;

pub fn code(r: Result<impl std::fmt::Debug, peregrine::Error>) -> i32 {
    match r {
        Ok(v) => panic!("expected an error, got {v:?}"),
        Err(e) => -e.code,
    }
}

/// A cluster with container "small" (chunk 64 KiB) beside the default one.
pub fn cluster(engines: u32) -> Cluster {
    let c = Cluster::with_pool(
        ClusterSpec {
            engines,
            ..Default::default()
        },
        128,
        "SX",
        "crc32c",
    );
    let mut m = c.mgmt();
    c.rt.block_on(m.cont_create(ContCreateReq {
        pool: "pool".into(),
        label: "small".into(),
        oclass: "SX".into(),
        chunk_size: 64 << 10,
        ..Default::default()
    }))
    .unwrap();
    c
}

pub fn mount(c: &Cluster, cont: &str, ro: bool) -> Dfs {
    let client = c.client();
    let pool = client.pool_connect("pool").unwrap();
    Dfs::mount(pool.cont_open(cont).unwrap(), !ro, ro).unwrap()
}

pub fn names(fs: &Dfs, dir: &Node) -> Vec<Vec<u8>> {
    let h = fs.opendir(dir).unwrap();
    fs.readdir(&h, 0, usize::MAX)
        .unwrap()
        .into_iter()
        .map(|e| e.name)
        .collect()
}

pub fn read_all(fs: &Dfs, n: &Node) -> Vec<u8> {
    let f = fs.open(n).unwrap();
    let mut buf = vec![0u8; f.size().unwrap() as usize];
    let got = f.read_at(0, &mut buf).unwrap();
    buf.truncate(got);
    buf
}

pub fn nlink(fs: &Dfs, path: &str) -> u32 {
    fs.getattr(&fs.lookup_path(path).unwrap()).unwrap().1.nlink
}
