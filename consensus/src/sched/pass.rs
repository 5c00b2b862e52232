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

    fn run_fifo(&mut self, mut queue: Vec<&'a PendingEntry>) {
        queue.sort_by_key(|(job, _)| (job.submitted_seq, job.id));
        // Built once: everything behind the blocker gets the same words.
        let mut waiting_behind: Option<String> = None;
        for (job, request) in queue {
            if let Some(reason) = &waiting_behind {
                // Nothing behind a blocked job starts; only its reason is left.
                if !self.waiting_reasons {
                    break;
                }
                let reason = reason.clone();
                self.note(job.id, reason);
                continue;
            }
            if let Err(reason) = self.admit(job) {
                self.note(job.id, reason);
                waiting_behind = Some(format!("fifo: waiting behind job {}", job.id));
                continue;
            }
            match self.place_in(Area::Free, request, None) {
                Ok(placement) => {
                    if !self.commit(job, placement, request.choice.exclusive) {
                        waiting_behind = Some(format!("fifo: waiting behind job {}", job.id));
                    }
                }
                Err(unplaceable) => {
                    self.note(job.id, unplaceable.reason);
                    waiting_behind = Some(format!("fifo: waiting behind job {}", job.id));
                }
            }
        }
    }

    /// `run` over the index instead of `validate_pending`, without waiting
    /// reasons: the same invalid reasons, the same plan, and only the part
    /// of the queue visited that can still change it.
    fn run_indexed(&mut self, index: &'a PendingIndex) {
        let input = self.input;
        // A pending job that is also running is invalid, and that reason
        // comes before any other (as in `validate_pending`).
        let mut running_too: Vec<JobId> = input
            .running
            .iter()
            .map(|job| job.id)
            .filter(|&id| index.contains(id))
            .collect();
        running_too.sort_unstable();
        running_too.dedup();
        for position in index.invalid_positions() {
            let Some((job, request)) = input.pending.get(position) else {
                continue;
            };
            if running_too.binary_search(&job.id).is_ok() {
                continue;
            }
            let tree = &self.tree;
            if let Some(problem) =
                static_problem(job, request, |name| tree.index_of(name).is_some())
            {
                self.plan
                    .pending_reasons
                    .insert(job.id, format!("{INVALID_PREFIX} {problem}"));
            }
        }
        for &id in &running_too {
            self.plan
                .pending_reasons
                .insert(id, format!("{INVALID_PREFIX} job {id} is already running"));
        }
        // Valid entries the running list makes invalid, by position.
        let mut excluded: Vec<usize> = running_too
            .iter()
            .filter_map(|&id| index.position_of(id))
            .filter(|&position| index.is_valid(position))
            .collect();
        excluded.sort_unstable();

        match input.policy {
            Policy::Fifo => self.run_fifo_indexed(index, &excluded),
            Policy::Hdrf | Policy::HdrfPreempt => {
                let mut excluded_per_tenant: BTreeMap<&str, usize> = BTreeMap::new();
                for &position in &excluded {
                    if let Some((job, _)) = input.pending.get(position) {
                        *excluded_per_tenant.entry(job.tenant.as_str()).or_default() += 1;
                    }
                }
                let waiting_in = |name: &str| {
                    index
                        .tenant_len(name)
                        .saturating_sub(excluded_per_tenant.get(name).copied().unwrap_or(0))
                };
                for tenant in 0..self.tree.len() {
                    let waiting = waiting_in(self.tree.name(tenant)) > 0;
                    if let Some(flag) = self.tenants_waiting.get_mut(tenant) {
                        *flag = waiting;
                    }
                }
                let valid = index.valid_len().saturating_sub(excluded.len());
                let held_by_tenant = if valid > 1 || always_sum_holdings() {
                    self.tenant_holdings()
                } else {
                    Vec::new()
                };
                let allocations = self.allocations(&held_by_tenant);
                let capacity = resources_of(
                    &self.cluster,
                    self.capacity_by_model.iter().copied().enumerate(),
                );
                let excluded = &excluded;
                let space = ResourceSpace::new(&capacity);
                let projecting = &space;
                // One demand per (model, size), shared: building one per
                // job taken from the order showed up in profiles.
                let demands: RefCell<SharedDemands<'_>> = RefCell::default();
                let demands = &demands;
                let order = FairOrder::new(&input.tenants, space.clone(), &allocations, |name| {
                    let items = index
                        .tenant_queue(name)
                        .filter(move |position| excluded.binary_search(position).is_err())
                        .filter_map(move |position| {
                            let (job, request) = input.pending.get(position)?;
                            let key = (request.gpu_model.as_deref(), job.gpus);
                            let mut demands = demands.borrow_mut();
                            let demand = match demands.iter().find(|(known, _)| *known == key) {
                                Some((_, demand)) => Rc::clone(demand),
                                None => {
                                    let demand: Projected = Rc::from(
                                        projecting.project(&ResourceVector::gpus(key.0, key.1)),
                                    );
                                    demands.push((key, Rc::clone(&demand)));
                                    demand
                                }
                            };
                            Some((demand, position))
                        });
                    (waiting_in(name), Box::new(items))
                });
                let entries = order.filter_map(|(tenant, position)| {
                    input
                        .pending
                        .get(position)
                        .map(|entry| (Some(tenant), entry))
                });
                let allow_preemption = input.policy == Policy::HdrfPreempt;
                self.walk_fair_order(entries, allow_preemption, Some(index));
            }
        }
    }

    /// `run_fifo` without waiting reasons, reading the index's order.
    fn run_fifo_indexed(&mut self, index: &'a PendingIndex, excluded: &[usize]) {
        let input = self.input;
        for position in index.fifo_order() {
            if excluded.binary_search(&position).is_ok() {
                continue;
            }
            let Some((job, request)) = input.pending.get(position) else {
                continue;
            };
            // Nothing behind a blocked job starts.
            if self.admit(job).is_err() {
                break;
            }
            let Ok(placement) = self.place_in(Area::Free, request, None) else {
                break;
            };
            if !self.commit(job, placement, request.choice.exclusive) {
                break;
            }
        }
    }

    /// Tenants' holdings as `order_pending` takes them.
    fn allocations(&self, held_by_tenant: &[ResourceVector]) -> Vec<TenantAllocation> {
        held_by_tenant
            .iter()
            .enumerate()
            .filter(|(_, resources)| !resources.0.is_empty())
            .map(|(tenant, resources)| TenantAllocation {
                tenant: self.tree.name(tenant).to_string(),
                resources: resources.clone(),
            })
            .collect()
    }

    /// Once a reservation holds, no job is preempted for and GPUs only get
    /// scarcer, so a job can still start only if some node set has room
    /// for its shape outside the reservation, or on free GPUs if it ends
    /// before the reservation's start. True when no job in the index
    /// (less those this pass placed, `placed`) passes that necessary test:
    /// the rest of the walk could not change the plan.
    fn nothing_more_can_start(
        &self,
        index: &PendingIndex,
        reservation: &Reservation,
        placed: &[(ShapeClass, u64)],
    ) -> bool {
        // Per node: usable free GPUs, and those of them outside the
        // reservation; as "nodes with at least g" counts.
        let mut free_at_least: Vec<usize> = Vec::new();
        let mut outside_at_least: Vec<usize> = Vec::new();
        for position in 0..self.input.nodes.len() {
            let free = self.free_usable.get(position).copied().unwrap_or(0) as usize;
            let outside = self
                .cluster
                .gpu_range(position)
                .filter(|&gpu| {
                    self.holder[gpu] == FREE
                        && !reservation.reserved.get(gpu).copied().unwrap_or(false)
                        && self.counts_as_usable(position, gpu)
                })
                .count();
            for (counts, value) in [(&mut free_at_least, free), (&mut outside_at_least, outside)] {
                if counts.len() <= value {
                    counts.resize(value + 1, 0);
                }
                counts[value] += 1;
            }
        }
        for counts in [&mut free_at_least, &mut outside_at_least] {
            for value in (1..counts.len()).rev() {
                counts[value - 1] += counts[value];
            }
        }
        let nodes_with = |counts: &[usize], gpus: u32| -> usize {
            usize::try_from(gpus)
                .ok()
                .and_then(|g| counts.get(g))
                .copied()
                .unwrap_or(0)
        };
        let now = self.input.now_s;
        for (shape, limits) in index.shapes() {
            let (gpus_per_node, nodes) = shape;
            let nodes = usize::try_from(nodes).unwrap_or(usize::MAX);
            if nodes_with(&free_at_least, gpus_per_node) < nodes {
                continue;
            }
            // The shortest time limit of this shape not placed already.
            let shortest = limits.iter().find_map(|(&limit, &count)| {
                let taken = placed
                    .iter()
                    .filter(|&&(s, l)| s == shape && l == limit)
                    .count();
                (count as usize > taken).then_some(limit)
            });
            let Some(shortest) = shortest else {
                continue;
            };
            if nodes_with(&outside_at_least, gpus_per_node) >= nodes
                || now.saturating_add(shortest) <= reservation.shadow_s
            {
                return false;
            }
        }
        true
    }

    fn run_hdrf(
        &mut self,
        valid: Vec<&'a PendingEntry>,
        held_by_tenant: &[ResourceVector],
        allow_preemption: bool,
    ) {
        let by_id: BTreeMap<JobId, &'a PendingEntry> =
            valid.iter().map(|entry| (entry.0.id, *entry)).collect();
        let order = {
            let allocations = self.allocations(held_by_tenant);
            // One demand vector per (model, size), cloned: formatting the
            // model key per pending job showed up in profiles.
            let mut demand_of: BTreeMap<(Option<&str>, u32), ResourceVector> = BTreeMap::new();
            let demands: Vec<PendingDemand<'_>> = valid
                .iter()
                .map(|(job, request)| {
                    let model = request.gpu_model.as_deref();
                    PendingDemand {
                        job,
                        resources: demand_of
                            .entry((model, job.gpus))
                            .or_insert_with(|| ResourceVector::gpus(model, job.gpus))
                            .clone(),
                    }
                })
                .collect();
            let capacity = resources_of(
                &self.cluster,
                self.capacity_by_model.iter().copied().enumerate(),
            );
            order_pending(&self.input.tenants, &capacity, &allocations, &demands)
        };
        let entries = order
            .into_iter()
            .filter_map(|id| by_id.get(&id).map(|&entry| (None, entry)));
        self.walk_fair_order(entries, allow_preemption, None);
    }

    /// HDRF's walk over the queue in fair order, with EASY backfill behind
    /// the first job that cannot start. With `index`, the walk stops as
    /// soon as `nothing_more_can_start` proves the rest would change
    /// nothing (only when waiting reasons are left out).
    fn walk_fair_order(
        &mut self,
        order: impl Iterator<Item = (Option<usize>, &'a PendingEntry)>,
        allow_preemption: bool,
        index: Option<&'a PendingIndex>,
    ) {
        let now = self.input.now_s;
        let mut reservation: Option<Reservation> = None;
        // Shapes and time limits placed so far, for the stop test.
        let mut placed: Vec<(ShapeClass, u64)> = Vec::new();
        for (tenant, (job, request)) in order {
            // The fair order knows the tenant; looking its name up again
            // was the largest cost of a long walk.
            let admitted = match tenant {
                Some(tenant) => self
                    .tree
                    .check_quota(tenant, job)
                    .map_err(|denied| denied.reason),
                None => self.admit(job),
            };
            if let Err(reason) = admitted {
                self.note(job.id, reason);
                continue;
            }
            let epoch = self.epoch;
            let Some(held_for_head) = &reservation else {
                match self.place_in(Area::Free, request, None) {
                    Ok(placement) => {
                        // Refused only past its quota, as `admit` refuses.
                        self.commit(job, placement, request.choice.exclusive);
                    }
                    Err(unplaceable) => {
                        if allow_preemption && self.try_preempt(job, request) {
                            if index.is_some() {
                                placed.push((
                                    (request.gpus_per_node, request.nodes),
                                    job.time_limit_s,
                                ));
                            }
                            continue;
                        }
                        reservation = self.reserve(request);
                        let reason = match &reservation {
                            Some(r) => format!(
                                "{}; reserved to start by t={}s",
                                unplaceable.reason, r.shadow_s
                            ),
                            None => format!(
                                "{}; does not fit even after every running job ends",
                                unplaceable.reason
                            ),
                        };
                        self.note(job.id, reason);
                        if let (Some(index), Some(held)) = (index, &reservation) {
                            if self.nothing_more_can_start(index, held, &placed) {
                                break;
                            }
                        }
                        continue;
                    }
                }
                if index.is_some() && self.epoch != epoch {
                    placed.push(((request.gpus_per_node, request.nodes), job.time_limit_s));
                }
                continue;
            };

            // Backfill: stay off the reserved GPUs, or be gone before the
            // head job needs them.
            let outside_reservation = self.place_in(
                Area::OutsideReservation,
                request,
                Some(&held_for_head.reserved),
            );
            let ends_in_time = now.saturating_add(job.time_limit_s) <= held_for_head.shadow_s;
            let decision = match outside_reservation {
                Ok(placement) => Ok(placement),
                // A job that would outlast the reservation waits whether or
                // not it fits on free GPUs; only the words depend on that,
                // so without waiting reasons the search (a full placement
                // when it fits) is skipped. What the memo would have learnt
                // from it, a later search finds again.
                Err(_) if !ends_in_time && !self.waiting_reasons => Err(String::new()),
                Err(_) => match self.place_in(Area::Free, request, None) {
                    Ok(placement) if ends_in_time => Ok(placement),
                    Ok(_) => Err(format!(
                        "backfill: would delay job {} reserved to start by t={}s",
                        held_for_head.job, held_for_head.shadow_s
                    )),
                    Err(unplaceable) => Err(unplaceable.reason),
                },
            };
            match decision {
                Ok(placement) => {
                    if !self.commit(job, placement, request.choice.exclusive) {
                        continue;
                    }
                    if let (Some(index), Some(held)) = (index, &reservation) {
                        placed.push(((request.gpus_per_node, request.nodes), job.time_limit_s));
                        if self.nothing_more_can_start(index, held, &placed) {
                            break;
                        }
                    }
                }
                Err(reason) => self.note(job.id, reason),
            }
        }
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

    /// Earliest time the gang fits if every job runs to its time limit, and
    /// the GPUs it would use then. Binary search over release times: freeing
    /// GPUs only ever helps, so placeability is (near enough) monotone.
    fn reserve(&self, request: &GangRequest) -> Option<Reservation> {
        let mut times: Vec<u64> = self.jobs.release_at.iter().flatten().copied().collect();
        times.sort_unstable();
        times.dedup();
        // Per flat GPU: when it is free at the latest (`None`: never).
        let free_from: Vec<Option<u64>> = self
            .holder
            .iter()
            .map(|&slot| match slot {
                FREE => Some(0),
                slot => self.jobs.release_at.get(slot as usize).copied().flatten(),
            })
            .collect();
        // Per node: when it first has `gpus_per_node` usable GPUs, so each
        // probe skips nodes that cannot help without looking at their GPUs.
        let need = usize::try_from(request.gpus_per_node).unwrap_or(usize::MAX);
        let mut release_times: Vec<u64> = Vec::new();
        let node_ready_at: Vec<Option<u64>> = (0..self.input.nodes.len())
            .map(|position| {
                if !self.cluster.hostable[position] || need == 0 {
                    return None;
                }
                release_times.clear();
                release_times.extend(
                    self.cluster
                        .gpu_range(position)
                        .filter(|&gpu| self.cluster.shape.gpu_unique[gpu])
                        .filter_map(|gpu| free_from[gpu]),
                );
                if release_times.len() < need {
                    return None;
                }
                release_times.select_nth_unstable(need - 1);
                Some(release_times[need - 1])
            })
            .collect();
        // A gang fits at no time before `nodes` nodes are ready: those
        // probes of the search below are answered without a placement.
        // The search itself, and so its answer, stays as it is.
        let mut ready_times: Vec<u64> = node_ready_at.iter().flatten().copied().collect();
        ready_times.sort_unstable();
        let first_possible = usize::try_from(request.nodes)
            .ok()
            .and_then(|nodes| nodes.checked_sub(1))
            .and_then(|last| ready_times.get(last))
            .copied();
        let fits_at = |time: u64| {
            if first_possible.is_none_or(|first| time < first) {
                return None;
            }
            let bound: Vec<u32> = node_ready_at
                .iter()
                .map(|ready| match ready {
                    Some(at) if *at <= time => u32::MAX,
                    _ => 0,
                })
                .collect();
            place_indexed(
                &self.cluster,
                self.prox,
                request,
                &|gpu| free_from[gpu].is_some_and(|end| end <= time),
                Some(&bound),
            )
            .ok()
        };
        let last = *times.last()?;
        let mut found = fits_at(last).map(|placement| (last, placement))?;
        let (mut low, mut high) = (0usize, times.len() - 1);
        while low < high {
            let middle = low + (high - low) / 2;
            match fits_at(times[middle]) {
                Some(placement) => {
                    found = (times[middle], placement);
                    high = middle;
                }
                None => low = middle + 1,
            }
        }
        let (shadow_s, placement) = found;
        let mut reserved = vec![false; self.holder.len()];
        for (node_id, indices) in &placement.nodes {
            let Some(position) = self.position_of(*node_id) else {
                continue;
            };
            for gpu in self.cluster.gpu_range(position) {
                if request.choice.exclusive || indices.contains(&self.cluster.gpu(gpu).index) {
                    reserved[gpu] = true;
                }
            }
        }
        Some(Reservation {
            job: request.job,
            shadow_s,
            reserved,
        })
    }

    /// Tries to make room for `job` by preempting; commits and returns true
    /// on success, changes nothing otherwise.
    ///
    /// Priority here is the base `priority` on both sides: `boost` only
    /// orders a tenant's own queue. Comparing `priority + boost` with a
    /// running job's priority let every requeued victim (boost 1) out-rank
    /// every running job of priority 0, so each preemption caused the next.
    fn try_preempt(&mut self, job: &PendingJob, request: &GangRequest) -> bool {
        let Some(preemptor_tenant) = self.tree.index_of(&job.tenant) else {
            return false;
        };
        // Deferred by `run` until a preemption is tried.
        self.tenant_holdings();
        let now = self.input.now_s;
        let own_active: Vec<bool> = (0..self.tree.len())
            .map(|t| {
                self.usage.own_share(t) > 0.0
                    || self.tenants_waiting.get(t).copied().unwrap_or(false)
            })
            .collect();
        let fair = self.tree.fair_fractions(&own_active);
        let below_fair_share =
            self.usage.own_share(preemptor_tenant) + SHARE_EPSILON < fair[preemptor_tenant];

        // Per tenant, once: a victim's tenant is judged by index, so the
        // walk over the running jobs below looks no name up and computes
        // no share (both showed up in profiles of long replays).
        let above_fair_share: Vec<bool> = (0..self.tree.len())
            .map(|t| self.usage.own_share(t) > fair[t] + SHARE_EPSILON)
            .collect();
        let running_tenants = &self.running_tenants;
        let mut candidates: Vec<&'a RunningJob> = self
            .input
            .running
            .iter()
            .zip(&self.running_slots)
            .zip(running_tenants.iter().chain(std::iter::repeat(&None)))
            .filter(|((victim, _), _)| victim.preemptible && now < victim.deadline_s())
            .filter(|((_, &slot), _)| !self.jobs.preempted[slot])
            .filter(|((victim, _), &victim_tenant)| {
                // Priority ranks a tenant's own jobs only: across tenants,
                // fair share alone decides, or one tenant's --priority
                // would preempt everyone.
                (below_fair_share && victim_tenant.is_some_and(|t| above_fair_share[t]))
                    || (victim_tenant == Some(preemptor_tenant) && job.priority > victim.priority)
            })
            .map(|((victim, _), _)| victim)
            .collect();
        // Who holds what on the nodes the gang could use takes a walk over
        // their GPUs: only worth it when someone may be preempted at all,
        // which on a cluster where every tenant is within its share is
        // nobody.
        if candidates.is_empty() {
            return false;
        }
        let holdings = self.gpus_held_on_useful_nodes(request);
        candidates.retain(|victim| holdings.contains_key(&victim.id));
        candidates.sort_by_key(|victim| {
            (
                victim.gpus,
                Reverse(victim.last_checkpoint_s.unwrap_or(victim.started_s)),
                victim.id,
            )
        });
        // Dedup in case the caller listed a running job twice.
        candidates.dedup_by_key(|victim| victim.id);

        // Cheap necessary condition before each full placement attempt:
        // enough nodes with enough usable GPUs once the victims are gone.
        let need = request.gpus_per_node;
        let mut usable_per_node: BTreeMap<usize, u32> = self.free_gpus_on_useful_nodes(request);
        let wanted_nodes = usize::try_from(request.nodes).unwrap_or(usize::MAX);
        let mut nodes_enough = usable_per_node.values().filter(|&&c| c >= need).count();

        let mut chosen: Vec<&'a RunningJob> = Vec::new();
        let mut fits = false;
        for victim in candidates {
            chosen.push(victim);
            for &(position, count) in holdings.get(&victim.id).map_or(&[][..], Vec::as_slice) {
                let entry = usable_per_node.entry(position).or_default();
                let before = *entry;
                *entry = entry.saturating_add(count);
                if before < need && *entry >= need {
                    nodes_enough += 1;
                }
            }
            if nodes_enough >= wanted_nodes && self.place_without(request, &chosen).is_ok() {
                fits = true;
                break;
            }
        }
        if !fits {
            return false;
        }
        // Greedy by size can overshoot; drop victims the gang can do without,
        // largest first.
        for position in (0..chosen.len()).rev() {
            let mut fewer = chosen.clone();
            fewer.remove(position);
            if self.place_without(request, &fewer).is_ok() {
                chosen = fewer;
            }
        }
        let Ok(placement) = self.place_without(request, &chosen) else {
            return false;
        };
        // An exclusive gang is charged its nodes whole: no one is evicted
        // for a gang its tenant's quota then refuses.
        if request.choice.exclusive && !self.whole_nodes_within_quota(job, &placement) {
            return false;
        }
        for victim in chosen {
            self.evict(victim, job.id);
        }
        self.commit(job, placement, request.choice.exclusive)
    }

    /// Whether `job`'s tenant may hold every GPU of `placement`'s nodes.
    fn whole_nodes_within_quota(&self, job: &PendingJob, placement: &Placement) -> bool {
        let whole: u32 = placement
            .nodes
            .iter()
            .filter_map(|(node_id, _)| self.position_of(*node_id))
            .map(|position| self.cluster.gpu_range(position).count() as u32)
            .sum();
        if whole <= job.gpus {
            return true;
        }
        let whole = PendingJob {
            gpus: whole,
            ..job.clone()
        };
        self.tree
            .index_of(&job.tenant)
            .is_none_or(|tenant| self.tree.check_quota(tenant, &whole).is_ok())
    }

    /// Places the gang as if `victims` had already been stopped.
    fn place_without(
        &self,
        request: &GangRequest,
        victims: &[&RunningJob],
    ) -> Result<Placement, Unplaceable> {
        let mut is_victim = vec![false; self.jobs.ids.len()];
        for victim in victims {
            if let Some(slot) = self.jobs.get(victim.id) {
                is_victim[slot] = true;
            }
        }
        let holder = &self.holder;
        place_indexed(
            &self.cluster,
            self.prox,
            request,
            &|gpu| {
                let slot = holder[gpu];
                slot == FREE || is_victim.get(slot as usize).copied().unwrap_or(false)
            },
            None,
        )
    }

    /// Nodes that could host a member of this gang at all (healthy, labelled,
    /// first view of their id), regardless of what is busy, each with its
    /// flat GPUs of the wanted model.
    fn useful_nodes(&self, request: &GangRequest) -> Vec<(usize, Vec<usize>)> {
        // A model the cluster lacks matches no GPU.
        let wanted: Option<Vec<u32>> = request
            .gpu_model
            .as_deref()
            .map(|model| self.cluster.model_ids(model));
        self.input
            .nodes
            .iter()
            .enumerate()
            .filter(|&(position, node)| {
                node.healthy
                    && self.position_of(node.id) == Some(position)
                    && request.choice.allows(node.id)
                    && request
                        .required_labels
                        .iter()
                        .all(|(key, value)| node.labels.get(key) == Some(value))
            })
            .map(|(position, _)| {
                let gpus = self
                    .cluster
                    .gpu_range(position)
                    .filter(|&gpu| match &wanted {
                        None => true,
                        Some(models) => models.contains(&self.cluster.shape.gpu_model[gpu]),
                    })
                    .collect();
                (position, gpus)
            })
            .collect()
    }

    /// Per running job: (useful node position, GPUs it holds there).
    fn gpus_held_on_useful_nodes(
        &self,
        request: &GangRequest,
    ) -> BTreeMap<JobId, Vec<(usize, u32)>> {
        let mut held: Vec<(JobId, usize)> = Vec::new();
        for (position, gpus) in self.useful_nodes(request) {
            for gpu in gpus {
                if let Some(job) = self.jobs.id(self.holder[gpu]) {
                    held.push((job, position));
                }
            }
        }
        held.sort_unstable();
        let mut holdings: BTreeMap<JobId, Vec<(usize, u32)>> = BTreeMap::new();
        for (job, position) in held {
            let per_node = holdings.entry(job).or_default();
            match per_node.last_mut() {
                Some((last, count)) if *last == position => *count += 1,
                _ => per_node.push((position, 1)),
            }
        }
        holdings
    }

    fn free_gpus_on_useful_nodes(&self, request: &GangRequest) -> BTreeMap<usize, u32> {
        self.useful_nodes(request)
            .into_iter()
            .map(|(position, gpus)| {
                let count = gpus.iter().filter(|&&gpu| self.holder[gpu] == FREE).count();
                (position, u32::try_from(count).unwrap_or(u32::MAX))
            })
            .collect()
    }

    /// Frees a victim's GPUs in the overlay and records compensation.
    fn evict(&mut self, victim: &RunningJob, for_job: JobId) {
        let mut freed = Held::default();
        if let Some(slot) = self.jobs.get(victim.id) {
            let slot = slot as u32;
            for (position, node) in self.input.nodes.iter().enumerate() {
                for gpu in self.cluster.gpu_range(position) {
                    if self.holder[gpu] != slot {
                        continue;
                    }
                    self.holder[gpu] = FREE;
                    let model = self.cluster.shape.gpu_model[gpu];
                    if node.healthy {
                        freed.add(model, 1);
                    }
                    if self.counts_as_usable(position, gpu) {
                        self.free_usable[position] += 1;
                        if let Some(free) = self.free_by_model.get_mut(model as usize) {
                            *free += 1;
                        }
                    }
                }
            }
            self.jobs.release_at[slot as usize] = None;
            self.jobs.preempted[slot as usize] = true;
        }
        let resources = resources_of(&self.cluster, freed.iter().map(|(m, c)| (m as usize, c)));
        if let Some(tenant) = self.tree.index_of(&victim.tenant) {
            self.tree.release_gpus(tenant, victim.gpus);
            self.usage.release(tenant, &resources);
        }
        // Freed GPUs may make earlier failures placeable.
        self.memo.clear();
        self.epoch += 1;
        let lost_since = victim.last_checkpoint_s.unwrap_or(victim.started_s);
        let lost_s = self.input.now_s.saturating_sub(lost_since);
        self.plan.preemptions.push(Preemption {
            victim: victim.id,
            for_job,
            refund_gpu_s: f64::from(victim.gpus) * lost_s as f64,
        });
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
