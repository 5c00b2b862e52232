//! The leader's cross-region checkpoint loops (docs/federation.md).
//!
//! [`RegionCopies`], for this region's own jobs with `--ckpt-replicas
//! L+R`: picks the region that holds the job's copies (the nearest
//! reachable peer, once, so the job's lease involves one region), marks the
//! copy as starting before anything is sent, sends each newly committed
//! step, and ends a job here once that region says it took the job over.
//!
//! [`RegionTakeover`], for peer regions' jobs held here: drops the copy of
//! a job that ended in its region, and takes over the jobs of a region
//! unreachable for `federation.region_failover_after_ms`.

use crate::clock::wall_ms;
use crate::node::Node;
use crate::regions as fed;
use crate::worker::Worker;
use shoal_consensus::{Command, LedgerResponse};
use std::collections::BTreeMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the loops look.
const PERIOD: Duration = Duration::from_secs(1);
/// Wait after a failed copy of a job before trying it again.
const RETRY_AFTER: Duration = Duration::from_secs(5);

async fn propose(node: &Node, cmd: Command, what: &str) -> Option<LedgerResponse> {
    match node.ledger().write(cmd).await {
        Ok((LedgerResponse::Rejected(why), _)) => {
            tracing::warn!(%why, "{what} refused");
            None
        }
        Ok((answer, _)) => Some(answer),
        Err(e) => {
            tracing::debug!(error = %e.message, "{what} not committed");
            None
        }
    }
}

/// One of this region's copied jobs, as the loop needs it.
struct CopiedJob {
    id: u64,
    spec: shoal_consensus::workload::JobSpec,
    latest: Option<shoal_consensus::workload::Checkpoint>,
    copies: BTreeMap<String, u64>,
}

pub struct RegionCopies {
    pub node: Arc<Node>,
    retry_at: BTreeMap<u64, Instant>,
}

impl RegionCopies {
    pub fn new(node: Arc<Node>) -> Self {
        RegionCopies {
            node,
            retry_at: BTreeMap::new(),
        }
    }

    fn copied_jobs(&self) -> (Vec<CopiedJob>, u64) {
        let Ok(d) = self.node.ledger().read() else {
            return (Vec::new(), 0);
        };
        let jobs = d
            .ledger
            .live_copied_jobs()
            .into_iter()
            .filter_map(|id| {
                let job = d.ledger.workload.jobs.get(&id)?;
                Some(CopiedJob {
                    id,
                    spec: job.spec.clone(),
                    latest: d.ledger.workload.latest_checkpoint(id).cloned(),
                    copies: d
                        .ledger
                        .federation
                        .copies_out
                        .get(&id)
                        .cloned()
                        .unwrap_or_default(),
                })
            })
            .collect();
        (jobs, d.last_applied.map(|l| l.index).unwrap_or_default())
    }

    /// Ends here every copied job a peer region says it took over.
    async fn end_moved_jobs(&self, jobs: &[CopiedJob]) {
        for job in jobs {
            for region in job.copies.keys() {
                let taken = self.node.federation().leases().taken_by(region);
                if !taken.contains(&job.id) {
                    continue;
                }
                let remote_job = self
                    .node
                    .federation()
                    .tracker()
                    .status(region)
                    .and_then(|s| s.summary.as_ref())
                    .and_then(|s| {
                        s.adopted
                            .iter()
                            .find(|a| a.origin_job == job.id)
                            .map(|a| a.job)
                    })
                    .unwrap_or_default();
                let cmd = Command::JobMoved {
                    job: job.id,
                    region: region.clone(),
                    remote_job,
                };
                propose(&self.node, cmd, "ending a job another region took over").await;
            }
        }
    }

    /// The nearest reachable peer region, by the last summary's round trip.
    fn nearest_region(&self) -> Option<String> {
        let now = wall_ms();
        let peers = fed::peers(&self.node);
        let tracker = self.node.federation().tracker();
        peers
            .iter()
            .filter(|p| tracker.reachable(&p.name, now))
            .min_by(|a, b| {
                let rtt = |name: &str| {
                    tracker
                        .status(name)
                        .and_then(|s| s.rtt_ms)
                        .unwrap_or(f64::MAX)
                };
                rtt(&a.name).total_cmp(&rtt(&b.name))
            })
            .map(|p| p.name.clone())
    }

    async fn copy(&mut self, job: &CopiedJob, origin_index: u64) {
        if self
            .retry_at
            .get(&job.id)
            .is_some_and(|t| Instant::now() < *t)
        {
            return;
        }
        let region = match job.copies.keys().next() {
            Some(r) => r.clone(),
            None => {
                let Some(region) = self.nearest_region() else {
                    return;
                };
                // From here on this region may take the job over: its
                // ranks need that region's lease before a byte is sent.
                let cmd = Command::CheckpointCopied {
                    job: job.id,
                    step: None,
                    region: region.clone(),
                };
                if propose(&self.node, cmd, "choosing the copy region")
                    .await
                    .is_none()
                {
                    return;
                }
                region
            }
        };
        let Some(latest) = &job.latest else {
            return;
        };
        if job
            .copies
            .get(&region)
            .is_some_and(|held| *held >= latest.step)
        {
            return;
        }
        let Ok(peer) = fed::peer_named(&self.node, &region) else {
            return;
        };
        let started = Instant::now();
        match fed::copy::send_step(&self.node, &peer, job.id, &job.spec, latest, origin_index).await
        {
            Ok(report) => {
                tracing::info!(
                    job = job.id,
                    step = latest.step,
                    %region,
                    chunks = report.chunks,
                    chunks_sent = report.chunks_sent,
                    bytes_sent = report.bytes_sent,
                    ms = started.elapsed().as_millis() as u64,
                    "checkpoint step copied to another region"
                );
                self.retry_at.remove(&job.id);
                let cmd = Command::CheckpointCopied {
                    job: job.id,
                    step: Some(latest.step),
                    region,
                };
                propose(&self.node, cmd, "recording a region copy").await;
            }
            Err(e) => {
                tracing::warn!(job = job.id, step = latest.step, %region, error = %e, "checkpoint step not copied to another region; will retry");
                self.retry_at.insert(job.id, Instant::now() + RETRY_AFTER);
            }
        }
    }
}

impl Worker for RegionCopies {
    fn period(&self) -> Duration {
        PERIOD
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        if !self.node.ledger().is_leader() {
            return ControlFlow::Continue(());
        }
        let (jobs, index) = self.copied_jobs();
        self.retry_at
            .retain(|id, _| jobs.iter().any(|j| j.id == *id));
        self.end_moved_jobs(&jobs).await;
        for job in &jobs {
            self.copy(job, index).await;
        }
        ControlFlow::Continue(())
    }
}

pub struct RegionTakeover {
    pub node: Arc<Node>,
}

/// What the takeover loop decided about one job held here.
#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    /// It ended in its region: drop the copy.
    Forget,
    /// Its region is lost: take it over.
    Adopt,
    Keep,
}

/// The rule, pure: `summary` is the origin's latest (its ledger index and
/// live copied jobs), `silent_ms` how long the origin has not answered
/// (`None`: it answers).
pub fn verdict(
    origin_job: u64,
    origin_index: u64,
    summary: Option<(u64, &[u64])>,
    silent_ms: Option<u64>,
    failover_after_ms: u64,
) -> Verdict {
    if let Some((index, live)) = summary {
        if index > origin_index && !live.contains(&origin_job) {
            return Verdict::Forget;
        }
    }
    match silent_ms {
        Some(ms) if ms >= failover_after_ms => Verdict::Adopt,
        _ => Verdict::Keep,
    }
}

impl Worker for RegionTakeover {
    fn period(&self) -> Duration {
        PERIOD
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        if !self.node.ledger().is_leader() {
            return ControlFlow::Continue(());
        }
        let held: Vec<(String, u64, u64)> = match self.node.ledger().read() {
            Ok(d) => d
                .ledger
                .federation
                .foreign
                .iter()
                .filter(|(origin, _)| d.ledger.federation.peers.contains_key(*origin))
                .flat_map(|(origin, jobs)| {
                    jobs.iter()
                        .filter(|(_, j)| j.adopted_as.is_none())
                        .map(|(id, j)| (origin.clone(), *id, j.origin_index))
                })
                .collect(),
            Err(_) => return ControlFlow::Continue(()),
        };
        let tuning = &self.node.config().federation;
        let now = wall_ms();
        let tracker = self.node.federation().tracker();
        // Silence is counted from this node's start when it never heard
        // the region: a new leader does not wait for a summary that will
        // never come, nor act before a full window.
        let up_ms = self.node.started().elapsed().as_millis() as u64;
        for (origin, origin_job, origin_index) in held {
            let status = tracker.status(&origin);
            let summary = status
                .and_then(|s| s.summary.as_ref())
                .map(|s| (s.ledger_index, s.copied_live.as_slice()));
            let silent_ms = (!tracker.reachable(&origin, now)).then(|| {
                status
                    .and_then(|s| s.last_ok_ms)
                    .map_or(up_ms, |t| now.saturating_sub(t).min(up_ms))
            });
            let v = verdict(
                origin_job,
                origin_index,
                summary,
                silent_ms,
                tuning.region_failover_after_ms,
            );
            tracing::debug!(%origin, origin_job, ?silent_ms, ?summary, ?v, "takeover verdict");
            let cmd = match v {
                Verdict::Keep => continue,
                Verdict::Forget => Command::ForgetForeignJob {
                    origin: origin.clone(),
                    origin_job,
                },
                Verdict::Adopt => Command::AdoptForeignJob {
                    origin: origin.clone(),
                    origin_job,
                    wait_ms: tuning.takeover_wait_ms(),
                },
            };
            if let Some(LedgerResponse::JobId(id)) =
                propose(&self.node, cmd, "a region takeover").await
            {
                tracing::warn!(%origin, origin_job, job = id, "region lost: took its job over from the copy held here");
            }
        }
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_is_dropped_only_on_newer_word_and_adopted_only_after_the_window() {
        // A summary from before the copy says nothing about the job.
        assert_eq!(verdict(7, 10, Some((9, &[])), None, 60), Verdict::Keep);
        assert_eq!(verdict(7, 10, Some((11, &[7])), None, 60), Verdict::Keep);
        assert_eq!(verdict(7, 10, Some((11, &[])), None, 60), Verdict::Forget);
        assert_eq!(verdict(7, 10, None, Some(59), 60), Verdict::Keep);
        assert_eq!(verdict(7, 10, None, Some(60), 60), Verdict::Adopt);
        // A job that ended before the region was lost is not resumed.
        assert_eq!(
            verdict(7, 10, Some((11, &[])), Some(600), 60),
            Verdict::Forget
        );
    }
}
