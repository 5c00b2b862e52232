//! Who goes next: Hierarchical Dominant Resource Fairness (Bhattacharya et
//! al., SoCC'13) over the tenant tree, plus quota and GPU-hour budget checks.
//!
//! Resources are a vector keyed by name so that CPUs or memory can join later.
//! GPUs are counted twice on purpose: once per model (`gpu/H100`) and once in
//! the aggregate `gpu` key. A job that accepts any model is charged only to
//! the aggregate, and since every model-specific charge also lands there, the
//! aggregate share is a floor for every tenant's dominant share. With a single
//! model HDRF reduces to hierarchical weighted max-min on GPU counts.
//!
//! Ordering is progressive filling: walk from the root, at each level step
//! into the child with the lowest weighted dominant share (subtree usage over
//! capacity, divided by weight), take that leaf's best job (highest priority
//! plus boost, then oldest), charge its demand as if it were running, repeat.
//! A tenant that has both children and jobs of its own competes with its
//! children through a virtual "own jobs" child carrying the tenant's weight.

use std::collections::BTreeMap;
use std::rc::Rc;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::model::JobId;

/// Aggregate GPU key of a [`ResourceVector`].
pub const GPU_RESOURCE: &str = "gpu";

/// Key of a model-specific GPU count, e.g. `gpu/H100`.
pub fn gpu_model_resource(model: &str) -> String {
    format!("{GPU_RESOURCE}/{model}")
}

/// Amounts per resource name. Sorted keys keep every output deterministic.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ResourceVector(pub BTreeMap<String, f64>);

impl ResourceVector {
    /// `count` GPUs, of `model` if the job insists on one.
    pub fn gpus(model: Option<&str>, count: u32) -> Self {
        let mut vector = ResourceVector::default();
        vector.add_gpus(model, count);
        vector
    }

    /// Adds `count` GPUs in one step. Callers with many GPUs should count
    /// them per model first: each call formats the model key.
    pub fn add_gpus(&mut self, model: Option<&str>, count: u32) {
        self.add_gpu_count(model, u64::from(count));
    }

    /// [`Self::add_gpus`] for counts summed over a whole cluster.
    pub(crate) fn add_gpu_count(&mut self, model: Option<&str>, count: u64) {
        // Exact: GPU counts stay far below 2^53.
        let amount = count as f64;
        self.add_amount(GPU_RESOURCE, amount);
        if let Some(model) = model {
            *self.0.entry(gpu_model_resource(model)).or_default() += amount;
        }
    }

    /// Adds to one resource, allocating its key only the first time.
    fn add_amount(&mut self, resource: &str, amount: f64) {
        match self.0.get_mut(resource) {
            Some(current) => *current += amount,
            None => {
                self.0.insert(resource.to_string(), amount);
            }
        }
    }

    pub fn get(&self, resource: &str) -> f64 {
        self.0.get(resource).copied().unwrap_or(0.0)
    }

    pub fn add(&mut self, other: &ResourceVector) {
        for (resource, amount) in &other.0 {
            self.add_amount(resource, *amount);
        }
    }

    /// Clamped at zero: usage reported by different sources may disagree, and
    /// a negative share would make a tenant look infinitely deserving.
    pub fn subtract(&mut self, other: &ResourceVector) {
        for (resource, amount) in &other.0 {
            if let Some(current) = self.0.get_mut(resource) {
                *current = (*current - amount).max(0.0);
            }
        }
    }

    /// Largest fraction of any resource's capacity this vector holds.
    /// Resources the cluster lacks are ignored: nobody can be given a share
    /// of nothing, and dividing by zero would poison the comparison.
    pub fn dominant_share(&self, capacity: &ResourceVector) -> f64 {
        self.0
            .iter()
            .filter_map(|(resource, amount)| {
                let total = capacity.get(resource);
                (total > 0.0 && amount.is_finite()).then(|| amount / total)
            })
            .fold(0.0, f64::max)
    }
}

/// A tenant (team, project, customer) in the sharing hierarchy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantView {
    pub name: String,
    /// `None` (or a parent that does not exist, or a cycle) hangs the tenant
    /// directly under the root.
    pub parent: Option<String>,
    /// Relative share among siblings; non-positive or non-finite counts as 1.
    pub weight: f64,
    /// Cap on GPUs held by this tenant's whole subtree at any moment.
    pub max_gpus: Option<u32>,
    /// Cap on GPU-hours consumed by the whole subtree.
    pub gpu_hours_limit: Option<f64>,
    /// Consumed by this tenant's own jobs; subtree sums are computed here.
    pub gpu_hours_used: f64,
    /// Held by this tenant's own jobs; subtree sums are computed here.
    pub gpus_in_use: u32,
    /// When `max_gpus` is this region's share of a cap across regions, that
    /// cap (for the waiting reason only).
    #[serde(default)]
    pub global_cap: Option<u32>,
}

/// A job waiting for GPUs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PendingJob {
    pub id: JobId,
    pub tenant: String,
    pub priority: i32,
    /// Submission order from the log; lower is older.
    pub submitted_seq: u64,
    /// Total over the gang.
    pub gpus: u32,
    pub time_limit_s: u64,
    pub preemptible: bool,
    /// Added to `priority` by the caller, e.g. +1 per time this job was
    /// preempted, so that victims do not starve. Only orders jobs within
    /// their tenant's queue; preemption compares base priorities, so a
    /// boosted victim cannot preempt its way back and start a cascade.
    pub boost: i32,
}

impl PendingJob {
    /// Priority for ordering within the tenant's queue (not for preemption).
    pub fn effective_priority(&self) -> i64 {
        i64::from(self.priority) + i64::from(self.boost)
    }

    /// The most GPU-hours this job can consume before its time limit kills it.
    pub fn gpu_hours_needed(&self) -> f64 {
        f64::from(self.gpus) * self.time_limit_s as f64 / 3600.0
    }
}

/// Resources a tenant's running jobs hold.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TenantAllocation {
    pub tenant: String,
    pub resources: ResourceVector,
}

/// A pending job with the resources it asks for.
#[derive(Clone, Debug, PartialEq)]
pub struct PendingDemand<'a> {
    pub job: &'a PendingJob,
    pub resources: ResourceVector,
}

/// What limit an admission check hit.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum QuotaKind {
    UnknownTenant,
    Gpus,
    Budget,
}

/// An admission refusal with a reason meant for the job's owner.
#[derive(Clone, Debug, PartialEq, Error, Serialize, Deserialize)]
#[error("{reason}")]
pub struct QuotaDenied {
    /// The tenant whose limit was hit: the job's own or an ancestor.
    pub tenant: String,
    pub kind: QuotaKind,
    pub reason: String,
}

/// Admission check for one job against the tenant and all its ancestors:
/// GPUs held after placement must stay within `max_gpus`, and the job's
/// worst-case GPU-hours must fit in what is left of `gpu_hours_limit`.
pub fn check_quota(tenants: &[TenantView], job: &PendingJob) -> Result<(), QuotaDenied> {
    let tree = TenantTree::new(tenants);
    match tree.index_of(&job.tenant) {
        Some(tenant) => tree.check_quota(tenant, job),
        None => Err(unknown_tenant(&job.tenant)),
    }
}

pub(crate) fn unknown_tenant(name: &str) -> QuotaDenied {
    QuotaDenied {
        tenant: name.to_string(),
        kind: QuotaKind::UnknownTenant,
        reason: format!("quota: unknown tenant {name}"),
    }
}

/// HDRF order of `pending`. `capacity` is what the cluster has in total
/// (healthy nodes), `running` what tenants hold now. Jobs of unknown tenants
/// come last, by priority and age, so they are still reported.
pub fn order_pending(
    tenants: &[TenantView],
    capacity: &ResourceVector,
    running: &[TenantAllocation],
    pending: &[PendingDemand<'_>],
) -> Vec<JobId> {
    let mut orphans: Vec<&PendingDemand<'_>> = Vec::new();
    let mut queues: BTreeMap<&str, Vec<&PendingDemand<'_>>> = BTreeMap::new();
    let known = TenantTree::new(tenants);
    for demand in pending {
        match known.index_of(&demand.job.tenant) {
            Some(_) => queues.entry(&demand.job.tenant).or_default().push(demand),
            None => orphans.push(demand),
        }
    }
    let space = ResourceSpace::new(capacity);
    let projecting = &space;
    let mut order: Vec<JobId> = FairOrder::new(tenants, space.clone(), running, |name| {
        let mut queue = queues.remove(name).unwrap_or_default();
        // Best job last, taken from the back: among listings that compare
        // equal (a repeated id), the last one listed goes first, as it
        // always has.
        queue.sort_by(|a, b| job_precedence(b.job, a.job));
        let len = queue.len();
        let items: TenantItems<'_, JobId> = Box::new(queue.into_iter().rev().map(move |demand| {
            (
                Rc::from(projecting.project(&demand.resources)),
                demand.job.id,
            )
        }));
        (len, items)
    })
    .map(|(_, id)| id)
    .collect();
    orphans.sort_by(|a, b| job_precedence(a.job, b.job));
    order.extend(orphans.into_iter().map(|demand| demand.job.id));
    order
}

/// A demand projected on a [`ResourceSpace`], shared by the jobs that ask
/// for the same.
pub(crate) type Projected = Rc<[Option<f64>]>;

/// A tenant's items for [`FairOrder`], best job first, each with the
/// resources it asks for, as [`ResourceSpace::project`] gives them.
pub(crate) type TenantItems<'q, T> = Box<dyn Iterator<Item = (Projected, T)> + 'q>;

/// One tenant's queue for [`FairOrder`]: its length and its items.
pub(crate) type TenantQueue<'q, T> = (usize, TenantItems<'q, T>);

/// The resources a fair order compares: those of which the cluster has a
/// positive amount, in name order. A vector over them is a slice of
/// amounts, `None` where the map it stands for has no entry, so that a
/// step of the order adds and compares numbers instead of looking names
/// up in maps (which dominated a long walk). Every amount a share is made
/// of is added and divided as [`ResourceVector::dominant_share`] does it,
/// in the same order, so the shares are bit for bit the same: resources
/// the cluster lacks never count in a share, so they can be left out.
#[derive(Clone, Debug)]
pub(crate) struct ResourceSpace {
    names: Vec<String>,
    totals: Vec<f64>,
}

impl ResourceSpace {
    pub(crate) fn new(capacity: &ResourceVector) -> Self {
        let (names, totals) = capacity
            .0
            .iter()
            .filter(|&(_, &total)| total > 0.0)
            .map(|(name, &total)| (name.clone(), total))
            .unzip();
        ResourceSpace { names, totals }
    }

    /// `resources` over this space's resources.
    pub(crate) fn project(&self, resources: &ResourceVector) -> Box<[Option<f64>]> {
        self.names
            .iter()
            .map(|name| resources.0.get(name).copied())
            .collect()
    }

    fn len(&self) -> usize {
        self.names.len()
    }

    /// [`ResourceVector::add`] over projections.
    fn add(into: &mut [Option<f64>], amounts: &[Option<f64>]) {
        for (current, amount) in into.iter_mut().zip(amounts) {
            if let Some(amount) = *amount {
                *current = Some(match *current {
                    Some(current) => current + amount,
                    None => amount,
                });
            }
        }
    }

    /// [`ResourceVector::dominant_share`] of a projection.
    fn dominant_share(&self, usage: &[Option<f64>]) -> f64 {
        usage
            .iter()
            .zip(&self.totals)
            .filter_map(|(amount, total)| {
                let amount = (*amount)?;
                amount.is_finite().then(|| amount / total)
            })
            .fold(0.0, f64::max)
    }
}

/// The HDRF order of [`order_pending`], produced one job at a time, so that
/// a pass that stops early does not pay for ordering the whole queue.
/// Progressive filling: the next job is the best of the least-served
/// tenant's queue, charged to its tenant as it is taken.
pub(crate) struct FairOrder<'q, T> {
    tree: TenantTree,
    space: ResourceSpace,
    /// Per tenant, `space.len()` amounts each: what its own jobs hold and
    /// what its subtree holds, as `HdrfUsage` kept them.
    own: Vec<Option<f64>>,
    subtree: Vec<Option<f64>>,
    /// Per tenant: its queue, and the next item taken from it.
    queues: Vec<TenantItems<'q, T>>,
    heads: Vec<Option<(Projected, T)>>,
    subtree_pending: Vec<usize>,
    /// Per tenant: `weighted_share`, own and subtree, updated
    /// for the tenants a charge touches: computing every tenant's share at
    /// every step cost more than the rest of the order.
    shares: Vec<(f64, f64)>,
}

impl<'q, T> FairOrder<'q, T> {
    /// `space` must be made from the cluster's capacity, and the items of
    /// `queue_of` projected on it. `queue_of` gives each tenant's queue by
    /// name; it is called once per tenant of the tree and must yield
    /// exactly the length it reports.
    pub(crate) fn new(
        tenants: &[TenantView],
        space: ResourceSpace,
        running: &[TenantAllocation],
        mut queue_of: impl FnMut(&str) -> TenantQueue<'q, T>,
    ) -> Self {
        let tree = TenantTree::new(tenants);
        let width = space.len();
        let mut order = FairOrder {
            own: vec![None; tree.len() * width],
            subtree: vec![None; tree.len() * width],
            queues: Vec::with_capacity(tree.len()),
            heads: Vec::with_capacity(tree.len()),
            subtree_pending: vec![0usize; tree.len()],
            shares: Vec::with_capacity(tree.len()),
            space,
            tree,
        };
        for allocation in running {
            if let Some(tenant) = order.tree.index_of(&allocation.tenant) {
                let resources = order.space.project(&allocation.resources);
                order.charge(tenant, &resources);
            }
        }
        for tenant in 0..order.tree.len() {
            let (len, mut items) = queue_of(order.tree.name(tenant));
            for ancestor in order.tree.self_and_ancestors(tenant) {
                order.subtree_pending[ancestor] += len;
            }
            order.heads.push(items.next());
            order.queues.push(items);
        }
        for tenant in 0..order.tree.len() {
            let shares = (
                order.weighted_share(tenant, false),
                order.weighted_share(tenant, true),
            );
            order.shares.push(shares);
        }
        order
    }

    /// `HdrfUsage::charge` over projections.
    fn charge(&mut self, tenant: usize, resources: &[Option<f64>]) {
        let width = self.space.len();
        if let Some(own) = self.own.get_mut(tenant * width..(tenant + 1) * width) {
            ResourceSpace::add(own, resources);
        }
        for t in self.tree.self_and_ancestors(tenant) {
            if let Some(subtree) = self.subtree.get_mut(t * width..(t + 1) * width) {
                ResourceSpace::add(subtree, resources);
            }
        }
    }

    /// Weighted dominant share of the tenant's own jobs (`subtree` false)
    /// or of its whole subtree, as `HdrfUsage::pick_leaf` compares them.
    fn weighted_share(&self, tenant: usize, subtree: bool) -> f64 {
        let width = self.space.len();
        let usage = if subtree { &self.subtree } else { &self.own };
        let share = usage
            .get(tenant * width..(tenant + 1) * width)
            .map_or(0.0, |usage| self.space.dominant_share(usage));
        share / self.tree.weight(tenant)
    }
}

/// Each item comes with its tenant's index in `TenantTree::new` of the
/// same tenant views, so that the caller need not look the name up again.
impl<T> Iterator for FairOrder<'_, T> {
    type Item = (usize, T);

    fn next(&mut self) -> Option<(usize, T)> {
        let heads = &self.heads;
        let tenant = HdrfUsage::pick_leaf(
            &self.tree,
            &self.shares,
            &|t| heads[t].is_some(),
            &self.subtree_pending,
        )?;
        let (resources, item) = self.heads[tenant].take()?;
        self.heads[tenant] = self.queues[tenant].next();
        for ancestor in self.tree.self_and_ancestors(tenant) {
            self.subtree_pending[ancestor] = self.subtree_pending[ancestor].saturating_sub(1);
        }
        self.charge(tenant, &resources);
        // A charge changes the tenant's own usage and its chain's subtrees.
        self.shares[tenant].0 = self.weighted_share(tenant, false);
        for ancestor in self.tree.self_and_ancestors(tenant) {
            let share = self.weighted_share(ancestor, true);
            self.shares[ancestor].1 = share;
        }
        Some((tenant, item))
    }
}

/// Within one tenant: higher effective priority first, then older, then id.
pub(crate) fn job_precedence(a: &PendingJob, b: &PendingJob) -> std::cmp::Ordering {
    b.effective_priority()
        .cmp(&a.effective_priority())
        .then(a.submitted_seq.cmp(&b.submitted_seq))
        .then(a.id.cmp(&b.id))
}

/// Up to this many tenants are looked up by a linear scan.
const FEW_TENANTS: usize = 32;

/// Byte equality without a library call: tenant names are short. (A
/// short-circuiting loop would be turned back into a `memcmp` call.)
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |differ, (x, y)| differ | (x ^ y)) == 0
}

/// The tenant hierarchy resolved to indices, with quota usage per subtree.
#[derive(Clone, Debug)]
pub(crate) struct TenantTree {
    names: Vec<String>,
    /// First view wins when names repeat.
    index: BTreeMap<String, usize>,
    parent: Vec<Option<usize>>,
    /// Children sorted by name; `roots` likewise.
    children: Vec<Vec<usize>>,
    roots: Vec<usize>,
    weight: Vec<f64>,
    max_gpus: Vec<Option<u32>>,
    global_caps: Vec<Option<u32>>,
    hours_limit: Vec<Option<f64>>,
    subtree_gpus: Vec<u64>,
    subtree_hours: Vec<f64>,
}

impl TenantTree {
    pub fn new(tenants: &[TenantView]) -> Self {
        let mut index: BTreeMap<String, usize> = BTreeMap::new();
        let mut views: Vec<&TenantView> = Vec::new();
        for tenant in tenants {
            if !index.contains_key(&tenant.name) {
                index.insert(tenant.name.clone(), views.len());
                views.push(tenant);
            }
        }
        let count = views.len();
        let declared: Vec<Option<usize>> = views
            .iter()
            .enumerate()
            .map(|(i, view)| {
                let parent = index.get(view.parent.as_deref()?).copied()?;
                (parent != i).then_some(parent)
            })
            .collect();
        // A tenant on a parent cycle is re-rooted; walking `count` steps is
        // enough to notice the walk came back to where it started.
        let parent: Vec<Option<usize>> = (0..count)
            .map(|i| {
                let mut cursor = declared[i];
                for _ in 0..count {
                    match cursor {
                        Some(p) if p == i => return None,
                        Some(p) => cursor = declared[p],
                        None => break,
                    }
                }
                declared[i]
            })
            .collect();
        let mut children: Vec<Vec<usize>> = vec![Vec::new(); count];
        let mut roots = Vec::new();
        // `index` iterates by name, so children come out sorted by name.
        for &i in index.values() {
            match parent[i] {
                Some(p) => children[p].push(i),
                None => roots.push(i),
            }
        }
        let mut tree = TenantTree {
            names: views.iter().map(|v| v.name.clone()).collect(),
            index,
            parent,
            children,
            roots,
            weight: views
                .iter()
                .map(|v| {
                    if v.weight.is_finite() && v.weight > 0.0 {
                        v.weight
                    } else {
                        1.0
                    }
                })
                .collect(),
            max_gpus: views.iter().map(|v| v.max_gpus).collect(),
            global_caps: views.iter().map(|v| v.global_cap).collect(),
            hours_limit: views.iter().map(|v| v.gpu_hours_limit).collect(),
            subtree_gpus: vec![0; count],
            subtree_hours: vec![0.0; count],
        };
        for (i, view) in views.iter().enumerate() {
            let hours = if view.gpu_hours_used.is_finite() {
                view.gpu_hours_used.max(0.0)
            } else {
                0.0
            };
            tree.charge(i, view.gpus_in_use, hours);
        }
        tree
    }

    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// A pass looks up the tenant of every running job, and on a busy
    /// cluster the `memcmp` calls of a map lookup showed up in profiles;
    /// clusters have few tenants, so a scan comparing bytes inline wins.
    pub fn index_of(&self, name: &str) -> Option<usize> {
        if self.names.len() > FEW_TENANTS {
            return self.index.get(name).copied();
        }
        // Names are unique here (the first view of a name won), so the
        // first match is the map's answer.
        self.names
            .iter()
            .position(|known| same_bytes(known.as_bytes(), name.as_bytes()))
    }

    pub fn name(&self, tenant: usize) -> &str {
        self.names.get(tenant).map_or("", String::as_str)
    }

    pub fn weight(&self, tenant: usize) -> f64 {
        self.weight.get(tenant).copied().unwrap_or(1.0)
    }

    /// The tenant itself, then its parent, up to its root. Bounded by the
    /// tree size, which the cycle breaking in `new` makes sufficient.
    pub fn self_and_ancestors(&self, tenant: usize) -> impl Iterator<Item = usize> + '_ {
        let mut cursor = Some(tenant).filter(|&t| t < self.len());
        std::iter::from_fn(move || {
            let current = cursor?;
            cursor = self.parent[current];
            Some(current)
        })
        .take(self.len())
    }

    /// Records GPUs and GPU-hours as used by `tenant` (and so its ancestors).
    pub fn charge(&mut self, tenant: usize, gpus: u32, hours: f64) {
        let chain: Vec<usize> = self.self_and_ancestors(tenant).collect();
        for t in chain {
            self.subtree_gpus[t] = self.subtree_gpus[t].saturating_add(u64::from(gpus));
            self.subtree_hours[t] += hours;
        }
    }

    /// Returns GPUs freed by preemption; GPU-hours already burnt stay spent.
    pub fn release_gpus(&mut self, tenant: usize, gpus: u32) {
        let chain: Vec<usize> = self.self_and_ancestors(tenant).collect();
        for t in chain {
            self.subtree_gpus[t] = self.subtree_gpus[t].saturating_sub(u64::from(gpus));
        }
    }

    pub fn check_quota(&self, tenant: usize, job: &PendingJob) -> Result<(), QuotaDenied> {
        let needed_hours = job.gpu_hours_needed();
        for t in self.self_and_ancestors(tenant) {
            let name = self.name(t);
            if let Some(max) = self.max_gpus[t] {
                let in_use = self.subtree_gpus[t];
                if in_use.saturating_add(u64::from(job.gpus)) > u64::from(max) {
                    let reason = match self.global_caps[t] {
                        Some(global) => format!(
                            "quota: {name} uses {in_use} of the {max} GPUs this region holds of its global cap of {global}, job needs {}; the other regions grant share they leave idle",
                            job.gpus
                        ),
                        None => format!(
                            "quota: {name} uses {in_use}/{max} GPUs, job needs {}",
                            job.gpus
                        ),
                    };
                    return Err(QuotaDenied {
                        tenant: name.to_string(),
                        kind: QuotaKind::Gpus,
                        reason,
                    });
                }
            }
            if let Some(limit) = self.hours_limit[t] {
                let used = self.subtree_hours[t];
                // Written so that a NaN limit denies rather than admits.
                let fits = used + needed_hours <= limit;
                if !fits {
                    let left = (limit - used).max(0.0);
                    return Err(QuotaDenied {
                        tenant: name.to_string(),
                        kind: QuotaKind::Budget,
                        reason: format!(
                            "budget: {name} has {left:.1} of {} GPU-hours left, job needs {}",
                            format_amount(limit),
                            format_amount(needed_hours)
                        ),
                    });
                }
            }
        }
        Ok(())
    }

    /// Each tenant's entitled fraction of the cluster, for its own jobs: the
    /// root's whole is split among active children by weight, recursively; a
    /// tenant with own jobs competes with its children using its own weight.
    /// `own_active[t]` says whether tenant `t` itself holds or wants anything.
    pub fn fair_fractions(&self, own_active: &[bool]) -> Vec<f64> {
        let count = self.len();
        let mut subtree_active = vec![false; count];
        for t in 0..count {
            if own_active.get(t).copied().unwrap_or(false) {
                for a in self.self_and_ancestors(t) {
                    subtree_active[a] = true;
                }
            }
        }
        let mut own_fraction = vec![0.0; count];
        let mut subtree_fraction = vec![0.0; count];
        let active_weight = |members: &[usize]| -> f64 {
            members
                .iter()
                .filter(|&&m| subtree_active[m])
                .map(|&m| self.weight(m))
                .sum()
        };
        let root_weight = active_weight(&self.roots);
        let mut stack: Vec<usize> = Vec::new();
        for &root in &self.roots {
            if subtree_active[root] && root_weight > 0.0 {
                subtree_fraction[root] = self.weight(root) / root_weight;
                stack.push(root);
            }
        }
        while let Some(t) = stack.pop() {
            let own = own_active.get(t).copied().unwrap_or(false);
            let denominator =
                active_weight(&self.children[t]) + if own { self.weight(t) } else { 0.0 };
            if denominator <= 0.0 {
                continue;
            }
            if own {
                own_fraction[t] = subtree_fraction[t] * self.weight(t) / denominator;
            }
            for &child in &self.children[t] {
                if subtree_active[child] {
                    subtree_fraction[child] =
                        subtree_fraction[t] * self.weight(child) / denominator;
                    stack.push(child);
                }
            }
        }
        own_fraction
    }
}

/// Prints whole amounts without decimals ("5000"), others with one ("2.5").
fn format_amount(amount: f64) -> String {
    if amount.fract() == 0.0 && amount.abs() < 1e15 {
        format!("{amount:.0}")
    } else {
        format!("{amount:.1}")
    }
}

/// Resource usage per tenant, own and per subtree, for HDRF comparisons.
#[derive(Clone, Debug)]
pub(crate) struct HdrfUsage {
    capacity: ResourceVector,
    own: Vec<ResourceVector>,
    subtree: Vec<ResourceVector>,
    parent: Vec<Option<usize>>,
}

impl HdrfUsage {
    pub fn new(tree: &TenantTree, capacity: ResourceVector) -> Self {
        HdrfUsage {
            capacity,
            own: vec![ResourceVector::default(); tree.len()],
            subtree: vec![ResourceVector::default(); tree.len()],
            parent: tree.parent.clone(),
        }
    }

    fn chain(&self, tenant: usize) -> Vec<usize> {
        let mut chain = Vec::new();
        let mut cursor = Some(tenant).filter(|&t| t < self.own.len());
        while let Some(t) = cursor {
            if chain.len() > self.own.len() {
                break;
            }
            chain.push(t);
            cursor = self.parent[t];
        }
        chain
    }

    pub fn charge(&mut self, tenant: usize, resources: &ResourceVector) {
        let chain = self.chain(tenant);
        if let Some(own) = self.own.get_mut(tenant) {
            own.add(resources);
        }
        for t in chain {
            self.subtree[t].add(resources);
        }
    }

    pub fn release(&mut self, tenant: usize, resources: &ResourceVector) {
        let chain = self.chain(tenant);
        if let Some(own) = self.own.get_mut(tenant) {
            own.subtract(resources);
        }
        for t in chain {
            self.subtree[t].subtract(resources);
        }
    }

    /// Dominant share of what the tenant's own jobs hold.
    pub fn own_share(&self, tenant: usize) -> f64 {
        self.own
            .get(tenant)
            .map_or(0.0, |usage| usage.dominant_share(&self.capacity))
    }

    /// Progressive filling step: from the root down, the least-served branch
    /// that still has pending work; ties go to the branch that sorts first.
    /// `shares` holds `FairOrder::weighted_share` of every tenant, own then
    /// subtree.
    fn pick_leaf(
        tree: &TenantTree,
        shares: &[(f64, f64)],
        has_own: &dyn Fn(usize) -> bool,
        subtree_pending: &[usize],
    ) -> Option<usize> {
        let mut level: &[usize] = &tree.roots;
        let mut current: Option<usize> = None;
        for _ in 0..=tree.len() {
            // (share, own-jobs-first, position) keeps the choice total.
            let mut best: Option<(f64, u8, usize, usize, bool)> = None;
            if let Some(t) = current {
                if has_own(t) {
                    best = Some((shares[t].0, 0, 0, t, true));
                }
            }
            for (position, &child) in level.iter().enumerate() {
                if subtree_pending[child] == 0 {
                    continue;
                }
                let key = (shares[child].1, 1, position, child, false);
                let better = match best {
                    None => true,
                    Some(b) => key
                        .0
                        .total_cmp(&b.0)
                        .then(key.1.cmp(&b.1))
                        .then(key.2.cmp(&b.2))
                        .is_lt(),
                };
                if better {
                    best = Some(key);
                }
            }
            let (_, _, _, chosen, is_own) = best?;
            if is_own {
                return Some(chosen);
            }
            current = Some(chosen);
            level = &tree.children[chosen];
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    pub(crate) fn tenant(name: &str, parent: Option<&str>, weight: f64) -> TenantView {
        TenantView {
            name: name.to_string(),
            parent: parent.map(str::to_string),
            weight,
            max_gpus: None,
            gpu_hours_limit: None,
            gpu_hours_used: 0.0,
            gpus_in_use: 0,
            global_cap: None,
        }
    }

    fn job(id: JobId, tenant: &str, gpus: u32) -> PendingJob {
        PendingJob {
            id,
            tenant: tenant.to_string(),
            priority: 0,
            submitted_seq: id,
            gpus,
            time_limit_s: 3600,
            preemptible: true,
            boost: 0,
        }
    }

    fn demands(jobs: &[PendingJob]) -> Vec<PendingDemand<'_>> {
        jobs.iter()
            .map(|job| PendingDemand {
                job,
                resources: ResourceVector::gpus(None, job.gpus),
            })
            .collect()
    }

    /// Progressive filling as it was written before `FairOrder` kept
    /// dense usage and cached shares: every share recomputed from the
    /// name-keyed maps at every step.
    fn reference_order(
        tenants: &[TenantView],
        capacity: &ResourceVector,
        running: &[TenantAllocation],
        pending: &[PendingDemand<'_>],
    ) -> Vec<JobId> {
        let tree = TenantTree::new(tenants);
        let mut usage = HdrfUsage::new(&tree, capacity.clone());
        for allocation in running {
            if let Some(tenant) = tree.index_of(&allocation.tenant) {
                usage.charge(tenant, &allocation.resources);
            }
        }
        let mut queues: Vec<Vec<&PendingDemand<'_>>> = vec![Vec::new(); tree.len()];
        let mut orphans: Vec<&PendingDemand<'_>> = Vec::new();
        for demand in pending {
            match tree.index_of(&demand.job.tenant) {
                Some(tenant) => queues[tenant].push(demand),
                None => orphans.push(demand),
            }
        }
        // Best job last, popped from the back.
        for queue in &mut queues {
            queue.sort_by(|a, b| job_precedence(b.job, a.job));
        }
        let mut order = Vec::new();
        loop {
            let mut subtree_pending = vec![0usize; tree.len()];
            for (tenant, queue) in queues.iter().enumerate() {
                for ancestor in tree.self_and_ancestors(tenant) {
                    subtree_pending[ancestor] += queue.len();
                }
            }
            let shares: Vec<(f64, f64)> = (0..tree.len())
                .map(|t| {
                    (
                        usage.own[t].dominant_share(capacity) / tree.weight(t),
                        usage.subtree[t].dominant_share(capacity) / tree.weight(t),
                    )
                })
                .collect();
            let Some(tenant) =
                HdrfUsage::pick_leaf(&tree, &shares, &|t| !queues[t].is_empty(), &subtree_pending)
            else {
                break;
            };
            let Some(demand) = queues[tenant].pop() else {
                break;
            };
            usage.charge(tenant, &demand.resources);
            order.push(demand.job.id);
        }
        orphans.sort_by(|a, b| job_precedence(a.job, b.job));
        order.extend(orphans.into_iter().map(|demand| demand.job.id));
        order
    }

    /// Resources from a small set of names, with whole and fractional
    /// amounts, zeros and the odd negative or huge one.
    fn random_resources(rng: &mut ChaCha8Rng) -> ResourceVector {
        const NAMES: [&str; 4] = ["gpu", "gpu/H100", "gpu/A100", "cpu"];
        let mut resources = ResourceVector::default();
        for name in NAMES {
            if rng.random_bool(0.5) {
                let amount = match rng.random_range(0..10) {
                    0 => 0.0,
                    1 => -0.0,
                    2 => -1.0,
                    3 => rng.random_range(0.0..10.0),
                    4 => 1e300,
                    _ => f64::from(rng.random_range(1u32..16)),
                };
                resources.0.insert(name.to_string(), amount);
            }
        }
        resources
    }

    proptest::proptest! {
        #[test]
        fn fair_order_matches_progressive_filling_over_maps(seed in proptest::prelude::any::<u64>()) {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            const NAMES: [&str; 5] = ["org", "a", "b", "c", "d"];
            let tenants: Vec<TenantView> = (0..rng.random_range(1..=NAMES.len()))
                .map(|i| {
                    let parent = rng
                        .random_bool(0.5)
                        .then(|| NAMES[rng.random_range(0..NAMES.len())]);
                    let weight = match rng.random_range(0..6) {
                        0 => 0.0,
                        1 => -2.0,
                        _ => f64::from(rng.random_range(1u32..4)),
                    };
                    tenant(NAMES[i], parent, weight)
                })
                .collect();
            let capacity = random_resources(&mut rng);
            let running: Vec<TenantAllocation> = (0..rng.random_range(0..4))
                .map(|_| TenantAllocation {
                    tenant: NAMES[rng.random_range(0..NAMES.len())].to_string(),
                    resources: random_resources(&mut rng),
                })
                .collect();
            let jobs: Vec<PendingJob> = (0..rng.random_range(0..40))
                .map(|i| {
                    let mut pending = job(i, NAMES[rng.random_range(0..NAMES.len())], 1);
                    pending.priority = rng.random_range(0..3);
                    pending.submitted_seq = rng.random_range(0..20);
                    pending
                })
                .collect();
            let pending: Vec<PendingDemand<'_>> = jobs
                .iter()
                .map(|job| PendingDemand {
                    job,
                    resources: random_resources(&mut rng),
                })
                .collect();
            proptest::prop_assert_eq!(
                order_pending(&tenants, &capacity, &running, &pending),
                reference_order(&tenants, &capacity, &running, &pending)
            );
        }
    }

    #[test]
    fn weighted_tenants_alternate_in_proportion() {
        let tenants = [tenant("a", None, 1.0), tenant("b", None, 2.0)];
        let jobs: Vec<PendingJob> = (0..6)
            .map(|i| job(i, "a", 1))
            .chain((10..16).map(|i| job(i, "b", 1)))
            .collect();
        let capacity = ResourceVector::gpus(None, 6);
        let order = order_pending(&tenants, &capacity, &[], &demands(&jobs));
        assert_eq!(order.len(), jobs.len());
        let first_six: Vec<&str> = order[..6]
            .iter()
            .map(|id| if *id < 10 { "a" } else { "b" })
            .collect();
        let b_count = first_six.iter().filter(|t| **t == "b").count();
        assert_eq!(b_count, 4, "order {order:?}");
    }

    #[test]
    fn hierarchy_splits_at_each_level() {
        // org1 (weight 1) has two leaves, org2 (weight 1) one leaf: the org2
        // leaf deserves as much as org1's two leaves together.
        let tenants = [
            tenant("org1", None, 1.0),
            tenant("org2", None, 1.0),
            tenant("x", Some("org1"), 1.0),
            tenant("y", Some("org1"), 1.0),
            tenant("z", Some("org2"), 1.0),
        ];
        let jobs: Vec<PendingJob> = (0..8)
            .map(|i| job(i, "x", 1))
            .chain((10..18).map(|i| job(i, "y", 1)))
            .chain((20..28).map(|i| job(i, "z", 1)))
            .collect();
        let order = order_pending(
            &tenants,
            &ResourceVector::gpus(None, 8),
            &[],
            &demands(&jobs),
        );
        let z_in_first_8 = order[..8].iter().filter(|id| **id >= 20).count();
        assert_eq!(z_in_first_8, 4, "order {order:?}");
    }

    #[test]
    fn running_usage_delays_the_heavy_tenant_and_priority_orders_within() {
        let tenants = [tenant("a", None, 1.0), tenant("b", None, 1.0)];
        let mut jobs = vec![job(1, "a", 1), job(2, "b", 1), job(3, "b", 1)];
        jobs[2].priority = 5;
        let running = [TenantAllocation {
            tenant: "a".into(),
            resources: ResourceVector::gpus(None, 4),
        }];
        let order = order_pending(
            &tenants,
            &ResourceVector::gpus(None, 8),
            &running,
            &demands(&jobs),
        );
        assert_eq!(order, vec![3, 2, 1]);
    }

    #[test]
    fn unknown_tenants_and_cycles_do_not_break_ordering() {
        let tenants = [tenant("a", Some("b"), 1.0), tenant("b", Some("a"), 1.0)];
        let jobs = vec![job(1, "ghost", 1), job(2, "a", 1), job(3, "b", 1)];
        let order = order_pending(
            &tenants,
            &ResourceVector::gpus(None, 2),
            &[],
            &demands(&jobs),
        );
        assert_eq!(order, vec![2, 3, 1]);
    }

    #[test]
    fn quota_counts_the_whole_subtree() {
        let mut parent = tenant("org", None, 1.0);
        parent.max_gpus = Some(64);
        let mut vision = tenant("vision", Some("org"), 1.0);
        vision.gpus_in_use = 40;
        let mut speech = tenant("speech", Some("org"), 1.0);
        speech.gpus_in_use = 20;
        let tenants = [parent, vision, speech];
        assert!(check_quota(&tenants, &job(1, "vision", 4)).is_ok());
        let denied = check_quota(&tenants, &job(1, "vision", 8)).unwrap_err();
        assert_eq!(denied.kind, QuotaKind::Gpus);
        assert_eq!(denied.reason, "quota: org uses 60/64 GPUs, job needs 8");
        assert_eq!(
            check_quota(&tenants, &job(1, "nobody", 1))
                .unwrap_err()
                .kind,
            QuotaKind::UnknownTenant
        );
    }

    #[test]
    fn budget_denial_is_readable() {
        let mut vision = tenant("vision", None, 1.0);
        vision.gpu_hours_limit = Some(5000.0);
        vision.gpu_hours_used = 4997.0;
        let mut big = job(1, "vision", 64);
        big.time_limit_s = 9 * 3600;
        let denied = check_quota(&[vision], &big).unwrap_err();
        assert_eq!(denied.kind, QuotaKind::Budget);
        assert_eq!(
            denied.reason,
            "budget: vision has 3.0 of 5000 GPU-hours left, job needs 576"
        );
    }

    #[test]
    fn fair_fractions_split_by_weight_among_active_tenants() {
        let tenants = [
            tenant("a", None, 1.0),
            tenant("b", None, 3.0),
            tenant("idle", None, 100.0),
        ];
        let tree = TenantTree::new(&tenants);
        let fractions = tree.fair_fractions(&[true, true, false]);
        assert!((fractions[0] - 0.25).abs() < 1e-9);
        assert!((fractions[1] - 0.75).abs() < 1e-9);
        assert_eq!(fractions[2], 0.0);
    }

    #[test]
    fn dominant_share_takes_the_scarcest_resource() {
        let mut capacity = ResourceVector::gpus(Some("H100"), 8);
        capacity.add_gpus(Some("A10"), 24);
        let usage = ResourceVector::gpus(Some("H100"), 4);
        // 4 of 8 H100 dominates 4 of 32 GPUs overall.
        assert!((usage.dominant_share(&capacity) - 0.5).abs() < 1e-9);
        assert_eq!(
            ResourceVector::gpus(Some("B200"), 4).dominant_share(&ResourceVector::default()),
            0.0
        );
    }
}
