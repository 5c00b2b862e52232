//! What one replay simulates: the cluster's shape, the policy, failures and
//! checkpoints ([`SimConfig`]), and where the cluster's state lives between
//! passes ([`Driver`]). The engine replays what it describes; a report
//! ([`metrics`](crate::metrics)) repeats the policy, shape, seed and failure
//! settings. It depends on no other module of the simulator.

use serde::{Deserialize, Serialize};

use shoal_consensus::sched::Policy;

/// The simulated cluster and policy.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SimConfig {
    pub nodes: u32,
    pub gpus_per_node: u32,
    /// Nodes are split into this many racks of consecutive node ids…
    pub racks: u32,
    /// …and racks into this many zones, all in one region.
    pub zones: u32,
    pub policy: Policy,
    /// Drives failure times and the FIFO baseline's random placement.
    pub seed: u64,
    /// Mean time between failures of one node; `None` disables failures.
    pub fail_mtbf_s: Option<u64>,
    /// Checkpoint period in run time; `None` means restarts lose all work.
    pub ckpt_interval_s: Option<u64>,
    pub gpu_model: String,
    /// Where jobs, tenants and allocations live between passes.
    #[serde(default)]
    pub driver: Driver,
}

/// How the engine turns a scheduling pass into a changed cluster.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Driver {
    /// The engine's own state feeds `schedule` and it applies the plan
    /// itself; fastest.
    #[default]
    Direct,
    /// A real consensus `Ledger` holds jobs, tenants and allocations; each
    /// pass is the live leader's (snapshot, schedule, `Schedule` command,
    /// re-validated by `apply`), and completions, time limits, preemptions
    /// and node failures are ledger commands. See `ledger_driver`.
    Ledger,
}

/// The name used on the command line and in reports.
pub fn driver_name(driver: Driver) -> &'static str {
    match driver {
        Driver::Direct => "direct",
        Driver::Ledger => "ledger",
    }
}

/// Inverse of [`driver_name`].
pub fn parse_driver(name: &str) -> Option<Driver> {
    match name {
        "direct" => Some(Driver::Direct),
        "ledger" => Some(Driver::Ledger),
        _ => None,
    }
}

impl SimConfig {
    /// A failure-free cluster of racks of 32 nodes in 4 zones (or fewer).
    pub fn new(nodes: u32, gpus_per_node: u32, policy: Policy) -> Self {
        let racks = nodes.div_ceil(32).max(1);
        SimConfig {
            nodes,
            gpus_per_node,
            racks,
            zones: racks.min(4),
            policy,
            seed: 0,
            fail_mtbf_s: None,
            ckpt_interval_s: None,
            gpu_model: "H100".to_string(),
            driver: Driver::default(),
        }
    }

    pub fn total_gpus(&self) -> u64 {
        u64::from(self.nodes) * u64::from(self.gpus_per_node)
    }
}
