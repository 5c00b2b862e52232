//! The replicated brain of Shoal: the ledger state machine (pure), the voter
//! selection policy (pure), the gang scheduler (pure, `sched`), and the openraft plumbing — redb-backed log and
//! state-machine stores, and a network adapter over a transport trait that
//! the node crate implements (this crate never touches sockets).
//!
//! The modules form layers, each naming only those below it (the node
//! crate's architecture test checks it): the pure cores (`ids`, `sched`,
//! `escrow`); each concern's records and rules (`members`, `events`,
//! `namespace`, `voters`, `tokens`, `once`, then `ca`, `workload`, then
//! `federation`), none of which knows the ledger; `command`, the log's
//! entries; `ledger/`, which owns the state, the dispatch, the admission
//! guards (`access`, `limits`, `node_access`) and the transitions that
//! touch more than one concern; then `store`, `network` and `recovery`.

pub mod ca;
pub mod command;
pub mod escrow;
pub mod events;
pub mod federation;
pub mod ids;
pub mod ledger;
pub mod members;
pub mod namespace;
pub mod network;
pub mod once;
pub mod recovery;
pub mod replicas;
pub mod sched;
pub mod store;
pub mod tokens;
pub mod types;
pub mod voters;
pub mod workload;

pub use command::{Command, LedgerRequest, LedgerResponse};
pub use ids::NodeId;
pub use ledger::{access, limits, node_access, Ledger};
pub use members::{Member, MemberSpec};
pub use types::TypeConfig;
