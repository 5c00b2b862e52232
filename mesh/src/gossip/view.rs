//! [`CapacityView`]: a pure, seq-monotonic map of the latest advert per node.
//!
//! The gossip task already drops stale adverts before emitting events, but the
//! view re-checks seq itself so it stays correct when fed from several sources
//! (own adverts, a snapshot, replays) in any order.

use std::collections::BTreeMap;

use libp2p::PeerId;

use super::wire::CapacityAdvert;
use super::GossipEvent;

/// The latest advert known for one node, with the peer that authored it.
#[derive(Debug, Clone, PartialEq)]
pub struct ViewEntry {
    /// Signed author of the advert (the publisher's libp2p identity).
    pub from: PeerId,
    /// The advert itself.
    pub advert: CapacityAdvert,
}

/// What [`CapacityView::apply`] did with an advert.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ViewUpdate {
    /// First advert seen for this node.
    Inserted,
    /// Replaced an older advert.
    Replaced {
        /// Seq of the advert that was replaced.
        previous_seq: u64,
    },
    /// Ignored: seq was not newer than what the view already holds.
    Stale {
        /// Seq the view keeps.
        current_seq: u64,
    },
    /// The event carried no advert.
    NotAnAdvert,
}

impl ViewUpdate {
    /// Whether the view changed.
    pub fn changed(self) -> bool {
        matches!(self, ViewUpdate::Inserted | ViewUpdate::Replaced { .. })
    }
}

/// Latest capacity advert per `node_id`, as believed by one node.
#[derive(Debug, Clone, Default)]
pub struct CapacityView {
    entries: BTreeMap<u64, ViewEntry>,
}

impl CapacityView {
    /// An empty view.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies a gossip event; only [`GossipEvent::Capacity`] changes the view.
    pub fn apply_event(&mut self, event: &GossipEvent) -> ViewUpdate {
        match event {
            GossipEvent::Capacity { from, advert } => self.apply(*from, advert.clone()),
            _ => ViewUpdate::NotAnAdvert,
        }
    }

    /// Applies one advert (e.g. the node's own, which gossip does not echo back).
    pub fn apply(&mut self, from: PeerId, advert: CapacityAdvert) -> ViewUpdate {
        match self.entries.get_mut(&advert.node_id) {
            Some(entry) if advert.seq <= entry.advert.seq => ViewUpdate::Stale {
                current_seq: entry.advert.seq,
            },
            Some(entry) => {
                let previous_seq = entry.advert.seq;
                *entry = ViewEntry { from, advert };
                ViewUpdate::Replaced { previous_seq }
            }
            None => {
                self.entries
                    .insert(advert.node_id, ViewEntry { from, advert });
                ViewUpdate::Inserted
            }
        }
    }

    /// Latest advert for `node_id`.
    pub fn get(&self, node_id: u64) -> Option<&CapacityAdvert> {
        self.entries.get(&node_id).map(|e| &e.advert)
    }

    /// Latest advert for `node_id`, with its author.
    pub fn entry(&self, node_id: u64) -> Option<&ViewEntry> {
        self.entries.get(&node_id)
    }

    /// Seq of the latest advert for `node_id`.
    pub fn seq(&self, node_id: u64) -> Option<u64> {
        self.get(node_id).map(|a| a.seq)
    }

    /// Free GPUs of `model` on `node_id` as last advertised (0 if the node
    /// advertised but does not list the model; `None` if never heard of).
    pub fn gpus_free(&self, node_id: u64, model: &str) -> Option<u32> {
        self.get(node_id)
            .map(|a| a.gpus_free_by_model.get(model).copied().unwrap_or(0))
    }

    /// Forgets a node (e.g. after it left the ledger).
    pub fn remove(&mut self, node_id: u64) -> Option<ViewEntry> {
        self.entries.remove(&node_id)
    }

    /// All entries, ordered by node id.
    pub fn iter(&self) -> impl Iterator<Item = (u64, &ViewEntry)> {
        self.entries.iter().map(|(id, e)| (*id, e))
    }

    /// Number of nodes in the view.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the view is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn advert(node_id: u64, seq: u64, free: u32) -> CapacityAdvert {
        CapacityAdvert {
            node_id,
            seq,
            gpus_free_by_model: BTreeMap::from([("H100".to_string(), free)]),
            gpus_total: 8,
            healthy: true,
            load: 0.5,
            job_util: BTreeMap::new(),
            coordinate: None,
            sent_at_ms: 0,
        }
    }

    #[test]
    fn keeps_highest_seq_only() {
        let peer = PeerId::random();
        let mut view = CapacityView::new();
        assert_eq!(view.apply(peer, advert(1, 5, 2)), ViewUpdate::Inserted);
        assert_eq!(
            view.apply(peer, advert(1, 5, 9)),
            ViewUpdate::Stale { current_seq: 5 }
        );
        assert_eq!(
            view.apply(peer, advert(1, 3, 9)),
            ViewUpdate::Stale { current_seq: 5 }
        );
        assert_eq!(view.gpus_free(1, "H100"), Some(2));
        assert_eq!(
            view.apply(peer, advert(1, 6, 4)),
            ViewUpdate::Replaced { previous_seq: 5 }
        );
        assert_eq!(view.gpus_free(1, "H100"), Some(4));
        assert_eq!(view.gpus_free(1, "A10"), Some(0));
        assert_eq!(view.gpus_free(2, "H100"), None);
        assert_eq!(view.len(), 1);
    }

    #[test]
    fn applies_only_capacity_events() {
        let peer = PeerId::random();
        let mut view = CapacityView::new();
        let hb = GossipEvent::Heartbeat {
            from: peer,
            node_id: 1,
            seq: 1,
            sent_at_ms: 0,
        };
        assert_eq!(view.apply_event(&hb), ViewUpdate::NotAnAdvert);
        let cap = GossipEvent::Capacity {
            from: peer,
            advert: advert(3, 1, 1),
        };
        assert!(view.apply_event(&cap).changed());
        assert_eq!(view.entry(3).map(|e| e.from), Some(peer));
    }
}
