//! The replicated brain of Shoal: the ledger state machine (pure), the voter
//! selection policy (pure), the gang scheduler (pure, `sched`), and the openraft plumbing — redb-backed log and
//! state-machine stores, and a network adapter over a transport trait that
//! the node crate implements (this crate never touches sockets).

pub mod access;
pub mod ca;
pub mod command;
pub mod events;
pub mod federation;
pub mod ledger;
pub mod limits;
pub mod namespace;
pub mod network;
pub mod node_access;
pub mod once;
pub mod recovery;
pub mod sched;
pub mod store;
pub mod tokens;
pub mod types;
pub mod voters;
pub mod workload;

pub use ledger::{Command, Ledger, LedgerRequest, LedgerResponse, Member, MemberSpec};
pub use types::{NodeId, TypeConfig};
