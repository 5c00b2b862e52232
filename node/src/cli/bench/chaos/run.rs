//! One chaos run: a cluster, a seeded fault schedule played against it
//! while the workload runs, then healing, settling and the checks.

use super::cluster::ChaosCluster;
use super::objects::ObjectLog;
use super::observe::AppliedWatch;
use super::workload::{self, JobLog, Target};
use crate::faults::chaos_hooks::{ChaosHooks, PlantedBug};
use crate::faults::{FaultRouter, Filter, FilterHandle};
use serde::Serialize;
use shoal_chaos::history::{Outcome, Recorder, RegisterOp};
use shoal_chaos::schedule::{self, Action, Fault, FaultKind, ScheduleConfig, Step};
use shoal_chaos::{invariants, linearizable, Violation};
use shoal_consensus::{Ledger, NodeId};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What to run.
#[derive(Clone, Debug)]
pub struct RunOptions {
    pub seed: u64,
    pub nodes: usize,
    pub duration: Duration,
    pub kinds: BTreeSet<FaultKind>,
    pub planted: BTreeSet<PlantedBug>,
    pub register_clients: u32,
    /// Gangs submitted and cancelled alongside the register workload.
    pub jobs: bool,
}

/// Fault kinds a run draws unless told otherwise: all that an in-process
/// cluster can inject. A full disk needs a file system per node.
pub fn default_kinds() -> BTreeSet<FaultKind> {
    FaultKind::ALL
        .into_iter()
        .filter(|k| *k != FaultKind::DiskFull)
        .collect()
}

impl RunOptions {
    pub fn new(seed: u64, nodes: usize, duration: Duration) -> RunOptions {
        RunOptions {
            seed,
            nodes,
            duration,
            kinds: default_kinds(),
            planted: BTreeSet::new(),
            register_clients: 3,
            jobs: true,
        }
    }

    pub fn schedule(&self) -> Vec<Step> {
        let mut cfg = ScheduleConfig::new(self.seed, self.nodes, self.duration.as_millis() as u64);
        cfg.kinds = self.kinds.clone();
        schedule::generate(&cfg)
    }
}

/// Operations of a run, by kind and outcome.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OpCounts {
    pub writes_ok: u32,
    pub writes_failed: u32,
    pub writes_unknown: u32,
    pub reads_ok: u32,
    pub reads_failed: u32,
    pub jobs_submitted: u32,
    pub jobs_refused: u32,
    pub jobs_unknown: u32,
    pub cancels: u32,
    pub rank_beats: u64,
    pub entries_applied: u64,
    /// The checkpoint steps restored and compared after healing.
    pub checkpoints: super::restore_check::RestoreCounts,
    /// The `mesh:/` puts and removes, and the objects compared after healing.
    pub objects: super::objects::ObjectCounts,
}

#[derive(Clone, Debug, Serialize)]
pub struct SeedReport {
    pub seed: u64,
    pub nodes: usize,
    /// The fault kinds drawn from, when not the default ones (they shape
    /// the schedule, so the replay needs them).
    pub kinds: Option<String>,
    pub duration_ms: u64,
    pub faults: Vec<String>,
    pub fault_counts: BTreeMap<FaultKind, u32>,
    pub ops: OpCounts,
    pub violations: Vec<Violation>,
    /// Node faults not installed because the cluster was not whole yet.
    pub skipped_faults: Vec<String>,
    /// The harness itself failed (a node would not start): the run proves
    /// nothing either way.
    pub error: Option<String>,
    pub wall_ms: u64,
}

impl SeedReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.error.is_none()
    }

    /// How to run this schedule again.
    pub fn replay(&self) -> String {
        let kinds = match &self.kinds {
            Some(k) => format!(" --kinds {k}"),
            None => String::new(),
        };
        format!(
            "shoal bench chaos --seed {} --nodes {} --duration {}s{kinds}",
            self.seed,
            self.nodes,
            self.duration_ms / 1000
        )
    }
}

/// A fault as installed, to heal it.
enum Installed {
    Filters(Vec<FilterHandle>),
    Crashed {
        slot: usize,
        wipe: bool,
    },
    Paused(usize),
    Clock(usize),
    DiskFull(usize),
    Removed(usize),
    /// A removal with no definite answer: it may still commit, so the
    /// harness finishes it before it takes another node away (seed 511: a
    /// removal that timed out here committed a second later, after the
    /// next fault had wiped another voter, and two of three were gone).
    RemovalInDoubt {
        slot: usize,
        name: String,
    },
    Nothing,
}

/// Runs one seed. Never panics on what the cluster does: every failure is
/// in the report.
pub async fn run_seed(opts: &RunOptions) -> SeedReport {
    let started = Instant::now();
    let steps = opts.schedule();
    let mut report = SeedReport {
        seed: opts.seed,
        nodes: opts.nodes,
        kinds: (opts.kinds != default_kinds()).then(|| {
            opts.kinds
                .iter()
                .map(|k| k.as_str())
                .collect::<Vec<_>>()
                .join(",")
        }),
        duration_ms: opts.duration.as_millis() as u64,
        faults: steps
            .iter()
            .filter_map(|s| match &s.action {
                Action::Start { fault, .. } => Some(format!("{:>6} ms {fault}", s.at_ms)),
                Action::Heal { .. } => None,
            })
            .collect(),
        fault_counts: schedule::count_by_kind(&steps),
        ops: OpCounts::default(),
        violations: Vec::new(),
        skipped_faults: Vec::new(),
        error: None,
        wall_ms: 0,
    };
    super::panics::install();
    super::panics::take();
    if let Err(e) = run_inner(opts, &steps, &mut report).await {
        report.error = Some(e);
    }
    report.violations.extend(
        super::panics::take()
            .into_iter()
            .map(|p| Violation::new("node-panicked", p)),
    );
    report.wall_ms = started.elapsed().as_millis() as u64;
    report
}

async fn run_inner(
    opts: &RunOptions,
    steps: &[Step],
    report: &mut SeedReport,
) -> Result<(), String> {
    let dir = tempfile::Builder::new()
        .prefix("shoal-chaos-")
        .tempdir()
        .map_err(|e| format!("cannot create a temp dir: {e}"))?;
    let rank_log = dir.path().join("ranks.log");
    std::fs::write(&rank_log, b"").map_err(|e| format!("cannot create the rank log: {e}"))?;
    let watch = AppliedWatch::new();
    let planted = opts.planted.clone();
    let hooks_watch = watch.clone();
    let hooks = Arc::new(move |name: &str| ChaosHooks {
        observer: Some(hooks_watch.observer(name)),
        planted: planted.clone(),
    });
    let tweak = Arc::new(|cfg: &mut crate::Config| {
        cfg.executor.enabled = true;
    });
    let router = FaultRouter::new();
    let mut cluster = ChaosCluster::start(
        dir.path(),
        opts.nodes,
        router.clone(),
        hooks,
        tweak,
        opts.kinds.contains(&FaultKind::DiskFull),
    )
    .await?;
    cluster.lost_disks = watch.lost_disks();
    let result = drive(opts, steps, report, &mut cluster, &watch, &rank_log).await;
    cluster.shutdown().await;
    result
}

async fn drive(
    opts: &RunOptions,
    steps: &[Step],
    report: &mut SeedReport,
    cluster: &mut ChaosCluster,
    watch: &Arc<AppliedWatch>,
    rank_log: &std::path::Path,
) -> Result<(), String> {
    wait_formed(cluster, Duration::from_secs(60)).await?;
    create_capped_tenant(cluster).await?;

    let epoch = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let target = Target {
        urls: cluster.slots.iter().map(|s| s.api_url()).collect(),
        token: cluster.admin_token.clone(),
        epoch,
        stop: stop.clone(),
    };
    let recorder = Recorder::new();
    let jobs = JobLog::default();
    let mut clients = Vec::new();
    for c in 0..opts.register_clients {
        let seed = opts.seed.wrapping_mul(1_000_003).wrapping_add(u64::from(c));
        clients.push(tokio::spawn(workload::register_client(
            target.clone(),
            recorder.clone(),
            c,
            seed,
        )));
    }
    let objects = ObjectLog::default();
    let object_dir = rank_log
        .parent()
        .unwrap_or(std::path::Path::new("."))
        .join("objects");
    std::fs::create_dir_all(&object_dir)
        .map_err(|e| format!("cannot create {}: {e}", object_dir.display()))?;
    if opts.jobs {
        clients.push(tokio::spawn(super::objects::object_client(
            target.clone(),
            objects.clone(),
            object_dir.clone(),
            opts.seed ^ 0x0b1e,
        )));
        clients.push(tokio::spawn(workload::job_client(
            target.clone(),
            jobs.clone(),
            rank_log.to_path_buf(),
            opts.nodes,
            opts.seed ^ 0x5eed,
        )));
    }

    let mut installed: BTreeMap<u32, Installed> = BTreeMap::new();
    let mut pending = Pending::default();
    for step in steps {
        pending
            .work_until(cluster, epoch + Duration::from_millis(step.at_ms))
            .await?;
        match &step.action {
            Action::Start { id, fault } => {
                // A node fault waits for the cluster to be whole again
                // after the last one (see `ChaosCluster::is_whole`); one
                // that comes too early is not installed.
                if fault.kind().takes_a_node() && !(pending.is_empty() && cluster.is_whole()) {
                    report
                        .skipped_faults
                        .push(format!("{:>6} ms {fault}", step.at_ms));
                    continue;
                }
                let done = install(cluster, fault, opts.seed ^ u64::from(*id)).await;
                installed.insert(*id, done);
            }
            Action::Heal { id } => {
                if let Some(done) = installed.remove(id) {
                    heal(cluster, done, &mut pending)?;
                }
            }
        }
    }
    pending.work_until(cluster, epoch + opts.duration).await?;
    stop.store(true, Ordering::Relaxed);
    for client in clients {
        let _ = client.await;
    }
    for (_, done) in std::mem::take(&mut installed) {
        heal(cluster, done, &mut pending)?;
    }
    cluster.router.heal();
    // Every fault is healed: a node that cannot come back now, with a
    // majority of intact voters, is a failure of the product.
    let mut restore_violations = Vec::new();
    pending
        .work_until_done(cluster, Instant::now() + Duration::from_secs(60))
        .await?;
    for (what, error) in pending.failures() {
        restore_violations.push(Violation::new(
            "not-restored",
            format!("{what} did not succeed within 60 s of healing every fault: {error}"),
        ));
    }

    let settled = settle(cluster, &mut pending, Duration::from_secs(60)).await;
    // Final reads through every node: what was acknowledged must be there.
    for (slot, _) in cluster.slots.iter().enumerate() {
        for k in 0..workload::KEYS {
            let op = RegisterOp::Read {
                key: workload::key(k),
            };
            workload::register_op(&target, &recorder, 1_000 + slot as u32, slot, op).await;
        }
    }

    let history = recorder.entries();
    count_ops(&history, &jobs, &mut report.ops);
    let (applied, _) = watch.applied_counts();
    report.ops.entries_applied = applied;

    let mut violations = restore_violations;
    violations.extend(linearizable::check_registers(&history));
    violations.extend(watch.violations());
    let text = std::fs::read_to_string(rank_log).unwrap_or_default();
    report.ops.rank_beats = text.lines().count() as u64;
    violations.extend(invariants::check_epochs(
        &invariants::parse_rank_log(&text),
        300,
    ));
    match settled {
        Ok(ledgers) => {
            let refs: Vec<(NodeId, &Ledger)> = ledgers.iter().map(|(id, l)| (*id, l)).collect();
            violations.extend(invariants::check_converged(&refs));
            if let Some((_, ledger)) = ledgers.first() {
                violations.extend(invariants::check_final(ledger));
                violations.extend(lost_jobs(ledger, &jobs));
                let client = cluster.client(0);
                let (restored, v) = super::restore_check::check(&client, ledger, |part| {
                    watch.worst_holders_lost(part)
                })
                .await;
                report.ops.checkpoints = restored;
                violations.extend(v);
                let members = ledger.active_members().map(|m| m.id).collect();
                let (counts, v) = super::objects::check(
                    &client,
                    &objects,
                    &members,
                    |path| watch.worst_object_holders_lost(path),
                    &object_dir,
                    opts.seed ^ 0x0b1e,
                )
                .await;
                report.ops.objects = counts;
                violations.extend(v);
            }
        }
        Err(v) => violations.extend(v),
    }
    report.violations = violations;
    Ok(())
}

/// Every acknowledged submission names a job the ledger knows.
fn lost_jobs(ledger: &Ledger, jobs: &JobLog) -> Vec<Violation> {
    jobs.counts()
        .acked
        .iter()
        .filter(|id| !ledger.workload.jobs.contains_key(id))
        .map(|id| Violation::new("job-lost", format!("job {id} was acknowledged and is gone")))
        .collect()
}

fn count_ops(history: &[shoal_chaos::history::Entry], jobs: &JobLog, ops: &mut OpCounts) {
    for e in history {
        match (&e.op, &e.outcome) {
            (RegisterOp::Write { .. }, Outcome::Ok(_)) => ops.writes_ok += 1,
            (RegisterOp::Write { .. }, Outcome::Failed(_)) => ops.writes_failed += 1,
            (RegisterOp::Write { .. }, Outcome::Unknown(_)) => ops.writes_unknown += 1,
            (RegisterOp::Read { .. }, Outcome::Ok(_)) => ops.reads_ok += 1,
            (RegisterOp::Read { .. }, _) => ops.reads_failed += 1,
        }
    }
    let counts = jobs.counts();
    ops.jobs_submitted = counts.acked.len() as u32;
    ops.jobs_refused = counts.refused;
    ops.jobs_unknown = counts.unknown;
    ops.cancels = counts.cancelled.len() as u32;
}

/// Ids of the nodes in `slots` now (a slot whose node has not joined yet
/// has none).
fn ids(cluster: &ChaosCluster, slots: &[usize]) -> Vec<NodeId> {
    slots
        .iter()
        .filter_map(|s| cluster.slots.get(*s).and_then(|s| s.id))
        .collect()
}

async fn install(cluster: &mut ChaosCluster, fault: &Fault, seed: u64) -> Installed {
    tracing::info!(%fault, "chaos: fault");
    let router = cluster.router.clone();
    let all: Vec<usize> = (0..cluster.slots.len()).collect();
    match fault {
        Fault::Partition { minority } => {
            let rest: Vec<usize> = all
                .iter()
                .copied()
                .filter(|s| !minority.contains(s))
                .collect();
            Installed::Filters(vec![router.add(Filter::partition(
                ids(cluster, minority),
                ids(cluster, &rest),
            ))])
        }
        Fault::Bridge { left, right, .. } => Installed::Filters(vec![
            router.add(Filter::partition(ids(cluster, left), ids(cluster, right)))
        ]),
        Fault::OneWay { from, to } => {
            match (ids(cluster, &[*from]).first(), ids(cluster, &[*to]).first()) {
                (Some(f), Some(t)) => Installed::Filters(vec![router.add(Filter::one_way(*f, *t))]),
                _ => Installed::Nothing,
            }
        }
        Fault::Drop { percent } => Installed::Filters(vec![
            router.add(Filter::drop(f64::from(*percent) / 100.0, seed))
        ]),
        Fault::Delay { node, ms } => match ids(cluster, &[*node]).first() {
            Some(id) => {
                let d = Duration::from_millis(*ms);
                Installed::Filters(vec![
                    router.add(Filter::delay(d).from(*id)),
                    router.add(Filter::delay(d).to(*id)),
                ])
            }
            None => Installed::Nothing,
        },
        Fault::Crash { node, wipe } => {
            cluster.crash(*node).await;
            Installed::Crashed {
                slot: *node,
                wipe: *wipe,
            }
        }
        Fault::Pause { node } => {
            cluster.pause(*node);
            Installed::Paused(*node)
        }
        Fault::ClockJump { node, offset_ms } => {
            cluster.set_clock(*node, *offset_ms);
            Installed::Clock(*node)
        }
        Fault::DiskFull { node } => match cluster.fill_disk(*node) {
            true => Installed::DiskFull(*node),
            false => Installed::Nothing,
        },
        Fault::RemoveVoter { node } => {
            let name = cluster.slots[*node].name.clone();
            match remove_member(cluster, &name, *node, Duration::from_secs(5)).await {
                Ok(()) => {
                    cluster.crash(*node).await;
                    Installed::Removed(*node)
                }
                // Every attempt was answered with a refusal: nothing of it
                // can commit later.
                Err(e) if !e.in_doubt => Installed::Nothing,
                Err(_) => Installed::RemovalInDoubt { slot: *node, name },
            }
        }
    }
}

/// Heals a fault. Bringing a node back may take many attempts (a join
/// needs a leader, which another fault may keep away), so it is queued in
/// `pending` and tried between the schedule's steps.
fn heal(cluster: &mut ChaosCluster, done: Installed, pending: &mut Pending) -> Result<(), String> {
    match done {
        Installed::Filters(handles) => {
            for h in handles {
                cluster.router.remove(h);
            }
        }
        Installed::Crashed { slot, wipe: false } => pending.push(Restore::Restart(slot)),
        Installed::Crashed { slot, wipe: true } => {
            // The machine comes back empty: a new node joins in its place
            // and an operator removes the old one.
            let old = cluster.replace(slot)?;
            pending.push(Restore::Join(slot));
            pending.push(Restore::RemoveOld { slot, name: old });
        }
        Installed::Removed(slot) => {
            cluster.replace(slot)?;
            pending.push(Restore::Join(slot));
        }
        Installed::RemovalInDoubt { slot, name } => {
            pending.push(Restore::FinishRemoval { slot, name });
        }
        Installed::Paused(slot) => cluster.resume(slot),
        Installed::Clock(slot) => cluster.set_clock(slot, 0),
        Installed::DiskFull(slot) => cluster.free_disk(slot),
        Installed::Nothing => {}
    }
    Ok(())
}

/// A step of bringing a node back.
#[derive(Clone, Debug)]
enum Restore {
    Restart(usize),
    Join(usize),
    RemoveOld {
        slot: usize,
        name: String,
    },
    /// Removing `name` until it is certainly gone, then joining a new
    /// node in its slot.
    FinishRemoval {
        slot: usize,
        name: String,
    },
}

impl std::fmt::Display for Restore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Restore::Restart(slot) => write!(f, "restarting slot {slot}"),
            Restore::Join(slot) => write!(f, "joining a new node in slot {slot}"),
            Restore::RemoveOld { name, .. } => write!(f, "removing the lost node {name}"),
            Restore::FinishRemoval { name, .. } => write!(f, "finishing the removal of {name}"),
        }
    }
}

/// Restores not done yet, each with its last error.
#[derive(Default)]
struct Pending {
    queue: Vec<(Restore, String)>,
}

impl Pending {
    fn push(&mut self, r: Restore) {
        self.queue.push((r, String::from("not tried yet")));
    }

    fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    fn failures(&self) -> Vec<(String, String)> {
        self.queue
            .iter()
            .map(|(r, e)| (r.to_string(), e.clone()))
            .collect()
    }

    /// One attempt at each restore; keeps those that failed. First, as a
    /// supervisor would, a node whose ledger stopped for good (its agent
    /// exits) is started again.
    async fn attempt(&mut self, cluster: &mut ChaosCluster) -> Result<(), String> {
        for slot in cluster.stopped_as_removed() {
            tracing::info!(
                slot,
                "chaos: a node heard of its removal and stops; a new one joins in its slot"
            );
            cluster.crash(slot).await;
            cluster.replace(slot)?;
            self.queue.retain(
                |(r, _)| !matches!(r, Restore::Restart(s) | Restore::Join(s) if *s == slot),
            );
            self.push(Restore::Join(slot));
        }
        for slot in cluster.stopped_ledgers() {
            cluster.crash(slot).await;
            if !self
                .queue
                .iter()
                .any(|(r, _)| matches!(r, Restore::Restart(s) if *s == slot))
            {
                self.push(Restore::Restart(slot));
            }
        }
        let mut left = Vec::new();
        // Slots given a new node in this pass: a restart queued for the
        // node they had is moot (seed 553: a removal finished here, and
        // the restart of the removed node queued after it started a second
        // copy of the new one, which found its ports taken).
        let mut replaced = std::collections::BTreeSet::new();
        for (r, _) in std::mem::take(&mut self.queue) {
            let result = match &r {
                Restore::Restart(slot) if replaced.contains(slot) => Ok(()),
                Restore::Restart(slot)
                    if crate::ledger_client::removal::marked(&cluster.slots[*slot].data_dir())
                        .is_some() =>
                {
                    // It heard of its removal before it crashed: its data
                    // dir never starts again, a new node joins instead.
                    cluster.replace(*slot)?;
                    replaced.insert(*slot);
                    left.push((Restore::Join(*slot), "removed".into()));
                    Ok(())
                }
                Restore::Restart(slot) => cluster.try_restart(*slot).await,
                Restore::Join(slot) => match cluster.try_join(*slot).await {
                    Err(e) if e.contains("already a member") || e.contains("no answer") => {
                        // The cluster may have admitted a join whose start
                        // did not finish here: an operator would try again
                        // under a new name and remove the half-joined one.
                        let ghost = cluster.replace(*slot)?;
                        left.push((
                            Restore::RemoveOld {
                                slot: *slot,
                                name: ghost,
                            },
                            e.clone(),
                        ));
                        Err(e)
                    }
                    other => other,
                },
                Restore::RemoveOld { slot, name } => {
                    remove_member(cluster, name, *slot, Duration::from_millis(1))
                        .await
                        .map_err(|e| e.last)
                }
                // The node heard of its removal and was replaced already.
                Restore::FinishRemoval { slot, name } if cluster.slots[*slot].name != *name => {
                    Ok(())
                }
                Restore::FinishRemoval { slot, name } => {
                    match remove_member(cluster, name, *slot, Duration::from_millis(1)).await {
                        Ok(()) => {
                            cluster.crash(*slot).await;
                            cluster.replace(*slot)?;
                            replaced.insert(*slot);
                            left.push((Restore::Join(*slot), "not tried yet".into()));
                            Ok(())
                        }
                        // It leads now: the attempt in doubt did not
                        // commit (a leader's log holds every committed
                        // entry, and it would have answered "already
                        // left"), and it stays.
                        Err(e) if e.last.contains("is the current leader") => Ok(()),
                        Err(e) => Err(e.last),
                    }
                }
            };
            if let Err(e) = result {
                left.push((r, e));
            }
        }
        self.queue = left;
        Ok(())
    }

    /// Attempts the restores until `until` (an attempt may run past it by
    /// its own timeout), then waits for `until`.
    async fn work_until(
        &mut self,
        cluster: &mut ChaosCluster,
        until: Instant,
    ) -> Result<(), String> {
        while (!self.queue.is_empty() || !cluster.removed_but_running().is_empty())
            && Instant::now() < until
        {
            self.attempt(cluster).await?;
            if !self.queue.is_empty() {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
        tokio::time::sleep_until(until.into()).await;
        Ok(())
    }

    async fn work_until_done(
        &mut self,
        cluster: &mut ChaosCluster,
        deadline: Instant,
    ) -> Result<(), String> {
        while (!self.queue.is_empty() || !cluster.removed_but_running().is_empty())
            && Instant::now() < deadline
        {
            self.attempt(cluster).await?;
            if !self.queue.is_empty() {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        }
        Ok(())
    }
}

/// Why a removal did not succeed: the last error, and whether any
/// attempt went unanswered (or failed in flight), so that it may still
/// commit.
struct RemoveFailed {
    last: String,
    in_doubt: bool,
}

/// `shoal node remove NAME` through any other running node, retried for
/// `within` (a removal needs a leader); the last refusal on failure.
async fn remove_member(
    cluster: &ChaosCluster,
    name: &str,
    not: usize,
    within: Duration,
) -> Result<(), RemoveFailed> {
    let deadline = Instant::now() + within;
    let mut last = String::from("no running node to ask");
    let mut in_doubt = false;
    loop {
        for (i, s) in cluster.slots.iter().enumerate() {
            if i == not || !s.is_running() || s.is_paused() {
                continue;
            }
            let removed =
                tokio::time::timeout(workload::OP_TIMEOUT, cluster.client(i).remove_node(name))
                    .await;
            match removed {
                Ok(Ok(_)) | Ok(Err(shoal_sdk::ClientError::Api { status: 404, .. })) => {
                    return Ok(())
                }
                // Gone already, or never admitted (a join that timed out
                // before the leader took it).
                Ok(Err(e))
                    if e.to_string().contains("already left")
                        || e.to_string().contains("no node named or numbered") =>
                {
                    return Ok(())
                }
                Ok(Err(e)) => {
                    // A refusal the leader answered (a 4xx) committed
                    // nothing; anything else may have.
                    let refused = matches!(
                        &e,
                        shoal_sdk::ClientError::Api { status, .. } if (400..500).contains(status)
                    );
                    in_doubt |= !refused;
                    last = format!("{}: {e}", s.name);
                }
                Err(_) => {
                    in_doubt = true;
                    last = format!("{}: no answer in {:?}", s.name, workload::OP_TIMEOUT);
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(RemoveFailed { last, in_doubt });
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Waits until every slot's node lists every slot's node as alive.
async fn wait_formed(cluster: &ChaosCluster, timeout: Duration) -> Result<(), String> {
    let deadline = Instant::now() + timeout;
    let want: Vec<NodeId> = cluster.slots.iter().filter_map(|s| s.id).collect();
    while Instant::now() < deadline {
        let formed = cluster.slots.iter().all(|s| {
            s.agent().is_some_and(|a| {
                a.ledger().read().is_ok_and(|d| {
                    want.iter().all(|id| {
                        d.ledger
                            .members
                            .get(id)
                            .is_some_and(|m| m.state == shoal_sdk::MemberState::Alive)
                    })
                })
            })
        });
        if formed {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!(
        "the cluster of {} nodes did not form in {timeout:?}",
        want.len()
    ))
}

async fn create_capped_tenant(cluster: &ChaosCluster) -> Result<(), String> {
    let req = shoal_sdk::TenantRequest {
        name: workload::CAPPED_TENANT.into(),
        max_gpus: Some(workload::CAPPED_TENANT_GPUS),
        ..Default::default()
    };
    let mut last = String::new();
    for _ in 0..20 {
        match tokio::time::timeout(workload::OP_TIMEOUT, cluster.client(0).create_tenant(&req))
            .await
        {
            Ok(Ok(_)) => return Ok(()),
            Ok(Err(e)) => last = e.to_string(),
            Err(_) => last = format!("no answer in {:?}", workload::OP_TIMEOUT),
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    Err(format!(
        "cannot create the tenant {}: {last}",
        workload::CAPPED_TENANT
    ))
}

/// After healing: waits until every node has applied the same ledger at
/// the same index (entries keep coming while jobs run and end, so this
/// polls for an instant of agreement). Returns each node's ledger.
async fn settle(
    cluster: &mut ChaosCluster,
    pending: &mut Pending,
    timeout: Duration,
) -> Result<Vec<(NodeId, Ledger)>, Vec<Violation>> {
    let deadline = Instant::now() + timeout;
    let mut last = Vec::new();
    while Instant::now() < deadline {
        // A ledger may still stop for good now (a disk that was full
        // until the end): its node is started again, as its supervisor
        // would.
        if !pending.is_empty()
            || !cluster.stopped_ledgers().is_empty()
            || !cluster.removed_but_running().is_empty()
        {
            let _ = pending.attempt(cluster).await;
        }
        let states: Vec<(NodeId, Option<u64>, Ledger)> = cluster
            .slots
            .iter()
            .filter_map(|s| {
                let agent = s.agent()?;
                let handle = agent.ledger();
                let d = handle.read().ok()?;
                Some((
                    agent.id(),
                    d.last_applied.map(|l| l.index),
                    d.ledger.clone(),
                ))
            })
            .collect();
        let all_running = states.len() == cluster.slots.len();
        let same_index = states.windows(2).all(|w| w[0].1 == w[1].1);
        if all_running && same_index && states.windows(2).all(|w| w[0].2 == w[1].2) {
            return Ok(states.into_iter().map(|(id, _, l)| (id, l)).collect());
        }
        last = states;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let indexes: Vec<String> = last
        .iter()
        .map(|(id, i, _)| format!("node {id} at {i:?}"))
        .collect();
    let refs: Vec<(NodeId, &Ledger)> = last.iter().map(|(id, _, l)| (*id, l)).collect();
    // What Raft says on each node: enough to tell a lagging voter from a
    // node the leader no longer replicates to.
    let raft: Vec<String> = cluster
        .slots
        .iter()
        .filter_map(|s| {
            let agent = s.agent()?;
            let watch = agent.node().ledger().raft_metrics();
            let m = watch.borrow();
            let replication = m.replication.as_ref().map(|r| {
                r.iter()
                    .map(|(id, log)| format!("{id}:{}", log.map_or(0, |l| l.index)))
                    .collect::<Vec<_>>()
                    .join(" ")
            });
            Some(format!(
                "node {} {:?} term {} leader {:?} voters {:?} learners {:?} last_log {:?} snapshot {:?} purged {:?} replication [{}]",
                agent.id(),
                m.state,
                m.current_term,
                m.current_leader,
                m.membership_config.membership().voter_ids().collect::<Vec<_>>(),
                m.membership_config.membership().learner_ids().collect::<Vec<_>>(),
                m.last_log_index,
                m.snapshot.map(|l| l.index),
                m.purged.map(|l| l.index),
                replication.unwrap_or_default()
            ))
        })
        .collect();
    let mut found: Vec<Violation> = cluster
        .removed_but_running()
        .into_iter()
        .map(|slot| {
            Violation::new(
                "removed-runs-on",
                format!(
                    "{} was removed from the cluster and still runs as a member: it never noticed",
                    cluster.slots[slot].name
                ),
            )
        })
        .collect();
    found.push(Violation::new(
        "not-converged",
        format!(
            "{} of {} nodes running; they did not reach one ledger within {timeout:?} of healing: {}; raft: {}",
            last.len(),
            cluster.slots.len(),
            indexes.join(", "),
            raft.join("; ")
        ),
    ));
    found.extend(invariants::check_converged(&refs));
    Err(found)
}
