//! What a replay measured, and how.
//!
//! - **JCT** is finish − submit of every finished job (completed or timed
//!   out); **queue** time is first start − submit. Percentiles use the
//!   nearest-rank method.
//! - **makespan** runs from the first submission to the last finish.
//! - **GPU utilization** is allocated GPU-time (rounded-up gangs and work
//!   later lost to preemption or failure included) over all configured GPUs ×
//!   makespan.
//! - **Jain fairness** is computed at every instant at which some tenant holds
//!   or wants GPUs: each such tenant's fair share is the max-min (water-filling)
//!   split of the healthy GPUs over the tenants' demands (GPUs held + GPUs
//!   queued), its ratio is held / fair, and Jain's index
//!   `(Σx)² / (n Σx²)` of the ratios is averaged over time. Instants at which
//!   every active tenant holds nothing are left out (the index is undefined).
//!   Per-tenant time-averaged fair and received shares are reported alongside.
//!
//! Every float in the JSON is rounded to 6 decimals and every list is in a
//! fixed order, so the same trace and seed give byte-identical output.

use serde::{Deserialize, Serialize};

use crate::config::SimConfig;

/// Points in [`SimReport::utilization_series`].
pub const UTILIZATION_BUCKETS: usize = 200;
/// Points in [`SimReport::jct_cdf`] (one per percentile).
pub const CDF_POINTS: usize = 100;

/// One stretch of a job holding GPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct RunSegment {
    pub start_s: u64,
    pub end_s: u64,
    pub gpus: u32,
}

/// The life of one job in the replay (not serialised into the report).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOutcome {
    /// The trace's job id.
    pub id: u64,
    pub tenant: String,
    pub submit_s: u64,
    pub duration_s: u64,
    /// GPUs held while running (gangs rounded up to whole nodes).
    pub gpus: u32,
    pub first_start_s: Option<u64>,
    pub finish_s: Option<u64>,
    pub rejected: Option<String>,
    pub timed_out: bool,
    pub preemptions: u32,
    pub failures: u32,
    pub segments: Vec<RunSegment>,
}

/// Per-tenant outcome.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantReport {
    pub tenant: String,
    pub jobs: usize,
    pub avg_jct_s: f64,
    /// GPU-hours the tenant's jobs need (GPUs × run time).
    pub demand_gpu_hours: f64,
    /// GPU-hours actually allocated, lost work included.
    pub received_gpu_hours: f64,
    /// Time-averaged max-min fair fraction of the cluster while contested.
    pub fair_share: f64,
    /// Time-averaged fraction of the cluster held over the same time.
    pub received_share: f64,
}

/// The result of one replay.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimReport {
    pub policy: String,
    /// Jobs that finished (completed or timed out).
    pub jobs: usize,
    pub avg_jct_s: f64,
    pub p50_jct_s: f64,
    pub p99_jct_s: f64,
    pub avg_queue_s: f64,
    pub makespan_s: f64,
    pub gpu_utilization: f64,
    pub jain_fairness: f64,
    pub preemptions: u64,
    pub trace_jobs: usize,
    /// Utilization from the first to the last submission only: the
    /// makespan-wide figure is diluted by the drain tail of a few
    /// months-long jobs after the last arrival.
    pub gpu_utilization_while_arriving: f64,
    /// Jobs that can never run on this cluster.
    pub rejected: usize,
    /// Jobs still waiting or running when the event budget ran out.
    pub unfinished: usize,
    pub timed_out: usize,
    pub nodes: u32,
    pub gpus_per_node: u32,
    pub seed: u64,
    pub fail_mtbf_s: Option<u64>,
    pub ckpt_interval_s: Option<u64>,
    pub node_failures: u64,
    /// Running jobs hit by a node failure.
    pub failure_interruptions: u64,
    pub gpu_hours_allocated: f64,
    /// Work since the last checkpoint, thrown away by node failures.
    pub gpu_hours_lost_failures: f64,
    /// What the same failures would have thrown away without checkpoints.
    pub gpu_hours_lost_failures_without_ckpt: f64,
    pub gpu_hours_lost_preemption: f64,
    pub scheduler_passes: u64,
    /// Placements the engine refused because they contradicted its state;
    /// nonzero means a scheduler bug.
    pub bad_placements: u64,
    /// Placements the ledger's `apply` refused (ledger driver only): a
    /// preemptor's placement waits for its victims to exit, and anything
    /// else means the snapshot and the ledger disagreed.
    pub ledger_refused_placements: u64,
    pub tenants: Vec<TenantReport>,
    /// `[seconds since first submission, fraction of GPUs allocated]`.
    pub utilization_series: Vec<[f64; 2]>,
    /// `[JCT seconds, fraction of finished jobs at or below it]`.
    pub jct_cdf: Vec<[f64; 2]>,
    /// Per-job detail for tests and tools; not serialised.
    #[serde(skip)]
    pub outcomes: Vec<JobOutcome>,
    /// Wall-clock seconds spent inside `schedule`; not serialised because it
    /// is not reproducible.
    #[serde(skip)]
    pub scheduler_wall_s: f64,
}

impl SimReport {
    /// Pretty JSON; byte-identical for identical replays.
    pub fn to_json(&self) -> String {
        serde_json::to_string_pretty(self)
            .unwrap_or_else(|error| format!("{{\"error\":\"{error}\"}}"))
    }
}

/// Running totals the engine feeds while the clock advances.
#[derive(Clone, Debug)]
pub(crate) struct Accounting {
    total_gpus: u64,
    allocated_now: i64,
    /// (time, GPUs allocated from then on).
    allocation_steps: Vec<(u64, i64)>,
    jain_time_sum: f64,
    jain_time: f64,
    fair_share_time_sum: Vec<f64>,
    received_share_time_sum: Vec<f64>,
    contested_time: f64,
    pub scheduler_passes: u64,
    pub scheduler_wall_s: f64,
    pub preemptions: u64,
    pub node_failures: u64,
    pub failure_interruptions: u64,
    pub lost_failure_gpu_s: f64,
    pub lost_failure_without_ckpt_gpu_s: f64,
    pub lost_preemption_gpu_s: f64,
    pub bad_placements: u64,
    pub ledger_refused_placements: u64,
}

impl Accounting {
    pub fn new(tenants: usize, total_gpus: u64) -> Self {
        Accounting {
            total_gpus,
            allocated_now: 0,
            allocation_steps: Vec::new(),
            jain_time_sum: 0.0,
            jain_time: 0.0,
            fair_share_time_sum: vec![0.0; tenants],
            received_share_time_sum: vec![0.0; tenants],
            contested_time: 0.0,
            scheduler_passes: 0,
            scheduler_wall_s: 0.0,
            preemptions: 0,
            node_failures: 0,
            failure_interruptions: 0,
            lost_failure_gpu_s: 0.0,
            lost_failure_without_ckpt_gpu_s: 0.0,
            lost_preemption_gpu_s: 0.0,
            bad_placements: 0,
            ledger_refused_placements: 0,
        }
    }

    pub fn allocation_changed(&mut self, time: u64, delta: i64) {
        self.allocated_now += delta;
        match self.allocation_steps.last_mut() {
            Some(last) if last.0 == time => last.1 = self.allocated_now,
            _ => self.allocation_steps.push((time, self.allocated_now)),
        }
    }

    /// Fairness over `[from, to)`, during which nothing changed.
    pub fn interval(
        &mut self,
        from: u64,
        to: u64,
        held: &[u64],
        pending: &[u64],
        healthy_gpus: u64,
    ) {
        let span = to.saturating_sub(from) as f64;
        if span <= 0.0 || healthy_gpus == 0 {
            return;
        }
        let demands: Vec<(usize, f64)> = held
            .iter()
            .zip(pending)
            .enumerate()
            .filter(|(_, (h, p))| **h + **p > 0)
            .map(|(tenant, (h, p))| (tenant, (h + p) as f64))
            .collect();
        if demands.is_empty() {
            return;
        }
        let capacity = healthy_gpus as f64;
        let fair = water_fill(&demands, capacity);
        let mut sum = 0.0;
        let mut sum_squares = 0.0;
        for &(tenant, fair_gpus) in &fair {
            let held_gpus = held[tenant] as f64;
            if fair_gpus > 0.0 {
                let ratio = held_gpus / fair_gpus;
                sum += ratio;
                sum_squares += ratio * ratio;
            }
            self.fair_share_time_sum[tenant] += fair_gpus / capacity * span;
            self.received_share_time_sum[tenant] += held_gpus / capacity * span;
        }
        self.contested_time += span;
        if sum_squares > 0.0 {
            self.jain_time_sum += sum * sum / (fair.len() as f64 * sum_squares) * span;
            self.jain_time += span;
        }
    }
}

/// Max-min fair split of `capacity` over `(tenant, demand)`, equal weights.
pub fn water_fill(demands: &[(usize, f64)], capacity: f64) -> Vec<(usize, f64)> {
    let mut order: Vec<usize> = (0..demands.len()).collect();
    order.sort_by(|&a, &b| {
        demands[a]
            .1
            .total_cmp(&demands[b].1)
            .then(demands[a].0.cmp(&demands[b].0))
    });
    let mut left = capacity;
    let mut shares = vec![0.0; demands.len()];
    for (served, &position) in order.iter().enumerate() {
        let remaining_tenants = (demands.len() - served) as f64;
        let share = (left / remaining_tenants).min(demands[position].1).max(0.0);
        shares[position] = share;
        left -= share;
    }
    demands
        .iter()
        .zip(shares)
        .map(|(&(tenant, _), share)| (tenant, share))
        .collect()
}

/// Rounds for stable, readable JSON.
pub fn round6(value: f64) -> f64 {
    if value.is_finite() {
        (value * 1e6).round() / 1e6
    } else {
        0.0
    }
}

/// Nearest-rank percentile of sorted values; 0 without any.
fn percentile(sorted: &[u64], fraction: f64) -> f64 {
    shoal_sdk::stats::percentile(sorted, fraction).map_or(0.0, |v| v as f64)
}

fn mean(values: impl Iterator<Item = u64>) -> f64 {
    let (sum, count) = values.fold((0.0, 0usize), |(s, c), v| (s + v as f64, c + 1));
    if count == 0 {
        0.0
    } else {
        sum / count as f64
    }
}

pub(crate) fn build_report(
    cfg: &SimConfig,
    outcomes: Vec<JobOutcome>,
    tenant_names: &[String],
    acct: Accounting,
    end_s: u64,
) -> SimReport {
    let finished: Vec<&JobOutcome> = outcomes.iter().filter(|o| o.finish_s.is_some()).collect();
    let jct = |o: &JobOutcome| o.finish_s.unwrap_or(o.submit_s).saturating_sub(o.submit_s);
    let mut jcts: Vec<u64> = finished.iter().map(|o| jct(o)).collect();
    jcts.sort_unstable();
    let queue = finished.iter().map(|o| {
        o.first_start_s
            .unwrap_or(o.submit_s)
            .saturating_sub(o.submit_s)
    });
    let first_submit = outcomes
        .iter()
        .filter(|o| o.rejected.is_none())
        .map(|o| o.submit_s)
        .min()
        .unwrap_or(0);
    let last_submit = outcomes
        .iter()
        .filter(|o| o.rejected.is_none())
        .map(|o| o.submit_s)
        .max()
        .unwrap_or(0);
    let last_finish = finished
        .iter()
        .filter_map(|o| o.finish_s)
        .max()
        .unwrap_or(first_submit);
    let makespan = last_finish.max(first_submit) - first_submit;
    let allocated_gpu_s: f64 = outcomes
        .iter()
        .flat_map(|o| &o.segments)
        .map(|s| s.end_s.saturating_sub(s.start_s) as f64 * f64::from(s.gpus))
        .sum();
    let capacity_gpu_s = acct.total_gpus as f64 * makespan as f64;
    let utilization = if capacity_gpu_s > 0.0 {
        allocated_gpu_s / capacity_gpu_s
    } else {
        0.0
    };

    let tenants = tenant_names
        .iter()
        .enumerate()
        .map(|(index, name)| {
            let mine: Vec<&JobOutcome> = outcomes.iter().filter(|o| &o.tenant == name).collect();
            let demand: f64 = mine
                .iter()
                .filter(|o| o.rejected.is_none())
                .map(|o| f64::from(o.gpus) * o.duration_s as f64)
                .sum();
            let received: f64 = mine
                .iter()
                .flat_map(|o| &o.segments)
                .map(|s| s.end_s.saturating_sub(s.start_s) as f64 * f64::from(s.gpus))
                .sum();
            let contested = acct.contested_time;
            let average = |sum: f64| {
                if contested > 0.0 {
                    sum / contested
                } else {
                    0.0
                }
            };
            TenantReport {
                tenant: name.clone(),
                jobs: mine.len(),
                avg_jct_s: round6(mean(
                    mine.iter().filter(|o| o.finish_s.is_some()).map(|o| jct(o)),
                )),
                demand_gpu_hours: round6(demand / 3600.0),
                received_gpu_hours: round6(received / 3600.0),
                fair_share: round6(average(
                    acct.fair_share_time_sum.get(index).copied().unwrap_or(0.0),
                )),
                received_share: round6(average(
                    acct.received_share_time_sum
                        .get(index)
                        .copied()
                        .unwrap_or(0.0),
                )),
            }
        })
        .collect();

    let jct_cdf = if jcts.is_empty() {
        Vec::new()
    } else {
        (1..=CDF_POINTS)
            .map(|point| {
                let fraction = point as f64 / CDF_POINTS as f64;
                [round6(percentile(&jcts, fraction)), round6(fraction)]
            })
            .collect()
    };

    SimReport {
        policy: cfg.policy.to_string(),
        jobs: finished.len(),
        avg_jct_s: round6(mean(jcts.iter().copied())),
        p50_jct_s: round6(percentile(&jcts, 0.50)),
        p99_jct_s: round6(percentile(&jcts, 0.99)),
        avg_queue_s: round6(mean(queue)),
        makespan_s: makespan as f64,
        gpu_utilization: round6(utilization),
        jain_fairness: round6(if acct.jain_time > 0.0 {
            acct.jain_time_sum / acct.jain_time
        } else {
            1.0
        }),
        preemptions: acct.preemptions,
        trace_jobs: outcomes.len(),
        gpu_utilization_while_arriving: round6(average_allocated(&acct, first_submit, last_submit)),
        rejected: outcomes.iter().filter(|o| o.rejected.is_some()).count(),
        unfinished: outcomes
            .iter()
            .filter(|o| o.rejected.is_none() && o.finish_s.is_none())
            .count(),
        timed_out: outcomes.iter().filter(|o| o.timed_out).count(),
        nodes: cfg.nodes,
        gpus_per_node: cfg.gpus_per_node,
        seed: cfg.seed,
        fail_mtbf_s: cfg.fail_mtbf_s,
        ckpt_interval_s: cfg.ckpt_interval_s,
        node_failures: acct.node_failures,
        failure_interruptions: acct.failure_interruptions,
        gpu_hours_allocated: round6(allocated_gpu_s / 3600.0),
        gpu_hours_lost_failures: round6(acct.lost_failure_gpu_s / 3600.0),
        gpu_hours_lost_failures_without_ckpt: round6(acct.lost_failure_without_ckpt_gpu_s / 3600.0),
        gpu_hours_lost_preemption: round6(acct.lost_preemption_gpu_s / 3600.0),
        scheduler_passes: acct.scheduler_passes,
        bad_placements: acct.bad_placements,
        ledger_refused_placements: acct.ledger_refused_placements,
        tenants,
        utilization_series: utilization_series(&acct, first_submit, end_s.max(last_finish)),
        jct_cdf,
        outcomes,
        scheduler_wall_s: acct.scheduler_wall_s,
    }
}

/// Allocated fraction of all GPUs, averaged over `[start, end)`.
fn average_allocated(acct: &Accounting, start: u64, end: u64) -> f64 {
    if end <= start || acct.total_gpus == 0 {
        return 0.0;
    }
    let steps = &acct.allocation_steps;
    let mut gpu_s = 0.0;
    for (index, &(time, allocated)) in steps.iter().enumerate() {
        let until = steps.get(index + 1).map_or(end, |next| next.0).min(end);
        let from = time.max(start);
        if until > from && allocated > 0 {
            gpu_s += (until - from) as f64 * allocated as f64;
        }
    }
    gpu_s / (acct.total_gpus as f64 * (end - start) as f64)
}

/// Average allocated fraction in equal buckets over `[start, end]`.
fn utilization_series(acct: &Accounting, start: u64, end: u64) -> Vec<[f64; 2]> {
    if end <= start || acct.total_gpus == 0 {
        return Vec::new();
    }
    let span = (end - start) as f64;
    let width = span / UTILIZATION_BUCKETS as f64;
    let mut sums = vec![0.0; UTILIZATION_BUCKETS];
    let steps = &acct.allocation_steps;
    for (index, &(time, allocated)) in steps.iter().enumerate() {
        let until = steps.get(index + 1).map_or(end, |next| next.0).min(end);
        let from = time.max(start);
        if until <= from || allocated <= 0 {
            continue;
        }
        // Spread the step over the buckets it overlaps.
        let (mut a, b) = ((from - start) as f64, (until - start) as f64);
        while a < b {
            let bucket = ((a / width) as usize).min(UTILIZATION_BUCKETS - 1);
            let bucket_end = if bucket == UTILIZATION_BUCKETS - 1 {
                b
            } else {
                ((bucket + 1) as f64 * width).min(b)
            };
            let piece = (bucket_end - a).max(0.0);
            sums[bucket] += piece * allocated as f64;
            if bucket_end <= a {
                break;
            }
            a = bucket_end;
        }
    }
    let capacity = acct.total_gpus as f64 * width;
    sums.iter()
        .enumerate()
        .map(|(bucket, sum)| {
            [
                round6((bucket as f64 + 0.5) * width),
                round6(sum / capacity),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn water_fill_caps_small_demands_and_splits_the_rest() {
        let shares = water_fill(&[(0, 2.0), (1, 10.0), (2, 10.0)], 12.0);
        assert_eq!(shares, vec![(0, 2.0), (1, 5.0), (2, 5.0)]);
        let plenty = water_fill(&[(0, 2.0), (1, 3.0)], 100.0);
        assert_eq!(plenty, vec![(0, 2.0), (1, 3.0)]);
    }

    #[test]
    fn nearest_rank_percentiles() {
        let values: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&values, 0.5), 50.0);
        assert_eq!(percentile(&values, 0.99), 99.0);
        assert_eq!(percentile(&[7], 0.99), 7.0);
        assert_eq!(percentile(&[], 0.5), 0.0);
    }

    #[test]
    fn jain_is_one_when_everyone_gets_their_fair_share_and_drops_otherwise() {
        let mut fair = Accounting::new(2, 8);
        fair.interval(0, 10, &[4, 4], &[4, 4], 8);
        assert!((fair.jain_time_sum / fair.jain_time - 1.0).abs() < 1e-12);
        let mut skewed = Accounting::new(2, 8);
        skewed.interval(0, 10, &[8, 0], &[4, 8], 8);
        // Ratios 2 and 0: (2)^2 / (2 * 4) = 0.5.
        assert!((skewed.jain_time_sum / skewed.jain_time - 0.5).abs() < 1e-12);
    }
}
