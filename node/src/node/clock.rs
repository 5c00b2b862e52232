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
