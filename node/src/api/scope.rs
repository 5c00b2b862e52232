//! What a caller may read. An admin token reads everything; a token of
//! tenant `T` reads only the work of `T` and the tenants below it — its jobs
//! (and their logs and checkpoints), its events, quotas and `mesh:/` objects,
//! and the chunks those name. Another tenant's work does not appear at all:
//! asking for it by id answers as if it did not exist, so ids and names do
//! not leak through error messages either. Pure: decided from the ledger.

use crate::trust::auth::Caller;
use shoal_consensus::access::covers;
use shoal_consensus::ledger::Ledger;
use shoal_consensus::workload::JobId;
use shoal_sdk::{EventInfo, JobInfo, NodeInfo, QuotaInfo, TenantInfo};
use shoal_storage::chunk::ChunkId;
use shoal_storage::manifest::Manifest;

/// The tenant subtree a caller reads; `None` for an admin token.
pub fn scope(caller: &Caller) -> Option<&str> {
    caller.tenant.as_deref()
}

/// Whether `caller` may see work of `tenant`.
pub fn sees_tenant(ledger: &Ledger, caller: &Caller, tenant: &str) -> bool {
    match scope(caller) {
        None => true,
        Some(scope) => covers(&ledger.workload, scope, tenant),
    }
}

/// Whether `caller` may see job `id` (an unknown job is visible only to an
/// admin, who then gets the usual "no job" answer).
pub fn sees_job(ledger: &Ledger, caller: &Caller, id: JobId) -> bool {
    match ledger.workload.jobs.get(&id) {
        Some(job) => sees_tenant(ledger, caller, &job.spec.tenant),
        None => scope(caller).is_none(),
    }
}

pub fn jobs(ledger: &Ledger, caller: &Caller, jobs: Vec<JobInfo>) -> Vec<JobInfo> {
    jobs.into_iter()
        .filter(|j| sees_tenant(ledger, caller, &j.tenant))
        .collect()
}

/// Events about the caller's jobs; events about no job (a node, a GPU
/// nobody of the tenant holds) are the operators'.
pub fn events(ledger: &Ledger, caller: &Caller, events: Vec<EventInfo>) -> Vec<EventInfo> {
    if scope(caller).is_none() {
        return events;
    }
    events
        .into_iter()
        .filter(|e| e.job.is_some_and(|job| sees_job(ledger, caller, job)))
        .collect()
}

pub fn tenants(ledger: &Ledger, caller: &Caller, tenants: Vec<TenantInfo>) -> Vec<TenantInfo> {
    tenants
        .into_iter()
        .filter(|t| sees_tenant(ledger, caller, &t.name))
        .collect()
}

pub fn quotas(ledger: &Ledger, caller: &Caller, quotas: Vec<QuotaInfo>) -> Vec<QuotaInfo> {
    quotas
        .into_iter()
        .filter(|q| sees_tenant(ledger, caller, &q.tenant))
        .collect()
}

/// Nodes as a tenant sees them: every GPU and whether it is free, but not
/// which other tenant's job holds it.
pub fn nodes(ledger: &Ledger, caller: &Caller, mut nodes: Vec<NodeInfo>) -> Vec<NodeInfo> {
    if scope(caller).is_none() {
        return nodes;
    }
    for gpu in nodes.iter_mut().flat_map(|n| n.gpus.iter_mut()) {
        if gpu
            .allocated_to
            .is_some_and(|job| !sees_job(ledger, caller, job))
        {
            // Still counted as taken in the node's gpus_free.
            gpu.allocated_to = None;
        }
    }
    nodes
}

/// Whether `caller` may fetch chunk `id`: an admin always; a tenant only
/// when a manifest it owns (a `mesh:/` object or a checkpoint of one of its
/// jobs) names the chunk.
pub fn sees_chunk(ledger: &Ledger, caller: &Caller, id: &ChunkId) -> bool {
    if scope(caller).is_none() {
        return true;
    }
    manifests_seen(ledger, caller).any(|bytes| {
        Manifest::from_bytes(bytes)
            .map(|m| m.unique_chunks().iter().any(|c| c.id == *id))
            .unwrap_or(false)
    })
}

/// Every chunk a manifest `caller` sees names (for a tenant; an admin sees
/// every chunk without a list).
pub fn visible_chunks(ledger: &Ledger, caller: &Caller) -> std::collections::HashSet<ChunkId> {
    manifests_seen(ledger, caller)
        .filter_map(|bytes| Manifest::from_bytes(bytes).ok())
        .flat_map(|m| m.unique_chunks().into_iter().map(|c| c.id))
        .collect()
}

/// The manifests of the `mesh:/` objects and checkpoints `caller` sees.
fn manifests_seen<'a>(ledger: &'a Ledger, caller: &'a Caller) -> impl Iterator<Item = &'a Vec<u8>> {
    let objects = ledger
        .namespace
        .objects
        .values()
        .filter(|o| sees_tenant(ledger, caller, &o.tenant))
        .map(|o| &o.manifest);
    let checkpoints = ledger
        .workload
        .checkpoints
        .iter()
        .filter(|(job, _)| sees_job(ledger, caller, **job))
        .flat_map(|(_, steps)| steps.iter())
        .flat_map(|c| c.parts.values().map(|p| &p.manifest));
    objects.chain(checkpoints)
}
