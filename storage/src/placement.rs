//! Failure-domain-aware replica placement by rendezvous (highest-random-weight)
//! hashing. Pure functions: no I/O, no clocks, no randomness — every node computes
//! the same answer from the same membership view.
//!
//! # Algorithm
//!
//! Every eligible node (alive, and with room) gets a score `BLAKE3(domain ‖ BLAKE3(key) ‖
//! node_id)` truncated to 64 bits. Nodes are ranked by score (ties broken by id), and
//! replicas are picked in rank order in three passes:
//!
//! 1. the best node of each not-yet-used **zone**;
//! 2. the best node of each not-yet-used **rack** (a rack is `(zone, rack)`, since rack
//!    names are only unique within a zone);
//! 3. the best remaining nodes.
//!
//! Nodes without a zone (or rack) share one "unknown" domain, so missing topology
//! degrades to plain HRW instead of being mistaken for diversity. The result is in pick
//! order: the first node is the highest-scoring node overall (the natural primary).
//!
//! # Stability
//!
//! Each pass is a scan of one fixed ranking that skips nodes whose domain is already
//! used. Removing a node that was *not* picked for a key does not change any earlier
//! decision in any pass, so the key's replica set is unchanged: only keys held by the
//! removed node move. Symmetrically, adding a node changes a key's set only if the new
//! node is picked for it, which happens for about `n / (N + 1)` of keys.

use serde::{Deserialize, Serialize};

/// Domain separation so placement scores never collide with chunk ids.
const HRW_DOMAIN: &[u8; 16] = b"shoal-hrw-v1\0\0\0\0";

/// A node as seen by placement.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: u64,
    /// Failure zone (e.g. datacenter / availability zone); `None` = unknown.
    pub zone: Option<String>,
    /// Rack (power / top-of-rack switch domain) within the zone; `None` = unknown.
    pub rack: Option<String>,
    /// Whether the node is currently reachable. Dead nodes are never chosen.
    pub alive: bool,
    /// Bytes the node can still accept; `None` = unknown (assumed to have room).
    pub free_bytes: Option<u64>,
}

impl NodeInfo {
    /// An alive node with no topology or capacity information.
    pub fn new(id: u64) -> Self {
        NodeInfo {
            id,
            zone: None,
            rack: None,
            alive: true,
            free_bytes: None,
        }
    }

    /// Builder: set zone and rack.
    pub fn in_domain(mut self, zone: impl Into<String>, rack: impl Into<String>) -> Self {
        self.zone = Some(zone.into());
        self.rack = Some(rack.into());
        self
    }

    fn has_room_for(&self, needed_bytes: u64) -> bool {
        // A node reporting 0 free bytes is full even for a size-unknown (0) request.
        self.free_bytes
            .is_none_or(|free| free > 0 && free >= needed_bytes)
    }
}

/// Rendezvous score of `node` for a key whose BLAKE3 digest is `key_digest`.
pub fn hrw_score(key_digest: &[u8; 32], node: u64) -> u64 {
    let mut input = [0u8; 56];
    input[..16].copy_from_slice(HRW_DOMAIN);
    input[16..48].copy_from_slice(key_digest);
    input[48..].copy_from_slice(&node.to_le_bytes());
    let hash = blake3::hash(&input);
    let bytes = hash.as_bytes();
    u64::from_le_bytes([
        bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7],
    ])
}

/// Chooses up to `n` distinct nodes for `key` (a chunk id's bytes, an object name, ...),
/// spreading across zones, then racks. Skips dead nodes and nodes reporting no free
/// space. Returns fewer than `n` only if fewer nodes are eligible.
pub fn place_replicas(key: &[u8], nodes: &[NodeInfo], n: usize) -> Vec<u64> {
    place_replicas_sized(key, nodes, n, 0)
}

/// [`place_replicas`] that also skips nodes whose known `free_bytes` is below
/// `needed_bytes`.
pub fn place_replicas_sized(
    key: &[u8],
    nodes: &[NodeInfo],
    n: usize,
    needed_bytes: u64,
) -> Vec<u64> {
    let digest = *blake3::hash(key).as_bytes();
    let mut ranked: Vec<(u64, &NodeInfo)> = nodes
        .iter()
        .filter(|node| node.alive && node.has_room_for(needed_bytes))
        .map(|node| (hrw_score(&digest, node.id), node))
        .collect();
    ranked.sort_unstable_by(|a, b| b.0.cmp(&a.0).then(a.1.id.cmp(&b.1.id)));
    ranked.dedup_by_key(|(_, node)| node.id);

    let mut picked: Vec<&NodeInfo> = Vec::with_capacity(n);
    let zone_of = |node: &NodeInfo| node.zone.clone();
    let rack_of = |node: &NodeInfo| (node.zone.clone(), node.rack.clone());
    // Pass 1: one node per zone.
    pick_new_domains(&ranked, &mut picked, n, zone_of);
    // Pass 2: one node per rack.
    pick_new_domains(&ranked, &mut picked, n, rack_of);
    // Pass 3: anything left, best score first.
    for (_, node) in &ranked {
        if picked.len() >= n {
            break;
        }
        if !picked.iter().any(|chosen| chosen.id == node.id) {
            picked.push(node);
        }
    }
    picked.into_iter().map(|node| node.id).collect()
}

fn pick_new_domains<'a, D: PartialEq>(
    ranked: &[(u64, &'a NodeInfo)],
    picked: &mut Vec<&'a NodeInfo>,
    n: usize,
    domain_of: impl Fn(&NodeInfo) -> D,
) {
    let mut used: Vec<D> = picked.iter().map(|node| domain_of(node)).collect();
    for (_, node) in ranked {
        if picked.len() >= n {
            return;
        }
        if picked.iter().any(|chosen| chosen.id == node.id) {
            continue;
        }
        let domain = domain_of(node);
        if !used.contains(&domain) {
            used.push(domain);
            picked.push(node);
        }
    }
}

/// What to do to bring a key's replicas back to its placement.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepairPlan {
    /// Alive current holders to read from, best first. Empty when nothing needs copying.
    pub copy_from: Vec<u64>,
    /// Nodes that should receive a copy.
    pub copy_to: Vec<u64>,
    /// Alive holders outside the target placement; delete their copy only *after*
    /// every `copy_to` transfer has succeeded.
    pub drop: Vec<u64>,
}

impl RepairPlan {
    /// True when no data needs to move.
    pub fn is_noop(&self) -> bool {
        self.copy_to.is_empty() && self.drop.is_empty()
    }

    /// True when copies are needed but no alive holder exists to copy from.
    pub fn is_unrecoverable(&self) -> bool {
        !self.copy_to.is_empty() && self.copy_from.is_empty()
    }
}

/// Plans re-replication of `key` given who holds it now.
///
/// The target is [`place_replicas`] over the current membership, except that alive
/// current holders are treated as having room (they already store the data), so a
/// full node is not asked to give up a copy it holds. Holders that are dead or not in
/// `nodes` are simply no longer counted. When the holders already match the target, the
/// plan is empty: no data moves.
pub fn repair_plan(
    key: &[u8],
    current_holders: &[u64],
    nodes: &[NodeInfo],
    n: usize,
) -> RepairPlan {
    let is_alive_holder = |node: &NodeInfo| node.alive && current_holders.contains(&node.id);
    let adjusted: Vec<NodeInfo> = nodes
        .iter()
        .map(|node| {
            if is_alive_holder(node) {
                NodeInfo {
                    free_bytes: None,
                    ..node.clone()
                }
            } else {
                node.clone()
            }
        })
        .collect();
    let target = place_replicas(key, &adjusted, n);
    let digest = *blake3::hash(key).as_bytes();
    let mut alive_holders: Vec<u64> = nodes
        .iter()
        .filter(|node| is_alive_holder(node))
        .map(|node| node.id)
        .collect();
    alive_holders.sort_unstable();
    alive_holders.dedup();
    let copy_to: Vec<u64> = target
        .iter()
        .copied()
        .filter(|id| !alive_holders.contains(id))
        .collect();
    let drop: Vec<u64> = alive_holders
        .iter()
        .copied()
        .filter(|id| !target.contains(id))
        .collect();
    let copy_from = if copy_to.is_empty() {
        Vec::new()
    } else {
        let mut sources = alive_holders;
        sources.sort_unstable_by_key(|id| std::cmp::Reverse(hrw_score(&digest, *id)));
        sources
    };
    RepairPlan {
        copy_from,
        copy_to,
        drop,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zoned(count: u64, zones: u64, racks_per_zone: u64) -> Vec<NodeInfo> {
        (0..count)
            .map(|id| {
                NodeInfo::new(id).in_domain(
                    format!("z{}", id % zones),
                    format!("r{}", (id / zones) % racks_per_zone),
                )
            })
            .collect()
    }

    #[test]
    fn picks_distinct_nodes_in_distinct_zones() {
        let nodes = zoned(12, 4, 3);
        for key in 0..200u32 {
            let picked = place_replicas(&key.to_le_bytes(), &nodes, 3);
            assert_eq!(picked.len(), 3);
            let zones: std::collections::BTreeSet<_> = picked.iter().map(|id| id % 4).collect();
            assert_eq!(zones.len(), 3, "key {key}: {picked:?}");
        }
    }

    #[test]
    fn too_few_eligible_nodes_returns_what_exists() {
        let mut nodes = zoned(3, 1, 1);
        nodes[1].alive = false;
        nodes[2].free_bytes = Some(0);
        assert_eq!(place_replicas(b"k", &nodes, 3), vec![0]);
        assert!(place_replicas(b"k", &[], 3).is_empty());
    }

    #[test]
    fn sized_placement_skips_small_nodes() {
        let mut nodes = zoned(6, 3, 1);
        for node in &mut nodes[..3] {
            node.free_bytes = Some(100);
        }
        let picked = place_replicas_sized(b"big", &nodes, 3, 1_000);
        assert!(picked.iter().all(|id| *id >= 3), "{picked:?}");
    }

    #[test]
    fn repair_is_noop_when_nothing_changed_and_fills_lost_holder() {
        let nodes = zoned(9, 3, 3);
        let holders = place_replicas(b"chunk", &nodes, 3);
        assert!(repair_plan(b"chunk", &holders, &nodes, 3).is_noop());

        let mut degraded = nodes.clone();
        let lost = holders[1];
        if let Some(node) = degraded.iter_mut().find(|node| node.id == lost) {
            node.alive = false;
        }
        let plan = repair_plan(b"chunk", &holders, &degraded, 3);
        assert_eq!(plan.copy_to.len(), 1);
        assert!(!holders.contains(&plan.copy_to[0]));
        assert!(plan.drop.is_empty());
        assert_eq!(plan.copy_from.len(), 2);
        assert!(!plan.copy_from.contains(&lost));
        assert!(!plan.is_unrecoverable());

        let all_dead: Vec<NodeInfo> = nodes
            .iter()
            .map(|node| NodeInfo {
                alive: !holders.contains(&node.id),
                ..node.clone()
            })
            .collect();
        assert!(repair_plan(b"chunk", &holders, &all_dead, 3).is_unrecoverable());
    }

    #[test]
    fn full_holder_keeps_its_copy() {
        let mut nodes = zoned(9, 3, 3);
        let holders = place_replicas(b"chunk", &nodes, 3);
        for node in &mut nodes {
            if node.id == holders[0] {
                node.free_bytes = Some(0);
            }
        }
        assert!(repair_plan(b"chunk", &holders, &nodes, 3).is_noop());
    }

    #[test]
    fn extra_holder_is_dropped_after_copies() {
        let nodes = zoned(9, 3, 3);
        let target = place_replicas(b"k", &nodes, 3);
        let stray = (0..9).find(|id| !target.contains(id)).expect("stray");
        let mut holders = target.clone();
        holders.push(stray);
        let plan = repair_plan(b"k", &holders, &nodes, 3);
        assert!(plan.copy_to.is_empty());
        assert_eq!(plan.drop, vec![stray]);
    }
}
