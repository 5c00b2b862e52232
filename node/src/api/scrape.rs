//! Brings the gauges that mirror state (Raft, ledger, GPU samples) up to
//! date right before `/metrics` is encoded; counters and histograms are
//! updated where their events happen.

use crate::node::Node;
use openraft::ServerState;
use shoal_sdk::MemberState;
use std::collections::BTreeMap;

type Labels = Vec<(String, String)>;

pub fn refresh(node: &Node) {
    refresh_process(&node.metrics().process);
    refresh_peer_view(node);
    let rpc = node.ledger().rpc_traffic();
    for (direction, total) in [("in", rpc.bytes_in), ("out", rpc.bytes_out)] {
        let counter = node
            .metrics()
            .rpc_bytes
            .get_or_create(&vec![("direction".into(), direction.into())]);
        counter.inc_by(total.saturating_sub(counter.get()));
    }
    let m = node.ledger().raft_metrics().borrow().clone();
    let mm = node.metrics();
    mm.raft_term.set(m.current_term as i64);
    mm.raft_is_leader
        .set(i64::from(m.state == ServerState::Leader));
    mm.raft_commit_index
        .set(m.last_applied.map(|l| l.index as i64).unwrap_or(0));
    mm.raft_last_log_index
        .set(m.last_log_index.map(|i| i as i64).unwrap_or(0));
    mm.raft_voters
        .set(m.membership_config.membership().voter_ids().count() as i64);
    let Ok(d) = node.ledger().read() else {
        return;
    };
    let ledger = &d.ledger;
    for state in [
        MemberState::Alive,
        MemberState::Suspect,
        MemberState::Down,
        MemberState::Left,
    ] {
        let n = ledger.members.values().filter(|m| m.state == state).count();
        mm.members
            .get_or_create(&vec![("state".into(), state.as_str().into())])
            .set(n as i64);
    }
    let workload = &ledger.workload;
    mm.jobs.clear();
    for job in workload.jobs.values() {
        mm.jobs
            .get_or_create(&vec![("state".into(), job.state.as_str().into())])
            .inc();
    }
    // Tenant names only where the operator asked for them: /metrics is open.
    let tenant_labels = node.config().metrics.tenant_labels;
    mm.jobs_pending.clear();
    for job in workload.jobs.values().filter(|j| j.state.is_waiting()) {
        let mut labels: Labels = vec![("reason".into(), reason_class(&job.reason).into())];
        if tenant_labels {
            labels.insert(0, ("tenant".into(), job.spec.tenant.clone()));
        }
        mm.jobs_pending.get_or_create(&labels).inc();
    }
    let owners = super::views::gpu_owners(ledger);
    let alive_gpus: usize = ledger
        .active_members()
        .filter(|m| m.state == MemberState::Alive)
        .map(|m| m.spec.gpus.len())
        .sum();
    let allocated = owners.len() as i64;
    mm.gpus
        .get_or_create(&vec![("state".into(), "allocated".into())])
        .set(allocated);
    mm.gpus
        .get_or_create(&vec![("state".into(), "free".into())])
        .set((alive_gpus as i64 - allocated).max(0));
    let held = workload.gpus_in_use();
    let now = ledger.clock_ms.max(crate::clock::wall_ms());
    mm.tenant_gpus.clear();
    mm.tenant_gpu_hours.clear();
    mm.tenant_gpu_hours_limit.clear();
    for tenant in workload.tenants.values().filter(|_| tenant_labels) {
        let labels: Labels = vec![("tenant".into(), tenant.name.clone())];
        mm.tenant_gpus.get_or_create(&labels).set(i64::from(
            held.get(tenant.name.as_str()).copied().unwrap_or(0),
        ));
        mm.tenant_gpu_hours
            .get_or_create(&labels)
            .set(workload.used_gpu_ms(&tenant.name, now) as f64 / 1000.0);
        if let Some(limit) = tenant.limits.gpu_seconds_limit {
            mm.tenant_gpu_hours_limit
                .get_or_create(&labels)
                .set(limit as f64);
        }
    }
    let alive: Vec<u64> = ledger
        .active_members()
        .filter(|m| m.state == MemberState::Alive)
        .map(|m| m.id)
        .collect();
    let wanted = (crate::ckpt::REPLICAS + 1).min(alive.len());
    let under = workload
        .checkpoints
        .values()
        .flatten()
        .filter(|c| c.committed_at_ms.is_some())
        .flat_map(|c| c.parts.values())
        .filter(|p| p.holders.iter().filter(|h| alive.contains(h)).count() < wanted)
        .count();
    mm.ckpt_under_replicated.set(under as i64);

    // The DCGM series of this node's own GPUs, with the job holding each.
    let inventory: BTreeMap<u32, shoal_sdk::GpuInfo> = node
        .local()
        .spec
        .gpus
        .iter()
        .map(|g| (g.index, g.clone()))
        .collect();
    let samples = node.gpus().latest();
    mm.dcgm.update(&samples, |index| {
        let info = inventory.get(&index);
        vec![
            ("gpu".into(), index.to_string()),
            (
                "UUID".into(),
                info.map(|g| g.uuid.clone()).unwrap_or_default(),
            ),
            ("device".into(), format!("nvidia{index}")),
            (
                "modelName".into(),
                info.map(|g| g.model.clone()).unwrap_or_default(),
            ),
            ("Hostname".into(), node.name().to_string()),
            (
                "shoal_job".into(),
                owners
                    .get(&(node.id(), index))
                    .map(u64::to_string)
                    .unwrap_or_default(),
            ),
        ]
    });
}

/// The scheduler's reasons are sentences for people ("quota: tenant a is at
/// 16 of 16 GPUs"); a label needs a small fixed set, which their prefix gives.
fn reason_class(reason: &str) -> &'static str {
    const CLASSES: [&str; 5] = ["quota", "budget", "fifo", "backfill", "invalid"];
    let prefix = reason.split(':').next().unwrap_or_default();
    CLASSES
        .into_iter()
        .find(|c| *c == prefix)
        .unwrap_or("resources")
}

fn refresh_process(p: &crate::metrics::ProcessSeries) {
    if let Some(stat) = crate::procstat::read_self() {
        let seen = p.cpu_seconds.get();
        if stat.cpu_seconds > seen {
            p.cpu_seconds.inc_by(stat.cpu_seconds - seen);
        }
        p.resident_memory_bytes
            .set(i64::try_from(stat.resident_bytes).unwrap_or(i64::MAX));
        p.virtual_memory_bytes
            .set(i64::try_from(stat.virtual_bytes).unwrap_or(i64::MAX));
        p.threads
            .set(i64::try_from(stat.threads).unwrap_or(i64::MAX));
        if let Some(boot) = crate::procstat::boot_time_s() {
            p.start_time_seconds
                .set(boot as f64 + stat.started_after_boot_s);
        }
    }
    if let Some(n) = crate::procstat::open_fds() {
        p.open_fds.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
    if let Some(n) = crate::procstat::max_fds() {
        p.max_fds.set(i64::try_from(n).unwrap_or(i64::MAX));
    }
}

/// Liveness as this node knows it (its failure detector where it leads,
/// the ledger elsewhere: `peers`), labelled with member names.
fn refresh_peer_view(node: &Node) {
    let mm = node.metrics();
    let committed: Vec<MemberState> = node
        .ledger()
        .read()
        .map(|d| {
            d.ledger
                .active_members()
                .filter(|m| m.id != node.id())
                .map(|m| m.state)
                .collect()
        })
        .unwrap_or_default();
    let Ok(view) = node.peers().lock() else {
        return;
    };
    let now = std::time::Instant::now();
    let mut by_state: BTreeMap<&str, i64> =
        BTreeMap::from([("alive", 0), ("suspect", 0), ("down", 0)]);
    if !view.judging() {
        for state in committed {
            if let Some(n) = by_state.get_mut(state.as_str()) {
                *n += 1;
            }
        }
    }
    mm.fd_phi.clear();
    for (peer, state) in view.detector.peers() {
        let state = match state {
            shoal_mesh::failure_detector::PeerState::Alive => "alive",
            shoal_mesh::failure_detector::PeerState::Suspect => "suspect",
            shoal_mesh::failure_detector::PeerState::Down => "down",
        };
        *by_state.entry(state).or_default() += 1;
        if let Some(phi) = view.detector.phi(peer, now) {
            let name = node
                .ledger()
                .name_of(*peer)
                .unwrap_or_else(|| peer.to_string());
            // +Inf is valid OpenMetrics, but a capped value graphs better.
            mm.fd_phi
                .get_or_create(&vec![("peer".into(), name)])
                .set(phi.min(1e6));
        }
    }
    for (state, n) in by_state {
        mm.fd_peers
            .get_or_create(&vec![("state".into(), state.into())])
            .set(n);
    }
    mm.fd_local_health
        .set(i64::from(view.detector.local_health()));
    let heard = view
        .last_heard
        .values()
        .filter(|t| {
            now.duration_since(**t) <= 2 * crate::peers::refresh_period(view.last_heard.len() + 1)
        })
        .count();
    mm.gossip_peers_heard.set(heard as i64);
}

#[cfg(test)]
mod tests {
    #[test]
    fn pending_reasons_fall_into_a_few_classes() {
        assert_eq!(
            super::reason_class("quota: tenant a is at 16 of 16 GPUs"),
            "quota"
        );
        assert_eq!(super::reason_class("fifo: waiting behind job 3"), "fifo");
        assert_eq!(
            super::reason_class("no 4 nodes with 8 free H100"),
            "resources"
        );
        assert_eq!(super::reason_class(""), "resources");
    }
}
