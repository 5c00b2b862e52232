//! This region's summary for its peers, computed from this node's replica
//! of the ledger (any node of a region answers for it, so a peer needs no
//! leader here) and its Vivaldi view. Pure but for what is passed in.

use shoal_consensus::ledger::Ledger;
use shoal_consensus::sched::Policy;
use shoal_consensus::workload::SchedSnapshot;
use shoal_sdk::{GpuModelCapacity, MemberState, RegionSummary, MAX_SUMMARY_NODES};
use std::collections::BTreeMap;

/// What the summary says besides the ledger's contents.
pub struct SummaryContext {
    pub ledger_index: u64,
    pub now_ms: u64,
    pub version: String,
    /// The Vivaldi coordinates (Euclidean part, height) of the members
    /// this node has one for.
    pub coordinates: Vec<(Vec<f64>, f64)>,
}

/// The region's summary: capacity by model (alive, undrained nodes; a
/// faulty GPU is neither total nor free), pending and running work, the
/// centroid of the coordinates, and its members' API URLs.
pub fn region_summary(ledger: &Ledger, ctx: &SummaryContext) -> RegionSummary {
    let snap = SchedSnapshot::new(ledger, ctx.now_ms, Policy::Fifo);
    let mut by_model: BTreeMap<String, GpuModelCapacity> = BTreeMap::new();
    for node in snap.input.nodes.iter().filter(|n| n.healthy) {
        let mut free_here: BTreeMap<&str, u32> = BTreeMap::new();
        for gpu in &node.gpus {
            let entry = by_model
                .entry(gpu.model.clone())
                .or_insert_with(|| GpuModelCapacity {
                    model: gpu.model.clone(),
                    total: 0,
                    free: 0,
                    free_per_node: Vec::new(),
                });
            entry.total += 1;
            if gpu.allocated_to.is_none() {
                entry.free += 1;
                *free_here.entry(gpu.model.as_str()).or_default() += 1;
            }
        }
        for (model, free) in free_here {
            if let Some(entry) = by_model.get_mut(model) {
                entry.free_per_node.push(free);
            }
        }
    }
    for entry in by_model.values_mut() {
        entry.free_per_node.sort_unstable_by(|a, b| b.cmp(a));
        entry.free_per_node.truncate(MAX_SUMMARY_NODES);
    }
    let (region, cluster_id) = ledger
        .cluster
        .as_ref()
        .map(|c| (c.region.clone(), c.cluster_id.clone()))
        .unwrap_or_default();
    RegionSummary {
        region,
        cluster_id,
        version: ctx.version.clone(),
        generated_at_ms: ctx.now_ms,
        ledger_index: ctx.ledger_index,
        gpus: by_model.into_values().collect(),
        pending_jobs: u32::try_from(snap.input.pending.len()).unwrap_or(u32::MAX),
        pending_gpus: snap
            .input
            .pending
            .iter()
            .map(|(p, _)| u64::from(p.gpus))
            .sum(),
        running_jobs: u32::try_from(snap.input.running.len()).unwrap_or(u32::MAX),
        centroid: centroid(&ctx.coordinates),
        api_urls: ledger
            .active_members()
            .filter(|m| m.state == MemberState::Alive)
            .map(|m| m.spec.api_url())
            .take(shoal_consensus::federation::MAX_PEER_URLS)
            .collect(),
        adopted: ledger
            .federation
            .foreign
            .keys()
            .flat_map(|origin| {
                ledger
                    .adoptions_from(origin)
                    .into_iter()
                    .map(|a| shoal_sdk::AdoptedJob {
                        origin: origin.clone(),
                        origin_job: a.origin_job,
                        job: a.job,
                    })
            })
            .collect(),
        copied_live: ledger.live_copied_jobs(),
        trusted_ca_pem: shoal_consensus::ca::join_pems(&ledger.trusted_ca_pems()),
        global_tenants: ledger.global_reports(),
    }
}

/// The mean of the coordinates (Euclidean part, then height), when there
/// are any of one dimensionality.
fn centroid(coords: &[(Vec<f64>, f64)]) -> Option<Vec<f64>> {
    let dim = coords.first()?.0.len();
    let same: Vec<_> = coords.iter().filter(|(v, _)| v.len() == dim).collect();
    let n = same.len() as f64;
    let mut out = vec![0.0; dim + 1];
    for (v, h) in &same {
        for (o, x) in out.iter_mut().zip(v.iter()) {
            *o += x / n;
        }
        out[dim] += h / n;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn centroid_is_the_mean_with_height_last() {
        let c = centroid(&[(vec![0.0, 2.0], 1.0), (vec![2.0, 0.0], 3.0)]).expect("centroid");
        assert_eq!(c, vec![1.0, 1.0, 2.0]);
        assert!(centroid(&[]).is_none());
    }

    #[test]
    fn an_empty_ledger_summarises_to_nothing() {
        let s = region_summary(
            &Ledger::new(),
            &SummaryContext {
                ledger_index: 3,
                now_ms: 5,
                version: "v".into(),
                coordinates: vec![],
            },
        );
        assert_eq!(s.gpus_total(), 0);
        assert_eq!(s.pending_jobs, 0);
        assert_eq!(s.ledger_index, 3);
    }
}
