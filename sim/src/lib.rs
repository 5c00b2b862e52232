//! Trace-replay simulator for Shoal's gang scheduler.
//!
//! [`run()`] replays a job trace ([`trace`]) on a simulated cluster
//! ([`SimConfig`], [`config`]) with a discrete-event engine ([`engine`]) that
//! calls the very scheduler the live cluster uses,
//! [`shoal_consensus::sched::schedule`], at every instant something happens,
//! and summarises the replay as a [`SimReport`] ([`metrics`]);
//! [`plot::write_svg`] charts several reports side by side.
//! With [`Driver::Ledger`] the jobs, tenants and allocations live in a real
//! consensus `Ledger` instead, and every pass and every change is the ledger
//! command the live cluster would commit (`ledger_driver`).
//!
//! Everything is deterministic for a given trace and seed: events are ordered
//! by (time, kind, index), randomness comes from seeded ChaCha streams, and
//! no hash-ordered collection reaches an output.
//!
//! Of Shoal's crates it needs only the scheduler and ledger
//! (`shoal-consensus`) and the API types (`shoal-sdk`). The `shoal sim`
//! subcommand (`shoal-node`) is a front end to [`run::execute`];
//! `examples/sim_speed.rs` measures replay speed.

pub mod config;
pub mod engine;
mod ledger_driver;
pub mod metrics;
pub mod plot;
pub mod run;
pub mod synthetic;
pub mod trace;

pub use config::{driver_name, parse_driver, Driver, SimConfig};
pub use engine::{run, NODE_REPAIR_S};
pub use metrics::{JobOutcome, RunSegment, SimReport, TenantReport};
pub use plot::{write_svg, PlotError};
/// The scheduler's policy, as [`SimConfig::policy`] takes it; its names
/// (`fifo`, `hdrf`, `hdrf-preempt`) are what reports and `--policy` use.
pub use shoal_consensus::sched::Policy;
pub use synthetic::{synthetic_trace, synthetic_trace_for};
pub use trace::{load_trace, parse_traces, GangShape, Trace, TraceError, TraceFormat, TraceJob};
