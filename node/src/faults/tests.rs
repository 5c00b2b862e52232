use super::*;
use openraft::raft::{VoteRequest, VoteResponse};
use openraft::Vote;
use shoal_storage::memory_transport::MemoryTransport;
use shoal_storage::replicate::replicate_chained;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

const RAFT: Channel = Channel::Raft;

fn verdict(router: &FaultRouter, from: NodeId, to: NodeId) -> Verdict {
    router.verdict(RAFT, from, to)
}

#[test]
fn partition_cuts_both_ways_between_the_groups_only() {
    let router = FaultRouter::new();
    router.add(Filter::partition([1, 2], [3]));
    for (from, to) in [(1, 3), (3, 1), (2, 3), (3, 2)] {
        assert_eq!(verdict(&router, from, to), Verdict::Cut, "{from}->{to}");
    }
    for (from, to) in [(1, 2), (2, 1), (3, 3), (4, 1), (3, 4)] {
        assert_eq!(verdict(&router, from, to), Verdict::Deliver, "{from}->{to}");
    }
}

#[test]
fn isolate_cuts_every_link_of_one_node() {
    let router = FaultRouter::new();
    router.add(Filter::isolate(3));
    for other in [1, 2, 4] {
        assert_eq!(verdict(&router, 3, other), Verdict::Cut);
        assert_eq!(verdict(&router, other, 3), Verdict::Cut);
    }
    assert_eq!(verdict(&router, 3, 3), Verdict::Deliver, "self-messages");
    assert_eq!(verdict(&router, 1, 2), Verdict::Deliver);
}

#[test]
fn one_way_cuts_only_what_is_initiated_in_its_direction() {
    let router = FaultRouter::new();
    router.add(Filter::one_way(1, 3));
    assert_eq!(verdict(&router, 1, 3), Verdict::Cut);
    assert_eq!(verdict(&router, 3, 1), Verdict::Deliver);
    assert_eq!(verdict(&router, 1, 2), Verdict::Deliver);
    assert!(!router.allows(1, 3));
    assert!(router.allows(3, 1));
}

#[test]
fn narrowing_aims_a_filter_at_chosen_links_and_channels() {
    let ms = Duration::from_millis;
    let router = FaultRouter::new();
    router.add(Filter::delay(ms(10)).between(1, 2));
    assert_eq!(verdict(&router, 1, 2), Verdict::Delay(ms(10)));
    assert_eq!(verdict(&router, 2, 1), Verdict::Delay(ms(10)));
    assert_eq!(verdict(&router, 1, 3), Verdict::Deliver);
    router.heal();

    router.add(Filter::drop(1.0, 7).from(1).to(3));
    assert_eq!(verdict(&router, 1, 3), Verdict::Drop);
    assert_eq!(verdict(&router, 3, 1), Verdict::Deliver);
    assert_eq!(verdict(&router, 1, 2), Verdict::Deliver);
    router.heal();

    // Repeating a kind widens it; different kinds narrow together.
    router.add(Filter::isolate(9).from(1).from(2));
    assert_eq!(verdict(&router, 1, 9), Verdict::Cut);
    assert_eq!(verdict(&router, 2, 9), Verdict::Cut);
    assert_eq!(verdict(&router, 9, 1), Verdict::Deliver);
    router.heal();

    router.add(Filter::partition([1], [2]).on(Channel::Raft));
    assert_eq!(router.verdict(Channel::Raft, 1, 2), Verdict::Cut);
    assert_eq!(router.verdict(Channel::Chunk, 1, 2), Verdict::Deliver);
    assert!(router.allows(2, 1), "gossip still flows");
}

#[test]
fn the_severest_verdict_wins_and_delays_add_up() {
    let ms = Duration::from_millis;
    let router = FaultRouter::new();
    router.add(Filter::delay(ms(10)));
    router.add(Filter::delay(ms(20)).to(2));
    assert_eq!(verdict(&router, 1, 2), Verdict::Delay(ms(30)));
    assert_eq!(verdict(&router, 1, 3), Verdict::Delay(ms(10)));
    let lossy = router.add(Filter::drop(1.0, 1));
    assert_eq!(verdict(&router, 1, 2), Verdict::Drop);
    router.add(Filter::isolate(2));
    assert_eq!(verdict(&router, 1, 2), Verdict::Cut);
    // Each filter still decided on its own.
    let own = router.filter_stats(lossy).expect("installed");
    assert_eq!(own.dropped, 2);
}

#[test]
fn clones_share_one_plan() {
    let router = FaultRouter::new();
    let node_view = router.clone();
    router.add(Filter::isolate(2));
    assert_eq!(verdict(&node_view, 1, 2), Verdict::Cut);
    assert_eq!(router.stats().cut, 1);
    assert_eq!(router, node_view);
    assert_ne!(router, FaultRouter::new());
}

#[test]
fn remove_and_heal_restore_delivery_and_keep_the_counters() {
    let router = FaultRouter::new();
    let cut = router.add(Filter::isolate(3));
    let slow = router.add(Filter::delay(Duration::from_millis(5)));
    assert_eq!(router.active(), 2);
    assert_eq!(verdict(&router, 1, 3), Verdict::Cut);
    assert!(router.remove(cut));
    assert!(!router.remove(cut), "already removed");
    assert_eq!(router.filter_stats(cut), None);
    assert_eq!(
        verdict(&router, 1, 3),
        Verdict::Delay(Duration::from_millis(5))
    );
    router.heal();
    assert_eq!(router.active(), 0);
    assert!(!router.remove(slow));
    assert_eq!(verdict(&router, 1, 3), Verdict::Deliver);
    let stats = router.stats();
    assert_eq!((stats.cut, stats.delayed, stats.delivered), (1, 1, 1));
}

fn losses(seed: u64, p: f64, messages: usize) -> Vec<bool> {
    let router = FaultRouter::new();
    router.add(Filter::drop(p, seed));
    (0..messages)
        .map(|_| verdict(&router, 1, 2) == Verdict::Drop)
        .collect()
}

#[test]
fn drop_is_reproducible_from_its_seed_and_loses_about_p() {
    let messages = 20_000;
    let first = losses(42, 0.3, messages);
    assert_eq!(first, losses(42, 0.3, messages), "same seed, same losses");
    assert_ne!(first, losses(43, 0.3, messages), "another seed differs");
    let rate = first.iter().filter(|lost| **lost).count() as f64 / messages as f64;
    assert!((rate - 0.3).abs() < 0.02, "lost {rate}");
    assert!(losses(42, 0.0, 1000).iter().all(|lost| !lost));
    assert!(losses(42, 1.0, 1000).iter().all(|lost| *lost));
    assert!(losses(42, f64::NAN, 100).iter().all(|lost| !lost));

    // A link's losses do not depend on traffic on other links.
    let router = FaultRouter::new();
    router.add(Filter::drop(0.3, 42));
    let interleaved: Vec<bool> = (0..messages)
        .map(|_| {
            verdict(&router, 2, 1);
            verdict(&router, 1, 2) == Verdict::Drop
        })
        .collect();
    assert_eq!(first, interleaved);
}

#[test]
fn counters_are_kept_per_channel_and_per_filter() {
    let router = FaultRouter::new();
    let lossy = router.add(Filter::drop(1.0, 0).on(Channel::Chunk));
    router.verdict(Channel::Chunk, 1, 2);
    router.verdict(Channel::Chunk, 1, 2);
    router.verdict(Channel::Raft, 1, 2);
    assert!(router.allows(2, 1));
    let chunk = router.stats_on(Channel::Chunk);
    assert_eq!((chunk.dropped, chunk.total()), (2, 2));
    assert_eq!(router.stats_on(Channel::Raft).delivered, 1);
    assert_eq!(router.stats_on(Channel::Gossip).delivered, 1);
    assert_eq!(router.stats().total(), 4);
    assert_eq!(router.filter_stats(lossy).map(|s| s.dropped), Some(2));
    router.reset_stats();
    assert_eq!(router.stats(), Stats::default());
    assert_eq!(router.filter_stats(lossy), Some(Stats::default()));
}

/// Answers every RPC with a granted vote and counts the calls.
#[derive(Default)]
struct Canned {
    calls: AtomicUsize,
    last_timeout: Mutex<Option<Duration>>,
}

impl RaftTransport for Canned {
    fn send(&self, _: NodeId, _: &str, _: RaftRpc, timeout: Duration) -> TransportFuture {
        self.calls.fetch_add(1, Ordering::SeqCst);
        *self.last_timeout.lock().expect("lock") = Some(timeout);
        Box::pin(async {
            Ok(RaftRpcReply::Vote(Ok(VoteResponse::new(
                Vote::new(1, 1),
                None,
                true,
            ))))
        })
    }
}

fn raft_node(me: NodeId, router: &FaultRouter) -> (Arc<Canned>, FaultyRaftTransport) {
    let inner = Arc::new(Canned::default());
    let transport = FaultyRaftTransport::new(me, inner.clone(), router.clone());
    (inner, transport)
}

fn vote() -> RaftRpc {
    RaftRpc::Vote(VoteRequest::new(Vote::new(1, 1), None))
}

const GENEROUS: Duration = Duration::from_secs(30);

#[tokio::test]
async fn raft_cut_is_unreachable_at_once_without_calling_inner() {
    let router = FaultRouter::new();
    router.add(Filter::isolate(2));
    let (inner, transport) = raft_node(1, &router);
    let started = Instant::now();
    let result = transport.send(2, "127.0.0.1:1", vote(), GENEROUS).await;
    assert!(
        matches!(result, Err(RaftError::Unreachable(_))),
        "{result:?}"
    );
    assert!(started.elapsed() < GENEROUS, "did not wait for the timeout");
    assert_eq!(inner.calls.load(Ordering::SeqCst), 0);
    assert_eq!(router.stats_on(RAFT).cut, 1);
    // Other links are untouched.
    let result = transport.send(3, "127.0.0.1:1", vote(), GENEROUS).await;
    assert!(
        matches!(result, Ok(RaftRpcReply::Vote(Ok(_)))),
        "{result:?}"
    );
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn raft_one_way_cut_leaves_the_reverse_direction_working() {
    let router = FaultRouter::new();
    router.add(Filter::one_way(1, 3));
    let (_, one) = raft_node(1, &router);
    let (_, three) = raft_node(3, &router);
    let forward = one.send(3, "a", vote(), GENEROUS).await;
    assert!(matches!(forward, Err(RaftError::Unreachable(_))));
    let reverse = three.send(1, "a", vote(), GENEROUS).await;
    assert!(reverse.is_ok(), "{reverse:?}");
}

#[tokio::test]
async fn raft_delay_delivers_after_the_delay_within_the_timeout() {
    let delay = Duration::from_millis(50);
    let router = FaultRouter::new();
    router.add(Filter::delay(delay).to(2));
    let (inner, transport) = raft_node(1, &router);
    let started = Instant::now();
    let result = transport.send(2, "a", vote(), GENEROUS).await;
    assert!(result.is_ok(), "{result:?}");
    assert!(started.elapsed() >= delay, "after {:?}", started.elapsed());
    assert_eq!(inner.calls.load(Ordering::SeqCst), 1);
    assert_eq!(
        *inner.last_timeout.lock().expect("lock"),
        Some(GENEROUS - delay),
        "the delay is taken out of the timeout"
    );
    assert_eq!(router.stats_on(RAFT).delayed, 1);
}

#[tokio::test]
async fn raft_delay_beyond_the_timeout_times_out() {
    let timeout = Duration::from_millis(50);
    let router = FaultRouter::new();
    router.add(Filter::delay(Duration::from_secs(60)));
    let (inner, transport) = raft_node(1, &router);
    let started = Instant::now();
    let result = transport.send(2, "a", vote(), timeout).await;
    assert!(matches!(result, Err(RaftError::Failed(_))), "{result:?}");
    assert!(started.elapsed() >= timeout);
    assert_eq!(inner.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn raft_drop_waits_out_the_timeout_then_fails() {
    let timeout = Duration::from_millis(100);
    let router = FaultRouter::new();
    router.add(Filter::drop(1.0, 3));
    let (inner, transport) = raft_node(1, &router);
    let started = Instant::now();
    let result = transport.send(2, "a", vote(), timeout).await;
    assert!(matches!(result, Err(RaftError::Failed(_))), "{result:?}");
    assert!(
        started.elapsed() >= timeout,
        "after {:?}",
        started.elapsed()
    );
    assert_eq!(inner.calls.load(Ordering::SeqCst), 0);
    assert_eq!(router.stats_on(RAFT).dropped, 1);
}

#[tokio::test]
async fn raft_without_a_router_is_the_inner_transport() {
    let inner: Arc<dyn RaftTransport> = Arc::new(Canned::default());
    assert!(Arc::ptr_eq(&wrap_raft(1, inner.clone(), None), &inner));
    let router = FaultRouter::new();
    let wrapped = wrap_raft(1, inner, Some(&router));
    assert!(wrapped.send(2, "a", vote(), GENEROUS).await.is_ok());
    assert_eq!(router.stats_on(RAFT).delivered, 1);
}

fn chunk(text: &str) -> EncodedChunk {
    shoal_storage::encode_chunk(text.as_bytes()).expect("encode")
}

fn chunk_net(nodes: impl IntoIterator<Item = u64>) -> Arc<MemoryTransport> {
    Arc::new(MemoryTransport::with_nodes(nodes))
}

fn is_unreachable<T: fmt::Debug>(node: u64, result: &Result<T, ChunkError>) -> bool {
    matches!(result, Err(ChunkError::Unreachable { node: n, .. }) if *n == node)
}

#[test]
fn chunk_push_to_a_cut_node_fails_as_unreachable() {
    let net = chunk_net(1..=3);
    let router = FaultRouter::new();
    router.add(Filter::isolate(3));
    let one = FaultyChunkTransport::new(1, net.clone(), router.clone());
    let data = chunk("to a cut node");
    let result = one.push(3, &data);
    assert!(is_unreachable(3, &result), "{result:?}");
    assert_eq!(net.push_calls(3), 0, "never sent");
    assert!(one.push(2, &data).is_ok());
    assert!(net.chunk_ids(2).contains(&data.id()));
    assert_eq!(router.stats_on(Channel::Chunk).cut, 1);
}

#[test]
fn chunk_fetch_and_has_honour_the_verdict() {
    let net = chunk_net(1..=4);
    let data = chunk("fetched");
    for node in [2, 3, 4] {
        net.insert(node, &data);
    }
    let router = FaultRouter::new();
    router.add(Filter::one_way(1, 3));
    router.add(Filter::drop(1.0, 5).to(2));
    let delay = Duration::from_millis(50);
    router.add(Filter::delay(delay).to(4));
    let one = FaultyChunkTransport::new(1, net.clone(), router.clone());

    assert!(is_unreachable(3, &one.fetch(3, &data.id())));
    assert!(is_unreachable(3, &one.has(3, &[data.id()])));
    assert_eq!((net.fetch_calls(3), net.has_calls(3)), (0, 0));
    // Node 3 still reaches node 1: the cut is one-way.
    let three = FaultyChunkTransport::new(3, net.clone(), router.clone());
    assert!(three.has(1, &[data.id()]).is_ok());

    let started = Instant::now();
    assert!(is_unreachable(2, &one.fetch(2, &data.id())));
    assert!(
        started.elapsed() >= CHUNK_DROP_WAIT,
        "waited like a timeout"
    );
    assert_eq!(net.fetch_calls(2), 0);

    let started = Instant::now();
    let fetched = one.fetch(4, &data.id()).expect("delayed, then delivered");
    assert_eq!(fetched.id(), data.id());
    assert_eq!(one.has(4, &[data.id()]), Ok(vec![true]));
    assert!(started.elapsed() >= delay * 2);

    let stats = router.stats_on(Channel::Chunk);
    assert_eq!((stats.cut, stats.dropped, stats.delayed), (2, 1, 2));
    assert_eq!(stats.delivered, 1);
}

#[test]
fn a_chain_past_a_cut_head_still_reaches_the_rest() {
    let net = chunk_net(1..=4);
    let router = FaultRouter::new();
    router.add(Filter::isolate(2));
    let one = FaultyChunkTransport::new(1, net.clone(), router);
    let data = chunk("chained");
    let pushed = one.push_chain(&[2, 3, 4], &data);
    assert_eq!(pushed.outcomes.len(), 3);
    assert!(is_unreachable(2, &pushed.outcomes[0]), "{pushed:?}");
    assert_eq!(pushed.outcomes[1..], [Ok(()), Ok(())]);
    assert_eq!(pushed.source_sends, 2, "the cut head, then node 3");
    assert_eq!(net.push_calls(2), 0);
    for node in [3, 4] {
        assert!(net.chunk_ids(node).contains(&data.id()), "node {node}");
    }
}

/// With the head down for real, the inner transport would fall through
/// to node 3 on its own, from node 1, which may not reach node 3.
#[test]
fn a_down_head_does_not_let_the_chain_bypass_a_cut() {
    let net = chunk_net(1..=4);
    net.set_down(2, true);
    let router = FaultRouter::new();
    router.add(Filter::one_way(1, 3));
    let one = FaultyChunkTransport::new(1, net.clone(), router);
    let data = chunk("down head");
    let pushed = one.push_chain(&[2, 3, 4], &data);
    assert!(is_unreachable(2, &pushed.outcomes[0]), "{pushed:?}");
    assert!(is_unreachable(3, &pushed.outcomes[1]), "{pushed:?}");
    assert_eq!(pushed.outcomes[2], Ok(()));
    assert!(!net.chunk_ids(3).contains(&data.id()));
    assert!(net.chunk_ids(4).contains(&data.id()));
}

#[test]
fn a_simulated_chain_judges_each_hop_from_its_forwarder() {
    let net = chunk_net(1..=4);
    let router = FaultRouter::new();
    let one =
        FaultyChunkTransport::new(1, net.clone(), router.clone()).chain_hops(ChainHops::Simulated);

    // 2 forwards past the isolated 3 to 4.
    let cut = router.add(Filter::isolate(3));
    let data = chunk("simulated");
    let pushed = one.push_chain(&[2, 3, 4], &data);
    assert_eq!(pushed.outcomes[0], Ok(()));
    assert!(is_unreachable(3, &pushed.outcomes[1]), "{pushed:?}");
    assert_eq!(pushed.outcomes[2], Ok(()));
    assert_eq!(pushed.source_sends, 1);
    assert!(!net.chunk_ids(3).contains(&data.id()));
    router.remove(cut);

    // The hop 2 -> 4 is 2's, not 1's.
    let data = chunk("second hop");
    let cut = router.add(Filter::one_way(1, 4));
    assert_eq!(one.push_chain(&[2, 4], &data).outcomes, [Ok(()), Ok(())]);
    router.remove(cut);
    router.add(Filter::one_way(2, 4));
    let data = chunk("third hop");
    let pushed = one.push_chain(&[2, 4], &data);
    assert!(is_unreachable(4, &pushed.outcomes[1]), "{pushed:?}");
    router.heal();

    // A cut head: the source sends again, to the next node.
    router.add(Filter::isolate(2));
    let pushed = one.push_chain(&[2, 3], &chunk("cut head"));
    assert!(is_unreachable(2, &pushed.outcomes[0]));
    assert_eq!(pushed.outcomes[1], Ok(()));
    assert_eq!(pushed.source_sends, 2);
}

#[test]
fn replication_over_the_wrapper_reports_the_cut_target() {
    let dir = tempfile::tempdir().expect("tempdir");
    let source = dir.path().join("ckpt");
    std::fs::create_dir_all(&source).expect("mkdir");
    std::fs::write(source.join("weights.bin"), vec![7u8; 300_000]).expect("write");
    let store = shoal_storage::ChunkStore::open(
        dir.path().join("chunks"),
        shoal_storage::StoreConfig::default(),
    )
    .expect("store");
    let (manifest, _) = shoal_storage::build_manifest(&source, &store).expect("manifest");

    let net = chunk_net(1..=4);
    let router = FaultRouter::new();
    let cut = router.add(Filter::isolate(3));
    let one = FaultyChunkTransport::new(1, net.clone(), router.clone());
    let report = replicate_chained(&manifest, &store, &[2, 3, 4], &one, 2, 2).expect("replicate");
    assert!(report.quorum_reached);
    assert_eq!(report.complete_nodes(), vec![2, 4]);
    assert_eq!(report.failed_nodes().len(), 1);
    assert_eq!(report.failed_nodes()[0].0, 3);
    assert!(router.filter_stats(cut).expect("installed").cut > 0);
}

#[test]
fn without_a_router_the_chunk_wrapper_passes_through() {
    let net = chunk_net(1..=3);
    let one = FaultyChunkTransport::wrap(1, net.clone(), None);
    let data = chunk("plain");
    let pushed = one.push_chain(&[2, 3], &data);
    assert_eq!(pushed.outcomes, [Ok(()), Ok(())]);
    assert_eq!(pushed.source_sends, 1, "the inner transport's own chain");
    assert!(Arc::ptr_eq(one.inner(), &net));
}
