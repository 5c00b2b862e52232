//! openraft type configuration.

use crate::command::{LedgerRequest, LedgerResponse};
use std::io::Cursor;

pub use crate::ids::NodeId;

openraft::declare_raft_types!(
    /// Shoal's Raft types: ledger commands in, ledger responses out.
    pub TypeConfig:
        D = LedgerRequest,
        R = LedgerResponse,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type Vote = openraft::Vote<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, openraft::BasicNode>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, openraft::BasicNode>;
pub type StorageError = openraft::StorageError<NodeId>;
