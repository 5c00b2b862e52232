//! The machinery behind [`super::schedule`]: an allocation overlay on the
//! borrowed snapshot, quota and fairness bookkeeping, EASY reservations and
//! victim selection.
//!
//! # Why it is shaped like this
//! A pass runs at every event of a busy cluster, so its cost must not grow
//! with anything but what it decides:
//! - The node views are borrowed, never cloned. Which job holds each GPU is
//!   kept in a flat overlay (`holder`, one `u32` per GPU, jobs numbered
//!   densely), and placement reads a [`ClusterIndex`] built once per pass.
//!   Its per-GPU part ([`ClusterShape`]) can come from a
//!   [`super::SchedCache`] that kept it since the previous pass, and so can
//!   the overlay with its job numbering, free counts and per-job holdings
//!   ([`Overlay`]), updated only for the nodes the caller says changed: a
//!   pass then copies it instead of reading every GPU view and hashing every
//!   holder, and visits only the GPUs of nodes that cannot host.
//! - Free usable GPUs are counted per node and per model as placements and
//!   evictions happen. Per-model totals reject a gang that cannot fit before
//!   any scan; per-node counts let a placement scan skip full nodes.
//! - Failures are memoised per gang shape (model, nodes, GPUs per node,
//!   constraints) and per search area: GPUs only get scarcer while a pass
//!   places jobs, so a shape that did not fit, or any larger shape with the
//!   same constraints, does not fit later in the pass either, and the queue
//!   behind it is answered without another search. Evictions clear the memo.
//! - Reason strings that would repeat (FIFO's "waiting behind") are built
//!   once and cloned.

use std::borrow::Cow;
use std::cell::RefCell;
use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;

use super::fairshare::{
    order_pending, unknown_tenant, FairOrder, HdrfUsage, PendingDemand, PendingJob, Projected,
    ResourceSpace, ResourceVector, TenantAllocation, TenantTree,
};
use super::model::{GangRequest, JobId, NodeChoice, NodeId, NodeView, Placement, TopologyTier};
use super::pending_index::{static_problem, PendingIndex, ShapeClass};
use super::placement::{
    count_feasible_nodes, labels_suffix, model_name, not_enough_nodes, place_indexed, ClusterIndex,
    ClusterShape, Unplaceable, UnplaceableKind,
};
use super::proximity::Proximity;
use super::{Policy, Preemption, RunningJob, SchedInput, SchedPlan};

mod orders;
mod preempt;

/// Shares closer than this are equal; keeps float noise from flip-flopping
/// preemption decisions.
const SHARE_EPSILON: f64 = 1e-9;

/// How the reason of a request that can never run begins; callers that
/// drop the other reasons keep these.
pub(crate) const INVALID_PREFIX: &str = "invalid:";

/// `holder` value of a GPU nobody holds.
const FREE: u32 = u32::MAX;

type PendingEntry = (PendingJob, GangRequest);

/// Demands by (model, GPUs), projected on the fair order's resources and
/// shared by its jobs. A handful of sizes and models: a scan.
type SharedDemands<'a> = Vec<((Option<&'a str>, u32), Projected)>;

/// Multiplicative hashing for job ids. Ids come from the consensus log and
/// are dense integers, for which SipHash is needlessly slow; the maps keyed
/// by it are only ever probed, never iterated, so their order cannot leak
/// into a plan.
#[derive(Default)]
struct JobIdHasher(u64);

impl Hasher for JobIdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &byte in bytes {
            self.write_u64(u64::from(byte));
        }
    }

    fn write_u64(&mut self, value: u64) {
        let mixed = (self.0 ^ value ^ (value >> 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        self.0 = mixed ^ (mixed >> 29);
    }
}

type FastJobMap<V> = HashMap<JobId, V, BuildHasherDefault<JobIdHasher>>;
type FastJobSet = HashSet<JobId, BuildHasherDefault<JobIdHasher>>;

/// Dense numbers for the jobs a pass sees holding or taking GPUs, so that
/// per-job state lives in vectors and the overlay fits in a `u32`.
#[derive(Default)]
struct JobSlots {
    ids: Vec<JobId>,
    slot_of: FastJobMap<u32>,
    /// Per slot: when the job is expected to let go, by its time limit;
    /// `None` for holders the pass knows nothing about (never released).
    release_at: Vec<Option<u64>>,
    preempted: Vec<bool>,
    running: Vec<bool>,
}

impl JobSlots {
    fn slot(&mut self, id: JobId) -> u32 {
        if let Some(&slot) = self.slot_of.get(&id) {
            return slot;
        }
        // Slots stop short of FREE; more jobs than that cannot fit in memory.
        let slot = u32::try_from(self.ids.len())
            .unwrap_or(FREE - 1)
            .min(FREE - 1);
        self.slot_of.insert(id, slot);
        self.ids.push(id);
        self.release_at.push(None);
        self.preempted.push(false);
        self.running.push(false);
        slot
    }

    /// Forgets every job but keeps the memory, for the next pass.
    fn clear(&mut self) {
        self.ids.clear();
        self.slot_of.clear();
        self.release_at.clear();
        self.preempted.clear();
        self.running.clear();
    }

    fn get(&self, id: JobId) -> Option<usize> {
        self.slot_of.get(&id).map(|&slot| slot as usize)
    }

    fn id(&self, slot: u32) -> Option<JobId> {
        self.ids.get(slot as usize).copied()
    }
}

/// Who holds each GPU, and the counts a pass derives from that, kept by a
/// [`super::SchedCache`] between passes and updated node by node as the
/// caller reports changes. Rebuilding them walked every GPU and hashed every
/// holder at each pass, the largest cost left in a pass on a big cluster.
///
/// Everything here ignores health and duplicated node ids, which may change
/// without being reported: a pass takes the nodes that cannot host (few)
/// back out of the counts (`Pass::new`). Slots are numbered by this
/// structure and reused when a job lets go of its last GPU; which job gets
/// which slot never reaches a plan.
#[derive(Default)]
pub(crate) struct Overlay {
    /// Per flat GPU: slot of its holder, or FREE.
    holder: Vec<u32>,
    /// Per slot: the job (stale while the slot is free).
    ids: Vec<JobId>,
    slot_of: FastJobMap<u32>,
    /// Per slot: GPUs it holds; at 0 the slot is freed.
    gpus_of_slot: Vec<u32>,
    free_slots: Vec<u32>,
    /// Per slot: GPUs held per model id, on any node.
    held: Vec<Held>,
    /// Per node position: free GPUs with a unique index.
    free_unique: Vec<u32>,
    /// Per model id: `free_unique` summed over the nodes.
    free_unique_by_model: Vec<u64>,
    /// Per model id: GPUs on any node.
    gpus_by_model: Vec<u64>,
}

impl Overlay {
    /// Reads every node afresh.
    pub(crate) fn rebuild(&mut self, shape: &ClusterShape, nodes: &[NodeView]) {
        self.holder.clear();
        self.holder.resize(shape.gpu_count(), FREE);
        self.ids.clear();
        self.slot_of.clear();
        self.gpus_of_slot.clear();
        self.free_slots.clear();
        self.held.clear();
        self.free_unique.clear();
        self.free_unique.resize(nodes.len(), 0);
        self.free_unique_by_model.clear();
        self.free_unique_by_model.resize(shape.models.len(), 0);
        self.gpus_by_model.clear();
        self.gpus_by_model.resize(shape.models.len(), 0);
        for &model in &shape.gpu_model {
            if let Some(total) = self.gpus_by_model.get_mut(model as usize) {
                *total += 1;
            }
        }
        for position in 0..nodes.len() {
            self.add_node(shape, nodes, position);
        }
    }

    /// Whether this was built for `shape` over `nodes` nodes.
    fn fits(&self, shape: &ClusterShape, nodes: usize) -> bool {
        self.holder.len() == shape.gpu_count()
            && self.free_unique.len() == nodes
            && self.gpus_by_model.len() == shape.models.len()
    }

    /// Forgets the node's GPUs; call before `shape` is refreshed, so that
    /// the index uniqueness counted when they were added is the one undone.
    pub(crate) fn remove_node(&mut self, shape: &ClusterShape, position: usize) {
        if !self.fits(shape, self.free_unique.len()) {
            return;
        }
        for gpu in shape.gpu_range(position) {
            let model = shape.gpu_model[gpu];
            let slot = std::mem::replace(&mut self.holder[gpu], FREE);
            if slot == FREE {
                if shape.gpu_unique[gpu] {
                    if let Some(free) = self.free_unique.get_mut(position) {
                        *free = free.saturating_sub(1);
                    }
                    if let Some(free) = self.free_unique_by_model.get_mut(model as usize) {
                        *free = free.saturating_sub(1);
                    }
                }
                continue;
            }
            let index = slot as usize;
            if let Some(held) = self.held.get_mut(index) {
                held.sub(model, 1);
            }
            if let Some(count) = self.gpus_of_slot.get_mut(index) {
                *count = count.saturating_sub(1);
                if *count == 0 {
                    if let Some(id) = self.ids.get(index) {
                        self.slot_of.remove(id);
                    }
                    self.held[index] = Held::default();
                    self.free_slots.push(slot);
                }
            }
        }
    }

    /// Reads the node's GPU views into the overlay (after `remove_node`).
    pub(crate) fn add_node(&mut self, shape: &ClusterShape, nodes: &[NodeView], position: usize) {
        let Some(node) = nodes.get(position) else {
            return;
        };
        if !self.fits(shape, nodes.len()) {
            return;
        }
        for (gpu, view) in shape.gpu_range(position).zip(&node.gpus) {
            let model = shape.gpu_model[gpu];
            match view.allocated_to {
                None => {
                    self.holder[gpu] = FREE;
                    if shape.gpu_unique[gpu] {
                        self.free_unique[position] += 1;
                        if let Some(free) = self.free_unique_by_model.get_mut(model as usize) {
                            *free += 1;
                        }
                    }
                }
                Some(id) => {
                    let slot = self.slot_for(id);
                    self.holder[gpu] = slot;
                    let index = slot as usize;
                    self.gpus_of_slot[index] += 1;
                    self.held[index].add(model, 1);
                }
            }
        }
    }

    /// Everything the overlay says, without its slot numbering (which
    /// depends on history): per GPU its holder, per holder its GPU count and
    /// per-model holdings, the free counts. Slot table consistency is
    /// checked on the way.
    #[cfg(test)]
    #[allow(clippy::type_complexity)]
    pub(crate) fn normalized(
        &self,
    ) -> (
        Vec<Option<JobId>>,
        BTreeMap<JobId, (u32, Vec<(u32, u64)>)>,
        Vec<u32>,
        Vec<u64>,
        Vec<u64>,
    ) {
        let holders: Vec<Option<JobId>> = self
            .holder
            .iter()
            .map(|&slot| (slot != FREE).then(|| self.ids[slot as usize]))
            .collect();
        let mut per_job = BTreeMap::new();
        for (slot, &id) in self.ids.iter().enumerate() {
            let gpus = self.gpus_of_slot[slot];
            if gpus == 0 {
                assert!(
                    self.free_slots.contains(&(slot as u32)),
                    "slot {slot} leaked"
                );
                continue;
            }
            assert_eq!(self.slot_of.get(&id), Some(&(slot as u32)), "job {id}");
            let mut held: Vec<(u32, u64)> =
                self.held[slot].iter().filter(|&(_, c)| c > 0).collect();
            held.sort_unstable();
            per_job.insert(id, (gpus, held));
        }
        assert_eq!(self.slot_of.len(), per_job.len());
        (
            holders,
            per_job,
            self.free_unique.clone(),
            self.free_unique_by_model.clone(),
            self.gpus_by_model.clone(),
        )
    }

    fn slot_for(&mut self, id: JobId) -> u32 {
        if let Some(&slot) = self.slot_of.get(&id) {
            return slot;
        }
        let slot = match self.free_slots.pop() {
            Some(slot) => {
                self.ids[slot as usize] = id;
                slot
            }
            None => {
                // Slots stop short of FREE, as in `JobSlots::slot`.
                let slot = u32::try_from(self.ids.len())
                    .unwrap_or(FREE - 1)
                    .min(FREE - 1);
                if slot as usize == self.ids.len() {
                    self.ids.push(id);
                    self.gpus_of_slot.push(0);
                    self.held.push(Held::default());
                }
                slot
            }
        };
        self.slot_of.insert(id, slot);
        slot
    }
}

/// What `Pass::new` derives from who holds which GPU.
struct Holdings<'a> {
    jobs: JobSlots,
    holder: Vec<u32>,
    held: Cow<'a, [Held]>,
    free_usable: Vec<u32>,
    free_by_model: Vec<u64>,
    capacity_by_model: Vec<u64>,
}

impl<'a> Holdings<'a> {
    /// One walk over every GPU view.
    fn read(input: &SchedInput, cluster: &ClusterIndex<'_>, mut jobs: JobSlots) -> Self {
        let gpu_count = cluster.shape.gpu_count();
        let mut holder = Vec::with_capacity(gpu_count);
        let mut held: Vec<Held> = Vec::new();
        let mut free_usable = vec![0u32; input.nodes.len()];
        let mut free_by_model = vec![0u64; cluster.shape.models.len()];
        let mut capacity_by_model = vec![0u64; cluster.shape.models.len()];
        let mut previous: Option<(JobId, u32)> = None;
        for (position, node) in input.nodes.iter().enumerate() {
            let hostable = cluster.hostable[position];
            for gpu in cluster.gpu_range(position) {
                let model = cluster.shape.gpu_model[gpu];
                let slot = match cluster.gpu(gpu).allocated_to {
                    None => FREE,
                    // Consecutive GPUs usually belong to the same job.
                    Some(id) => match previous {
                        Some((last, slot)) if last == id => slot,
                        _ => {
                            let slot = jobs.slot(id);
                            previous = Some((id, slot));
                            slot
                        }
                    },
                };
                holder.push(slot);
                if node.healthy {
                    if let Some(total) = capacity_by_model.get_mut(model as usize) {
                        *total += 1;
                    }
                    if slot != FREE {
                        let slot = slot as usize;
                        if held.len() <= slot {
                            held.resize(slot + 1, Held::default());
                        }
                        held[slot].add(model, 1);
                    }
                }
                if slot == FREE && hostable && cluster.shape.gpu_unique[gpu] {
                    free_usable[position] += 1;
                    if let Some(free) = free_by_model.get_mut(model as usize) {
                        *free += 1;
                    }
                }
            }
        }
        Holdings {
            jobs,
            holder,
            held: Cow::Owned(held),
            free_usable,
            free_by_model,
            capacity_by_model,
        }
    }

    /// From a cache's overlay: copies, then takes the nodes that cannot
    /// host back out; only those nodes' GPUs are visited.
    fn cached(
        input: &SchedInput,
        cluster: &ClusterIndex<'_>,
        overlay: &'a Overlay,
        mut jobs: JobSlots,
    ) -> Self {
        jobs.ids.extend_from_slice(&overlay.ids);
        jobs.slot_of.clone_from(&overlay.slot_of);
        let slots = overlay.ids.len();
        jobs.release_at.resize(slots, None);
        jobs.preempted.resize(slots, false);
        jobs.running.resize(slots, false);
        let holder = overlay.holder.clone();
        let mut held = Cow::Borrowed(&overlay.held[..]);
        let mut free_usable = Vec::with_capacity(input.nodes.len());
        let mut free_by_model = overlay.free_unique_by_model.clone();
        let mut capacity_by_model = overlay.gpus_by_model.clone();
        for (position, node) in input.nodes.iter().enumerate() {
            let hostable = cluster.hostable[position];
            free_usable.push(if hostable {
                overlay.free_unique.get(position).copied().unwrap_or(0)
            } else {
                0
            });
            if hostable {
                continue;
            }
            for gpu in cluster.gpu_range(position) {
                let model = cluster.shape.gpu_model[gpu] as usize;
                let slot = holder[gpu];
                if slot == FREE && cluster.shape.gpu_unique[gpu] {
                    if let Some(free) = free_by_model.get_mut(model) {
                        *free = free.saturating_sub(1);
                    }
                }
                if !node.healthy {
                    if let Some(total) = capacity_by_model.get_mut(model) {
                        *total = total.saturating_sub(1);
                    }
                    if slot != FREE {
                        if let Some(held) = held.to_mut().get_mut(slot as usize) {
                            held.sub(model as u32, 1);
                        }
                    }
                }
            }
        }
        Holdings {
            jobs,
            holder,
            held,
            free_usable,
            free_by_model,
            capacity_by_model,
        }
    }
}

/// Memory a pass can hand back for the next one, so that a cache running
/// passes back to back does not rebuild the job-slot table's hash map from
/// nothing every time. Carries no decisions: a pass starts by clearing it.
#[derive(Default)]
pub(crate) struct Scratch {
    jobs: JobSlots,
}

/// GPUs per model id held by one job; almost always a single model, so the
/// first model lives inline: a pass builds one of these per running job, and
/// a heap allocation each showed up in profiles.
#[derive(Clone, Debug, Default)]
struct Held {
    first: Option<(u32, u64)>,
    /// Further models, in the order they were first added.
    more: Vec<(u32, u64)>,
}

impl Held {
    fn add(&mut self, model: u32, count: u64) {
        match &mut self.first {
            None => self.first = Some((model, count)),
            Some((first, held)) if *first == model => *held += count,
            Some(_) => match self.more.iter_mut().find(|(m, _)| *m == model) {
                Some((_, held)) => *held += count,
                None => self.more.push((model, count)),
            },
        }
    }

    /// Takes back what `add` counted; models stay listed (with 0), which
    /// every reader skips.
    fn sub(&mut self, model: u32, count: u64) {
        let entry = match &mut self.first {
            Some((first, held)) if *first == model => Some(held),
            _ => self
                .more
                .iter_mut()
                .find(|(m, _)| *m == model)
                .map(|(_, held)| held),
        };
        if let Some(held) = entry {
            *held = held.saturating_sub(count);
        }
    }

    /// (model id, count) in the order models were first added.
    fn iter(&self) -> impl Iterator<Item = (u32, u64)> + '_ {
        self.first.into_iter().chain(self.more.iter().copied())
    }
}

/// Where a placement attempt may put GPUs; memoised failures are kept per
/// area. `OutsideReservation` is a subset of `Free`, so a failure in `Free`
/// also answers it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Area {
    Free,
    OutsideReservation,
}

/// Everything about a request that placement looks at, except its size.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct ShapeConstraints<'a> {
    model: Option<&'a str>,
    same: Option<TopologyTier>,
    /// Bit pattern: validated requests never carry NaN.
    max_rtt_bits: Option<u64>,
    labels: &'a BTreeMap<String, String>,
    choice: &'a NodeChoice,
}

impl<'a> ShapeConstraints<'a> {
    fn of(request: &'a GangRequest) -> Self {
        ShapeConstraints {
            model: request.gpu_model.as_deref(),
            same: request.same,
            max_rtt_bits: request.max_rtt_ms.map(f64::to_bits),
            labels: &request.required_labels,
            choice: &request.choice,
        }
    }
}

/// A placement that failed earlier in the pass.
struct Failure {
    nodes: u32,
    gpus_per_node: u32,
    kind: UnplaceableKind,
    reason: String,
    /// Commits and evictions seen when it failed.
    epoch: u64,
}

impl Failure {
    /// Lack of nodes or of a big enough topology group only gets worse as
    /// GPUs are taken; the latency heuristic promises no such thing.
    fn holds_while_gpus_are_taken(&self) -> bool {
        matches!(
            self.kind,
            UnplaceableKind::NotEnoughNodes | UnplaceableKind::Topology
        )
    }
}

/// Failed placements of this pass, by area and constraints.
#[derive(Default)]
struct FailureMemo<'a> {
    failures: BTreeMap<(Area, ShapeConstraints<'a>), Vec<Failure>>,
}

impl<'a> FailureMemo<'a> {
    /// The reason `request` cannot be placed in `area`, if an earlier
    /// attempt already proves it.
    fn known(
        &self,
        area: Area,
        request: &'a GangRequest,
        epoch: u64,
        with_reason: bool,
    ) -> Option<Unplaceable> {
        let constraints = ShapeConstraints::of(request);
        let areas: &[Area] = match area {
            Area::Free => &[Area::Free],
            Area::OutsideReservation => &[Area::Free, Area::OutsideReservation],
        };
        let mut dominating: Option<&Failure> = None;
        for &area in areas {
            let Some(failures) = self.failures.get(&(area, constraints.clone())) else {
                continue;
            };
            for failure in failures {
                let still_valid = failure.holds_while_gpus_are_taken() || failure.epoch == epoch;
                if !still_valid {
                    continue;
                }
                if failure.nodes == request.nodes && failure.gpus_per_node == request.gpus_per_node
                {
                    return Some(Unplaceable {
                        kind: failure.kind,
                        // Nobody reads it without waiting reasons, and a
                        // copy per job walked was a heap allocation each.
                        reason: if with_reason {
                            failure.reason.clone()
                        } else {
                            String::new()
                        },
                    });
                }
                if failure.holds_while_gpus_are_taken()
                    && failure.nodes <= request.nodes
                    && failure.gpus_per_node <= request.gpus_per_node
                {
                    dominating.get_or_insert(failure);
                }
            }
        }
        dominating.map(|smaller| Unplaceable {
            kind: smaller.kind,
            // Only ever shown to people: a pass that drops waiting reasons
            // skips formatting one per waiting job.
            reason: if !with_reason {
                String::new()
            } else {
                format!(
                    "no room for {} nodes x {} {}{}: even {} x {} does not fit ({})",
                    request.nodes,
                    request.gpus_per_node,
                    model_name(request),
                    labels_suffix(request),
                    smaller.nodes,
                    smaller.gpus_per_node,
                    smaller.reason
                )
            },
        })
    }

    fn record(&mut self, area: Area, request: &'a GangRequest, failed: &Unplaceable, epoch: u64) {
        self.failures
            .entry((area, ShapeConstraints::of(request)))
            .or_default()
            .push(Failure {
                nodes: request.nodes,
                gpus_per_node: request.gpus_per_node,
                kind: failed.kind,
                reason: failed.reason.clone(),
                epoch,
            });
    }

    fn clear(&mut self) {
        self.failures.clear();
    }
}

/// The head job's claim on the future under EASY backfill.
struct Reservation {
    job: JobId,
    /// Earliest time the head job fits, assuming jobs run to their limits.
    shadow_s: u64,
    /// Per flat GPU: the head job would take it then; backfill must avoid
    /// it unless it ends before `shadow_s`.
    reserved: Vec<bool>,
}

pub(crate) struct Pass<'a> {
    input: &'a SchedInput,
    prox: &'a dyn Proximity,
    cluster: ClusterIndex<'a>,
    /// Allocation overlay: slot of the job holding each flat GPU, or FREE.
    /// Placements are written here as they are decided.
    holder: Vec<u32>,
    jobs: JobSlots,
    /// Per entry of `input.running`: its job slot, so that per-running-job
    /// loops need no hash lookup.
    running_slots: Vec<usize>,
    /// Per entry of `input.running`: its tenant's index, once
    /// `tenant_holdings` has looked them up (empty before).
    running_tenants: Vec<Option<usize>>,
    /// Per node: free GPUs that placement may use (hostable node, unique
    /// index); an upper bound for every search inside the free area.
    free_usable: Vec<u32>,
    /// Per model id: the sum of `free_usable` over GPUs of that model.
    free_by_model: Vec<u64>,
    /// (id, position) of the first view of each node id, sorted by id; later
    /// duplicates are never placed on.
    node_position: Vec<(NodeId, usize)>,
    /// Healthy GPUs per model id.
    capacity_by_model: Vec<u64>,
    /// Per job slot: GPUs held on healthy nodes according to the views.
    held: Cow<'a, [Held]>,
    tree: TenantTree,
    usage: HdrfUsage,
    /// Per tenant: has valid pending jobs, for "who is active" in fair
    /// shares.
    tenants_waiting: Vec<bool>,
    /// Whether `tenant_holdings` has charged the running jobs to `usage`.
    holdings_charged: bool,
    memo: FailureMemo<'a>,
    /// Bumped by every commit and eviction.
    epoch: u64,
    /// Explain why valid jobs wait (`pending_reasons`); `invalid:` reasons
    /// are always written.
    waiting_reasons: bool,
    /// The cache's sorted, validated queue, when the caller kept it up to
    /// date; see [`PendingIndex`].
    index: Option<&'a PendingIndex>,
    plan: SchedPlan,
}

impl<'a> Pass<'a> {
    /// `shape` must number the GPUs of `input.nodes`; `overlay`, when
    /// given, says who holds each GPU and replaces reading `allocated_to`
    /// from every GPU view (a cache keeps it up to date).
    pub fn new(
        input: &'a SchedInput,
        prox: &'a dyn Proximity,
        shape: Cow<'a, ClusterShape>,
        overlay: Option<&'a Overlay>,
        scratch: Scratch,
    ) -> Self {
        let cluster = ClusterIndex::with_shape(&input.nodes, shape);
        let mut jobs = scratch.jobs;
        jobs.clear();
        let Holdings {
            mut jobs,
            holder,
            held,
            free_usable,
            free_by_model,
            capacity_by_model,
        } = match overlay {
            Some(overlay) if overlay.fits(&cluster.shape, input.nodes.len()) => {
                Holdings::cached(input, &cluster, overlay, jobs)
            }
            _ => Holdings::read(input, &cluster, jobs),
        };
        let mut running_slots = Vec::with_capacity(input.running.len());
        for job in &input.running {
            let slot = jobs.slot(job.id) as usize;
            running_slots.push(slot);
            // The last listing of a job wins, as it always has.
            jobs.release_at[slot] = Some(job.deadline_s().max(input.now_s));
            jobs.running[slot] = true;
        }

        let mut node_position: Vec<(NodeId, usize)> = input
            .nodes
            .iter()
            .enumerate()
            .map(|(position, node)| (node.id, position))
            .collect();
        // Stable, so the first view of an id stays first.
        node_position.sort_by_key(|&(id, _)| id);
        node_position.dedup_by_key(|&mut (id, _)| id);

        let tree = TenantTree::new(&input.tenants);
        let tenant_count = tree.len();
        let capacity = resources_of(&cluster, capacity_by_model.iter().copied().enumerate());
        let usage = HdrfUsage::new(&tree, capacity);
        Pass {
            input,
            prox,
            cluster,
            holder,
            jobs,
            running_slots,
            running_tenants: Vec::new(),
            free_usable,
            free_by_model,
            node_position,
            capacity_by_model,
            held,
            tree,
            usage,
            tenants_waiting: vec![false; tenant_count],
            holdings_charged: false,
            memo: FailureMemo::default(),
            epoch: 0,
            waiting_reasons: true,
            index: None,
            plan: SchedPlan::default(),
        }
    }

    /// Lets the pass read the queue from `index` instead of walking
    /// `input.pending`, where that decides the same (see `run`).
    pub fn with_index(&mut self, index: &'a PendingIndex) {
        self.index = Some(index);
    }

    /// Leaves out the reasons of valid waiting jobs; see
    /// [`super::SchedCache::without_waiting_reasons`].
    pub fn omit_waiting_reasons(&mut self) {
        self.waiting_reasons = false;
    }

    /// The plan, and the pass's memory for the next pass to reuse.
    pub fn run(mut self) -> (SchedPlan, Scratch) {
        let now = self.input.now_s;
        let mut timed_out: Vec<JobId> = self
            .input
            .running
            .iter()
            .filter(|job| now >= job.deadline_s())
            .map(|job| job.id)
            .collect();
        timed_out.sort_unstable();
        timed_out.dedup();
        self.plan.timed_out = timed_out;

        // Without waiting reasons, only the jobs that start (and, under
        // HDRF, the one that gets the reservation) matter, so an index that
        // is already sorted and validated lets a pass stop once nothing
        // left in the queue can start.
        let indexed = self
            .index
            .filter(|index| !self.waiting_reasons && index.usable(self.input.pending.len()));
        if let Some(index) = indexed {
            self.run_indexed(index);
            return (self.plan, Scratch { jobs: self.jobs });
        }

        let valid = self.validate_pending();
        // Tenants' holdings feed the fair order of two or more jobs and the
        // fair shares preemption compares; nothing else reads them. Summing
        // them reads every running job's tenant name, a cache miss each on a
        // busy cluster, so a pass that cannot use them skips it: FIFO never
        // does, and the fair order of at most one job is that job. For
        // preemption they are summed when the first preemption is tried
        // (`try_preempt`): usage is only read there, and counts are integers,
        // so charging them later gives the same sums.
        let needs_holdings = match self.input.policy {
            Policy::Fifo => false,
            Policy::Hdrf | Policy::HdrfPreempt => valid.len() > 1,
        } || always_sum_holdings();
        let held_by_tenant = if needs_holdings {
            self.tenant_holdings()
        } else {
            Vec::new()
        };
        match self.input.policy {
            Policy::Fifo => self.run_fifo(valid),
            Policy::Hdrf => self.run_hdrf(valid, &held_by_tenant, false),
            Policy::HdrfPreempt => self.run_hdrf(valid, &held_by_tenant, true),
        }

        if !self.waiting_reasons {
            return (self.plan, Scratch { jobs: self.jobs });
        }
        let placed: FastJobSet = self.plan.placements.iter().map(|p| p.job).collect();
        for (job, _) in &self.input.pending {
            if !placed.contains(&job.id) {
                let reason = self.plan.pending_reasons.entry(job.id).or_default();
                if reason.is_empty() {
                    *reason = "not considered in this pass".to_string();
                }
            }
        }
        (self.plan, Scratch { jobs: self.jobs })
    }

    /// What each tenant's running jobs hold, charged to the fair-share
    /// usage. Summed per tenant and model before any ResourceVector is
    /// built: one vector per tenant instead of a map update per GPU. Counts
    /// are integers, so the float sums are exact whatever the order.
    fn tenant_holdings(&mut self) -> Vec<ResourceVector> {
        if std::mem::replace(&mut self.holdings_charged, true) {
            return Vec::new();
        }
        let held = std::mem::replace(&mut self.held, Cow::Borrowed(&[]));
        let mut held_by_tenant: Vec<Held> = vec![Held::default(); self.tree.len()];
        self.running_tenants.clear();
        for (job, &slot) in self.input.running.iter().zip(&self.running_slots) {
            let tenant = self.tree.index_of(&job.tenant);
            self.running_tenants.push(tenant);
            let Some(tenant) = tenant else {
                continue;
            };
            let Some(resources) = held.get(slot) else {
                continue;
            };
            for (model, count) in resources.iter() {
                held_by_tenant[tenant].add(model, count);
            }
        }
        let held_by_tenant: Vec<ResourceVector> = held_by_tenant
            .iter()
            .map(|held| resources_of(&self.cluster, held.iter().map(|(m, c)| (m as usize, c))))
            .collect();
        for (tenant, resources) in held_by_tenant.iter().enumerate() {
            if !resources.0.is_empty() {
                self.usage.charge(tenant, resources);
            }
        }
        held_by_tenant
    }

    /// Splits off requests that can never run; they get an `invalid:` reason
    /// and are never allowed to block a queue.
    fn validate_pending(&mut self) -> Vec<&'a PendingEntry> {
        let input = self.input;
        let mut seen = FastJobSet::default();
        let mut valid = Vec::with_capacity(input.pending.len());
        for entry in &input.pending {
            let (job, request) = entry;
            let problem = if !seen.insert(job.id) {
                Some(format!("duplicate job id {}", job.id))
            } else if self
                .jobs
                .get(job.id)
                .is_some_and(|slot| self.jobs.running[slot])
            {
                Some(format!("job {} is already running", job.id))
            } else {
                let tree = &self.tree;
                let problem = static_problem(job, request, |name| tree.index_of(name).is_some());
                if problem.is_none() {
                    if let Some(waiting) = tree
                        .index_of(&job.tenant)
                        .and_then(|tenant| self.tenants_waiting.get_mut(tenant))
                    {
                        *waiting = true;
                    }
                }
                problem
            };
            match problem {
                Some(problem) => {
                    // A duplicate must not overwrite the reason of the original.
                    self.plan
                        .pending_reasons
                        .entry(job.id)
                        .or_insert_with(|| format!("{INVALID_PREFIX} {problem}"));
                }
                None => valid.push(entry),
            }
        }
        valid
    }

    fn note(&mut self, job: JobId, reason: String) {
        if self.waiting_reasons {
            self.plan.pending_reasons.insert(job, reason);
        }
    }

    fn admit(&self, job: &PendingJob) -> Result<(), String> {
        match self.tree.index_of(&job.tenant) {
            Some(tenant) => self
                .tree
                .check_quota(tenant, job)
                .map_err(|denied| denied.reason),
            None => Err(unknown_tenant(&job.tenant).reason),
        }
    }

    /// Places `request` on free GPUs (outside `reserved`, when given),
    /// answering from the failure memo or the per-model free counts when
    /// they already prove it cannot fit.
    fn place_in(
        &mut self,
        area: Area,
        request: &'a GangRequest,
        reserved: Option<&[bool]>,
    ) -> Result<Placement, Unplaceable> {
        if let Some(known) = self
            .memo
            .known(area, request, self.epoch, self.waiting_reasons)
        {
            return Err(known);
        }
        let holder = &self.holder;
        let is_free = |gpu: usize| {
            holder[gpu] == FREE && reserved.is_none_or(|r| !r.get(gpu).copied().unwrap_or(false))
        };
        let outcome = if self.too_few_free_gpus(request) {
            let have_enough =
                count_feasible_nodes(&self.cluster, request, &is_free, Some(&self.free_usable));
            Err(not_enough_nodes(request, have_enough))
        } else {
            place_indexed(
                &self.cluster,
                self.prox,
                request,
                &is_free,
                Some(&self.free_usable),
            )
        };
        if let Err(failed) = &outcome {
            self.memo.record(area, request, failed, self.epoch);
        }
        outcome
    }

    /// O(1) necessary condition: enough free usable GPUs of the model (of
    /// any model when the request does not care) in the whole cluster.
    fn too_few_free_gpus(&self, request: &GangRequest) -> bool {
        let free: u64 = match request.gpu_model.as_deref() {
            Some(model) => self
                .cluster
                .model_ids(model)
                .into_iter()
                .filter_map(|id| self.free_by_model.get(id as usize).copied())
                .sum(),
            None => self.free_by_model.iter().sum(),
        };
        free < u64::from(request.nodes) * u64::from(request.gpus_per_node)
    }

    fn position_of(&self, node: NodeId) -> Option<usize> {
        self.node_position
            .binary_search_by_key(&node, |&(id, _)| id)
            .ok()
            .and_then(|i| self.node_position.get(i))
            .map(|&(_, position)| position)
    }

    /// Whether a flat GPU counts in `free_usable` when free.
    fn counts_as_usable(&self, position: usize, gpu: usize) -> bool {
        self.cluster.hostable[position] && self.cluster.shape.gpu_unique[gpu]
    }

    /// GPUs a placement holds: those planned, and for an exclusive job
    /// every other free GPU of its nodes, which nobody else may use while
    /// it runs and which its tenant is charged for (quota, budget, share).
    fn gpus_held(&self, placement: &Placement, request_exclusive: bool) -> u32 {
        let planned: u32 = placement.nodes.iter().map(|(_, g)| g.len() as u32).sum();
        if !request_exclusive {
            return planned;
        }
        let whole: u32 = placement
            .nodes
            .iter()
            .filter_map(|(node_id, _)| self.position_of(*node_id))
            .map(|position| {
                self.cluster
                    .gpu_range(position)
                    .filter(|gpu| self.holder[*gpu] == FREE)
                    .count() as u32
            })
            .sum();
        whole.max(planned)
    }

    /// Writes a placement into the overlay and charges its tenant; an
    /// exclusive job whose whole nodes exceed its tenant's quota or budget
    /// is not placed (its planned GPUs alone were within them).
    ///
    /// Whether it placed the job.
    fn commit(&mut self, job: &PendingJob, placement: Placement, request_exclusive: bool) -> bool {
        let held = self.gpus_held(&placement, request_exclusive);
        let whole;
        let job = if held > job.gpus {
            whole = PendingJob {
                gpus: held,
                ..job.clone()
            };
            if let Some(Err(denied)) = self
                .tree
                .index_of(&job.tenant)
                .map(|tenant| self.tree.check_quota(tenant, &whole))
            {
                self.note(
                    job.id,
                    format!("{} (--exclusive counts whole nodes)", denied.reason),
                );
                return false;
            }
            &whole
        } else {
            job
        };
        let slot = self.jobs.slot(job.id);
        let mut taken = Held::default();
        for (node_id, indices) in &placement.nodes {
            let Some(position) = self.position_of(*node_id) else {
                continue;
            };
            for gpu in self.cluster.gpu_range(position) {
                if self.holder[gpu] == FREE && indices.contains(&self.cluster.gpu(gpu).index) {
                    self.holder[gpu] = slot;
                    let model = self.cluster.shape.gpu_model[gpu];
                    taken.add(model, 1);
                    if self.counts_as_usable(position, gpu) {
                        self.free_usable[position] = self.free_usable[position].saturating_sub(1);
                        if let Some(free) = self.free_by_model.get_mut(model as usize) {
                            *free = free.saturating_sub(1);
                        }
                    }
                }
            }
        }
        if request_exclusive {
            // Nobody else is placed on a whole node for the rest of the
            // pass: its other GPUs are the job's, and charged as such.
            for (node_id, _) in &placement.nodes {
                let Some(position) = self.position_of(*node_id) else {
                    continue;
                };
                for gpu in self.cluster.gpu_range(position) {
                    if self.holder[gpu] == FREE {
                        self.holder[gpu] = slot;
                        let model = self.cluster.shape.gpu_model[gpu];
                        taken.add(model, 1);
                        if self.counts_as_usable(position, gpu) {
                            self.free_usable[position] =
                                self.free_usable[position].saturating_sub(1);
                            if let Some(free) = self.free_by_model.get_mut(model as usize) {
                                *free = free.saturating_sub(1);
                            }
                        }
                    }
                }
            }
        }
        let resources = resources_of(&self.cluster, taken.iter().map(|(m, c)| (m as usize, c)));
        if let Some(tenant) = self.tree.index_of(&job.tenant) {
            self.tree.charge(tenant, job.gpus, job.gpu_hours_needed());
            self.usage.charge(tenant, &resources);
        }
        self.jobs.release_at[slot as usize] =
            Some(self.input.now_s.saturating_add(job.time_limit_s));
        self.epoch += 1;
        self.plan.pending_reasons.remove(&job.id);
        self.plan.placements.push(placement);
        true
    }
}

#[cfg(test)]
thread_local! {
    /// Tests switch the skip off to prove it changes no decision.
    pub(crate) static ALWAYS_SUM_HOLDINGS: std::cell::Cell<bool> =
        const { std::cell::Cell::new(false) };
}

#[cfg(test)]
fn always_sum_holdings() -> bool {
    ALWAYS_SUM_HOLDINGS.with(std::cell::Cell::get)
}

#[cfg(not(test))]
fn always_sum_holdings() -> bool {
    false
}

/// A resource vector from GPU counts per model id, one map update per model
/// rather than per GPU.
fn resources_of(
    cluster: &ClusterIndex<'_>,
    counts: impl Iterator<Item = (usize, u64)>,
) -> ResourceVector {
    let mut resources = ResourceVector::default();
    for (model, count) in counts {
        if count == 0 {
            continue;
        }
        let name = u32::try_from(model).map_or("", |id| cluster.model_name(id));
        resources.add_gpu_count(Some(name), count);
    }
    resources
}
