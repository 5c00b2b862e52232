//! Chaos runs (`shoal bench chaos`): whole in-process clusters under a
//! seeded fault schedule and a recorded workload, judged by the checkers
//! of the `shoal_chaos` crate. See docs/reliability.md.

pub mod cluster;
pub mod hooks;
pub mod observe;
pub mod panics;
pub mod run;
pub mod workload;
