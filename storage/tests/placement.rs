//! Placement properties: distinctness, domain spreading, liveness, minimal movement.

use std::collections::BTreeSet;

use proptest::prelude::*;
use shoal_storage::placement::{place_replicas, place_replicas_sized, NodeInfo};

fn topology(count: u64, zones: u64, racks: u64) -> Vec<NodeInfo> {
    (0..count)
        .map(|id| {
            NodeInfo::new(id * 7 + 1).in_domain(
                format!("zone-{}", id % zones),
                format!("rack-{}", (id / zones) % racks),
            )
        })
        .collect()
}

fn keys(count: u32) -> Vec<[u8; 4]> {
    (0..count).map(u32::to_le_bytes).collect()
}

fn node_strategy() -> impl Strategy<Value = Vec<NodeInfo>> {
    prop::collection::vec(
        (
            0u8..5,
            prop::option::of(0u8..3),
            prop::bool::weighted(0.85),
            prop::option::weighted(0.2, 0u64..2),
        ),
        2..30,
    )
    .prop_map(|specs| {
        specs
            .into_iter()
            .enumerate()
            .map(|(index, (zone, rack, alive, free))| NodeInfo {
                id: index as u64 * 1_000_003 + 11,
                zone: Some(format!("z{zone}")),
                rack: rack.map(|r| format!("r{r}")),
                alive,
                free_bytes: free,
            })
            .collect()
    })
}

fn eligible(nodes: &[NodeInfo]) -> Vec<&NodeInfo> {
    nodes
        .iter()
        .filter(|node| node.alive && node.free_bytes != Some(0))
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn picks_are_distinct_alive_and_zone_spread(nodes in node_strategy(), n in 1usize..5) {
        let eligible = eligible(&nodes);
        let eligible_zones: BTreeSet<_> = eligible.iter().map(|node| node.zone.clone()).collect();
        for key in keys(50) {
            let picked = place_replicas(&key, &nodes, n);
            prop_assert_eq!(picked.len(), n.min(eligible.len()));
            let distinct: BTreeSet<_> = picked.iter().collect();
            prop_assert_eq!(distinct.len(), picked.len());
            for id in &picked {
                prop_assert!(eligible.iter().any(|node| node.id == *id), "ineligible node {} picked", id);
            }
            let picked_zones: BTreeSet<_> = picked
                .iter()
                .filter_map(|id| nodes.iter().find(|node| node.id == *id))
                .map(|node| node.zone.clone())
                .collect();
            // As many distinct zones as possible: all n if ≥ n zones exist, else every zone.
            prop_assert_eq!(picked_zones.len(), n.min(eligible_zones.len()).min(picked.len()));
        }
    }

    #[test]
    fn removing_a_node_moves_only_its_keys(nodes in node_strategy(), n in 1usize..5, victim in any::<prop::sample::Index>()) {
        let removed = nodes[victim.index(nodes.len())].id;
        let remaining: Vec<NodeInfo> = nodes.iter().filter(|node| node.id != removed).cloned().collect();
        for key in keys(50) {
            let before = place_replicas(&key, &nodes, n);
            let after = place_replicas(&key, &remaining, n);
            if !before.contains(&removed) {
                prop_assert_eq!(&before, &after, "key {:?} moved though node {} did not hold it", key, removed);
            }
            // Adding it back is the mirror image: the key either returns to its old set
            // or the added node is in the new set.
            prop_assert!(before == after || before.contains(&removed));
        }
    }
}

/// Measures movement on a 40-node, 5-zone × 2-rack cluster with 3 replicas.
#[test]
fn movement_on_removal_and_addition_is_minimal() {
    const KEYS: u32 = 10_000;
    const REPLICAS: usize = 3;
    let nodes = topology(40, 5, 2);
    let before: Vec<Vec<u64>> = keys(KEYS)
        .iter()
        .map(|key| place_replicas(key, &nodes, REPLICAS))
        .collect();

    // Removal of one node.
    let removed = nodes[17].id;
    let remaining: Vec<NodeInfo> = nodes
        .iter()
        .filter(|node| node.id != removed)
        .cloned()
        .collect();
    let mut keys_moved = 0;
    for (key, old) in keys(KEYS).iter().zip(&before) {
        let new = place_replicas(key, &remaining, REPLICAS);
        if &new != old {
            keys_moved += 1;
            assert!(
                old.contains(&removed),
                "only keys held by the removed node may move"
            );
        }
    }
    let removal_fraction = f64::from(keys_moved) / f64::from(KEYS);
    let expected = REPLICAS as f64 / 40.0;
    println!("removal: {removal_fraction:.4} of keys moved (expected ≈ n/N = {expected:.4})");
    assert!(
        (expected * 0.7..=expected * 1.3).contains(&removal_fraction),
        "removal moved {removal_fraction}"
    );

    // Addition of one node (in an existing zone/rack).
    let mut grown = nodes.clone();
    grown.push(NodeInfo::new(999_999).in_domain("zone-2", "rack-1"));
    let mut keys_changed = 0;
    let mut slots_changed = 0usize;
    for (key, old) in keys(KEYS).iter().zip(&before) {
        let new = place_replicas(key, &grown, REPLICAS);
        if &new != old {
            keys_changed += 1;
            assert!(
                new.contains(&999_999),
                "a key may only move onto the new node"
            );
            slots_changed += new.iter().filter(|id| !old.contains(id)).count();
        }
    }
    let key_fraction = f64::from(keys_changed) / f64::from(KEYS);
    let slot_fraction = slots_changed as f64 / (f64::from(KEYS) * REPLICAS as f64);
    let expected_slots = 1.0 / 41.0;
    println!(
        "addition: {key_fraction:.4} of keys changed, {slot_fraction:.4} of replica slots moved \
         (expected ≈ 1/(N+1) = {expected_slots:.4})"
    );
    assert!(
        (expected_slots * 0.7..=expected_slots * 1.3).contains(&slot_fraction),
        "addition moved {slot_fraction} of slots"
    );
}

#[test]
fn load_is_balanced_across_nodes() {
    let nodes = topology(12, 3, 2);
    let mut counts = std::collections::BTreeMap::new();
    for key in keys(12_000) {
        for id in place_replicas(&key, &nodes, 3) {
            *counts.entry(id).or_insert(0u32) += 1;
        }
    }
    // 36,000 replicas over 12 nodes = 3,000 each; HRW should be within ±10 %.
    for (id, count) in counts {
        assert!((2700..=3300).contains(&count), "node {id} got {count}");
    }
}

#[test]
fn rack_spreading_when_zones_run_out() {
    // Two zones, two racks each, n = 3: two zones, and the third replica on a fresh rack.
    let nodes = topology(16, 2, 2);
    for key in keys(300) {
        let picked = place_replicas(&key, &nodes, 3);
        let domains: BTreeSet<_> = picked
            .iter()
            .filter_map(|id| nodes.iter().find(|node| node.id == *id))
            .map(|node| (node.zone.clone(), node.rack.clone()))
            .collect();
        assert_eq!(domains.len(), 3, "{picked:?}");
    }
}

#[test]
fn dead_and_full_nodes_are_never_chosen() {
    let mut nodes = topology(20, 4, 2);
    for node in nodes.iter_mut().step_by(3) {
        node.alive = false;
    }
    for node in nodes.iter_mut().skip(1).step_by(5) {
        node.free_bytes = Some(10);
    }
    for key in keys(500) {
        for id in place_replicas_sized(&key, &nodes, 3, 100) {
            let node = nodes.iter().find(|node| node.id == id).expect("known node");
            assert!(node.alive);
            assert_ne!(node.free_bytes, Some(10));
        }
    }
}
