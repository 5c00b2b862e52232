//! `GET /v1/telemetry`: what the answering node knows about every member
//! beyond the ledger — GPU load and per-job utilization from the members'
//! capacity adverts (gossip), Vivaldi coordinates and estimated RTTs, and
//! every member's GPUs' latest samples (temperature, power, memory). The
//! dashboard colours GPUs with it and shows the samples on hover; `shoal
//! top` shows them per GPU and ranks' utilization. Scoped like the rest: a
//! tenant token sees only its own jobs' utilization and names.
//!
//! The other members' samples come through the [`crate::gpu_relay::Relay`]: the answering
//! node asks each member for its own samples over the node-to-node link
//! ([`crate::proto::Request::GpuTelemetry`]), waits at most
//! `dashboard.relay_timeout_ms`, and keeps the answers
//! `dashboard.relay_max_age_ms`, so however many pages and `shoal top`s are
//! open each member is asked at most once per period. Reading never waits
//! for the members: a page gets what the relay holds, and a member that has
//! not answered shows as "no data" (`gpus_problem`). The relayed samples
//! carry no job: which job holds a GPU is read from this node's ledger and
//! scoped to the caller here.

use crate::api::scope;
use crate::gpu_relay::{own_gpus, RelayTiming};
use crate::node::Node;
pub use crate::proto::GpuTelemetry;
use crate::trust::auth::Caller;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Instant;

/// Pairwise RTTs are included up to this many members (N² numbers).
pub const PAIRWISE_RTT_MAX_NODES: usize = 64;

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct Telemetry {
    /// The answering node's name.
    pub node: String,
    pub at_ms: u64,
    pub nodes: Vec<NodeTelemetry>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct NodeTelemetry {
    pub id: u64,
    pub name: String,
    /// Mean GPU utilization, 0-1, from the latest advert (or own samples).
    pub load: Option<f32>,
    /// Mean utilization (percent) of the GPUs each visible job holds here.
    pub job_util: BTreeMap<u64, f32>,
    /// Vivaldi position in milliseconds, and its height and error.
    pub coord_ms: Option<Vec<f64>>,
    pub height_ms: Option<f64>,
    pub coord_error: Option<f64>,
    /// Estimated RTT from the answering node.
    pub rtt_ms: Option<f64>,
    /// Estimated RTT to each other member by name (small clusters only:
    /// [`PAIRWISE_RTT_MAX_NODES`]).
    #[serde(default)]
    pub rtt_to_ms: BTreeMap<String, f64>,
    /// Per-GPU samples: the answering node's own, and the other members'
    /// through the relay. Empty, with `gpus_problem` set, for a member
    /// whose samples the answering node does not have.
    #[serde(default)]
    pub gpus: Vec<GpuTelemetry>,
    /// How old `gpus` are (ms): 0 for the answering node's own, the time
    /// since the member answered for the others; `None` without samples.
    #[serde(default)]
    pub gpus_age_ms: Option<u64>,
    /// Why `gpus` is empty or old: the member did not answer in time,
    /// refused, or has not been asked yet.
    #[serde(default)]
    pub gpus_problem: Option<String>,
}

/// Starts a refresh of the relay in the background when one is due;
/// never waits for it.
fn refresh_soon(app: &Node, members: &[u64]) {
    let timing = RelayTiming::of(&app.config().dashboard);
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let relay = app.gpu_relay().clone();
    if relay.due(Instant::now(), timing) {
        rt.spawn(relay.refresh(app.ledger().clone(), members.to_vec(), timing));
    }
}

/// The other active members, as the relay asks them.
fn others(app: &Node) -> Vec<u64> {
    match app.ledger().read() {
        Ok(d) => d
            .ledger
            .active_members()
            .map(|m| m.id)
            .filter(|id| *id != app.id())
            .collect(),
        Err(_) => Vec::new(),
    }
}

/// The telemetry `caller` may see, from this node's own state (no leader
/// involved, so it answers during an election too). `pairwise` adds every
/// pair's RTT (small clusters only): the live stream leaves it out, as it
/// is most of the bytes and changes slowly.
pub fn collect(app: &Node, caller: &Caller, pairwise: bool) -> Telemetry {
    let me = app.id();
    let (members, owners, visible, job_names) = match app.ledger().read() {
        Ok(d) => {
            let members: Vec<(u64, String)> = d
                .ledger
                .active_members()
                .map(|m| (m.id, m.spec.name.clone()))
                .collect();
            let owners = crate::views::gpu_owners(&d.ledger);
            let jobs: BTreeMap<u64, String> = d
                .ledger
                .workload
                .jobs
                .iter()
                .filter(|(id, _)| scope::sees_job(&d.ledger, caller, **id))
                .map(|(id, job)| (*id, job.spec.name.clone()))
                .collect();
            let visible: std::collections::BTreeSet<u64> = jobs.keys().copied().collect();
            (members, owners, visible, jobs)
        }
        Err(_) => Default::default(),
    };
    let samples = app.gpus().latest();
    let remote_ids: Vec<u64> = members
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| *id != me)
        .collect();
    refresh_soon(app, &remote_ids);
    let mut relayed = app.gpu_relay().view(
        &remote_ids,
        Instant::now(),
        RelayTiming::of(&app.config().dashboard),
    );
    let own_util = crate::anomaly::job_utilization(me, &samples, &owners);
    let names: BTreeMap<u64, String> = members.iter().cloned().collect();
    let Ok(view) = app.peers().lock() else {
        return Telemetry {
            node: app.name().to_string(),
            at_ms: crate::clock::wall_ms(),
            nodes: Vec::new(),
        };
    };
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1000.0;
    let pairwise = pairwise && members.len() <= PAIRWISE_RTT_MAX_NODES;
    let nodes = members
        .iter()
        .map(|(id, name)| {
            let advert = view.capacity.get(*id);
            let (load, util) = if *id == me {
                (Some(crate::gpu::mean_load(&samples)), own_util.clone())
            } else {
                (
                    advert.map(|a| a.load),
                    advert.map(|a| a.job_util.clone()).unwrap_or_default(),
                )
            };
            let (gpus, gpus_age_ms, gpus_problem) = if *id == me {
                (own_gpus(&samples), Some(0), None)
            } else {
                let r = relayed.remove(id).unwrap_or_default();
                (r.gpus, r.age_ms, r.problem)
            };
            let coord = view.coordinate_of(*id, me);
            let rtt_to_ms = if pairwise {
                members
                    .iter()
                    .filter(|(other, _)| other != id)
                    .filter_map(|(other, _)| {
                        let rtt = view.estimated_rtt(*id, *other, me)?;
                        Some((names.get(other)?.clone(), ms(rtt)))
                    })
                    .collect()
            } else {
                BTreeMap::new()
            };
            NodeTelemetry {
                id: *id,
                name: name.clone(),
                load,
                job_util: util
                    .into_iter()
                    .filter(|(job, _)| visible.contains(job))
                    .collect(),
                coord_ms: coord
                    .as_ref()
                    .map(|c| c.vec.iter().map(|v| v * 1000.0).collect()),
                height_ms: coord.as_ref().map(|c| c.height * 1000.0),
                coord_error: coord.as_ref().map(|c| c.error),
                rtt_ms: if *id == me {
                    Some(0.0)
                } else {
                    view.estimated_rtt(me, *id, me).map(ms)
                },
                rtt_to_ms,
                gpus: with_jobs(*id, gpus, &owners, &visible, &job_names),
                gpus_age_ms,
                gpus_problem,
            }
        })
        .collect();
    Telemetry {
        node: app.name().to_string(),
        at_ms: crate::clock::wall_ms(),
        nodes,
    }
}

/// Each GPU's job (and name) as `node`'s holder in this node's ledger,
/// when the caller may see it.
fn with_jobs(
    node: u64,
    mut gpus: Vec<GpuTelemetry>,
    owners: &BTreeMap<(u64, u32), u64>,
    visible: &std::collections::BTreeSet<u64>,
    names: &BTreeMap<u64, String>,
) -> Vec<GpuTelemetry> {
    for g in &mut gpus {
        let job = owners
            .get(&(node, g.index))
            .copied()
            .filter(|j| visible.contains(j));
        g.job = job;
        g.job_name = job.and_then(|j| names.get(&j).cloned());
    }
    gpus
}

pub async fn get(
    axum::extract::State(app): axum::extract::State<Arc<Node>>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> axum::Json<Telemetry> {
    // The first read on a node waits for one round of the relay (bounded
    // by its timeout), so a one-off `curl` or `shoal top`'s first frame
    // shows every member; later reads never wait.
    if app.gpu_relay().never_asked() {
        let timing = RelayTiming::of(&app.config().dashboard);
        let relay = app.gpu_relay().clone();
        if relay.due(Instant::now(), timing) {
            relay
                .refresh(app.ledger().clone(), others(&app), timing)
                .await;
        }
    }
    axum::Json(collect(&app, &caller, true))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu(index: u32, temp_c: u32) -> GpuTelemetry {
        GpuTelemetry {
            index,
            temp_c,
            ..Default::default()
        }
    }

    #[test]
    fn jobs_are_named_only_when_the_caller_sees_them() {
        let owners = BTreeMap::from([((2, 0), 7), ((2, 1), 8)]);
        let visible = std::collections::BTreeSet::from([7]);
        let names = BTreeMap::from([(7, "mine".to_string())]);
        let gpus = with_jobs(
            2,
            vec![gpu(0, 60), gpu(1, 61), gpu(2, 40)],
            &owners,
            &visible,
            &names,
        );
        assert_eq!(gpus[0].job, Some(7));
        assert_eq!(gpus[0].job_name.as_deref(), Some("mine"));
        // Another tenant's job: neither its id nor its name.
        assert_eq!(gpus[1].job, None);
        assert_eq!(gpus[1].job_name, None);
        assert_eq!(gpus[2].job, None);
    }
}
