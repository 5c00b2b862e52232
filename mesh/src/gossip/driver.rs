//! The task that owns the swarm: commands from the handle, membership and dials, and every message checked before gossipsub forwards it.

use super::*;

/// State owned by the spawned task.
pub(super) struct Driver {
    pub(super) swarm: Swarm<ShoalBehaviour>,
    pub(super) local_peer_id: PeerId,
    pub(super) members: BTreeMap<PeerId, Multiaddr>,
    pub(super) capacity_topic: TopicHash,
    pub(super) heartbeat_topic: TopicHash,
    /// node_id -> member PeerId that first advertised it (TOFU, see module docs).
    pub(super) node_owner: HashMap<u64, PeerId>,
    pub(super) last_capacity_seq: HashMap<u64, u64>,
    pub(super) last_heartbeat_seq: HashMap<u64, u64>,
    pub(super) connected: HashSet<PeerId>,
    /// Open connections per peer, with the agent version each identified
    /// the peer by (`None` until identify answered on it).
    pub(super) connections: HashMap<PeerId, HashMap<ConnectionId, Option<String>>>,
    /// Peers found restarted whose connections are being closed, with the
    /// addresses to dial them at once they are (see the module docs).
    pub(super) redial_restarted: HashMap<PeerId, Vec<Multiaddr>>,
    pub(super) events: mpsc::Sender<GossipEvent>,
    pub(super) dropped_events: u64,
    pub(super) config: GossipConfig,
}

/// Outcome of validating one gossipsub message.
pub(super) enum Verdict {
    Accept(GossipEvent),
    Stale,
    Reject(RejectReason),
}

impl Driver {
    pub(super) async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
        let mut redial = tokio::time::interval(self.config.redial_interval);
        redial.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                command = commands.recv() => match command {
                    Some(Command::Shutdown) | None => break,
                    Some(command) => self.handle_command(command),
                },
                event = self.swarm.select_next_some() => self.handle_swarm_event(event),
                _ = redial.tick() => self.dial_missing_members(),
            }
        }
        self.close_connections().await;
        tracing::info!(peer = %self.local_peer_id, "gossip stopped");
    }

    /// Closes every connection and drives the swarm until they are gone (or
    /// [`CLOSE_TIMEOUT`] passes), so peers see a prompt QUIC close instead of
    /// waiting out an idle timeout.
    pub(super) async fn close_connections(&mut self) {
        let peers: Vec<PeerId> = self.swarm.connected_peers().copied().collect();
        for peer in peers {
            let _ = self.swarm.disconnect_peer_id(peer);
        }
        let drain = async {
            while self.swarm.connected_peers().next().is_some() {
                // Events during shutdown are of no interest; just drive the swarm.
                let _ = self.swarm.select_next_some().await;
            }
        };
        if tokio::time::timeout(CLOSE_TIMEOUT, drain).await.is_err() {
            tracing::debug!("some connections did not close within {CLOSE_TIMEOUT:?}");
        }
    }

    pub(super) fn emit(&mut self, event: GossipEvent) {
        match self.events.try_send(event) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => {
                self.dropped_events += 1;
                tracing::debug!("gossip event channel full; dropping event");
            }
            // Receiver dropped: the owner does not want events; keep serving publishes.
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    pub(super) fn handle_command(&mut self, command: Command) {
        match command {
            Command::SetMembers(members) => self.set_members(members),
            Command::Publish {
                topic,
                payload,
                reply,
            } => {
                let topic_hash = match topic {
                    GossipTopic::Capacity => self.capacity_topic.clone(),
                    GossipTopic::Heartbeat => self.heartbeat_topic.clone(),
                };
                let result = self
                    .swarm
                    .behaviour_mut()
                    .gossipsub
                    .publish(topic_hash, payload)
                    .map(|_| ())
                    .map_err(|source| GossipError::Publish {
                        topic: topic.name(),
                        source,
                    });
                // The caller may have given up waiting; nothing to do then.
                let _ = reply.send(result);
            }
            Command::Status(reply) => {
                let _ = reply.send(self.status());
            }
            Command::Shutdown => {}
        }
    }

    pub(super) fn status(&self) -> GossipStatus {
        let gossipsub = &self.swarm.behaviour().gossipsub;
        let mut capacity_topic_peers = 0;
        let mut heartbeat_topic_peers = 0;
        for (peer, topics) in gossipsub.all_peers() {
            if !self.members.contains_key(peer) {
                continue;
            }
            if topics.contains(&&self.capacity_topic) {
                capacity_topic_peers += 1;
            }
            if topics.contains(&&self.heartbeat_topic) {
                heartbeat_topic_peers += 1;
            }
        }
        GossipStatus {
            members: self.members.len(),
            connected_peers: self.connected.len(),
            connected_members: self
                .connected
                .iter()
                .filter(|p| self.members.contains_key(p))
                .count(),
            capacity_topic_peers,
            heartbeat_topic_peers,
            capacity_mesh_peers: gossipsub.mesh_peers(&self.capacity_topic).count(),
            heartbeat_mesh_peers: gossipsub.mesh_peers(&self.heartbeat_topic).count(),
            dropped_events: self.dropped_events,
        }
    }

    pub(super) fn set_members(&mut self, mut members: BTreeMap<PeerId, Multiaddr>) {
        members.remove(&self.local_peer_id);
        // Forget node_id bindings (and their seq floors) of departed members,
        // so a node re-admitted under a new key is not locked out.
        let departed: Vec<u64> = self
            .node_owner
            .iter()
            .filter(|(_, owner)| !members.contains_key(owner))
            .map(|(node_id, _)| *node_id)
            .collect();
        for node_id in departed {
            self.node_owner.remove(&node_id);
            self.last_capacity_seq.remove(&node_id);
            self.last_heartbeat_seq.remove(&node_id);
        }
        self.members = members;
        if self.config.non_member_policy == NonMemberPolicy::Disconnect && !self.members.is_empty()
        {
            // Covers departed members and peers that connected before any member set was known.
            let outsiders: Vec<PeerId> = self
                .connected
                .iter()
                .filter(|p| !self.members.contains_key(p))
                .copied()
                .collect();
            for peer in outsiders {
                let _ = self.swarm.disconnect_peer_id(peer);
            }
        }
        let connected: Vec<PeerId> = self.connected.iter().copied().collect();
        for peer in connected {
            self.refresh_application_score(peer);
        }
        self.dial_missing_members();
    }

    /// Members score 0; non-members get [`NON_MEMBER_APPLICATION_SCORE`] so we
    /// never mesh with, gossip to or flood-publish to them (see
    /// [`peer_score_params`]), which keeps a non-member from relaying member
    /// messages to us and poisoning our duplicate cache.
    pub(super) fn refresh_application_score(&mut self, peer: PeerId) {
        // Before the first member set arrives nobody can be judged; penalising
        // everyone would make peers PRUNE each other and sit out the backoff.
        let score = if self.members.is_empty() || self.members.contains_key(&peer) {
            0.0
        } else {
            NON_MEMBER_APPLICATION_SCORE
        };
        self.swarm
            .behaviour_mut()
            .gossipsub
            .set_application_score(&peer, score);
    }

    /// Dials unconnected members until `target_member_connections` is reached.
    /// Candidates are ordered by a hash of (our id, their id): a stable,
    /// per-node pseudo-random choice, so capped nodes still form a
    /// well-mixed graph rather than all picking the same lowest ids.
    pub(super) fn dial_missing_members(&mut self) {
        let connected_members = self
            .connected
            .iter()
            .filter(|p| self.members.contains_key(p))
            .count();
        let wanted = self
            .config
            .target_member_connections
            .saturating_sub(connected_members);
        if wanted == 0 {
            return;
        }
        let local = self.local_peer_id.to_bytes();
        let mut candidates: Vec<(u64, PeerId, Multiaddr)> = self
            .members
            .iter()
            .filter(|(peer, _)| !self.connected.contains(peer))
            .map(|(peer, addr)| (fnv1a64(&[&local, &peer.to_bytes()]), *peer, addr.clone()))
            .collect();
        candidates.sort_by_key(|(rank, _, _)| *rank);
        for (_, peer, addr) in candidates.into_iter().take(wanted) {
            let opts = DialOpts::peer_id(peer)
                .addresses(vec![addr])
                .condition(PeerCondition::DisconnectedAndNotDialing)
                .build();
            if let Err(e) = self.swarm.dial(opts) {
                tracing::debug!(%peer, error = %e, "dial not started");
            }
        }
    }

    pub(super) fn handle_swarm_event(&mut self, event: SwarmEvent<ShoalBehaviourEvent>) {
        match event {
            SwarmEvent::Behaviour(ShoalBehaviourEvent::Gossipsub(event)) => {
                self.handle_gossipsub(event)
            }
            SwarmEvent::Behaviour(ShoalBehaviourEvent::Ping(ping::Event {
                peer, result, ..
            })) => match result {
                Ok(rtt) if self.members.contains_key(&peer) => {
                    self.emit(GossipEvent::Rtt { peer, rtt })
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(%peer, error = %e, "ping failed"),
            },
            SwarmEvent::Behaviour(ShoalBehaviourEvent::Identify(identify::Event::Received {
                connection_id,
                peer_id,
                info,
            })) => self.identified(peer_id, connection_id, info),
            SwarmEvent::Behaviour(_) => {}
            SwarmEvent::ConnectionEstablished {
                peer_id,
                connection_id,
                num_established,
                ..
            } => {
                self.connections
                    .entry(peer_id)
                    .or_default()
                    .insert(connection_id, None);
                let is_member = self.members.contains_key(&peer_id);
                if !is_member
                    && !self.members.is_empty()
                    && self.config.non_member_policy == NonMemberPolicy::Disconnect
                {
                    tracing::debug!(peer = %peer_id, "closing connection from non-member");
                    let _ = self.swarm.disconnect_peer_id(peer_id);
                    return;
                }
                self.refresh_application_score(peer_id);
                if num_established.get() == 1 && self.connected.insert(peer_id) {
                    self.emit(GossipEvent::PeerConnected { peer: peer_id });
                }
            }
            SwarmEvent::ConnectionClosed {
                peer_id,
                connection_id,
                num_established,
                ..
            } => {
                if let Some(open) = self.connections.get_mut(&peer_id) {
                    open.remove(&connection_id);
                }
                if num_established > 0 {
                    return;
                }
                self.connections.remove(&peer_id);
                if self.connected.remove(&peer_id) {
                    self.emit(GossipEvent::PeerDisconnected { peer: peer_id });
                }
                if let Some(addrs) = self.redial_restarted.remove(&peer_id) {
                    self.redial(peer_id, addrs);
                }
            }
            SwarmEvent::OutgoingConnectionError { peer_id, error, .. } => {
                tracing::debug!(peer = ?peer_id, error = %error, "dial failed");
            }
            _ => {}
        }
    }

    /// Identify answered on `connection`: if another open connection to
    /// the peer identified an earlier incarnation, the peer restarted and
    /// that connection is a dead one of its previous life. Gossipsub would
    /// never greet the peer on the new connection (see the module docs), so
    /// every connection to it is closed and the peer dialed again, at the
    /// addresses it reports now, once they are down.
    pub(super) fn identified(
        &mut self,
        peer: PeerId,
        connection: ConnectionId,
        info: identify::Info,
    ) {
        let Some(open) = self.connections.get_mut(&peer) else {
            return;
        };
        let restarted = open.iter().any(|(id, seen)| {
            *id != connection && seen.as_ref().is_some_and(|v| *v != info.agent_version)
        });
        open.insert(connection, Some(info.agent_version));
        if !restarted {
            return;
        }
        tracing::info!(
            %peer,
            "peer restarted while its old connection was still open; reconnecting to it"
        );
        self.redial_restarted.insert(peer, info.listen_addrs);
        let _ = self.swarm.disconnect_peer_id(peer);
    }

    /// Dials a member found restarted, at the addresses it reported and the
    /// one the ledger records.
    pub(super) fn redial(&mut self, peer: PeerId, mut addrs: Vec<Multiaddr>) {
        let Some(recorded) = self.members.get(&peer) else {
            return;
        };
        if !addrs.contains(recorded) {
            addrs.push(recorded.clone());
        }
        let opts = DialOpts::peer_id(peer)
            .addresses(addrs)
            .condition(PeerCondition::DisconnectedAndNotDialing)
            .build();
        if let Err(e) = self.swarm.dial(opts) {
            tracing::debug!(%peer, error = %e, "redial of a restarted peer not started");
        }
    }

    pub(super) fn handle_gossipsub(&mut self, event: gossipsub::Event) {
        let gossipsub::Event::Message {
            propagation_source,
            message_id,
            message,
        } = event
        else {
            return;
        };
        let from = message.source.unwrap_or(propagation_source);
        let (acceptance, outcome) = match self.validate(&propagation_source, &message) {
            Verdict::Accept(event) => (MessageAcceptance::Accept, Some(event)),
            Verdict::Stale => (MessageAcceptance::Ignore, None),
            Verdict::Reject(reason) => {
                tracing::debug!(%from, %reason, "rejecting gossip message");
                (
                    MessageAcceptance::Reject,
                    Some(GossipEvent::Rejected { from, reason }),
                )
            }
        };
        self.swarm
            .behaviour_mut()
            .gossipsub
            .report_message_validation_result(&message_id, &propagation_source, acceptance);
        if let Some(event) = outcome {
            self.emit(event);
        }
    }

    pub(super) fn validate(
        &mut self,
        propagation_source: &PeerId,
        message: &gossipsub::Message,
    ) -> Verdict {
        let Some(author) = message.source else {
            return Verdict::Reject(RejectReason::Unsigned);
        };
        if !self.members.contains_key(&author) {
            return Verdict::Reject(RejectReason::AuthorNotMember);
        }
        if !self.members.contains_key(propagation_source) {
            return Verdict::Reject(RejectReason::ForwarderNotMember {
                forwarder: *propagation_source,
            });
        }
        if message.topic == self.capacity_topic {
            let advert = match CapacityAdvert::decode(&message.data) {
                Ok(advert) => advert,
                Err(e) => return Verdict::Reject(RejectReason::Malformed(e)),
            };
            if let Err(reason) = self.claim_node_id(advert.node_id, author) {
                return Verdict::Reject(reason);
            }
            if !advance_seq(&mut self.last_capacity_seq, advert.node_id, advert.seq) {
                return Verdict::Stale;
            }
            Verdict::Accept(GossipEvent::Capacity {
                from: author,
                advert,
            })
        } else if message.topic == self.heartbeat_topic {
            let hb = match HeartbeatPayload::decode(&message.data) {
                Ok(hb) => hb,
                Err(e) => return Verdict::Reject(RejectReason::Malformed(e)),
            };
            if let Err(reason) = self.claim_node_id(hb.node_id, author) {
                return Verdict::Reject(reason);
            }
            if !advance_seq(&mut self.last_heartbeat_seq, hb.node_id, hb.seq) {
                return Verdict::Stale;
            }
            Verdict::Accept(GossipEvent::Heartbeat {
                from: author,
                node_id: hb.node_id,
                seq: hb.seq,
                sent_at_ms: hb.sent_at_ms,
            })
        } else {
            Verdict::Reject(RejectReason::UnknownTopic(message.topic.clone()))
        }
    }

    pub(super) fn claim_node_id(
        &mut self,
        node_id: u64,
        author: PeerId,
    ) -> Result<(), RejectReason> {
        let owner = *self.node_owner.entry(node_id).or_insert(author);
        if owner == author {
            Ok(())
        } else {
            Err(RejectReason::NodeIdClaimedByOther { node_id, owner })
        }
    }
}

/// Records `seq` for `node_id` if it is newer; returns whether it was.
pub(super) fn advance_seq(last: &mut HashMap<u64, u64>, node_id: u64, seq: u64) -> bool {
    match last.get(&node_id) {
        Some(&prev) if seq <= prev => false,
        _ => {
            last.insert(node_id, seq);
            true
        }
    }
}
