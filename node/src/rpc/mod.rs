//! Mesh RPC between members: Raft messages ([`raft_transport`]),
//! checkpoint chunks ([`chunks`]) and the upload receipts holders keep
//! ([`receipts`]). The wire protocol is [`crate::proto`]; the handler that
//! serves peers needs the whole node, so it sits above it (`rpc_handler`).

pub mod chunks;
pub mod raft_transport;
pub mod receipts;
