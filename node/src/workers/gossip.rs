//! The node's side of the gossip (libp2p, `shoal_mesh::gossip`): keeps the
//! gossip membership in step with the ledger, publishes capacity adverts,
//! and feeds what arrives into this node's
//! [`PeerView`](crate::peers::PeerView). Liveness is not gossiped: members
//! renew a lease on the leader, which alone judges them (`peers`).
//!
//! Gossip has no transport a fault router could wrap, so when a test
//! installed one ([`crate::faults`]) the event loop applies it on
//! receipt: a heartbeat or capacity advert from a node the router does not
//! let reach this one is ignored, and so is an RTT sample of a ping
//! exchange this node may not start towards that peer (a delayed link adds
//! its delay to the sample instead).

use crate::clock::wall_ms;
use crate::faults::{Channel, FaultRouter, Verdict};
use crate::gpu::Gpus;
use crate::ledger_client::per_applied::PerApplied;
use crate::ledger_client::LedgerClient;
use crate::metrics::Metrics;
use crate::node::LocalMember;
use crate::peers::{
    refresh_period, Multiaddr, PeerId, SharedPeerView, CAPACITY_EVERY, RENEW_EVERY,
};
use crate::worker::Worker;
use shoal_consensus::NodeId;
use shoal_mesh::failure_detector::PeerState;
use shoal_mesh::gossip::{CapacityAdvert, GossipEvent, GossipHandle, RejectReason, WireError};
use shoal_sdk::MemberState;
use std::collections::{BTreeMap, HashMap};
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};

/// Adverts a node publishes at [`CAPACITY_EVERY`] after it starts.
const WARM_UP_ADVERTS: u64 = 3;
/// The leader's tick: its failure detector judges every member on it.
const TICK: Duration = Duration::from_millis(100);
/// Elsewhere the loop only keeps the gossip membership in step with the
/// ledger and sends this node's adverts: within a second is soon enough,
/// and a tick costs a pass over every member.
const MEMBER_TICK: Duration = Duration::from_secs(1);

/// The handles the gossip loops use.
#[derive(Clone)]
pub struct GossipParts {
    pub local: LocalMember,
    pub ledger: LedgerClient,
    pub view: SharedPeerView,
    pub metrics: Arc<Metrics>,
    pub gpus: Gpus,
    /// Test only: the fault plan that decides which peers this node hears.
    pub faults: Option<FaultRouter>,
}

/// Runs the node's side of the gossip: member sync, heartbeats, adverts,
/// event handling and the detector's clock.
pub fn spawn(
    parts: GossipParts,
    handle: GossipHandle,
    events: mpsc::Receiver<GossipEvent>,
    shutdown: watch::Receiver<bool>,
) {
    tokio::spawn(handle_events(parts.clone(), events, shutdown.clone()));
    crate::worker::spawn(Publisher::new(parts, handle), shutdown);
}

async fn handle_events(
    parts: GossipParts,
    mut events: mpsc::Receiver<GossipEvent>,
    mut shutdown: watch::Receiver<bool>,
) {
    let view = &parts.view;
    let me = parts.local.id;
    // Whether a message `from` started towards this node reaches it.
    let hears = |from: NodeId| parts.faults.as_ref().is_none_or(|r| r.allows(from, me));
    // Peers already warned about for a wire version this node does not speak.
    let mut foreign_wire = std::collections::HashSet::new();
    loop {
        let event = tokio::select! {
            e = events.recv() => match e { Some(e) => e, None => return },
            _ = shutdown.changed() => return,
        };
        let now = Instant::now();
        let Ok(mut v) = view.lock() else { return };
        match event {
            GossipEvent::Heartbeat { from, node_id, .. } => {
                if v.node_of(&from) == Some(node_id) && hears(node_id) {
                    count_message(&parts.metrics, "heartbeat");
                    v.heard(node_id, now);
                }
            }
            GossipEvent::Capacity { from, advert } => {
                if v.node_of(&from) == Some(advert.node_id) && hears(advert.node_id) {
                    count_message(&parts.metrics, "capacity");
                    let delay_ms = wall_ms().saturating_sub(advert.sent_at_ms);
                    parts
                        .metrics
                        .gossip_advert_delay
                        .observe(delay_ms as f64 / 1000.0);
                    let node = advert.node_id;
                    v.capacity.apply(from, advert);
                    v.heard(node, now);
                }
            }
            GossipEvent::Rtt { peer, rtt } => {
                let Some(node) = v.node_of(&peer) else {
                    continue;
                };
                // This node's ping and its answer are one exchange, judged
                // on the link from here.
                let fault_delay = match parts
                    .faults
                    .as_ref()
                    .map(|r| r.verdict(Channel::Gossip, me, node))
                {
                    None | Some(Verdict::Deliver) => Duration::ZERO,
                    Some(Verdict::Delay(delay)) => delay,
                    Some(Verdict::Drop | Verdict::Cut) => continue,
                };
                let extra = fault_delay
                    + parts
                        .ledger
                        .name_of(node)
                        .map(|name| v.injected_rtt_to(&name))
                        .unwrap_or_default();
                let Some(coord) = v.coordinate_of(node, u64::MAX) else {
                    continue;
                };
                if let Err(e) = v.vivaldi.update(&node, &coord, rtt + extra) {
                    tracing::debug!(node, error = %e, "ignored an RTT sample");
                }
            }
            GossipEvent::Rejected { from, reason } => {
                parts.metrics.gossip_rejected.inc();
                if let RejectReason::Malformed(WireError::UnsupportedVersion { .. }) = &reason {
                    // A member on another release publishes a format this
                    // one does not read: refused (never misread), counted,
                    // and said once per member rather than every second.
                    if foreign_wire.insert(from) {
                        tracing::warn!(
                            peer = %from,
                            %reason,
                            "refusing gossip of a wire version this node does not speak; \
                             further ones from this peer are only counted (see docs/operations.md, Upgrade)"
                        );
                    }
                } else {
                    tracing::warn!(peer = %from, %reason, "rejected a gossip message");
                }
            }
            GossipEvent::PeerConnected { .. } | GossipEvent::PeerDisconnected { .. } => {}
        }
    }
}

/// Publishes heartbeats and capacity adverts and keeps the gossip
/// membership and the detector's clock in step with the ledger.
struct Publisher {
    parts: GossipParts,
    handle: GossipHandle,
    capacity_seq: u64,
    heartbeat_seq: u64,
    last_heartbeat: Instant,
    /// Adverts published since this node started.
    adverts_sent: u64,
    last_capacity: Option<(Instant, CapacityAdvert)>,
    /// This refresh's share of the refresh period, drawn anew after each
    /// advert: members that started together (a pool's first start, a
    /// restart after maintenance) would otherwise refresh together, in
    /// bursts of the whole pool, for as long as they run.
    refresh_spread: f64,
    members_sent: BTreeMap<PeerId, Multiaddr>,
    /// The member list `members_sent` was last checked against.
    members_told: Arc<Vec<GossipMember>>,
    /// See [`Publisher::gossip_members`].
    members_memo: PerApplied<Arc<Vec<GossipMember>>>,
    /// Each member's gossip identity as last parsed, with the ledger's
    /// text it was parsed from.
    parsed: HashMap<NodeId, ParsedPeer>,
}

/// A member's peer id and gossip address, and the ledger's text of them.
struct ParsedPeer {
    peer_id_text: String,
    addr_text: String,
    peer: PeerId,
    addr: Multiaddr,
}

impl Publisher {
    fn new(parts: GossipParts, handle: GossipHandle) -> Self {
        Publisher {
            parts,
            handle,
            // Receivers drop messages whose seq is not above the last one
            // they saw from a node, so sequence numbers must keep growing
            // across restarts: start from the wall clock in milliseconds
            // (they advance by one per message, far slower than the clock).
            capacity_seq: wall_ms(),
            heartbeat_seq: wall_ms(),
            last_heartbeat: Instant::now() - RENEW_EVERY,
            adverts_sent: 0,
            last_capacity: None,
            refresh_spread: 1.0,
            members_sent: BTreeMap::new(),
            members_memo: PerApplied::default(),
            members_told: Arc::default(),
            parsed: HashMap::new(),
        }
    }

    /// Members' gossip identities and ledger states (this node excluded),
    /// listed again only when the ledger has applied something since, and
    /// each member's peer id and address parsed only when the ledger's text
    /// of them changed: the loop ticks every second on every node, and
    /// while a pool forms every join is an entry, so parsing every member
    /// each time made a pool's formation cost grow with the cube of its size.
    fn gossip_members(&mut self) -> Arc<Vec<GossipMember>> {
        let Ok(d) = self.parts.ledger.read() else {
            return Arc::default();
        };
        let me = self.parts.local.id;
        let parsed = &mut self.parsed;
        self.members_memo.get(d.last_applied, || {
            let mut listed = HashMap::with_capacity(parsed.len());
            let members = d
                .ledger
                .active_members()
                .filter(|m| m.id != me)
                .filter_map(|m| {
                    let known = parsed.remove(&m.id).filter(|p| {
                        p.peer_id_text == m.spec.gossip_peer_id && p.addr_text == m.spec.gossip_addr
                    });
                    let p = match known {
                        Some(p) => p,
                        None => ParsedPeer {
                            peer: m.spec.gossip_peer_id.parse().ok()?,
                            addr: m.spec.gossip_addr.parse().ok()?,
                            peer_id_text: m.spec.gossip_peer_id.clone(),
                            addr_text: m.spec.gossip_addr.clone(),
                        },
                    };
                    let member = (m.id, p.peer, p.addr.clone(), m.state);
                    listed.insert(m.id, p);
                    Some(member)
                })
                .collect();
            *parsed = listed;
            Arc::new(members)
        })
    }
}

/// A member as the gossip layer knows it: id, peer id, address, state.
type GossipMember = (NodeId, PeerId, Multiaddr, MemberState);

impl Worker for Publisher {
    fn period(&self) -> Duration {
        if self.parts.ledger.is_leader() {
            TICK
        } else {
            MEMBER_TICK
        }
    }

    fn wakeup(&self) -> crate::worker::Wakeup {
        crate::worker::Wakeup::on_leadership(self.parts.ledger.raft())
    }

    async fn stop(&mut self) {
        let _ = self.handle.shutdown().await;
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        // Members from the ledger.
        let members = self.gossip_members();
        let parts = &self.parts;
        let now = Instant::now();
        let judging = parts.ledger.is_leader();
        if let Ok(mut v) = parts.view.lock() {
            let ids: Vec<(NodeId, PeerId, MemberState)> = members
                .iter()
                .map(|(id, peer, _, state)| (*id, *peer, *state))
                .collect();
            let expected_tick = if judging { TICK } else { MEMBER_TICK };
            for t in v.tick(&ids, judging, expected_tick, now) {
                let to = match t.to {
                    PeerState::Alive => "alive",
                    PeerState::Suspect => "suspect",
                    PeerState::Down => "down",
                };
                parts
                    .metrics
                    .fd_transitions
                    .get_or_create(&vec![("to".into(), to.into())])
                    .inc();
                tracing::info!(node = t.peer, from = ?t.from, to = ?t.to, "peer state changed (local view)");
            }
        }
        let traffic = self.handle.traffic();
        for (direction, total) in [("in", traffic.bytes_in), ("out", traffic.bytes_out)] {
            let counter = parts
                .metrics
                .gossip_bytes
                .get_or_create(&vec![("direction".into(), direction.into())]);
            let seen = counter.get();
            if total > seen {
                counter.inc_by(total - seen);
            }
        }
        if !Arc::ptr_eq(&members, &self.members_told) {
            let wanted: BTreeMap<PeerId, Multiaddr> =
                members.iter().map(|(_, p, a, _)| (*p, a.clone())).collect();
            if wanted == self.members_sent {
                self.members_told = members.clone();
            } else if self.handle.set_members(wanted.clone()).await.is_ok() {
                self.members_sent = wanted;
                self.members_told = members.clone();
            }
        }

        // A member of an older release judges every peer itself, from
        // gossiped heartbeats: while one is a member, keep sending them.
        let older_members = parts
            .ledger
            .effective_protocol()
            .is_some_and(|p| p < crate::proto::RENEW_SINCE_PROTOCOL);
        if older_members && now.duration_since(self.last_heartbeat) >= RENEW_EVERY {
            self.heartbeat_seq += 1;
            self.last_heartbeat = now;
            if let Err(e) = self
                .handle
                .publish_heartbeat(parts.local.id, self.heartbeat_seq, wall_ms())
                .await
            {
                tracing::trace!(error = %e, "heartbeat not published");
            }
        }

        let mut advert = capacity_advert(&parts.local, &parts.ledger, &parts.gpus);
        if let Ok(v) = parts.view.lock() {
            advert.coordinate = bincode::serialize(v.vivaldi.coordinate()).ok();
        }
        let due = match &self.last_capacity {
            None => true,
            Some((at, prev)) => {
                let period = if self.adverts_sent < WARM_UP_ADVERTS {
                    CAPACITY_EVERY
                } else {
                    refresh_period(members.len() + 1).mul_f64(self.refresh_spread)
                };
                now.duration_since(*at) >= period
                    || prev.gpus_free_by_model != advert.gpus_free_by_model
                    || prev.healthy != advert.healthy
                    || job_util_moved(&prev.job_util, &advert.job_util)
            }
        };
        if due {
            self.capacity_seq += 1;
            self.adverts_sent += 1;
            advert.seq = self.capacity_seq;
            advert.sent_at_ms = wall_ms();
            if let Err(e) = self.handle.publish_capacity(&advert).await {
                tracing::trace!(error = %e, "capacity advert not published");
            }
            self.last_capacity = Some((now, advert));
            self.refresh_spread = rand::random_range(0.5..1.5);
        }
        ControlFlow::Continue(())
    }
}

fn count_message(metrics: &Metrics, topic: &str) {
    metrics
        .gossip_messages
        .get_or_create(&vec![("topic".into(), topic.into())])
        .inc();
}

/// What this node offers right now, for its capacity advert.
pub fn capacity_advert(local: &LocalMember, ledger: &LedgerClient, gpus: &Gpus) -> CapacityAdvert {
    let (inventory, owners) = ledger
        .read()
        .ok()
        .and_then(|d| {
            let inventory = d.ledger.members.get(&local.id)?.spec.gpus.clone();
            Some((inventory, crate::views::gpu_owners(&d.ledger)))
        })
        .unwrap_or_else(|| (local.spec.gpus.clone(), BTreeMap::new()));
    let free = free_by_model(local.id, &inventory, &owners);
    let samples = gpus.latest();
    let load = crate::gpu::mean_load(&samples);
    CapacityAdvert {
        node_id: local.id,
        seq: 0,
        gpus_free_by_model: free,
        gpus_total: inventory.len() as u32,
        healthy: true,
        load,
        job_util: crate::anomaly::job_utilization(local.id, &samples, &owners),
        coordinate: None,
        sent_at_ms: 0,
    }
}

/// Free GPUs of `node` by model: held by no allocation (`owners`, where the
/// scheduler records who holds a GPU) and not marked taken in the member's
/// inventory.
fn free_by_model(
    node: NodeId,
    inventory: &[shoal_sdk::GpuInfo],
    owners: &BTreeMap<(NodeId, u32), u64>,
) -> BTreeMap<String, u32> {
    let mut free: BTreeMap<String, u32> = BTreeMap::new();
    for g in inventory {
        let e = free.entry(g.model.clone()).or_default();
        if g.allocated_to.is_none() && !owners.contains_key(&(node, g.index)) {
            *e += 1;
        }
    }
    free
}

/// Utilization change (percentage points) of a job's GPUs that is worth an
/// advert before the periodic one: enough to show a straggler within a
/// sampling period, not so little that noise floods the topic.
const JOB_UTIL_STEP: f32 = 15.0;

fn job_util_moved(before: &BTreeMap<u64, f32>, now: &BTreeMap<u64, f32>) -> bool {
    before.len() != now.len()
        || now.iter().any(|(job, u)| {
            before
                .get(job)
                .is_none_or(|b| (b - u).abs() >= JOB_UTIL_STEP)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, model: &str) -> shoal_sdk::GpuInfo {
        shoal_sdk::GpuInfo {
            index,
            model: model.into(),
            memory_mb: 81_920,
            uuid: format!("GPU-{index}"),
            allocated_to: None,
            numa_node: None,
            nvlink_peers: Vec::new(),
            mig_enabled: false,
            health: String::new(),
            health_reason: None,
        }
    }

    #[test]
    fn gpus_held_by_allocations_are_not_advertised_free() {
        let mut inventory = [
            gpu(0, "H100"),
            gpu(1, "H100"),
            gpu(2, "A100"),
            gpu(3, "A100"),
        ];
        let owners = BTreeMap::from([((7, 1), 3), ((8, 0), 4), ((7, 2), 3)]);
        assert_eq!(
            free_by_model(7, &inventory, &owners),
            BTreeMap::from([("H100".to_string(), 1), ("A100".to_string(), 1)])
        );
        inventory[3].allocated_to = Some(9);
        assert_eq!(free_by_model(7, &inventory, &owners)["A100"], 0);
    }
}
