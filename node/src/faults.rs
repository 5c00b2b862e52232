//! In-process fault injection: partitions, lost messages and slow links for
//! clusters of [`crate::Agent`]s that share one process, without root,
//! network namespaces or packet filters.
//!
//! One [`FaultRouter`] is shared by every node of a test cluster. Tests add
//! [`Filter`]s to it (and remove them again); each node's transports ask it
//! for a [`Verdict`] on every message they are about to send, so one call
//! such as `router.add(Filter::partition([1, 2], [3]))` splits the whole
//! cluster, in both directions, on every channel at once:
//!
//! - Raft: [`FaultyRaftTransport`] wraps the node's [`RaftTransport`]. The
//!   ledger requests a node forwards to the leader (writes, linearizable
//!   reads) are judged on this channel too, by the node's ledger client, so
//!   a cut-off follower cannot commit through the leader either;
//! - checkpoint chunks: [`FaultyChunkTransport`] wraps the node's
//!   [`ChunkTransport`]. A chain push is forwarded server-side by each
//!   node of the chain with its own chunk transport, so when every node's
//!   transport is wrapped, every forwarded hop is judged too, by the node
//!   that sends it;
//! - gossip has no transport to wrap: the receiving node's event loop asks
//!   [`FaultRouter::allows`] and ignores events from a sender it may not
//!   hear. An RTT sample comes from a ping this node started, so it is
//!   judged on the link from this node to the peer, and a delay verdict
//!   is added to the sample.
//!
//! # Semantics
//!
//! A message is judged once, by the node that initiates it, on the link
//! `(from, to)`; a request and its reply form one exchange. That is what
//! makes [`Filter::one_way`] one-directional: `one_way(1, 3)` stops what
//! node 1 starts towards node 3, while node 3's requests to node 1 and
//! node 1's answers to them still flow. A node's messages to itself are
//! always delivered, since they never cross a link.
//!
//! Every filter whose scope matches a message decides on its own, and the
//! most severe decision wins: [`Verdict::Cut`] over [`Verdict::Drop`] over
//! [`Verdict::Delay`] over [`Verdict::Deliver`]; the delays of several
//! matching delay filters add up, as latencies of segments of one path do.
//!
//! - **Cut** (a partition, an isolated node, a one-way cut) fails like an
//!   unreachable host, at once. Raft gets
//!   [`TransportError::Unreachable`](RaftError::Unreachable); failing
//!   without a wait does not turn openraft into a busy loop, because its
//!   replication streams back off (500 ms by default) after `Unreachable`,
//!   heartbeats come on the heartbeat interval anyway, and a candidate
//!   asks for votes once per election timeout. Chunks get
//!   [`ChunkError::Unreachable`], the variant the storage crate defines
//!   for a peer that is down, so replication and restore skip the node and
//!   try the next one, as they would for a crashed peer.
//! - **Drop** loses the message like a datagram: the sender hears nothing
//!   and gives up when its timeout runs out. Raft waits out the `timeout`
//!   openraft passed (capped at [`RAFT_DROP_WAIT_MAX`]) and then fails
//!   with `Failed`, the error of an exchange that timed out; chunks wait
//!   [`CHUNK_DROP_WAIT`] (far shorter than the real 30 s chunk timeout, so
//!   that tests finish) and then fail with `Unreachable`, which is how the
//!   real chunk transport reports a timeout. Which messages are lost is a
//!   pure function of the filter's seed, the channel, the link and the
//!   message's sequence number on that link, so a run is reproducible
//!   link by link.
//! - **Delay** holds the message for the summed delay and then delivers it
//!   (`tokio::time::sleep` on the async Raft path, `std::thread::sleep` on
//!   the blocking chunk path). For Raft the delay is taken out of the
//!   exchange's timeout, so a link slower than the timeout times out the
//!   way a slow real link would. Gossip events cannot be held back without
//!   reordering the event loop, so [`FaultRouter::allows`] delivers them at
//!   once: narrow delay filters with [`Filter::on`] when that matters.
//!
//! Counters of every verdict, per channel and per filter, let a test check
//! that its fault was exercised at all ([`FaultRouter::stats`],
//! [`FaultRouter::filter_stats`]).
//!
//! This layer is no substitute for the network-namespace tests: connections
//! stay up underneath (gossip keeps its libp2p connections, QUIC its
//! sessions), and a cut is seen only through the wrapped transports.

use shoal_consensus::network::{
    RaftRpc, RaftRpcReply, RaftTransport, TransportError as RaftError, TransportFuture,
};
use shoal_consensus::NodeId;
use shoal_storage::chunk::{ChunkId, EncodedChunk};
use shoal_storage::replicate::{ChainPush, ChunkTransport, TransportError as ChunkError};
use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

/// Longest a dropped Raft message keeps its sender waiting. openraft's
/// timeouts are a heartbeat interval or an election timeout (well under a
/// second by default); only snapshot transfers ask for more, and a test
/// should not stall for a long snapshot timeout to learn a message was lost.
pub const RAFT_DROP_WAIT_MAX: Duration = Duration::from_secs(2);

/// How long a dropped chunk message keeps its (blocking) sender waiting
/// before it fails. The real chunk transport waits up to 30 s for an
/// answer; that would make every lost chunk message cost a test half a
/// minute, while any wait at all keeps "lost" distinguishable from "cut".
pub const CHUNK_DROP_WAIT: Duration = Duration::from_millis(200);

/// The kinds of traffic a filter can be narrowed to ([`Filter::on`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Channel {
    Raft,
    Chunk,
    Gossip,
}

impl Channel {
    fn index(self) -> usize {
        match self {
            Channel::Raft => 0,
            Channel::Chunk => 1,
            Channel::Gossip => 2,
        }
    }
}

/// What happens to one message.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    Deliver,
    /// Deliver after this long.
    Delay(Duration),
    /// Lost: the sender waits out its timeout.
    Drop,
    /// The link is down: the sender fails at once, as for an unreachable host.
    Cut,
}

/// Messages judged, by verdict.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    pub delivered: u64,
    pub delayed: u64,
    pub dropped: u64,
    pub cut: u64,
}

impl Stats {
    /// Every message judged, whatever the verdict.
    pub fn total(&self) -> u64 {
        self.delivered + self.delayed + self.dropped + self.cut
    }

    fn count(&mut self, verdict: Verdict) {
        let counter = match verdict {
            Verdict::Deliver => &mut self.delivered,
            Verdict::Delay(_) => &mut self.delayed,
            Verdict::Drop => &mut self.dropped,
            Verdict::Cut => &mut self.cut,
        };
        *counter += 1;
    }

    fn add(&mut self, other: &Stats) {
        self.delivered += other.delivered;
        self.delayed += other.delayed;
        self.dropped += other.dropped;
        self.cut += other.cut;
    }
}

#[derive(Clone, Debug)]
enum Rule {
    Partition {
        a: BTreeSet<NodeId>,
        b: BTreeSet<NodeId>,
    },
    Isolate(NodeId),
    OneWay {
        from: NodeId,
        to: NodeId,
    },
    Drop {
        p: f64,
        seed: u64,
    },
    Delay(Duration),
}

/// A fault to install on a [`FaultRouter`]: a rule, optionally narrowed.
///
/// Narrowing methods of different kinds combine with AND (`.from(1).to(3)`:
/// messages from 1 to 3); repeating one kind widens it with OR
/// (`.from(1).from(2)`: messages from 1 or from 2), so that a filter can be
/// aimed at any set of links.
#[derive(Clone, Debug)]
pub struct Filter {
    rule: Rule,
    senders: BTreeSet<NodeId>,
    receivers: BTreeSet<NodeId>,
    pairs: Vec<(NodeId, NodeId)>,
    channels: BTreeSet<Channel>,
}

impl Filter {
    fn with(rule: Rule) -> Filter {
        Filter {
            rule,
            senders: BTreeSet::new(),
            receivers: BTreeSet::new(),
            pairs: Vec::new(),
            channels: BTreeSet::new(),
        }
    }

    /// Cuts every link between a node of `a` and a node of `b`, both ways.
    pub fn partition(
        a: impl IntoIterator<Item = NodeId>,
        b: impl IntoIterator<Item = NodeId>,
    ) -> Filter {
        Filter::with(Rule::Partition {
            a: a.into_iter().collect(),
            b: b.into_iter().collect(),
        })
    }

    /// Cuts `node` off from every other node, both ways.
    pub fn isolate(node: NodeId) -> Filter {
        Filter::with(Rule::Isolate(node))
    }

    /// Cuts only what `from` initiates towards `to`; the reverse still works.
    pub fn one_way(from: NodeId, to: NodeId) -> Filter {
        Filter::with(Rule::OneWay { from, to })
    }

    /// Loses each message with probability `p` (clamped to 0..=1; NaN is 0).
    /// The seed makes the losses reproducible.
    pub fn drop(p: f64, seed: u64) -> Filter {
        let p = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
        Filter::with(Rule::Drop { p, seed })
    }

    /// Holds every message for `delay` before delivering it.
    pub fn delay(delay: Duration) -> Filter {
        Filter::with(Rule::Delay(delay))
    }

    /// Narrows to the links between `a` and `b`, in both directions.
    pub fn between(mut self, a: NodeId, b: NodeId) -> Filter {
        self.pairs.push((a, b));
        self
    }

    /// Narrows to messages `node` sends.
    pub fn from(mut self, node: NodeId) -> Filter {
        self.senders.insert(node);
        self
    }

    /// Narrows to messages sent to `node`.
    pub fn to(mut self, node: NodeId) -> Filter {
        self.receivers.insert(node);
        self
    }

    /// Narrows to one kind of traffic, e.g. to cut Raft while gossip still
    /// says the node is alive.
    pub fn on(mut self, channel: Channel) -> Filter {
        self.channels.insert(channel);
        self
    }

    fn in_scope(&self, channel: Channel, from: NodeId, to: NodeId) -> bool {
        (self.channels.is_empty() || self.channels.contains(&channel))
            && (self.senders.is_empty() || self.senders.contains(&from))
            && (self.receivers.is_empty() || self.receivers.contains(&to))
            && (self.pairs.is_empty()
                || self
                    .pairs
                    .iter()
                    .any(|&(a, b)| (a, b) == (from, to) || (b, a) == (from, to)))
    }

    /// Whether the rule cuts the link, regardless of the narrowing.
    fn cuts(&self, from: NodeId, to: NodeId) -> bool {
        match &self.rule {
            Rule::Partition { a, b } => {
                (a.contains(&from) && b.contains(&to)) || (b.contains(&from) && a.contains(&to))
            }
            Rule::Isolate(node) => *node == from || *node == to,
            Rule::OneWay {
                from: cut_from,
                to: cut_to,
            } => (*cut_from, *cut_to) == (from, to),
            Rule::Drop { .. } | Rule::Delay(_) => false,
        }
    }
}

/// Names an installed filter, to remove it or read its counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct FilterHandle(u64);

struct Installed {
    handle: FilterHandle,
    filter: Filter,
    /// Messages this filter has judged per (channel, from, to): the
    /// sequence number that makes drop decisions reproducible per link.
    sequence: HashMap<(Channel, NodeId, NodeId), u64>,
    stats: Stats,
}

impl Installed {
    /// This filter's own decision on a message in its scope.
    fn judge(&mut self, channel: Channel, from: NodeId, to: NodeId) -> Verdict {
        let verdict = match self.filter.rule {
            Rule::Delay(delay) => Verdict::Delay(delay),
            Rule::Drop { p, seed } => {
                let seq = self.sequence.entry((channel, from, to)).or_insert(0);
                let lost = unit_interval(seed, channel, from, to, *seq) < p;
                *seq += 1;
                if lost {
                    Verdict::Drop
                } else {
                    Verdict::Deliver
                }
            }
            _ if self.filter.cuts(from, to) => Verdict::Cut,
            _ => Verdict::Deliver,
        };
        self.stats.count(verdict);
        verdict
    }
}

#[derive(Default)]
struct State {
    next_handle: u64,
    filters: Vec<Installed>,
    by_channel: [Stats; 3],
}

/// The fault plan of one test cluster, shared by all its nodes.
///
/// Clones share the same filters and counters, so the harness keeps one
/// and hands a clone to each node it starts; filters added later reach
/// nodes that are already running.
#[derive(Clone, Default)]
pub struct FaultRouter {
    state: Arc<Mutex<State>>,
}

impl fmt::Debug for FaultRouter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.lock();
        f.debug_struct("FaultRouter")
            .field(
                "filters",
                &state.filters.iter().map(|i| &i.filter).collect::<Vec<_>>(),
            )
            .finish()
    }
}

/// Two routers are equal when they are the same shared plan, so a
/// configuration that carries one (a test-only, unserialised field) can
/// keep deriving `PartialEq`.
impl PartialEq for FaultRouter {
    fn eq(&self, other: &FaultRouter) -> bool {
        Arc::ptr_eq(&self.state, &other.state)
    }
}

impl Eq for FaultRouter {}

impl FaultRouter {
    pub fn new() -> FaultRouter {
        FaultRouter::default()
    }

    /// The state is counters and a filter list that every operation leaves
    /// whole, so a panic elsewhere while the lock was held (a failing test
    /// thread) leaves nothing inconsistent behind: carry on with it.
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Installs `filter` on every node sharing this router, from their next
    /// message on.
    pub fn add(&self, filter: Filter) -> FilterHandle {
        let mut state = self.lock();
        let handle = FilterHandle(state.next_handle);
        state.next_handle += 1;
        tracing::info!(?handle, ?filter, "fault filter added");
        state.filters.push(Installed {
            handle,
            filter,
            sequence: HashMap::new(),
            stats: Stats::default(),
        });
        handle
    }

    /// Removes one filter; false if it was already gone (removed, or healed).
    pub fn remove(&self, handle: FilterHandle) -> bool {
        let mut state = self.lock();
        let before = state.filters.len();
        state.filters.retain(|i| i.handle != handle);
        let removed = state.filters.len() < before;
        if removed {
            tracing::info!(?handle, "fault filter removed");
        }
        removed
    }

    /// Removes every filter. Counters are kept, so a test can still check
    /// what its faults did after healing.
    pub fn heal(&self) {
        let mut state = self.lock();
        if !state.filters.is_empty() {
            tracing::info!(filters = state.filters.len(), "fault filters healed");
        }
        state.filters.clear();
    }

    /// Installed filters.
    pub fn active(&self) -> usize {
        self.lock().filters.len()
    }

    /// Decides the fate of one message and counts it. Transports call this
    /// once per message, as the message is sent.
    pub fn verdict(&self, channel: Channel, from: NodeId, to: NodeId) -> Verdict {
        let mut state = self.lock();
        let mut verdict = Verdict::Deliver;
        if from != to {
            let mut delay = Duration::ZERO;
            let (mut dropped, mut cut) = (false, false);
            for installed in state
                .filters
                .iter_mut()
                .filter(|i| i.filter.in_scope(channel, from, to))
            {
                match installed.judge(channel, from, to) {
                    Verdict::Cut => cut = true,
                    Verdict::Drop => dropped = true,
                    Verdict::Delay(d) => delay = delay.saturating_add(d),
                    Verdict::Deliver => {}
                }
            }
            verdict = if cut {
                Verdict::Cut
            } else if dropped {
                Verdict::Drop
            } else if !delay.is_zero() {
                Verdict::Delay(delay)
            } else {
                Verdict::Deliver
            };
        }
        state.by_channel[channel.index()].count(verdict);
        verdict
    }

    /// For the gossip event loop of node `to`: whether to act on an event
    /// from `from`. A delayed event is let through at once (see the module
    /// doc); a dropped or cut one is to be ignored.
    pub fn allows(&self, from: NodeId, to: NodeId) -> bool {
        matches!(
            self.verdict(Channel::Gossip, from, to),
            Verdict::Deliver | Verdict::Delay(_)
        )
    }

    /// Whether some installed filter could refuse the link (cut it, or lose
    /// messages on it), without judging a message: consumes no sequence
    /// number and counts nothing.
    fn may_refuse(&self, channel: Channel, from: NodeId, to: NodeId) -> bool {
        from != to
            && self.lock().filters.iter().any(|i| {
                i.filter.in_scope(channel, from, to)
                    && match i.filter.rule {
                        Rule::Drop { p, .. } => p > 0.0,
                        Rule::Delay(_) => false,
                        _ => i.filter.cuts(from, to),
                    }
            })
    }

    /// Messages judged on every channel.
    pub fn stats(&self) -> Stats {
        let state = self.lock();
        let mut total = Stats::default();
        for stats in &state.by_channel {
            total.add(stats);
        }
        total
    }

    /// Messages judged on one channel.
    pub fn stats_on(&self, channel: Channel) -> Stats {
        self.lock().by_channel[channel.index()]
    }

    /// What one filter decided on the messages in its scope, on its own:
    /// a drop filter counts the messages it let through as delivered even
    /// if another filter cut them. None once the filter is removed.
    pub fn filter_stats(&self, handle: FilterHandle) -> Option<Stats> {
        self.lock()
            .filters
            .iter()
            .find(|i| i.handle == handle)
            .map(|i| i.stats)
    }

    /// Zeroes the per-channel counters (per-filter ones go with their
    /// filter), to measure one phase of a test on its own.
    pub fn reset_stats(&self) {
        let mut state = self.lock();
        state.by_channel = [Stats::default(); 3];
        for installed in &mut state.filters {
            installed.stats = Stats::default();
        }
    }
}

/// SplitMix64's finaliser: a cheap, well-mixed hash, so that the losses of
/// a drop filter need no RNG state shared between links.
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) determined by its arguments alone.
fn unit_interval(seed: u64, channel: Channel, from: NodeId, to: NodeId, seq: u64) -> f64 {
    let mut h = mix(seed);
    for word in [channel.index() as u64, from, to, seq] {
        h = mix(h ^ word);
    }
    (h >> 11) as f64 / (1u64 << 53) as f64
}

/// Wraps `inner` when a router is given, and returns it untouched when not,
/// so start-up code installs faults with one line and production pays nothing.
pub fn wrap_raft(
    me: NodeId,
    inner: Arc<dyn RaftTransport>,
    router: Option<&FaultRouter>,
) -> Arc<dyn RaftTransport> {
    match router {
        Some(router) => Arc::new(FaultyRaftTransport::new(me, inner, router.clone())),
        None => inner,
    }
}

/// Node `me`'s Raft transport, with the router's verdict applied to every
/// RPC it sends.
pub struct FaultyRaftTransport {
    me: NodeId,
    inner: Arc<dyn RaftTransport>,
    router: FaultRouter,
}

impl FaultyRaftTransport {
    pub fn new(me: NodeId, inner: Arc<dyn RaftTransport>, router: FaultRouter) -> Self {
        FaultyRaftTransport { me, inner, router }
    }
}

impl RaftTransport for FaultyRaftTransport {
    fn max_message_bytes(&self) -> u64 {
        self.inner.max_message_bytes()
    }

    fn send(&self, target: NodeId, addr: &str, rpc: RaftRpc, timeout: Duration) -> TransportFuture {
        let me = self.me;
        let timed_out = move |waited: Duration, why: &str| {
            RaftError::Failed(format!(
                "node {target}: no answer within {waited:?} ({why} on {me}->{target})"
            ))
        };
        match self.router.verdict(Channel::Raft, me, target) {
            Verdict::Deliver => self.inner.send(target, addr, rpc, timeout),
            Verdict::Cut => Box::pin(async move {
                Err::<RaftRpcReply, _>(RaftError::Unreachable(format!(
                    "node {target}: link {me}->{target} cut by a fault filter"
                )))
            }),
            Verdict::Drop => {
                let wait = timeout.min(RAFT_DROP_WAIT_MAX);
                Box::pin(async move {
                    tokio::time::sleep(wait).await;
                    Err(timed_out(wait, "message dropped by a fault filter"))
                })
            }
            Verdict::Delay(delay) if delay >= timeout => Box::pin(async move {
                tokio::time::sleep(timeout).await;
                Err(timed_out(timeout, "fault filter delay exceeds the timeout"))
            }),
            Verdict::Delay(delay) => {
                let inner = self.inner.clone();
                let addr = addr.to_string();
                Box::pin(async move {
                    tokio::time::sleep(delay).await;
                    inner.send(target, &addr, rpc, timeout - delay).await
                })
            }
        }
    }
}

/// How [`FaultyChunkTransport::push_chain`] treats the hops after the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ChainHops {
    /// The inner transport forwards down the chain server-side, each node
    /// with its own (wrapped) transport, which judges its own next hop.
    /// Right for the node's QUIC transport.
    Forwarded,
    /// The inner transport reaches every node from here (an in-memory
    /// store of all nodes, or the trait's default `push_chain`), so this
    /// wrapper walks the chain itself and judges each hop from the node
    /// that would have forwarded it: the last one reached.
    Simulated,
}

/// Node `me`'s chunk transport, with the router's verdict applied to every
/// call. Holds the inner transport in an `Arc` so one in-memory transport
/// can serve as the network of a whole test cluster, each node with its
/// own wrapper.
pub struct FaultyChunkTransport<T: ChunkTransport + ?Sized> {
    me: NodeId,
    inner: Arc<T>,
    router: Option<FaultRouter>,
    hops: ChainHops,
}

impl<T: ChunkTransport + ?Sized> FaultyChunkTransport<T> {
    /// A wrapper for an inner transport that forwards chains server-side.
    pub fn new(me: NodeId, inner: Arc<T>, router: FaultRouter) -> Self {
        Self::wrap(me, inner, Some(router))
    }

    /// Like [`FaultyChunkTransport::new`], passing everything straight
    /// through when `router` is None, so call sites keep one transport type
    /// whether or not a test installed faults.
    pub fn wrap(me: NodeId, inner: Arc<T>, router: Option<FaultRouter>) -> Self {
        FaultyChunkTransport {
            me,
            inner,
            router,
            hops: ChainHops::Forwarded,
        }
    }

    /// Chooses how chain hops are judged (see [`ChainHops`]).
    pub fn chain_hops(mut self, hops: ChainHops) -> Self {
        self.hops = hops;
        self
    }

    pub fn inner(&self) -> &Arc<T> {
        &self.inner
    }

    /// Applies the verdict on `from -> to` in the calling (blocking) thread:
    /// Ok means deliver now.
    fn pass(&self, from: NodeId, to: NodeId) -> Result<(), ChunkError> {
        let Some(router) = &self.router else {
            return Ok(());
        };
        match router.verdict(Channel::Chunk, from, to) {
            Verdict::Deliver => Ok(()),
            Verdict::Delay(delay) => {
                std::thread::sleep(delay);
                Ok(())
            }
            Verdict::Drop => {
                std::thread::sleep(CHUNK_DROP_WAIT);
                Err(ChunkError::Unreachable {
                    node: to,
                    reason: format!(
                        "no answer within {CHUNK_DROP_WAIT:?} (message dropped by a fault filter on {from}->{to})"
                    ),
                })
            }
            Verdict::Cut => Err(ChunkError::Unreachable {
                node: to,
                reason: format!("link {from}->{to} cut by a fault filter"),
            }),
        }
    }

    fn may_refuse(&self, from: NodeId, to: NodeId) -> bool {
        self.router
            .as_ref()
            .is_some_and(|r| r.may_refuse(Channel::Chunk, from, to))
    }

    /// Heads are tried in order from here, as the chunk transport's contract
    /// asks: a head this node may not reach is reported unreachable and the
    /// next one becomes the head. The first head let through gets the rest
    /// of the chain to forward. If that head is down for real, the inner
    /// transport falls through to the next heads by itself, from here,
    /// without asking the router; so when a later node's link from here
    /// could be refused, the head is first asked whether it is up (one
    /// `has` call), and a head that cannot be reached is skipped here
    /// instead. A head that dies between that question and the push still
    /// lets the inner transport fall through unjudged.
    fn push_forwarded(&self, chain: &[u64], chunk: &EncodedChunk) -> ChainPush {
        let mut outcomes = Vec::with_capacity(chain.len());
        let mut source_sends = 0;
        for (head, &node) in chain.iter().enumerate() {
            if let Err(error) = self.pass(self.me, node) {
                outcomes.push(Err(error));
                source_sends += 1;
                continue;
            }
            let rest = &chain[head..];
            if rest[1..]
                .iter()
                .any(|&later| self.may_refuse(self.me, later))
            {
                if let Err(error @ ChunkError::Unreachable { .. }) =
                    self.inner.has(node, &[chunk.id()])
                {
                    outcomes.push(Err(error));
                    source_sends += 1;
                    continue;
                }
            }
            let pushed = self.inner.push_chain(rest, chunk);
            outcomes.extend(pushed.outcomes);
            source_sends += pushed.source_sends;
            break;
        }
        ChainPush {
            outcomes,
            source_sends,
        }
    }

    /// Walks the chain as forwarding nodes would: each node is sent the
    /// frame by the last node that was reached (this one at first), which
    /// stores it and passes it on even if its own store failed.
    fn push_simulated(&self, chain: &[u64], chunk: &EncodedChunk) -> ChainPush {
        let mut outcomes = Vec::with_capacity(chain.len());
        let mut source_sends = 0;
        let mut forwarder = self.me;
        for &node in chain {
            if forwarder == self.me {
                source_sends += 1;
            }
            let outcome = self
                .pass(forwarder, node)
                .and_then(|()| self.inner.push(node, chunk));
            if !matches!(outcome, Err(ChunkError::Unreachable { .. })) {
                forwarder = node;
            }
            outcomes.push(outcome);
        }
        ChainPush {
            outcomes,
            source_sends,
        }
    }
}

impl<T: ChunkTransport + ?Sized> ChunkTransport for FaultyChunkTransport<T> {
    fn push(&self, node: u64, chunk: &EncodedChunk) -> Result<(), ChunkError> {
        self.pass(self.me, node)?;
        self.inner.push(node, chunk)
    }

    fn fetch(&self, node: u64, id: &ChunkId) -> Result<EncodedChunk, ChunkError> {
        self.pass(self.me, node)?;
        self.inner.fetch(node, id)
    }

    fn has(&self, node: u64, ids: &[ChunkId]) -> Result<Vec<bool>, ChunkError> {
        self.pass(self.me, node)?;
        self.inner.has(node, ids)
    }

    fn push_chain(&self, chain: &[u64], chunk: &EncodedChunk) -> ChainPush {
        if self.router.is_none() {
            return self.inner.push_chain(chain, chunk);
        }
        match self.hops {
            ChainHops::Forwarded => self.push_forwarded(chain, chunk),
            ChainHops::Simulated => self.push_simulated(chain, chunk),
        }
    }
}

pub mod chaos_hooks;

#[cfg(test)]
mod tests;
