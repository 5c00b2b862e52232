//! In-process clusters: several agents in this process, over real QUIC,
//! real TLS and real fsyncs on 127.0.0.1. Every test that starts a cluster
//! holds `common::one_at_a_time`, so tests in this binary never compete for
//! the cores.

#[path = "../common/mod.rs"]
mod common;

mod ca_rotation;
mod chaos;
mod cluster;
mod gpu_health;
mod hostile_input;
mod job_files;
mod mesh_scale;
mod node_trust;
mod partition;
mod relayed;
mod tenancy;
