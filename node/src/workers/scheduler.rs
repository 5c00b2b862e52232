//! The leader's scheduling loop: read the ledger, run the pure scheduler
//! with Vivaldi distances, commit the plan as one `Schedule` command. Every
//! other node's loop idles. `apply` re-validates the plan, so a leader that
//! lost its term while planning cannot double-book anything.

use crate::clock::wall_ms;
use crate::ledger_client::LedgerClient;
use crate::metrics::Metrics;
use crate::peers::SharedPeerView;
use crate::proto::WireError;
use crate::worker::Worker;
use shoal_consensus::sched::{schedule, Policy, Proximity};
use shoal_consensus::workload::{SchedSnapshot, STOP_DEADLINE_MS};
use shoal_consensus::{Command, LedgerResponse, NodeId};
use shoal_mesh::vivaldi::{estimate_rtt, Coordinate};
use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Network distance from the members' Vivaldi coordinates; nodes without a
/// coordinate yet fall back to the scheduler's label estimate.
pub struct VivaldiProximity {
    coordinates: HashMap<NodeId, Coordinate>,
}

impl Proximity for VivaldiProximity {
    fn rtt_ms(&self, a: NodeId, b: NodeId) -> Option<f64> {
        let rtt = estimate_rtt(self.coordinates.get(&a)?, self.coordinates.get(&b)?);
        Some(rtt.as_secs_f64() * 1000.0)
    }
}

/// The scheduling loop's handles.
pub struct Scheduler {
    pub ledger: LedgerClient,
    pub peers: SharedPeerView,
    pub metrics: Arc<Metrics>,
    pub policy: Policy,
    pub period: Duration,
}

impl Worker for Scheduler {
    fn period(&self) -> Duration {
        if self.ledger.is_leader() {
            self.period
        } else {
            crate::worker::OFF_LEADER_PERIOD.max(self.period)
        }
    }

    /// A pass as soon as a submit, an end or a node change is applied,
    /// and as soon as this node is elected.
    fn wakeup(&self) -> crate::worker::Wakeup {
        crate::worker::Wakeup::on_apply(self.ledger.applied_watch())
            .and_leadership(self.ledger.raft())
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        if self.ledger.is_leader() {
            if let Err(e) = self.pass().await {
                tracing::debug!(error = %e.message, "scheduling pass not committed");
            }
        }
        ControlFlow::Continue(())
    }
}

impl Scheduler {
    fn proximity(&self, members: &[NodeId]) -> VivaldiProximity {
        let mut coordinates = HashMap::new();
        if let Ok(view) = self.peers.lock() {
            for node in members {
                if let Some(c) = view.coordinate_of(*node, self.ledger.me()) {
                    coordinates.insert(*node, c);
                }
            }
        }
        VivaldiProximity { coordinates }
    }

    /// One pass; public so that benchmarks can drive passes back to back.
    pub async fn pass(&self) -> Result<PassOutcome, WireError> {
        let policy = self.policy;
        let now_ms = wall_ms();
        let (plan, overdue) = {
            let data = self.ledger.read()?;
            let ledger = &data.ledger;
            if ledger.workload.nothing_to_schedule() {
                return Ok(PassOutcome::default());
            }
            let planning = Instant::now();
            let snapshot = SchedSnapshot::new(ledger, now_ms, policy);
            let members: Vec<NodeId> = snapshot.input.nodes.iter().map(|n| n.id).collect();
            let prox = self.proximity(&members);
            let sched_plan = schedule(&snapshot.input, &prox);
            let plan = snapshot.to_plan(&sched_plan, &ledger.workload);
            self.metrics.observe_sched_pass(planning.elapsed());
            // Stopping jobs whose ranks never reported back (their node died
            // without being declared down, or the agent lost them).
            let overdue: Vec<(u64, u64)> = ledger
                .workload
                .holding()
                .filter_map(|(job, alloc)| {
                    let stop = alloc.stop?;
                    (now_ms >= stop.requested_at_ms.saturating_add(STOP_DEADLINE_MS))
                        .then_some((job.id, alloc.epoch))
                })
                .collect();
            (plan, overdue)
        };
        let mut outcome = PassOutcome::default();
        if !plan.is_empty() {
            let (resp, _) = self.ledger.write_local(Command::Schedule(plan)).await?;
            if let LedgerResponse::Scheduled { started, refused } = resp {
                for (job, reason) in &refused {
                    tracing::info!(job, %reason, "placement refused on apply");
                }
                self.metrics.count_placements(started.len() as u64);
                outcome.started = started.len();
                outcome.refused = refused.len();
            }
        }
        for (job, epoch) in overdue {
            tracing::warn!(
                job,
                epoch,
                "ranks did not report back before the stop deadline; releasing the GPUs"
            );
            self.ledger
                .write_local(Command::ReleaseJob { job, epoch })
                .await?;
        }
        Ok(outcome)
    }
}

#[derive(Debug, Default)]
pub struct PassOutcome {
    pub started: usize,
    pub refused: usize,
}
