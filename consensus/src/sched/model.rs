//! The cluster as the scheduler sees it: a snapshot handed in by the caller,
//! never mutated behind the caller's back.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Jobs are named by the consensus log, which hands out dense integers.
pub type JobId = u64;

/// Nodes are named by their mesh identity, shortened to an integer.
pub type NodeId = u64;

/// Label keys that describe where a node sits; anything else is free-form.
/// (`TopologyPath::of` spells them out as byte arrays for speed; a test keeps
/// the two in step.)
pub const REGION_LABEL: &str = "region";
/// See [`REGION_LABEL`].
pub const ZONE_LABEL: &str = "zone";
/// See [`REGION_LABEL`].
pub const RACK_LABEL: &str = "rack";

/// One GPU slot of a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GpuView {
    pub index: u32,
    pub model: String,
    /// `Some` means the GPU is busy, whether or not the job is known to us.
    pub allocated_to: Option<JobId>,
    pub numa_node: Option<u32>,
    /// Indices of GPUs on the same node reachable over NVLink; treated as
    /// symmetric because drivers sometimes report only one direction.
    pub nvlink_peers: Vec<u32>,
}

/// A node and its GPUs as last reported.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeView {
    pub id: NodeId,
    pub name: String,
    pub healthy: bool,
    /// Topology lives under [`REGION_LABEL`], [`ZONE_LABEL`] and [`RACK_LABEL`].
    pub labels: BTreeMap<String, String>,
    pub gpus: Vec<GpuView>,
}

/// Levels of the physical hierarchy, narrowest first so that `Ord` means
/// "looser".
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum TopologyTier {
    Rack,
    Zone,
    Region,
}

impl TopologyTier {
    /// Narrowest first: the order in which soft preferences are tried.
    pub const ALL: [TopologyTier; 3] =
        [TopologyTier::Rack, TopologyTier::Zone, TopologyTier::Region];
}

impl fmt::Display for TopologyTier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TopologyTier::Rack => "rack",
            TopologyTier::Zone => "zone",
            TopologyTier::Region => "region",
        })
    }
}

/// What a gang needs from the cluster; all of it or nothing.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct GangRequest {
    pub job: JobId,
    pub tenant: String,
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// `None` accepts any model, but all GPUs of one node still share a model.
    pub gpu_model: Option<String>,
    /// Hard constraint: every node in the same rack / zone / region.
    pub same: Option<TopologyTier>,
    /// Hard constraint on the gang's diameter (largest pairwise RTT).
    pub max_rtt_ms: Option<f64>,
    pub required_labels: BTreeMap<String, String>,
    /// Which nodes the gang may use (`--nodelist`, `--exclude`,
    /// `--exclusive`); the default is any node, shared.
    #[serde(default)]
    pub choice: NodeChoice,
}

/// A gang's say in which nodes host it, beyond its GPUs and labels.
#[derive(Clone, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct NodeChoice {
    /// Only these nodes, sorted and distinct (`-w/--nodelist`); empty: any.
    pub only: Vec<NodeId>,
    /// Never these nodes, sorted and distinct (`-x/--exclude`).
    pub exclude: Vec<NodeId>,
    /// Whole nodes (`--exclusive`): only nodes none of whose GPUs is in
    /// use, and no other job is placed on them while the gang holds them.
    pub exclusive: bool,
}

impl NodeChoice {
    /// Whether the gang may be placed on `node` at all (its GPUs aside).
    pub fn allows(&self, node: NodeId) -> bool {
        (self.only.is_empty() || self.only.binary_search(&node).is_ok())
            && self.exclude.binary_search(&node).is_err()
    }

    /// Any node, shared: what a gang without these options gets.
    pub fn is_default(&self) -> bool {
        self.only.is_empty() && self.exclude.is_empty() && !self.exclusive
    }

    /// Sorts and dedups the lists, so [`NodeChoice::allows`] may search them.
    pub fn normalized(mut self) -> Self {
        self.only.sort_unstable();
        self.only.dedup();
        self.exclude.sort_unstable();
        self.exclude.dedup();
        self
    }
}

impl GangRequest {
    /// Saturating so that absurd requests fail placement instead of overflowing.
    pub fn total_gpus(&self) -> u32 {
        self.nodes.saturating_mul(self.gpus_per_node)
    }
}

/// Whether a requested GPU model (`--gres gpu:TYPE:N`) names a node's GPU
/// model. The one rule the scheduler, the ledger's placement check and the
/// submit-time feasibility check all use:
///
/// Both names are split into tokens at `-`, `_` and whitespace and compared
/// ignoring ASCII case; a leading `NVIDIA` token (as NVML reports names) is
/// dropped from both. The request matches when its first token equals the
/// model's first token (the family: `a100` never matches `A10`) and its other
/// tokens appear, in order, among the model's other tokens. So `h100`
/// matches `H100-80GB`, `H100-SXM5-80GB` and `NVIDIA H100 80GB HBM3`;
/// `a100-80gb` matches `A100-80GB` and `A100-SXM4-80GB` but not `A100-40GB`;
/// a full name matches itself in any case. An empty request matches nothing.
pub fn gpu_model_matches(requested: &str, model: &str) -> bool {
    fn tokens(name: &str) -> impl Iterator<Item = &str> {
        let mut all = name
            .split(|c: char| c == '-' || c == '_' || c.is_whitespace())
            .filter(|t| !t.is_empty())
            .peekable();
        if all.peek().is_some_and(|t| t.eq_ignore_ascii_case("nvidia")) {
            all.next();
        }
        all
    }
    let mut wanted = tokens(requested);
    let mut have = tokens(model);
    match (wanted.next(), have.next()) {
        (Some(w), Some(h)) if w.eq_ignore_ascii_case(h) => {}
        _ => return false,
    }
    wanted.all(|w| have.any(|h| h.eq_ignore_ascii_case(w)))
}

/// Where a gang runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub job: JobId,
    /// Rank order: entry `i` hosts ranks `i * gpus_per_node ..`. Neighbouring
    /// entries are close to each other, which suits ring collectives.
    pub nodes: Vec<(NodeId, Vec<u32>)>,
    /// Largest pairwise RTT between the chosen nodes, as estimated.
    pub diameter_ms: f64,
}

impl Placement {
    pub fn total_gpus(&self) -> usize {
        self.nodes.iter().map(|(_, gpus)| gpus.len()).sum()
    }
}

/// Where a node sits, borrowed from its labels. A tier only counts as shared
/// when the label is present on both sides *and* every wider tier matches,
/// because rack names are commonly reused across zones.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct TopologyPath<'a> {
    pub region: Option<&'a str>,
    pub zone: Option<&'a str>,
    pub rack: Option<&'a str>,
}

impl<'a> TopologyPath<'a> {
    /// One walk over the labels instead of three lookups: on large clusters
    /// label reads are cache misses and dominate placement time.
    pub fn of(labels: &'a BTreeMap<String, String>) -> Self {
        let mut path = TopologyPath {
            region: None,
            zone: None,
            rack: None,
        };
        for (key, value) in labels {
            // Fixed-size array compares inline; a `match` on `&str` calls
            // memcmp for every key of every node.
            let key = key.as_bytes();
            if let Ok(four) = <[u8; 4]>::try_from(key) {
                if four == *b"zone" {
                    path.zone = Some(value);
                } else if four == *b"rack" {
                    path.rack = Some(value);
                }
            } else if <[u8; 6]>::try_from(key).is_ok_and(|six| six == *b"region") {
                path.region = Some(value);
            }
        }
        path
    }

    /// The group this node belongs to at `tier`, or `None` when the labels
    /// do not say (such a node forms a group of its own).
    pub fn group(&self, tier: TopologyTier) -> Option<TopologyPath<'a>> {
        match tier {
            TopologyTier::Rack => self.rack.map(|_| *self),
            TopologyTier::Zone => self.zone.map(|_| TopologyPath {
                rack: None,
                ..*self
            }),
            TopologyTier::Region => self.region.map(|region| TopologyPath {
                region: Some(region),
                zone: None,
                rack: None,
            }),
        }
    }

    /// Narrowest tier both paths share, if any.
    pub fn shared_tier(&self, other: &TopologyPath<'_>) -> Option<TopologyTier> {
        TopologyTier::ALL.into_iter().find(|tier| {
            let mine = self.group(*tier);
            mine.is_some() && mine == other.group(*tier)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn topology_path_reads_exactly_the_topology_labels() {
        let labels: BTreeMap<String, String> = [
            (REGION_LABEL, "eu"),
            (ZONE_LABEL, "a"),
            (RACK_LABEL, "r1"),
            ("racks", "x"),
            ("zon", "y"),
            ("regions", "z"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let path = TopologyPath::of(&labels);
        assert_eq!(path.region, Some("eu"));
        assert_eq!(path.zone, Some("a"));
        assert_eq!(path.rack, Some("r1"));
        assert_eq!(TopologyPath::of(&BTreeMap::new()).rack, None);
    }

    #[test]
    fn gpu_models_match_ignoring_case_and_by_short_names() {
        for (wanted, model) in [
            ("H100-80GB", "H100-80GB"),
            ("h100-80gb", "H100-80GB"),
            ("h100", "H100-80GB"),
            ("H100", "H100-SXM5-80GB"),
            ("h100-80gb", "H100-SXM5-80GB"),
            ("a100", "A100-40GB"),
            ("a100-80gb", "A100-80GB"),
            ("a100-80gb", "A100-SXM4-80GB"),
            ("h100", "NVIDIA H100 80GB HBM3"),
            ("nvidia-h100", "H100-80GB"),
            ("l4", "L4"),
        ] {
            assert!(
                gpu_model_matches(wanted, model),
                "{wanted} should match {model}"
            );
        }
        for (wanted, model) in [
            ("a100", "H100-80GB"),
            ("a10", "A100-80GB"),
            ("a100", "A10"),
            ("a100-80gb", "A100-40GB"),
            ("80gb", "H100-80GB"),
            ("h100-sxm5", "H100-80GB"),
            ("80gb-h100", "H100-80GB"),
            ("", "H100-80GB"),
            ("nvidia", "NVIDIA H100"),
            ("h100", ""),
        ] {
            assert!(
                !gpu_model_matches(wanted, model),
                "{wanted} should not match {model}"
            );
        }
    }

    proptest::proptest! {
        /// Every name matches itself in any case, and the family alone (its
        /// first token) matches every model of the family.
        #[test]
        fn a_model_matches_itself_and_its_family(
            tokens in proptest::collection::vec("[A-Za-z0-9]{1,6}", 1..5),
        ) {
            let model = tokens.join("-");
            proptest::prop_assume!(!tokens[0].eq_ignore_ascii_case("nvidia"));
            proptest::prop_assert!(gpu_model_matches(&model, &model));
            proptest::prop_assert!(gpu_model_matches(&model.to_lowercase(), &model.to_uppercase()));
            proptest::prop_assert!(gpu_model_matches(&tokens[0], &model));
        }

        /// A request with a token the model lacks never matches, and
        /// matching is transitive along refinements (a request matching a
        /// longer request matches whatever that one matches).
        #[test]
        fn a_request_never_matches_a_model_without_its_tokens(
            tokens in proptest::collection::vec("[a-z0-9]{1,4}", 1..5),
            extra in "[a-z]{7,9}",
        ) {
            let model = tokens.join("-");
            let wanted = format!("{model}-{extra}");
            proptest::prop_assert!(!gpu_model_matches(&wanted, &model));
            proptest::prop_assert!(gpu_model_matches(&model, &wanted) || tokens[0] == "nvidia");
        }
    }
}
