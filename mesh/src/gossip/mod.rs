//! Gossip layer of a Shoal node: capacity adverts and heartbeats over
//! libp2p gossipsub on QUIC, restricted to ledger-admitted members.
//!
//! # Shape
//! [`Gossip::start`] builds a libp2p swarm (QUIC only; gossipsub + identify +
//! ping + kad) and spawns one tokio task that owns it. The caller talks to the
//! task through a cloneable [`GossipHandle`] and receives [`GossipEvent`]s on a
//! bounded channel. [`CapacityView`] is a pure helper that folds events into
//! "latest advert per node".
//!
//! # Admission
//! The replicated ledger (elsewhere) decides membership and hands the set to
//! [`GossipHandle::set_members`]. Every message is validated by the
//! application (`validate_messages()`): it is accepted only if both its signed
//! author (`MessageAuthenticity::Signed`, `ValidationMode::Strict`) and the
//! peer that forwarded it are members; otherwise it is reported as
//! `MessageAcceptance::Reject`, which gossipsub's peer scoring turns into a P4
//! penalty so repeat offenders get graylisted and their RPCs dropped unread.
//! Connected non-members also get a negative application score, so we never
//! send them anything they could relay back (see `peer_score_params`).
//! Connections from non-members are closed by default ([`NonMemberPolicy`]).
//!
//! A `node_id` is bound to the first member `PeerId` that advertises it
//! (trust-on-first-use); a different member later claiming the same `node_id`
//! is rejected. The binding is forgotten when that `PeerId` leaves the member
//! set, so a node re-admitted under a new key starts fresh. (The ledger knows
//! the authoritative `node_id -> PeerId` map; callers that need a hard
//! guarantee should check [`GossipEvent::Capacity::from`] against it.)
//!
//! # Staleness
//! Adverts and heartbeats whose `seq` is not above the highest seq already
//! accepted for that `node_id` are reported as `MessageAcceptance::Ignore`:
//! they are neither delivered nor forwarded, and the forwarder is *not*
//! penalised, because reordering on a gossip mesh is normal behaviour.
//!
//! # Restarted peers
//! Gossipsub greets a peer (sends it our subscriptions) only on the first
//! connection to it. A member that crashed, or whose address went away,
//! leaves its old connection open on our side until QUIC's idle timeout; if
//! it comes back within that time (same key, any address), its new
//! connection is our second one, so it is never told what we subscribe to
//! and never publishes to us, however long both stay up. Every gossip
//! instance therefore names its incarnation in identify's agent version;
//! when a connection identifies a peer under another incarnation than one
//! of its other connections did, the peer restarted: we close all our
//! connections to it and dial it again at the addresses it just reported,
//! so both sides meet on a fresh first connection.
//!
//! # Message ids
//! `author PeerId bytes ++ FNV-1a-64(topic ++ data)`: content addressed, so the
//! same payload arriving over several paths (or re-published) dedupes, and the
//! author prefix means a member can only ever collide with its own messages.
//! FNV is used instead of `DefaultHasher` because every node must compute the
//! same id regardless of the Rust version it was built with.

mod traffic;
mod view;
mod wire;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt;
use libp2p::core::multiaddr::Protocol;
use libp2p::gossipsub::{self, IdentTopic, MessageAcceptance, MessageAuthenticity, TopicHash};
use libp2p::identity::KeyType;
use libp2p::swarm::dial_opts::{DialOpts, PeerCondition};
use libp2p::swarm::{ConnectionId, NetworkBehaviour, SwarmEvent};
use libp2p::{identify, kad, ping, StreamProtocol, Swarm, Transport};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

/// Re-exported so callers need no direct libp2p dependency.
pub use libp2p::identity::Keypair;
pub use libp2p::{Multiaddr, PeerId};
pub use traffic::TrafficStats;
pub use view::{CapacityView, ViewEntry, ViewUpdate};
pub use wire::{CapacityAdvert, HeartbeatPayload, WireError, MAX_MESSAGE_BYTES, WIRE_VERSION};

use traffic::{CountingMuxer, TrafficCounters};

/// Topic carrying [`CapacityAdvert`]s.
pub const CAPACITY_TOPIC: &str = "shoal/capacity/1";
/// Topic carrying [`HeartbeatPayload`]s.
pub const HEARTBEAT_TOPIC: &str = "shoal/heartbeat/1";

const KAD_PROTOCOL: StreamProtocol = StreamProtocol::new("/shoal/kad/1.0.0");
const IDENTIFY_PROTOCOL: &str = "/shoal/id/1.0.0";
/// Prefix of identify's agent version; the rest names the incarnation
/// (see the module docs, Restarted peers).
const AGENT_VERSION_PREFIX: &str = concat!("shoal/", env!("CARGO_PKG_VERSION"), " incarnation/");
/// How long `start` waits for the QUIC listener to report its address.
const LISTEN_TIMEOUT: Duration = Duration::from_secs(10);
/// Room for the gossipsub envelope (signature, key, seqno, topic) on top of the payload.
const ENVELOPE_SLACK: usize = 1024;
/// Application-specific score of a connected non-member; see [`peer_score_params`].
const NON_MEMBER_APPLICATION_SCORE: f64 = -6.0;
/// How long shutdown waits for connections to close gracefully.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(2);

/// What to do with connections from peers that are not in the member set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonMemberPolicy {
    /// Close them as soon as they are established (once a member set is
    /// known). Self-healing under ledger lag: when our ledger replica admits
    /// the peer, `set_members` makes us dial it.
    Disconnect,
    /// Keep them; their messages are still rejected in validation and their
    /// score sinks until gossipsub graylists them.
    Tolerate,
}

/// Configuration for [`Gossip::start`]. Build with [`GossipConfig::new`] and
/// adjust fields; the defaults target a LAN mesh of up to ~1,000 nodes.
#[derive(Debug, Clone)]
pub struct GossipConfig {
    /// Node identity; must be ed25519 (the ledger records the derived PeerId).
    pub keypair: Keypair,
    /// UDP socket for QUIC; port 0 picks a free port (see [`GossipHandle::listen_addr`]).
    pub listen: SocketAddr,
    /// Gossipsub heartbeat (mesh maintenance and IHAVE gossip). 100 ms: a
    /// message missed by flood-publish and mesh forwarding is recovered via
    /// IHAVE/IWANT within ~1-2 heartbeats, and mesh repair after churn is fast.
    /// Cost is a few control messages per peer per heartbeat.
    pub heartbeat: Duration,
    /// Ping interval; each successful ping yields a [`GossipEvent::Rtt`].
    pub ping_interval: Duration,
    /// How often the task re-dials members it is not connected to.
    pub redial_interval: Duration,
    /// The task dials members until this many member connections are up.
    /// Gossipsub needs only `mesh_n_high` (12) peers; extra connections
    /// shorten flood-publish paths. 64 keeps a 1,000-node mesh at most two
    /// hops from any publisher without 1,000 QUIC connections per node.
    pub target_member_connections: usize,
    /// Capacity of the event channel. When full, events are dropped (counted
    /// in [`GossipStatus::dropped_events`]) rather than stalling the swarm.
    pub event_buffer: usize,
    /// Non-member connection handling.
    pub non_member_policy: NonMemberPolicy,
    /// How long an idle connection (no open streams) is kept.
    pub idle_connection_timeout: Duration,
}

impl GossipConfig {
    /// Defaults for everything but identity and socket.
    pub fn new(keypair: Keypair, listen: SocketAddr) -> Self {
        Self {
            keypair,
            listen,
            heartbeat: Duration::from_millis(100),
            ping_interval: Duration::from_secs(5),
            redial_interval: Duration::from_secs(2),
            target_member_connections: 64,
            event_buffer: 4096,
            non_member_policy: NonMemberPolicy::Disconnect,
            idle_connection_timeout: Duration::from_secs(60),
        }
    }
}

/// Why a message was rejected in validation.
#[derive(Debug, Clone, PartialEq)]
pub enum RejectReason {
    /// The message carried no author (cannot happen with strict signing; defensive).
    Unsigned,
    /// The signed author is not an admitted member.
    AuthorNotMember,
    /// The author is a member but the peer that forwarded it is not.
    ForwarderNotMember {
        /// The non-member forwarder.
        forwarder: PeerId,
    },
    /// Message on a topic this layer does not use.
    UnknownTopic(TopicHash),
    /// Payload failed to decode.
    Malformed(WireError),
    /// The `node_id` is bound to a different member.
    NodeIdClaimedByOther {
        /// Claimed node id.
        node_id: u64,
        /// Member the node id is bound to.
        owner: PeerId,
    },
}

impl fmt::Display for RejectReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RejectReason::Unsigned => write!(f, "message has no signed author"),
            RejectReason::AuthorNotMember => write!(f, "author is not an admitted member"),
            RejectReason::ForwarderNotMember { forwarder } => {
                write!(f, "forwarded by non-member {forwarder}")
            }
            RejectReason::UnknownTopic(t) => write!(f, "unknown topic {t}"),
            RejectReason::Malformed(e) => write!(f, "malformed payload: {e}"),
            RejectReason::NodeIdClaimedByOther { node_id, owner } => {
                write!(f, "node_id {node_id} is bound to {owner}")
            }
        }
    }
}

/// Events delivered to the owner of the gossip instance.
#[derive(Debug, Clone, PartialEq)]
pub enum GossipEvent {
    /// A new (seq-fresh) capacity advert from a member.
    Capacity {
        /// Signed author.
        from: PeerId,
        /// The advert.
        advert: CapacityAdvert,
    },
    /// A new (seq-fresh) heartbeat from a member.
    Heartbeat {
        /// Signed author.
        from: PeerId,
        /// Publisher's node id.
        node_id: u64,
        /// Publisher's heartbeat seq.
        seq: u64,
        /// Publisher's clock at send time (ms since epoch).
        sent_at_ms: u64,
    },
    /// Round-trip time to a connected member, measured by libp2p ping.
    Rtt {
        /// The member.
        peer: PeerId,
        /// Measured round trip.
        rtt: Duration,
    },
    /// First connection to a peer came up.
    PeerConnected {
        /// The peer.
        peer: PeerId,
    },
    /// Last connection to a peer went down.
    PeerDisconnected {
        /// The peer.
        peer: PeerId,
    },
    /// A message was rejected in validation (and the sender penalised).
    Rejected {
        /// Signed author if present, else the forwarding peer.
        from: PeerId,
        /// Why.
        reason: RejectReason,
    },
}

/// Errors of the gossip layer.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    /// The keypair is not ed25519.
    #[error("gossip keypair must be ed25519, got {0:?}")]
    UnsupportedKeyType(KeyType),
    /// Swarm construction failed.
    #[error("building the libp2p swarm failed: {0}")]
    Build(String),
    /// Could not listen on the configured socket.
    #[error("listening on {addr} failed: {detail}")]
    Listen {
        /// Multiaddr we tried.
        addr: Multiaddr,
        /// Transport error text.
        detail: String,
    },
    /// Payload encoding failed.
    #[error("encoding the {topic} payload failed: {source}")]
    Encode {
        /// Topic the payload was meant for.
        topic: &'static str,
        /// Underlying error.
        #[source]
        source: WireError,
    },
    /// Gossipsub refused to publish (e.g. no subscribed peers yet, duplicate).
    #[error("publishing on {topic} failed: {source}")]
    Publish {
        /// Topic.
        topic: &'static str,
        /// Gossipsub's error.
        #[source]
        source: gossipsub::PublishError,
    },
    /// The gossip task is no longer running.
    #[error("the gossip task has stopped")]
    Stopped,
    /// The gossip task panicked or was cancelled.
    #[error("the gossip task failed: {0}")]
    TaskFailed(String),
}

/// Which gossip topic a raw payload goes to (see [`GossipHandle::publish_raw`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GossipTopic {
    /// [`CAPACITY_TOPIC`].
    Capacity,
    /// [`HEARTBEAT_TOPIC`].
    Heartbeat,
}

impl GossipTopic {
    /// The topic string.
    pub fn name(self) -> &'static str {
        match self {
            GossipTopic::Capacity => CAPACITY_TOPIC,
            GossipTopic::Heartbeat => HEARTBEAT_TOPIC,
        }
    }
}

/// Snapshot of the gossip task's state, for health checks and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GossipStatus {
    /// Size of the member set.
    pub members: usize,
    /// Peers with at least one connection.
    pub connected_peers: usize,
    /// Connected peers that are members.
    pub connected_members: usize,
    /// Members known to be subscribed to the capacity topic.
    pub capacity_topic_peers: usize,
    /// Members known to be subscribed to the heartbeat topic.
    pub heartbeat_topic_peers: usize,
    /// Peers in our gossipsub mesh for the capacity topic.
    pub capacity_mesh_peers: usize,
    /// Peers in our gossipsub mesh for the heartbeat topic.
    pub heartbeat_mesh_peers: usize,
    /// Events dropped because the event channel was full.
    pub dropped_events: u64,
}

enum Command {
    SetMembers(BTreeMap<PeerId, Multiaddr>),
    Publish {
        topic: GossipTopic,
        payload: Vec<u8>,
        reply: oneshot::Sender<Result<(), GossipError>>,
    },
    Status(oneshot::Sender<GossipStatus>),
    Shutdown,
}

/// Cloneable handle to a running gossip instance.
#[derive(Clone)]
pub struct GossipHandle {
    local_peer_id: PeerId,
    listen_addr: SocketAddr,
    listen_multiaddr: Multiaddr,
    commands: mpsc::Sender<Command>,
    traffic: Arc<TrafficCounters>,
    task: Arc<Mutex<Option<JoinHandle<()>>>>,
}

impl fmt::Debug for GossipHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GossipHandle")
            .field("local_peer_id", &self.local_peer_id)
            .field("listen_addr", &self.listen_addr)
            .finish_non_exhaustive()
    }
}

impl GossipHandle {
    /// This node's PeerId (derived from the configured keypair).
    pub fn local_peer_id(&self) -> PeerId {
        self.local_peer_id
    }

    /// The UDP socket actually bound (resolves port 0).
    pub fn listen_addr(&self) -> SocketAddr {
        self.listen_addr
    }

    /// The QUIC multiaddr to record in the ledger, e.g. `/ip4/10.0.0.5/udp/4001/quic-v1`.
    pub fn listen_multiaddr(&self) -> Multiaddr {
        self.listen_multiaddr.clone()
    }

    /// Bytes through this node's libp2p streams so far.
    pub fn traffic(&self) -> TrafficStats {
        self.traffic.snapshot()
    }

    /// Replaces the admitted member set. Members we are not connected to are
    /// dialed and added to kad; from now on only their messages are accepted.
    /// Our own PeerId may be included; it is ignored.
    pub async fn set_members(
        &self,
        members: BTreeMap<PeerId, Multiaddr>,
    ) -> Result<(), GossipError> {
        self.commands
            .send(Command::SetMembers(members))
            .await
            .map_err(|_| GossipError::Stopped)
    }

    /// Publishes a capacity advert on [`CAPACITY_TOPIC`].
    ///
    /// Fails with [`GossipError::Publish`] if no member is subscribed yet
    /// (gossipsub's `NoPeersSubscribedToTopic`) or the identical payload was
    /// already published; callers publishing periodically can log and go on.
    pub async fn publish_capacity(&self, advert: &CapacityAdvert) -> Result<(), GossipError> {
        let payload = advert.encode().map_err(|source| GossipError::Encode {
            topic: CAPACITY_TOPIC,
            source,
        })?;
        self.publish_raw(GossipTopic::Capacity, payload).await
    }

    /// Publishes a heartbeat on [`HEARTBEAT_TOPIC`].
    pub async fn publish_heartbeat(
        &self,
        node_id: u64,
        seq: u64,
        sent_at_ms: u64,
    ) -> Result<(), GossipError> {
        let payload = HeartbeatPayload {
            node_id,
            seq,
            sent_at_ms,
        }
        .encode()
        .map_err(|source| GossipError::Encode {
            topic: HEARTBEAT_TOPIC,
            source,
        })?;
        self.publish_raw(GossipTopic::Heartbeat, payload).await
    }

    /// Publishes `payload` unmodified. Receivers validate it like any other
    /// message; this exists for protocol-level fault injection (e.g. checking
    /// that peers reject a malformed payload) and for forward-compatible
    /// payload versions.
    pub async fn publish_raw(
        &self,
        topic: GossipTopic,
        payload: Vec<u8>,
    ) -> Result<(), GossipError> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Publish {
                topic,
                payload,
                reply,
            })
            .await
            .map_err(|_| GossipError::Stopped)?;
        rx.await.map_err(|_| GossipError::Stopped)?
    }

    /// Current state of the gossip task.
    pub async fn status(&self) -> Result<GossipStatus, GossipError> {
        let (reply, rx) = oneshot::channel();
        self.commands
            .send(Command::Status(reply))
            .await
            .map_err(|_| GossipError::Stopped)?;
        rx.await.map_err(|_| GossipError::Stopped)
    }

    /// Stops the task (closing all connections) and waits for it to end.
    /// Other clones of the handle then get [`GossipError::Stopped`].
    pub async fn shutdown(&self) -> Result<(), GossipError> {
        // If the task is already gone the send fails; joining below still reports how it ended.
        let _ = self.commands.send(Command::Shutdown).await;
        let task = self
            .task
            .lock()
            .map_err(|_| GossipError::TaskFailed("task handle lock poisoned".into()))?
            .take();
        match task {
            Some(task) => task
                .await
                .map_err(|e| GossipError::TaskFailed(e.to_string())),
            None => Ok(()),
        }
    }
}

#[derive(NetworkBehaviour)]
struct ShoalBehaviour {
    gossipsub: gossipsub::Behaviour,
    identify: identify::Behaviour,
    ping: ping::Behaviour,
    kad: kad::Behaviour<kad::store::MemoryStore>,
}

/// Entry point; see the module docs.
pub struct Gossip;

impl Gossip {
    /// Builds the swarm, binds the QUIC socket, subscribes to both topics and
    /// spawns the task. Must be called inside a tokio runtime.
    pub async fn start(
        config: GossipConfig,
    ) -> Result<(GossipHandle, mpsc::Receiver<GossipEvent>), GossipError> {
        let key_type = config.keypair.key_type();
        if key_type != KeyType::Ed25519 {
            return Err(GossipError::UnsupportedKeyType(key_type));
        }
        let local_peer_id = config.keypair.public().to_peer_id();
        let traffic = Arc::new(TrafficCounters::default());
        let mut swarm = build_swarm(&config, traffic.clone(), new_incarnation(&config))?;

        let listen = socket_to_quic_multiaddr(config.listen);
        swarm
            .listen_on(listen.clone())
            .map_err(|e| GossipError::Listen {
                addr: listen.clone(),
                detail: e.to_string(),
            })?;
        let listen_multiaddr = wait_for_listen_addr(&mut swarm, &listen).await?;
        let listen_addr =
            quic_multiaddr_to_socket(&listen_multiaddr).ok_or_else(|| GossipError::Listen {
                addr: listen.clone(),
                detail: format!("listener reported non-UDP address {listen_multiaddr}"),
            })?;

        let capacity_topic = IdentTopic::new(CAPACITY_TOPIC);
        let heartbeat_topic = IdentTopic::new(HEARTBEAT_TOPIC);
        for topic in [&capacity_topic, &heartbeat_topic] {
            swarm
                .behaviour_mut()
                .gossipsub
                .subscribe(topic)
                .map_err(|e| GossipError::Build(format!("subscribing to {topic}: {e}")))?;
        }

        let (command_tx, command_rx) = mpsc::channel(256);
        let (event_tx, event_rx) = mpsc::channel(config.event_buffer.max(1));
        let driver = Driver {
            swarm,
            local_peer_id,
            members: BTreeMap::new(),
            capacity_topic: capacity_topic.hash(),
            heartbeat_topic: heartbeat_topic.hash(),
            node_owner: HashMap::new(),
            last_capacity_seq: HashMap::new(),
            last_heartbeat_seq: HashMap::new(),
            connected: HashSet::new(),
            connections: HashMap::new(),
            redial_restarted: HashMap::new(),
            events: event_tx,
            dropped_events: 0,
            config: config.clone(),
        };
        let task = tokio::spawn(driver.run(command_rx));
        tracing::info!(peer = %local_peer_id, addr = %listen_multiaddr, "gossip started");

        Ok((
            GossipHandle {
                local_peer_id,
                listen_addr,
                listen_multiaddr,
                commands: command_tx,
                traffic,
                task: Arc::new(Mutex::new(Some(task))),
            },
            event_rx,
        ))
    }
}

fn socket_to_quic_multiaddr(addr: SocketAddr) -> Multiaddr {
    Multiaddr::empty()
        .with(Protocol::from(addr.ip()))
        .with(Protocol::Udp(addr.port()))
        .with(Protocol::QuicV1)
}

fn quic_multiaddr_to_socket(addr: &Multiaddr) -> Option<SocketAddr> {
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

async fn wait_for_listen_addr(
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
fn new_incarnation(config: &GossipConfig) -> u64 {
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
fn fnv1a64(chunks: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for chunk in chunks {
        for byte in chunk.iter() {
            hash ^= u64::from(*byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

fn message_id(message: &gossipsub::Message) -> gossipsub::MessageId {
    let mut id = message.source.map(|p| p.to_bytes()).unwrap_or_default();
    id.extend_from_slice(
        &fnv1a64(&[message.topic.as_str().as_bytes(), &[0], &message.data]).to_be_bytes(),
    );
    gossipsub::MessageId::new(&id)
}

fn gossipsub_config(config: &GossipConfig) -> Result<gossipsub::Config, GossipError> {
    gossipsub::ConfigBuilder::default()
        .heartbeat_interval(config.heartbeat)
        // Start mesh maintenance right away instead of the 5 s default.
        .heartbeat_initial_delay(config.heartbeat)
        // Publisher sends to every subscribed peer above publish_threshold,
        // not just its mesh: one hop to everyone it is connected to.
        .flood_publish(true)
        // mesh_n/low/high/lazy: defaults (6/5/12/6), proven for large meshes.
        // Keep 10 heartbeats (1 s at 100 ms) of messages for IWANT replies and
        // advertise the last 3 in IHAVE; long enough to repair a loss on a LAN.
        .history_length(10)
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
fn peer_score_params() -> (gossipsub::PeerScoreParams, gossipsub::PeerScoreThresholds) {
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

fn build_swarm(
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
                let local_peer_id = key.public().to_peer_id();
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

                let mut kad_config = kad::Config::new(KAD_PROTOCOL);
                // Members come from the ledger; kad only indexes them, so no
                // periodic random walks eating bandwidth.
                kad_config.set_periodic_bootstrap_interval(None);
                let mut kad = kad::Behaviour::with_config(
                    local_peer_id,
                    kad::store::MemoryStore::new(local_peer_id),
                    kad_config,
                );
                // Loopback/LAN addresses are never "confirmed external", so
                // force server mode or kad would stay client-only.
                kad.set_mode(Some(kad::Mode::Server));
                Ok(ShoalBehaviour {
                    gossipsub,
                    identify,
                    ping,
                    kad,
                })
            },
        )
        .map_err(|e| GossipError::Build(format!("behaviour: {e}")))?
        .with_swarm_config(|c| c.with_idle_connection_timeout(idle))
        .build();
    Ok(swarm)
}

/// State owned by the spawned task.
struct Driver {
    swarm: Swarm<ShoalBehaviour>,
    local_peer_id: PeerId,
    members: BTreeMap<PeerId, Multiaddr>,
    capacity_topic: TopicHash,
    heartbeat_topic: TopicHash,
    /// node_id -> member PeerId that first advertised it (TOFU, see module docs).
    node_owner: HashMap<u64, PeerId>,
    last_capacity_seq: HashMap<u64, u64>,
    last_heartbeat_seq: HashMap<u64, u64>,
    connected: HashSet<PeerId>,
    /// Open connections per peer, with the agent version each identified
    /// the peer by (`None` until identify answered on it).
    connections: HashMap<PeerId, HashMap<ConnectionId, Option<String>>>,
    /// Peers found restarted whose connections are being closed, with the
    /// addresses to dial them at once they are (see the module docs).
    redial_restarted: HashMap<PeerId, Vec<Multiaddr>>,
    events: mpsc::Sender<GossipEvent>,
    dropped_events: u64,
    config: GossipConfig,
}

/// Outcome of validating one gossipsub message.
enum Verdict {
    Accept(GossipEvent),
    Stale,
    Reject(RejectReason),
}

impl Driver {
    async fn run(mut self, mut commands: mpsc::Receiver<Command>) {
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
    async fn close_connections(&mut self) {
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

    fn emit(&mut self, event: GossipEvent) {
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

    fn handle_command(&mut self, command: Command) {
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

    fn status(&self) -> GossipStatus {
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

    fn set_members(&mut self, mut members: BTreeMap<PeerId, Multiaddr>) {
        members.remove(&self.local_peer_id);
        let removed: Vec<PeerId> = self
            .members
            .keys()
            .filter(|p| !members.contains_key(p))
            .copied()
            .collect();
        for peer in &removed {
            self.swarm.behaviour_mut().kad.remove_peer(peer);
        }
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
        for (peer, addr) in &members {
            // A member that came back elsewhere is not to be looked up at
            // its old address any more.
            if let Some(old) = self.members.get(peer).filter(|old| *old != addr) {
                self.swarm.behaviour_mut().kad.remove_address(peer, old);
            }
            self.swarm
                .behaviour_mut()
                .kad
                .add_address(peer, addr.clone());
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
    fn refresh_application_score(&mut self, peer: PeerId) {
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
    fn dial_missing_members(&mut self) {
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

    fn handle_swarm_event(&mut self, event: SwarmEvent<ShoalBehaviourEvent>) {
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
    fn identified(&mut self, peer: PeerId, connection: ConnectionId, info: identify::Info) {
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
    fn redial(&mut self, peer: PeerId, mut addrs: Vec<Multiaddr>) {
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

    fn handle_gossipsub(&mut self, event: gossipsub::Event) {
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

    fn validate(&mut self, propagation_source: &PeerId, message: &gossipsub::Message) -> Verdict {
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

    fn claim_node_id(&mut self, node_id: u64, author: PeerId) -> Result<(), RejectReason> {
        let owner = *self.node_owner.entry(node_id).or_insert(author);
        if owner == author {
            Ok(())
        } else {
            Err(RejectReason::NodeIdClaimedByOther { node_id, owner })
        }
    }
}

/// Records `seq` for `node_id` if it is newer; returns whether it was.
fn advance_seq(last: &mut HashMap<u64, u64>, node_id: u64, seq: u64) -> bool {
    match last.get(&node_id) {
        Some(&prev) if seq <= prev => false,
        _ => {
            last.insert(node_id, seq);
            true
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quic_multiaddr_round_trip() {
        let socket: SocketAddr = "127.0.0.1:4001".parse().expect("socket");
        let addr = socket_to_quic_multiaddr(socket);
        assert_eq!(addr.to_string(), "/ip4/127.0.0.1/udp/4001/quic-v1");
        assert_eq!(quic_multiaddr_to_socket(&addr), Some(socket));
    }

    #[test]
    fn advance_seq_is_strictly_monotonic() {
        let mut last = HashMap::new();
        assert!(advance_seq(&mut last, 1, 0));
        assert!(!advance_seq(&mut last, 1, 0));
        assert!(advance_seq(&mut last, 1, 2));
        assert!(!advance_seq(&mut last, 1, 1));
        assert!(advance_seq(&mut last, 2, 1));
    }

    #[test]
    fn fnv_is_stable() {
        // Reference value of FNV-1a-64("a").
        assert_eq!(fnv1a64(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
    }

    #[tokio::test]
    async fn starts_on_an_ephemeral_port_and_shuts_down() {
        let config = GossipConfig::new(
            Keypair::generate_ed25519(),
            "127.0.0.1:0".parse().expect("socket"),
        );
        let (handle, _events) = Gossip::start(config).await.expect("start");
        assert_ne!(handle.listen_addr().port(), 0);
        handle.shutdown().await.expect("shutdown");
    }
}
