//! Mesh RPC between members: the wire protocol ([`proto`]), the handler
//! that serves peers ([`handler`]), Raft messages ([`raft_transport`]) and
//! checkpoint chunks ([`chunks`]), and the fault-injecting router tests put
//! between them ([`faults`]).

pub mod chunks;
pub mod faults;
pub mod handler;
pub mod proto;
pub mod raft_transport;
pub mod receipts;
