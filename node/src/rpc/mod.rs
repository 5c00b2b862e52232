//! Mesh RPC between members: the wire protocol ([`proto`]), the handler
//! that serves peers ([`handler`]), Raft messages ([`raft_transport`]) and
//! checkpoint chunks ([`chunks`]).

pub mod chunks;
pub mod handler;
pub mod proto;
pub mod raft_transport;
