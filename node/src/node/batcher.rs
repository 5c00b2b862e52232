//! Proposal batching on the leader. openraft 0.9 appends (and fsyncs) each
//! `client_write` on its own, so one write costs one fsync plus one
//! replication round trip. The batcher turns the writes that arrive while a
//! proposal is in flight into a single `Command::Batch`, so under load one
//! fsync and one round trip commit many writes.

use crate::rpc::proto::{ErrorCode, WireError};
use openraft::error::{ClientWriteError, RaftError};
use shoal_consensus::types::Raft;
use shoal_consensus::{Command, LedgerRequest, LedgerResponse};
use tokio::sync::{mpsc, oneshot};

/// Upper bound of commands in one log entry (keeps entries and replication
/// messages small).
const MAX_BATCH: usize = 512;

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

async fn run(raft: Raft, node_id: u64, mut rx: mpsc::UnboundedReceiver<(Command, Reply)>) {
    while let Some(first) = rx.recv().await {
        let mut batch = vec![first];
        while batch.len() < MAX_BATCH {
            match rx.try_recv() {
                Ok(next) => batch.push(next),
                Err(_) => break,
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
            now_ms: super::clock::wall_ms(),
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
