//! Properties of the ledger and of the ranks' own records that must hold
//! whatever faults a run injects.
//!
//! - [`check_applied`] runs after every applied log entry on every node;
//! - [`check_epochs`] judges the ranks' heartbeat lines
//!   ([`parse_rank_log`]): a job never runs under two epochs at once;
//! - [`check_final`] and [`check_converged`] judge the state at the end.
//!
//! Each check states an invariant `apply` actually maintains, no stronger:
//! some limits are enforced only when a job is placed (see
//! [`check_applied`]), and checking them on every state would flag correct
//! behaviour.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use shoal_consensus::workload::{Allocation, Job, JobId, Workload};
use shoal_consensus::{Ledger, NodeId};

use crate::Violation;

/// Checks the state after the log entry at `index` was applied:
///
/// - `gpu-held-twice`: no GPU of a node is held by two allocations;
/// - `gang-not-whole`: every allocation holds exactly `spec.nodes` distinct
///   nodes with exactly `spec.gpus_per_node` distinct GPUs each (job specs
///   never change, so this holds for as long as the allocation does);
/// - for allocations created by this entry (their epoch is its index):
///   - `gpu-out-of-range`: every GPU is one of the node's recorded GPUs;
///   - `tenant-cap-exceeded`: the tenant and each of its ancestors with a
///     GPU cap hold at most that many GPUs over their whole subtree;
///   - `budget-exceeded`: the same tenants with a GPU-hour budget have at
///     most that much committed (finished usage plus the worst case of every
///     running job, [`Workload::committed_gpu_seconds`]).
///
/// The last three are checked only where a placement happened because
/// that is the only place `apply` enforces them: a cap or budget may be
/// lowered, or a tenant moved under a capped parent (`UpdateTenant`), and a
/// node may re-register with fewer GPUs (`UpdateMember`), without anything
/// running being stopped. Between placements usage and commitment only go
/// down (a released job is charged at most its worst case), so right after
/// the entry that placed a job they still bound what its placement was
/// checked against. One case escapes this: the leader batches concurrent
/// writes into one entry, and if an `UpdateTenant` lowering a limit or an
/// `UpdateMember` shrinking a node follows a placement in the same batch,
/// the state after the entry is correct but fails the check. Runs that
/// change limits or inventories mid-run must read those violations with
/// this in mind.
///
/// Cost: O(GPUs held) plus, for the tenants of new allocations, a walk of
/// the tenant tree.
pub fn check_applied(index: u64, ledger: &Ledger) -> Vec<Violation> {
    let workload = &ledger.workload;
    let mut found = check_gpus_held_once(index, ledger);
    for (job, alloc) in workload.holding() {
        found.extend(check_gang(index, job, alloc, ledger));
        if alloc.epoch == index {
            found.extend(check_gpus_exist(index, job, alloc, ledger));
        }
    }
    found.extend(check_new_placement_quotas(index, workload));
    found
}

/// `node 3 (gpu-b)`, or `node 3` when it is not a member.
fn node_name(ledger: &Ledger, node: NodeId) -> String {
    match ledger.members.get(&node) {
        Some(member) => format!("node {node} ({})", member.spec.name),
        None => format!("node {node}"),
    }
}

fn check_gpus_held_once(index: u64, ledger: &Ledger) -> Vec<Violation> {
    let workload = &ledger.workload;
    let held: usize = workload
        .holding()
        .map(|(_, alloc)| alloc.gpu_count() as usize)
        .sum();
    let mut holder: HashMap<(NodeId, u32), JobId> = HashMap::with_capacity(held);
    let mut found = Vec::new();
    for (job, alloc) in workload.holding() {
        for (node, gpus) in &alloc.nodes {
            for &gpu in gpus {
                match holder.insert((*node, gpu), job.id) {
                    // The same job twice is a malformed gang, reported as such.
                    Some(other) if other != job.id => found.push(Violation::new(
                        "gpu-held-twice",
                        format!(
                            "after index {index}: GPU {gpu} of {} is held by job {other} and job {}",
                            node_name(ledger, *node),
                            job.id
                        ),
                    )),
                    _ => {}
                }
            }
        }
    }
    found
}

fn check_gang(index: u64, job: &Job, alloc: &Allocation, ledger: &Ledger) -> Option<Violation> {
    let spec = &job.spec;
    let mut problems = Vec::new();
    if alloc.nodes.len() != spec.nodes as usize {
        problems.push(format!(
            "holds {} nodes, the job asks for {}",
            alloc.nodes.len(),
            spec.nodes
        ));
    }
    let mut nodes = BTreeSet::new();
    for (node, gpus) in &alloc.nodes {
        if !nodes.insert(*node) {
            problems.push(format!("{} appears twice", node_name(ledger, *node)));
        }
        let distinct: BTreeSet<u32> = gpus.iter().copied().collect();
        if gpus.len() != spec.gpus_per_node as usize || distinct.len() != gpus.len() {
            problems.push(format!(
                "holds GPUs {gpus:?} on {}, the job asks for {} distinct GPUs per node",
                node_name(ledger, *node),
                spec.gpus_per_node
            ));
        }
    }
    (!problems.is_empty()).then(|| {
        Violation::new(
            "gang-not-whole",
            format!(
                "after index {index}: job {} (epoch {}) {}",
                job.id,
                alloc.epoch,
                problems.join("; ")
            ),
        )
    })
}

/// Nodes that are not members are skipped: there is nothing to compare.
fn check_gpus_exist(index: u64, job: &Job, alloc: &Allocation, ledger: &Ledger) -> Vec<Violation> {
    let mut found = Vec::new();
    for (node, gpus) in &alloc.nodes {
        let Some(member) = ledger.members.get(node) else {
            continue;
        };
        for &gpu in gpus {
            if !member.spec.gpus.iter().any(|g| g.index == gpu) {
                found.push(Violation::new(
                    "gpu-out-of-range",
                    format!(
                        "at index {index}: job {} was placed on GPU {gpu} of {}, which records \
                         GPUs {:?}",
                        job.id,
                        node_name(ledger, *node),
                        member.spec.gpus.iter().map(|g| g.index).collect::<Vec<_>>()
                    ),
                ));
            }
        }
    }
    found
}

/// The tenants whose caps and budgets a placement at `index` was checked
/// against (each new job's tenant and its ancestors), re-checked on the
/// state after the entry.
fn check_new_placement_quotas(index: u64, workload: &Workload) -> Vec<Violation> {
    let mut placed_by: BTreeMap<&str, Vec<JobId>> = BTreeMap::new();
    for (job, alloc) in workload.holding() {
        if alloc.epoch == index {
            for tenant in workload.ancestry(&job.spec.tenant) {
                placed_by.entry(tenant).or_default().push(job.id);
            }
        }
    }
    if placed_by.is_empty() {
        return Vec::new();
    }
    let held = workload.gpus_in_use();
    let mut found = Vec::new();
    for (name, jobs) in placed_by {
        let Some(tenant) = workload.tenants.get(name) else {
            continue;
        };
        let subtree = workload.subtree(name);
        if let Some(max) = tenant.limits.max_gpus {
            let in_use: u32 = subtree.iter().filter_map(|t| held.get(t)).sum();
            if in_use > max {
                found.push(Violation::new(
                    "tenant-cap-exceeded",
                    format!(
                        "at index {index}: placing jobs {jobs:?} left tenant {name} (with the \
                         tenants below it) holding {in_use} GPUs, over its cap of {max}"
                    ),
                ));
            }
        }
        if let Some(limit) = tenant.limits.gpu_seconds_limit {
            let committed: u64 = subtree
                .iter()
                .map(|t| workload.committed_gpu_seconds(t))
                .sum();
            if committed > limit {
                found.push(Violation::new(
                    "budget-exceeded",
                    format!(
                        "at index {index}: placing jobs {jobs:?} left tenant {name} (with the \
                         tenants below it) with {committed} GPU-seconds used or committed, over \
                         its budget of {limit}"
                    ),
                ));
            }
        }
    }
    found
}

/// A rank process's lifetime, as seen from its own heartbeat lines.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RankRecord {
    pub job: u64,
    pub epoch: u64,
    pub rank: u32,
    /// The node of its first beat.
    pub node: String,
    pub first_ms: u64,
    pub last_ms: u64,
}

/// Parses heartbeat lines `beat JOB EPOCH RANK NODE WALL_MS`, merging the
/// beats of each (job, epoch, rank) into one record, in that order. Other
/// lines (a rank's own output, a line cut short by a kill) are skipped.
pub fn parse_rank_log(text: &str) -> Vec<RankRecord> {
    let mut records: BTreeMap<(u64, u64, u32), RankRecord> = BTreeMap::new();
    for (job, epoch, rank, node, at) in text.lines().filter_map(parse_beat) {
        records
            .entry((job, epoch, rank))
            .and_modify(|r| {
                r.first_ms = r.first_ms.min(at);
                r.last_ms = r.last_ms.max(at);
            })
            .or_insert_with(|| RankRecord {
                job,
                epoch,
                rank,
                node: node.to_string(),
                first_ms: at,
                last_ms: at,
            });
    }
    records.into_values().collect()
}

fn parse_beat(line: &str) -> Option<(u64, u64, u32, &str, u64)> {
    let mut fields = line.split_whitespace();
    if fields.next()? != "beat" {
        return None;
    }
    let job = fields.next()?.parse().ok()?;
    let epoch = fields.next()?.parse().ok()?;
    let rank = fields.next()?.parse().ok()?;
    let node = fields.next()?;
    let at = fields.next()?.parse().ok()?;
    fields
        .next()
        .is_none()
        .then_some((job, epoch, rank, node, at))
}

/// The ranks of one epoch of a job: the first to start and the last seen.
struct EpochSpan<'a> {
    first: &'a RankRecord,
    last: &'a RankRecord,
}

/// A job never runs under two epochs at once: for epochs `e1 < e2` of a
/// job, every rank of `e2` starts after every rank of `e1` was last seen,
/// give or take `slack_ms` (heartbeat period and clock skew between
/// nodes). That covers both a new epoch started too early and an old rank
/// that kept beating after its replacement started (it was not fenced).
/// One violation per pair of epochs, naming the worst pair of ranks.
pub fn check_epochs(records: &[RankRecord], slack_ms: u64) -> Vec<Violation> {
    let mut spans: BTreeMap<u64, BTreeMap<u64, EpochSpan>> = BTreeMap::new();
    for record in records {
        spans
            .entry(record.job)
            .or_default()
            .entry(record.epoch)
            .and_modify(|span| {
                if record.first_ms < span.first.first_ms {
                    span.first = record;
                }
                if record.last_ms > span.last.last_ms {
                    span.last = record;
                }
            })
            .or_insert(EpochSpan {
                first: record,
                last: record,
            });
    }
    let mut found = Vec::new();
    for (job, epochs) in &spans {
        let epochs: Vec<&EpochSpan> = epochs.values().collect();
        for (i, earlier) in epochs.iter().enumerate() {
            for later in &epochs[i + 1..] {
                let (old, new) = (earlier.last, later.first);
                if new.first_ms.saturating_add(slack_ms) < old.last_ms {
                    found.push(overlap(*job, old, new, slack_ms));
                }
            }
        }
    }
    found
}

fn overlap(job: u64, old: &RankRecord, new: &RankRecord, slack_ms: u64) -> Violation {
    Violation::new(
        "epochs-overlap",
        format!(
            "job {job}: epoch {} rank {} on {} was seen at {} ms, after epoch {} rank {} on {} \
             started at {} ms ({} ms of overlap, {slack_ms} ms of slack)",
            old.epoch,
            old.rank,
            old.node,
            old.last_ms,
            new.epoch,
            new.rank,
            new.node,
            new.first_ms,
            old.last_ms - new.first_ms,
        ),
    )
}

/// At the end of a run every waiting job says why it waits, so that a user
/// looking at `shoal queue` is never left guessing.
pub fn check_final(ledger: &Ledger) -> Vec<Violation> {
    ledger
        .workload
        .jobs
        .values()
        .filter(|job| job.state.is_waiting() && job.reason.trim().is_empty())
        .map(|job| {
            Violation::new(
                "pending-without-reason",
                format!("job {} is {} without a reason", job.id, job.state),
            )
        })
        .collect()
}

/// Every replica ends with the same ledger. The ledgers are grouped into
/// identical ones; each group other than the largest is reported against
/// it, naming the fields that differ.
pub fn check_converged(ledgers: &[(u64, &Ledger)]) -> Vec<Violation> {
    let mut groups: Vec<(Vec<u64>, &Ledger)> = Vec::new();
    for &(node, ledger) in ledgers {
        match groups.iter_mut().find(|(_, other)| *other == ledger) {
            Some((nodes, _)) => nodes.push(node),
            None => groups.push((vec![node], ledger)),
        }
    }
    let Some(majority) = (0..groups.len()).max_by_key(|&i| (groups[i].0.len(), usize::MAX - i))
    else {
        return Vec::new();
    };
    let (reference_nodes, reference) = &groups[majority];
    groups
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != majority)
        .map(|(_, (nodes, ledger))| {
            Violation::new(
                "not-converged",
                format!(
                    "nodes {nodes:?} differ from nodes {reference_nodes:?} in {}",
                    differing_fields(ledger, reference).join(", ")
                ),
            )
        })
        .collect()
}

/// The top-level fields (and the workload's fields) where `a` and `b`
/// differ; for jobs, which ones. A field added to the ledger after this
/// list was written still shows up, as "another field".
fn differing_fields(a: &Ledger, b: &Ledger) -> Vec<String> {
    let (wa, wb) = (&a.workload, &b.workload);
    let fields = [
        ("cluster", a.cluster == b.cluster),
        ("members", a.members == b.members),
        ("next_node_id", a.next_node_id == b.next_node_id),
        ("join_tokens", a.join_tokens == b.join_tokens),
        ("api_tokens", a.api_tokens == b.api_tokens),
        ("attrs", a.attrs == b.attrs),
        ("workload.tenants", wa.tenants == wb.tenants),
        ("workload.jobs", wa.jobs == wb.jobs),
        ("workload.next_job_id", wa.next_job_id == wb.next_job_id),
        ("workload.checkpoints", wa.checkpoints == wb.checkpoints),
        ("workload.drained", wa.drained == wb.drained),
        ("workload.gpu_faults", wa.gpu_faults == wb.gpu_faults),
        ("events", a.events == b.events),
        ("namespace", a.namespace == b.namespace),
        ("ca", a.ca == b.ca),
        ("clock_ms", a.clock_ms == b.clock_ms),
        (
            "voter_eligibility",
            a.voter_eligibility == b.voter_eligibility,
        ),
        ("admin_holds", a.admin_holds == b.admin_holds),
    ];
    let mut differ: Vec<String> = fields
        .iter()
        .filter(|(_, same)| !same)
        .map(|&(name, _)| match name {
            "workload.jobs" => format!("workload.jobs ({})", differing_jobs(wa, wb)),
            name => name.to_string(),
        })
        .collect();
    if differ.is_empty() {
        differ.push("another field".to_string());
    }
    differ
}

/// `jobs 3, 8` (at most a few named).
fn differing_jobs(a: &Workload, b: &Workload) -> String {
    const SHOWN: usize = 5;
    let ids: BTreeSet<JobId> = a.jobs.keys().chain(b.jobs.keys()).copied().collect();
    let differ: Vec<JobId> = ids
        .into_iter()
        .filter(|id| a.jobs.get(id) != b.jobs.get(id))
        .collect();
    let mut text = differ
        .iter()
        .take(SHOWN)
        .map(JobId::to_string)
        .collect::<Vec<_>>()
        .join(", ");
    if differ.len() > SHOWN {
        text.push_str(&format!(" and {} more", differ.len() - SHOWN));
    }
    format!("jobs {text}")
}

#[cfg(test)]
mod tests;
