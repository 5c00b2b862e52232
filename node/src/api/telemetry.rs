//! `GET /v1/telemetry`: what the answering node knows about every member
//! beyond the ledger — GPU load and per-job utilization from the members'
//! capacity adverts (gossip), Vivaldi coordinates and estimated RTTs, and
//! its own GPUs' latest samples (temperature, power, memory). The dashboard
//! colours GPUs with it and plots proximity; `shoal top` shows ranks' GPU
//! utilization. Scoped like the rest: a tenant token sees only its own
//! jobs' utilization.

use crate::api::scope;
use crate::node::auth::Caller;
use crate::node::Node;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

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
    /// Per-GPU samples: the answering node's own GPUs only.
    #[serde(default)]
    pub gpus: Vec<GpuTelemetry>,
}

#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct GpuTelemetry {
    pub index: u32,
    pub util_pct: u32,
    pub temp_c: u32,
    pub power_w: f64,
    pub fb_used_mb: u64,
    pub fb_total_mb: u64,
}

/// The telemetry `caller` may see, from this node's own state (no leader
/// involved, so it answers during an election too). `pairwise` adds every
/// pair's RTT (small clusters only): the live stream leaves it out, as it
/// is most of the bytes and changes slowly.
pub fn collect(app: &Node, caller: &Caller, pairwise: bool) -> Telemetry {
    let me = app.id();
    let (members, owners, visible) = match app.ledger().read() {
        Ok(d) => {
            let members: Vec<(u64, String)> = d
                .ledger
                .active_members()
                .map(|m| (m.id, m.spec.name.clone()))
                .collect();
            let owners = crate::api::views::gpu_owners(&d.ledger);
            let jobs: std::collections::BTreeSet<u64> = d
                .ledger
                .workload
                .jobs
                .keys()
                .copied()
                .filter(|id| scope::sees_job(&d.ledger, caller, *id))
                .collect();
            (members, owners, jobs)
        }
        Err(_) => Default::default(),
    };
    let samples = app.gpus().latest();
    let own_util = crate::workers::anomaly::job_utilization(me, &samples, &owners);
    let names: BTreeMap<u64, String> = members.iter().cloned().collect();
    let Ok(view) = app.peers().lock() else {
        return Telemetry {
            node: app.name().to_string(),
            at_ms: crate::node::clock::wall_ms(),
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
                (
                    Some(crate::node::gpu::mean_load(&samples)),
                    own_util.clone(),
                )
            } else {
                (
                    advert.map(|a| a.load),
                    advert.map(|a| a.job_util.clone()).unwrap_or_default(),
                )
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
                gpus: if *id == me {
                    samples
                        .iter()
                        .map(|s| GpuTelemetry {
                            index: s.index,
                            util_pct: s.util_pct.min(100),
                            temp_c: s.temp_c,
                            power_w: s.power_w,
                            fb_used_mb: s.fb_used_mb,
                            fb_total_mb: s.fb_used_mb + s.fb_free_mb,
                        })
                        .collect()
                } else {
                    Vec::new()
                },
            }
        })
        .collect();
    Telemetry {
        node: app.name().to_string(),
        at_ms: crate::node::clock::wall_ms(),
        nodes,
    }
}

pub async fn get(
    axum::extract::State(app): axum::extract::State<std::sync::Arc<Node>>,
    axum::Extension(caller): axum::Extension<Caller>,
) -> axum::Json<Telemetry> {
    axum::Json(collect(&app, &caller, true))
}
