use super::*;
use crate::sched::{schedule, Policy, TopologyProximity};
use crate::store::{open_db, LogStore, StateMachineStore};
use crate::workload::{JobSpec, SchedSnapshot, DEFAULT_TENANT};
use openraft::storage::{RaftLogStorage, RaftStateMachine};
use openraft::{CommittedLeaderId, EntryPayload, RaftLogReader};
use shoal_sdk::GpuInfo;

fn spec(name: &str) -> MemberSpec {
    MemberSpec {
        name: name.into(),
        rpc_addr: format!("127.0.0.1:{}", 7000 + name.len()),
        api_addr: "127.0.0.1:7070".into(),
        gpus: (0..2)
            .map(|index| GpuInfo {
                index,
                model: "H100".into(),
                memory_mb: 81_920,
                uuid: format!("GPU-{name}-{index}"),
                allocated_to: None,
                numa_node: None,
                nvlink_peers: vec![],
                mig_enabled: false,
                health: String::new(),
                health_reason: None,
            })
            .collect(),
        ..Default::default()
    }
}

fn log_id(term: u64, index: u64) -> LogId {
    LogId::new(CommittedLeaderId::new(term, 1), index)
}

/// The log of a three-member cluster with one tenant, a gang running on
/// all three nodes and a pending job, as the leader (node 1) wrote it.
struct Log {
    ledger: Ledger,
    entries: Vec<Entry>,
}

impl Log {
    fn new() -> Self {
        let mut log = Log {
            ledger: Ledger::new(),
            entries: vec![Entry {
                log_id: log_id(1, 0),
                payload: EntryPayload::Membership(Membership::new(
                    vec![BTreeSet::from([1, 2, 3])],
                    (),
                )),
            }],
        };
        log.push(Command::Bootstrap {
            cluster_id: "c1".into(),
            region: "r".into(),
            ca_cert_pem: "old-ca".into(),
            admin_token_hash: "admin-hash".into(),
            first_member: 1,
            spec: spec("n1"),
        });
        log.push(Command::CreateJoinToken {
            hash: "t".into(),
            expires_at_ms: u64::MAX,
            uses: 5,
        });
        log.push(Command::AddMember {
            spec: spec("n22"),
            token_hash: "t".into(),
        });
        log.push(Command::AddMember {
            spec: spec("n333"),
            token_hash: "t".into(),
        });
        log.push(Command::CreateTenant {
            name: "vision".into(),
            limits: Default::default(),
        });
        log.push(Command::SubmitJob {
            spec: job("gang", 3),
        });
        let plan = {
            let snapshot = SchedSnapshot::new(&log.ledger, 5_000, Policy::Fifo);
            let prox = TopologyProximity::new(&snapshot.input.nodes);
            let plan = schedule(&snapshot.input, &prox);
            snapshot.to_plan(&plan, &log.ledger.workload)
        };
        log.push(Command::Schedule(plan));
        // Waits: every node has only one of its two GPUs free.
        log.push(Command::SubmitJob {
            spec: JobSpec {
                gpus_per_node: 2,
                ..job("waits", 3)
            },
        });
        log
    }

    fn push(&mut self, cmd: Command) -> LedgerResponse {
        let index = self.entries.len() as u64;
        let req = LedgerRequest {
            now_ms: 1_000 + index,
            cmd,
        };
        let r = self.ledger.apply(index, &req);
        self.entries.push(Entry {
            log_id: log_id(2, index),
            payload: EntryPayload::Normal(req),
        });
        r
    }
}

fn job(name: &str, nodes: u32) -> JobSpec {
    JobSpec {
        name: name.into(),
        tenant: "vision".into(),
        nodes,
        gpus_per_node: 1,
        time_limit_s: 3600,
        command: vec!["true".into()],
        max_restarts: 2,
        ..Default::default()
    }
}

/// Writes `entries` into a fresh database as a node's log, `committed` up
/// to the given index (None: unknown).
fn node_db(dir: &std::path::Path, entries: &[Entry], committed: Option<u64>) -> Arc<Database> {
    let db = open_db(&dir.join("raft.redb")).expect("db");
    drop(LogStore::new(db.clone()).expect("log store"));
    drop(StateMachineStore::new(db.clone()).expect("sm store"));
    let tx = db.begin_write().expect("tx");
    {
        let mut t = tx.open_table(LOGS).expect("logs");
        for e in entries {
            t.insert(e.log_id.index, encode(e).expect("encode").as_slice())
                .expect("insert");
        }
        let mut m = tx.open_table(META).expect("meta");
        let committed = committed.map(|i| entries[i as usize].log_id);
        m.insert(KEY_COMMITTED, encode(&committed).expect("enc").as_slice())
            .expect("committed");
        let vote = Vote::new_committed(2, 1);
        m.insert(KEY_VOTE, encode(&vote).expect("enc").as_slice())
            .expect("vote");
    }
    tx.commit().expect("commit");
    db
}

use std::sync::Arc;

#[test]
fn every_entry_a_node_holds_is_replayed_and_counted_past_the_commit() {
    let log = Log::new();
    let dir = tempfile::tempdir().expect("dir");
    let last = log.entries.len() as u64 - 1;
    let db = node_db(dir.path(), &log.entries, Some(last - 2));
    let state = read_local_state(&db, &ApplyChecks::default()).expect("read");
    assert_eq!(state.replayed, last + 1);
    assert_eq!(state.past_commit, 2);
    assert_eq!(state.snapshot_at, None);
    assert_eq!(
        state.data.last_applied,
        Some(log.entries[last as usize].log_id)
    );
    assert_eq!(
        state.data.ledger, log.ledger,
        "the same ledger as the leader's"
    );
    assert_eq!(state.vote, Some(Vote::new_committed(2, 1)));
}

#[test]
fn a_hole_in_the_log_is_an_error_not_a_silent_skip() {
    let mut log = Log::new();
    log.entries.remove(3);
    let dir = tempfile::tempdir().expect("dir");
    let db = node_db(dir.path(), &log.entries, None);
    let err = read_local_state(&db, &ApplyChecks::default()).expect_err("a hole");
    assert!(err.to_string().contains("jumps from index 2 to 4"), "{err}");
}

#[test]
fn reseat_leaves_one_member_requeues_its_lost_gangs_and_keeps_the_rest() {
    let log = Log::new();
    let mut data = StateMachineData {
        last_applied: log.entries.last().map(|e| e.log_id),
        membership: StoredMembership::default(),
        ledger: log.ledger.clone(),
    };
    let gang = data
        .ledger
        .workload
        .jobs
        .values()
        .find(|j| j.spec.name == "gang")
        .map(|j| (j.id, j.state))
        .expect("gang");
    assert_eq!(gang.1, JobState::Running, "the gang must be placed first");
    let done = reseat(
        &mut data,
        Survivor::Member(3),
        "10.0.0.3:7071",
        50_000,
        "test",
        &ApplyChecks::default(),
    )
    .expect("reseat");
    assert_eq!(done.node_id, 3);
    assert_eq!(done.removed, vec![(1, "n1".into()), (2, "n22".into())]);
    assert_eq!(done.requeued, vec![gang.0]);
    assert_eq!(done.join_tokens_revoked.len(), 1);
    let l = &data.ledger;
    assert_eq!(l.next_node_id, 4 + ID_GAP_AFTER_RECOVERY);
    assert_eq!(l.members[&1].state, MemberState::Left);
    assert_eq!(l.members[&2].state, MemberState::Left);
    assert_eq!(l.members[&3].state, MemberState::Alive);
    assert_eq!(l.workload.jobs[&gang.0].state, JobState::Requeued);
    assert!(l.workload.jobs[&gang.0].alloc.is_none());
    assert!(l.workload.tenants.contains_key("vision"));
    assert!(l.workload.tenants.contains_key(DEFAULT_TENANT));
    assert_eq!(l.workload.jobs.len(), 2);
    assert!(
        l.api_tokens.contains_key("admin-hash"),
        "the admin token stays"
    );
    assert!(l.join_tokens.values().all(|t| t.revoked));
    assert!(l
        .events
        .events
        .iter()
        .any(|e| e.spec.kind == "cluster_recovered" && e.spec.message.contains("n1, n22")));
    let m = data.membership.membership();
    assert_eq!(m.voter_ids().collect::<Vec<_>>(), vec![3]);
    assert_eq!(m.learner_ids().count(), 0);
    assert_eq!(
        m.get_node(&3).map(|n| n.addr.as_str()),
        Some("10.0.0.3:7071")
    );
    assert_eq!(data.membership.log_id(), &data.last_applied);
}

#[test]
fn a_new_survivor_gets_an_id_past_the_gap_and_may_take_a_removed_name() {
    let log = Log::new();
    let mut data = StateMachineData {
        last_applied: log.entries.last().map(|e| e.log_id),
        membership: StoredMembership::default(),
        ledger: log.ledger.clone(),
    };
    let done = reseat(
        &mut data,
        Survivor::New(Box::new(spec("n1"))),
        "10.0.0.9:7071",
        50_000,
        "restore",
        &ApplyChecks::default(),
    )
    .expect("reseat");
    // Past the ids the lost part of the cluster may have handed out.
    let id = 4 + ID_GAP_AFTER_RECOVERY;
    assert_eq!(done.node_id, id);
    assert_eq!(done.removed.len(), 3);
    let l = &data.ledger;
    assert_eq!(
        l.active_members().map(|m| m.id).collect::<Vec<_>>(),
        vec![id]
    );
    assert_eq!(l.members[&id].spec.name, "n1");
    assert_eq!(l.next_node_id, id + 1);
    assert_eq!(
        l.join_tokens.len(),
        1,
        "the restore's own join token is gone again"
    );
    // A member that left cannot be the survivor.
    let again = reseat(
        &mut data.clone(),
        Survivor::Member(2),
        "x",
        60_000,
        "t",
        &ApplyChecks::default(),
    );
    assert!(again.expect_err("left").contains("has left"));
}

/// What openraft reads back at start-up from a rewritten database: the
/// snapshot at the last index, an empty log purged up to it, that index
/// committed, and the one-voter membership.
#[test]
fn a_rewritten_database_starts_raft_from_the_snapshot_alone() {
    let log = Log::new();
    let dir = tempfile::tempdir().expect("dir");
    let db = node_db(dir.path(), &log.entries, None);
    let mut state = read_local_state(&db, &ApplyChecks::default()).expect("read");
    reseat(
        &mut state.data,
        Survivor::Member(1),
        "127.0.0.1:7001",
        60_000,
        "t",
        &ApplyChecks::default(),
    )
    .expect("reseat");
    let vote = state.vote.expect("vote");
    write_as_only_state(&db, &state.data, &vote).expect("write");

    let rt = tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("rt");
    rt.block_on(async {
        let mut logs = LogStore::new(db.clone()).expect("log store");
        let ls = logs.get_log_state().await.expect("log state");
        let at = state.data.last_applied;
        assert_eq!(ls.last_purged_log_id, at);
        assert_eq!(ls.last_log_id, at);
        assert_eq!(logs.read_committed().await.expect("committed"), at);
        assert_eq!(logs.read_vote().await.expect("vote"), Some(vote));
        assert!(logs
            .try_get_log_entries(0..)
            .await
            .expect("entries")
            .is_empty());
        let mut sm = StateMachineStore::new(db.clone()).expect("sm");
        let (applied, membership) = sm.applied_state().await.expect("applied");
        assert_eq!(applied, at);
        assert_eq!(
            membership.membership().voter_ids().collect::<Vec<_>>(),
            vec![1]
        );
        let snap = sm
            .get_current_snapshot()
            .await
            .expect("snapshot")
            .expect("one");
        assert_eq!(snap.meta.last_log_id, at);
        assert_eq!(snap.meta.last_membership, membership);
        let handle = sm.handle();
        let d = handle.read().expect("lock");
        assert_eq!(d.ledger, state.data.ledger);
    });
    // And read again offline, it is the same state with nothing to replay.
    let again = read_local_state(&db, &ApplyChecks::default()).expect("read");
    assert_eq!(again.replayed, 0);
    assert_eq!(again.data.ledger, state.data.ledger);
}
