//! The machinery behind [`super::schedule`]: a working copy of the cluster,
//! quota and fairness bookkeeping, EASY reservations and victim selection.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};

use super::fairshare::{
    order_pending, unknown_tenant, HdrfUsage, PendingDemand, PendingJob, ResourceVector,
    TenantAllocation, TenantTree,
};
use super::model::{GangRequest, GpuView, JobId, NodeId, NodeView, Placement};
use super::placement::{place_gang_where, Unplaceable};
use super::proximity::Proximity;
use super::{Policy, Preemption, RunningJob, SchedInput, SchedPlan};

/// Shares closer than this are equal; keeps float noise from flip-flopping
/// preemption decisions.
const SHARE_EPSILON: f64 = 1e-9;

type PendingEntry = (PendingJob, GangRequest);

/// The head job's claim on the future under EASY backfill.
struct Reservation {
    job: JobId,
    /// Earliest time the head job fits, assuming jobs run to their limits.
    shadow_s: u64,
    /// The GPUs the head job would take then; backfill must avoid them
    /// unless it ends before `shadow_s`.
    gpus: BTreeSet<(NodeId, u32)>,
}

pub(crate) struct Pass<'a> {
    input: &'a SchedInput,
    prox: &'a dyn Proximity,
    /// Working copy: placements are written here as they are decided.
    nodes: Vec<NodeView>,
    /// First view of each node id; later duplicates are never placed on.
    node_position: BTreeMap<NodeId, usize>,
    tree: TenantTree,
    usage: HdrfUsage,
    /// When each GPU-holding job is expected to let go, by its time limit.
    release_at: BTreeMap<JobId, u64>,
    preempted: BTreeSet<JobId>,
    /// Tenants with valid pending jobs, for "who is active" in fair shares.
    tenants_waiting: BTreeSet<usize>,
    plan: SchedPlan,
}

impl<'a> Pass<'a> {
    pub fn new(input: &'a SchedInput, prox: &'a dyn Proximity) -> Self {
        let nodes = input.nodes.clone();
        let mut node_position = BTreeMap::new();
        for (position, node) in nodes.iter().enumerate() {
            node_position.entry(node.id).or_insert(position);
        }
        let tree = TenantTree::new(&input.tenants);
        let usage = HdrfUsage::new(&tree, cluster_capacity(&nodes));
        let release_at = input
            .running
            .iter()
            .map(|job| (job.id, job.deadline_s().max(input.now_s)))
            .collect();
        Pass {
            input,
            prox,
            nodes,
            node_position,
            tree,
            usage,
            release_at,
            preempted: BTreeSet::new(),
            tenants_waiting: BTreeSet::new(),
            plan: SchedPlan::default(),
        }
    }

    pub fn run(mut self) -> SchedPlan {
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

        let held = self.resources_held();
        for job in &self.input.running {
            if let (Some(tenant), Some(resources)) =
                (self.tree.index_of(&job.tenant), held.get(&job.id))
            {
                self.usage.charge(tenant, resources);
            }
        }

        let valid = self.validate_pending();
        for (job, _) in &valid {
            if let Some(tenant) = self.tree.index_of(&job.tenant) {
                self.tenants_waiting.insert(tenant);
            }
        }
        match self.input.policy {
            Policy::Fifo => self.run_fifo(valid),
            Policy::Hdrf => self.run_hdrf(valid, &held, false),
            Policy::HdrfPreempt => self.run_hdrf(valid, &held, true),
        }

        let placed: BTreeSet<JobId> = self.plan.placements.iter().map(|p| p.job).collect();
        for (job, _) in &self.input.pending {
            if !placed.contains(&job.id) {
                let reason = self.plan.pending_reasons.entry(job.id).or_default();
                if reason.is_empty() {
                    *reason = "not considered in this pass".to_string();
                }
            }
        }
        self.plan
    }

    /// Resources each job holds according to the node views.
    fn resources_held(&self) -> BTreeMap<JobId, ResourceVector> {
        let mut held: BTreeMap<JobId, ResourceVector> = BTreeMap::new();
        for node in self.nodes.iter().filter(|n| n.healthy) {
            for gpu in &node.gpus {
                if let Some(job) = gpu.allocated_to {
                    held.entry(job).or_default().add_gpus(Some(&gpu.model), 1);
                }
            }
        }
        held
    }

    /// Splits off requests that can never run; they get an `invalid:` reason
    /// and are never allowed to block a queue.
    fn validate_pending(&mut self) -> Vec<&'a PendingEntry> {
        let input = self.input;
        let running: BTreeSet<JobId> = input.running.iter().map(|job| job.id).collect();
        let mut seen: BTreeSet<JobId> = BTreeSet::new();
        let mut valid = Vec::with_capacity(input.pending.len());
        for entry in &input.pending {
            let (job, request) = entry;
            let problem = if !seen.insert(job.id) {
                Some(format!("duplicate job id {}", job.id))
            } else if running.contains(&job.id) {
                Some(format!("job {} is already running", job.id))
            } else if request.job != job.id {
                Some(format!(
                    "gang request is for job {}, not {}",
                    request.job, job.id
                ))
            } else if request.tenant != job.tenant {
                Some(format!(
                    "gang request is for tenant {}, job belongs to {}",
                    request.tenant, job.tenant
                ))
            } else if request.nodes == 0 || request.gpus_per_node == 0 {
                Some("a gang needs at least one node and one GPU per node".to_string())
            } else if u64::from(job.gpus)
                != u64::from(request.nodes) * u64::from(request.gpus_per_node)
            {
                Some(format!(
                    "job asks for {} GPUs but its gang is {} nodes x {} GPUs",
                    job.gpus, request.nodes, request.gpus_per_node
                ))
            } else if request
                .max_rtt_ms
                .is_some_and(|limit| limit.is_nan() || limit < 0.0)
            {
                Some("max_rtt_ms must be a non-negative number".to_string())
            } else if self.tree.index_of(&job.tenant).is_none() {
                Some(format!("unknown tenant {}", job.tenant))
            } else {
                None
            };
            match problem {
                Some(problem) => {
                    // A duplicate must not overwrite the reason of the original.
                    self.plan
                        .pending_reasons
                        .entry(job.id)
                        .or_insert_with(|| format!("invalid: {problem}"));
                }
                None => valid.push(entry),
            }
        }
        valid
    }

    fn run_fifo(&mut self, mut queue: Vec<&'a PendingEntry>) {
        queue.sort_by_key(|(job, _)| (job.submitted_seq, job.id));
        let mut blocker: Option<JobId> = None;
        for (job, request) in queue {
            if let Some(head) = blocker {
                self.note(job.id, format!("fifo: waiting behind job {head}"));
                continue;
            }
            if let Err(reason) = self.admit(job) {
                self.note(job.id, reason);
                blocker = Some(job.id);
                continue;
            }
            match self.place(request, &|_, gpu| gpu.allocated_to.is_none()) {
                Ok(placement) => self.commit(job, placement),
                Err(unplaceable) => {
                    self.note(job.id, unplaceable.reason);
                    blocker = Some(job.id);
                }
            }
        }
    }

    fn run_hdrf(
        &mut self,
        valid: Vec<&'a PendingEntry>,
        held: &BTreeMap<JobId, ResourceVector>,
        allow_preemption: bool,
    ) {
        let by_id: BTreeMap<JobId, &'a PendingEntry> =
            valid.iter().map(|entry| (entry.0.id, *entry)).collect();
        let order = {
            let allocations: Vec<TenantAllocation> = self
                .input
                .running
                .iter()
                .filter_map(|job| {
                    Some(TenantAllocation {
                        tenant: job.tenant.clone(),
                        resources: held.get(&job.id)?.clone(),
                    })
                })
                .collect();
            let demands: Vec<PendingDemand<'_>> = valid
                .iter()
                .map(|(job, request)| PendingDemand {
                    job,
                    resources: ResourceVector::gpus(request.gpu_model.as_deref(), job.gpus),
                })
                .collect();
            let capacity = cluster_capacity(&self.nodes);
            order_pending(&self.input.tenants, &capacity, &allocations, &demands)
        };

        let now = self.input.now_s;
        let mut reservation: Option<Reservation> = None;
        for id in order {
            let Some((job, request)) = by_id.get(&id).copied() else {
                continue;
            };
            if let Err(reason) = self.admit(job) {
                self.note(job.id, reason);
                continue;
            }
            let Some(held_for_head) = &reservation else {
                match self.place(request, &|_, gpu| gpu.allocated_to.is_none()) {
                    Ok(placement) => self.commit(job, placement),
                    Err(unplaceable) => {
                        if allow_preemption && self.try_preempt(job, request) {
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
                    }
                }
                continue;
            };

            // Backfill: stay off the reserved GPUs, or be gone before the
            // head job needs them.
            let reserved = &held_for_head.gpus;
            let outside_reservation = self.place(request, &|node, gpu| {
                gpu.allocated_to.is_none() && !reserved.contains(&(node.id, gpu.index))
            });
            let decision = match outside_reservation {
                Ok(placement) => Ok(placement),
                Err(_) => {
                    let anywhere = self.place(request, &|_, gpu| gpu.allocated_to.is_none());
                    let ends_in_time =
                        now.saturating_add(job.time_limit_s) <= held_for_head.shadow_s;
                    match anywhere {
                        Ok(placement) if ends_in_time => Ok(placement),
                        Ok(_) => Err(format!(
                            "backfill: would delay job {} reserved to start by t={}s",
                            held_for_head.job, held_for_head.shadow_s
                        )),
                        Err(unplaceable) => Err(unplaceable.reason),
                    }
                }
            };
            match decision {
                Ok(placement) => self.commit(job, placement),
                Err(reason) => self.note(job.id, reason),
            }
        }
    }

    fn note(&mut self, job: JobId, reason: String) {
        self.plan.pending_reasons.insert(job, reason);
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

    fn place(
        &self,
        request: &GangRequest,
        is_free: &dyn Fn(&NodeView, &GpuView) -> bool,
    ) -> Result<Placement, Unplaceable> {
        place_gang_where(&self.nodes, self.prox, request, is_free)
    }

    /// Writes a placement into the working copy and charges its tenant.
    fn commit(&mut self, job: &PendingJob, placement: Placement) {
        let mut resources = ResourceVector::default();
        for (node_id, indices) in &placement.nodes {
            let Some(&position) = self.node_position.get(node_id) else {
                continue;
            };
            for gpu in &mut self.nodes[position].gpus {
                if indices.contains(&gpu.index) && gpu.allocated_to.is_none() {
                    gpu.allocated_to = Some(job.id);
                    resources.add_gpus(Some(&gpu.model), 1);
                }
            }
        }
        if let Some(tenant) = self.tree.index_of(&job.tenant) {
            self.tree.charge(tenant, job.gpus, job.gpu_hours_needed());
            self.usage.charge(tenant, &resources);
        }
        self.release_at
            .insert(job.id, self.input.now_s.saturating_add(job.time_limit_s));
        self.plan.pending_reasons.remove(&job.id);
        self.plan.placements.push(placement);
    }

    /// Earliest time the gang fits if every job runs to its time limit, and
    /// the GPUs it would use then. Binary search over release times: freeing
    /// GPUs only ever helps, so placeability is (near enough) monotone.
    fn reserve(&self, request: &GangRequest) -> Option<Reservation> {
        let mut times: Vec<u64> = self.release_at.values().copied().collect();
        times.sort_unstable();
        times.dedup();
        let release_at = &self.release_at;
        let fits_at = |time: u64| {
            self.place(request, &|_, gpu| match gpu.allocated_to {
                None => true,
                Some(job) => release_at.get(&job).is_some_and(|&end| end <= time),
            })
        };
        let last = *times.last()?;
        let mut found = fits_at(last).ok().map(|placement| (last, placement))?;
        let (mut low, mut high) = (0usize, times.len() - 1);
        while low < high {
            let middle = low + (high - low) / 2;
            match fits_at(times[middle]) {
                Ok(placement) => {
                    found = (times[middle], placement);
                    high = middle;
                }
                Err(_) => low = middle + 1,
            }
        }
        let (shadow_s, placement) = found;
        Some(Reservation {
            job: request.job,
            shadow_s,
            gpus: placement
                .nodes
                .iter()
                .flat_map(|(node, indices)| indices.iter().map(move |&index| (*node, index)))
                .collect(),
        })
    }

    /// Tries to make room for `job` by preempting; commits and returns true
    /// on success, changes nothing otherwise.
    fn try_preempt(&mut self, job: &PendingJob, request: &GangRequest) -> bool {
        let Some(preemptor_tenant) = self.tree.index_of(&job.tenant) else {
            return false;
        };
        let now = self.input.now_s;
        let own_active: Vec<bool> = (0..self.tree.len())
            .map(|t| self.usage.own_share(t) > 0.0 || self.tenants_waiting.contains(&t))
            .collect();
        let fair = self.tree.fair_fractions(&own_active);
        let below_fair_share =
            self.usage.own_share(preemptor_tenant) + SHARE_EPSILON < fair[preemptor_tenant];

        let holdings = self.gpus_held_on_useful_nodes(request);
        let mut candidates: Vec<&'a RunningJob> = self
            .input
            .running
            .iter()
            .filter(|victim| victim.preemptible && now < victim.deadline_s())
            .filter(|victim| {
                !self.preempted.contains(&victim.id) && holdings.contains_key(&victim.id)
            })
            .filter(|victim| {
                let above_fair_share = self
                    .tree
                    .index_of(&victim.tenant)
                    .is_some_and(|t| self.usage.own_share(t) > fair[t] + SHARE_EPSILON);
                (below_fair_share && above_fair_share)
                    || job.effective_priority() > i64::from(victim.priority)
            })
            .collect();
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
            if nodes_enough >= wanted_nodes && self.fits_without(request, &chosen) {
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
            if self.fits_without(request, &fewer) {
                chosen = fewer;
            }
        }
        let victims: BTreeSet<JobId> = chosen.iter().map(|victim| victim.id).collect();
        let Ok(placement) = self.place(request, &|_, gpu| {
            gpu.allocated_to
                .is_none_or(|holder| victims.contains(&holder))
        }) else {
            return false;
        };
        for victim in chosen {
            self.evict(victim, job.id);
        }
        self.commit(job, placement);
        true
    }

    fn fits_without(&self, request: &GangRequest, victims: &[&RunningJob]) -> bool {
        let victims: BTreeSet<JobId> = victims.iter().map(|victim| victim.id).collect();
        self.place(request, &|_, gpu| {
            gpu.allocated_to
                .is_none_or(|holder| victims.contains(&holder))
        })
        .is_ok()
    }

    /// Nodes that could host a member of this gang at all (healthy, labelled,
    /// right model), regardless of what is busy.
    fn useful_node(&self, position: usize, node: &NodeView, request: &GangRequest) -> bool {
        node.healthy
            && self.node_position.get(&node.id) == Some(&position)
            && request
                .required_labels
                .iter()
                .all(|(key, value)| node.labels.get(key) == Some(value))
    }

    fn model_matches(gpu: &GpuView, request: &GangRequest) -> bool {
        request
            .gpu_model
            .as_deref()
            .is_none_or(|model| gpu.model == model)
    }

    /// Per useful node position: running job → GPUs it holds there.
    fn gpus_held_on_useful_nodes(
        &self,
        request: &GangRequest,
    ) -> BTreeMap<JobId, Vec<(usize, u32)>> {
        let mut holdings: BTreeMap<JobId, BTreeMap<usize, u32>> = BTreeMap::new();
        for (position, node) in self.nodes.iter().enumerate() {
            if !self.useful_node(position, node, request) {
                continue;
            }
            for gpu in node
                .gpus
                .iter()
                .filter(|gpu| Self::model_matches(gpu, request))
            {
                if let Some(job) = gpu.allocated_to {
                    *holdings
                        .entry(job)
                        .or_default()
                        .entry(position)
                        .or_default() += 1;
                }
            }
        }
        holdings
            .into_iter()
            .map(|(job, per_node)| (job, per_node.into_iter().collect()))
            .collect()
    }

    fn free_gpus_on_useful_nodes(&self, request: &GangRequest) -> BTreeMap<usize, u32> {
        let mut free = BTreeMap::new();
        for (position, node) in self.nodes.iter().enumerate() {
            if !self.useful_node(position, node, request) {
                continue;
            }
            let count = node
                .gpus
                .iter()
                .filter(|gpu| gpu.allocated_to.is_none() && Self::model_matches(gpu, request))
                .count();
            free.insert(position, u32::try_from(count).unwrap_or(u32::MAX));
        }
        free
    }

    /// Frees a victim's GPUs in the working copy and records compensation.
    fn evict(&mut self, victim: &RunningJob, for_job: JobId) {
        let mut resources = ResourceVector::default();
        for node in &mut self.nodes {
            for gpu in &mut node.gpus {
                if gpu.allocated_to == Some(victim.id) {
                    gpu.allocated_to = None;
                    if node.healthy {
                        resources.add_gpus(Some(&gpu.model), 1);
                    }
                }
            }
        }
        if let Some(tenant) = self.tree.index_of(&victim.tenant) {
            self.tree.release_gpus(tenant, victim.gpus);
            self.usage.release(tenant, &resources);
        }
        self.release_at.remove(&victim.id);
        self.preempted.insert(victim.id);
        let lost_since = victim.last_checkpoint_s.unwrap_or(victim.started_s);
        let lost_s = self.input.now_s.saturating_sub(lost_since);
        self.plan.preemptions.push(Preemption {
            victim: victim.id,
            for_job,
            refund_gpu_s: f64::from(victim.gpus) * lost_s as f64,
        });
    }
}

/// GPUs on healthy nodes, per model and in aggregate.
fn cluster_capacity(nodes: &[NodeView]) -> ResourceVector {
    let mut capacity = ResourceVector::default();
    for node in nodes.iter().filter(|n| n.healthy) {
        for gpu in &node.gpus {
            capacity.add_gpus(Some(&gpu.model), 1);
        }
    }
    capacity
}
