//! What the executor tells the ledger about ranks it did not see end: stalls, ranks lost with the agent, GPU faults.

use super::*;

pub(super) fn report_stall(host: &RankHost, key: &RankKey, silent: Duration) {
    let spec = EventSpec {
        severity: Severity::Warning,
        kind: "job_stalled".into(),
        node: Some(host.local.id),
        gpu: None,
        job: Some(key.job),
        message: format!(
            "job {} rank {} on {}: no new output and no new checkpoint for {} s",
            key.job,
            key.rank,
            host.local.name,
            silent.as_secs()
        ),
        resource: None,
    };
    host.events.record(spec);
}

/// A rank this node launched before the agent restarted died with it (the
/// parent-death signal): say so in its log and the agent's.
pub(super) fn report_lost(host: &RankHost, key: &RankKey) {
    use std::io::Write;
    tracing::warn!(
        job = key.job,
        epoch = key.epoch,
        rank = key.rank,
        "the rank died with this agent's previous run; reporting it lost so the gang restarts together"
    );
    host.metrics.count_rank_exit("lost");
    let log = log_path(&host.jobs_dir, key.job, key.rank);
    if let Ok(mut out) = std::fs::OpenOptions::new().append(true).open(&log) {
        let _ = writeln!(
            out,
            "--- shoal: job {} epoch {} rank {} lost: the agent on {} restarted ---",
            key.job, key.epoch, key.rank, host.local.name
        );
    }
}

/// A rank that died of its GPU (an ECC error, an XID) must not count as
/// the job's failure: the fault is in the ledger before the exit is, so the
/// gang is requeued elsewhere rather than charged a restart. The GPUs are
/// read afresh: the periodic sample may predate the fault.
pub(super) async fn report_gpu_faults(host: &RankHost, gpus: &[u32]) {
    let busy: std::collections::BTreeSet<u32> = gpus.iter().copied().collect();
    let Some(samples) = host.gpus.sample(&busy) else {
        return;
    };
    let inventory: Vec<_> = host
        .local
        .spec
        .gpus
        .iter()
        .filter(|g| busy.contains(&g.index))
        .cloned()
        .collect();
    for (gpu, reason) in crate::gpu::health::faults(&inventory, &samples) {
        let known = host
            .ledger
            .read()
            .map(|d| d.ledger.workload.gpu_fault(host.local.id, gpu).is_some())
            .unwrap_or(false);
        if known {
            continue;
        }
        let cmd = Command::SetGpuFault {
            node: host.local.id,
            gpu,
            fault: Some(shoal_consensus::ledger::GpuFaultReport {
                reason,
                detected: true,
            }),
        };
        if let Err(e) = host.ledger.write(cmd).await {
            tracing::debug!(gpu, error = %e.message, "could not report a GPU fault before a rank's exit");
        }
    }
}
