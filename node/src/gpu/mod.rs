//! Accelerator discovery and sampling.
//!
//! Two sources give the same types: NVML (`nvml`), loaded at run time so the
//! binary runs on machines without NVIDIA drivers, and simulated devices
//! (`sim`, from `--sim-gpus 8xH100-80GB`) with plausible, varying metrics and
//! injectable faults, which every test and demo uses.

pub mod health;
pub mod nvml;
pub mod sim;
mod sim_spec;

pub use sim_spec::parse_sim_gpus;

use serde::{Deserialize, Serialize};
use shoal_sdk::GpuInfo;

/// One reading of one GPU, with dcgm-exporter's units.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct GpuSample {
    pub index: u32,
    /// DCGM_FI_DEV_GPU_UTIL, percent.
    pub util_pct: u32,
    /// DCGM_FI_DEV_FB_USED / FB_FREE, MiB.
    pub fb_used_mb: u64,
    pub fb_free_mb: u64,
    /// DCGM_FI_DEV_GPU_TEMP, °C.
    pub temp_c: u32,
    /// DCGM_FI_DEV_POWER_USAGE, W.
    pub power_w: f64,
    /// DCGM_FI_DEV_ECC_SBE_VOL_TOTAL / DBE_VOL_TOTAL.
    pub ecc_sbe_total: u64,
    pub ecc_dbe_total: u64,
    /// Last XID error code seen (DCGM_FI_DEV_XID_ERRORS), 0 when none.
    pub last_xid: u64,
    /// Active clock throttle reasons, e.g. "HW_THERMAL_SLOWDOWN".
    pub throttle: Vec<String>,
}

/// Where a node's accelerators come from.
pub trait GpuSource: Send {
    fn inventory(&self) -> Vec<GpuInfo>;
    /// Reads every GPU now. A GPU that cannot be read is left out.
    fn sample(&mut self) -> Vec<GpuSample>;
    fn kind(&self) -> &'static str;
    /// Each GPU's `/dev/nvidiaN` minor, by index, for the device fence. A
    /// simulated GPU stands for `/dev/nvidia<index>`.
    fn device_minors(&self) -> std::collections::BTreeMap<u32, u32> {
        self.inventory()
            .iter()
            .map(|g| (g.index, g.index))
            .collect()
    }
    /// Which GPUs jobs hold now. Simulated GPUs work hard while held, so
    /// dashboards and detectors see what a real cluster would show; real
    /// GPUs report what they do and ignore this.
    fn set_busy(&mut self, _busy: &std::collections::BTreeSet<u32>) {}
    /// A handle to make simulated GPUs misbehave; `None` for real ones.
    fn fault_injector(&self) -> Option<sim::FaultInjector> {
        None
    }
}

/// Picks the source: simulated GPUs when asked for, else NVML when it finds
/// devices, else none — saying which in one log line.
pub fn discover(
    sim_spec: Option<&str>,
    node_name: &str,
) -> Result<Option<Box<dyn GpuSource>>, String> {
    if let Some(spec) = sim_spec {
        let gpus = parse_sim_gpus(spec, node_name)?;
        tracing::info!(gpus = gpus.len(), spec, "using simulated GPUs");
        return Ok(Some(Box::new(sim::SimGpus::new(gpus, node_name))));
    }
    match nvml::NvmlGpus::open() {
        Ok(n) if !n.inventory().is_empty() => {
            tracing::info!(gpus = n.inventory().len(), "discovered GPUs through NVML");
            Ok(Some(Box::new(n)))
        }
        Ok(_) => {
            tracing::info!(
                "NVML found no GPUs: this node offers 0 GPUs (pass --sim-gpus to simulate some)"
            );
            Ok(None)
        }
        Err(reason) => {
            tracing::info!("no NVIDIA driver found ({reason}): this node offers 0 GPUs (pass --sim-gpus to simulate some)");
            Ok(None)
        }
    }
}

/// This node's GPUs as the rest of the node shares them: the source, its
/// fault injector when simulated, and the latest samples.
#[derive(Clone)]
pub struct Gpus {
    state: std::sync::Arc<std::sync::Mutex<GpuState>>,
}

struct GpuState {
    source: Option<Box<dyn GpuSource>>,
    faults: Option<sim::FaultInjector>,
    latest: Vec<GpuSample>,
}

impl Gpus {
    pub fn new(source: Option<Box<dyn GpuSource>>) -> Self {
        Gpus {
            state: std::sync::Arc::new(std::sync::Mutex::new(GpuState {
                faults: source.as_ref().and_then(|g| g.fault_injector()),
                source,
                latest: Vec::new(),
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, GpuState> {
        // A panic while sampling leaves the samples as they were; they stay usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Samples every GPU now, telling the source which ones jobs hold;
    /// `None` when the node has no GPU source.
    pub fn sample(&self, busy: &std::collections::BTreeSet<u32>) -> Option<Vec<GpuSample>> {
        let mut g = self.lock();
        let src = g.source.as_mut()?;
        src.set_busy(busy);
        let samples = src.sample();
        g.latest = samples.clone();
        Some(samples)
    }

    /// The samples of the last [`Self::sample`].
    pub fn latest(&self) -> Vec<GpuSample> {
        self.lock().latest.clone()
    }

    /// Mean utilisation of the last samples, 0..1 (0 without GPUs).
    pub fn load(&self) -> f32 {
        mean_load(&self.latest())
    }

    /// Each GPU's `/dev/nvidiaN` minor, by index (none without a source).
    pub fn device_minors(&self) -> std::collections::BTreeMap<u32, u32> {
        self.lock()
            .source
            .as_ref()
            .map(|s| s.device_minors())
            .unwrap_or_default()
    }

    /// Whether the GPUs are real (NVML), so CUDA sees them.
    pub fn real(&self) -> bool {
        self.lock()
            .source
            .as_ref()
            .is_some_and(|s| s.kind() == "nvml")
    }

    /// The injector of simulated GPUs; `None` for real ones.
    pub fn fault_injector(&self) -> Option<sim::FaultInjector> {
        self.lock().faults.clone()
    }
}

/// Mean utilisation of `samples`, 0..1 (0 for none).
pub fn mean_load(samples: &[GpuSample]) -> f32 {
    if samples.is_empty() {
        0.0
    } else {
        samples.iter().map(|s| s.util_pct as f32).sum::<f32>() / (100.0 * samples.len() as f32)
    }
}
