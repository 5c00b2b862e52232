//! Which GPUs must take no work, judged from the driver's readings. Pure:
//! the `gpu_health` worker feeds it.

use super::GpuSample;
use shoal_sdk::GpuInfo;

/// XID codes after which a GPU must not take work until it is reset or
/// replaced (NVIDIA's XID catalogue; the ones DCGM treats as fatal).
pub const FATAL_XIDS: &[(u64, &str)] = &[
    (48, "double-bit ECC error"),
    (62, "internal micro-controller halt"),
    (64, "row remapping failure"),
    (74, "NVLink error"),
    (79, "fell off the bus"),
    (92, "high single-bit ECC error rate"),
    (95, "uncontained ECC error"),
    (119, "GSP RPC timeout"),
    (120, "GSP error"),
];

/// The GPUs of `inventory` that must take no work, with why, judged from
/// one round of `samples` (sans-IO: the worker feeds it).
pub fn faults(inventory: &[GpuInfo], samples: &[GpuSample]) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for gpu in inventory {
        let Some(s) = samples.iter().find(|s| s.index == gpu.index) else {
            // No reading at all means no driver answer yet, not a lost GPU.
            if !samples.is_empty() {
                out.push((gpu.index, "lost: the driver no longer reports it".into()));
            }
            continue;
        };
        if s.ecc_dbe_total > 0 {
            out.push((
                gpu.index,
                format!("uncorrectable ECC errors: {}", s.ecc_dbe_total),
            ));
        } else if let Some((code, what)) = FATAL_XIDS.iter().find(|(c, _)| *c == s.last_xid) {
            out.push((gpu.index, format!("XID {code}: {what}")));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32) -> GpuInfo {
        GpuInfo {
            index,
            model: "H100".into(),
            memory_mb: 80_000,
            uuid: format!("GPU-{index}"),
            allocated_to: None,
            numa_node: None,
            nvlink_peers: vec![],
            mig_enabled: false,
            health: String::new(),
            health_reason: None,
        }
    }

    fn sample(index: u32, dbe: u64, xid: u64) -> GpuSample {
        GpuSample {
            index,
            util_pct: 0,
            fb_used_mb: 0,
            fb_free_mb: 0,
            temp_c: 40,
            power_w: 70.0,
            ecc_sbe_total: 5,
            ecc_dbe_total: dbe,
            last_xid: xid,
            throttle: vec![],
        }
    }

    #[test]
    fn ecc_fatal_xids_and_lost_gpus_are_faults_and_nothing_else_is() {
        let inventory = [gpu(0), gpu(1), gpu(2), gpu(3)];
        let samples = [sample(0, 0, 0), sample(1, 2, 0), sample(2, 0, 79)];
        let found = faults(&inventory, &samples);
        assert_eq!(
            found,
            vec![
                (1, "uncorrectable ECC errors: 2".to_string()),
                (2, "XID 79: fell off the bus".to_string()),
                (3, "lost: the driver no longer reports it".to_string()),
            ]
        );
        // Corrected errors and harmless XIDs (13: a job's own fault) are not.
        assert!(faults(&inventory[..1], &[sample(0, 0, 13)]).is_empty());
        // Before the first reading nothing is judged.
        assert!(faults(&inventory, &[]).is_empty());
    }
}
