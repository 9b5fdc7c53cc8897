//! Access control lists of pools and containers, as DAOS has them
//! (docs/access-control.md): who may read, write and administer.
//!
//! An ACL is a list of entries `A:<flags>:<principal>:<perms>`, written
//! one after another separated by commas (or newlines, in a file):
//! - type `A` (allow: there are no deny entries, a principal has what its
//!   entry grants and nothing else);
//! - flags empty, or `G` for a group principal;
//! - principal `OWNER@`, `GROUP@` (flag `G`: the owner group), `EVERYONE@`,
//!   or a user or group name followed by `@` (`alice@`, `A:G:staff@:r`);
//!   a decimal name matches that uid or gid;
//! - perms a non-empty subset of `rwa`: read, write, administer.
//!
//! Which entry applies (DAOS's order, first match wins): the owner gets
//! `OWNER@`; a user named by an entry gets that entry; otherwise every
//! group entry that matches (`GROUP@` for members of the owner group)
//! counts, their perms joined; otherwise `EVERYONE@`; otherwise nothing.

use std::fmt;

/// Most entries one ACL may have (it travels in every pool and container
/// description and is checked on every open).
pub const MAX_ENTRIES: usize = 64;
/// Longest user or group name in an entry.
pub const MAX_NAME: usize = 255;

/// What an entry grants.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Perms(u8);

impl Perms {
    pub const NONE: Perms = Perms(0);
    /// Read data and descriptions (pool connect, container open for reading).
    pub const READ: Perms = Perms(1);
    /// Write data (container open for writing).
    pub const WRITE: Perms = Perms(2);
    /// Change the ACL and properties, destroy.
    pub const ADMIN: Perms = Perms(4);
    pub const ALL: Perms = Perms(7);

    pub fn contains(self, other: Perms) -> bool {
        self.0 & other.0 == other.0
    }
    pub fn union(self, other: Perms) -> Perms {
        Perms(self.0 | other.0)
    }
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    fn parse(s: &str) -> Result<Perms, String> {
        let mut p = Perms::NONE;
        for c in s.chars() {
            let bit = match c {
                'r' => Perms::READ,
                'w' => Perms::WRITE,
                'a' => Perms::ADMIN,
                other => {
                    return Err(format!(
                        "permission {other:?}: want r (read), w (write) or a (administer)"
                    ))
                }
            };
            if p.contains(bit) {
                return Err(format!("permission {c:?} given twice"));
            }
            p = p.union(bit);
        }
        if p.is_empty() {
            return Err("no permissions (want a subset of rwa)".into());
        }
        Ok(p)
    }
}

impl fmt::Display for Perms {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (bit, c) in [(Perms::READ, 'r'), (Perms::WRITE, 'w'), (Perms::ADMIN, 'a')] {
            if self.contains(bit) {
                write!(f, "{c}")?;
            }
        }
        Ok(())
    }
}

/// Whom an entry is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Principal {
    Owner,
    OwnerGroup,
    Everyone,
    User(String),
    Group(String),
}

impl fmt::Display for Principal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Principal::Owner => write!(f, "OWNER@"),
            Principal::OwnerGroup => write!(f, "GROUP@"),
            Principal::Everyone => write!(f, "EVERYONE@"),
            Principal::User(n) | Principal::Group(n) => write!(f, "{n}@"),
        }
    }
}

impl Principal {
    fn flags(&self) -> &'static str {
        match self {
            Principal::OwnerGroup | Principal::Group(_) => "G",
            _ => "",
        }
    }

    /// A principal as the CLI names one to remove: `OWNER@`, `GROUP@`,
    /// `EVERYONE@`, `u:NAME@` or `g:NAME@` (a bare `NAME@` is a user).
    pub fn parse(s: &str) -> Result<Principal, String> {
        let (group, name) = match s.split_once(':') {
            Some(("u", n)) => (false, n),
            Some(("g", n)) => (true, n),
            Some((k, _)) => return Err(format!("principal {s:?}: kind {k:?}: want u or g")),
            None => (s == "GROUP@", s),
        };
        principal(group, name).map_err(|e| format!("principal {s:?}: {e}"))
    }
}

/// A user or group name with its `@` (or the name alone), checked;
/// returned without the `@`.
pub fn parse_name(s: &str) -> Result<String, String> {
    let n = s.strip_suffix('@').unwrap_or(s);
    if n.is_empty() || n.len() > MAX_NAME {
        return Err(format!(
            "name {s:?}: want 1 to {MAX_NAME} characters before the @"
        ));
    }
    if let Some(c) = n
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | '$')))
    {
        return Err(format!(
            "name {s:?}: character {c:?} (want letters, digits, '.', '_', '-', '$')"
        ));
    }
    Ok(n.to_string())
}

fn principal(group: bool, s: &str) -> Result<Principal, String> {
    Ok(match (s, group) {
        ("OWNER@", false) => Principal::Owner,
        ("GROUP@", true) => Principal::OwnerGroup,
        ("EVERYONE@", false) => Principal::Everyone,
        ("OWNER@" | "EVERYONE@", true) => return Err(format!("{s} takes no G flag")),
        ("GROUP@", false) => return Err("GROUP@ needs the G flag (A:G:GROUP@:...)".into()),
        _ if !s.ends_with('@') => return Err(format!("{s:?}: a name ends with @")),
        _ if group => Principal::Group(parse_name(s)?),
        _ => Principal::User(parse_name(s)?),
    })
}

/// One entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ace {
    pub principal: Principal,
    pub perms: Perms,
}

impl Ace {
    fn parse(s: &str) -> Result<Ace, String> {
        let parts: Vec<&str> = s.split(':').collect();
        let [kind, flags, who, perms] = parts[..] else {
            return Err("want A:<flags>:<principal>:<perms>".into());
        };
        if kind != "A" {
            return Err(format!("type {kind:?}: only A (allow) entries exist"));
        }
        let group = match flags {
            "" => false,
            "G" => true,
            other => return Err(format!("flags {other:?}: want none or G")),
        };
        Ok(Ace {
            principal: principal(group, who)?,
            perms: Perms::parse(perms)?,
        })
    }
}

impl fmt::Display for Ace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "A:{}:{}:{}",
            self.principal.flags(),
            self.principal,
            self.perms
        )
    }
}

/// A checked ACL: at most [`MAX_ENTRIES`], each principal once.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Acl {
    entries: Vec<Ace>,
}

/// The ACL of a pool or container made without one: the owner may do
/// everything, the owner group read and write.
pub const DEFAULT_ACL: &str = "A::OWNER@:rwa,A:G:GROUP@:rw";

/// Who asks: a user, its uid and its groups (names or decimal gids).
#[derive(Clone, Copy, Debug)]
pub struct Who<'a> {
    pub user: &'a str,
    pub uid: u32,
    pub groups: &'a [String],
}

impl Who<'_> {
    fn is_user(&self, name: &str) -> bool {
        name == self.user || name.parse::<u32>() == Ok(self.uid)
    }
    fn in_group(&self, name: &str) -> bool {
        self.groups.iter().any(|g| g == name)
    }
}

impl Acl {
    /// An ACL from its text (entries separated by commas or newlines);
    /// the error names the entry at fault.
    pub fn parse(s: &str) -> Result<Acl, String> {
        let mut acl = Acl::default();
        for (i, e) in s
            .split([',', '\n'])
            .map(str::trim)
            .filter(|e| !e.is_empty() && !e.starts_with('#'))
            .enumerate()
        {
            let ace = Ace::parse(e).map_err(|why| format!("ACL entry {} {e:?}: {why}", i + 1))?;
            if acl.entries.iter().any(|a| a.principal == ace.principal) {
                return Err(format!(
                    "ACL entry {} {e:?}: {} has an entry already",
                    i + 1,
                    ace.principal
                ));
            }
            acl.entries.push(ace);
        }
        acl.check_len()?;
        Ok(acl)
    }

    fn check_len(&self) -> Result<(), String> {
        if self.entries.len() > MAX_ENTRIES {
            return Err(format!(
                "ACL of {} entries: at most {MAX_ENTRIES}",
                self.entries.len()
            ));
        }
        Ok(())
    }

    pub fn entries(&self) -> &[Ace] {
        &self.entries
    }

    /// Add `other`'s entries, replacing those of the same principals.
    pub fn update(&mut self, other: &Acl) -> Result<(), String> {
        for ace in &other.entries {
            match self
                .entries
                .iter_mut()
                .find(|a| a.principal == ace.principal)
            {
                Some(a) => a.perms = ace.perms,
                None => self.entries.push(ace.clone()),
            }
        }
        self.check_len()
    }

    /// Remove the entry of `p`; whether there was one.
    pub fn remove(&mut self, p: &Principal) -> bool {
        let before = self.entries.len();
        self.entries.retain(|a| &a.principal != p);
        self.entries.len() != before
    }

    fn of(&self, p: &Principal) -> Option<Perms> {
        self.entries
            .iter()
            .find(|a| &a.principal == p)
            .map(|a| a.perms)
    }

    /// What `who` may do on an object owned by user `owner` and group
    /// `group` (names without `@`).
    pub fn perms(&self, who: &Who, owner: &str, group: &str) -> Perms {
        if who.is_user(owner) {
            return self.of(&Principal::Owner).unwrap_or_default();
        }
        if let Some(p) = self.entries.iter().find_map(|a| match &a.principal {
            Principal::User(n) if who.is_user(n) => Some(a.perms),
            _ => None,
        }) {
            return p;
        }
        let mut matched = None;
        for a in &self.entries {
            let member = match &a.principal {
                Principal::OwnerGroup => who.in_group(group),
                Principal::Group(n) => who.in_group(n),
                _ => false,
            };
            if member {
                matched = Some(matched.unwrap_or(Perms::NONE).union(a.perms));
            }
        }
        matched
            .or_else(|| self.of(&Principal::Everyone))
            .unwrap_or_default()
    }
}

impl fmt::Display for Acl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, a) in self.entries.iter().enumerate() {
            if i > 0 {
                write!(f, ",")?;
            }
            write!(f, "{a}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who<'a>(user: &'a str, uid: u32, groups: &'a [String]) -> Who<'a> {
        Who { user, uid, groups }
    }

    #[test]
    fn entries_round_trip_and_errors_name_the_entry() {
        let a = Acl::parse("A::OWNER@:rwa, A:G:GROUP@:rw\nA::alice@:r,A:G:staff@:w,A::EVERYONE@:r")
            .unwrap();
        assert_eq!(
            a.to_string(),
            "A::OWNER@:rwa,A:G:GROUP@:rw,A::alice@:r,A:G:staff@:w,A::EVERYONE@:r"
        );
        assert_eq!(Acl::parse(&a.to_string()).unwrap(), a);
        for (bad, says) in [
            ("A::alice@:rx", "entry 1"),
            ("A::OWNER@:rw,D::bob@:r", "only A"),
            ("A::bob:r", "ends with @"),
            ("A::GROUP@:r", "G flag"),
            ("A:G:OWNER@:r", "no G flag"),
            ("A::alice@:r,A::alice@:w", "has an entry already"),
            ("A::al ice@:r", "character"),
            ("A::alice@:", "no permissions"),
            ("A::alice@:rr", "twice"),
            ("A:X:alice@:r", "flags"),
            ("A::alice@", "want A:"),
        ] {
            let e = Acl::parse(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
        let many: Vec<String> = (0..=MAX_ENTRIES).map(|i| format!("A::u{i}@:r")).collect();
        assert!(Acl::parse(&many.join(",")).unwrap_err().contains("at most"));
    }

    #[test]
    fn the_first_matching_class_of_entry_decides() {
        let a =
            Acl::parse("A::OWNER@:rwa,A:G:GROUP@:r,A::bob@:w,A:G:staff@:w,A::EVERYONE@:r").unwrap();
        let none: Vec<String> = vec![];
        let staff = vec!["staff".to_string()];
        let both = vec!["owners".to_string(), "staff".to_string()];
        // The owner, by name or by uid.
        assert_eq!(a.perms(&who("ann", 7, &none), "ann", "owners"), Perms::ALL);
        assert_eq!(a.perms(&who("7", 7, &none), "7", "owners"), Perms::ALL);
        // A named user: its entry only, even if its groups grant more.
        assert_eq!(
            a.perms(&who("bob", 8, &both), "ann", "owners"),
            Perms::WRITE
        );
        // Groups join.
        assert_eq!(
            a.perms(&who("cy", 9, &both), "ann", "owners"),
            Perms::READ.union(Perms::WRITE)
        );
        assert_eq!(
            a.perms(&who("cy", 9, &staff), "ann", "owners"),
            Perms::WRITE
        );
        // Everyone else.
        assert_eq!(
            a.perms(&who("dan", 10, &none), "ann", "owners"),
            Perms::READ
        );
        // No EVERYONE@ entry: nothing.
        let strict = Acl::parse(DEFAULT_ACL).unwrap();
        assert!(strict
            .perms(&who("dan", 10, &none), "ann", "owners")
            .is_empty());
        // An owner without an OWNER@ entry has nothing from it.
        let no_owner = Acl::parse("A::EVERYONE@:r").unwrap();
        assert!(no_owner.perms(&who("ann", 7, &none), "ann", "g").is_empty());
    }

    #[test]
    fn update_replaces_and_remove_drops_one_principal() {
        let mut a = Acl::parse(DEFAULT_ACL).unwrap();
        a.update(&Acl::parse("A:G:GROUP@:r,A::alice@:rw").unwrap())
            .unwrap();
        assert_eq!(a.to_string(), "A::OWNER@:rwa,A:G:GROUP@:r,A::alice@:rw");
        assert!(a.remove(&Principal::parse("u:alice@").unwrap()));
        assert!(!a.remove(&Principal::parse("alice@").unwrap()));
        assert!(a.remove(&Principal::parse("GROUP@").unwrap()));
        assert_eq!(a.to_string(), "A::OWNER@:rwa");
        assert!(Principal::parse("x:alice@").is_err());
        assert_eq!(
            Principal::parse("g:staff@").unwrap(),
            Principal::Group("staff".into())
        );
    }
}
