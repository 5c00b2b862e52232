//! Partitions, lost messages and cut chain hops in in-process clusters:
//! every node of a [`LocalCluster`] shares one [`FaultRouter`], whose
//! filters reach the node's Raft transport, its forwarded ledger requests,
//! its chunk transport (chain hops included) and its gossip loop. Real QUIC
//! on 127.0.0.1; no root, no network namespaces (the kernel-level version
//! of the first scenarios is `partition_netns.rs`).
//!
//! - an isolated leader commits nothing while the majority elects a new
//!   one and accepts writes; healed, it follows and catches up;
//! - an isolated node of a gang kills its own rank, the cluster declares
//!   it down and re-places the gang elsewhere under a new epoch, only after
//!   the old rank is gone; healed, no GPU is held twice;
//! - with a fifth of all messages lost (and Raft delayed), every write the
//!   cluster acknowledged is in every node's ledger after healing;
//! - a chained chunk push is judged hop by hop by the node that forwards.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;

use openraft::ServerState;
use shoal_consensus::workload::JobState;
use shoal_consensus::{Command, NodeId};
use shoal_node::agent::testkit::LocalCluster;
use shoal_node::faults::{Channel, FaultRouter, Filter};
use shoal_node::Agent;
use shoal_sdk::MemberState;
use shoal_storage::replicate::{ChunkTransport, TransportError};
use std::collections::BTreeMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Generous: a loaded 2-core machine runs these next to other builds.
const TIMEOUT: Duration = Duration::from_secs(60);

/// Waits until every agent of `among` names the same leader, one of
/// `among`, which itself is in the leader state; returns it.
async fn leader_among(c: &LocalCluster, among: &[NodeId], what: &str) -> NodeId {
    let mut leader = None;
    c.wait_until(what, TIMEOUT, |c| {
        let agents: Vec<&Agent> = among.iter().filter_map(|id| c.agent(*id)).collect();
        let first = agents.first().and_then(|a| a.current_leader());
        leader = first.filter(|l| {
            among.contains(l)
                && agents.iter().all(|a| a.current_leader() == Some(*l))
                && c.agent(*l)
                    .is_some_and(|a| raft_state(a) == ServerState::Leader)
        });
        let ok = leader.is_some();
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", raft_states(c)));
    leader.expect("a leader")
}

/// Waits until the cluster has formed: every node alive in every ledger,
/// and every node agreeing on one leader and on one voter set of `voters`
/// (joiners are learners first). Returns the leader.
async fn formed(c: &LocalCluster, voters: usize) -> NodeId {
    c.wait_all_alive(TIMEOUT).await.expect("every node alive");
    let all = ids(c);
    c.wait_until("one voter set everywhere", TIMEOUT, |c| {
        let first = c.agents[0].voters();
        let ok = first.len() == voters && c.agents.iter().all(|a| a.voters() == first);
        async move { ok }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", raft_states(c)));
    leader_among(c, &all, "a leader").await
}

fn raft_state(a: &Agent) -> ServerState {
    a.node().ledger().raft_metrics().borrow().state
}

/// Every node's Raft state, for failure messages.
fn raft_states(c: &LocalCluster) -> String {
    c.agents
        .iter()
        .map(|a| {
            let m = a.node().ledger().raft_metrics().borrow().clone();
            format!(
                "node {}: {:?} term {} leader {:?} last log {:?} applied {:?}",
                a.id(),
                m.state,
                m.current_term,
                m.current_leader,
                m.last_log_index,
                m.last_applied.map(|l| l.index)
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

fn ids(c: &LocalCluster) -> Vec<NodeId> {
    c.agents.iter().map(|a| a.id()).collect()
}

fn put(key: &str, value: &str) -> Command {
    Command::PutAttr {
        key: key.into(),
        value: value.into(),
    }
}

/// The attribute as `a`'s own applied ledger has it.
fn attr(a: &Agent, key: &str) -> Option<String> {
    a.ledger().read().ok()?.ledger.attrs.get(key).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_leader_commits_nothing_and_catches_up_as_a_follower_after_healing() {
    let _serial = common::one_at_a_time();
    let router = FaultRouter::new();
    let c = LocalCluster::start_with_faults(3, router.clone(), |_, cfg| {
        cfg.executor.enabled = false;
    })
    .await
    .expect("cluster");
    let old = formed(&c, 3).await;
    let all = ids(&c);
    c.agents[0]
        .write_as(&c.admin_token, put("before", "1"))
        .await
        .expect("write before the cut");

    let cut = router.add(Filter::isolate(old));
    let cut_at = Instant::now();
    let majority: Vec<NodeId> = all.iter().copied().filter(|id| *id != old).collect();
    let new = leader_among(&c, &majority, "a new leader on the majority side").await;
    println!(
        "node {new} leads the majority {:.2?} after node {old} was cut off",
        cut_at.elapsed()
    );
    for (i, id) in majority.iter().cycle().take(6).enumerate() {
        let (response, _) = c
            .agent(*id)
            .expect("agent")
            .write_as(&c.admin_token, put(&format!("during/{i}"), &i.to_string()))
            .await
            .expect("the majority accepts writes");
        assert!(
            matches!(response, shoal_consensus::LedgerResponse::Ok),
            "{response:?}"
        );
    }

    // A write through the cut-off leader never commits, and fails within
    // the request timeout (8 s) instead of hanging until the cut heals.
    let old_agent = c.agent(old).expect("old leader");
    let stranded = tokio::time::timeout(
        Duration::from_secs(30),
        old_agent.write_as(&c.admin_token, put("stranded", "x")),
    )
    .await;
    assert!(
        matches!(stranded, Ok(Err(_))),
        "a write through an isolated leader did not fail in time: {stranded:?}"
    );
    assert!(attr(old_agent, "during/0").is_none(), "the cut leaked");
    let exercised = router.filter_stats(cut).expect("installed");
    let (raft, gossip) = (
        router.stats_on(Channel::Raft),
        router.stats_on(Channel::Gossip),
    );
    println!("cut: {exercised:?}; raft {raft:?}; gossip {gossip:?}");
    assert!(raft.cut > 0 && gossip.cut > 0, "the cut was not exercised");

    router.heal();
    let healed_at = Instant::now();
    c.wait_until("the old leader to follow and catch up", TIMEOUT, |c| {
        let a = c.agent(old).expect("old leader");
        let ok = c
            .agreed_leader()
            .is_some_and(|l| l.id() != old && majority.contains(&l.id()))
            && raft_state(a) == ServerState::Follower
            && (0..6).all(|i| attr(a, &format!("during/{i}")) == Some(i.to_string()));
        async move { ok }
    })
    .await
    .expect("rejoin");
    println!(
        "node {old} follows and has caught up {:.2?} after healing",
        healed_at.elapsed()
    );
    for a in &c.agents {
        assert_eq!(attr(a, "before").as_deref(), Some("1"), "node {}", a.id());
        assert_eq!(
            attr(a, "stranded"),
            None,
            "node {} applied the isolated leader's write",
            a.id()
        );
    }
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_one_way_cut_stops_what_a_follower_sends_the_leader_but_not_replication() {
    let _serial = common::one_at_a_time();
    let router = FaultRouter::new();
    let c = LocalCluster::start_with_faults(3, router.clone(), |_, cfg| {
        cfg.executor.enabled = false;
    })
    .await
    .expect("cluster");
    let leader = formed(&c, 3).await;
    let follower = ids(&c)
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    let (l, f) = (
        c.agent(leader).expect("leader"),
        c.agent(follower).expect("follower"),
    );

    // The leader still replicates to the follower (it starts those
    // exchanges); the follower's requests to the leader are lost.
    let cut = router.add(Filter::one_way(follower, leader));
    l.write_as(&c.admin_token, put("from-leader", "1"))
        .await
        .expect("leader write");
    c.wait_until("the follower applies the leader's write", TIMEOUT, |_| {
        let ok = attr(f, "from-leader").as_deref() == Some("1");
        async move { ok }
    })
    .await
    .expect("replication past a one-way cut");
    let forwarded = tokio::time::timeout(
        Duration::from_secs(30),
        f.write_as(&c.admin_token, put("from-follower", "1")),
    )
    .await;
    assert!(
        matches!(forwarded, Ok(Err(_)) | Err(_)),
        "a forwarded write crossed the cut: {forwarded:?}"
    );
    assert_eq!(raft_state(f), ServerState::Follower);
    assert_eq!(f.current_leader(), Some(leader), "{}", raft_states(&c));
    let exercised = router.filter_stats(cut).expect("installed");
    println!("one-way cut {follower} -> {leader}: {exercised:?}; forwarded write: {forwarded:?}");
    assert!(exercised.cut > 0);

    router.remove(cut);
    f.write_as(&c.admin_token, put("from-follower", "2"))
        .await
        .expect("a forwarded write once the cut is gone");
    c.wait_until("every node applies the follower's write", TIMEOUT, |c| {
        let ok = c
            .agents
            .iter()
            .all(|a| attr(a, "from-follower").as_deref() == Some("2"));
        async move { ok }
    })
    .await
    .expect("healed");
    c.shutdown().await;
}

/// Whether `pid` is a live process (not gone, not a zombie).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| !matches!(state, "Z" | "X" | "x"))
    })
}

fn wall_s() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or_default()
}

/// What a rank of the gang job printed when it started.
#[derive(Clone, Copy, Debug)]
struct RankStart {
    epoch: u64,
    rank: u32,
    pid: u32,
    /// Wall-clock seconds.
    at: f64,
}

/// The job's rank starts on node `a`, from its rank logs.
fn rank_starts(a: &Agent, job: u64) -> Vec<RankStart> {
    let jobs_dir = a.node().config().jobs_dir();
    let mut out = Vec::new();
    for rank in 0..2 {
        let log = std::fs::read_to_string(shoal_node::executor::log_path(&jobs_dir, job, rank))
            .unwrap_or_default();
        for line in log.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let ["start", epoch, rank, pid, at] = fields.as_slice() else {
                continue;
            };
            if let (Ok(epoch), Ok(rank), Ok(pid), Ok(at)) =
                (epoch.parse(), rank.parse(), pid.parse(), at.parse())
            {
                out.push(RankStart {
                    epoch,
                    rank,
                    pid,
                    at,
                });
            }
        }
    }
    out
}

/// The job's allocation (epoch, nodes in rank order) in `a`'s own ledger,
/// while it runs.
fn running_alloc(a: &Agent, job: u64) -> Option<(u64, Vec<NodeId>)> {
    let ledger = a.ledger();
    let data = ledger.read().ok()?;
    let job = data.ledger.workload.jobs.get(&job)?;
    let alloc = job.alloc.as_ref()?;
    (job.state == JobState::Running).then(|| {
        (
            alloc.epoch,
            alloc.nodes.iter().map(|(node, _)| *node).collect(),
        )
    })
}

fn member_state(a: &Agent, node: NodeId) -> Option<MemberState> {
    Some(a.ledger().read().ok()?.ledger.members.get(&node)?.state)
}

/// In `a`'s ledger: no GPU is in two allocations, and every GPU held is
/// one of its node's. (Ownership lives in the allocations alone: the
/// members' inventories do not record it.) Returns the GPUs held, as
/// (node, gpu) -> job.
fn gpu_holders(a: &Agent) -> BTreeMap<(NodeId, u32), u64> {
    let ledger = a.ledger();
    let data = ledger.read().expect("ledger");
    let mut held = BTreeMap::new();
    for (job, alloc) in data.ledger.workload.holding() {
        for (node, gpus) in &alloc.nodes {
            for gpu in gpus {
                let exists = data
                    .ledger
                    .members
                    .get(node)
                    .is_some_and(|m| m.spec.gpus.iter().any(|g| g.index == *gpu));
                assert!(
                    exists,
                    "node {}'s ledger: job {} holds GPU {gpu} of node {node}, which has none such",
                    a.id(),
                    job.id
                );
                if let Some(other) = held.insert((*node, *gpu), job.id) {
                    panic!(
                        "node {}'s ledger: GPU {gpu} of node {node} is held by jobs {other} and {}",
                        a.id(),
                        job.id
                    );
                }
            }
        }
    }
    held
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_gang_node_that_leads_fences_its_rank_before_the_gang_is_placed_again() {
    let _serial = common::one_at_a_time();
    isolate_a_gang_node(Cut::TheLeaderIfInTheGang).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_gang_node_that_follows_fences_its_rank_before_the_gang_is_placed_again() {
    let _serial = common::one_at_a_time();
    isolate_a_gang_node(Cut::AFollower).await;
}

/// Which node of the gang to cut off.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Cut {
    /// The leader when it runs a rank (the scheduler decides; otherwise a
    /// follower): it must fence its rank while still believing it leads.
    TheLeaderIfInTheGang,
    /// A follower, whose forwarded ledger requests the router cuts too.
    AFollower,
}

/// Three nodes, a gang on two of them; cuts one gang node off entirely
/// (Raft, forwarded requests, chunks, gossip) and checks fencing, the
/// re-placement and the state after healing, in every node's own ledger
/// and in the processes themselves.
async fn isolate_a_gang_node(which: Cut) {
    let router = FaultRouter::new();
    let c = LocalCluster::start_with_faults(3, router.clone(), |_, _| {})
        .await
        .expect("cluster");
    formed(&c, 3).await;
    let all = ids(&c);

    // Two nodes of four GPUs each: the gang takes two of the three nodes.
    let mut req = common::sh_job(
        2,
        4,
        r#"echo "start $SHOAL_EPOCH $RANK $$ $(date +%s.%N)"; exec sleep 3600"#,
    );
    req.name = "gang".into();
    req.max_restarts = Some(3);
    let job = c.client(0).submit_job(&req).await.expect("submit").id;
    let (first_epoch, gang) = common::wait_for("the gang running", TIMEOUT, || {
        let found = running_alloc(&c.agents[0], job).filter(|(epoch, nodes)| {
            nodes.len() == 2
                && nodes.iter().all(|n| {
                    rank_starts(c.agent(*n).expect("agent"), job)
                        .iter()
                        .any(|s| s.epoch == *epoch && running(s.pid))
                })
        });
        async move { found }
    })
    .await;
    let leader = leader_among(&c, &all, "a leader").await;
    let cut_node = match which {
        Cut::TheLeaderIfInTheGang if gang.contains(&leader) => leader,
        _ => *gang
            .iter()
            .find(|n| **n != leader)
            .expect("a follower in the gang"),
    };
    let survivor = *gang
        .iter()
        .find(|n| **n != cut_node)
        .expect("a second rank");
    let old_rank = |node: NodeId| {
        rank_starts(c.agent(node).expect("agent"), job)
            .into_iter()
            .find(|s| s.epoch == first_epoch)
            .expect("a rank of the first epoch")
    };
    let (fenced, moved) = (old_rank(cut_node), old_rank(survivor));
    let majority: Vec<NodeId> = all.iter().copied().filter(|id| *id != cut_node).collect();
    println!(
        "job {job} epoch {first_epoch} on {gang:?} (leader {leader}); isolating node {cut_node}"
    );

    let cut = router.add(Filter::isolate(cut_node));
    let cut_at = Instant::now();
    let fenced_at = common::wait_for("the cut-off node to kill its rank", TIMEOUT, || {
        let dead = (!running(fenced.pid)).then(wall_s);
        async move { dead }
    })
    .await;
    println!(
        "node {cut_node} killed its rank {} (pid {}) {:.2?} after the cut",
        fenced.rank,
        fenced.pid,
        cut_at.elapsed()
    );
    // It cannot have learnt of anything newer: its ledger still places the
    // job on itself, and it took the rank down on its own.
    let stale = running_alloc(c.agent(cut_node).expect("agent"), job);
    assert_eq!(stale.map(|(epoch, _)| epoch), Some(first_epoch));
    // Nor can it commit anything, as leader or through the leader; the
    // write runs while the majority re-places the gang.
    let stranded = {
        let a = c.agent(cut_node).expect("agent").clone();
        let admin = c.admin_token.clone();
        tokio::spawn(async move {
            tokio::time::timeout(
                Duration::from_secs(15),
                a.write_as(&admin, put("stranded", "x")),
            )
            .await
        })
    };

    // The majority declares the node down and places the gang again, on
    // the survivors, under a new epoch.
    let (new_epoch, new_gang) =
        common::wait_for("the gang re-placed on the majority side", TIMEOUT, || {
            let found = majority.iter().try_fold(None, |seen, id| {
                let a = c.agent(*id)?;
                if member_state(a, cut_node) != Some(MemberState::Down) {
                    return None;
                }
                let (epoch, nodes) = running_alloc(a, job)?;
                let ok = epoch > first_epoch
                    && !nodes.contains(&cut_node)
                    && seen.as_ref().is_none_or(|s| *s == (epoch, nodes.clone()));
                ok.then_some(Some((epoch, nodes)))
            });
            let placed = found.flatten().filter(|(epoch, nodes)| {
                nodes.iter().all(|n| {
                    rank_starts(c.agent(*n).expect("agent"), job)
                        .iter()
                        .any(|s| s.epoch == *epoch && running(s.pid))
                })
            });
            async move { placed }
        })
        .await;
    println!(
        "re-placed as epoch {new_epoch} on {new_gang:?} {:.2?} after the cut",
        cut_at.elapsed()
    );
    assert!(
        !running(moved.pid),
        "the survivor's old-epoch rank still runs"
    );
    let stranded = stranded.await.expect("the stranded write's task");
    assert!(
        !matches!(stranded, Ok(Ok(_))),
        "a write committed through an isolated node: {stranded:?}"
    );
    for node in &new_gang {
        for start in rank_starts(c.agent(*node).expect("agent"), job) {
            if start.epoch == new_epoch {
                assert!(
                    start.at > fenced_at,
                    "rank {} of epoch {new_epoch} started on node {node} at {:.3}, before the fenced rank was seen gone at {fenced_at:.3}",
                    start.rank,
                    start.at
                );
            }
        }
    }
    let exercised = router.filter_stats(cut).expect("installed");
    println!(
        "cut: {exercised:?}; raft {:?}; gossip {:?}",
        router.stats_on(Channel::Raft),
        router.stats_on(Channel::Gossip)
    );
    assert!(router.stats_on(Channel::Raft).cut > 0);
    assert!(router.stats_on(Channel::Gossip).cut > 0);

    router.heal();
    c.wait_until(
        "the healed node alive again and caught up everywhere",
        TIMEOUT,
        |c| {
            let ok = c.agents.iter().all(|a| {
                member_state(a, cut_node) == Some(MemberState::Alive)
                    && running_alloc(a, job) == Some((new_epoch, new_gang.clone()))
            });
            async move { ok }
        },
    )
    .await
    .expect("heal");
    let mut views = Vec::new();
    for a in &c.agents {
        let held = gpu_holders(a);
        assert!(
            held.keys().all(|(node, _)| *node != cut_node),
            "node {}'s ledger: the healed node still holds GPUs: {held:?}",
            a.id()
        );
        assert_eq!(held.len(), 8, "node {}'s ledger: {held:?}", a.id());
        views.push(held);
    }
    assert!(
        views.windows(2).all(|w| w[0] == w[1]),
        "ledgers disagree on GPUs: {views:?}"
    );
    assert!(
        c.agents.iter().all(|a| attr(a, "stranded").is_none()),
        "the isolated node's write was applied"
    );
    let on_cut_node = rank_starts(c.agent(cut_node).expect("agent"), job);
    assert!(
        on_cut_node.iter().all(|s| !running(s.pid)),
        "a rank still runs on the healed node: {on_cut_node:?}"
    );
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_acknowledged_over_lossy_links_are_in_every_ledger_after_healing() {
    let _serial = common::one_at_a_time();
    let router = FaultRouter::new();
    let c = LocalCluster::start_with_faults(3, router.clone(), |_, cfg| {
        cfg.executor.enabled = false;
    })
    .await
    .expect("cluster");
    formed(&c, 3).await;

    let lossy = router.add(Filter::drop(0.2, 7));
    let slow = router.add(Filter::delay(Duration::from_millis(5)).on(Channel::Raft));
    let writes = 30;
    let mut acked = Vec::new();
    let mut refused = Vec::new();
    for i in 0..writes {
        let a = &c.agents[i % c.agents.len()];
        // Bounded by the node's request timeout (8 s); the outer bound only
        // keeps a hung write from hanging the test.
        let write = tokio::time::timeout(
            Duration::from_secs(30),
            a.write_as(&c.admin_token, put(&format!("lossy/{i}"), &i.to_string())),
        )
        .await;
        match write {
            Ok(Ok(_)) => acked.push(i),
            other => refused.push((i, a.id(), format!("{other:?}"))),
        }
    }
    let lost = router.filter_stats(lossy).expect("installed");
    let delayed = router.filter_stats(slow).expect("installed");
    println!(
        "{} of {writes} writes acknowledged; lossy filter {lost:?}; delay filter {delayed:?}; refused {refused:?}",
        acked.len()
    );
    assert!(lost.dropped > 0, "nothing was lost");
    assert!(delayed.delayed > 0, "nothing was delayed");
    assert!(
        acked.len() * 2 >= writes,
        "most writes should get through a 20% loss: {refused:?}"
    );

    router.heal();
    c.wait_until("every acknowledged write in every ledger", TIMEOUT, |c| {
        let ok = c.agents.iter().all(|a| {
            acked
                .iter()
                .all(|i| attr(a, &format!("lossy/{i}")) == Some(i.to_string()))
        });
        async move { ok }
    })
    .await
    .expect("durable writes");
    c.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_chained_push_is_judged_hop_by_hop_by_the_forwarding_node() {
    let _serial = common::one_at_a_time();
    let router = FaultRouter::new();
    let c = LocalCluster::start_with_faults(4, router.clone(), |_, cfg| {
        cfg.executor.enabled = false;
    })
    .await
    .expect("cluster");
    formed(&c, 3).await;
    let [source, head, middle, tail] = [0, 1, 2, 3].map(|i| c.agents[i].id());

    // Only the hop the head forwards is cut; the source itself may still
    // reach every node of the chain.
    let cut = router.add(Filter::one_way(head, middle).on(Channel::Chunk));
    let chunk = shoal_storage::encode_chunk(b"forwarded hop by hop").expect("chunk");
    let id = chunk.id();
    let net = c.agents[0].node().chunks().clone();
    let handle = tokio::runtime::Handle::current();
    let pushed = tokio::task::spawn_blocking(move || {
        net.transport(handle)
            .push_chain(&[head, middle, tail], &chunk)
    })
    .await
    .expect("push");
    println!("chain {source} -> {head} -> {middle} -> {tail}: {pushed:?}");
    assert_eq!(pushed.outcomes.len(), 3);
    assert_eq!(pushed.outcomes[0], Ok(()));
    assert!(
        matches!(&pushed.outcomes[1], Err(TransportError::Unreachable { node, .. }) if *node == middle),
        "{pushed:?}"
    );
    assert_eq!(pushed.outcomes[2], Ok(()));
    assert_eq!(pushed.source_sends, 1, "the head forwarded the rest");
    let holds = |node: NodeId| {
        c.agent(node)
            .expect("agent")
            .node()
            .chunks()
            .store()
            .contains(&id)
            .expect("store")
    };
    assert!(holds(head) && holds(tail));
    assert!(!holds(middle), "the cut hop was delivered");
    assert_eq!(router.filter_stats(cut).map(|s| s.cut), Some(1));
    c.shutdown().await;
}

/// A follower cut off while the others remove it never applies its own
/// removal. Healed, it hears of it: from the first peer that refuses its
/// certificate, or from its own ledger when the leader's last entries to it
/// (sent while the membership without it was being committed) reach it
/// first; both are the design. Its data dir, once marked, never starts
/// again. While
/// it is cut off, the other follower may not be removed: the two voters
/// left would need the silent one for a majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_cut_off_while_it_was_removed_hears_of_it_once_healed() {
    let _serial = common::one_at_a_time();
    let router = FaultRouter::new();
    let c = LocalCluster::start_with_faults(3, router.clone(), |_, cfg| {
        cfg.executor.enabled = false;
    })
    .await
    .expect("cluster");
    let leader = formed(&c, 3).await;
    let gone = ids(&c)
        .into_iter()
        .find(|id| *id != leader)
        .expect("a follower");
    router.add(Filter::isolate(gone));
    let admin = shoal_sdk::Client::new(
        c.agent(leader).expect("leader").api_url(),
        Some(c.admin_token.clone()),
    );
    let other = ids(&c)
        .into_iter()
        .find(|id| *id != leader && *id != gone)
        .expect("the other follower");
    let leader_agent = c.agent(leader).expect("leader");
    c.wait_until(
        "the leader to stop hearing from the cut-off node",
        TIMEOUT,
        |_| {
            let silent = leader_agent
                .node()
                .contacts()
                .last_contact(gone)
                .is_none_or(|at| at.elapsed() > Duration::from_secs(2));
            async move { silent }
        },
    )
    .await
    .expect("silent");
    let refused = admin
        .remove_node(&other.to_string())
        .await
        .expect_err("removing a live voter while another is silent");
    assert!(
        refused.to_string().contains("cannot be removed now")
            && refused.to_string().contains(&format!("[{gone}]")),
        "{refused}"
    );
    assert_ne!(
        member_state(leader_agent, other),
        Some(MemberState::Left),
        "a refused removal changed the ledger"
    );
    admin
        .remove_node(&gone.to_string())
        .await
        .expect("the majority removes the cut-off node");
    c.wait_until(
        "the removed node to leave the leader's Raft membership",
        TIMEOUT,
        |c| {
            let listed = c
                .agreed_leader()
                .is_some_and(|l| l.node().ledger().replicas().contains(&gone));
            async move { !listed }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", raft_states(&c)));
    let gone_agent = c.agent(gone).expect("the removed node's agent");
    assert_eq!(
        gone_agent.removed(),
        None,
        "a node cut off heard of its removal through the cut"
    );
    assert_ne!(
        member_state(gone_agent, gone),
        Some(MemberState::Left),
        "the cut leaked the removal"
    );

    router.heal();
    let heard = c
        .wait_until("the removed node to hear of its removal", TIMEOUT, |_| {
            let heard = gone_agent.removed().is_some();
            async move { heard }
        })
        .await
        .expect("a removed node hears of its removal once healed");
    let why = gone_agent.removed_from_cluster().await;
    println!("node {gone} heard of its removal {heard:.2?} after healing: {why}");
    assert!(
        why.contains("refused") || why.contains(&format!("ledger records node {gone} as removed")),
        "{why}"
    );
    let cfg = gone_agent.node().config().clone();
    gone_agent.shutdown().await;
    match Agent::start(cfg, shoal_node::agent::StartMode::Restart).await {
        Err(shoal_node::agent::AgentError::Removed(msg)) => {
            assert!(msg.contains("removed from the cluster"), "{msg}")
        }
        Err(e) => panic!("a removed node's data dir refused for another reason: {e}"),
        Ok(_) => panic!("a removed node's data dir started again"),
    }
    c.shutdown().await;
}
