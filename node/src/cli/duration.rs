//! Durations as Slurm users write them: `MM`, `MM:SS`, `HH:MM:SS`, `D-HH`,
//! `D-HH:MM`, `D-HH:MM:SS`, and the suffixed `90s`, `30m`, `2h`, `1d`.

use std::time::Duration;

pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    let bad = || {
        format!("invalid duration '{s}': use MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]] or 90s/30m/2h/1d")
    };
    if s.is_empty() {
        return Err(bad());
    }
    if let Some(unit) = s.chars().last().filter(|c| c.is_ascii_alphabetic()) {
        let n: u64 = s[..s.len() - 1].parse().map_err(|_| bad())?;
        let secs = match unit {
            's' => n,
            'm' => n * 60,
            'h' => n * 3600,
            'd' => n * 86400,
            _ => return Err(bad()),
        };
        return Ok(Duration::from_secs(secs));
    }
    let (days, rest) = match s.split_once('-') {
        Some((d, r)) => (d.parse::<u64>().map_err(|_| bad())?, r),
        None => (0, s),
    };
    let parts: Vec<u64> = rest
        .split(':')
        .map(|p| p.parse::<u64>().map_err(|_| bad()))
        .collect::<Result<_, _>>()?;
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slurm_forms() {
        let d = |s| parse_duration(s).map(|d| d.as_secs());
        assert_eq!(d("30"), Ok(1800));
        assert_eq!(d("30:15"), Ok(1815));
        assert_eq!(d("72:00:00"), Ok(72 * 3600));
        assert_eq!(d("2-12"), Ok(2 * 86400 + 12 * 3600));
        assert_eq!(d("1-00:30:05"), Ok(86400 + 1805));
        assert_eq!(d("90s"), Ok(90));
        assert_eq!(d("30m"), Ok(1800));
        assert_eq!(d("24h"), Ok(86400));
        assert!(d("").is_err());
        assert!(d("1:2:3:4").is_err());
        assert!(d("abc").is_err());
        assert!(d("5x").is_err());
    }
}
