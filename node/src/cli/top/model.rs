//! What one frame of `shoal top` shows, as plain data: fetched by the I/O
//! loop (the parent module), drawn by the `frame` module.

use crate::api::telemetry::{GpuTelemetry, NodeTelemetry, Telemetry};
use shoal_sdk::{CheckpointInfo, EventInfo, JobInfo, NodeInfo};

/// Events kept for the "recent events" pane.
pub const RECENT_EVENTS: usize = 50;
/// Log lines kept for `--job`.
pub const LOG_LINES: usize = 200;

#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// The API URL, for the title line.
    pub api: String,
    pub nodes: Vec<NodeInfo>,
    pub jobs: Vec<JobInfo>,
    /// Newest last, at most [`RECENT_EVENTS`].
    pub events: Vec<EventInfo>,
    pub telemetry: Option<Telemetry>,
    /// With `--job`: the job followed.
    pub job: Option<JobView>,
    /// Why the last refresh failed, shown in the status line.
    pub problem: Option<String>,
    /// Wall-clock milliseconds of the refresh, for running times.
    pub now_ms: u64,
    /// The cluster view lists every GPU (temperature, power, memory, job)
    /// instead of one line per node (`--gpus`, or `g`).
    pub show_gpus: bool,
}

#[derive(Clone, Debug)]
pub struct JobView {
    pub job: JobInfo,
    pub checkpoints: Vec<CheckpointInfo>,
    pub log_rank: u32,
    /// The rank's last lines, newest last; `None` when its node's log
    /// could not be read (the reason is in `log_note`).
    pub log: Vec<String>,
    pub log_note: Option<String>,
}

impl Snapshot {
    /// What the answering node knows of node `name`'s GPUs.
    pub fn node_telemetry(&self, name: &str) -> Option<&NodeTelemetry> {
        self.telemetry
            .as_ref()?
            .nodes
            .iter()
            .find(|n| n.name == name)
    }

    /// GPU `index` of node `name`'s latest sample (relayed for the nodes
    /// other than the answering one).
    pub fn gpu_sample(&self, name: &str, index: u32) -> Option<&GpuTelemetry> {
        self.node_telemetry(name)?
            .gpus
            .iter()
            .find(|g| g.index == index)
    }

    /// Mean utilization (percent) of the GPUs `job` holds on node `name`.
    pub fn job_util(&self, name: &str, job: u64) -> Option<f32> {
        self.telemetry
            .as_ref()?
            .nodes
            .iter()
            .find(|n| n.name == name)?
            .job_util
            .get(&job)
            .copied()
    }

    /// A GPU's utilization: its own sample when the answering node is its
    /// node, else the mean over its job's GPUs on that node.
    pub fn gpu_util(&self, node: &NodeInfo, gpu: &shoal_sdk::GpuInfo) -> Option<f32> {
        let t = self
            .telemetry
            .as_ref()?
            .nodes
            .iter()
            .find(|n| n.name == node.name)?;
        if let Some(s) = t.gpus.iter().find(|g| g.index == gpu.index) {
            return Some(s.util_pct as f32);
        }
        match gpu.allocated_to {
            Some(job) => t.job_util.get(&job).copied(),
            None => Some(0.0),
        }
    }
}
