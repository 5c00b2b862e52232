//! The `shoal` node: the composition root that wires mesh, consensus and
//! storage together, the HTTP API, and the command-line interface.
//!
//! Its modules form layers, each naming only those below it (the
//! architecture test checks it), lowest first:
//!
//! - the wire protocol ([`proto`]), fault injection for tests
//!   ([`faults`]) and pure helpers ([`clock`], [`procstat`], [`hostlist`]);
//! - the host's own facts: [`identity`], [`credentials`], [`backup`],
//!   [`gpu`], the gossip view of its [`peers`], the [`federation`] state;
//! - [`config`] and [`metrics`];
//! - the [`ledger_client`], then [`trust`] (auth, audit, the CA) and the
//!   [`gpu_relay`];
//! - member RPC ([`rpc`]: Raft and chunk transports) and checkpoints
//!   ([`ckpt`]);
//! - the [`node`] itself: its parts and the handles it hands out;
//! - what works on the whole node: [`regions`], the API's [`views`] of
//!   the ledger, the [`worker`] loop; the [`anomaly`] detectors; the
//!   [`executor`], which runs this node's ranks;
//! - the servers and loops: [`rpc_handler`], [`workers`], [`api`];
//! - the [`agent`] (start-up, and the in-process cluster harness);
//! - the [`cli`], benchmarks and chaos runs included.

pub mod agent;
pub mod anomaly;
pub mod api;
pub mod backup;
pub mod ckpt;
pub mod cli;
pub mod clock;
pub mod config;
pub mod credentials;
pub mod executor;
pub mod faults;
pub mod federation;
pub mod gpu;
pub mod gpu_relay;
pub mod hostlist;
pub mod identity;
pub mod ledger_client;
pub mod metrics;
pub mod node;
pub mod peers;
pub mod procstat;
pub mod proto;
pub mod regions;
pub mod rpc;
pub mod rpc_handler;
pub mod trust;
pub mod views;
pub mod worker;
pub mod workers;

#[cfg(test)]
mod architecture;

pub use agent::{Agent, AgentError, StartMode};
pub use config::Config;
