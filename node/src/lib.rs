//! The `shoal` node: the composition root that wires mesh, consensus and
//! storage together, the HTTP API, and the command-line interface.

pub mod agent;
pub mod anomaly;
pub mod api;
pub mod batcher;
pub mod bench;
pub mod bench_anomaly;
pub mod bench_ckpt;
pub mod bench_cp;
pub mod bench_gossip;
pub mod bench_place;
pub mod bench_recovery;
pub mod ckpt;
pub mod cli;
pub mod cli_ckpt;
pub mod cli_cp;
pub mod cli_jobs;
pub mod config;
pub mod demo;
pub mod dev;
pub mod durability;
pub mod duration;
pub mod executor;
pub mod gpu;
pub mod identity;
pub mod jobs_api;
pub mod local_cluster;
pub mod metrics;
pub mod peers;
pub mod procstat;
pub mod proto;
pub mod reconcile;
pub mod scheduler;
pub mod scrape;
pub mod slurm;
pub mod transport;

pub use agent::{Agent, AgentError, StartMode};
pub use config::Config;
