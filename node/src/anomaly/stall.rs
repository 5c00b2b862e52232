//! Stalled ranks: a process that is alive but makes no progress (a deadlocked
//! collective, a hung data loader) holds its GPUs and produces nothing; the
//! executor would never notice because nothing exits. Progress is what a
//! training job leaves behind: new output in its log, or a new checkpoint.
//! Sans-IO: the executor passes what it saw and the time.

use std::time::{Duration, Instant};

pub struct StallWatch {
    last_progress: Instant,
    log_len: u64,
    step: Option<u64>,
    reported: bool,
}

impl StallWatch {
    pub fn new(now: Instant) -> Self {
        StallWatch {
            last_progress: now,
            log_len: 0,
            step: None,
            reported: false,
        }
    }

    /// Feeds the rank's log length and latest checkpoint step. Returns how
    /// long it has been silent when it has just been silent for `after`
    /// (once per episode); a zero `after` turns the check off.
    pub fn observe(
        &mut self,
        now: Instant,
        log_len: u64,
        step: Option<u64>,
        after: Duration,
    ) -> Option<Duration> {
        if log_len != self.log_len || step != self.step {
            self.log_len = log_len;
            self.step = step;
            self.last_progress = now;
            self.reported = false;
            return None;
        }
        let silent = now.saturating_duration_since(self.last_progress);
        if after.is_zero() || self.reported || silent < after {
            return None;
        }
        self.reported = true;
        Some(silent)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const AFTER: Duration = Duration::from_secs(10);

    #[test]
    fn silence_for_the_window_is_reported_once_and_output_resets_it() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut w = StallWatch::new(t0);
        assert_eq!(w.observe(at(1), 100, None, AFTER), None);
        assert_eq!(w.observe(at(10), 100, None, AFTER), None);
        assert_eq!(
            w.observe(at(11), 100, None, AFTER),
            Some(Duration::from_secs(10))
        );
        assert_eq!(w.observe(at(40), 100, None, AFTER), None);
        // New output: a fresh episode may be reported again later.
        assert_eq!(w.observe(at(41), 150, None, AFTER), None);
        assert_eq!(w.observe(at(50), 150, None, AFTER), None);
        assert!(w.observe(at(51), 150, None, AFTER).is_some());
    }

    #[test]
    fn a_new_checkpoint_is_progress_and_zero_turns_the_check_off() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut w = StallWatch::new(t0);
        assert_eq!(w.observe(at(9), 0, Some(100), AFTER), None);
        assert_eq!(w.observe(at(18), 0, Some(100), AFTER), None);
        assert!(w.observe(at(19), 0, Some(100), AFTER).is_some());
        let mut off = StallWatch::new(t0);
        assert_eq!(off.observe(at(1000), 0, None, Duration::ZERO), None);
    }
}
