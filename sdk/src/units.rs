//! Durations and sizes as users write them, one reading for every command
//! and the Python package (which keeps a copy checked against the same
//! vectors, `testdata/units.json`).
//!
//! Durations are Slurm's: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`, `D-HH:MM`,
//! `D-HH:MM:SS`, and the suffixed `90s`, `30m`, `2h`, `1d`. Sizes are
//! Slurm's too: `K`, `M`, `G`, `T`, each optionally followed by `B` or
//! `iB` in any case, are powers of 1024 (`16GB` is `16GiB`, as `--mem`
//! reads it), `B` alone is bytes; what a bare number means is the caller's
//! (MiB for `--mem`, bytes elsewhere).

use std::time::Duration;

/// A Slurm duration.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let bad = || {
        format!("invalid duration '{s}': use MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]] or 90s/30m/2h/1d")
    };
    if s.is_empty() {
        return Err(bad());
    }
    let number = |t: &str| -> Result<u64, String> {
        if t.is_empty() || !t.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad());
        }
        t.parse().map_err(|_| bad())
    };
    if let Some(unit) = s.chars().last().filter(|c| c.is_ascii_alphabetic()) {
        let n = number(&s[..s.len() - 1])?;
        let scale = match unit {
            's' => 1,
            'm' => 60,
            'h' => 3600,
            'd' => 86400,
            _ => return Err(bad()),
        };
        return n
            .checked_mul(scale)
            .map(Duration::from_secs)
            .ok_or_else(bad);
    }
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (number(d)?, r),
        None => (0, s),
    };
    let parts: Vec<u64> = rest.split(':').map(number).collect::<Result<_, _>>()?;
    let secs = match (s.contains('-'), parts.as_slice()) {
        (false, [m]) => m * 60,
        (false, [m, sec]) => m * 60 + sec,
        (false, [h, m, sec]) => h * 3600 + m * 60 + sec,
        (true, [h]) => h * 3600,
        (true, [h, m]) => h * 3600 + m * 60,
        (true, [h, m, sec]) => h * 3600 + m * 60 + sec,
        _ => return Err(bad()),
    };
    Ok(Duration::from_secs(days * 86400 + secs))
}

/// Bytes of `s`, a bare number counting units of `2^bare_shift` bytes;
/// `None` when it is not a size.
fn size(s: &str, bare_shift: u32) -> Option<u64> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (digits, unit) = t.split_at(split);
    let n: u64 = digits.parse().ok()?;
    let unit = unit.to_ascii_uppercase();
    let unit = unit
        .strip_suffix("IB")
        .filter(|u| !u.is_empty())
        .or_else(|| unit.strip_suffix('B').filter(|u| !u.is_empty()))
        .unwrap_or(&unit);
    let shift = match unit {
        "" => bare_shift,
        "B" => 0,
        "K" => 10,
        "M" => 20,
        "G" => 30,
        "T" => 40,
        _ => return None,
    };
    n.checked_mul(1u64 << shift)
}

/// A size in bytes (`1GiB`, `512M`, `4096`): a bare number is bytes.
pub fn parse_bytes(s: &str) -> Result<u64, String> {
    size(s, 0).ok_or_else(|| format!("invalid size '{s}': use e.g. 1GiB, 512M or 4096 (bytes)"))
}

/// A rank's memory as `--mem` takes it: a bare number is MiB; it must be
/// positive.
pub fn parse_mem(s: &str) -> Result<u64, String> {
    match size(s, 20) {
        Some(0) => Err(format!(
            "invalid --mem '{s}': the memory of a rank must be positive"
        )),
        Some(bytes) => Ok(bytes),
        None => Err(format!(
            "invalid --mem '{s}': use a size such as 512M, 16G or 1048576B (a bare number is MiB)"
        )),
    }
}

/// A byte count the way `--mem` takes it: the largest unit that divides it.
pub fn format_mem(bytes: u64) -> String {
    for (shift, unit) in [(40, "T"), (30, "G"), (20, "M"), (10, "K")] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    format!("{bytes}B")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn vectors() -> Value {
        serde_json::from_str(include_str!("../testdata/units.json")).expect("units.json")
    }

    fn cases<'a>(v: &'a Value, key: &str) -> Vec<(&'a str, u64)> {
        v[key]
            .as_array()
            .expect(key)
            .iter()
            .map(|c| (c[0].as_str().expect("text"), c[1].as_u64().expect("value")))
            .collect()
    }

    fn bad<'a>(v: &'a Value, key: &str) -> Vec<&'a str> {
        v[key]
            .as_array()
            .expect(key)
            .iter()
            .filter_map(Value::as_str)
            .collect()
    }

    #[test]
    fn durations_read_as_the_shared_vectors_say() {
        let v = vectors();
        for (text, secs) in cases(&v, "durations") {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_secs(secs)),
                "{text}"
            );
        }
        for text in bad(&v, "bad_durations") {
            assert!(parse_duration(text).is_err(), "'{text}' accepted");
        }
    }

    #[test]
    fn memory_sizes_read_as_the_shared_vectors_say() {
        let v = vectors();
        for (text, bytes) in cases(&v, "mem") {
            assert_eq!(parse_mem(text), Ok(bytes), "{text}");
        }
        for text in bad(&v, "bad_mem") {
            assert!(parse_mem(text).is_err(), "'{text}' accepted");
        }
    }

    #[test]
    fn one_size_rule_whatever_a_bare_number_means() {
        for (text, bytes) in [("4096", 4096), ("512M", 512 << 20), ("100MB", 100 << 20)] {
            assert_eq!(parse_bytes(text), Ok(bytes), "{text}");
        }
        for text in ["64K", "16G", "16GB", "16GiB", "1048576B"] {
            assert_eq!(parse_bytes(text), parse_mem(text), "{text}");
        }
        assert!(parse_bytes("1.5G").is_err() && parse_bytes("16X").is_err());
        assert_eq!(format_mem(16 << 30), "16G");
        assert_eq!(format_mem(1536 << 20), "1536M");
        assert_eq!(format_mem(1000), "1000B");
        for s in ["512M", "16G", "3T", "7K", "1000B"] {
            assert_eq!(format_mem(parse_mem(s).expect("valid")), s);
        }
    }
}
