//! After healing: every committed checkpoint step restores byte for byte
//! while at most one of each part's holders is lost.
//!
//! The ranks write parts whose bytes depend on (job, rank, step) alone
//! ([`super::workload::checkpoint_part`]), so a restore is judged against
//! what the rank wrote without keeping a copy. A holder is lost when it is
//! no longer a member (a node that came back without its disk joins under
//! a new id and the old one is removed). A step with two holders lost may
//! be gone: the property does not cover it, and it is counted apart. The
//! losses count from the last time the part had two live holders listed:
//! repair rewrites a part's holder list, so a part that lost one holder,
//! was listed on the survivor alone while repair had not copied it yet,
//! and then lost the survivor never shows two lost holders in one list;
//! the run's observer remembers them.

use super::workload;
use shoal_chaos::Violation;
use shoal_consensus::ledger::Ledger;
use shoal_sdk::Client;
use std::collections::BTreeSet;

/// What the check restored.
#[derive(Clone, Copy, Debug, Default, serde::Serialize)]
pub struct RestoreCounts {
    /// Committed steps restored and compared.
    pub steps_checked: u32,
    /// Committed steps with a part that lost two holders or more: not
    /// covered by the property.
    pub steps_beyond_the_fault_model: u32,
}

/// Restores every committed step of every job in `ledger` through `client`
/// and compares each rank's part with what the rank wrote. `worst_lost`
/// tells how many of a part's holders were lost at once during the run.
pub async fn check(
    client: &Client,
    ledger: &Ledger,
    worst_lost: impl Fn(super::observe::PartKey) -> usize,
) -> (RestoreCounts, Vec<Violation>) {
    let members: BTreeSet<u64> = ledger.active_members().map(|m| m.id).collect();
    let mut counts = RestoreCounts::default();
    let mut violations = Vec::new();
    let scratch = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => {
            violations.push(Violation::new(
                "not-restorable",
                format!("cannot make a scratch dir for the restores: {e}"),
            ));
            return (counts, violations);
        }
    };
    let jobs: Vec<u64> = ledger.workload.jobs.keys().copied().collect();
    for job in jobs {
        let ckpts = match client.checkpoints(job).await {
            Ok(c) => c,
            Err(e) => {
                violations.push(Violation::new(
                    "not-restorable",
                    format!("cannot list job {job}'s checkpoints: {e}"),
                ));
                continue;
            }
        };
        for ckpt in ckpts.iter().filter(|c| c.committed_at.is_some()) {
            let lost_most = ckpt
                .parts
                .iter()
                .map(|p| {
                    let now = p.holders.iter().filter(|h| !members.contains(h)).count();
                    now.max(worst_lost((job, ckpt.step, p.rank)))
                })
                .max()
                .unwrap_or(0);
            if lost_most >= 2 {
                counts.steps_beyond_the_fault_model += 1;
                continue;
            }
            counts.steps_checked += 1;
            let to = scratch.path().join(format!("{job}-{}", ckpt.step));
            if let Err(e) = crate::cli::ckpt::restore(client, ckpt, &to).await {
                violations.push(Violation::new(
                    "not-restorable",
                    format!(
                        "job {job} step {} (holders {:?}, members {members:?}) does not restore: {e:#}",
                        ckpt.step,
                        ckpt.parts.iter().map(|p| &p.holders).collect::<Vec<_>>()
                    ),
                ));
                continue;
            }
            for part in &ckpt.parts {
                let (name, want) = workload::checkpoint_part(job, part.rank, ckpt.step);
                match std::fs::read(to.join(&name)) {
                    Ok(got) if got == want => {}
                    Ok(got) => violations.push(Violation::new(
                        "not-restorable",
                        format!(
                            "job {job} step {} rank {}: restored {:?}, the rank wrote {:?}",
                            ckpt.step,
                            part.rank,
                            String::from_utf8_lossy(&got),
                            String::from_utf8_lossy(&want)
                        ),
                    )),
                    Err(e) => violations.push(Violation::new(
                        "not-restorable",
                        format!(
                            "job {job} step {} rank {}: {name} is missing from the restore: {e}",
                            ckpt.step, part.rank
                        ),
                    )),
                }
            }
        }
    }
    (counts, violations)
}
