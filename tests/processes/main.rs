//! End to end on spawned `shoal` processes on loopback: the CLI contract,
//! kill -9 and restarts, jobs and failover, `shoal cp`, checkpoint
//! durability, metrics and events, the Python SDK. Every test that starts
//! an agent holds `common::one_at_a_time`, so agents of two tests never
//! share the cores.

#[path = "../common/mod.rs"]
mod common;

mod ckpt_durability;
mod cli;
mod cluster;
mod cp;
mod dashboard;
mod disk_full;
mod doctor;
mod federation;
mod global_caps;
mod graceful_stop;
mod https_api;
mod install;
mod isolation;
mod jobs;
mod metrics;
mod python_sdk;
mod recovery;
mod region_failover;
mod upgrade;
