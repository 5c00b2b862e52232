//! Gossip layer of a Shoal node: capacity adverts and heartbeats over
//! libp2p gossipsub on QUIC, restricted to ledger-admitted members.
//!
//! # Shape
//! [`Gossip::start`] builds a libp2p swarm (QUIC only; gossipsub + identify +
//! ping) and spawns one tokio task that owns it. The caller talks to the
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

mod swarm;
mod traffic;
mod view;
mod wire;
use swarm::*;
mod driver;
use driver::*;

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
use libp2p::{identify, ping, Swarm, Transport};
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

/// The members a node dials by default
/// ([`GossipConfig::target_member_connections`]).
pub const DIALLED_MEMBERS: usize = 8;

/// Configuration for [`Gossip::start`]. Build with [`GossipConfig::new`] and
/// adjust fields; the defaults target a LAN mesh of up to ~1,000 nodes.
#[derive(Debug, Clone)]
pub struct GossipConfig {
    /// Node identity; must be ed25519 (the ledger records the derived PeerId).
    pub keypair: Keypair,
    /// UDP socket for QUIC; port 0 picks a free port (see [`GossipHandle::listen_addr`]).
    pub listen: SocketAddr,
    /// Gossipsub heartbeat (mesh maintenance and IHAVE gossip). 1 s, as
    /// libp2p's default: a message missed by flood-publish and mesh
    /// forwarding is recovered via IHAVE/IWANT within a heartbeat or two.
    /// Gossip carries only capacity adverts (liveness goes through the
    /// ledger's lease renewals), so a second's repair is soon enough, and
    /// every heartbeat costs each node control messages to its peers.
    pub heartbeat: Duration,
    /// Ping interval; each successful ping yields a [`GossipEvent::Rtt`].
    pub ping_interval: Duration,
    /// How often the task re-dials members it is not connected to.
    pub redial_interval: Duration,
    /// The task dials members until this many member connections are up.
    /// Others dial it too, so a node ends up with about twice as many
    /// (16 at 8): more than gossipsub's `mesh_n` (6), and enough for a
    /// 5,000-node mesh to reach every node within about three hops. Every
    /// connection costs keep-alives, pings and a copy of every message,
    /// so more would make a node's cost grow with the pool.
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
            heartbeat: Duration::from_secs(1),
            ping_interval: Duration::from_secs(5),
            redial_interval: Duration::from_secs(2),
            target_member_connections: DIALLED_MEMBERS,
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
    /// dialed (up to the target); from now on only their messages are accepted.
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
