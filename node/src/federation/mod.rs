//! The federation state a node keeps (docs/federation.md): what it knows
//! of its peer regions and how it reaches them. Below the node's root, so
//! the node can hold it; what a node does with its peers, given the whole
//! node, is the `regions` module above the node.
//!
//! - [`view`]: what this node knows of its peers (pure, `now` passed in);
//! - [`summary`]: this region's summary from the ledger (pure);
//! - [`link`]: bounded requests to a peer region's API, with [`lease`]s;
//! - [`secrets`]: the credentials this region presents to its peers, in
//!   the data directory;
//! - [`config`]: the federation's tuning.

pub mod config;
pub mod lease;
pub mod link;
pub mod secrets;
pub mod summary;
pub mod view;
