//! Sub-second anomaly detection inside the agent: samples the GPUs every
//! 250 ms, compares each sample with the previous one, and commits an event
//! for every new problem (double-bit ECC error, XID error, thermal or power
//! throttling, a GPU that stopped answering). Node-down events come from the
//! ledger itself when the leader commits a member down. Edge-triggered and
//! de-duplicated in `apply`, so a persistent fault is reported once.

use crate::agent::Inner;
use crate::gpu::GpuSample;
use shoal_consensus::events::{EventSpec, Severity};
use shoal_consensus::{Command, NodeId};
use std::collections::BTreeMap;
use std::sync::Weak;
use std::time::Duration;
use tokio::sync::watch;

pub const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// New problems between two consecutive samples of one node's GPUs.
/// `holders` maps a GPU index to the job holding it.
pub fn detect(
    node: NodeId,
    node_name: &str,
    inventory: &[u32],
    previous: &[GpuSample],
    current: &[GpuSample],
    holders: &BTreeMap<u32, u64>,
) -> Vec<EventSpec> {
    let before: BTreeMap<u32, &GpuSample> = previous.iter().map(|s| (s.index, s)).collect();
    let now: BTreeMap<u32, &GpuSample> = current.iter().map(|s| (s.index, s)).collect();
    let mut events = Vec::new();
    let mut event = |severity, kind: &str, gpu: u32, message: String| {
        events.push(EventSpec {
            severity,
            kind: kind.to_string(),
            node: Some(node),
            gpu: Some(gpu),
            job: holders.get(&gpu).copied(),
            message,
        })
    };
    for &gpu in inventory {
        let (Some(prev), cur) = (before.get(&gpu), now.get(&gpu)) else {
            continue;
        };
        let Some(cur) = cur else {
            event(
                Severity::Critical,
                "gpu_lost",
                gpu,
                format!("GPU {gpu} of {node_name} stopped answering"),
            );
            continue;
        };
        if cur.ecc_dbe_total > prev.ecc_dbe_total {
            event(
                Severity::Critical,
                "gpu_ecc_dbe",
                gpu,
                format!(
                    "GPU {gpu} of {node_name}: {} new double-bit ECC error(s)",
                    cur.ecc_dbe_total - prev.ecc_dbe_total
                ),
            );
        }
        if cur.last_xid != 0 && cur.last_xid != prev.last_xid {
            event(
                Severity::Critical,
                "gpu_xid",
                gpu,
                format!("GPU {gpu} of {node_name}: XID {}", cur.last_xid),
            );
        }
        for reason in &cur.throttle {
            if !prev.throttle.contains(reason) {
                event(
                    Severity::Warning,
                    "gpu_throttle",
                    gpu,
                    format!(
                        "GPU {gpu} of {node_name} throttling: {reason} at {} °C",
                        cur.temp_c
                    ),
                );
            }
        }
    }
    events
}

pub async fn run(inner: Weak<Inner>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut previous: Vec<GpuSample> = Vec::new();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.changed() => return,
        }
        let Some(inner) = inner.upgrade() else { return };
        let current = match inner.gpu.lock() {
            Ok(mut g) => match g.source.as_mut() {
                Some(src) => {
                    let samples = src.sample();
                    g.latest = samples.clone();
                    samples
                }
                None => continue,
            },
            Err(_) => return,
        };
        if !previous.is_empty() {
            let inventory: Vec<u32> = inner.spec.gpus.iter().map(|g| g.index).collect();
            let holders: BTreeMap<u32, u64> = inner
                .read_ledger()
                .map(|d| {
                    crate::jobs_api::gpu_owners(&d.ledger)
                        .into_iter()
                        .filter(|((node, _), _)| *node == inner.id)
                        .map(|((_, gpu), job)| (gpu, job))
                        .collect()
                })
                .unwrap_or_default();
            for spec in detect(
                inner.id,
                &inner.name,
                &inventory,
                &previous,
                &current,
                &holders,
            ) {
                tracing::warn!(kind = %spec.kind, gpu = ?spec.gpu, "{}", spec.message);
                let inner = inner.clone();
                tokio::spawn(async move {
                    if let Err(e) = inner.write(Command::RecordEvent(spec)).await {
                        tracing::warn!(error = %e.message, "could not record an event");
                    }
                });
            }
        }
        previous = current;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(index: u32) -> GpuSample {
        GpuSample {
            index,
            util_pct: 90,
            fb_used_mb: 1,
            fb_free_mb: 1,
            temp_c: 50,
            power_w: 300.0,
            ecc_sbe_total: 0,
            ecc_dbe_total: 0,
            last_xid: 0,
            throttle: vec![],
        }
    }

    #[test]
    fn each_new_fault_is_one_event_and_persisting_ones_are_not_repeated() {
        let before = vec![sample(0), sample(1), sample(2)];
        let mut after = before.clone();
        after[0].ecc_dbe_total = 1;
        after[1].last_xid = 79;
        after[2].throttle = vec!["HW_THERMAL_SLOWDOWN".into()];
        let holders = BTreeMap::from([(1, 42)]);
        let events = detect(7, "n7", &[0, 1, 2, 3], &before, &after, &holders);
        let kinds: Vec<(&str, Option<u32>, Option<u64>)> = events
            .iter()
            .map(|e| (e.kind.as_str(), e.gpu, e.job))
            .collect();
        assert_eq!(
            kinds,
            [
                ("gpu_ecc_dbe", Some(0), None),
                ("gpu_xid", Some(1), Some(42)),
                ("gpu_throttle", Some(2), None)
            ]
        );
        assert!(detect(7, "n7", &[0, 1, 2], &after, &after, &holders).is_empty());
        let lost = detect(7, "n7", &[0, 1, 2], &after, &after[..2], &holders);
        assert_eq!(lost.len(), 1);
        assert_eq!(lost[0].kind, "gpu_lost");
    }
}
