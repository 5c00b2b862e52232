//! What the workload's clients did: every operation with its invocation
//! and completion time and its outcome. A client that timed out does not
//! know whether its operation took effect; the history says so
//! ([`Outcome::Unknown`]) and the checkers must allow both.

use serde::{Deserialize, Serialize};
use std::sync::{Arc, Mutex, PoisonError};

/// An operation of the register workload on one key (`/v1/attrs`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum RegisterOp {
    /// Writes `value`; every write of a run writes a value no other write does.
    Write { key: String, value: String },
    /// Reads the key; the outcome carries what was read (`None`: unset).
    Read { key: String },
}

impl RegisterOp {
    pub fn key(&self) -> &str {
        match self {
            RegisterOp::Write { key, .. } | RegisterOp::Read { key } => key,
        }
    }
}

/// What came back.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    /// Acknowledged. For a read, the value read.
    Ok(Option<String>),
    /// Refused for certain: the operation did not take effect.
    Failed(String),
    /// Timed out or the connection broke: it may or may not have taken
    /// effect, at any time after its invocation.
    Unknown(String),
}

/// One operation of one client.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    pub client: u32,
    pub op: RegisterOp,
    /// Milliseconds since the run started (monotonic clock).
    pub invoked_ms: u64,
    /// When the outcome came back; for an `Unknown` outcome, when the
    /// client gave up (the operation may still take effect later).
    pub completed_ms: u64,
    pub outcome: Outcome,
}

/// The history of a run, shared by its clients.
#[derive(Clone, Default)]
pub struct Recorder {
    entries: Arc<Mutex<Vec<Entry>>>,
}

impl Recorder {
    pub fn new() -> Recorder {
        Recorder::default()
    }

    pub fn record(&self, entry: Entry) {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(entry);
    }

    /// Every entry so far, in the order they completed.
    pub fn entries(&self) -> Vec<Entry> {
        self.entries
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}
