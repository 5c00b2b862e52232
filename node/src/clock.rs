//! Wall-clock time. The leader stamps every log entry with it (DESIGN
//! invariant 7); everything else measures durations with `Instant`.

use std::cell::RefCell;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

thread_local! {
    /// How far this thread's wall clock is off, when a chaos run moved it.
    static SKEW_MS: RefCell<Option<Arc<AtomicI64>>> = const { RefCell::new(None) };
}

/// Milliseconds since the Unix epoch on this node's clock.
pub fn wall_ms() -> u64 {
    let real = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0);
    match SKEW_MS.with(|s| s.borrow().as_ref().map(|s| s.load(Ordering::Relaxed))) {
        Some(skew) => real.saturating_add_signed(skew),
        None => real,
    }
}

/// Test only: this thread's wall clock is `skew` milliseconds off from now
/// on (the value may change later). A chaos run sets it on every thread of
/// one in-process node's runtime, so that one node's clock jumps while the
/// others' do not.
pub fn skew_this_thread(skew: Arc<AtomicI64>) {
    SKEW_MS.with(|s| *s.borrow_mut() = Some(skew));
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
