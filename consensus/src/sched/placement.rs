//! Gang placement: pick `nodes` distinct nodes with `gpus_per_node` free GPUs
//! each, keeping the gang's network diameter small.
//!
//! Exact diameter minimisation is a k-clique style search, far too slow for
//! thousands of nodes inside a consensus tick. Instead a bounded number of
//! seed nodes is tried (seeds come from the topology groups with the most
//! feasible nodes, at most one per rack at first so the seeds are spread out),
//! each seed is grown by taking its nearest feasible nodes (a bounded heap,
//! linear in the cluster), and the candidate with the smallest diameter wins.
//! When RTTs obey the triangle inequality the diameter of a seed-grown set is
//! at most twice its radius, so a good seed gives a near-optimal set. Nodes
//! farther from a seed than the best diameter so far are skipped, and the
//! O(k²) diameter check stops as soon as it cannot win.
//!
//! Cost per request: O(n) to filter and group the nodes, plus
//! `MAX_SEEDS × (n + k²)` RTT lookups. The filter reads a [`ClusterIndex`]
//! (flat integer arrays built once per snapshot), not the node views, and a
//! scheduling pass can hand in per-node upper bounds on free GPUs so that
//! full nodes are skipped without looking at their GPUs.
//!
//! Ties (within measurement noise) prefer a narrower topology span, then
//! packing: nodes left with the fewest free GPUs, so whole nodes stay free for
//! large gangs; then the lowest ids, so the outcome is reproducible.

use std::borrow::Cow;
use std::cell::OnceCell;
use std::cmp::Ordering;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::Range;

use serde::{Deserialize, Serialize};
use thiserror::Error;

use super::model::{GangRequest, GpuView, NodeId, NodeView, Placement, TopologyPath, TopologyTier};
use super::proximity::{rtt_or_estimate, Proximity};

/// Seeds tried per request. Eight rack-diverse seeds found the same mean
/// diameter as sixteen on the 4,096-node benchmark at half the cost.
pub const MAX_SEEDS: usize = 8;

/// Diameters closer than this are treated as equal: RTT estimates (Vivaldi)
/// are noisy, and packing is worth more than a difference below the noise.
const DIAMETER_TOLERANCE_ABS_MS: f64 = 0.01;
/// See [`DIAMETER_TOLERANCE_ABS_MS`]; relative part for long-haul gangs.
const DIAMETER_TOLERANCE_REL: f64 = 0.01;

/// Bounds the NVLink clique search so an adversarial peer list cannot stall a
/// scheduling pass; the search then falls back to NUMA locality.
const CLIQUE_SEARCH_STEP_BUDGET: usize = 10_000;

/// Why a gang could not be placed, for callers that react differently to a
/// malformed request than to a full cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum UnplaceableKind {
    /// The request can never be satisfied as written (zero nodes, …).
    InvalidRequest,
    /// Fewer feasible nodes than the gang needs.
    NotEnoughNodes,
    /// Enough nodes, but not inside one topology group as `same` demands.
    Topology,
    /// Enough nodes, but not within `max_rtt_ms` of each other.
    Latency,
}

/// A placement failure with a reason meant for the job's owner.
#[derive(Clone, Debug, PartialEq, Error, Serialize, Deserialize)]
#[error("{reason}")]
pub struct Unplaceable {
    pub kind: UnplaceableKind,
    pub reason: String,
}

impl Unplaceable {
    fn new(kind: UnplaceableKind, reason: String) -> Self {
        Unplaceable { kind, reason }
    }
}

/// Places a gang on the GPUs that are currently free.
pub fn place_gang(
    nodes: &[NodeView],
    prox: &dyn Proximity,
    req: &GangRequest,
) -> Result<Placement, Unplaceable> {
    Placer::new(nodes).place(prox, req)
}

/// Places gangs against one snapshot, building the cluster index once, as a
/// scheduling pass does: for callers that make many decisions against the
/// same view (the leader's pass, benchmarks). Each call is independent; it
/// does not remember earlier placements.
pub struct Placer<'a> {
    cluster: ClusterIndex<'a>,
}

impl<'a> Placer<'a> {
    pub fn new(nodes: &'a [NodeView]) -> Self {
        Placer {
            cluster: ClusterIndex::new(nodes),
        }
    }

    pub fn place(&self, prox: &dyn Proximity, req: &GangRequest) -> Result<Placement, Unplaceable> {
        let cluster = &self.cluster;
        place_indexed(
            cluster,
            prox,
            req,
            &|gpu| cluster.gpu(gpu).allocated_to.is_none(),
            None,
        )
    }
}

/// Marks a GPU without a known model in [`ClusterShape`]; never happens for
/// GPUs of the snapshot, kept so that lookups need no `Option`.
const NO_MODEL: u32 = u32::MAX;

/// The part of a snapshot that placement reads per GPU and that only changes
/// when nodes join, leave or report different GPUs: flat GPU numbering,
/// model ids and index uniqueness. Owned, so that a [`super::SchedCache`]
/// can keep it from one pass to the next instead of walking every GPU view
/// again.
///
/// GPUs are numbered by their position in a flat list: node `n` owns
/// positions `gpu_start[n]..gpu_start[n + 1]`, in the order of `NodeView::gpus`.
/// A scheduling pass keeps its allocation overlay in that numbering.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct ClusterShape {
    gpu_start: Vec<usize>,
    /// Per flat GPU: position of its node in the snapshot.
    node_of_gpu: Vec<u32>,
    /// Per flat GPU: position of its model in `models`.
    pub gpu_model: Vec<u32>,
    /// Per flat GPU: no other GPU of the node claims the same index; GPUs
    /// with ambiguous indices are never handed out.
    pub gpu_unique: Vec<bool>,
    /// Distinct model names, sorted, so that model ids order like names.
    pub models: Vec<String>,
}

impl ClusterShape {
    pub fn new(nodes: &[NodeView]) -> Self {
        let gpu_total: usize = nodes.iter().map(|n| n.gpus.len()).sum();
        let mut gpu_start = Vec::with_capacity(nodes.len() + 1);
        let mut node_of_gpu = Vec::with_capacity(gpu_total);
        let mut gpu_unique = Vec::with_capacity(gpu_total);
        // Model strings are compared against the previous GPU's first: in
        // practice a node (and usually the cluster) has a single model. Ids
        // are handed out in order of appearance, then renumbered by name.
        let mut seen: Vec<&str> = Vec::new();
        // Beyond a handful of models a linear search would be quadratic.
        let mut seen_index: BTreeMap<&str, usize> = BTreeMap::new();
        let mut gpu_model: Vec<u32> = Vec::with_capacity(gpu_total);
        let mut previous: Option<(&str, u32)> = None;
        for (position, node) in nodes.iter().enumerate() {
            gpu_start.push(gpu_model.len());
            let unique_fast = indices_strictly_increasing(node);
            let position = u32::try_from(position).unwrap_or(u32::MAX);
            for gpu in &node.gpus {
                node_of_gpu.push(position);
                gpu_unique.push(unique_fast || index_is_unique(node, gpu));
                let model = gpu.model.as_str();
                let id = match previous {
                    Some((name, id)) if same_text(name, model) => id,
                    _ => {
                        let known = if seen.len() <= FEW_MODELS {
                            seen.iter().position(|name| same_text(name, model))
                        } else {
                            seen_index.get(model).copied()
                        };
                        let id = match known {
                            Some(i) => i,
                            None => {
                                seen_index.insert(model, seen.len());
                                seen.push(model);
                                seen.len() - 1
                            }
                        };
                        let id = u32::try_from(id).unwrap_or(NO_MODEL);
                        previous = Some((model, id));
                        id
                    }
                };
                gpu_model.push(id);
            }
        }
        gpu_start.push(gpu_model.len());
        let mut models: Vec<&str> = seen.clone();
        models.sort_unstable();
        let renumber: Vec<u32> = seen
            .iter()
            .map(|name| {
                models
                    .binary_search(name)
                    .ok()
                    .and_then(|i| u32::try_from(i).ok())
                    .unwrap_or(NO_MODEL)
            })
            .collect();
        for id in &mut gpu_model {
            *id = renumber.get(*id as usize).copied().unwrap_or(NO_MODEL);
        }
        ClusterShape {
            gpu_start,
            node_of_gpu,
            gpu_model,
            gpu_unique,
            models: models.into_iter().map(str::to_string).collect(),
        }
    }

    /// Number of GPUs over all nodes.
    pub fn gpu_count(&self) -> usize {
        self.gpu_model.len()
    }

    /// Flat positions of the GPUs of node `node`.
    pub fn gpu_range(&self, node: usize) -> Range<usize> {
        let start = self.gpu_start.get(node).copied().unwrap_or(0);
        let end = self.gpu_start.get(node + 1).copied().unwrap_or(start);
        start..end
    }

    /// Whether the shape numbers exactly these nodes' GPUs: same node count
    /// and GPU count per node. Cheap (one read per node), so a cache checks
    /// it before every pass; a mismatch means the shape must be rebuilt.
    pub fn matches_sizes(&self, nodes: &[NodeView]) -> bool {
        self.gpu_start.len() == nodes.len() + 1
            && nodes
                .iter()
                .enumerate()
                .all(|(position, node)| self.gpu_range(position).len() == node.gpus.len())
    }

    /// Re-reads one node whose GPUs may have changed. Returns false when the
    /// change cannot be applied in place (GPU count or a model differs, which
    /// may renumber models): the caller must rebuild the whole shape.
    pub fn refresh_node(&mut self, nodes: &[NodeView], position: usize) -> bool {
        let Some(node) = nodes.get(position) else {
            return false;
        };
        let range = self.gpu_range(position);
        if range.len() != node.gpus.len() {
            return false;
        }
        let unique_fast = indices_strictly_increasing(node);
        for (gpu, view) in range.zip(&node.gpus) {
            let cached_model = self
                .models
                .get(self.gpu_model[gpu] as usize)
                .map(String::as_str);
            if cached_model != Some(view.model.as_str()) {
                return false;
            }
            self.gpu_unique[gpu] = unique_fast || index_is_unique(node, view);
        }
        true
    }
}

/// What placement needs to know about a snapshot that does not change while
/// a pass runs, computed once so that each placement attempt reads compact
/// integer arrays instead of walking node views, label maps and model strings.
/// The per-GPU part ([`ClusterShape`]) is either built here or lent by a
/// cache that kept it from an earlier pass.
pub(crate) struct ClusterIndex<'a> {
    pub nodes: &'a [NodeView],
    pub shape: Cow<'a, ClusterShape>,
    /// Per node: healthy and its id appears only once, so it may be placed on.
    pub hostable: Vec<bool>,
    /// Topology paths, read from a node's labels only when a multi-node
    /// gang considers that node, then kept for the rest of the pass.
    paths: Vec<OnceCell<TopologyPath<'a>>>,
}

impl<'a> ClusterIndex<'a> {
    pub fn new(nodes: &'a [NodeView]) -> Self {
        Self::with_shape(nodes, Cow::Owned(ClusterShape::new(nodes)))
    }

    /// `shape` must have been built (or refreshed) from `nodes`; callers
    /// check [`ClusterShape::matches_sizes`] first.
    pub fn with_shape(nodes: &'a [NodeView], shape: Cow<'a, ClusterShape>) -> Self {
        let duplicated = duplicated_ids(nodes);
        let hostable = nodes
            .iter()
            .map(|node| node.healthy && duplicated.binary_search(&node.id).is_err())
            .collect();
        ClusterIndex {
            nodes,
            shape,
            hostable,
            paths: vec![OnceCell::new(); nodes.len()],
        }
    }

    /// The view of flat GPU `gpu`.
    pub fn gpu(&self, gpu: usize) -> &'a GpuView {
        let node = self.shape.node_of_gpu[gpu] as usize;
        let nodes: &'a [NodeView] = self.nodes;
        &nodes[node].gpus[gpu - self.shape.gpu_start[node]]
    }

    /// Flat positions of the GPUs of node `node`.
    pub fn gpu_range(&self, node: usize) -> Range<usize> {
        self.shape.gpu_range(node)
    }

    /// Ids of the models a requested name matches ([`gpu_model_matches`]),
    /// in id order; empty when the cluster has none of them.
    ///
    /// [`gpu_model_matches`]: super::model::gpu_model_matches
    pub fn model_ids(&self, name: &str) -> Vec<u32> {
        self.shape
            .models
            .iter()
            .enumerate()
            .filter(|(_, model)| super::model::gpu_model_matches(name, model))
            .filter_map(|(i, _)| u32::try_from(i).ok())
            .collect()
    }

    pub fn model_name(&self, id: u32) -> &str {
        usize::try_from(id)
            .ok()
            .and_then(|i| self.shape.models.get(i))
            .map_or("", String::as_str)
    }

    fn path(&self, node: usize) -> TopologyPath<'a> {
        match (self.paths.get(node), self.nodes.get(node)) {
            (Some(cell), Some(view)) => *cell.get_or_init(|| TopologyPath::of(&view.labels)),
            _ => TopologyPath {
                region: None,
                zone: None,
                rack: None,
            },
        }
    }
}

/// Up to this many distinct models are looked up by linear search.
const FEW_MODELS: usize = 16;

/// String equality without a `memcmp` call: model names are short, and the
/// call overhead per GPU dominated building the index.
fn same_text(a: &str, b: &str) -> bool {
    a.len() == b.len()
        && a.bytes()
            .zip(b.bytes())
            .fold(0u8, |differ, (x, y)| differ | (x ^ y))
            == 0
}

/// Ids that appear on more than one node view, sorted. Placing on an
/// ambiguous view could double-book whichever copy is stale.
fn duplicated_ids(nodes: &[NodeView]) -> Vec<NodeId> {
    if nodes.windows(2).all(|pair| pair[0].id < pair[1].id) {
        return Vec::new();
    }
    let mut ids: Vec<NodeId> = nodes.iter().map(|n| n.id).collect();
    ids.sort_unstable();
    let mut duplicated: Vec<NodeId> = ids
        .windows(2)
        .filter(|pair| pair[0] == pair[1])
        .map(|pair| pair[0])
        .collect();
    duplicated.dedup();
    duplicated
}

/// Marks an absent topology group; never equal to a real group id.
const NO_GROUP: u32 = u32::MAX;

/// A node that can host one member of the gang.
struct Candidate<'a> {
    id: NodeId,
    /// Position of the node in the snapshot.
    position: usize,
    /// Filled only for multi-node gangs, which are the only ones that look.
    path: TopologyPath<'a>,
    model: u32,
    /// Free GPUs left on the node after placing; smaller packs tighter.
    leftover: u32,
    /// Per tier (rack, zone, region): an id for this node's group, local to
    /// one call, so that hot loops compare integers instead of label strings.
    /// [`NO_GROUP`] when the labels do not say.
    groups: [u32; 3],
    /// Feasible nodes in this node's rack, zone and region (1 when unlabelled).
    group_sizes: [usize; 3],
}

impl Candidate<'_> {
    fn rtt_to(&self, other: &Candidate<'_>, prox: &dyn Proximity) -> f64 {
        rtt_or_estimate(prox, (self.id, &self.path), (other.id, &other.path))
    }

    fn same_group(&self, other: &Candidate<'_>, slot: usize) -> bool {
        self.groups[slot] != NO_GROUP && self.groups[slot] == other.groups[slot]
    }
}

/// A fully evaluated gang candidate.
struct Evaluated {
    seed: usize,
    members: Vec<usize>,
    diameter: f64,
    /// Index into [`TopologyTier::ALL`] of the narrowest tier shared by all
    /// members, `ALL.len()` when they share none.
    span: usize,
    packing: u64,
    sorted_ids: Vec<NodeId>,
}

/// The reason given when no node can take a member of the gang.
pub(crate) fn not_enough_nodes(req: &GangRequest, have_enough: usize) -> Unplaceable {
    Unplaceable::new(
        UnplaceableKind::NotEnoughNodes,
        format!(
            "no {} nodes with {} free {}{} ({have_enough} have enough)",
            req.nodes,
            req.gpus_per_node,
            model_name(req),
            labels_suffix(req),
        ),
    )
}

/// Places a gang on the GPUs (flat positions of `cluster`) that `is_free`
/// allows. `usable_at_most`, when given, bounds per node how many GPUs
/// `is_free` can allow; nodes below the gang's per-node need are skipped
/// without looking at their GPUs, which is what keeps repeated attempts in a
/// pass cheap on a busy cluster.
pub(crate) fn place_indexed<F: Fn(usize) -> bool + ?Sized>(
    cluster: &ClusterIndex<'_>,
    prox: &dyn Proximity,
    req: &GangRequest,
    is_free: &F,
    usable_at_most: Option<&[u32]>,
) -> Result<Placement, Unplaceable> {
    validate(req)?;
    let gang_size = usize::try_from(req.nodes).unwrap_or(usize::MAX);
    let mut candidates = feasible_candidates(cluster, req, is_free, usable_at_most);
    if candidates.len() < gang_size {
        return Err(not_enough_nodes(req, candidates.len()));
    }
    if gang_size > 1 {
        for candidate in &mut candidates {
            candidate.path = cluster.path(candidate.position);
        }
        assign_groups(&mut candidates);
    }

    // Every candidate's group sizes are at least 1, so for single-node gangs
    // (no paths, no groups) every candidate is eligible, as it should be.
    let eligible: Vec<usize> = match req.same {
        Some(tier) => {
            let slot = tier_slot(tier);
            let eligible: Vec<usize> = (0..candidates.len())
                .filter(|&i| candidates[i].group_sizes[slot] >= gang_size)
                .collect();
            if eligible.is_empty() {
                let largest = candidates
                    .iter()
                    .map(|c| c.group_sizes[slot])
                    .max()
                    .unwrap_or(0);
                return Err(Unplaceable::new(
                    UnplaceableKind::Topology,
                    format!(
                        "no {tier} has {} nodes with {} free {}{} (largest has {largest})",
                        req.nodes,
                        req.gpus_per_node,
                        model_name(req),
                        labels_suffix(req),
                    ),
                ));
            }
            eligible
        }
        None => {
            // Soft preference: seed from the narrowest tier that can hold the
            // whole gang, but let growth cross groups if the RTTs say so.
            match TopologyTier::ALL
                .into_iter()
                .map(tier_slot)
                .find(|&slot| candidates.iter().any(|c| c.group_sizes[slot] >= gang_size))
            {
                Some(slot) => (0..candidates.len())
                    .filter(|&i| candidates[i].group_sizes[slot] >= gang_size)
                    .collect(),
                None => (0..candidates.len()).collect(),
            }
        }
    };

    let best = if gang_size == 1 {
        // Every single node has diameter zero: pure packing decides.
        eligible
            .iter()
            .copied()
            .min_by_key(|&i| (candidates[i].leftover, candidates[i].id))
            .map(|i| Evaluated {
                seed: i,
                members: vec![i],
                diameter: 0.0,
                span: 0,
                packing: u64::from(candidates[i].leftover),
                sorted_ids: vec![candidates[i].id],
            })
    } else {
        let seeds = choose_seeds(&candidates, &eligible);
        search_from_seeds(&candidates, &seeds, gang_size, req.same, prox)
    };
    let Some(best) = best else {
        // Unreachable with eligible nodes present, but never worth a panic.
        return Err(Unplaceable::new(
            UnplaceableKind::NotEnoughNodes,
            format!("no set of {} nodes found", req.nodes),
        ));
    };

    if let Some(limit) = req.max_rtt_ms {
        if best.diameter > limit {
            return Err(Unplaceable::new(
                UnplaceableKind::Latency,
                format!(
                    "no set of {} nodes within {limit:.1} ms (closest found spans {:.1} ms)",
                    req.nodes, best.diameter
                ),
            ));
        }
    }

    let ordered = ring_order(&candidates, best.seed, &best.members, prox);
    let need = usize::try_from(req.gpus_per_node).unwrap_or(usize::MAX);
    let mut placed = Vec::with_capacity(ordered.len());
    for i in ordered {
        let candidate = &candidates[i];
        let usable = usable_gpus(cluster, candidate.position, candidate.model, is_free);
        placed.push((candidate.id, pick_gpus(&usable, need)));
    }
    Ok(Placement {
        job: req.job,
        nodes: placed,
        diameter_ms: best.diameter,
    })
}

fn validate(req: &GangRequest) -> Result<(), Unplaceable> {
    let invalid = |why: &str| {
        Err(Unplaceable::new(
            UnplaceableKind::InvalidRequest,
            format!("invalid request: {why}"),
        ))
    };
    if req.nodes == 0 {
        return invalid("a gang needs at least one node");
    }
    if req.gpus_per_node == 0 {
        return invalid("a gang needs at least one GPU per node");
    }
    if let Some(limit) = req.max_rtt_ms {
        if limit.is_nan() || limit < 0.0 {
            return invalid("max_rtt_ms must be a non-negative number");
        }
    }
    Ok(())
}

pub(crate) fn model_name(req: &GangRequest) -> &str {
    req.gpu_model.as_deref().unwrap_or("GPUs")
}

pub(crate) fn labels_suffix(req: &GangRequest) -> String {
    let mut out = String::new();
    if !req.required_labels.is_empty() {
        let labels: Vec<String> = req
            .required_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        out = format!(" labelled {}", labels.join(","));
    }
    if !req.choice.only.is_empty() {
        out.push_str(" of its --nodelist");
    } else if !req.choice.exclude.is_empty() {
        out.push_str(" outside its --exclude");
    }
    if req.choice.exclusive {
        out.push_str(", whole (--exclusive)");
    }
    out
}

fn tier_slot(tier: TopologyTier) -> usize {
    match tier {
        TopologyTier::Rack => 0,
        TopologyTier::Zone => 1,
        TopologyTier::Region => 2,
    }
}

/// How many nodes could host one member of the gang: the count a
/// [`UnplaceableKind::NotEnoughNodes`] reason reports, without building a
/// placement.
pub(crate) fn count_feasible_nodes<F: Fn(usize) -> bool + ?Sized>(
    cluster: &ClusterIndex<'_>,
    req: &GangRequest,
    is_free: &F,
    usable_at_most: Option<&[u32]>,
) -> usize {
    feasible_candidates(cluster, req, is_free, usable_at_most).len()
}

/// Hostable, correctly labelled nodes with enough usable GPUs of one model.
fn feasible_candidates<'a, F: Fn(usize) -> bool + ?Sized>(
    cluster: &ClusterIndex<'a>,
    req: &GangRequest,
    is_free: &F,
    usable_at_most: Option<&[u32]>,
) -> Vec<Candidate<'a>> {
    let need = req.gpus_per_node;
    let wanted_model = match req.gpu_model.as_deref() {
        // A model nobody has: no node qualifies.
        Some(name) => match cluster.model_ids(name) {
            ids if ids.is_empty() => return Vec::new(),
            ids => Some(ids),
        },
        None => None,
    };
    let no_position = TopologyPath {
        region: None,
        zone: None,
        rack: None,
    };
    // Reused across nodes: free GPUs per model on the node being looked at.
    let mut per_model: Vec<(u32, u32)> = Vec::new();
    let mut candidates = Vec::new();
    for (position, node) in cluster.nodes.iter().enumerate() {
        if usable_at_most.is_some_and(|bound| bound.get(position).is_some_and(|&b| b < need))
            || !cluster.hostable[position]
            || !req.choice.allows(node.id)
        {
            continue;
        }
        let gpus = cluster.gpu_range(position);
        // A whole node: none of its GPUs may be in use, whatever its model.
        if req.choice.exclusive && !gpus.clone().all(is_free) {
            continue;
        }
        let usable = |gpu: usize| cluster.shape.gpu_unique[gpu] && is_free(gpu);
        let mut total_free: u32 = 0;
        per_model.clear();
        for gpu in gpus.filter(|&gpu| usable(gpu)) {
            total_free = total_free.saturating_add(1);
            let model = cluster.shape.gpu_model[gpu];
            if wanted_model
                .as_ref()
                .is_some_and(|wanted| !wanted.contains(&model))
            {
                continue;
            }
            match per_model.iter_mut().find(|(m, _)| *m == model) {
                Some((_, count)) => *count += 1,
                None => per_model.push((model, 1)),
            }
        }
        if total_free < need {
            continue;
        }
        // Best fit: the model with the fewest free GPUs that still fits
        // keeps the larger pool intact for someone who needs it. Model ids
        // sort like model names, so ties go to the same model as by name.
        let Some(model) = per_model
            .iter()
            .filter(|&&(_, count)| count >= need)
            .min_by_key(|&&(model, count)| (count, model))
            .map(|&(model, _)| model)
        else {
            continue;
        };
        if !req
            .required_labels
            .iter()
            .all(|(key, value)| node.labels.get(key) == Some(value))
        {
            continue;
        }
        candidates.push(Candidate {
            id: node.id,
            position,
            path: no_position,
            model,
            leftover: total_free.saturating_sub(need),
            groups: [NO_GROUP; 3],
            group_sizes: [1; 3],
        });
    }
    candidates
}

/// Numbers the topology groups and counts their members. Label strings are
/// compared as rarely as possible: consecutive nodes usually share a rack, so
/// the previous node's rack is checked before the map, and wider tiers are
/// looked up once per rack (a rack's path already names its zone and region).
fn assign_groups(candidates: &mut [Candidate<'_>]) {
    for (slot, tier) in TopologyTier::ALL.into_iter().enumerate() {
        let mut ids: BTreeMap<TopologyPath<'_>, u32> = BTreeMap::new();
        let mut sizes: Vec<usize> = Vec::new();
        let mut group_of_finer: Vec<u32> = Vec::new();
        let mut previous: Option<(TopologyPath<'_>, u32)> = None;
        for candidate in candidates.iter_mut() {
            let finer = slot
                .checked_sub(1)
                .map_or(NO_GROUP, |finer_slot| candidate.groups[finer_slot]);
            let known = usize::try_from(finer)
                .ok()
                .and_then(|f| group_of_finer.get(f))
                .copied()
                .filter(|&id| id != UNSET);
            let id = match known {
                Some(id) => id,
                None => {
                    let id = match candidate.path.group(tier) {
                        None => NO_GROUP,
                        Some(group) => match previous {
                            Some((path, id)) if path == group => id,
                            _ => {
                                let next = u32::try_from(ids.len()).unwrap_or(NO_GROUP - 1);
                                let id = *ids.entry(group).or_insert(next);
                                if id == next {
                                    sizes.push(0);
                                }
                                previous = Some((group, id));
                                id
                            }
                        },
                    };
                    if let Ok(f) = usize::try_from(finer) {
                        if finer != NO_GROUP {
                            if group_of_finer.len() <= f {
                                group_of_finer.resize(f + 1, UNSET);
                            }
                            group_of_finer[f] = id;
                        }
                    }
                    id
                }
            };
            if let Some(size) = usize::try_from(id).ok().and_then(|i| sizes.get_mut(i)) {
                *size += 1;
            }
            candidate.groups[slot] = id;
        }
        for candidate in candidates.iter_mut() {
            candidate.group_sizes[slot] = usize::try_from(candidate.groups[slot])
                .ok()
                .and_then(|id| sizes.get(id).copied())
                .unwrap_or(1);
        }
    }
}

/// Not yet looked up, in `assign_groups`' per-rack cache.
const UNSET: u32 = NO_GROUP - 1;

/// True when no other GPU of the node claims the same index; duplicates make
/// "GPU 3" ambiguous, so neither copy is handed out.
fn index_is_unique(node: &NodeView, gpu: &GpuView) -> bool {
    node.gpus
        .iter()
        .filter(|other| other.index == gpu.index)
        .count()
        == 1
}

fn indices_strictly_increasing(node: &NodeView) -> bool {
    node.gpus
        .windows(2)
        .all(|pair| pair[0].index < pair[1].index)
}

fn usable_gpus<'a, F: Fn(usize) -> bool + ?Sized>(
    cluster: &ClusterIndex<'a>,
    node: usize,
    model: u32,
    is_free: &F,
) -> Vec<&'a GpuView> {
    let mut gpus: Vec<&GpuView> = cluster
        .gpu_range(node)
        .filter(|&gpu| {
            cluster.shape.gpu_model[gpu] == model && cluster.shape.gpu_unique[gpu] && is_free(gpu)
        })
        .map(|gpu| cluster.gpu(gpu))
        .collect();
    gpus.sort_by_key(|gpu| gpu.index);
    gpus
}

/// Seeds: most promising first (biggest rack, zone, region), then best packed,
/// then lowest id; one per rack before any rack gets a second, so a few big
/// racks cannot crowd out the rest of the cluster.
fn choose_seeds(candidates: &[Candidate<'_>], eligible: &[usize]) -> Vec<usize> {
    let rank = |a: &usize, b: &usize| {
        let (ca, cb) = (&candidates[*a], &candidates[*b]);
        cb.group_sizes[0]
            .cmp(&ca.group_sizes[0])
            .then(cb.group_sizes[1].cmp(&ca.group_sizes[1]))
            .then(cb.group_sizes[2].cmp(&ca.group_sizes[2]))
            .then(ca.leftover.cmp(&cb.leftover))
            .then(ca.id.cmp(&cb.id))
    };
    // The best node of each rack, in rank order, is exactly what a walk over
    // the fully ranked list taking one node per rack would pick, without
    // sorting thousands of nodes per request.
    let rack_slot = tier_slot(TopologyTier::Rack);
    let mut best_of_rack: BTreeMap<u32, usize> = BTreeMap::new();
    let mut representatives: Vec<usize> = Vec::new();
    for &i in eligible {
        match candidates[i].groups[rack_slot] {
            NO_GROUP => representatives.push(i),
            rack => {
                let best = best_of_rack.entry(rack).or_insert(i);
                if rank(&i, best).is_lt() {
                    *best = i;
                }
            }
        }
    }
    representatives.extend(best_of_rack.into_values());
    representatives.sort_by(rank);
    representatives.truncate(MAX_SEEDS);
    if representatives.len() < MAX_SEEDS {
        // Few racks: top up with the next best nodes overall. Only the top
        // 2 * MAX_SEEDS can matter, since at most MAX_SEEDS are taken already.
        let mut ranked = eligible.to_vec();
        let keep = (2 * MAX_SEEDS).min(ranked.len());
        if keep > 0 && ranked.len() > keep {
            ranked.select_nth_unstable_by(keep - 1, rank);
            ranked.truncate(keep);
        }
        ranked.sort_by(rank);
        for i in ranked {
            if representatives.len() == MAX_SEEDS {
                break;
            }
            if !representatives.contains(&i) {
                representatives.push(i);
            }
        }
    }
    representatives
}

fn diameters_equivalent(a: f64, b: f64) -> bool {
    (a - b).abs() <= DIAMETER_TOLERANCE_ABS_MS.max(DIAMETER_TOLERANCE_REL * a.max(b))
}

/// Largest diameter that [`diameters_equivalent`] could still call a tie
/// with `best`: solving `d - best <= max(abs, rel * d)` for `d`, rounded up
/// a notch so pruning never discards a tie that float rounding would accept.
fn diameter_bound(best: Option<&Evaluated>) -> f64 {
    best.map_or(f64::INFINITY, |b| {
        (b.diameter + DIAMETER_TOLERANCE_ABS_MS)
            .max(b.diameter / (1.0 - DIAMETER_TOLERANCE_REL))
            .next_up()
    })
}

fn is_better(new: &Evaluated, best: &Evaluated) -> bool {
    if !diameters_equivalent(new.diameter, best.diameter) {
        return new.diameter < best.diameter;
    }
    (new.span, new.packing, &new.sorted_ids) < (best.span, best.packing, &best.sorted_ids)
}

/// A node near the seed; ordered nearest first, then best packed, then id.
#[derive(Clone, Copy, Debug)]
struct Neighbour {
    rtt: f64,
    leftover: u32,
    id: NodeId,
    candidate: usize,
}

impl Neighbour {
    fn key_cmp(&self, other: &Neighbour) -> Ordering {
        self.rtt
            .total_cmp(&other.rtt)
            .then(self.leftover.cmp(&other.leftover))
            .then(self.id.cmp(&other.id))
    }
}

impl PartialEq for Neighbour {
    fn eq(&self, other: &Self) -> bool {
        self.key_cmp(other).is_eq()
    }
}

impl Eq for Neighbour {}

impl PartialOrd for Neighbour {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Neighbour {
    fn cmp(&self, other: &Self) -> Ordering {
        self.key_cmp(other)
    }
}

fn search_from_seeds(
    candidates: &[Candidate<'_>],
    seeds: &[usize],
    gang_size: usize,
    hard_tier: Option<TopologyTier>,
    prox: &dyn Proximity,
) -> Option<Evaluated> {
    let mut best: Option<Evaluated> = None;
    let wanted = gang_size - 1;
    // Bounded max-heap of the nearest `wanted`: most nodes are rejected by a
    // single comparison with the current worst, far cheaper than selecting
    // over every candidate.
    let mut nearest: BinaryHeap<Neighbour> = BinaryHeap::with_capacity(wanted + 1);
    // The per-seed scan touches only this compact copy, not the candidates.
    let hard_slot = hard_tier.map(tier_slot);
    let hot: Vec<(NodeId, u32, u32)> = candidates
        .iter()
        .map(|c| {
            (
                c.id,
                c.leftover,
                hard_slot.map_or(NO_GROUP, |slot| c.groups[slot]),
            )
        })
        .collect();
    for &seed in seeds {
        let seed_candidate = &candidates[seed];
        let seed_group = hard_slot.map(|slot| seed_candidate.groups[slot]);
        // A node farther from this seed than the best diameter so far cannot
        // be in a set that beats it, so it never reaches the heap.
        let bound = diameter_bound(best.as_ref());
        nearest.clear();
        for (i, &(id, leftover, group)) in hot.iter().enumerate() {
            if i == seed {
                continue;
            }
            if let Some(seed_group) = seed_group {
                if seed_group == NO_GROUP || group != seed_group {
                    continue;
                }
            }
            let rtt = match prox.rtt_ms(seed_candidate.id, id) {
                Some(rtt) if rtt.is_finite() && rtt >= 0.0 => rtt,
                _ => seed_candidate.rtt_to(&candidates[i], prox),
            };
            if rtt > bound {
                continue;
            }
            let neighbour = Neighbour {
                rtt,
                leftover,
                id,
                candidate: i,
            };
            if nearest.len() < wanted {
                nearest.push(neighbour);
            } else if let Some(mut worst) = nearest.peek_mut() {
                if neighbour < *worst {
                    *worst = neighbour;
                }
            }
        }
        if nearest.len() < wanted {
            continue;
        }
        let neighbours = std::mem::take(&mut nearest).into_sorted_vec();
        let radius = neighbours.last().map_or(0.0, |n| n.rtt);
        if radius > bound {
            continue;
        }
        let members: Vec<usize> = std::iter::once(seed)
            .chain(neighbours.iter().map(|n| n.candidate))
            .collect();
        nearest = BinaryHeap::from(neighbours);
        let Some(diameter) = diameter_within(candidates, &members, radius, bound, prox) else {
            continue;
        };
        let mut sorted_ids: Vec<NodeId> = members.iter().map(|&i| candidates[i].id).collect();
        sorted_ids.sort_unstable();
        let evaluated = Evaluated {
            seed,
            span: span_of(candidates, &members),
            packing: members
                .iter()
                .map(|&i| u64::from(candidates[i].leftover))
                .sum(),
            members,
            diameter,
            sorted_ids,
        };
        if best.as_ref().is_none_or(|b| is_better(&evaluated, b)) {
            best = Some(evaluated);
        }
    }
    best
}

/// Largest pairwise RTT among `members` (the first is the seed, whose
/// distances are already folded into `radius`), or `None` as soon as it
/// exceeds `bound`.
fn diameter_within(
    candidates: &[Candidate<'_>],
    members: &[usize],
    radius: f64,
    bound: f64,
    prox: &dyn Proximity,
) -> Option<f64> {
    let mut diameter = radius;
    for (pos, &a) in members.iter().enumerate().skip(1) {
        for &b in &members[pos + 1..] {
            let rtt = candidates[a].rtt_to(&candidates[b], prox);
            if rtt > diameter {
                diameter = rtt;
                if diameter > bound {
                    return None;
                }
            }
        }
    }
    Some(diameter)
}

fn span_of(candidates: &[Candidate<'_>], members: &[usize]) -> usize {
    let Some(&first) = members.first() else {
        return 0;
    };
    (0..TopologyTier::ALL.len())
        .find(|&slot| {
            members
                .iter()
                .all(|&m| candidates[first].same_group(&candidates[m], slot))
        })
        .unwrap_or(TopologyTier::ALL.len())
}

/// Nearest-neighbour chain from the seed: consecutive ranks end up close,
/// which is what ring all-reduce cares about.
fn ring_order(
    candidates: &[Candidate<'_>],
    seed: usize,
    members: &[usize],
    prox: &dyn Proximity,
) -> Vec<usize> {
    let mut remaining: Vec<usize> = members.iter().copied().filter(|&m| m != seed).collect();
    let mut order = Vec::with_capacity(members.len());
    order.push(seed);
    let mut last = seed;
    while !remaining.is_empty() {
        let mut best_pos = 0;
        let mut best_key = (f64::INFINITY, NodeId::MAX);
        for (pos, &m) in remaining.iter().enumerate() {
            let key = (
                candidates[last].rtt_to(&candidates[m], prox),
                candidates[m].id,
            );
            if key.0.total_cmp(&best_key.0).then(key.1.cmp(&best_key.1)) == Ordering::Less {
                best_key = key;
                best_pos = pos;
            }
        }
        last = remaining.swap_remove(best_pos);
        order.push(last);
    }
    order
}

fn nvlinked(a: &GpuView, b: &GpuView) -> bool {
    a.nvlink_peers.contains(&b.index) || b.nvlink_peers.contains(&a.index)
}

/// GPUs inside one node: a full NVLink clique if one exists, else one NUMA
/// node (the smallest that fits, to keep bigger ones whole), else the lowest
/// indices. `usable` is sorted by index and holds at least `need` entries.
fn pick_gpus(usable: &[&GpuView], need: usize) -> Vec<u32> {
    let lowest = || {
        usable
            .iter()
            .take(need)
            .map(|g| g.index)
            .collect::<Vec<u32>>()
    };
    if need <= 1 || usable.len() <= need {
        return lowest();
    }
    if let Some(clique) = find_nvlink_clique(usable, need) {
        return clique.into_iter().map(|pos| usable[pos].index).collect();
    }
    let mut by_numa: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for gpu in usable {
        if let Some(numa) = gpu.numa_node {
            by_numa.entry(numa).or_default().push(gpu.index);
        }
    }
    by_numa
        .into_values()
        .filter(|indices| indices.len() >= need)
        .min_by_key(Vec::len)
        .map(|indices| indices.into_iter().take(need).collect())
        .unwrap_or_else(lowest)
}

/// First clique of size `need` in index order, by bounded backtracking.
fn find_nvlink_clique(usable: &[&GpuView], need: usize) -> Option<Vec<usize>> {
    fn extend(
        usable: &[&GpuView],
        need: usize,
        start: usize,
        chosen: &mut Vec<usize>,
        steps: &mut usize,
    ) -> bool {
        if chosen.len() == need {
            return true;
        }
        for next in start..usable.len() {
            if usable.len() - next < need - chosen.len() {
                return false;
            }
            *steps += 1;
            if *steps > CLIQUE_SEARCH_STEP_BUDGET {
                return false;
            }
            if chosen.iter().all(|&c| nvlinked(usable[c], usable[next])) {
                chosen.push(next);
                if extend(usable, need, next + 1, chosen, steps) {
                    return true;
                }
                chosen.pop();
            }
        }
        false
    }
    let mut chosen = Vec::with_capacity(need);
    let mut steps = 0;
    extend(usable, need, 0, &mut chosen, &mut steps).then_some(chosen)
}
