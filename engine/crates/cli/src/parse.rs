//! Parsers for command-line values: sizes, object ids, properties, rank lists.
//!
//! Each returns a plain `String` error describing the value; clap names the flag,
//! and `main` folds both into the one-line `peregrine: --flag "value": reason` form.

use peregrine_proto::oclass::{ObjectClass, ObjectId};

/// A byte count given on the command line (`1GiB`, `512MiB`, `4G`, `100M`, `4096`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Size(pub u64);

pub fn parse_size(s: &str) -> Result<Size, String> {
    peregrine_proto::size::parse_size(s).map(Size)
}

/// A `KEY=VALUE` property. The value may itself contain `=`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Prop {
    pub key: String,
    pub value: String,
}

pub fn parse_prop(s: &str) -> Result<Prop, String> {
    let (k, v) = s.split_once('=').ok_or("expected KEY=VALUE")?;
    let key = k.trim();
    if key.is_empty() {
        return Err("empty property name (expected KEY=VALUE)".into());
    }
    if key.chars().any(char::is_whitespace) {
        return Err(format!("property name {key:?} contains whitespace"));
    }
    Ok(Prop {
        key: key.to_string(),
        value: v.to_string(),
    })
}

/// Collect properties into the map the proto wants; a repeated key is an error
/// rather than a silent last-one-wins.
pub fn props_map(props: &[Prop]) -> Result<std::collections::HashMap<String, String>, String> {
    let mut m = std::collections::HashMap::new();
    for p in props {
        if m.insert(p.key.clone(), p.value.clone()).is_some() {
            return Err(format!("property {:?} given twice", p.key));
        }
    }
    Ok(m)
}

/// A rank list: `0,1,2`, ranges `0-3`, or a mix `0,2-4`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ranks(pub Vec<u32>);

pub fn parse_ranks(s: &str) -> Result<Ranks, String> {
    let mut out = Vec::new();
    for part in s.split(',').map(str::trim) {
        let num = |x: &str| {
            x.trim()
                .parse::<u32>()
                .map_err(|_| format!("{x:?} is not a rank number"))
        };
        match part.split_once('-') {
            _ if part.is_empty() => return Err("empty rank in list".into()),
            Some((a, b)) => {
                let (a, b) = (num(a)?, num(b)?);
                if a > b {
                    return Err(format!("range {part:?} runs backwards"));
                }
                out.extend(a..=b);
            }
            None => out.push(num(part)?),
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(Ranks(out))
}

/// Bits of `hi` left to the user once the class byte is taken.
const OID_HI_MASK: u64 = 0x00FF_FFFF_FFFF_FFFF;

/// Parse an object id.
///
/// Accepted forms:
/// - `CLASS:HI.LO`, e.g. `SX:1.2` or `RP_2G1:0x10.0xff`: numbers in decimal, or hex with `0x`;
///   HI has 56 bits (the top byte of an id is its class).
/// - `HEXHI.HEXLO`, the raw 128-bit form the engine logs print; the class comes from its top byte.
pub fn parse_oid(s: &str) -> Result<ObjectId, String> {
    let s = s.trim();
    let Some((class, rest)) = s.split_once(':') else {
        let oid: ObjectId = s.parse().map_err(|_| {
            "expected CLASS:HI.LO (e.g. SX:1.2) or a raw HEXHI.HEXLO id".to_string()
        })?;
        oid.class().map_err(|e| e.to_string())?;
        return Ok(oid);
    };
    let class: ObjectClass = class
        .parse()
        .map_err(|e: peregrine_proto::oclass::UnknownClass| e.to_string())?;
    let (hi, lo) = rest
        .split_once('.')
        .ok_or("expected CLASS:HI.LO (e.g. SX:1.2)")?;
    let hi = parse_u64(hi)?;
    let lo = parse_u64(lo)?;
    if hi > OID_HI_MASK {
        return Err(format!(
            "HI {hi:#x} does not fit in 56 bits (the top byte holds the class)"
        ));
    }
    Ok(ObjectId::new(class, hi, lo))
}

fn parse_u64(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|_| format!("{s:?} is not a 64-bit number (decimal, or hex with 0x)"))
}

/// The `CLASS:HI.LO` text of an id, the inverse of [`parse_oid`].
pub fn format_oid(oid: &ObjectId) -> String {
    match oid.class() {
        Ok(c) => format!("{}:{}.{}", c.name(), oid.hi & OID_HI_MASK, oid.lo),
        Err(_) => oid.to_string(),
    }
}

/// A default object class name given on the command line, checked here so a typo
/// fails before anything is created; sent to the service by its canonical name.
pub fn parse_oclass(s: &str) -> Result<String, String> {
    s.parse::<ObjectClass>()
        .map(|c| c.name().to_string())
        .map_err(|e| e.to_string())
}

/// A positive number of seconds.
pub fn parse_secs(s: &str) -> Result<std::time::Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| "expected a number of seconds".to_string())?;
    if !(v > 0.0 && v.is_finite() && v < 1e9) {
        return Err("must be a positive number of seconds".into());
    }
    Ok(std::time::Duration::from_secs_f64(v))
}

/// Fraction of a pool's space that goes to the SCM tier.
pub fn parse_ratio(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| "expected a fraction such as 0.06".to_string())?;
    if !(v > 0.0 && v < 1.0) {
        return Err("must be between 0 and 1 (exclusive)".into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(Size(4096)));
        assert_eq!(parse_size("4096B"), Ok(Size(4096)));
        assert_eq!(parse_size("1GiB"), Ok(Size(1 << 30)));
        assert_eq!(parse_size("512MiB"), Ok(Size(512 << 20)));
        assert_eq!(parse_size("4G"), Ok(Size(4 << 30)));
        assert_eq!(parse_size("100M"), Ok(Size(100 << 20)));
        assert_eq!(parse_size("100mb"), Ok(Size(100 << 20)));
        assert_eq!(parse_size("8 KiB"), Ok(Size(8192)));
        assert_eq!(parse_size("1.5G"), Ok(Size(3 << 29)));
        assert_eq!(parse_size("2T"), Ok(Size(2 << 40)));
    }

    #[test]
    fn bad_sizes() {
        let e = parse_size("12XB").unwrap_err();
        assert!(e.contains("unknown unit \"XB\""), "{e}");
        assert!(parse_size("").is_err());
        assert!(parse_size("GiB").is_err());
        assert!(parse_size("-1G").is_err());
        assert!(parse_size("1.2.3G").is_err());
        assert!(parse_size("99999999999999999999").is_err());
        assert!(parse_size("100000000P").is_err(), "overflow must be caught");
    }

    #[test]
    fn props() {
        assert_eq!(
            parse_prop("label=x"),
            Ok(Prop {
                key: "label".into(),
                value: "x".into()
            })
        );
        // Values keep their own '=' (e.g. ACL entries) and may be empty.
        assert_eq!(parse_prop("acl=A::u=rw").unwrap().value, "A::u=rw");
        assert_eq!(parse_prop("k=").unwrap().value, "");
        assert!(parse_prop("novalue").is_err());
        assert!(parse_prop("=v").is_err());
        assert!(parse_prop("a b=v").is_err());
        let dup = [parse_prop("a=1").unwrap(), parse_prop("a=2").unwrap()];
        assert!(props_map(&dup).unwrap_err().contains("twice"));
    }

    #[test]
    fn ranks() {
        assert_eq!(parse_ranks("0,1,2"), Ok(Ranks(vec![0, 1, 2])));
        assert_eq!(parse_ranks("3,0-2,1"), Ok(Ranks(vec![0, 1, 2, 3])));
        assert!(parse_ranks("0,,1").is_err());
        assert!(parse_ranks("2-1").is_err());
        assert!(parse_ranks("x").is_err());
    }

    #[test]
    fn oids() {
        let o = parse_oid("SX:1.2").unwrap();
        assert_eq!(o, ObjectId::new(ObjectClass::SX, 1, 2));
        assert_eq!(format_oid(&o), "SX:1.2");
        let o = parse_oid("rp_2g1:0x10.0xff").unwrap();
        assert_eq!(o.class().unwrap(), ObjectClass::Rp2G1);
        assert_eq!(format_oid(&o), "RP_2G1:16.255");
        // The raw form round-trips through the proto's Display.
        let raw = ObjectId::new(ObjectClass::Ec2P1G1, 5, 6);
        assert_eq!(parse_oid(&raw.to_string()).unwrap(), raw);
    }

    #[test]
    fn bad_oids() {
        let e = parse_oid("XX:1.2").unwrap_err();
        assert!(
            e.contains("unknown object class") && e.contains("RP_2G1") && e.contains("SX"),
            "{e}"
        );
        assert!(parse_oid("SX:1").is_err());
        assert!(parse_oid("SX:a.2").is_err());
        assert!(parse_oid("SX:0x100000000000000.0")
            .unwrap_err()
            .contains("56 bits"));
        assert!(parse_oid("12").is_err());
        // A raw id whose top byte is no class.
        assert!(parse_oid("ff00000000000000.1").is_err());
    }

    #[test]
    fn oclass_names() {
        assert_eq!(parse_oclass("sx").unwrap(), "SX");
        assert!(parse_oclass("S3").unwrap_err().contains("known:"));
    }

    #[test]
    fn secs_and_ratio() {
        assert_eq!(
            parse_secs("1.5").unwrap(),
            std::time::Duration::from_millis(1500)
        );
        assert!(parse_secs("0").is_err());
        assert!(parse_secs("-3").is_err());
        assert!(parse_ratio("0.06").is_ok());
        assert!(parse_ratio("1.5").is_err());
    }
}
