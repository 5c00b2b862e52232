//! Simulated GPUs: the inventory from `--sim-gpus`, and metrics that move
//! plausibly (a deterministic random walk per GPU, seeded by the node name)
//! so dashboards and detectors see something alive. Faults can be injected
//! through a shared handle so tests can make a GPU misbehave.

use super::{GpuSample, GpuSource};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use shoal_sdk::GpuInfo;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// Something a simulated GPU can be told to do.
#[derive(Clone, Debug, PartialEq)]
pub enum SimFault {
    /// One uncorrectable (double-bit) ECC error.
    EccDoubleBit,
    /// An XID error with this code (e.g. 79: fell off the bus).
    Xid(u64),
    /// Run hot and throttle.
    Hot,
    /// Utilization far below its siblings (a straggler rank).
    Slow,
    /// Gone from the driver: no more readings.
    Lost,
    /// Back to normal.
    Clear,
}

impl SimFault {
    /// `ecc-dbe`, `xid:CODE`, `hot`, `slow` or `clear`.
    pub fn parse(s: &str) -> Result<SimFault, String> {
        match s {
            "ecc-dbe" => Ok(SimFault::EccDoubleBit),
            "hot" => Ok(SimFault::Hot),
            "slow" => Ok(SimFault::Slow),
            "clear" => Ok(SimFault::Clear),
            "lost" => Ok(SimFault::Lost),
            other => match other.strip_prefix("xid:").map(str::parse) {
                Some(Ok(code)) => Ok(SimFault::Xid(code)),
                _ => Err(format!(
                    "unknown fault '{other}': use ecc-dbe, xid:CODE, hot, slow, lost or clear"
                )),
            },
        }
    }
}

/// Shared handle to inject faults while the node runs.
#[derive(Clone, Default)]
pub struct FaultInjector {
    pending: Arc<Mutex<Vec<(u32, SimFault)>>>,
}

impl FaultInjector {
    pub fn inject(&self, gpu: u32, fault: SimFault) {
        if let Ok(mut p) = self.pending.lock() {
            p.push((gpu, fault));
        }
    }
}

#[derive(Clone, Debug, Default)]
struct GpuState {
    util: f64,
    temp: f64,
    sbe: u64,
    dbe: u64,
    last_xid: u64,
    hot: bool,
    slow: bool,
    lost: bool,
}

pub struct SimGpus {
    inventory: Vec<GpuInfo>,
    state: BTreeMap<u32, GpuState>,
    rng: ChaCha8Rng,
    faults: FaultInjector,
    busy: BTreeSet<u32>,
}

impl SimGpus {
    pub fn new(mut inventory: Vec<GpuInfo>, node_name: &str) -> Self {
        // Simulated boards: pairs of GPUs share an NVLink bridge, halves of
        // the board share a NUMA node, like a common 8-GPU server.
        let n = inventory.len() as u32;
        for g in &mut inventory {
            g.numa_node = Some(if g.index < n.div_ceil(2) { 0 } else { 1 });
            let peer = g.index ^ 1;
            g.nvlink_peers = if peer < n { vec![peer] } else { vec![] };
        }
        let seed = u64::from_le_bytes(
            blake3::hash(node_name.as_bytes()).as_bytes()[..8]
                .try_into()
                .unwrap_or([0; 8]),
        );
        let state = inventory
            .iter()
            .map(|g| {
                (
                    g.index,
                    GpuState {
                        util: 5.0,
                        temp: 35.0,
                        ..Default::default()
                    },
                )
            })
            .collect();
        SimGpus {
            inventory,
            state,
            rng: ChaCha8Rng::seed_from_u64(seed),
            faults: FaultInjector::default(),
            busy: BTreeSet::new(),
        }
    }

    pub fn injector(&self) -> FaultInjector {
        self.faults.clone()
    }
}

impl GpuSource for SimGpus {
    fn inventory(&self) -> Vec<GpuInfo> {
        self.inventory.clone()
    }

    fn fault_injector(&self) -> Option<FaultInjector> {
        Some(self.faults.clone())
    }

    fn set_busy(&mut self, busy: &BTreeSet<u32>) {
        self.busy.clone_from(busy);
    }

    fn kind(&self) -> &'static str {
        "simulated"
    }

    fn sample(&mut self) -> Vec<GpuSample> {
        let injected: Vec<(u32, SimFault)> = self
            .faults
            .pending
            .lock()
            .map(|mut p| std::mem::take(&mut *p))
            .unwrap_or_default();
        for (gpu, fault) in injected {
            let Some(s) = self.state.get_mut(&gpu) else {
                continue;
            };
            match fault {
                SimFault::EccDoubleBit => s.dbe += 1,
                SimFault::Xid(code) => s.last_xid = code,
                SimFault::Hot => s.hot = true,
                SimFault::Slow => s.slow = true,
                SimFault::Lost => s.lost = true,
                SimFault::Clear => {
                    s.hot = false;
                    s.slow = false;
                    s.lost = false;
                    s.last_xid = 0;
                }
            }
        }
        let mut out = Vec::with_capacity(self.inventory.len());
        for g in &self.inventory {
            let Some(s) = self.state.get_mut(&g.index) else {
                continue;
            };
            if s.lost {
                continue;
            }
            let busy = self.busy.contains(&g.index);
            let target = match (busy, s.slow) {
                (_, true) => 15.0,
                (true, false) => 92.0,
                (false, false) => 3.0,
            };
            s.util = (s.util + (target - s.util) * 0.3 + self.rng.random_range(-3.0..3.0))
                .clamp(0.0, 100.0);
            let temp_target = if s.hot { 92.0 } else { 35.0 + s.util * 0.4 };
            s.temp += (temp_target - s.temp) * 0.2 + self.rng.random_range(-0.5..0.5);
            if self.rng.random_range(0..10_000) == 0 {
                s.sbe += 1;
            }
            let fb_total = g.memory_mb;
            let fb_used = if busy {
                fb_total * 8 / 10
            } else {
                512.min(fb_total)
            };
            out.push(GpuSample {
                index: g.index,
                util_pct: s.util.round() as u32,
                fb_used_mb: fb_used,
                fb_free_mb: fb_total.saturating_sub(fb_used),
                temp_c: s.temp.round().max(0.0) as u32,
                power_w: 70.0 + s.util * 6.3,
                ecc_sbe_total: s.sbe,
                ecc_dbe_total: s.dbe,
                last_xid: s.last_xid,
                throttle: if s.hot {
                    vec!["HW_THERMAL_SLOWDOWN".into()]
                } else {
                    vec![]
                },
            });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_metrics_move_and_faults_show() {
        let inv = crate::gpu::parse_sim_gpus("4xH100-80GB", "n1").expect("spec");
        let mut g = SimGpus::new(inv, "n1");
        let inj = g.injector();
        let first = g.sample();
        assert_eq!(first.len(), 4);
        assert!(first
            .iter()
            .all(|s| s.fb_free_mb + s.fb_used_mb == 80 * 1024));
        inj.inject(2, SimFault::EccDoubleBit);
        inj.inject(1, SimFault::Hot);
        inj.inject(3, SimFault::Xid(79));
        let mut last = Vec::new();
        for _ in 0..30 {
            last = g.sample();
        }
        assert_eq!(last[2].ecc_dbe_total, 1);
        assert!(last[1].temp_c > 80, "{:?}", last[1]);
        assert_eq!(last[1].throttle, vec!["HW_THERMAL_SLOWDOWN".to_string()]);
        assert_eq!(last[3].last_xid, 79);
        assert_eq!(g.inventory()[0].nvlink_peers, vec![1]);
    }

    #[test]
    fn held_gpus_work_hard_and_a_slow_one_falls_behind() {
        let inv = crate::gpu::parse_sim_gpus("3xH100-80GB", "n1").expect("spec");
        let mut g = SimGpus::new(inv, "n1");
        g.set_busy(&BTreeSet::from([0, 1]));
        g.injector().inject(1, SimFault::Slow);
        let mut last = Vec::new();
        for _ in 0..30 {
            last = g.sample();
        }
        assert!(last[0].util_pct > 80, "{:?}", last[0]);
        assert!(last[1].util_pct < 30, "{:?}", last[1]);
        assert!(last[2].util_pct < 10, "{:?}", last[2]);
    }

    #[test]
    fn the_same_node_name_gives_the_same_series() {
        let inv = crate::gpu::parse_sim_gpus("2xL4", "n1").expect("spec");
        let mut a = SimGpus::new(inv.clone(), "n1");
        let mut b = SimGpus::new(inv, "n1");
        for _ in 0..10 {
            assert_eq!(a.sample(), b.sample());
        }
    }
}
