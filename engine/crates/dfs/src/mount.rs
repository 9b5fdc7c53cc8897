//! Mounting: finding or making the superblock and the root (see "Layout"
//! in the crate docs).

use crate::dfs::Inner;
use crate::legacy::RENAME_LEASE_NS;
use crate::{
    err, now_ns, Dfs, Entry, Node, DEFAULT_CHUNK_SIZE, INODE, LAYOUT_VERSION, LOCKS, ROOT_NAME,
    SB_DKEY, SB_LAYOUT, SB_MAGIC,
};
use peregrine::sync::Mutex;
use peregrine::{Container, DiscardQueue, Error, ObjectClass, ObjectId, Result};
use peregrine_proto::oclass::ALL_CLASSES;
use std::collections::HashMap;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;

fn parse_class(field: &str, v: &str, dflt: ObjectClass) -> Result<ObjectClass> {
    if v.is_empty() {
        return Ok(dflt);
    }
    v.parse::<ObjectClass>()
        .map_err(|e| Error::inval(format!("container property {field}: {e}")))
}

fn layout_value(root: ObjectId) -> Vec<u8> {
    let mut v = SB_MAGIC.to_vec();
    v.extend_from_slice(&LAYOUT_VERSION.to_le_bytes());
    v.extend_from_slice(&root.hi.to_le_bytes());
    v.extend_from_slice(&root.lo.to_le_bytes());
    v
}

fn parse_layout(v: &[u8]) -> Result<ObjectId> {
    if v.len() != SB_MAGIC.len() + 20 || !v.starts_with(SB_MAGIC) {
        return Err(err(libc::EIO, "superblock: bad magic or length"));
    }
    let p = SB_MAGIC.len();
    let ver = u32::from_le_bytes(v[p..p + 4].try_into().unwrap());
    if ver != LAYOUT_VERSION {
        return Err(err(
            libc::EPROTO,
            format!("superblock: layout version {ver}, this build reads {LAYOUT_VERSION}"),
        ));
    }
    let hi = u64::from_le_bytes(v[p + 4..p + 12].try_into().unwrap());
    let lo = u64::from_le_bytes(v[p + 12..p + 20].try_into().unwrap());
    Ok(ObjectId { hi, lo })
}

impl Dfs {
    /// Mount the POSIX namespace of `cont`; create it when absent and
    /// `create` is set (idempotent, safe for racing first mounts).
    pub fn mount(cont: Container, create: bool, read_only: bool) -> Result<Dfs> {
        let info = cont.info().clone();
        let file_class = parse_class("oclass", &info.oclass, ObjectClass::SX)?;
        let dir_class = parse_class(
            "dir_oclass",
            &info.dir_oclass,
            file_class.default_dir_class(),
        )?;
        let chunk_size = if info.chunk_size == 0 {
            DEFAULT_CHUNK_SIZE
        } else {
            info.chunk_size
        };
        let what = |e: Error| e.context(format!("container {:?}", cont.label()));
        // Find the superblock: current dir class first, then the others.
        let mut candidates = vec![dir_class];
        candidates.extend(ALL_CLASSES.iter().copied().filter(|c| *c != dir_class));
        let mut found = None;
        for c in candidates {
            let oid = ObjectId::new(c, 0, 0);
            let Ok(obj) = cont.object(oid) else { continue };
            if let Some(v) = obj.fetch_single(SB_DKEY, SB_LAYOUT).map_err(what)? {
                found = Some((oid, parse_layout(&v).map_err(what)?));
                break;
            }
        }
        let (sb, root_oid) = match found {
            Some(f) => f,
            None if !create || read_only => {
                return Err(what(err(
                    libc::ENOENT,
                    "no file system in this container (mount with create to make one)",
                )))
            }
            None => {
                let sb = ObjectId::new(dir_class, 0, 0);
                let root = ObjectId::new(dir_class, 0, 1);
                let obj = cont.object(sb).map_err(what)?;
                let t = now_ns();
                let e = Entry {
                    mode: libc::S_IFDIR | 0o755,
                    // SAFETY: geteuid takes no arguments and cannot fail.
                    uid: unsafe { libc::geteuid() },
                    // SAFETY: getegid takes no arguments and cannot fail.
                    gid: unsafe { libc::getegid() },
                    atime: t,
                    mtime: t,
                    ctime: t,
                    oid: root,
                    chunk_size,
                    size_hint: 0,
                    child_class: 0,
                    target: vec![],
                    moving: None,
                    from: None,
                    rdev: 0,
                    subdirs_counted: true,
                    linked: false,
                };
                // Root entry first: a superblock never points at nothing.
                if obj.fetch_single(ROOT_NAME, INODE).map_err(what)?.is_none() {
                    obj.update_single(ROOT_NAME, INODE, &e.encode())
                        .map_err(what)?;
                }
                obj.update_single(SB_DKEY, SB_LAYOUT, &layout_value(root))
                    .map_err(what)?;
                // Adopt whatever the store holds now.
                let v = obj
                    .fetch_single(SB_DKEY, SB_LAYOUT)
                    .map_err(what)?
                    .ok_or_else(|| what(err(libc::EIO, "superblock vanished after writing it")))?;
                (sb, parse_layout(&v).map_err(what)?)
            }
        };
        let sb_obj = cont.object(sb).map_err(what)?;
        let root_entry = match sb_obj.fetch_single(ROOT_NAME, INODE).map_err(what)? {
            Some(v) => Entry::decode(&v).map_err(what)?,
            None => return Err(what(err(libc::EIO, "superblock without a root entry"))),
        };
        if root_entry.oid != root_oid {
            return Err(what(err(
                libc::EIO,
                format!(
                    "superblock names root {root_oid} but the root entry holds {}",
                    root_entry.oid
                ),
            )));
        }
        let oid_hi = loop {
            let h: u64 = crate::unique_u64() & 0x00FF_FFFF_FFFF_FFFF;
            if h != 0 {
                break h;
            }
        };
        Ok(Dfs {
            inner: Arc::new(Inner {
                cont,
                sb,
                root: Node {
                    parent: sb,
                    name: ROOT_NAME.to_vec(),
                    entry: root_entry,
                },
                read_only,
                file_class,
                dir_class,
                chunk_size,
                oid_hi,
                next_lo: AtomicU64::new(1),
                locks: (0..LOCKS).map(|_| Mutex::new(())).collect(),
                dir_stats: Default::default(),
                touches: Mutex::new(HashMap::new()),
                counts: Mutex::new(HashMap::new()),
                rename_lease_ns: RENAME_LEASE_NS.into(),
                discards: DiscardQueue::default(),
            }),
        })
    }
}
