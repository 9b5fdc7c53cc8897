//! The ACL commands' logic, apart from the gRPC calls: what the stored
//! properties `acl`, `owner` and `group` of a pool or container say, the
//! changes `update-acl` and `delete-acl` make, and how they print
//! (docs/access-control.md).

use peregrine_proto::acl::{parse_name, Acl, Principal, DEFAULT_ACL};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::io::Write;
use std::path::Path;

/// Owner and group of an object whose properties name none.
pub const DEFAULT_OWNER: &str = "root";

/// An object's access properties, as its properties hold them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// The owner user, without `@` (a name, or a decimal uid).
    pub owner: String,
    /// The owner group, without `@`.
    pub group: String,
    pub acl: Acl,
}

impl Access {
    /// From a pool's or container's properties: no `acl` is the default
    /// ACL, no `owner` or `group` is root.
    pub fn of_props(props: &HashMap<String, String>) -> Result<Access, String> {
        let text = props.get("acl").map_or(DEFAULT_ACL, String::as_str);
        let acl = Acl::parse(text).map_err(|e| format!("the stored property acl: {e}"))?;
        let name = |k: &str| {
            props
                .get(k)
                .map(|v| v.trim_end_matches('@'))
                .filter(|v| !v.is_empty())
                .unwrap_or(DEFAULT_OWNER)
                .to_string()
        };
        Ok(Access {
            owner: name("owner"),
            group: name("group"),
            acl,
        })
    }

    /// The DAOS form: owner and group as comments, then one entry a line
    /// (what `--acl-file` reads back).
    pub fn write(&self, o: &mut impl Write) -> std::io::Result<()> {
        writeln!(o, "# Owner: {}@", self.owner)?;
        writeln!(o, "# Owner-Group: {}@", self.group)?;
        for e in self.acl.entries() {
            writeln!(o, "{e}")?;
        }
        Ok(())
    }

    pub fn json(&self) -> Value {
        json!({
            "owner": format!("{}@", self.owner),
            "group": format!("{}@", self.group),
            "acl": self.acl.entries().iter().map(ToString::to_string).collect::<Vec<_>>(),
        })
    }
}

/// One or more entries given with `--entry` (commas may separate several).
pub fn parse_entries(s: &str) -> Result<Acl, String> {
    let acl = Acl::parse(s)?;
    if acl.entries().is_empty() {
        return Err("no ACL entry (want A:<flags>:<principal>:<perms>)".into());
    }
    Ok(acl)
}

/// A principal to remove: `OWNER@`, `GROUP@`, `EVERYONE@`, `u:NAME@`, `g:NAME@`.
pub fn parse_principal(s: &str) -> Result<Principal, String> {
    Principal::parse(s.trim())
}

/// An owner user or group: `NAME@` (the `@` may be left out) or a decimal
/// id; returned as the property holds it, without the `@`.
pub fn parse_owner(s: &str) -> Result<String, String> {
    parse_name(s.trim())
}

/// The entries of an ACL file: one entry a line (or several separated by
/// commas), `#` comment lines, as `get-acl` prints.
pub fn read_file(path: &Path) -> Result<Acl, String> {
    let what = format!("ACL file {}", path.display());
    let text = std::fs::read_to_string(path).map_err(|e| format!("{what}: {e}"))?;
    let acl = Acl::parse(&text).map_err(|e| format!("{what}: {e}"))?;
    if acl.entries().is_empty() {
        return Err(format!("{what}: no entries"));
    }
    Ok(acl)
}

/// Several `--entry` flags as one set of entries; a principal given twice is
/// an error rather than a silent last-one-wins.
pub fn join(parts: &[Acl]) -> Result<Acl, String> {
    let mut all = Acl::default();
    for p in parts {
        for e in p.entries() {
            if all.entries().iter().any(|a| a.principal == e.principal) {
                return Err(format!(
                    "entry \"{e}\": {} has another entry in this command",
                    name(&e.principal)
                ));
            }
        }
        all.update(p)?;
    }
    Ok(all)
}

/// `current` with `add`'s entries, those of the same principals replaced.
pub fn updated(current: &Acl, add: &Acl) -> Result<Acl, String> {
    let mut a = current.clone();
    a.update(add)?;
    Ok(a)
}

/// `current` without the entry of `p`; an error if it has none.
pub fn removed(current: &Acl, p: &Principal) -> Result<Acl, String> {
    let mut a = current.clone();
    if !a.remove(p) {
        return Err(format!("the ACL has no entry for {}", name(p)));
    }
    Ok(a)
}

/// A principal as `--principal` names it (`u:alice@`, `g:staff@`, `GROUP@`).
pub fn name(p: &Principal) -> String {
    match p {
        Principal::User(n) => format!("u:{n}@"),
        Principal::Group(n) => format!("g:{n}@"),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn props(kv: &[(&str, &str)]) -> HashMap<String, String> {
        kv.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn text(a: &Access) -> String {
        let mut o = Vec::new();
        a.write(&mut o).unwrap();
        String::from_utf8(o).unwrap()
    }

    #[test]
    fn unset_properties_are_the_defaults() {
        let a = Access::of_props(&props(&[("rf", "1")])).unwrap();
        assert_eq!(
            text(&a),
            "# Owner: root@\n# Owner-Group: root@\nA::OWNER@:rwa\nA:G:GROUP@:rw\n"
        );
        assert_eq!(
            a.json(),
            json!({"owner": "root@", "group": "root@", "acl": ["A::OWNER@:rwa", "A:G:GROUP@:rw"]})
        );
    }

    #[test]
    fn stored_properties_print_one_entry_a_line() {
        let a = Access::of_props(&props(&[
            ("acl", "A::OWNER@:rwa,A::bob@:r,A:G:staff@:rw"),
            ("owner", "ann"),
            ("group", "staff"),
        ]))
        .unwrap();
        let t = text(&a);
        assert_eq!(
            t,
            "# Owner: ann@\n# Owner-Group: staff@\nA::OWNER@:rwa\nA::bob@:r\nA:G:staff@:rw\n"
        );
        // What get-acl prints is an ACL file update-acl reads back.
        assert_eq!(Acl::parse(&t).unwrap(), a.acl);
        let bad = Access::of_props(&props(&[("acl", "A::bob:r")])).unwrap_err();
        assert!(bad.contains("stored property acl"), "{bad}");
    }

    #[test]
    fn update_merges_and_delete_needs_an_entry() {
        let cur = Acl::parse(DEFAULT_ACL).unwrap();
        let add = join(&[
            parse_entries("A:G:GROUP@:r").unwrap(),
            parse_entries("A::alice@:rw,A::EVERYONE@:r").unwrap(),
        ])
        .unwrap();
        let new = updated(&cur, &add).unwrap();
        assert_eq!(
            new.to_string(),
            "A::OWNER@:rwa,A:G:GROUP@:r,A::alice@:rw,A::EVERYONE@:r"
        );
        let new = removed(&new, &parse_principal("u:alice@").unwrap()).unwrap();
        let new = removed(&new, &parse_principal("EVERYONE@").unwrap()).unwrap();
        assert_eq!(new.to_string(), "A::OWNER@:rwa,A:G:GROUP@:r");
        let e = removed(&new, &parse_principal("g:staff@").unwrap()).unwrap_err();
        assert_eq!(e, "the ACL has no entry for g:staff@");
        // A user alice@ and a group alice@ are two principals.
        let e = removed(&cur, &parse_principal("alice@").unwrap()).unwrap_err();
        assert!(e.contains("u:alice@"), "{e}");
    }

    #[test]
    fn entries_and_principals_are_checked() {
        let e = parse_entries("A::bob@:rx").unwrap_err();
        assert!(e.contains("\"A::bob@:rx\""), "{e}");
        assert!(parse_entries(" ").unwrap_err().contains("no ACL entry"));
        let e = join(&[
            parse_entries("A::bob@:r").unwrap(),
            parse_entries("A::bob@:rw").unwrap(),
        ])
        .unwrap_err();
        assert!(e.contains("u:bob@ has another entry"), "{e}");
        assert_eq!(parse_principal("GROUP@").unwrap(), Principal::OwnerGroup);
        assert!(parse_principal("x:bob@").is_err());
        assert!(parse_principal("u:bob").is_err());
        assert_eq!(parse_owner("ann@").unwrap(), "ann");
        assert_eq!(parse_owner("1000").unwrap(), "1000");
        assert!(parse_owner("a b@").is_err());
        assert!(parse_owner("@").is_err());
    }

    #[test]
    fn acl_files_have_comments_and_name_the_bad_entry() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("acl");
        std::fs::write(
            &f,
            "# Owner: ann@\n# Owner-Group: staff@\nA::OWNER@:rwa\n\nA:G:staff@:r\n",
        )
        .unwrap();
        assert_eq!(
            read_file(&f).unwrap().to_string(),
            "A::OWNER@:rwa,A:G:staff@:r"
        );
        std::fs::write(&f, "A::OWNER@:rwa\nA::bob@:q\n").unwrap();
        let e = read_file(&f).unwrap_err();
        assert!(e.contains("entry 2 \"A::bob@:q\""), "{e}");
        std::fs::write(&f, "# nothing\n").unwrap();
        assert!(read_file(&f).unwrap_err().contains("no entries"));
        assert!(read_file(&d.path().join("missing")).is_err());
    }
}
