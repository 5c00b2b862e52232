//! The libp2p swarm: QUIC addresses, gossipsub's configuration and peer scores, the incarnation and message ids, and building the swarm.

use super::*;

pub(super) fn socket_to_quic_multiaddr(addr: SocketAddr) -> Multiaddr {
    Multiaddr::empty()
        .with(Protocol::from(addr.ip()))
        .with(Protocol::Udp(addr.port()))
        .with(Protocol::QuicV1)
}

pub(super) fn quic_multiaddr_to_socket(addr: &Multiaddr) -> Option<SocketAddr> {
    let mut iter = addr.iter();
    let ip = match iter.next()? {
        Protocol::Ip4(ip) => std::net::IpAddr::V4(ip),
        Protocol::Ip6(ip) => std::net::IpAddr::V6(ip),
        _ => return None,
    };
    match iter.next()? {
        Protocol::Udp(port) => Some(SocketAddr::new(ip, port)),
        _ => None,
    }
}

pub(super) async fn wait_for_listen_addr(
    swarm: &mut Swarm<ShoalBehaviour>,
    requested: &Multiaddr,
) -> Result<Multiaddr, GossipError> {
    let wait = async {
        loop {
            match swarm.select_next_some().await {
                SwarmEvent::NewListenAddr { address, .. } => return Ok(address),
                SwarmEvent::ListenerError { error, .. } => {
                    return Err(GossipError::Listen {
                        addr: requested.clone(),
                        detail: error.to_string(),
                    })
                }
                SwarmEvent::ListenerClosed { reason, .. } => {
                    return Err(GossipError::Listen {
                        addr: requested.clone(),
                        detail: format!("listener closed: {reason:?}"),
                    })
                }
                _ => {}
            }
        }
    };
    tokio::time::timeout(LISTEN_TIMEOUT, wait)
        .await
        .map_err(|_| GossipError::Listen {
            addr: requested.clone(),
            detail: format!("no listen address reported within {LISTEN_TIMEOUT:?}"),
        })?
}

/// A name for this run of the gossip layer, different from any earlier run
/// of the same node (the wall clock in nanoseconds, the process and the
/// socket hashed together); only compared for equality, never ordered.
pub(super) fn new_incarnation(config: &GossipConfig) -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or_default();
    fnv1a64(&[
        &nanos.to_be_bytes(),
        &std::process::id().to_be_bytes(),
        config.listen.to_string().as_bytes(),
    ])
}

/// Stable 64-bit FNV-1a; see the module docs for why not `DefaultHasher`.
pub(super) fn fnv1a64(chunks: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for chunk in chunks {
        for byte in chunk.iter() {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

pub(super) fn message_id(message: &gossipsub::Message) -> gossipsub::MessageId {
    let mut id = message.source.map(|p| p.to_bytes()).unwrap_or_default();
    id.extend_from_slice(
        &fnv1a64(&[message.topic.as_str().as_bytes(), &[0], &message.data]).to_be_bytes(),
    );
    gossipsub::MessageId::new(&id)
}

pub(super) fn gossipsub_config(config: &GossipConfig) -> Result<gossipsub::Config, GossipError> {
    gossipsub::ConfigBuilder::default()
        .heartbeat_interval(config.heartbeat)
        // Start mesh maintenance right away instead of the 5 s default.
        .heartbeat_initial_delay(config.heartbeat)
        // Publisher sends to every subscribed peer above publish_threshold,
        // not just its mesh: one hop to everyone it is connected to.
        .flood_publish(true)
        // Every mesh peer forwards each message once, so a node receives
        // (and verifies) about mesh_n copies of each advert, and sends
        // IHAVE to gossip_lazy others every heartbeat. Adverts are small,
        // refreshed, and flood-published to every connected peer, so a
        // mesh of 4 (3..8) and 3 lazy peers, below libp2p's 6 (5..12) and
        // 6, still reach every node while a node's copies fall by a third.
        .mesh_n(4)
        .mesh_n_low(3)
        .mesh_n_high(8)
        .mesh_outbound_min(2)
        .gossip_lazy(3)
        // Keep 5 heartbeats (5 s at 1 s) of messages for IWANT replies and
        // advertise the last 3 in IHAVE (libp2p's defaults).
        .history_length(5)
        .history_gossip(3)
        .duplicate_cache_time(Duration::from_secs(60))
        // A PRUNE (e.g. of a peer our ledger replica had not admitted yet)
        // keeps that pair out of each other's mesh for this long; 10 s instead
        // of 60 s so meshes heal quickly after ledger lag or churn on a LAN.
        .prune_backoff(Duration::from_secs(10))
        .max_transmit_size(MAX_MESSAGE_BYTES + ENVELOPE_SLACK)
        .validation_mode(gossipsub::ValidationMode::Strict)
        .validate_messages()
        .message_id_fn(message_id)
        .build()
        .map_err(|e| GossipError::Build(format!("gossipsub config: {e}")))
}

/// Scoring tuned for an admitted LAN membership:
/// * IP colocation (P6) is off: many nodes share an address in tests and
///   behind NAT, and the ledger, not IP diversity, is the Sybil defence.
/// * Mesh delivery penalties (P3/P3b) are off: capacity traffic is sparse and
///   bursty, so quiet mesh peers are normal, not misbehaving.
/// * Application score (P5, weight 10): members 0, non-members
///   [`NON_MEMBER_APPLICATION_SCORE`] (-6 -> -60). That is below
///   publish_threshold (-50), gossip_threshold (-10) and 0 (mesh), so we send
///   non-members nothing, yet above graylist_threshold (-80), so what they
///   send still reaches application validation and is rejected there.
/// * Positive credit (P1 time in mesh, P2 first deliveries) is capped at
///   +20 in total, so it cannot outweigh misbehaviour.
/// * Invalid messages (P4): one reject costs -40 (a member drops below
///   gossip_threshold -10 but stays above publish_threshold -50); two cost
///   -160 and graylist the peer (-80: its RPCs are dropped unread). The counter halves every second, so an honest peer rejected by
///   ledger lag recovers within a few seconds.
pub(super) fn peer_score_params() -> (gossipsub::PeerScoreParams, gossipsub::PeerScoreThresholds) {
    let topic_params = gossipsub::TopicScoreParams {
        topic_weight: 1.0,
        // P1/P2 rewards are kept small (<= +5 each) so that good behaviour
        // cannot bank enough credit to shrug off invalid messages.
        time_in_mesh_weight: 0.1,
        time_in_mesh_quantum: Duration::from_secs(1),
        time_in_mesh_cap: 50.0,
        first_message_deliveries_weight: 0.5,
        first_message_deliveries_cap: 10.0,
        mesh_message_deliveries_weight: 0.0,
        mesh_failure_penalty_weight: 0.0,
        invalid_message_deliveries_weight: -40.0,
        invalid_message_deliveries_decay: 0.5,
        ..Default::default()
    };
    let mut params = gossipsub::PeerScoreParams {
        topic_score_cap: 20.0,
        ip_colocation_factor_weight: 0.0,
        decay_interval: Duration::from_secs(1),
        // A member that restarts keeps its peer id; the score it earned while
        // dying (broken IWANT promises) must not follow it into its new life.
        retain_score: Duration::from_secs(5),
        ..Default::default()
    };
    for topic in [CAPACITY_TOPIC, HEARTBEAT_TOPIC] {
        params
            .topics
            .insert(IdentTopic::new(topic).hash(), topic_params.clone());
    }
    (params, gossipsub::PeerScoreThresholds::default())
}

pub(super) fn build_swarm(
    config: &GossipConfig,
    traffic: Arc<TrafficCounters>,
    incarnation: u64,
) -> Result<Swarm<ShoalBehaviour>, GossipError> {
    let gossipsub_config = gossipsub_config(config)?;
    let ping_interval = config.ping_interval;
    let idle = config.idle_connection_timeout;
    let swarm = libp2p::SwarmBuilder::with_existing_identity(config.keypair.clone())
        .with_tokio()
        .with_other_transport(move |key| {
            libp2p::quic::tokio::Transport::new(libp2p::quic::Config::new(key))
                .map(move |(peer, muxer), _| (peer, CountingMuxer::new(muxer, traffic.clone())))
        })
        .map_err(|e| GossipError::Build(format!("QUIC transport: {e}")))?
        .with_behaviour(
            |key| -> Result<ShoalBehaviour, Box<dyn std::error::Error + Send + Sync>> {
                let mut gossipsub = gossipsub::Behaviour::new(
                    MessageAuthenticity::Signed(key.clone()),
                    gossipsub_config,
                )?;
                let (params, thresholds) = peer_score_params();
                gossipsub.with_peer_score(params, thresholds)?;

                let identify = identify::Behaviour::new(
                    identify::Config::new(IDENTIFY_PROTOCOL.to_string(), key.public())
                        .with_agent_version(format!("{AGENT_VERSION_PREFIX}{incarnation:016x}")),
                );
                let ping = ping::Behaviour::new(ping::Config::new().with_interval(ping_interval));

                Ok(ShoalBehaviour {
                    gossipsub,
                    identify,
                    ping,
                })
            },
        )
        .map_err(|e| GossipError::Build(format!("behaviour: {e}")))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(idle))
        .build();
    Ok(swarm)
}
