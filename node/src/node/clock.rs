//! Wall-clock time. The leader stamps every log entry with it (DESIGN
//! invariant 7); everything else measures durations with `Instant`.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch on this node's clock.
pub fn wall_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// RFC 3339 in UTC, to the second.
pub fn rfc3339(ms: u64) -> String {
    let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_else(|| format!("@{secs}"))
}
