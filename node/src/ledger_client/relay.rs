//! The committed log relayed between members: how a member outside the
//! Raft replicas keeps a whole ledger of its own
//! (`shoal_consensus::replicas`).
//!
//! The asking side sends the last entry it applied; the serving side
//! answers with the entries it has applied since, or its snapshot when it
//! no longer holds them, and holds the question while there is nothing
//! newer (a long poll: an idle member costs one round trip per wait, and
//! a new entry reaches it one hop after the server applied it). The asker
//! hands what it got to its own Raft as the leader's AppendEntries would,
//! under the vote of the leader that committed them: only committed
//! entries travel, so a relay can never make a member apply what the
//! cluster did not decide, and the member's Raft checks that the entries
//! follow on from its own log as it checks the leader's.

use super::client::LedgerClient;
use crate::proto::{ErrorCode, Request, Response, WireError};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse};
use openraft::storage::{RaftLogReader, Snapshot};
use shoal_consensus::types::{LogId, TypeConfig};
use shoal_consensus::NodeId;
use std::io::Cursor;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// The longest a server holds a question while nothing is newer.
pub const MAX_WAIT: Duration = Duration::from_secs(10);
/// Entries per answer at most: a member far behind catches up in a few
/// round trips without one answer the size of the whole log.
const MAX_BATCH: u64 = 512;

/// What one question to a relay brought.
#[derive(Debug, PartialEq, Eq)]
pub enum Followed {
    /// Nothing newer within the wait.
    Nothing,
    /// This many entries appended.
    Entries(usize),
    /// A snapshot installed.
    Snapshot,
}

impl LedgerClient {
    /// Serves `Request::FollowLog` for member `asker`: the entries this
    /// node applied after `after`, held up to `wait` while there are none.
    /// Only to a member this node's ledger knows (and has not seen leave:
    /// the caller refuses those before this).
    pub async fn serve_log(
        &self,
        asker: NodeId,
        after: Option<LogId>,
        wait: Duration,
    ) -> Result<Response, WireError> {
        let known = self
            .read()
            .map(|d| d.ledger.members.contains_key(&asker))
            .unwrap_or(false);
        if !known {
            return Err(WireError::new(
                ErrorCode::Forbidden,
                format!("node {asker} is not a member this node knows yet"),
            ));
        }
        let deadline = Instant::now() + wait.min(MAX_WAIT);
        // Woken by what the log and the vote do, not by the leader's
        // replication metrics, which change with every acknowledgement.
        let mut data = self.raft().data_metrics();
        let mut server = self.raft().server_metrics();
        let (vote, applied, purged) = loop {
            let (applied, purged) = {
                let d = data.borrow_and_update();
                (d.last_applied, d.purged)
            };
            let vote = server.borrow_and_update().vote;
            let newer = applied.map(|a| a.index) > after.map(|a| a.index);
            // Entries go out under the vote of a leader that committed
            // them; mid-election there is none to name, so they wait.
            if newer && vote.is_committed() {
                break (vote, applied, purged);
            }
            let stopped = || WireError::new(ErrorCode::Unavailable, "the ledger has stopped");
            tokio::select! {
                changed = data.changed() => changed.map_err(|_| stopped())?,
                changed = server.changed() => changed.map_err(|_| stopped())?,
                _ = tokio::time::sleep_until(deadline.into()) => {
                    return Ok(Response::LogEntries { vote, entries: Vec::new() });
                }
            }
        };
        let Some(applied) = applied else {
            return Ok(Response::LogEntries {
                vote,
                entries: Vec::new(),
            });
        };
        let first = after.map_or(0, |a| a.index + 1);
        if purged.is_some_and(|p| first <= p.index) {
            return self.serve_snapshot(vote).await;
        }
        let last = applied.index.min(first + MAX_BATCH - 1);
        let mut reader = self.log_reader();
        let entries = reader
            .try_get_log_entries(first..=last)
            .await
            .map_err(|e| WireError::new(ErrorCode::Internal, format!("reading the log: {e}")))?;
        // Purged while we read: the snapshot has it all.
        if entries.first().map(|e| e.log_id.index) != Some(first) {
            return self.serve_snapshot(vote).await;
        }
        Ok(Response::LogEntries { vote, entries })
    }

    async fn serve_snapshot(
        &self,
        vote: shoal_consensus::types::Vote,
    ) -> Result<Response, WireError> {
        let snapshot = self.raft().get_snapshot().await.map_err(|e| {
            WireError::new(ErrorCode::Unavailable, format!("reading the snapshot: {e}"))
        })?;
        match snapshot {
            Some(s) => Ok(Response::LogSnapshot {
                vote,
                meta: s.meta,
                data: s.snapshot.into_inner(),
            }),
            None => Err(WireError::new(
                ErrorCode::Unavailable,
                "this node holds neither those entries nor a snapshot yet",
            )),
        }
    }

    /// Asks the member at `addr` (`relay`, when known: a fault filter
    /// judges the link) for the log after this node's applied entry, and
    /// appends or installs what it answers.
    pub async fn follow(
        &self,
        relay: Option<NodeId>,
        addr: SocketAddr,
        wait: Duration,
    ) -> Result<Followed, WireError> {
        let after = self.raft_metrics().borrow().last_applied;
        let req = Request::FollowLog {
            after,
            wait_ms: u32::try_from(wait.as_millis()).unwrap_or(u32::MAX),
        };
        let timeout = wait + self.request_timeout();
        let reply = self.call_at(relay, addr, &req, timeout).await?;
        let raft = self.raft();
        match reply {
            Response::LogEntries { entries, .. } if entries.is_empty() => Ok(Followed::Nothing),
            Response::LogEntries { vote, entries } => {
                let n = entries.len();
                let leader_commit = entries.last().map(|e| e.log_id);
                let appended = raft
                    .append_entries(AppendEntriesRequest::<TypeConfig> {
                        vote,
                        prev_log_id: after,
                        entries,
                        leader_commit,
                    })
                    .await
                    .map_err(|e| WireError::new(ErrorCode::Unavailable, e.to_string()))?;
                match appended {
                    AppendEntriesResponse::Success | AppendEntriesResponse::PartialSuccess(_) => {
                        Ok(Followed::Entries(n))
                    }
                    AppendEntriesResponse::HigherVote(v) => Err(WireError::new(
                        ErrorCode::Unavailable,
                        format!("the relay knows an older leader than this node's vote {v}"),
                    )),
                    AppendEntriesResponse::Conflict => Err(WireError::new(
                        ErrorCode::Internal,
                        "the relay's entries do not follow on from this node's log",
                    )),
                }
            }
            Response::LogSnapshot { vote, meta, data } => {
                raft.install_full_snapshot(
                    vote,
                    Snapshot {
                        meta,
                        snapshot: Box::new(Cursor::new(data)),
                    },
                )
                .await
                .map_err(|e| WireError::new(ErrorCode::Unavailable, e.to_string()))?;
                Ok(Followed::Snapshot)
            }
            _ => Err(WireError::new(
                ErrorCode::Internal,
                "unexpected answer to a log request",
            )),
        }
    }
}
