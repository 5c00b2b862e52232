//! Sans-IO gang scheduler: every decision is a pure function of a snapshot,
//! so all replicas of the consensus log compute the same plan, and tests and
//! the simulator drive it without clocks, sockets or randomness.
//!
//! One call to [`schedule`] is one pass over a [`SchedInput`]; it returns a
//! [`SchedPlan`] for the caller to commit. The pass borrows the node views
//! and records its own placements in a private allocation overlay as soon as
//! it decides them, so a GPU is never promised twice within a pass.
//!
//! # Policies
//! - [`Policy::Fifo`] is the "traditional cluster" baseline: strict submission
//!   order; the first job that cannot start (for lack of GPUs or quota) blocks
//!   every job behind it; no backfill, no preemption.
//! - [`Policy::Hdrf`] orders jobs by hierarchical dominant resource fairness
//!   ([`fairshare`]), enforces quota and GPU-hour budgets, and backfills in
//!   EASY style: the first job in fair order that cannot start gets a
//!   reservation at the earliest time running jobs (by their time limits)
//!   leave enough room for it; later jobs start now only if they end before
//!   that time or stay off the GPUs the reservation needs.
//! - [`Policy::HdrfPreempt`] additionally lets a job that cannot start, ahead
//!   of any reservation, preempt preemptible running jobs when its tenant is
//!   below its fair share and the victims' tenants are above theirs, or when
//!   its base `priority` is strictly higher than that of a victim of its own
//!   tenant (priority never ranks one tenant's jobs against another's, so a
//!   tenant's `--priority 1000000` preempts nobody else). `boost` does not
//!   count here (see below). Victims are taken
//!   smallest first, then most recently checkpointed, and only if freeing them
//!   really makes the gang placeable; victims that turn out unnecessary are
//!   dropped again.
//!
//! # Preemption compensation
//! A victim loses the work since its last checkpoint, so the plan refunds
//! `refund_gpu_s = victim.gpus × (now_s − (last_checkpoint_s or started_s))`
//! GPU-seconds, saturating at zero for clocks that appear to run backwards.
//! Requeueing the victim is the caller's business; the suggested policy is
//! `boost += 1` per preemption suffered, so repeated victims climb in their
//! tenant's queue instead of starving. Boost only orders jobs within their
//! tenant's queue; it never makes a job out-rank a running job for
//! preemption, because a requeued victim with boost 1 would otherwise
//! out-rank every running job of priority 0, and each preemption would
//! trigger the next. Report a running job's base priority in
//! [`RunningJob::priority`], not its boost.
//!
//! # Inputs the pass distrusts
//! Requests that can never run (zero nodes, GPU totals that disagree with the
//! gang shape, unknown tenants, duplicated ids) are left pending with an
//! `invalid:` reason and never block a queue. Nodes whose id appears twice are
//! never placed on. Which GPUs a running job holds is read from the node views
//! (`allocated_to`), not from `RunningJob::nodes`.

pub mod fairshare;
pub mod model;
mod pass;
mod pending_index;
pub mod placement;
pub mod proximity;

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod testkit;
#[cfg(test)]
mod tests;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

pub use fairshare::{
    check_quota, order_pending, PendingDemand, PendingJob, QuotaDenied, QuotaKind, ResourceVector,
    TenantAllocation, TenantView,
};
pub use model::{
    gpu_model_matches, GangRequest, GpuView, JobId, NodeChoice, NodeId, NodeView, Placement,
    TopologyTier,
};
use placement::ClusterShape;
pub use placement::{place_gang, Placer, Unplaceable, UnplaceableKind};
pub use proximity::{MatrixProximity, Proximity, TopologyProximity};

/// How a pass picks and starts jobs; see the module documentation.
///
/// Named `fifo`, `hdrf` and `hdrf-preempt` wherever a person writes or reads
/// one (configuration, command line, reports): [`FromStr`](std::str::FromStr)
/// parses those names, [`Display`](fmt::Display) prints them, and serde
/// (de)serializes a policy as its name.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    Fifo,
    Hdrf,
    HdrfPreempt,
}

impl Policy {
    /// Every policy, in the order the names are listed.
    pub const ALL: [Policy; 3] = [Policy::Fifo, Policy::Hdrf, Policy::HdrfPreempt];

    /// The policy's name: `fifo`, `hdrf` or `hdrf-preempt`.
    pub const fn name(self) -> &'static str {
        match self {
            Policy::Fifo => "fifo",
            Policy::Hdrf => "hdrf",
            Policy::HdrfPreempt => "hdrf-preempt",
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.name())
    }
}

/// A name that is not one of [`Policy`]'s.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct UnknownPolicy(pub String);

impl fmt::Display for UnknownPolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "unknown policy '{}': use fifo, hdrf or hdrf-preempt",
            self.0
        )
    }
}

impl std::error::Error for UnknownPolicy {}

impl std::str::FromStr for Policy {
    type Err = UnknownPolicy;

    /// Exactly the names [`Policy::name`] gives; no trimming, no case folding.
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Policy::ALL
            .into_iter()
            .find(|policy| policy.name() == name)
            .ok_or_else(|| UnknownPolicy(name.to_string()))
    }
}

impl Serialize for Policy {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for Policy {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let name = String::deserialize(deserializer)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

/// A job holding GPUs right now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RunningJob {
    pub id: JobId,
    pub tenant: String,
    pub gpus: u32,
    pub nodes: Vec<NodeId>,
    pub started_s: u64,
    pub time_limit_s: u64,
    pub preemptible: bool,
    /// Base priority, as submitted; never include a requeue boost here.
    pub priority: i32,
    pub last_checkpoint_s: Option<u64>,
}

impl RunningJob {
    /// When the time limit forces the job off its GPUs.
    pub fn deadline_s(&self) -> u64 {
        self.started_s.saturating_add(self.time_limit_s)
    }
}

/// Everything one pass looks at.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SchedInput {
    pub now_s: u64,
    pub nodes: Vec<NodeView>,
    pub tenants: Vec<TenantView>,
    pub running: Vec<RunningJob>,
    pub pending: Vec<(PendingJob, GangRequest)>,
    pub policy: Policy,
}

/// A running job to stop so that `for_job` can start.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Preemption {
    pub victim: JobId,
    pub for_job: JobId,
    /// GPU-seconds of lost work to credit back to the victim's tenant.
    pub refund_gpu_s: f64,
}

/// What the caller should do after a pass.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SchedPlan {
    /// In the order the pass decided them.
    pub placements: Vec<Placement>,
    /// Must be carried out before the placements that rely on them.
    pub preemptions: Vec<Preemption>,
    /// Every pending job that was not placed, with a non-empty explanation.
    pub pending_reasons: BTreeMap<JobId, String>,
    /// Running jobs at or past their time limit, sorted by id. Their GPUs are
    /// still treated as busy in this pass.
    pub timed_out: Vec<JobId>,
}

/// One scheduling pass.
pub fn schedule(input: &SchedInput, prox: &dyn Proximity) -> SchedPlan {
    let shape = Cow::Owned(ClusterShape::new(&input.nodes));
    pass::Pass::new(input, prox, shape, None, pass::Scratch::default())
        .run()
        .0
}

/// Which node views may differ from the snapshot of the previous pass run
/// through the same [`SchedCache`].
#[derive(Clone, Copy, Debug)]
pub enum NodeChanges<'c> {
    /// Anything may have changed: every GPU view is read again.
    All,
    /// Only the GPUs (holder, model, index) of the nodes at these positions
    /// of [`SchedInput::nodes`] may have changed. Health, labels and node ids
    /// are read afresh every pass whatever is listed, and a change in the
    /// number of nodes or of GPUs on any node is noticed and answered with a
    /// full re-read.
    Only(&'c [usize]),
}

/// Scheduler state kept from one pass to the next, for callers that run
/// passes back to back on a cluster that changes a little in between (the
/// simulator, at every event instant). Reading every GPU view to rebuild
/// the flat GPU numbering and the allocation overlay dominated a pass on a
/// large cluster; with the cache a pass re-reads only the nodes the caller
/// says changed.
///
/// A pass through the cache decides exactly what [`schedule`] decides on
/// the same input, provided the caller's [`NodeChanges`] are truthful: the
/// cache then holds what a full read would produce (tests compare both).
#[derive(Default)]
pub struct SchedCache {
    /// `None` until the first pass.
    shape: Option<ClusterShape>,
    /// Who holds each GPU of `shape`, as last read.
    overlay: pass::Overlay,
    scratch: pass::Scratch,
    /// See [`SchedCache::without_waiting_reasons`].
    omit_waiting_reasons: bool,
    /// The queue, sorted and validated, for
    /// [`SchedCache::schedule_incremental`].
    pending: pending_index::PendingIndex,
    /// Scratch: the tenants' names, sorted, for the index.
    tenant_names: Vec<String>,
}

/// Which entries of [`SchedInput::pending`] may differ from the previous
/// pass run through the same [`SchedCache`].
#[derive(Clone, Copy, Debug)]
pub enum PendingChanges<'c> {
    /// Anything may have changed: the queue is read again.
    All,
    /// Only the entries at these positions may have changed (added,
    /// replaced, or moved there, e.g. by `swap_remove`): every other
    /// position below the new length holds what it held at the previous
    /// pass. Positions past the new length are dropped; repeats and
    /// positions out of range are harmless.
    Only(&'c [usize]),
}

impl SchedCache {
    /// A cache whose plans explain only the `invalid:` requests in
    /// [`SchedPlan::pending_reasons`], not why valid jobs wait. Placements,
    /// preemptions and time-outs are unchanged (tested). For callers that
    /// never show the waiting reasons (the simulator): writing one for every
    /// waiting job made each pass cost a string and a map insert per job in
    /// the queue, and a FIFO pass could otherwise stop at its first blocked
    /// job instead of walking the whole queue.
    pub fn without_waiting_reasons() -> Self {
        SchedCache {
            omit_waiting_reasons: true,
            ..SchedCache::default()
        }
    }

    /// One pass, like [`schedule`], reading only what `changes` names.
    pub fn schedule(
        &mut self,
        input: &SchedInput,
        prox: &dyn Proximity,
        changes: NodeChanges<'_>,
    ) -> SchedPlan {
        // The caller did not say what changed in the queue.
        self.pending.forget_all();
        self.pass(input, prox, changes, false)
    }

    /// One pass, like [`SchedCache::schedule`], that is also told which
    /// entries of the queue changed. With a cache made by
    /// [`SchedCache::without_waiting_reasons`], a FIFO pass then visits the
    /// queue only up to its first blocked job instead of validating and
    /// sorting all of it, which made a pass on a long queue cost a walk
    /// over the whole backlog. Decisions are those of [`schedule`]
    /// (tested), provided `pending` is truthful.
    pub fn schedule_incremental(
        &mut self,
        input: &SchedInput,
        prox: &dyn Proximity,
        nodes: NodeChanges<'_>,
        pending: PendingChanges<'_>,
    ) -> SchedPlan {
        let mut names = std::mem::take(&mut self.tenant_names);
        names.clear();
        names.extend(input.tenants.iter().map(|tenant| tenant.name.clone()));
        names.sort_unstable();
        names.dedup();
        let changed = match pending {
            PendingChanges::All => None,
            PendingChanges::Only(positions) => Some(positions),
        };
        self.pending.sync(&input.pending, &names, changed);
        self.tenant_names = names;
        self.pass(input, prox, nodes, true)
    }

    fn pass(
        &mut self,
        input: &SchedInput,
        prox: &dyn Proximity,
        changes: NodeChanges<'_>,
        use_index: bool,
    ) -> SchedPlan {
        self.sync(&input.nodes, changes);
        match &self.shape {
            Some(shape) => {
                let scratch = std::mem::take(&mut self.scratch);
                let mut pass = pass::Pass::new(
                    input,
                    prox,
                    Cow::Borrowed(shape),
                    Some(&self.overlay),
                    scratch,
                );
                if self.omit_waiting_reasons {
                    pass.omit_waiting_reasons();
                }
                if use_index {
                    pass.with_index(&self.pending);
                }
                let (plan, scratch) = pass.run();
                self.scratch = scratch;
                plan
            }
            // `sync` always leaves a shape; reading the views is the safe answer.
            None => {
                let mut plan = schedule(input, prox);
                if self.omit_waiting_reasons {
                    plan.pending_reasons
                        .retain(|_, reason| reason.starts_with(pass::INVALID_PREFIX));
                }
                plan
            }
        }
    }

    /// Brings the shape and the overlay up to date with `nodes`.
    fn sync(&mut self, nodes: &[NodeView], changes: NodeChanges<'_>) {
        let refreshed_in_place = match (&mut self.shape, changes) {
            (Some(shape), NodeChanges::Only(changed)) if shape.matches_sizes(nodes) => {
                let mut in_place = true;
                for &position in changed {
                    // Out with the node as the overlay counted it, in with
                    // what it reports now.
                    self.overlay.remove_node(shape, position);
                    if !shape.refresh_node(nodes, position) {
                        in_place = false;
                        break;
                    }
                    self.overlay.add_node(shape, nodes, position);
                }
                in_place
            }
            _ => false,
        };
        if !refreshed_in_place {
            let shape = ClusterShape::new(nodes);
            self.overlay.rebuild(&shape, nodes);
            self.shape = Some(shape);
        }
    }
}
