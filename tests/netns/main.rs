//! Separate hosts and cut links with network namespaces (root, iproute2):
//! each agent in its own namespace, joined by a bridge.

#[path = "../common/mod.rs"]
mod common;

mod hosts;
mod net;
mod partition;
