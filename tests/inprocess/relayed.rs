//! Bounded Raft replicas: past the voters and a few learners, a member is
//! relayed — it follows the committed log from a replica instead of the
//! leader shipping it every entry. A relayed member's own ledger keeps up
//! with every write, keeps up when its replica dies, and the leader puts
//! a new learner in the dead one's place. Raft's timer does not run on it.

// See `common::one_at_a_time`: its guard is held across awaits on purpose.
#![allow(clippy::await_holding_lock)]

use crate::common;
use shoal_consensus::replicas::learner_target;
use shoal_consensus::NodeId;
use shoal_node::agent::testkit::LocalCluster;
use shoal_node::Agent;
use std::collections::BTreeSet;
use std::time::Duration;

/// (voters, learners) in `a`'s own Raft membership.
fn replicas_of(a: &Agent) -> (BTreeSet<NodeId>, BTreeSet<NodeId>) {
    let m = a.node().ledger().raft_metrics();
    let m = m.borrow();
    let membership = m.membership_config.membership();
    (
        membership.voter_ids().collect(),
        membership.learner_ids().collect(),
    )
}

fn applied(a: &Agent) -> u64 {
    a.node()
        .ledger()
        .raft_metrics()
        .borrow()
        .last_applied
        .map_or(0, |l| l.index)
}

/// How many of `a`'s lease renewals went `via` ("relay" or "leader").
fn renewals_via(a: &Agent, via: &str) -> f64 {
    let prefix = format!("shoal_lease_renewals_total{{via=\"{via}\"}} ");
    a.node()
        .metrics()
        .render()
        .lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// A write sent through `a`'s own API (which forwards it to the leader);
/// returns its log index. An attribute, not `a`'s member record: the
/// node's own housekeeping rewrites that record until it matches the node.
async fn put_through(a: &Agent, admin_token: &str, key: &str, value: &str) -> u64 {
    shoal_sdk::Client::new(a.api_url(), Some(admin_token.to_string()))
        .put_attr(key, value)
        .await
        .expect("write")
        .index
}

fn attr(a: &Agent, key: &str) -> Option<String> {
    a.ledger()
        .read()
        .expect("ledger")
        .ledger
        .attrs
        .get(key)
        .cloned()
}

/// How many times `a`'s Raft published its metrics (one per turn of its
/// loop that was not coalesced with the next) in a 2 s window in which `a`
/// applied no entry; `None` if ten windows in a row each saw an entry.
async fn raft_turns_in_a_quiet_window(a: &Agent) -> Option<usize> {
    for _ in 0..10 {
        let mut metrics = a.node().ledger().raft_metrics();
        metrics.borrow_and_update();
        let before = applied(a);
        let end = tokio::time::Instant::now() + Duration::from_secs(2);
        let mut turns = 0;
        while let Ok(Ok(())) = tokio::time::timeout_at(end, metrics.changed()).await {
            metrics.borrow_and_update();
            turns += 1;
        }
        if applied(a) == before {
            return Some(turns);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_beyond_the_replicas_follow_the_log_from_one() {
    let _serial = common::one_at_a_time();
    let n = 10;
    let c = LocalCluster::start(n, |_, _| {}).await.expect("cluster");
    let learners = learner_target(n);
    let leader = c
        .wait_until(
            "5 voters and the bounded learners everywhere",
            Duration::from_secs(90),
            |c| {
                let ok = c.agreed_leader().is_some()
                    && c.agents.iter().all(|a| {
                        let (v, l) = replicas_of(a);
                        v.len() == 5 && l.len() == learners
                    });
                async move { ok }
            },
        )
        .await
        .map(|_| c.agreed_leader().expect("leader").id())
        .expect("bounded replicas");
    let (voters, learner_ids) = replicas_of(c.agent(leader).expect("leader agent"));
    let relayed: Vec<&Agent> = c
        .agents
        .iter()
        .filter(|a| !voters.contains(&a.id()) && !learner_ids.contains(&a.id()))
        .collect();
    assert_eq!(relayed.len(), n - 5 - learners, "members outside Raft");

    // A write from a relayed member reaches every member's own ledger.
    let index = put_through(relayed[0], &c.admin_token, "relayed/one", "yes").await;
    c.wait_until(
        "every ledger to apply the write",
        Duration::from_secs(10),
        |c| {
            let ok = c.agents.iter().all(|a| applied(a) >= index);
            async move { ok }
        },
    )
    .await
    .expect("applied everywhere");
    for a in &relayed {
        assert_eq!(attr(a, "relayed/one").as_deref(), Some("yes"));
    }

    // Their leases are renewed through their replica, in batches.
    c.wait_until(
        "relayed members renewing through their replica",
        Duration::from_secs(10),
        |_| {
            let ok = relayed.iter().all(|a| renewals_via(a, "relay") > 0.0);
            async move { ok }
        },
    )
    .await
    .expect("relayed renewals");

    // Raft's timer runs only where it is needed: a relayed member's Raft
    // does not turn at all while no entry comes (its ticks were four turns
    // a second, each waking every loop that waits for an entry).
    let turns = raft_turns_in_a_quiet_window(relayed[0])
        .await
        .expect("a 2 s window without an entry applied, in ten tries");
    assert!(
        turns <= 1,
        "a relayed member's Raft turned {turns} times in 2 s without an entry"
    );

    // The status says who is relayed.
    let status = c.client(0).status().await.expect("status");
    assert_eq!(status.learners.len(), learners);
    assert_eq!(status.members.len(), n);

    // A learner dies: the members it relayed to follow another replica,
    // and the leader puts a live member in its place.
    let dead = *learner_ids.iter().next().expect("a learner");
    c.agent(dead).expect("learner agent").shutdown().await;
    let alive: Vec<&Agent> = c.agents.iter().filter(|a| a.id() != dead).collect();
    let index = put_through(relayed[1], &c.admin_token, "relayed/two", "yes").await;
    let took = c
        .wait_until(
            "every live ledger to apply a write after a replica died",
            Duration::from_secs(15),
            |_| {
                let ok = alive.iter().all(|a| applied(a) >= index);
                async move { ok }
            },
        )
        .await
        .expect("applied by the live members");
    println!("a write reached every live member {took:?} after its replica died");
    c.wait_until(
        "a live learner in the dead one's place",
        Duration::from_secs(60),
        |_| {
            let (_, l) = replicas_of(alive[0]);
            let ok = l.len() == learners && !l.contains(&dead);
            async move { ok }
        },
    )
    .await
    .expect("learner replaced");
    for a in alive {
        a.shutdown().await;
    }
}
