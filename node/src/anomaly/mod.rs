//! Sub-second anomaly detection inside the agent: samples the GPUs every
//! 250 ms, compares each sample with the previous one, and commits an event
//! for every new problem (double-bit ECC error, XID error, thermal or power
//! throttling, a GPU that stopped answering). The leader also compares the
//! ranks of every gang (`straggler`) from the per-job utilization each node
//! gossips; the executor watches its ranks for silence (`stall`). Node-down
//! events come from the ledger itself when the leader commits a member down.
//! Edge-triggered here and de-duplicated in `apply`, so a persistent fault is
//! reported once; `webhook` forwards every event.

pub mod stall;
pub mod straggler;
pub mod webhook;

use crate::config::AnomalyTuning;
use crate::gpu::{GpuSample, Gpus};
use crate::ledger_client::LedgerClient;
use crate::metrics::Metrics;
use crate::node::LocalMember;
use crate::peers::SharedPeerView;
use crate::worker::Worker;
use shoal_consensus::events::{EventSpec, Severity};
use shoal_consensus::workload::JobState;
use shoal_consensus::{Command, NodeId};
use shoal_sdk::MemberState;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};
use straggler::{RankUtil, StragglerConfig, StragglerWatch};

pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);
/// On a node where no job holds a GPU, and that does not lead: a GPU
/// that fails there is found within a second, and nothing waits on its
/// utilization, so a real agent makes a quarter as many idle NVML queries.
pub const IDLE_SAMPLE_EVERY: Duration = Duration::from_secs(1);

/// New problems between two consecutive samples of one node's GPUs.
/// `holders` maps a GPU index to the job holding it.
pub fn detect(
    node: NodeId,
    node_name: &str,
    inventory: &[u32],
    previous: &[GpuSample],
    current: &[GpuSample],
    holders: &BTreeMap<u32, u64>,
) -> Vec<EventSpec> {
    let before: BTreeMap<u32, &GpuSample> = previous.iter().map(|s| (s.index, s)).collect();
    let now: BTreeMap<u32, &GpuSample> = current.iter().map(|s| (s.index, s)).collect();
    let mut events = Vec::new();
    let mut event = |severity, kind: &str, gpu: u32, message: String| {
        events.push(EventSpec {
            severity,
            kind: kind.to_string(),
            node: Some(node),
            gpu: Some(gpu),
            job: holders.get(&gpu).copied(),
            message,
            resource: None,
        })
    };
    for &gpu in inventory {
        let (Some(prev), cur) = (before.get(&gpu), now.get(&gpu)) else {
            continue;
        };
        let Some(cur) = cur else {
            event(
                Severity::Critical,
                "gpu_lost",
                gpu,
                format!("GPU {gpu} of {node_name} stopped answering"),
            );
            continue;
        };
        if cur.ecc_dbe_total > prev.ecc_dbe_total {
            event(
                Severity::Critical,
                "gpu_ecc_dbe",
                gpu,
                format!(
                    "GPU {gpu} of {node_name}: {} new double-bit ECC error(s)",
                    cur.ecc_dbe_total - prev.ecc_dbe_total
                ),
            );
        }
        if cur.last_xid != 0 && cur.last_xid != prev.last_xid {
            event(
                Severity::Critical,
                "gpu_xid",
                gpu,
                format!("GPU {gpu} of {node_name}: XID {}", cur.last_xid),
            );
        }
        for reason in &cur.throttle {
            if !prev.throttle.contains(reason) {
                event(
                    Severity::Warning,
                    "gpu_throttle",
                    gpu,
                    format!(
                        "GPU {gpu} of {node_name} throttling: {reason} at {} °C",
                        cur.temp_c
                    ),
                );
            }
        }
    }
    events
}

/// Mean utilization (percent) of the GPUs each job holds on `node`.
pub fn job_utilization(
    node: NodeId,
    samples: &[GpuSample],
    owners: &BTreeMap<(NodeId, u32), u64>,
) -> BTreeMap<u64, f32> {
    let mut sums: BTreeMap<u64, (f32, u32)> = BTreeMap::new();
    for s in samples {
        if let Some(job) = owners.get(&(node, s.index)) {
            let e = sums.entry(*job).or_default();
            e.0 += s.util_pct.min(100) as f32;
            e.1 += 1;
        }
    }
    sums.into_iter()
        .map(|(job, (sum, n))| (job, sum / n as f32))
        .collect()
}

/// Commits events to the ledger: a detector never waits for the ledger.
#[derive(Clone)]
pub struct EventLog {
    ledger: LedgerClient,
    metrics: Arc<Metrics>,
}

impl EventLog {
    pub fn new(ledger: LedgerClient, metrics: Arc<Metrics>) -> Self {
        EventLog { ledger, metrics }
    }

    /// Counts a round of samples the detectors judged.
    pub fn round_judged(&self) {
        self.metrics.gpu_sample_rounds.inc();
    }

    /// Logs, counts and commits a detected anomaly (in the background).
    pub fn record(&self, spec: EventSpec) {
        tracing::warn!(kind = %spec.kind, gpu = ?spec.gpu, job = ?spec.job, "{}", spec.message);
        self.metrics
            .anomaly_events
            .get_or_create(&vec![("kind".into(), spec.kind.clone())])
            .inc();
        let ledger = self.ledger.clone();
        tokio::spawn(async move {
            if let Err(e) = ledger.write(Command::RecordEvent(spec)).await {
                tracing::warn!(error = %e.message, "could not record an event");
            }
        });
    }
}

/// The GPU-sampling and gang-comparing loop and its handles.
pub struct AnomalyWatch {
    local: LocalMember,
    ledger: LedgerClient,
    peers: SharedPeerView,
    gpus: Gpus,
    tuning: AnomalyTuning,
    events: EventLog,
    previous: Vec<GpuSample>,
    stragglers: StragglerWatch,
    /// Whether a job held one of this node's GPUs at the last sample.
    busy: bool,
}

impl AnomalyWatch {
    pub fn new(
        local: LocalMember,
        ledger: LedgerClient,
        peers: SharedPeerView,
        gpus: Gpus,
        tuning: AnomalyTuning,
        events: EventLog,
    ) -> Self {
        AnomalyWatch {
            local,
            ledger,
            peers,
            gpus,
            tuning,
            events,
            previous: Vec::new(),
            stragglers: StragglerWatch::default(),
            busy: false,
        }
    }
}

impl Worker for AnomalyWatch {
    fn period(&self) -> Duration {
        // The leader compares every gang's ranks on each sample.
        if self.busy || self.ledger.is_leader() {
            SAMPLE_EVERY
        } else {
            IDLE_SAMPLE_EVERY
        }
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let me = self.local.id;
        let owners = self
            .ledger
            .read()
            .map(|d| crate::views::gpu_owners(&d.ledger))
            .unwrap_or_default();
        let holders: BTreeMap<u32, u64> = owners
            .iter()
            .filter(|((node, _), _)| *node == me)
            .map(|((_, gpu), job)| (*gpu, *job))
            .collect();
        self.busy = !holders.is_empty();
        let Some(current) = self.gpus.sample(&holders.keys().copied().collect()) else {
            return ControlFlow::Continue(());
        };
        if !self.previous.is_empty() {
            let inventory: Vec<u32> = self.local.spec.gpus.iter().map(|g| g.index).collect();
            for spec in detect(
                me,
                &self.local.name,
                &inventory,
                &self.previous,
                &current,
                &holders,
            ) {
                self.events.record(spec);
            }
        }
        if self.ledger.is_leader() {
            self.check_gangs(&current, &owners);
        }
        self.events.round_judged();
        self.previous = current;
        ControlFlow::Continue(())
    }
}

impl AnomalyWatch {
    /// The leader compares the ranks of every running gang: its own ranks from
    /// its samples, the others from the utilization their nodes gossip (alive
    /// nodes only: a silent node's last advert says nothing about now).
    fn check_gangs(&mut self, own: &[GpuSample], owners: &BTreeMap<(NodeId, u32), u64>) {
        let me = self.local.id;
        let a = &self.tuning;
        let cfg = StragglerConfig {
            window: Duration::from_millis(a.straggler_window_ms),
            below: f64::from(a.straggler_below_pct) / 100.0,
            min_sibling_util: f64::from(a.straggler_min_sibling_util_pct),
        };
        let own_util = job_utilization(me, own, owners);
        let gangs: Vec<(u64, Vec<(u32, NodeId)>)> = match self.ledger.read() {
            Ok(d) => d
                .ledger
                .workload
                .holding()
                .filter(|(job, alloc)| {
                    job.state == JobState::Running && alloc.stop.is_none() && alloc.nodes.len() > 1
                })
                .map(|(job, alloc)| {
                    let ranks = alloc
                        .nodes
                        .iter()
                        .enumerate()
                        .map(|(rank, (node, _))| (rank as u32, *node))
                        .collect();
                    (job.id, ranks)
                })
                .collect(),
            Err(_) => return,
        };
        let now = Instant::now();
        let mut found = Vec::new();
        if let Ok(view) = self.peers.lock() {
            for (job, ranks) in &gangs {
                let utils: Vec<RankUtil> = ranks
                    .iter()
                    .filter_map(|&(rank, node)| {
                        let util = if node == me {
                            own_util.get(job).copied()
                        } else if view.state(node) == Some(MemberState::Alive) {
                            view.capacity.get(node)?.job_util.get(job).copied()
                        } else {
                            None
                        }?;
                        Some(RankUtil {
                            rank,
                            node,
                            util: f64::from(util),
                        })
                    })
                    .collect();
                // A gang with a rank unaccounted for is not judged.
                if utils.len() == ranks.len() {
                    found.extend(self.stragglers.observe(&cfg, now, *job, &utils));
                }
            }
        }
        self.stragglers
            .retain_jobs(&gangs.iter().map(|(job, _)| *job).collect::<BTreeSet<_>>());
        for s in found {
            let name = self
                .ledger
                .name_of(s.node)
                .unwrap_or_else(|| s.node.to_string());
            self.events.record(
            EventSpec {
                severity: Severity::Warning,
                kind: "job_straggler".into(),
                node: Some(s.node),
                gpu: None,
                job: Some(s.job),
                message: format!(
                    "job {} rank {} on {name} is a straggler: GPU utilization {:.0}% vs a median of {:.0}% on its {} sibling(s) for {:.1} s",
                    s.job,
                    s.rank,
                    s.util,
                    s.sibling_median,
                    s.siblings,
                    s.lasted.as_secs_f64()
                ),
                resource: None,
            },
        );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(index: u32) -> GpuSample {
        GpuSample {
            index,
            util_pct: 90,
            fb_used_mb: 1,
            fb_free_mb: 1,
            temp_c: 50,
            power_w: 300.0,
            ecc_sbe_total: 0,
            ecc_dbe_total: 0,
            last_xid: 0,
            throttle: vec![],
        }
    }

    #[test]
    fn job_utilization_averages_the_gpus_each_job_holds_here() {
        let mut samples = vec![sample(0), sample(1), sample(2), sample(3)];
        samples[1].util_pct = 10;
        let owners = BTreeMap::from([((7, 0), 5), ((7, 1), 5), ((7, 2), 6), ((8, 3), 5)]);
        let util = job_utilization(7, &samples, &owners);
        assert_eq!(util, BTreeMap::from([(5, 50.0), (6, 90.0)]));
    }

    #[test]
    fn each_new_fault_is_one_event_and_persisting_ones_are_not_repeated() {
        let before = vec![sample(0), sample(1), sample(2)];
        let mut after = before.clone();
        after[0].ecc_dbe_total = 1;
        after[1].last_xid = 79;
        after[2].throttle = vec!["HW_THERMAL_SLOWDOWN".into()];
        let holders = BTreeMap::from([(1, 42)]);
        let events = detect(7, "n7", &[0, 1, 2, 3], &before, &after, &holders);
        let kinds: Vec<(&str, Option<u32>, Option<u64>)> = events
            .iter()
            .map(|e| (e.kind.as_str(), e.gpu, e.job))
            .collect();
        assert_eq!(
            kinds,
            [
                ("gpu_ecc_dbe", Some(0), None),
                ("gpu_xid", Some(1), Some(42)),
                ("gpu_throttle", Some(2), None)
            ]
        );
        assert!(detect(7, "n7", &[0, 1, 2], &after, &after, &holders).is_empty());
        let lost = detect(7, "n7", &[0, 1, 2], &after, &after[..2], &holders);
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].kind, "gpu_lost");
    }
}
