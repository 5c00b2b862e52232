//! Proposal batching on the leader. openraft 0.9 appends (and fsyncs) each
//! `client_write` on its own, so one write costs one fsync plus one
//! replication round trip. The batcher turns the writes that arrive while a
//! proposal is in flight into a single `Command::Batch`, so under load one
//! fsync and one round trip commit many writes.

use crate::proto::{ErrorCode, WireError};
use openraft::error::{ClientWriteError, RaftError};
use shoal_consensus::types::Raft;
use shoal_consensus::{Command, LedgerRequest, LedgerResponse};
use tokio::sync::{mpsc, oneshot};

/// Upper bound of commands in one log entry (keeps entries and replication
/// messages small).
const MAX_BATCH: usize = 512;
/// Upper bound of one log entry's encoded commands: a quarter of the RPC
/// frame, so an AppendEntries always has room for at least one entry (the
/// transport splits larger batches of entries, never an entry).
pub const MAX_ENTRY_BYTES: u64 = shoal_mesh::rpc::MAX_FRAME as u64 / 4;

type Reply = oneshot::Sender<Result<(LedgerResponse, u64), WireError>>;

#[derive(Clone)]
pub struct Batcher {
    tx: mpsc::UnboundedSender<(Command, Reply)>,
}

impl Batcher {
    pub fn spawn(raft: Raft, node_id: u64) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(run(raft, node_id, rx));
        Batcher { tx }
    }

    /// Proposes `cmd` (batched with concurrent ones) and waits for its commit.
    pub async fn propose(&self, cmd: Command) -> Result<(LedgerResponse, u64), WireError> {
        let (reply, rx) = oneshot::channel();
        self.tx
            .send((cmd, reply))
            .map_err(|_| WireError::new(ErrorCode::Unavailable, "the node is shutting down"))?;
        rx.await
            .map_err(|_| WireError::new(ErrorCode::Unavailable, "the node is shutting down"))?
    }
}

/// The encoded size of `cmd`, or why it cannot be one log entry.
fn entry_size(cmd: &Command) -> Result<u64, WireError> {
    let size = bincode::serialized_size(cmd).unwrap_or(u64::MAX);
    if size > MAX_ENTRY_BYTES {
        return Err(WireError::new(
            ErrorCode::Invalid,
            format!("this write is {size} bytes; one ledger entry holds at most {MAX_ENTRY_BYTES}"),
        ));
    }
    Ok(size)
}

async fn run(raft: Raft, node_id: u64, mut rx: mpsc::UnboundedReceiver<(Command, Reply)>) {
    // A write that did not fit the last batch opens the next one.
    let mut carried: Option<(Command, Reply, u64)> = None;
    loop {
        let (first, first_reply, mut bytes) = match carried.take() {
            Some(c) => c,
            None => {
                let Some((cmd, reply)) = rx.recv().await else {
                    return;
                };
                match entry_size(&cmd) {
                    Ok(size) => (cmd, reply, size),
                    Err(e) => {
                        let _ = reply.send(Err(e));
                        continue;
                    }
                }
            }
        };
        let mut batch = vec![(first, first_reply)];
        while batch.len() < MAX_BATCH {
            let Ok((cmd, reply)) = rx.try_recv() else {
                break;
            };
            match entry_size(&cmd) {
                Err(e) => {
                    let _ = reply.send(Err(e));
                }
                Ok(size) if bytes + size > MAX_ENTRY_BYTES => {
                    carried = Some((cmd, reply, size));
                    break;
                }
                Ok(size) => {
                    bytes += size;
                    batch.push((cmd, reply));
                }
            }
        }
        let (mut cmds, replies): (Vec<Command>, Vec<Reply>) = batch.into_iter().unzip();
        let single = cmds.len() == 1;
        let cmd = match cmds.pop() {
            Some(c) if single => c,
            Some(last) => {
                cmds.push(last);
                Command::Batch(cmds)
            }
            None => continue,
        };
        let req = LedgerRequest {
            now_ms: crate::clock::wall_ms(),
            cmd,
        };
        match raft.client_write(req).await {
            Ok(resp) => {
                let index = resp.log_id.index;
                let answers = match resp.data {
                    LedgerResponse::Batch(v) if !single => v,
                    other => vec![other],
                };
                for (reply, answer) in replies.into_iter().zip(answers) {
                    let _ = reply.send(Ok((answer, index)));
                }
            }
            Err(e) => {
                let err = match e {
                    RaftError::APIError(ClientWriteError::ForwardToLeader(_)) => WireError::new(
                        ErrorCode::NotLeader,
                        format!("node {node_id} is not the leader"),
                    ),
                    RaftError::Fatal(f) => {
                        WireError::new(ErrorCode::Unavailable, format!("raft has stopped: {f}"))
                    }
                    RaftError::APIError(other) => {
                        WireError::new(ErrorCode::Internal, other.to_string())
                    }
                };
                for reply in replies {
                    let _ = reply.send(Err(err.clone()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_write_larger_than_an_entry_is_refused_before_raft_sees_it() {
        let small = Command::PutAttr {
            key: "k".into(),
            value: "v".into(),
        };
        assert!(entry_size(&small).is_ok_and(|s| s < 64));
        let huge = Command::PutAttr {
            key: "k".into(),
            value: "x".repeat(MAX_ENTRY_BYTES as usize + 1),
        };
        let err = entry_size(&huge).expect_err("too large");
        assert_eq!(err.code, ErrorCode::Invalid);
        assert!(err.message.contains("at most"), "{}", err.message);
    }
}
