//! Disaster recovery on a stopped node's Raft database (etcd's
//! `snapshot restore` and `--force-new-cluster`): read everything the node
//! holds, turn the ledger into that of a cluster with one member, and
//! rewrite the database so that openraft starts from one snapshot whose
//! membership is that member alone as the only voter.
//!
//! Nothing here runs inside Raft: a recovered state is the base of a new
//! cluster's log, never an entry of the old one. The ledger changes are
//! made by applying ordinary commands ([`Ledger::apply_with`]), so that the
//! members that are gone leave exactly as a removed member does (their
//! gangs requeued from their latest checkpoint, or failed without restarts
//! left).

// openraft fixes `StorageError` as the error type of storage reads; it is
// large, but boxing it is not ours to choose (as in `store`).
#![allow(clippy::result_large_err)]

use crate::ledger::{ApplyChecks, Command, Ledger, LedgerRequest, LedgerResponse, MemberSpec};
use crate::store::{
    apply_entry, decode, decode_snapshot, encode, encode_snapshot, read_err, read_snapshot,
    write_err, StateMachineData, KEY_COMMITTED, KEY_PURGED, KEY_SNAP_DATA, KEY_SNAP_META, KEY_VOTE,
    LOGS, META, SNAPSHOT,
};
use crate::types::{Entry, LogId, NodeId, SnapshotMeta, StorageError, StoredMembership, Vote};
use crate::workload::{JobId, JobState};
use openraft::{BasicNode, Membership};
use redb::TableError;
use shoal_sdk::MemberState;
use std::collections::{BTreeMap, BTreeSet};

pub use redb::Database;

/// Why a stopped node's database did not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// Another process (an agent) has it open.
    #[error("the database is in use by another process")]
    InUse,
    #[error("{0}")]
    Other(String),
}

/// Opens an existing Raft database for recovery; refuses one another
/// process holds (redb locks the file while it is open).
pub fn open_stopped(path: &std::path::Path) -> Result<std::sync::Arc<Database>, OpenError> {
    match Database::open(path) {
        Ok(db) => Ok(std::sync::Arc::new(db)),
        Err(redb::DatabaseError::DatabaseAlreadyOpen) => Err(OpenError::InUse),
        Err(e) => Err(OpenError::Other(e.to_string())),
    }
}

/// Everything a node's database holds: its snapshot with every log entry
/// after it applied, in order.
#[derive(Debug)]
pub struct LocalState {
    pub data: StateMachineData,
    pub vote: Option<Vote>,
    /// The commit index the node last recorded (it may lag: it is saved
    /// without an fsync of its own).
    pub committed: Option<LogId>,
    /// Where the node's own snapshot ended.
    pub snapshot_at: Option<LogId>,
    /// Entries applied on top of the snapshot.
    pub replayed: u64,
    /// Of those, the ones past `committed`: entries this node holds whose
    /// commit it never learnt of (possibly never committed at all).
    pub past_commit: u64,
}

/// Reads the snapshot and the whole log of a (stopped) node's database and
/// applies every entry the snapshot does not cover, committed or not, with
/// `checks` (those the live state machine uses). Reads only.
pub fn read_local_state(db: &Database, checks: &ApplyChecks) -> Result<LocalState, StorageError> {
    let mut data = match read_snapshot_if_any(db)? {
        Some(bytes) => decode_snapshot(&bytes)?,
        None => StateMachineData {
            ledger: Ledger::new(),
            ..Default::default()
        },
    };
    let snapshot_at = data.last_applied;
    let tx = db.begin_read().map_err(read_err)?;
    let (vote, committed) = match tx.open_table(META) {
        Ok(meta) => {
            let vote = match meta.get(KEY_VOTE).map_err(read_err)? {
                Some(v) => Some(decode::<Vote>(v.value()).map_err(read_err)?),
                None => None,
            };
            let committed = match meta.get(KEY_COMMITTED).map_err(read_err)? {
                Some(v) => decode::<Option<LogId>>(v.value()).map_err(read_err)?,
                None => None,
            };
            (vote, committed)
        }
        Err(TableError::TableDoesNotExist(_)) => (None, None),
        Err(e) => return Err(read_err(e)),
    };
    let mut replayed = 0;
    let mut past_commit = 0;
    match tx.open_table(LOGS) {
        Ok(logs) => {
            let start = data.last_applied.map_or(0, |l| l.index + 1);
            for (expect, item) in (start..).zip(logs.range(start..).map_err(read_err)?) {
                let (_, v) = item.map_err(read_err)?;
                let e: Entry = decode(v.value()).map_err(read_err)?;
                if e.log_id.index != expect {
                    return Err(read_err(format!(
                        "the Raft log jumps from index {} to {}: the database is damaged",
                        expect.saturating_sub(1),
                        e.log_id.index
                    )));
                }
                if committed.is_none_or(|c| e.log_id.index > c.index) {
                    past_commit += 1;
                }
                apply_entry(&mut data, e, checks);
                replayed += 1;
            }
        }
        Err(TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(read_err(e)),
    }
    Ok(LocalState {
        data,
        vote,
        committed,
        snapshot_at,
        replayed,
        past_commit,
    })
}

fn read_snapshot_if_any(db: &Database) -> Result<Option<Vec<u8>>, StorageError> {
    let tx = db.begin_read().map_err(read_err)?;
    match tx.open_table(SNAPSHOT) {
        Ok(_) => Ok(read_snapshot(db)?.map(|(_, bytes)| bytes)),
        Err(TableError::TableDoesNotExist(_)) => Ok(None),
        Err(e) => Err(read_err(e)),
    }
}

/// Raft membership of one voter, `id` at `rpc_addr`, as of `at`.
pub fn single_voter(id: NodeId, rpc_addr: &str, at: Option<LogId>) -> StoredMembership {
    StoredMembership::new(
        at,
        Membership::new(
            vec![BTreeSet::from([id])],
            BTreeMap::from([(id, BasicNode::new(rpc_addr))]),
        ),
    )
}

/// Writes `data` into `db` as the node's only state: the snapshot at
/// `data.last_applied` (with `data.membership`), an empty log purged up to
/// it, that index committed, and `vote`. One write transaction: the
/// database holds either the old state or the new one.
pub fn write_as_only_state(
    db: &Database,
    data: &StateMachineData,
    vote: &Vote,
) -> Result<(), StorageError> {
    let at = data
        .last_applied
        .ok_or_else(|| write_err("the ledger is empty: there is nothing to recover"))?;
    let meta = SnapshotMeta {
        last_log_id: Some(at),
        last_membership: data.membership.clone(),
        snapshot_id: format!("{}-{}-recovered", at.leader_id, at.index),
    };
    let bytes = encode_snapshot(data)?;
    let meta_bytes = encode(&meta).map_err(write_err)?;
    let vote_bytes = encode(vote).map_err(write_err)?;
    let committed_bytes = encode(&Some(at)).map_err(write_err)?;
    let purged_bytes = encode(&at).map_err(write_err)?;
    let tx = db.begin_write().map_err(write_err)?;
    {
        let mut logs = tx.open_table(LOGS).map_err(write_err)?;
        logs.retain(|_, _| false).map_err(write_err)?;
        let mut m = tx.open_table(META).map_err(write_err)?;
        m.insert(KEY_VOTE, vote_bytes.as_slice())
            .map_err(write_err)?;
        m.insert(KEY_COMMITTED, committed_bytes.as_slice())
            .map_err(write_err)?;
        m.insert(KEY_PURGED, purged_bytes.as_slice())
            .map_err(write_err)?;
        let mut s = tx.open_table(SNAPSHOT).map_err(write_err)?;
        s.insert(KEY_SNAP_META, meta_bytes.as_slice())
            .map_err(write_err)?;
        s.insert(KEY_SNAP_DATA, bytes.as_slice())
            .map_err(write_err)?;
    }
    tx.commit().map_err(write_err)
}

/// Node ids a recovery skips: the lost part of the cluster may have
/// admitted members after the last entry the recovered ledger holds, and
/// with the CA kept their certificates stay valid; a node that joins the
/// recovered cluster must never get the id one of them has.
pub const ID_GAP_AFTER_RECOVERY: NodeId = 1000;

/// Who the one member of the recovered cluster is.
#[derive(Clone, Debug)]
pub enum Survivor {
    /// A member of the ledger that keeps its id (`--force-new-cluster`).
    Member(NodeId),
    /// A new node admitted by the recovery itself (a restore into a fresh
    /// data dir): it gets the next node id.
    New(Box<MemberSpec>),
}

/// What [`reseat`] did.
#[derive(Clone, Debug, Default)]
pub struct Reseated {
    /// The id of the only member.
    pub node_id: NodeId,
    /// Members marked left: (id, name).
    pub removed: Vec<(NodeId, String)>,
    /// Jobs that lost their allocation and wait to be placed again.
    pub requeued: Vec<JobId>,
    /// Jobs that lost their allocation with no restarts left.
    pub failed: Vec<JobId>,
    /// Join tokens revoked (ids): they were made to join the old cluster.
    pub join_tokens_revoked: Vec<String>,
}

/// Makes the ledger that of a cluster whose only member is `survivor`, at
/// `rpc_addr`: every other member leaves (through the same command a
/// removal commits), node ids skip [`ID_GAP_AFTER_RECOVERY`], unused join
/// tokens are revoked, the survivor is alive,
/// an event records the recovery and `why`, and the Raft membership is the
/// survivor alone as voter. The ledger's admin and API tokens, tenants,
/// jobs, objects and checkpoint catalog stay. Deterministic for `now_ms`.
pub fn reseat(
    data: &mut StateMachineData,
    survivor: Survivor,
    rpc_addr: &str,
    now_ms: u64,
    why: &str,
    checks: &ApplyChecks,
) -> Result<Reseated, String> {
    let at = data
        .last_applied
        .ok_or("the ledger is empty: there is nothing to recover")?;
    if data.ledger.cluster.is_none() {
        return Err("the ledger has no cluster record: there is nothing to recover".into());
    }
    if let Survivor::Member(id) = &survivor {
        match data.ledger.members.get(id) {
            None => return Err(format!("node {id} is not a member of this ledger")),
            Some(m) if m.state == MemberState::Left => {
                return Err(format!(
                    "node {id} ({}) has left the cluster in this ledger",
                    m.spec.name
                ))
            }
            Some(_) => {}
        }
    }
    let keep = match &survivor {
        Survivor::Member(id) => Some(*id),
        Survivor::New(_) => None,
    };
    let index = at.index;
    let ledger = &mut data.ledger;
    let apply = |ledger: &mut Ledger, cmd: Command| {
        ledger.apply_with(index, &LedgerRequest { now_ms, cmd }, checks)
    };
    let before: BTreeMap<JobId, JobState> = job_states(ledger);
    let mut out = Reseated::default();

    let others: Vec<(NodeId, String)> = ledger
        .active_members()
        .filter(|m| Some(m.id) != keep)
        .map(|m| (m.id, m.spec.name.clone()))
        .collect();
    for (id, name) in others {
        let state = MemberState::Left;
        match apply(ledger, Command::SetMemberState { id, state }) {
            LedgerResponse::Ok => out.removed.push((id, name)),
            other => return Err(format!("could not remove node {id} ({name}): {other:?}")),
        }
    }
    ledger.next_node_id = ledger.next_node_id.saturating_add(ID_GAP_AFTER_RECOVERY);
    let open_tokens: Vec<String> = ledger
        .join_tokens
        .values()
        .filter(|t| !t.revoked && t.uses_left > 0 && t.expires_at_ms > now_ms)
        .map(|t| t.id.clone())
        .collect();
    for id in open_tokens {
        if apply(ledger, Command::RevokeJoinToken { id: id.clone() }) == LedgerResponse::Ok {
            out.join_tokens_revoked.push(id);
        }
    }

    out.node_id = match survivor {
        Survivor::Member(id) => {
            let alive = ledger
                .members
                .get(&id)
                .is_some_and(|m| m.state == MemberState::Alive);
            if !alive {
                let state = MemberState::Alive;
                match apply(ledger, Command::SetMemberState { id, state }) {
                    LedgerResponse::Ok => {}
                    other => return Err(format!("could not mark node {id} alive: {other:?}")),
                }
            }
            id
        }
        Survivor::New(spec) => {
            // Admitted the way every member is, with a join token of its
            // own that is gone again once used.
            let hash = format!("restore-{index}-{now_ms}");
            let token = Command::CreateVoterJoinToken {
                hash: hash.clone(),
                expires_at_ms: now_ms.saturating_add(60_000),
                uses: 1,
            };
            match apply(ledger, token) {
                LedgerResponse::Ok => {}
                other => return Err(format!("could not admit the restored node: {other:?}")),
            }
            let admitted = apply(
                ledger,
                Command::AddMember {
                    spec: *spec,
                    token_hash: hash.clone(),
                },
            );
            ledger.join_tokens.remove(&hash);
            ledger.voter_eligibility.voter_tokens.remove(&hash);
            match admitted {
                LedgerResponse::NodeId(id) => id,
                LedgerResponse::Rejected(why) => {
                    return Err(format!("the restored node was refused: {why}"))
                }
                other => return Err(format!("could not admit the restored node: {other:?}")),
            }
        }
    };

    // The one member left is the only voter, whatever its token was.
    ledger.voter_eligibility.learners_only.remove(&out.node_id);

    let after = job_states(ledger);
    for (job, state) in &after {
        let was_holding = matches!(
            before.get(job),
            Some(JobState::Running | JobState::Checkpointing)
        );
        if !was_holding {
            continue;
        }
        match state {
            JobState::Requeued | JobState::Pending => out.requeued.push(*job),
            JobState::Failed | JobState::NodeFail | JobState::Timeout | JobState::OutOfMemory => {
                out.failed.push(*job)
            }
            _ => {}
        }
    }
    let removed: Vec<&str> = out.removed.iter().map(|(_, n)| n.as_str()).collect();
    let message = format!(
        "{why}: node {} is the only member and voter from log index {index}; removed {}",
        out.node_id,
        if removed.is_empty() {
            "no other member".to_string()
        } else {
            removed.join(", ")
        }
    );
    let event = crate::events::EventSpec {
        severity: crate::events::Severity::Critical,
        kind: "cluster_recovered".into(),
        node: Some(out.node_id),
        gpu: None,
        job: None,
        message,
        resource: None,
    };
    apply(ledger, Command::RecordEvent(event));
    data.membership = single_voter(out.node_id, rpc_addr, Some(at));
    Ok(out)
}

fn job_states(ledger: &Ledger) -> BTreeMap<JobId, JobState> {
    ledger
        .workload
        .jobs
        .iter()
        .map(|(id, j)| (*id, j.state))
        .collect()
}

/// Replaces the cluster CA certificate in the ledger (a recovery that has no
/// copy of the old CA key makes a new CA). Join tokens pin the CA, so every
/// one made before no longer matches.
pub fn replace_ca_cert(data: &mut StateMachineData, ca_cert_pem: &str) -> Result<(), String> {
    if ca_cert_pem.matches("-----BEGIN CERTIFICATE-----").count() != 1 {
        return Err("the cluster CA must be exactly one certificate".into());
    }
    match data.ledger.cluster.as_mut() {
        Some(c) => {
            c.ca_cert_pem = ca_cert_pem.to_string();
            // A rotation of the old CA, and what members said about it,
            // mean nothing under a new one.
            data.ledger.ca.rotation = None;
            data.ledger.ca.reports.clear();
            Ok(())
        }
        None => Err("the ledger has no cluster record".into()),
    }
}

#[cfg(test)]
mod tests;
