//! The simulator's integration tests, one binary: replays through the public
//! `shoal_sim` API only.
//!
//! - [`determinism`]: same trace and seed give byte-identical JSON.
//! - [`policies`]: policy comparisons and engine behaviour on small traces.
//! - [`properties`]: invariants over random traces, for every policy.
//! - [`readers`]: the trace readers on the real files and on malformed input.

mod determinism;
mod policies;
mod properties;
mod readers;
