//! Every node keeps the secrets its region presents to the peer regions in
//! its own data directory (`node::federation::secrets`), never in the
//! ledger. This loop fetches the ones it lacks from other members (the
//! node that made a join has it first), checked against the ledger's hash;
//! forgets those of former peers; and moves a secret an older release kept
//! in the ledger onto disk, after which the leader seals the record
//! (`Command::SealPeerSecret`) once every member speaks the protocol that
//! keeps secrets out of the ledger.

use crate::federation::secrets;
use crate::node::Node;
use crate::proto::{Request, Response};
use crate::worker::Worker;
use shoal_consensus::federation::{is_clear_secret, PeerRegion, SEALED_SECRETS_SINCE_PROTOCOL};
use shoal_consensus::{Command, LedgerResponse, NodeId};
use std::collections::BTreeSet;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct PeerSecrets {
    node: Arc<Node>,
    /// What this node last settled (the peer records, whether every
    /// member speaks the protocol, whether it leads): until one of them
    /// changes, a tick has nothing to do.
    settled: Option<Settled>,
    /// When it last asked other members for a secret: at most once a
    /// period, however often entries wake the loop.
    asked_at: Option<Instant>,
    /// Regions whose secret no member could hand over, said once each.
    told: BTreeSet<String>,
}

type Settled = (Vec<(String, String)>, bool, bool);

impl PeerSecrets {
    pub fn new(node: Arc<Node>) -> PeerSecrets {
        PeerSecrets {
            node,
            settled: None,
            asked_at: None,
            told: BTreeSet::new(),
        }
    }

    /// The other members, to ask for a secret.
    fn others(&self) -> Vec<NodeId> {
        let me = self.node.ledger().me();
        self.node
            .ledger()
            .read()
            .map(|d| {
                d.ledger
                    .members
                    .values()
                    .filter(|m| m.id != me && m.state != shoal_sdk::MemberState::Left)
                    .map(|m| m.id)
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Asks the other members for `peer`'s secret; keeps the first that
    /// matches the ledger's hash.
    async fn fetch(&mut self, peer: &PeerRegion) -> bool {
        let req = Request::FetchPeerSecret {
            region: peer.name.clone(),
        };
        for member in self.others() {
            let Ok(Response::PeerSecret(Some(secret))) =
                self.node.ledger().call_member(member, &req).await
            else {
                continue;
            };
            if !secrets::matches(&secret.0, peer) {
                tracing::warn!(from = member, region = %peer.name, "a member handed over a secret the ledger does not name");
                continue;
            }
            match secrets::store(self.node.data_dir(), &peer.name, &secret.0) {
                Ok(()) => {
                    tracing::info!(from = member, region = %peer.name, "this node now holds the secret for a peer region");
                    self.told.remove(&peer.name);
                    return true;
                }
                Err(e) => {
                    tracing::warn!(region = %peer.name, error = %e, "cannot keep a peer region's secret");
                    return false;
                }
            }
        }
        if self.told.insert(peer.name.clone()) {
            tracing::warn!(region = %peer.name, "no member could hand over the secret for a peer region yet; this node cannot call it until one does");
        }
        false
    }

    /// A record an older release wrote holds the secret itself: kept on
    /// disk, then (the leader, once every member speaks the protocol)
    /// replaced in the ledger by its hash. Whether the secret is on disk.
    async fn seal(&self, peer: &PeerRegion, spoken: bool) -> bool {
        let clear = &peer.outbound_secret_hash;
        let hash = shoal_consensus::tokens::hash_secret(clear);
        let on_disk =
            std::fs::read_to_string(secrets::path(self.node.data_dir(), &peer.name, &hash))
                .is_ok_and(|s| s.trim() == clear);
        if !on_disk {
            if let Err(e) = secrets::store(self.node.data_dir(), &peer.name, clear) {
                tracing::warn!(region = %peer.name, error = %e, "cannot keep a peer region's secret");
                return false;
            }
        }
        if !spoken || !self.node.ledger().is_leader() {
            return true;
        }
        let cmd = Command::SealPeerSecret {
            region: peer.name.clone(),
        };
        match self.node.ledger().write(cmd).await {
            Ok((LedgerResponse::Ok, _)) => {
                tracing::info!(region = %peer.name, "sealed a peer region's secret: the ledger keeps only its hash");
            }
            Ok((other, _)) => {
                tracing::warn!(region = %peer.name, answer = ?other, "sealing a peer region's secret was refused");
            }
            Err(e) => {
                tracing::debug!(region = %peer.name, error = %e.message, "cannot seal a peer region's secret yet");
            }
        }
        // Sealed, the record changes and the next tick sees it; else the
        // next tick tries again.
        false
    }
}

impl Worker for PeerSecrets {
    fn period(&self) -> Duration {
        Duration::from_secs(1)
    }

    fn wakeup(&self) -> crate::worker::Wakeup {
        crate::worker::Wakeup::on_apply(self.node.ledger().applied_watch())
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let (peers, spoken) = match self.node.ledger().read() {
            Ok(d) => (
                d.ledger
                    .federation
                    .peers
                    .values()
                    .cloned()
                    .collect::<Vec<_>>(),
                d.ledger
                    .effective_protocol()
                    .is_some_and(|p| p >= SEALED_SECRETS_SINCE_PROTOCOL),
            ),
            Err(_) => return ControlFlow::Continue(()),
        };
        let records: Vec<(String, String)> = peers
            .iter()
            .map(|p| (p.name.clone(), p.outbound_secret_hash.clone()))
            .collect();
        let now = (records, spoken, self.node.ledger().is_leader());
        if self.settled.as_ref() == Some(&now) {
            return ControlFlow::Continue(());
        }
        secrets::prune(self.node.data_dir(), &peers);
        let may_ask = self.asked_at.is_none_or(|at| at.elapsed() >= self.period());
        let mut all_held = true;
        for peer in &peers {
            let held = if is_clear_secret(&peer.outbound_secret_hash) {
                self.seal(peer, spoken).await
            } else if secrets::load(self.node.data_dir(), peer).is_some() {
                true
            } else if may_ask {
                self.asked_at = Some(Instant::now());
                self.fetch(peer).await
            } else {
                false
            };
            all_held &= held;
        }
        self.settled = all_held.then_some(now);
        ControlFlow::Continue(())
    }
}
