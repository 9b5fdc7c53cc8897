//! Extended attributes: akeys `"x:" + name` of the entry's dkey, and the
//! object-class xattr ([`crate::OCLASS_XATTR`]) kept in a directory's entry.

use crate::{
    err, now_ns, show, Dfs, Node, Xattrs, NAME_MAX, OCLASS_XATTR, XATTR_SIZE_MAX, XPREFIX,
};
use peregrine::{Error, ObjectClass, ObjectId, Result};

fn xattr_akey(name: &[u8]) -> Vec<u8> {
    [XPREFIX, name].concat()
}

impl Dfs {
    /// The xattr akeys of an entry ("x:..." names, with prefix).
    pub(crate) fn xattr_keys(&self, parent: ObjectId, name: &[u8]) -> Result<Vec<Vec<u8>>> {
        Ok(self
            .obj(parent)?
            .list_akeys(name)?
            .into_iter()
            .filter(|k| k.starts_with(XPREFIX))
            .collect())
    }

    pub(crate) fn xattrs(&self, parent: ObjectId, name: &[u8]) -> Result<Xattrs> {
        let o = self.obj(parent)?;
        let mut out = Vec::new();
        for k in self.xattr_keys(parent, name)? {
            if let Some(v) = o.fetch_single(name, &k)? {
                out.push((k, v));
            }
        }
        Ok(out)
    }

    /// setxattr(2): `flags` XATTR_CREATE (1) / XATTR_REPLACE (2).
    pub fn setxattr(&self, node: &Node, name: &[u8], value: &[u8], flags: i32) -> Result<()> {
        self.check_rw()?;
        check_xattr_name(name)?;
        if value.len() > XATTR_SIZE_MAX {
            return Err(err(
                libc::E2BIG,
                format!("xattr value of {} bytes", value.len()),
            ));
        }
        let _g = self.lock(&[(node.parent, &node.name)]);
        let (mut n, epoch) = self.versioned(node)?;
        if name == OCLASS_XATTR.as_bytes() {
            if !n.is_dir() {
                return Err(Error::inval(format!(
                    "{OCLASS_XATTR} applies to directories only"
                )));
            }
            let s = std::str::from_utf8(value)
                .unwrap_or("")
                .trim_end_matches('\0');
            let class = s
                .parse::<ObjectClass>()
                .map_err(|e| Error::inval(format!("{OCLASS_XATTR}: {e}")))?;
            // Usable in this pool?
            self.obj(ObjectId::new(class, 0, 0))
                .map_err(|e| Error::inval(format!("{OCLASS_XATTR} {class}: {}", e.msg)))?;
            let exists = n.entry.child_class != 0;
            xattr_flags_check(flags, exists, name)?;
            n.entry.child_class = class.id();
            n.entry.ctime = now_ns();
            let r = self.replace_entry(&n, epoch);
            self.dir_entry_changed(n.oid());
            return r;
        }
        let o = self.obj(n.parent)?;
        let key = xattr_akey(name);
        if flags != 0 {
            let exists = o.fetch_single(&n.name, &key)?.is_some();
            xattr_flags_check(flags, exists, name)?;
        }
        o.update_single(&n.name, &key, value)
    }

    pub fn getxattr(&self, node: &Node, name: &[u8]) -> Result<Vec<u8>> {
        check_xattr_name(name)?;
        if name == OCLASS_XATTR.as_bytes() {
            let n = self.refresh(node)?;
            return match ObjectClass::from_id(n.entry.child_class) {
                Some(c) => Ok(c.name().as_bytes().to_vec()),
                None => Err(err(libc::ENODATA, format!("no xattr {OCLASS_XATTR}"))),
            };
        }
        let key = xattr_akey(name);
        if let Some(v) = self.obj(node.parent)?.fetch_single(&node.name, &key)? {
            return Ok(v);
        }
        // A name that became a hard link since `node` was read: its xattrs
        // moved to the inode record.
        let n = self.refresh(node)?;
        match self.is_record(&n) && !self.is_record(node) {
            true => self.obj(n.parent)?.fetch_single(&n.name, &key)?,
            false => None,
        }
        .ok_or_else(|| err(libc::ENODATA, format!("no xattr {:?}", show(name))))
    }

    /// `node` as stored now, with the epoch of its entry's version.
    fn versioned(&self, node: &Node) -> Result<(Node, u64)> {
        self.node_versioned(node.parent, &node.name)?
            .ok_or_else(|| {
                err(
                    libc::ENOENT,
                    format!("{:?}: entry removed", show(&node.name)),
                )
            })
    }

    pub fn listxattr(&self, node: &Node) -> Result<Vec<Vec<u8>>> {
        let n = self.refresh(node)?;
        let mut out: Vec<Vec<u8>> = self
            .xattr_keys(n.parent, &n.name)?
            .into_iter()
            .map(|k| k[XPREFIX.len()..].to_vec())
            .collect();
        if n.entry.child_class != 0 {
            out.push(OCLASS_XATTR.as_bytes().to_vec());
        }
        Ok(out)
    }

    pub fn removexattr(&self, node: &Node, name: &[u8]) -> Result<()> {
        self.check_rw()?;
        check_xattr_name(name)?;
        let _g = self.lock(&[(node.parent, &node.name)]);
        let (mut n, epoch) = self.versioned(node)?;
        if name == OCLASS_XATTR.as_bytes() {
            if n.entry.child_class == 0 {
                return Err(err(libc::ENODATA, format!("no xattr {OCLASS_XATTR}")));
            }
            n.entry.child_class = 0;
            let r = self.replace_entry(&n, epoch);
            self.dir_entry_changed(n.oid());
            return r;
        }
        let o = self.obj(n.parent)?;
        let key = xattr_akey(name);
        if o.fetch_single(&n.name, &key)?.is_none() {
            return Err(err(libc::ENODATA, format!("no xattr {:?}", show(name))));
        }
        o.punch_akeys(&n.name, &[&key])
    }
}

fn check_xattr_name(name: &[u8]) -> Result<()> {
    if name.is_empty() || name.len() > NAME_MAX {
        return Err(err(
            libc::ERANGE,
            format!("xattr name of {} bytes", name.len()),
        ));
    }
    Ok(())
}

fn xattr_flags_check(flags: i32, exists: bool, name: &[u8]) -> Result<()> {
    if flags & libc::XATTR_CREATE != 0 && exists {
        return Err(err(libc::EEXIST, format!("xattr {:?} exists", show(name))));
    }
    if flags & libc::XATTR_REPLACE != 0 && !exists {
        return Err(err(libc::ENODATA, format!("no xattr {:?}", show(name))));
    }
    Ok(())
}
