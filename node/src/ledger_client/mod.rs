//! How the node reads and writes the ledger: the [`LedgerClient`] (reads
//! of the applied state, writes routed to the leader, queries, membership
//! calls), the log [`relay`]ed to members outside the Raft replicas, the
//! write [`batcher`], leadership [`handover`], Raft's timer kept to the
//! nodes that need it ([`raft_timer`]), and the notice that this node was
//! [`removal`]-ed from the cluster.

pub mod batcher;
pub mod client;
pub mod handover;
pub mod per_applied;
pub mod raft_timer;
pub mod read_rounds;
pub mod relay;
pub mod removal;

pub use client::LedgerClient;
