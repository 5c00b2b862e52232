//! A rank's checkpoint steps: recording a finished step in the ledger once its parts are replicated, and dropping steps no epoch committed.

use super::*;

/// Waits for the rank's replication in flight, if any. A step that failed
/// (a peer unreachable, the leader changing) is handed out again after
/// `CKPT_RETRY`, so a job that writes one checkpoint and then runs for
/// hours still gets it committed.
pub(super) async fn settle_replication(rank: &mut RunningRank) {
    let Some((step, pending)) = rank.replicating.take() else {
        return;
    };
    if pending.await.unwrap_or(false) {
        rank.recorded_step = Some(step);
        rank.retry_after = None;
    } else {
        rank.reported_step = rank.recorded_step;
        rank.retry_after = Some(Instant::now() + CKPT_RETRY);
    }
}

/// Stores and replicates this rank's part of `step`, then records it in the
/// ledger. False when it should be tried again; a refusal by the ledger is
/// final (another epoch, an older step).
pub(super) async fn record_checkpoint(
    host: &RankHost,
    key: &RankKey,
    step: u64,
    dir: PathBuf,
) -> bool {
    let started = Instant::now();
    let worker = host.chunks.clone();
    let handle = tokio::runtime::Handle::current();
    let (job, rank) = (key.job, key.rank);
    let copies = crate::ckpt::peer_copies(
        host.ledger
            .read()
            .ok()
            .and_then(|d| {
                d.ledger
                    .workload
                    .jobs
                    .get(&job)
                    .map(|j| j.spec.ckpt_peer_copies)
            })
            .unwrap_or_default(),
    );
    let part = tokio::task::spawn_blocking(move || {
        crate::ckpt::replicate_part(&worker, handle, job, rank, step, &dir, copies)
    })
    .await
    .map_err(|e| e.to_string())
    .and_then(|r| r);
    let part = match part {
        Ok(part) => part,
        Err(e) => {
            host.metrics.count_checkpoint_part("failed");
            tracing::warn!(job, rank, step, error = %e, "checkpoint not replicated; will retry");
            return false;
        }
    };
    let holders = part.holders.clone();
    let bytes = part.bytes;
    let cmd = Command::CheckpointPart {
        job,
        epoch: key.epoch,
        rank,
        step,
        part,
    };
    match host.ledger.write(cmd).await {
        Ok((LedgerResponse::Rejected(reason), _)) => {
            host.metrics.count_checkpoint_part("rejected");
            tracing::info!(job, rank, step, %reason, "checkpoint part not recorded");
            true
        }
        Ok(_) => {
            host.metrics.count_checkpoint_part("recorded");
            host.metrics.ckpt_bytes.inc_by(bytes);
            host.metrics
                .ckpt_part_seconds
                .observe(started.elapsed().as_secs_f64());
            tracing::info!(
                job,
                rank,
                step,
                ?holders,
                ms = started.elapsed().as_millis() as u64,
                "checkpoint part replicated and recorded"
            );
            true
        }
        Err(e) => {
            host.metrics.count_checkpoint_part("failed");
            tracing::warn!(job, rank, step, error = %e.message, "checkpoint part not recorded; will retry");
            false
        }
    }
}

/// Removes the steps above `restored` that an earlier epoch of the job
/// left in this node's `ckpt/`: none was committed (the restore is the
/// latest committed step), and the new rank would otherwise report one as
/// its own part at once — possibly another rank's files, if this node ran
/// another rank of the job before (chaos seed 24: a committed step whose
/// rank-1 part held only rank 0's file).
pub(super) fn discard_uncommitted_steps(ckpt_dir: &Path, restored: u64) {
    let Ok(entries) = std::fs::read_dir(ckpt_dir) else {
        return;
    };
    for entry in entries.flatten() {
        let stale = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u64>().ok())
            .is_some_and(|step| step > restored);
        if !stale {
            continue;
        }
        // remove_dir_all does not follow links the job may have planted.
        let path = entry.path();
        let removed = match std::fs::symlink_metadata(&path) {
            Ok(m) if m.is_dir() => std::fs::remove_dir_all(&path),
            Ok(_) => std::fs::remove_file(&path),
            Err(e) => Err(e),
        };
        if let Err(e) = removed {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove an uncommitted checkpoint step");
        }
    }
}

/// The highest step `N` with `<ckpt_dir>/N/.done`.
pub fn latest_done_step(ckpt_dir: &Path) -> Option<u64> {
    std::fs::read_dir(ckpt_dir)
        .ok()?
        .filter_map(Result::ok)
        .filter_map(|entry| {
            let step = entry.file_name().to_str()?.parse::<u64>().ok()?;
            // The job owns this directory: a step that is a link, or whose
            // marker is one, is not a checkpoint (the capture would refuse
            // it anyway; this keeps it from being tried every tick).
            let real = |p: &Path| {
                std::fs::symlink_metadata(p)
                    .ok()
                    .filter(|m| !m.file_type().is_symlink())
            };
            real(&entry.path())?.is_dir().then_some(())?;
            real(&entry.path().join(".done")).map(|_| step)
        })
        .max()
}
