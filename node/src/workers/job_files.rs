//! A node's job files stay bounded: a running rank's log is rotated once
//! it passes `executor.log_max_bytes` (copied to `rank-R.log.1`, then cut
//! to nothing: the rank keeps writing to the file it has open, in append
//! mode, from its new end), and a finished job's directory goes
//! `executor.job_retention_s` after the job ended.

use crate::clock;
use crate::executor::{job_dir, log_path, log_rotations, rotations_path};
use crate::identity::write_private;
use crate::ledger_client::LedgerClient;
use crate::worker::Worker;
use shoal_consensus::workload::Workload;
use shoal_consensus::NodeId;
use std::ops::ControlFlow;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub struct JobFiles {
    pub me: NodeId,
    pub ledger: LedgerClient,
    pub jobs_dir: PathBuf,
    pub log_max_bytes: u64,
    pub retention: Duration,
}

/// The job directories under the jobs dir to remove at `now_ms`: jobs that
/// ended more than `retention` ago, and jobs the ledger no longer has
/// (pruned long after they ended). A job the ledger does not know *yet*
/// (an id at or past its next id) stays.
pub fn expired(workload: &Workload, dirs: &[u64], now_ms: u64, retention: Duration) -> Vec<u64> {
    let ended = |id: &u64| workload.jobs.get(id).map(|job| job.ended_at_ms);
    expired_by(ended, workload.next_job_id, dirs, now_ms, retention)
}

/// [`expired`] over `ended(id)`: `None` for a job the ledger does not
/// have, `Some(None)` for one still running or waiting.
fn expired_by(
    ended: impl Fn(&u64) -> Option<Option<u64>>,
    next_job_id: u64,
    dirs: &[u64],
    now_ms: u64,
    retention: Duration,
) -> Vec<u64> {
    let keep_ms = u64::try_from(retention.as_millis()).unwrap_or(u64::MAX);
    dirs.iter()
        .copied()
        .filter(|id| match ended(id) {
            Some(at) => at.is_some_and(|ended| now_ms.saturating_sub(ended) > keep_ms),
            None => *id < next_job_id,
        })
        .collect()
}

/// Copies `log` to `log.1` and empties it, counting the rotation.
fn rotate(log: &Path) -> std::io::Result<()> {
    let previous = log.with_extension("log.1");
    std::fs::copy(log, &previous)?;
    // The copy takes the log's mode; an older log may have had wider bits.
    std::fs::set_permissions(
        &previous,
        std::os::unix::fs::PermissionsExt::from_mode(0o600),
    )?;
    std::fs::OpenOptions::new()
        .write(true)
        .open(log)?
        .set_len(0)?;
    let count = log_rotations(log) + 1;
    write_private(&rotations_path(log), count.to_string().as_bytes(), 0o600)
}

impl JobFiles {
    fn job_dirs(&self) -> Vec<u64> {
        std::fs::read_dir(&self.jobs_dir)
            .into_iter()
            .flatten()
            .flatten()
            .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse().ok()))
            .collect()
    }
}

impl Worker for JobFiles {
    fn period(&self) -> Duration {
        (self.retention / 4).clamp(Duration::from_millis(500), Duration::from_secs(10))
    }

    async fn tick(&mut self) -> ControlFlow<()> {
        let (running, gone) = match self.ledger.read() {
            Ok(d) => {
                let workload = &d.ledger.workload;
                let running: Vec<(u64, u32)> = workload
                    .holding()
                    .flat_map(|(job, alloc)| {
                        alloc
                            .nodes
                            .iter()
                            .enumerate()
                            .filter(|(_, (node, _))| *node == self.me)
                            .map(move |(rank, _)| (job.id, rank as u32))
                    })
                    .collect();
                let gone = expired(workload, &self.job_dirs(), clock::wall_ms(), self.retention);
                (running, gone)
            }
            Err(_) => return ControlFlow::Break(()),
        };
        let (jobs_dir, max) = (self.jobs_dir.clone(), self.log_max_bytes);
        // Copies and deletions of big files: off the async threads.
        let work = tokio::task::spawn_blocking(move || {
            if max > 0 {
                for (job, rank) in running {
                    let log = log_path(&jobs_dir, job, rank);
                    if std::fs::metadata(&log).is_ok_and(|m| m.len() > max) {
                        if let Err(e) = rotate(&log) {
                            tracing::warn!(job, rank, error = %e, "could not rotate a rank's log");
                        }
                    }
                }
            }
            for job in gone {
                // remove_dir_all does not follow symlinks a job left inside.
                match std::fs::remove_dir_all(job_dir(&jobs_dir, job)) {
                    Ok(()) => tracing::info!(job, "removed a finished job's files"),
                    Err(e) => {
                        tracing::warn!(job, error = %e, "could not remove a finished job's files")
                    }
                }
            }
        });
        let _ = work.await;
        ControlFlow::Continue(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finished_jobs_go_after_the_retention_and_unknown_future_ones_stay() {
        // 1 ended long ago, 2 just now, 3 runs, 4 was pruned, 12 is newer
        // than this node's ledger.
        let jobs = std::collections::BTreeMap::from([
            (1u64, Some(1_000u64)),
            (2, Some(99_000)),
            (3, None),
        ]);
        let gone = expired_by(
            |id| jobs.get(id).copied(),
            10,
            &[1, 2, 3, 4, 12],
            100_000,
            Duration::from_secs(10),
        );
        assert_eq!(gone, vec![1, 4]);
    }

    #[test]
    fn a_rotation_keeps_the_old_part_and_counts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("rank-0.log");
        std::fs::write(&log, b"first part\n").expect("write");
        let mut writer = std::fs::OpenOptions::new()
            .append(true)
            .open(&log)
            .expect("open");
        rotate(&log).expect("rotate");
        use std::io::Write;
        writer.write_all(b"second\n").expect("write");
        assert_eq!(std::fs::read(&log).expect("read"), b"second\n");
        assert_eq!(
            std::fs::read(dir.path().join("rank-0.log.1")).expect("read"),
            b"first part\n"
        );
        assert_eq!(log_rotations(&log), 1);
        rotate(&log).expect("rotate");
        assert_eq!(log_rotations(&log), 2);
    }
}
