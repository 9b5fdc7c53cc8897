//! Human output (aligned tables, humanized sizes) and the JSON forms of the
//! management messages. The generated proto types carry no serde derives, so the
//! JSON is built here, field names as in `mgmt.proto`.

use peregrine_proto::mgmt::{self as pb, ContInfo, Member, PoolInfo, RankStorage, Snapshot, Tier};
use serde_json::{json, Value};
use std::collections::{BTreeMap, HashMap};
use std::io::Write;

/// `1073741824` -> `1.0 GiB`; below 1 KiB, plain bytes.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 6] = ["KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}

/// Seconds since the epoch as `YYYY-MM-DD HH:MM:SS UTC` (no timezone database needed).
pub fn human_time(unix: u64) -> String {
    if unix == 0 {
        return "-".into();
    }
    let days = (unix / 86_400) as i64;
    let secs = unix % 86_400;
    // Civil-from-days (H. Hinnant): proleptic Gregorian calendar.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        secs / 3600,
        secs / 60 % 60,
        secs % 60
    )
}

/// A plain text table: columns padded to their widest cell, two spaces apart.
pub struct Table {
    headers: Vec<String>,
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// Headers ending in `>` are right-aligned (numbers, sizes); the `>` is not printed.
    pub fn new(headers: &[&str]) -> Self {
        Table {
            headers: headers
                .iter()
                .map(|h| h.trim_end_matches('>').to_string())
                .collect(),
            right: headers.iter().map(|h| h.ends_with('>')).collect(),
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.headers.len());
        self.rows.push(cells);
    }

    pub fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        let mut width: Vec<usize> = self.headers.iter().map(|h| h.chars().count()).collect();
        for r in &self.rows {
            for (w, c) in width.iter_mut().zip(r) {
                *w = (*w).max(c.chars().count());
            }
        }
        let line = |cells: &[String], out: &mut dyn Write| -> std::io::Result<()> {
            let mut s = String::new();
            for (i, c) in cells.iter().enumerate() {
                if i > 0 {
                    s.push_str("  ");
                }
                let pad = width[i] - c.chars().count();
                if self.right[i] {
                    s.extend(std::iter::repeat_n(' ', pad));
                    s.push_str(c);
                } else {
                    s.push_str(c);
                    if i + 1 < cells.len() {
                        s.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            writeln!(out, "{}", s.trim_end())
        };
        line(&self.headers, out)?;
        let rule: Vec<String> = width.iter().map(|w| "-".repeat(*w)).collect();
        line(&rule, out)?;
        for r in &self.rows {
            line(r, out)?;
        }
        Ok(())
    }
}

/// `key: value` lines with the values aligned.
pub fn write_fields(out: &mut impl Write, fields: &[(&str, String)]) -> std::io::Result<()> {
    let w = fields.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    for (k, v) in fields {
        writeln!(out, "{:<w$}  {}", format!("{k}:"), v, w = w + 1)?;
    }
    Ok(())
}

pub fn sorted(props: &HashMap<String, String>) -> BTreeMap<&str, &str> {
    props
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

pub fn props_text(props: &HashMap<String, String>) -> String {
    if props.is_empty() {
        return "-".into();
    }
    sorted(props)
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

pub fn ranks_text(ranks: &[u32]) -> String {
    if ranks.is_empty() {
        return "-".into();
    }
    ranks
        .iter()
        .map(u32::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

pub fn tier<'a>(tiers: &'a [Tier], name: &str) -> Option<&'a Tier> {
    tiers.iter().find(|t| t.name == name)
}

pub fn dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

// ---- the words of the management enums ----

/// A management enum value as the CLI prints it: its proto name without the
/// enum's prefix, lowercase ("MEMBER_STATE_JOINED" -> "joined"); "" when
/// unspecified, the number for a value this CLI does not know.
fn enum_word(name: Option<&'static str>, prefix: &str, v: i32) -> String {
    match name.and_then(|n| n.strip_prefix(prefix)) {
        Some("UNSPECIFIED") => String::new(),
        Some(w) => w.to_ascii_lowercase(),
        None => v.to_string(),
    }
}

/// "joined", "stopped" or "maintenance".
pub fn member_state(v: i32) -> String {
    let name = pb::MemberState::try_from(v).ok().map(|s| s.as_str_name());
    enum_word(name, "MEMBER_STATE_", v)
}

/// "ready", "maintenance", "degraded" or "unreachable".
pub fn storage_state(v: i32) -> String {
    let name = pb::StorageState::try_from(v).ok().map(|s| s.as_str_name());
    enum_word(name, "STORAGE_STATE_", v)
}

/// "ready", "degraded" or "reintegrating".
pub fn pool_state(v: i32) -> String {
    let name = pb::PoolState::try_from(v).ok().map(|s| s.as_str_name());
    enum_word(name, "POOL_STATE_", v)
}

/// "POSIX": container types print in capitals, as they are given.
pub fn cont_type(v: i32) -> String {
    let name = pb::ContType::try_from(v).ok().map(|s| s.as_str_name());
    enum_word(name, "CONT_TYPE_", v).to_ascii_uppercase()
}

/// "crc32c" or "off".
pub fn checksum(v: i32) -> String {
    let name = pb::Checksum::try_from(v).ok().map(|s| s.as_str_name());
    enum_word(name, "CHECKSUM_", v)
}

// ---- JSON forms, field names as in mgmt.proto ----

pub fn member_json(m: &Member) -> Value {
    json!({
        "rank": m.rank, "uuid": m.uuid, "control_addr": m.control_addr, "data_addr": m.data_addr,
        "state": member_state(m.state), "fault_domain": m.fault_domain, "targets": m.targets, "targets_out": m.targets_out,
    })
}

pub fn rank_storage_json(r: &RankStorage) -> Value {
    json!({
        "rank": r.rank, "bdev_class": r.bdev_class, "bdev_path": r.bdev_path, "bdev_bytes": r.bdev_bytes,
        "scm_bytes": r.scm_bytes, "formatted": r.formatted, "system": r.system,
        "engine_uuid": r.engine_uuid, "state": storage_state(r.state), "message": r.message,
        "nvme_free": r.nvme_free, "scm_free": r.scm_free,
        "unflushed_records": r.unflushed_records, "flushes": r.flushes,
        "scrub_bytes": r.scrub_bytes, "scrub_extents": r.scrub_extents, "scrub_passes": r.scrub_passes,
        "scrub_damaged": r.scrub_damaged, "scrub_damage": r.scrub_damage, "repairs": r.repairs,
    })
}

pub fn tier_json(t: &Tier) -> Value {
    json!({"name": t.name, "total": t.total, "free": t.free})
}

pub fn pool_json(p: &PoolInfo) -> Value {
    json!({
        "uuid": p.uuid, "label": p.label, "state": pool_state(p.state), "map_version": p.map_version,
        "ranks": p.ranks, "total_targets": p.total_targets, "disabled_targets": p.disabled_targets,
        "reintegrating_targets": p.reintegrating_targets,
        "tiers": p.tiers.iter().map(tier_json).collect::<Vec<_>>(), "props": sorted(&p.props),
        "containers": p.containers,
    })
}

pub fn cont_json(c: &ContInfo) -> Value {
    json!({
        "uuid": c.uuid, "label": c.label, "pool_uuid": c.pool_uuid, "type": cont_type(c.r#type),
        "oclass": c.oclass, "dir_oclass": c.dir_oclass, "chunk_size": c.chunk_size,
        "redundancy_factor": c.redundancy_factor, "checksum": checksum(c.checksum), "props": sorted(&c.props),
        "used_bytes": c.used_bytes, "snapshots": c.snapshots, "create_epoch": c.create_epoch,
    })
}

pub fn snapshot_json(s: &Snapshot) -> Value {
    json!({"epoch": s.epoch, "name": s.name, "created_unix": s.created_unix})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_humanized() {
        assert_eq!(human_size(0), "0 B");
        assert_eq!(human_size(1023), "1023 B");
        assert_eq!(human_size(1024), "1.0 KiB");
        assert_eq!(human_size(1 << 30), "1.0 GiB");
        assert_eq!(human_size(3 << 29), "1.5 GiB");
    }

    #[test]
    fn times() {
        assert_eq!(human_time(0), "-");
        assert_eq!(human_time(1_700_000_000), "2023-11-14 22:13:20 UTC");
        assert_eq!(human_time(951_782_400), "2000-02-29 00:00:00 UTC");
    }

    #[test]
    fn table_aligns() {
        let mut t = Table::new(&["NAME", "SIZE>"]);
        t.row(vec!["a".into(), "1.0 GiB".into()]);
        t.row(vec!["longer".into(), "5 B".into()]);
        let mut out = Vec::new();
        t.write(&mut out).unwrap();
        let s = String::from_utf8(out).unwrap();
        assert_eq!(
            s,
            "NAME       SIZE\n------  -------\na       1.0 GiB\nlonger      5 B\n"
        );
    }
}
