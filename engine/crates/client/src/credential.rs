//! The user a process acts for, as the management service checks it
//! against ACLs ([`Credential`], docs/access-control.md): the effective uid
//! and gid, the user's name and the names of its groups, as this node
//! knows them (a decimal id where it has no name).

use peregrine_proto::mgmt::Credential;
use std::ffi::CStr;

/// Most groups a credential lists (the service refuses more).
const MAX_GROUPS: usize = 256;

/// The credential of this process.
pub fn of_process() -> Credential {
    // SAFETY: geteuid and getegid cannot fail and touch no memory of ours.
    let (uid, gid) = unsafe { (libc::geteuid(), libc::getegid()) };
    of_ids(uid, gid, &supplementary_groups())
}

/// The credential of user `uid` with primary group `gid` and the
/// supplementary groups `groups` (e.g. a peer's, from SO_PEERCRED and its
/// /proc status).
pub fn of_ids(uid: u32, gid: u32, groups: &[u32]) -> Credential {
    let mut names = vec![group_name(gid)];
    for &g in groups.iter().filter(|&&g| g != gid) {
        if names.len() == MAX_GROUPS {
            break;
        }
        names.push(group_name(g));
    }
    Credential {
        uid,
        gid,
        user: user_name(uid),
        groups: names,
    }
}

/// The credential of a peer on this node known by its uid and gid (from
/// SO_PEERCRED): its supplementary groups are those the node's group
/// database gives its user (as `id` shows), not what the peer says.
pub fn of_peer(uid: u32, gid: u32) -> Credential {
    of_ids(uid, gid, &database_groups(uid, gid))
}

fn database_groups(uid: u32, gid: u32) -> Vec<u32> {
    let Some(name) = user_db_name(uid) else {
        return vec![];
    };
    let Ok(name) = std::ffi::CString::new(name) else {
        return vec![];
    };
    let mut n: libc::c_int = 64;
    loop {
        let mut v = vec![0 as libc::gid_t; n as usize];
        let mut got = n;
        // SAFETY: name is NUL-terminated; v has room for `got` entries, and
        // getgrouplist writes at most that many (and the count it needs).
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, v.as_mut_ptr(), &mut got) };
        if rc >= 0 {
            v.truncate(got.max(0) as usize);
            return v;
        }
        if got <= n || got as usize > MAX_GROUPS * 4 {
            return vec![];
        }
        n = got;
    }
}

fn supplementary_groups() -> Vec<u32> {
    // SAFETY: with a null list and 0, getgroups only returns the count.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n <= 0 {
        return vec![];
    }
    let mut v = vec![0 as libc::gid_t; n as usize];
    // SAFETY: v has room for n entries, and getgroups writes at most n.
    let got = unsafe { libc::getgroups(n, v.as_mut_ptr()) };
    v.truncate(got.max(0) as usize);
    v
}

/// A name fit for an ACL (see `peregrine_proto::acl::parse_name`), else
/// the decimal id.
fn fit(name: Option<String>, id: u32) -> String {
    match name {
        Some(n) if peregrine_proto::acl::parse_name(&n).is_ok() => n,
        _ => id.to_string(),
    }
}

fn user_name(uid: u32) -> String {
    // uid 0 is root on every node, whatever its passwd file says (images
    // without one included).
    fit(
        user_db_name(uid).or_else(|| (uid == 0).then(|| "root".into())),
        uid,
    )
}

/// The user's name in the node's passwd database.
fn user_db_name(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: zeroed passwd is a valid out-parameter for getpwuid_r.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: every pointer is to live memory of the sizes given.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pw, buf.as_mut_ptr(), buf.len(), &mut out) };
    (rc == 0 && !out.is_null()).then(|| {
        // SAFETY: on success pw_name points to a NUL-terminated string in buf.
        unsafe { CStr::from_ptr(pw.pw_name) }
            .to_string_lossy()
            .into_owned()
    })
}

fn group_name(gid: u32) -> String {
    let mut buf = vec![0 as libc::c_char; 16384];
    // SAFETY: zeroed group is a valid out-parameter for getgrgid_r.
    let mut gr: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer is to live memory of the sizes given.
    let rc = unsafe { libc::getgrgid_r(gid, &mut gr, buf.as_mut_ptr(), buf.len(), &mut out) };
    let name = (rc == 0 && !out.is_null()).then(|| {
        // SAFETY: on success gr_name points to a NUL-terminated string in buf.
        unsafe { CStr::from_ptr(gr.gr_name) }
            .to_string_lossy()
            .into_owned()
    });
    fit(name.or_else(|| (gid == 0).then(|| "root".into())), gid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_process_and_unknown_ids() {
        let c = of_process();
        // SAFETY: geteuid cannot fail.
        assert_eq!(c.uid, unsafe { libc::geteuid() });
        assert!(!c.user.is_empty() && !c.groups.is_empty());
        let root = of_ids(0, 0, &[0, 4_000_000_000]);
        assert_eq!(root.user, "root");
        assert_eq!(root.groups, vec!["root".to_string(), "4000000000".into()]);
        let nobody = of_ids(3_999_999_999, 3_999_999_998, &[]);
        assert_eq!(nobody.user, "3999999999");
        assert_eq!(nobody.groups, vec!["3999999998".to_string()]);
    }
}
