//! Byte counts as people write them: `4096`, `4KiB`, `512MiB`, `4G`, `1.5GiB`.

/// Units are binary whichever spelling is used: storage sizes here are always
/// multiples of pages, and `4G` meaning 4 GiB is what dmg and fio users expect.
const UNITS: &[(&[&str], u64)] = &[
    (&["", "B"], 1),
    (&["K", "KB", "KIB"], 1 << 10),
    (&["M", "MB", "MIB"], 1 << 20),
    (&["G", "GB", "GIB"], 1 << 30),
    (&["T", "TB", "TIB"], 1 << 40),
    (&["P", "PB", "PIB"], 1 << 50),
];

/// Parse a size; the error describes the value (callers name the flag or key).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    if num.is_empty() {
        return Err("expected a number with an optional unit (e.g. 4096, 512MiB, 4G)".into());
    }
    let unit = unit.trim().to_ascii_uppercase();
    let mult = UNITS
        .iter()
        .find(|(names, _)| names.contains(&unit.as_str()))
        .map(|(_, m)| *m)
        .ok_or_else(|| {
            format!("unknown unit {unit:?} (use B, K/KiB, M/MiB, G/GiB, T/TiB, P/PiB)")
        })?;
    let bytes = if num.contains('.') {
        let v: f64 = num
            .parse()
            .map_err(|_| format!("{num:?} is not a number"))?;
        let b = (v * mult as f64).round();
        if !b.is_finite() || b >= u64::MAX as f64 {
            return Err("too large".into());
        }
        b as u64
    } else {
        let v: u64 = num.parse().map_err(|_| "too large".to_string())?;
        v.checked_mul(mult).ok_or_else(|| "too large".to_string())?
    };
    Ok(bytes)
}
