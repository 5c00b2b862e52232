//! Network distance between nodes. The mesh will answer from Vivaldi
//! coordinates; the scheduler only needs "how far apart", so it depends on a
//! trait and falls back to topology labels wherever the estimate is missing.

use std::collections::BTreeMap;

use super::model::{NodeId, NodeView, TopologyPath, TopologyTier};

/// Estimated round-trip time between two nodes.
pub trait Proximity {
    /// `None` when nothing is known yet (e.g. a node that just joined); the
    /// scheduler then estimates from labels instead of guessing zero.
    fn rtt_ms(&self, a: NodeId, b: NodeId) -> Option<f64>;
}

/// Typical RTTs by the narrowest shared tier; coarse on purpose, they only
/// need to rank candidates the way the real network would.
pub const SAME_RACK_RTT_MS: f64 = 0.1;
/// See [`SAME_RACK_RTT_MS`].
pub const SAME_ZONE_RTT_MS: f64 = 1.0;
/// See [`SAME_RACK_RTT_MS`].
pub const SAME_REGION_RTT_MS: f64 = 10.0;
/// See [`SAME_RACK_RTT_MS`].
pub const DISTANT_RTT_MS: f64 = 100.0;

pub(crate) fn rtt_from_paths(a: &TopologyPath<'_>, b: &TopologyPath<'_>) -> f64 {
    match a.shared_tier(b) {
        Some(TopologyTier::Rack) => SAME_RACK_RTT_MS,
        Some(TopologyTier::Zone) => SAME_ZONE_RTT_MS,
        Some(TopologyTier::Region) => SAME_REGION_RTT_MS,
        None => DISTANT_RTT_MS,
    }
}

/// RTT between two nodes: the proximity source when it has a usable answer,
/// the label estimate otherwise. Negative or non-finite answers are treated as
/// unknown so that one bad coordinate cannot pull a gang across the world.
pub(crate) fn rtt_or_estimate(
    prox: &dyn Proximity,
    (a, a_path): (NodeId, &TopologyPath<'_>),
    (b, b_path): (NodeId, &TopologyPath<'_>),
) -> f64 {
    if a == b {
        return 0.0;
    }
    match prox.rtt_ms(a, b) {
        Some(rtt) if rtt.is_finite() && rtt >= 0.0 => rtt,
        _ => rtt_from_paths(a_path, b_path),
    }
}

/// Interned location so that lookups compare integers, not strings: the
/// placement hot loop calls `rtt_ms` tens of thousands of times. A missing
/// label gets an id of its own, so it never matches anything and the
/// comparison needs no `Option`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct InternedPath {
    region: u32,
    zone: u32,
    rack: u32,
}

/// Marks an empty slot of the dense table (an id no node has). Interned ids
/// stop below `u32::MAX`, so checking `region` alone is enough.
const UNKNOWN_NODE: InternedPath = InternedPath {
    region: u32::MAX,
    zone: u32::MAX,
    rack: u32::MAX,
};

/// Label-based estimate for clusters (or moments) without coordinates.
#[derive(Clone, Debug, Default)]
pub struct TopologyProximity {
    /// Sorted by node id; the first view wins when ids repeat.
    paths: Vec<(NodeId, InternedPath)>,
    /// Direct index by id when ids are dense enough, which they usually are;
    /// a binary search per lookup dominated placement time otherwise.
    dense: Vec<InternedPath>,
}

/// Dense lookup is used while it costs at most this many slots per node.
const DENSE_SLOTS_PER_NODE: u64 = 4;

impl TopologyProximity {
    pub fn new(nodes: &[NodeView]) -> Self {
        // Interning the full prefix keeps "rack r1 in zone a" distinct from
        // "rack r1 in zone b" while comparing a single integer per tier.
        struct Interner<'n> {
            ids: BTreeMap<TopologyPath<'n>, u32>,
            next: u32,
        }
        impl<'n> Interner<'n> {
            fn id(&mut self, group: Option<TopologyPath<'n>>) -> u32 {
                let fresh = self.next;
                // u32::MAX is reserved for UNKNOWN_NODE.
                self.next = self.next.saturating_add(1).min(u32::MAX - 1);
                match group {
                    Some(group) => *self.ids.entry(group).or_insert(fresh),
                    None => fresh,
                }
            }
        }
        let mut interner = Interner {
            ids: BTreeMap::new(),
            next: 0,
        };
        let mut paths: Vec<(NodeId, InternedPath)> = nodes
            .iter()
            .map(|node| {
                let path = TopologyPath::of(&node.labels);
                let interned_path = InternedPath {
                    region: interner.id(path.group(TopologyTier::Region)),
                    zone: interner.id(path.group(TopologyTier::Zone)),
                    rack: interner.id(path.group(TopologyTier::Rack)),
                };
                (node.id, interned_path)
            })
            .collect();
        paths.sort_by_key(|(id, _)| *id);
        paths.dedup_by_key(|(id, _)| *id);
        let max_id = paths.last().map_or(0, |(id, _)| *id);
        let budget = (paths.len() as u64)
            .saturating_mul(DENSE_SLOTS_PER_NODE)
            .saturating_add(1024);
        let mut dense = Vec::new();
        if max_id < budget {
            dense = vec![UNKNOWN_NODE; usize::try_from(max_id).map_or(0, |max| max + 1)];
            for (id, path) in &paths {
                if let Some(slot) = usize::try_from(*id).ok().and_then(|i| dense.get_mut(i)) {
                    *slot = *path;
                }
            }
        }
        TopologyProximity { paths, dense }
    }

    fn path(&self, id: NodeId) -> Option<InternedPath> {
        if !self.dense.is_empty() {
            return usize::try_from(id)
                .ok()
                .and_then(|i| self.dense.get(i))
                .copied()
                .filter(|path| path.region != UNKNOWN_NODE.region);
        }
        self.paths
            .binary_search_by_key(&id, |(node, _)| *node)
            .ok()
            .and_then(|pos| self.paths.get(pos))
            .map(|(_, path)| *path)
    }
}

impl Proximity for TopologyProximity {
    fn rtt_ms(&self, a: NodeId, b: NodeId) -> Option<f64> {
        if a == b {
            return Some(0.0);
        }
        let (pa, pb) = (self.path(a)?, self.path(b)?);
        Some(if pa.rack == pb.rack {
            SAME_RACK_RTT_MS
        } else if pa.zone == pb.zone {
            SAME_ZONE_RTT_MS
        } else if pa.region == pb.region {
            SAME_REGION_RTT_MS
        } else {
            DISTANT_RTT_MS
        })
    }
}

/// Explicit RTT table, for tests and simulations that want a specific network.
/// Symmetric: setting `(a, b)` also answers `(b, a)`.
#[derive(Clone, Debug, Default)]
pub struct MatrixProximity {
    rtts: BTreeMap<(NodeId, NodeId), f64>,
    /// Answer for pairs not in the table; `None` exercises the label fallback.
    default_ms: Option<f64>,
}

impl MatrixProximity {
    pub fn new(default_ms: Option<f64>) -> Self {
        MatrixProximity {
            rtts: BTreeMap::new(),
            default_ms,
        }
    }

    pub fn set(&mut self, a: NodeId, b: NodeId, rtt_ms: f64) -> &mut Self {
        self.rtts.insert((a.min(b), a.max(b)), rtt_ms);
        self
    }
}

impl Proximity for MatrixProximity {
    fn rtt_ms(&self, a: NodeId, b: NodeId) -> Option<f64> {
        if a == b {
            return Some(0.0);
        }
        self.rtts
            .get(&(a.min(b), a.max(b)))
            .copied()
            .or(self.default_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn effective_rtt_ms(prox: &dyn Proximity, a: &NodeView, b: &NodeView) -> f64 {
        rtt_or_estimate(
            prox,
            (a.id, &TopologyPath::of(&a.labels)),
            (b.id, &TopologyPath::of(&b.labels)),
        )
    }

    fn node(id: NodeId, region: &str, zone: &str, rack: &str) -> NodeView {
        NodeView {
            id,
            name: format!("n{id}"),
            healthy: true,
            labels: [("region", region), ("zone", zone), ("rack", rack)]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            gpus: Vec::new(),
        }
    }

    #[test]
    fn topology_estimate_follows_the_narrowest_shared_tier() {
        let nodes = [
            node(1, "eu", "a", "r1"),
            node(2, "eu", "a", "r1"),
            node(3, "eu", "a", "r2"),
            node(4, "eu", "b", "r1"),
            node(5, "us", "a", "r1"),
        ];
        let prox = TopologyProximity::new(&nodes);
        assert_eq!(prox.rtt_ms(1, 2), Some(SAME_RACK_RTT_MS));
        assert_eq!(prox.rtt_ms(1, 3), Some(SAME_ZONE_RTT_MS));
        // Same rack name in another zone is a different rack.
        assert_eq!(prox.rtt_ms(1, 4), Some(SAME_REGION_RTT_MS));
        assert_eq!(prox.rtt_ms(1, 5), Some(DISTANT_RTT_MS));
        assert_eq!(prox.rtt_ms(1, 99), None);
        assert_eq!(prox.rtt_ms(3, 3), Some(0.0));
        // The label fallback agrees with the interned implementation.
        for a in &nodes {
            for b in &nodes {
                assert_eq!(
                    Some(effective_rtt_ms(&MatrixProximity::new(None), a, b)),
                    prox.rtt_ms(a.id, b.id)
                );
            }
        }
    }

    #[test]
    fn unusable_answers_fall_back_to_labels() {
        let (a, b) = (node(1, "eu", "a", "r1"), node(2, "eu", "a", "r1"));
        let mut prox = MatrixProximity::new(None);
        prox.set(1, 2, f64::NAN);
        assert_eq!(effective_rtt_ms(&prox, &a, &b), SAME_RACK_RTT_MS);
        prox.set(2, 1, -3.0);
        assert_eq!(effective_rtt_ms(&prox, &a, &b), SAME_RACK_RTT_MS);
        prox.set(1, 2, 7.5);
        assert_eq!(effective_rtt_ms(&prox, &b, &a), 7.5);
    }
}
