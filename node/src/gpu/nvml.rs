//! Real GPUs through NVML. The library is opened at run time; on a machine
//! without the NVIDIA driver `open` fails with a reason and the node runs
//! with no accelerators.

use super::{GpuSample, GpuSource};
use nvml_wrapper::bitmasks::event::EventTypes;
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TemperatureSensor};
use nvml_wrapper::enums::event::XidError;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::Nvml;
use shoal_sdk::GpuInfo;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

/// NVLink links per device that NVML can report.
const MAX_NVLINKS: u32 = 18;

pub struct NvmlGpus {
    nvml: Nvml,
    inventory: Vec<GpuInfo>,
    /// `/dev/nvidiaN` minors by index (NVML's index is not the minor).
    minors: BTreeMap<u32, u32>,
    /// The last critical XID of each GPU (by index), from NVML's events.
    xids: Arc<Mutex<BTreeMap<u32, u64>>>,
}

/// Listens for critical XID errors on its own thread and NVML handle (an
/// event set borrows its handle, and `wait` blocks): XIDs are events, not
/// counters. Without event support (some drivers, MIG) nothing is recorded
/// and the log says so once.
fn listen_for_xids(xids: Arc<Mutex<BTreeMap<u32, u64>>>) {
    let spawned = std::thread::Builder::new()
        .name("nvml-xid".into())
        .spawn(move || {
            let Ok(nvml) = Nvml::init() else {
                return;
            };
            let Ok(mut set) = nvml.create_event_set() else {
                tracing::info!("NVML has no event sets here: XID errors are not watched");
                return;
            };
            let count = nvml.device_count().unwrap_or(0);
            for index in 0..count {
                let Ok(dev) = nvml.device_by_index(index) else {
                    continue;
                };
                match dev.register_events(EventTypes::CRITICAL_XID_ERROR, set) {
                    Ok(s) => set = s,
                    Err(e) => {
                        tracing::info!(gpu = index, error = %e, "XID errors of this GPU are not watched");
                        return;
                    }
                }
            }
            loop {
                match set.wait(1000) {
                    Ok(event) => {
                        let (Ok(index), Some(XidError::Value(code))) =
                            (event.device.index(), event.event_data)
                        else {
                            continue;
                        };
                        tracing::warn!(gpu = index, xid = code, "a GPU reported an XID error");
                        if let Ok(mut x) = xids.lock() {
                            x.insert(index, code);
                        }
                    }
                    Err(NvmlError::Timeout) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "stopped watching XID errors");
                        return;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot watch XID errors");
    }
}

impl NvmlGpus {
    pub fn open() -> Result<Self, String> {
        let nvml = Nvml::init().map_err(|e| e.to_string())?;
        let count = nvml
            .device_count()
            .map_err(|e| format!("cannot count devices: {e}"))?;
        let mut bus_ids = Vec::new();
        let mut inventory = Vec::new();
        let mut minors = BTreeMap::new();
        for index in 0..count {
            let Ok(dev) = nvml.device_by_index(index) else {
                continue;
            };
            match dev.minor_number() {
                Ok(minor) => {
                    minors.insert(index, minor);
                }
                Err(e) => {
                    tracing::warn!(gpu = index, error = %e, "no device minor: ranks cannot be given this GPU's /dev node")
                }
            }
            bus_ids.push((index, dev.pci_info().map(|p| p.bus_id).unwrap_or_default()));
            let memory_mb = dev
                .memory_info()
                .map(|m| m.total / (1024 * 1024))
                .unwrap_or(0);
            inventory.push(GpuInfo {
                index,
                model: dev.name().unwrap_or_else(|_| "unknown".into()),
                memory_mb,
                uuid: dev.uuid().unwrap_or_default(),
                allocated_to: None,
                numa_node: dev.numa_node_id().ok(),
                nvlink_peers: Vec::new(),
                mig_enabled: dev.mig_mode().map(|m| m.current == 1).unwrap_or(false),
                health: String::new(),
                health_reason: None,
            });
        }
        // NVLink peers: map each active link's remote PCI bus id back to a
        // local device index.
        for gpu in &mut inventory {
            let Ok(dev) = nvml.device_by_index(gpu.index) else {
                continue;
            };
            let mut peers = Vec::new();
            for link in 0..MAX_NVLINKS {
                let l = dev.link_wrapper_for(link);
                if l.is_active().unwrap_or(false) {
                    if let Ok(remote) = l.remote_pci_info() {
                        if let Some((peer, _)) = bus_ids.iter().find(|(_, b)| *b == remote.bus_id) {
                            if *peer != gpu.index && !peers.contains(peer) {
                                peers.push(*peer);
                            }
                        }
                    }
                }
            }
            peers.sort_unstable();
            gpu.nvlink_peers = peers;
        }
        let xids = Arc::new(Mutex::new(BTreeMap::new()));
        listen_for_xids(xids.clone());
        Ok(NvmlGpus {
            nvml,
            inventory,
            minors,
            xids,
        })
    }
}

impl GpuSource for NvmlGpus {
    fn inventory(&self) -> Vec<GpuInfo> {
        self.inventory.clone()
    }

    fn kind(&self) -> &'static str {
        "nvml"
    }

    fn device_minors(&self) -> BTreeMap<u32, u32> {
        self.minors.clone()
    }

    fn sample(&mut self) -> Vec<GpuSample> {
        let mut out = Vec::new();
        for gpu in &self.inventory {
            let Ok(dev) = self.nvml.device_by_index(gpu.index) else {
                continue;
            };
            let mem = dev.memory_info().ok();
            out.push(GpuSample {
                index: gpu.index,
                util_pct: dev.utilization_rates().map(|u| u.gpu).unwrap_or(0),
                fb_used_mb: mem.as_ref().map(|m| m.used / (1024 * 1024)).unwrap_or(0),
                fb_free_mb: mem.as_ref().map(|m| m.free / (1024 * 1024)).unwrap_or(0),
                temp_c: dev.temperature(TemperatureSensor::Gpu).unwrap_or(0),
                power_w: dev
                    .power_usage()
                    .map(|mw| mw as f64 / 1000.0)
                    .unwrap_or(0.0),
                ecc_sbe_total: dev
                    .total_ecc_errors(MemoryError::Corrected, EccCounter::Volatile)
                    .unwrap_or(0),
                ecc_dbe_total: dev
                    .total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile)
                    .unwrap_or(0),
                // XID errors arrive through NVML's event API, not a counter.
                last_xid: self
                    .xids
                    .lock()
                    .ok()
                    .and_then(|x| x.get(&gpu.index).copied())
                    .unwrap_or(0),
                throttle: dev
                    .current_throttle_reasons()
                    .map(|r| {
                        format!("{r:?}")
                            .split('|')
                            .map(|s| s.trim().to_string())
                            .filter(|s| !s.is_empty() && s != "(empty)")
                            .collect()
                    })
                    .unwrap_or_default(),
            });
        }
        out
    }
}
