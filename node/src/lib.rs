//! The `shoal` node: the composition root that wires mesh, consensus and
//! storage together, the HTTP API, and the command-line interface.
//!
//! - [`agent`]: start-up (bootstrap, join, restart) and the in-process
//!   cluster harness ([`agent::testkit`]);
//! - [`node`]: the node's parts and the handles it hands out (ledger
//!   client, auth, peer view, GPUs, identity, config, metrics);
//! - [`rpc`]: mesh RPC (wire protocol, handler, Raft and chunk transports);
//! - [`api`]: the HTTP API, its views of the ledger and `/metrics`;
//! - [`workers`]: the periodic loops (housekeeping, scheduler, durability,
//!   gossip, anomaly detection, webhook);
//! - [`executor`]: runs this node's ranks;
//! - [`ckpt`]: checkpoint replication and restore;
//! - [`cli`] and [`bench`]: the command line and the benchmarks (chaos
//!   runs included).

pub mod agent;
pub mod api;
pub mod bench;
pub mod ckpt;
pub mod cli;
pub mod executor;
pub mod node;
pub mod rpc;
pub mod workers;

#[cfg(test)]
mod architecture;

pub use agent::{Agent, AgentError, StartMode};
pub use node::config::Config;
