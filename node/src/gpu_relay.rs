//! The other members' GPU samples for the dashboard and `shoal top` (see
//! `api::telemetry`): fetched over the node-to-node link on demand, at most
//! once per period however many readers there are, and kept for a while
//! when a member stops answering.

use crate::config::DashboardTuning;
use crate::ledger_client::LedgerClient;
use crate::proto::{GpuTelemetry, Request, Response};
use futures::StreamExt;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// This node's own GPUs as they travel and are shown (no job yet).
pub fn own_gpus(samples: &[crate::gpu::GpuSample]) -> Vec<GpuTelemetry> {
    samples
        .iter()
        .map(|s| GpuTelemetry {
            index: s.index,
            util_pct: s.util_pct.min(100),
            temp_c: s.temp_c,
            power_w: s.power_w,
            fb_used_mb: s.fb_used_mb,
            fb_total_mb: s.fb_used_mb + s.fb_free_mb,
            throttle: s.throttle.clone(),
            job: None,
            job_name: None,
        })
        .collect()
}

/// Relayed samples are shown this long after the member last answered
/// (with their age), then the member's GPUs show as "no data".
const RELAY_KEEP_PERIODS: u32 = 3;
/// Members asked at once during one refresh.
const RELAY_CONCURRENCY: usize = 32;

/// The other members' GPU samples as this node last fetched them, shared
/// by every page, stream and `shoal top` it serves.
#[derive(Clone, Default)]
pub struct Relay(Arc<Mutex<RelayState>>);

#[derive(Default)]
struct RelayState {
    members: BTreeMap<u64, Relayed>,
    /// When the last refresh started, and whether one is running.
    asked_at: Option<Instant>,
    in_flight: bool,
}

#[derive(Clone, Default)]
struct Relayed {
    gpus: Vec<GpuTelemetry>,
    /// When the member last answered.
    at: Option<Instant>,
    problem: Option<String>,
}

/// One member's relayed samples, as shown.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct RelayedGpus {
    pub gpus: Vec<GpuTelemetry>,
    pub age_ms: Option<u64>,
    pub problem: Option<String>,
}

/// What the relay asks with: how long to wait and how long answers last.
#[derive(Clone, Copy, Debug)]
pub struct RelayTiming {
    pub timeout: Duration,
    pub max_age: Duration,
}

impl RelayTiming {
    pub fn of(d: &DashboardTuning) -> Self {
        RelayTiming {
            timeout: Duration::from_millis(d.relay_timeout_ms.max(1)),
            max_age: Duration::from_millis(d.relay_max_age_ms.max(1)),
        }
    }
}

impl Relay {
    fn lock(&self) -> std::sync::MutexGuard<'_, RelayState> {
        // The state is a cache: after a panic elsewhere it is still usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks a refresh as started when one is due (the answers are older
    /// than `max_age` and none is running); the caller then runs it.
    pub fn due(&self, now: Instant, timing: RelayTiming) -> bool {
        let mut s = self.lock();
        let stale = s
            .asked_at
            .is_none_or(|at| now.saturating_duration_since(at) >= timing.max_age);
        if stale && !s.in_flight {
            s.in_flight = true;
            s.asked_at = Some(now);
            true
        } else {
            false
        }
    }

    /// Whether the relay has never been refreshed.
    pub fn never_asked(&self) -> bool {
        let s = self.lock();
        s.asked_at.is_none() && !s.in_flight
    }

    /// What the relay holds for `members` (the answering node excluded
    /// by the caller), as of `now`.
    pub fn view(
        &self,
        members: &[u64],
        now: Instant,
        timing: RelayTiming,
    ) -> BTreeMap<u64, RelayedGpus> {
        let keep = timing.max_age.max(timing.timeout) * RELAY_KEEP_PERIODS;
        let s = self.lock();
        members
            .iter()
            .map(|id| {
                let r = s.members.get(id).cloned().unwrap_or_default();
                let age = r.at.map(|at| now.saturating_duration_since(at));
                let shown =
                    match age {
                        Some(age) if age <= keep => RelayedGpus {
                            gpus: r.gpus,
                            age_ms: Some(age.as_millis() as u64),
                            problem: r.problem,
                        },
                        _ => RelayedGpus {
                            gpus: Vec::new(),
                            age_ms: None,
                            problem: Some(r.problem.unwrap_or_else(|| {
                                "no data yet: the node was not asked yet".into()
                            })),
                        },
                    };
                (*id, shown)
            })
            .collect()
    }

    /// Records one refresh's answers (and forgets members no longer asked).
    pub(crate) fn record(
        &self,
        answers: Vec<(u64, Result<Vec<GpuTelemetry>, String>)>,
        now: Instant,
    ) {
        let mut s = self.lock();
        let asked: std::collections::BTreeSet<u64> = answers.iter().map(|(id, _)| *id).collect();
        s.members.retain(|id, _| asked.contains(id));
        for (id, answer) in answers {
            let entry = s.members.entry(id).or_default();
            match answer {
                Ok(gpus) => {
                    *entry = Relayed {
                        gpus,
                        at: Some(now),
                        problem: None,
                    }
                }
                // The last samples stay (and age) until they are too old.
                Err(why) => entry.problem = Some(why),
            }
        }
        s.in_flight = false;
    }

    /// Asks every one of `members` for its samples, each bounded by the
    /// timeout, and records the answers.
    pub async fn refresh(self, ledger: LedgerClient, members: Vec<u64>, timing: RelayTiming) {
        let answers = futures::stream::iter(members)
            .map(|id| {
                let ledger = ledger.clone();
                async move {
                    let answer = match tokio::time::timeout(
                        timing.timeout,
                        ledger.call_member(id, &Request::GpuTelemetry),
                    )
                    .await
                    {
                        Ok(Ok(Response::GpuTelemetry(gpus))) => Ok(gpus),
                        Ok(Ok(_)) => Err(
                            "no data: the node answered something else (an older version?)".into(),
                        ),
                        Ok(Err(e)) => Err(format!("no data: {}", e.message)),
                        Err(_) => Err(format!(
                            "no data: no answer within {} ms",
                            timing.timeout.as_millis()
                        )),
                    };
                    (id, answer)
                }
            })
            .buffer_unordered(RELAY_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        self.record(answers, Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TIMING: RelayTiming = RelayTiming {
        timeout: Duration::from_millis(1000),
        max_age: Duration::from_millis(2000),
    };

    fn gpu(index: u32, temp_c: u32) -> GpuTelemetry {
        GpuTelemetry {
            index,
            temp_c,
            ..Default::default()
        }
    }

    #[test]
    fn one_refresh_per_period_however_many_readers() {
        let relay = Relay::default();
        let t0 = Instant::now();
        assert!(relay.never_asked());
        assert!(relay.due(t0, TIMING));
        // Every other reader, while it runs and until the answers age.
        for _ in 0..100 {
            assert!(!relay.due(t0, TIMING));
        }
        relay.record(vec![(2, Ok(vec![gpu(0, 60)]))], t0);
        assert!(!relay.due(t0 + Duration::from_millis(1999), TIMING));
        assert!(relay.due(t0 + TIMING.max_age, TIMING));
        assert!(!relay.never_asked());
    }

    #[test]
    fn a_member_that_does_not_answer_is_no_data_and_old_samples_age_out() {
        let relay = Relay::default();
        let t0 = Instant::now();
        let before = relay.view(&[2, 3], t0, TIMING);
        assert!(before[&2].gpus.is_empty());
        assert!(before[&2]
            .problem
            .as_deref()
            .is_some_and(|p| p.contains("no data")));

        relay.due(t0, TIMING);
        relay.record(
            vec![
                (2, Ok(vec![gpu(0, 60), gpu(1, 61)])),
                (3, Err("no data: no answer within 1000 ms".into())),
            ],
            t0,
        );
        let v = relay.view(&[2, 3], t0 + Duration::from_millis(300), TIMING);
        assert_eq!(v[&2].gpus.len(), 2);
        assert_eq!(v[&2].age_ms, Some(300));
        assert_eq!(v[&2].problem, None);
        assert!(v[&3].gpus.is_empty());
        assert_eq!(v[&3].age_ms, None);
        assert_eq!(
            v[&3].problem.as_deref(),
            Some("no data: no answer within 1000 ms")
        );

        // n2 stops answering: its last samples are shown, with their age
        // and why, for a few periods, then no data.
        let t1 = t0 + TIMING.max_age;
        relay.due(t1, TIMING);
        relay.record(
            vec![
                (2, Err("no data: node 2: refused".into())),
                (3, Err("x".into())),
            ],
            t1,
        );
        let v = relay.view(&[2], t1, TIMING);
        assert_eq!(v[&2].gpus.len(), 2);
        assert_eq!(v[&2].age_ms, Some(2000));
        assert!(v[&2].problem.is_some());
        let v = relay.view(&[2], t0 + TIMING.max_age * (RELAY_KEEP_PERIODS + 1), TIMING);
        assert!(v[&2].gpus.is_empty());
        assert_eq!(v[&2].problem.as_deref(), Some("no data: node 2: refused"));
    }

    #[test]
    fn a_member_that_left_is_forgotten() {
        let relay = Relay::default();
        let t0 = Instant::now();
        relay.record(
            vec![(2, Ok(vec![gpu(0, 60)])), (3, Ok(vec![gpu(0, 50)]))],
            t0,
        );
        relay.record(vec![(2, Ok(vec![gpu(0, 61)]))], t0);
        let v = relay.view(&[3], t0, TIMING);
        assert!(v[&3].gpus.is_empty());
    }
}
