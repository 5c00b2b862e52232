//! The API's views of the ledger (status, nodes, jobs, tenants, quota,
//! objects, events) and the conversions between the API's job and tenant
//! types and the ledger's. Pure, so the API and RPC handlers stay thin and
//! the mapping is tested here.

use crate::clock::wall_ms;
use crate::proto::{ErrorCode, Query, Response, WireError};
use openraft::{BasicNode, RaftMetrics};
use shoal_consensus::ledger::Ledger;
use shoal_consensus::limits::{self, Limits};
use shoal_consensus::sched::{NodeChoice, TopologyTier};
use shoal_consensus::store::StateMachineData;
use shoal_consensus::workload::{
    Job, JobSpec, JobState, Tenant, TenantLimits, TenantUpdate, DEFAULT_TENANT,
};
use shoal_consensus::NodeId;
use shoal_sdk::{
    CheckpointInfo, CheckpointPartInfo, JobInfo, JobSubmitRequest, LedgerLimitsInfo, MemberState,
    QuotaInfo, TenantInfo, TenantRequest,
};
use shoal_sdk::{MemberSummary, NodeInfo, StatusResponse};
use std::collections::BTreeMap;
use std::collections::BTreeSet;
use std::time::Instant;

pub use crate::clock::rfc3339;

pub fn job_spec(req: &JobSubmitRequest) -> Result<JobSpec, String> {
    let same = match req.same.as_deref() {
        None => None,
        Some("rack") => Some(TopologyTier::Rack),
        Some("zone") => Some(TopologyTier::Zone),
        Some("region") => Some(TopologyTier::Region),
        Some(other) => {
            return Err(format!(
                "--same must be rack, zone or region, not '{other}'"
            ))
        }
    };
    let (max_restarts, requeue) = req.restart_policy();
    let ckpt_copies = parse_ckpt_replicas(req.ckpt_replicas.as_deref())?;
    let (dependencies, singleton) = match req.dependency.as_deref() {
        None | Some("") => (Vec::new(), false),
        Some(list) => shoal_consensus::workload::Dependency::parse_list(list)?,
    };
    Ok(JobSpec {
        name: if req.name.is_empty() {
            req.command
                .first()
                .map(|c| c.rsplit('/').next().unwrap_or(c).to_string())
                .unwrap_or_else(|| "alloc".into())
        } else {
            req.name.clone()
        },
        tenant: req
            .tenant
            .clone()
            .unwrap_or_else(|| DEFAULT_TENANT.to_string()),
        nodes: req.nodes,
        gpus_per_node: req.gpus_per_node,
        gpu_model: req.gpu_model.clone(),
        time_limit_s: req.time_limit_s,
        priority: req.priority,
        preemptible: req.preemptible,
        command: req.command.clone(),
        env: req.env.clone(),
        workdir: req.workdir.clone(),
        ckpt_interval_s: req.ckpt_interval_s,
        max_restarts,
        requeue,
        same,
        max_rtt_ms: req.max_rtt_ms,
        required_labels: req.labels.clone(),
        mem_bytes: req.mem_bytes,
        cpus_per_task: req.cpus_per_task,
        tasks_per_node: match req.tasks_per_node {
            Some(0) => return Err("--ntasks-per-node must be positive".into()),
            t => t.unwrap_or(1),
        },
        batch: req.batch,
        dependencies,
        singleton,
        warn_signal: req
            .signal
            .as_deref()
            .map(shoal_consensus::workload::WarnSignal::parse)
            .transpose()?,
        // Names are resolved against the ledger by [`node_choice`].
        choice: NodeChoice {
            exclusive: req.exclusive,
            ..NodeChoice::default()
        },
        submit_held: req.hold,
        ckpt_peer_copies: ckpt_copies.0,
        ckpt_region_copies: ckpt_copies.1,
    })
}

/// `--ckpt-replicas L[+R]`: peers of the job's region (besides the
/// writer) and other regions holding each checkpoint; absent: 3 and 0.
pub fn parse_ckpt_replicas(text: Option<&str>) -> Result<(u32, u32), String> {
    let Some(text) = text.map(str::trim).filter(|t| !t.is_empty()) else {
        return Ok((0, 0));
    };
    let bad = || {
        format!(
            "--ckpt-replicas '{text}': expected L or L+R (copies on L peers of the job's region, 1-3, and in R other regions, 0-1), e.g. 2+1"
        )
    };
    let (local, remote) = match text.split_once('+') {
        Some((l, r)) => (l, r),
        None => (text, "0"),
    };
    let local: u32 = local.trim().parse().map_err(|_| bad())?;
    let remote: u32 = remote.trim().parse().map_err(|_| bad())?;
    if !(1..=shoal_consensus::workload::MAX_PEER_COPIES).contains(&local)
        || remote > shoal_consensus::workload::MAX_REGION_COPIES
    {
        return Err(bad());
    }
    Ok((local, remote))
}

/// The job's node choice with `--nodelist`/`--exclude` host lists resolved
/// to the members of that name (not those that left); a name no member has
/// is an error naming it.
pub fn node_choice(ledger: &Ledger, req: &JobSubmitRequest) -> Result<NodeChoice, String> {
    let by_name: BTreeMap<&str, NodeId> = ledger
        .members
        .values()
        .filter(|m| m.state != MemberState::Left)
        .map(|m| (m.spec.name.as_str(), m.id))
        .collect();
    let resolve = |flag: &str, list: Option<&str>| -> Result<Vec<NodeId>, String> {
        let Some(list) = list.filter(|l| !l.is_empty()) else {
            return Ok(Vec::new());
        };
        let names = crate::hostlist::expand_hostlist(list).map_err(|e| format!("{flag}: {e}"))?;
        names
            .iter()
            .map(|name| {
                by_name
                    .get(name.as_str())
                    .copied()
                    .ok_or_else(|| format!("{flag}: no node named '{name}' in the cluster"))
            })
            .collect()
    };
    Ok(NodeChoice {
        only: resolve("--nodelist", req.nodelist.as_deref())?,
        exclude: resolve("--exclude", req.exclude.as_deref())?,
        exclusive: req.exclusive,
    }
    .normalized())
}

/// A `--test-only` answer with node names and times.
pub fn test_only(
    ledger: &Ledger,
    trial: &shoal_consensus::workload::TrialStart,
    now_ms: u64,
) -> shoal_sdk::JobTestOnlyResponse {
    let nodes: Vec<String> = trial
        .nodes
        .iter()
        .map(|(id, _)| {
            ledger
                .members
                .get(id)
                .map_or_else(|| id.to_string(), |m| m.spec.name.clone())
        })
        .collect();
    shoal_sdk::JobTestOnlyResponse {
        start_in_s: trial.start_in_s,
        start_at: trial
            .start_in_s
            .map(|s| rfc3339(now_ms.saturating_add(s.saturating_mul(1000)))),
        nodelist: crate::hostlist::compress_hostlist(&nodes),
        nodes,
        reason: trial.reason.clone(),
    }
}

pub fn job_info(ledger: &Ledger, job: &Job) -> JobInfo {
    let name_of = |id: u64| {
        ledger
            .members
            .get(&id)
            .map(|m| m.spec.name.clone())
            .unwrap_or_else(|| id.to_string())
    };
    let placed = job
        .alloc
        .as_ref()
        .map(|a| &a.nodes)
        .unwrap_or(&job.last_nodes);
    let hostlist_of = |ids: &[NodeId]| {
        (!ids.is_empty()).then(|| {
            let names: Vec<String> = ids.iter().map(|n| name_of(*n)).collect();
            crate::hostlist::compress_hostlist(&names)
        })
    };
    JobInfo {
        region: None,
        id: job.id,
        name: job.spec.name.clone(),
        tenant: job.spec.tenant.clone(),
        state: job.state,
        // What the user set (a hold, a dependency) is why the scheduler has
        // not looked at it.
        reason: match job.state.is_waiting() {
            true => job
                .user_hold(&ledger.workload.jobs)
                .unwrap_or_else(|| job.reason.clone()),
            false => job.reason.clone(),
        },
        nodes: placed.iter().map(|(n, _)| name_of(*n)).collect(),
        gpus: placed
            .iter()
            .map(|(n, gpus)| (name_of(*n), gpus.clone()))
            .collect(),
        epoch: job.alloc.as_ref().map(|a| a.epoch).or(job.last_epoch),
        restarts: job.restarts,
        max_restarts: job.spec.max_restarts,
        requeue: job.spec.requeue,
        preemptions: job.preemptions,
        priority: job.spec.priority,
        nodes_requested: job.spec.nodes,
        gpus_per_node: job.spec.gpus_per_node,
        time_limit_s: job.spec.time_limit_s,
        preemptible: job.spec.preemptible,
        command: job.spec.command.clone(),
        submitted_at: rfc3339(job.submitted_at_ms),
        started_at: job.started_at_ms.map(rfc3339),
        ended_at: job.ended_at_ms.map(rfc3339),
        exit_code: job.exit_code,
        last_ckpt_step: job.last_ckpt_step,
        mem_bytes: job.spec.mem_bytes,
        cpus_per_task: job.spec.cpus_per_task,
        tasks_per_node: job.spec.tasks_per_node(),
        dependency: (!job.spec.dependencies.is_empty() || job.spec.singleton).then(|| {
            shoal_consensus::workload::Dependency::format_list(
                &job.spec.dependencies,
                job.spec.singleton,
            )
        }),
        held: job.held,
        signal: job.spec.warn_signal.map(|w| w.display()),
        nodelist: hostlist_of(&job.spec.choice.only),
        exclude: hostlist_of(&job.spec.choice.exclude),
        exclusive: job.spec.choice.exclusive,
    }
}

pub fn jobs(
    ledger: &Ledger,
    tenant: Option<&str>,
    state: Option<&str>,
) -> Result<Vec<JobInfo>, String> {
    let state = match state {
        None => None,
        Some(s) => Some(JobState::parse(s).ok_or_else(|| {
            let known: Vec<&str> = JobState::ALL.iter().map(|s| s.as_str()).collect();
            format!("unknown job state '{s}' ({})", known.join(", "))
        })?),
    };
    Ok(ledger
        .workload
        .jobs
        .values()
        .filter(|j| tenant.is_none_or(|t| j.spec.tenant == t))
        .filter(|j| state.is_none_or(|s| j.state == s))
        .map(|j| job_info(ledger, j))
        .collect())
}

pub fn checkpoints(ledger: &Ledger, job: u64) -> Option<Vec<CheckpointInfo>> {
    ledger.workload.jobs.get(&job)?;
    Some(
        ledger
            .workload
            .checkpoints
            .get(&job)
            .map(|catalog| {
                catalog
                    .iter()
                    .map(|c| CheckpointInfo {
                        step: c.step,
                        bytes: c.bytes(),
                        replicas: c.replicas(),
                        committed_at: c.committed_at_ms.map(rfc3339),
                        epoch: c.epoch,
                        regions: c.regions.clone(),
                        parts: c
                            .parts
                            .iter()
                            .map(|(rank, part)| CheckpointPartInfo {
                                rank: *rank,
                                bytes: part.bytes,
                                holders: part.holders.clone(),
                                manifest_hex: hex::encode(&part.manifest),
                            })
                            .collect(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
    )
}

pub fn objects(ledger: &Ledger, path: &str) -> Vec<shoal_sdk::ObjectInfo> {
    let alive: Vec<u64> = ledger
        .active_members()
        .filter(|m| m.state == MemberState::Alive)
        .map(|m| m.id)
        .collect();
    ledger
        .namespace
        .list(path)
        .into_iter()
        .map(|o| shoal_sdk::ObjectInfo {
            path: o.path.clone(),
            is_dir: o.is_dir,
            bytes: o.bytes,
            files: o.files,
            replicas: o.holders.clone(),
            replica: o.replica,
            // Live copies, not the list: a holder that is down stays
            // listed (it comes back with its copy) beside its replacement.
            healthy: o.holders.iter().filter(|h| alive.contains(h)).count() >= o.replica as usize,
            tenant: o.tenant.clone(),
            mtime: rfc3339(o.mtime_ms),
            manifest_hex: hex::encode(&o.manifest),
        })
        .collect()
}

pub fn events(ledger: &Ledger, after: u64) -> Vec<shoal_sdk::EventInfo> {
    ledger
        .events
        .after(after)
        .map(|e| shoal_sdk::EventInfo {
            id: e.id,
            at: rfc3339(e.at_ms),
            at_ms: e.at_ms,
            severity: e.spec.severity.as_str().to_string(),
            kind: e.spec.kind.clone(),
            node: e.spec.node.map(|n| {
                ledger
                    .members
                    .get(&n)
                    .map(|m| m.spec.name.clone())
                    .unwrap_or_else(|| n.to_string())
            }),
            gpu: e.spec.gpu,
            job: e.spec.job,
            message: e.spec.message.clone(),
            resource: e.spec.resource.clone(),
            repeats: e.repeats,
        })
        .collect()
}

/// The changes of a tenant's caps across regions `req` asks for (GPUs,
/// GPU-seconds): `None` leaves a cap, `Some(None)` lifts it.
pub type GlobalCapsChange = (Option<Option<u32>>, Option<Option<u64>>);

pub fn global_caps_change(req: &TenantRequest) -> Result<GlobalCapsChange, String> {
    let unset = |field: &str| req.unset.iter().any(|f| f == field);
    let gpus = match (req.global_gpus, unset("global_gpus")) {
        (Some(_), true) => return Err("--global-gpus cannot be both set and unset".into()),
        (Some(n), false) => Some(Some(n)),
        (None, true) => Some(None),
        (None, false) => None,
    };
    let seconds = match (req.global_gpu_hours, unset("global_gpu_hours")) {
        (Some(_), true) => return Err("--global-gpu-hours cannot be both set and unset".into()),
        (Some(h), false) => Some(Some(hours_to_seconds(h)?)),
        (None, true) => Some(None),
        (None, false) => None,
    };
    Ok((gpus, seconds))
}

pub fn tenant_limits(req: &TenantRequest) -> Result<TenantLimits, String> {
    if let Some(unknown) = req.unset.first() {
        return Err(format!(
            "'{unknown}' cannot be unset when creating a tenant"
        ));
    }
    Ok(TenantLimits {
        parent: req.parent.clone(),
        max_gpus: req.max_gpus,
        gpu_seconds_limit: req.gpu_hours.map(hours_to_seconds).transpose()?,
        weight: req.weight.unwrap_or(1),
        max_pending_jobs: req.max_pending_jobs,
        max_objects: req.max_objects,
        max_manifest_bytes: req.max_manifest_bytes,
        max_priority: req.max_priority,
    })
}

pub fn tenant_update(req: &TenantRequest) -> Result<TenantUpdate, String> {
    let mut update = TenantUpdate {
        parent: req.parent.clone().map(Some),
        max_gpus: req.max_gpus.map(Some),
        gpu_seconds_limit: req.gpu_hours.map(hours_to_seconds).transpose()?.map(Some),
        weight: req.weight,
        max_pending_jobs: req.max_pending_jobs.map(Some),
        max_objects: req.max_objects.map(Some),
        max_manifest_bytes: req.max_manifest_bytes.map(Some),
        max_priority: req.max_priority.map(Some),
    };
    for field in &req.unset {
        match field.as_str() {
            "parent" => update.parent = Some(None),
            "max_gpus" => update.max_gpus = Some(None),
            "gpu_hours" => update.gpu_seconds_limit = Some(None),
            "max_pending_jobs" => update.max_pending_jobs = Some(None),
            "max_objects" => update.max_objects = Some(None),
            "max_manifest_bytes" => update.max_manifest_bytes = Some(None),
            "max_priority" => update.max_priority = Some(None),
            // Not limits of the tenant's record: see `global_caps_change`.
            "global_gpus" | "global_gpu_hours" => {}
            other => {
                return Err(format!(
                    "cannot unset '{other}' (parent, max_gpus, gpu_hours, global_gpus, global_gpu_hours, max_pending_jobs, max_objects, max_manifest_bytes or max_priority)"
                ))
            }
        }
    }
    Ok(update)
}

/// A tenant's own ledger use and the limits in force on it.
pub fn ledger_limits(ledger: &Ledger, tenant: &Tenant) -> LedgerLimitsInfo {
    let limits = Limits::of(ledger, &tenant.name);
    let used = limits::usage(ledger, &tenant.name);
    let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
    LedgerLimitsInfo {
        pending_jobs: count(used.waiting_jobs),
        max_pending_jobs: count(limits.waiting_jobs),
        objects: count(used.objects),
        max_objects: count(limits.objects),
        manifest_bytes: count(used.manifest_bytes),
        max_manifest_bytes: count(limits.tenant_manifest_bytes),
        max_priority: limits.max_priority,
        overridden: limits::overridden(&tenant.limits),
    }
}

fn hours_to_seconds(hours: f64) -> Result<u64, String> {
    if !(0.0..=1e12).contains(&hours) {
        return Err(format!(
            "--gpu-hours must be a non-negative number, not {hours}"
        ));
    }
    Ok((hours * 3600.0).round() as u64)
}

pub fn tenants(ledger: &Ledger) -> Vec<TenantInfo> {
    ledger
        .workload
        .tenants
        .values()
        .map(|t| TenantInfo {
            name: t.name.clone(),
            parent: t.limits.parent.clone(),
            max_gpus: t.limits.max_gpus,
            gpu_hours_limit: t.limits.gpu_seconds_limit.map(|s| s as f64 / 3600.0),
            weight: t.limits.weight,
            created_at: rfc3339(t.created_at_ms),
            ledger_limits: Some(ledger_limits(ledger, t)),
        })
        .collect()
}

/// Quota and usage per tenant, subtree totals, as of `now_ms`.
pub fn quota(ledger: &Ledger, now_ms: u64) -> Vec<QuotaInfo> {
    let workload = &ledger.workload;
    let held = workload.gpus_in_use();
    let healthy_gpus: usize = ledger
        .active_members()
        .filter(|m| m.state == MemberState::Alive)
        .map(|m| m.spec.gpus.len())
        .sum();
    let mut counts: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
    for job in workload.jobs.values() {
        let entry = counts.entry(job.spec.tenant.as_str()).or_default();
        if job.alloc.is_some() {
            entry.0 += 1;
        } else if job.state.is_waiting() {
            entry.1 += 1;
        }
    }
    workload
        .tenants
        .values()
        .map(|t| {
            let subtree = workload.subtree(&t.name);
            let gpus_in_use: u32 = subtree
                .iter()
                .map(|s| held.get(s).copied().unwrap_or(0))
                .sum();
            let used_ms: u64 = subtree
                .iter()
                .map(|s| workload.used_gpu_ms(s, now_ms))
                .sum();
            let refunded_ms: u64 = subtree
                .iter()
                .map(|s| workload.tenants[*s].refunded_gpu_ms)
                .sum();
            let fair_ms: u64 = subtree
                .iter()
                .map(|s| workload.tenants[*s].fair_usage_gpu_ms)
                .sum();
            let (running, pending) = subtree.iter().fold((0, 0), |acc, s| {
                let c = counts.get(s).copied().unwrap_or_default();
                (acc.0 + c.0, acc.1 + c.1)
            });
            QuotaInfo {
                tenant: t.name.clone(),
                gpus_in_use,
                max_gpus: t.limits.max_gpus,
                gpu_hours_used: used_ms as f64 / 3_600_000.0,
                gpu_hours_limit: t.limits.gpu_seconds_limit.map(|s| s as f64 / 3600.0),
                share: if healthy_gpus == 0 {
                    0.0
                } else {
                    f64::from(gpus_in_use) / healthy_gpus as f64
                },
                weight: t.limits.weight,
                gpu_hours_refunded: refunded_ms as f64 / 3_600_000.0,
                fair_usage_gpu_hours: fair_ms as f64 / 3_600_000.0,
                running_jobs: running,
                pending_jobs: pending,
                ledger_limits: Some(ledger_limits(ledger, t)),
            }
        })
        .collect()
}

/// GPUs of each node held by jobs, for `shoal nodes`.
pub fn gpu_owners(ledger: &Ledger) -> BTreeMap<(u64, u32), u64> {
    let mut owners = BTreeMap::new();
    for (job, alloc) in ledger.workload.holding() {
        for (node, gpus) in &alloc.nodes {
            for gpu in gpus {
                owners.insert((*node, *gpu), job.id);
            }
        }
    }
    owners
}

/// What this node saw itself, for the views that show liveness and load.
pub struct Seen<'a> {
    pub me: NodeId,
    pub peers: &'a crate::peers::SharedPeerView,
    /// This node's own GPU load, 0..1.
    pub own_load: f32,
}

/// Answers `q` from the leader's ledger, which the caller has confirmed is
/// current ([`LedgerClient::ensure_linearizable`]).
pub fn answer(
    q: Query,
    d: &StateMachineData,
    raft: &RaftMetrics<NodeId, BasicNode>,
    seen: &Seen,
) -> Result<Response, WireError> {
    let metrics = raft;
    let membership = metrics.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    match q {
        Query::Status => {
            let (cluster_id, region) = d
                .ledger
                .cluster
                .as_ref()
                .map(|c| (c.cluster_id.clone(), c.region.clone()))
                .unwrap_or_default();
            Ok(Response::Status(StatusResponse {
                cluster_id,
                region,
                leader: metrics.current_leader,
                term: metrics.current_term,
                commit_index: metrics.last_applied.map(|l| l.index).unwrap_or(0),
                voters: voters.iter().copied().collect(),
                learners: membership.learner_ids().collect(),
                members: d
                    .ledger
                    .active_members()
                    .map(|m| MemberSummary {
                        id: m.id,
                        name: m.spec.name.clone(),
                        state: m.state,
                        version: m.spec.version.clone(),
                        protocol: protocol_text(&m.spec),
                    })
                    .collect(),
                node_id: seen.me,
                effective_protocol: d.ledger.effective_protocol(),
                ca_fingerprint: d
                    .ledger
                    .cluster
                    .as_ref()
                    .and_then(|c| shoal_mesh::tls::fingerprint_pem(&c.ca_cert_pem))
                    .unwrap_or_default(),
                ca_rotation: d
                    .ledger
                    .ca
                    .rotation
                    .as_ref()
                    .map(|r| r.phase.as_str().to_string()),
            }))
        }
        Query::Attrs { prefix } => Ok(Response::Attrs(
            d.ledger
                .attrs
                .range(prefix.clone()..)
                .take_while(|(k, _)| k.starts_with(&prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        )),
        Query::Jobs { tenant, state } => jobs(&d.ledger, tenant.as_deref(), state.as_deref())
            .map(Response::Jobs)
            .map_err(|m| WireError::new(ErrorCode::Invalid, m)),
        Query::Job(id) => match d.ledger.workload.jobs.get(&id) {
            Some(job) => Ok(Response::Jobs(vec![job_info(&d.ledger, job)])),
            None => Err(WireError::new(ErrorCode::NotFound, format!("no job {id}"))),
        },
        Query::Checkpoints(id) => checkpoints(&d.ledger, id)
            .map(Response::Checkpoints)
            .ok_or_else(|| WireError::new(ErrorCode::NotFound, format!("no job {id}"))),
        Query::Objects { path } => Ok(Response::Objects(objects(&d.ledger, &path))),
        Query::Events { after } => Ok(Response::Events(events(&d.ledger, after))),
        Query::Tenants => Ok(Response::Tenants(tenants(&d.ledger))),
        Query::Quota => Ok(Response::Quota(quota(
            &d.ledger,
            d.ledger.clock_ms.max(wall_ms()),
        ))),
        Query::Nodes => {
            let owners = gpu_owners(&d.ledger);
            let now = Instant::now();
            let nodes = d
                .ledger
                .active_members()
                .map(|m| {
                    let (last_seen_ms, gpu_util) = match seen.peers.lock() {
                        Ok(p) if m.id != seen.me => (
                            p.last_heard
                                .get(&m.id)
                                .map(|t| now.saturating_duration_since(*t).as_millis() as u64),
                            p.capacity.get(m.id).map(|a| a.load),
                        ),
                        _ => (Some(0), Some(seen.own_load)),
                    };
                    let gpus: Vec<_> = m
                        .spec
                        .gpus
                        .iter()
                        .map(|g| {
                            let fault = d.ledger.workload.gpu_fault(m.id, g.index);
                            let health = match fault {
                                None => "ok",
                                Some(f) if f.detected => "unhealthy",
                                Some(_) => "drained",
                            };
                            shoal_sdk::GpuInfo {
                                allocated_to: owners.get(&(m.id, g.index)).copied(),
                                health: health.into(),
                                health_reason: fault.map(|f| f.reason.clone()),
                                ..g.clone()
                            }
                        })
                        .collect();
                    let gpus_total = gpus.len() as u32;
                    let gpus_free = gpus
                        .iter()
                        .filter(|g| g.allocated_to.is_none() && g.health == "ok")
                        .count() as u32;
                    NodeInfo {
                        id: m.id,
                        name: m.spec.name.clone(),
                        state: m.state,
                        addr: m.spec.rpc_addr.clone(),
                        api_addr: m.spec.api_addr.clone(),
                        api_url: m.spec.api_url(),
                        labels: m.spec.labels.clone(),
                        gpus,
                        gpus_free,
                        gpus_total,
                        last_seen_ms,
                        voter: voters.contains(&m.id),
                        joined_at_ms: m.joined_at_ms,
                        gpu_util,
                        drained: d.ledger.workload.drained.contains(&m.id),
                        isolation: m.spec.isolation.clone(),
                        isolation_controllers: m.spec.isolation_controllers.clone(),
                        version: m.spec.version.clone(),
                        protocol: protocol_text(&m.spec),
                    }
                })
                .collect();
            Ok(Response::Nodes(nodes))
        }
    }
}

/// A member's protocol range as `min..max`.
fn protocol_text(spec: &shoal_consensus::MemberSpec) -> String {
    let (min, max) = spec.protocol();
    format!("{min}..{max}")
}

/// This node's own view of every other member: adverts and RTTs from
/// gossip, liveness as the leader judges it (its detector on the leader,
/// the ledger elsewhere).
pub fn peer_views(
    ledger: &crate::ledger_client::LedgerClient,
    peers: &crate::peers::SharedPeerView,
) -> Vec<shoal_sdk::PeerView> {
    let me = ledger.me();
    let members: Vec<(NodeId, String, MemberState)> = match ledger.read() {
        Ok(d) => d
            .ledger
            .active_members()
            .filter(|m| m.id != me)
            .map(|m| (m.id, m.spec.name.clone(), m.state))
            .collect(),
        Err(_) => return Vec::new(),
    };
    let Ok(p) = peers.lock() else {
        return Vec::new();
    };
    let now = Instant::now();
    members
        .into_iter()
        .map(|(id, name, committed)| {
            let advert = p.capacity.get(id);
            // The leader's own judgement where this node leads (it is
            // ahead of the ledger by a commit), else the ledger's.
            let state = if p.judging() {
                p.state(id).map(|s| s.as_str().to_string())
            } else {
                Some(committed.as_str().to_string())
            };
            shoal_sdk::PeerView {
                id,
                name,
                state: state.unwrap_or_else(|| "unknown".into()),
                last_heard_ms: p
                    .last_heard
                    .get(&id)
                    .map(|t| now.saturating_duration_since(*t).as_millis() as u64),
                rtt_ms: p
                    .estimated_rtt(me, id, me)
                    .map(|d| d.as_secs_f64() * 1000.0),
                gpus_free: advert.map(|a| a.gpus_free_by_model.values().sum()),
                gpus_total: advert.map(|a| a.gpus_total),
                load: advert.map(|a| a.load),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timestamps_are_rfc3339_utc() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(1_795_000_000_123), "2026-11-18T11:06:40Z");
    }

    #[test]
    fn submissions_map_to_specs_with_defaults() {
        let req = JobSubmitRequest {
            name: String::new(),
            tenant: None,
            nodes: 2,
            gpus_per_node: 8,
            gpu_model: None,
            time_limit_s: 60,
            priority: 0,
            preemptible: true,
            command: vec!["/usr/bin/python3".into(), "train.py".into()],
            env: BTreeMap::new(),
            workdir: None,
            ckpt_interval_s: None,
            max_restarts: Some(0),
            requeue: false,
            same: Some("rack".into()),
            max_rtt_ms: None,
            labels: BTreeMap::new(),
            mem_bytes: None,
            cpus_per_task: None,
            tasks_per_node: None,
            batch: false,
            dependency: None,
            signal: None,
            nodelist: None,
            exclude: None,
            exclusive: false,
            hold: false,
            ckpt_replicas: None,
            near: None,
        };
        let spec = job_spec(&req).expect("valid");
        assert_eq!(spec.name, "python3");
        assert_eq!(spec.tenant, DEFAULT_TENANT);
        assert_eq!(spec.same, Some(TopologyTier::Rack));
        let bad = JobSubmitRequest {
            same: Some("building".into()),
            ..req
        };
        assert!(job_spec(&bad).unwrap_err().contains("--same"));
    }

    #[test]
    fn restarts_on_rank_failure_only_when_asked_for() {
        let base = JobSubmitRequest::shell(1, 1, "true");
        let policy = |max_restarts: Option<u32>, requeue: bool| {
            let spec = job_spec(&JobSubmitRequest {
                max_restarts,
                requeue,
                ..base.clone()
            })
            .expect("valid");
            (spec.max_restarts, spec.requeue)
        };
        // Neither flag: node loss restarts 3 times, a rank's failure never.
        assert_eq!(
            policy(None, false),
            (shoal_sdk::DEFAULT_MAX_RESTARTS, false)
        );
        assert_eq!(policy(None, true), (shoal_sdk::DEFAULT_MAX_RESTARTS, true));
        assert_eq!(policy(Some(2), false), (2, true));
        assert_eq!(policy(Some(0), false), (0, false));
        assert_eq!(policy(Some(5), true), (5, true));
    }

    #[test]
    fn tenant_updates_can_unset_limits() {
        let req = TenantRequest {
            name: "t".into(),
            gpu_hours: Some(1.5),
            unset: vec!["max_gpus".into()],
            ..Default::default()
        };
        let update = tenant_update(&req).expect("valid");
        assert_eq!(update.max_gpus, Some(None));
        assert_eq!(update.gpu_seconds_limit, Some(Some(5400)));
        assert!(tenant_limits(&req).is_err());
        let bad = TenantRequest {
            unset: vec!["weight".into()],
            ..req
        };
        assert!(tenant_update(&bad).is_err());
    }

    #[test]
    fn ledger_limits_are_set_reset_and_shown_in_force() {
        let req = TenantRequest {
            name: "t".into(),
            max_pending_jobs: Some(7),
            max_priority: Some(-1),
            unset: vec!["max_objects".into(), "max_manifest_bytes".into()],
            ..Default::default()
        };
        let update = tenant_update(&req).expect("valid");
        assert_eq!(update.max_pending_jobs, Some(Some(7)));
        assert_eq!(update.max_priority, Some(Some(-1)));
        assert_eq!(update.max_objects, Some(None));
        assert_eq!(update.max_manifest_bytes, Some(None));
        let created = tenant_limits(&TenantRequest {
            unset: vec![],
            ..req
        })
        .expect("valid");
        assert_eq!(created.max_pending_jobs, Some(7));
        assert_eq!(created.max_objects, None);

        let mut ledger = Ledger::new();
        let tenant = shoal_consensus::workload::Tenant {
            name: "t".into(),
            limits: created,
            created_at_ms: 0,
            charged_gpu_ms: 0,
            refunded_gpu_ms: 0,
            fair_usage_gpu_ms: 0,
            fair_usage_at_ms: 0,
        };
        ledger.workload.tenants.insert("t".into(), tenant.clone());
        let shown = ledger_limits(&ledger, &tenant);
        assert_eq!(shown.max_pending_jobs, 7);
        assert_eq!(shown.max_priority, -1);
        assert_eq!(shown.max_objects, Limits::DEFAULT.objects as u64);
        assert_eq!(shown.overridden, vec!["max_pending_jobs", "max_priority"]);
        assert_eq!(shown.pending_jobs, 0);
    }
}
