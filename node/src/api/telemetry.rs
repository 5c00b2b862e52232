//! `GET /v1/telemetry`: what the answering node knows about every member
//! beyond the ledger — GPU load and per-job utilization from the members'
//! capacity adverts (gossip), Vivaldi coordinates and estimated RTTs, and
//! every member's GPUs' latest samples (temperature, power, memory). The
//! dashboard colours GPUs with it and shows the samples on hover; `shoal
//! top` shows them per GPU and ranks' utilization. Scoped like the rest: a
//! tenant token sees only its own jobs' utilization and names.
//!
//! The other members' samples come through the [`Relay`]: the answering
//! node asks each member for its own samples over the node-to-node link
//! ([`crate::rpc::proto::Request::GpuTelemetry`]), waits at most
//! `dashboard.relay_timeout_ms`, and keeps the answers
//! `dashboard.relay_max_age_ms`, so however many pages and `shoal top`s are
//! open each member is asked at most once per period. Reading never waits
//! for the members: a page gets what the relay holds, and a member that has
//! not answered shows as "no data" (`gpus_problem`). The relayed samples
//! carry no job: which job holds a GPU is read from this node's ledger and
//! scoped to the caller here.

use crate::api::scope;
use crate::node::auth::Caller;
use crate::node::{LedgerClient, Node};
use crate::rpc::proto::{Request, Response};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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

/// One GPU's latest sample. It also travels between nodes (bincode, in
/// [`Response::GpuTelemetry`]): no field may be skipped when serialized.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct GpuTelemetry {
    pub index: u32,
    pub util_pct: u32,
    pub temp_c: u32,
    pub power_w: f64,
    pub fb_used_mb: u64,
    pub fb_total_mb: u64,
    /// Active clock throttle reasons, e.g. `HW_THERMAL_SLOWDOWN`.
    #[serde(default)]
    pub throttle: Vec<String>,
    /// The job holding the GPU and its name, when the caller may see it;
    /// filled by the answering node from its ledger, never relayed.
    #[serde(default)]
    pub job: Option<u64>,
    #[serde(default)]
    pub job_name: Option<String>,
}

/// This node's own GPUs as they travel and are shown (no job yet).
pub fn own_gpus(samples: &[crate::node::gpu::GpuSample]) -> Vec<GpuTelemetry> {
    samples
        .iter()
        .map(|s| GpuTelemetry {
            index: s.index,
            util_pct: s.util_pct.min(100),
            temp_c: s.temp_c,
            power_w: s.power_w,
            fb_used_mb: s.fb_used_mb,
            fb_total_mb: s.fb_used_mb + s.fb_free_mb,
            throttle: s.throttle.clone(),
            job: None,
            job_name: None,
        })
        .collect()
}

/// Relayed samples are shown this long after the member last answered
/// (with their age), then the member's GPUs show as "no data".
const RELAY_KEEP_PERIODS: u32 = 3;
/// Members asked at once during one refresh.
const RELAY_CONCURRENCY: usize = 32;

/// The other members' GPU samples as this node last fetched them, shared
/// by every page, stream and `shoal top` it serves.
#[derive(Clone, Default)]
pub struct Relay(Arc<Mutex<RelayState>>);

#[derive(Default)]
struct RelayState {
    members: BTreeMap<u64, Relayed>,
    /// When the last refresh started, and whether one is running.
    asked_at: Option<Instant>,
    in_flight: bool,
}

#[derive(Clone, Default)]
struct Relayed {
    gpus: Vec<GpuTelemetry>,
    /// When the member last answered.
    at: Option<Instant>,
    problem: Option<String>,
}

/// One member's relayed samples, as shown.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct RelayedGpus {
    pub gpus: Vec<GpuTelemetry>,
    pub age_ms: Option<u64>,
    pub problem: Option<String>,
}

/// What the relay asks with: how long to wait and how long answers last.
#[derive(Clone, Copy, Debug)]
pub struct RelayTiming {
    pub timeout: Duration,
    pub max_age: Duration,
}

impl RelayTiming {
    pub fn of(app: &Node) -> Self {
        let d = &app.config().dashboard;
        RelayTiming {
            timeout: Duration::from_millis(d.relay_timeout_ms.max(1)),
            max_age: Duration::from_millis(d.relay_max_age_ms.max(1)),
        }
    }
}

impl Relay {
    fn lock(&self) -> std::sync::MutexGuard<'_, RelayState> {
        // The state is a cache: after a panic elsewhere it is still usable.
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Marks a refresh as started when one is due (the answers are older
    /// than `max_age` and none is running); the caller then runs it.
    fn due(&self, now: Instant, timing: RelayTiming) -> bool {
        let mut s = self.lock();
        let stale = s
            .asked_at
            .is_none_or(|at| now.saturating_duration_since(at) >= timing.max_age);
        if stale && !s.in_flight {
            s.in_flight = true;
            s.asked_at = Some(now);
            true
        } else {
            false
        }
    }

    /// Whether the relay has never been refreshed.
    fn never_asked(&self) -> bool {
        let s = self.lock();
        s.asked_at.is_none() && !s.in_flight
    }

    /// What the relay holds for `members` (the answering node excluded
    /// by the caller), as of `now`.
    pub fn view(
        &self,
        members: &[u64],
        now: Instant,
        timing: RelayTiming,
    ) -> BTreeMap<u64, RelayedGpus> {
        let keep = timing.max_age.max(timing.timeout) * RELAY_KEEP_PERIODS;
        let s = self.lock();
        members
            .iter()
            .map(|id| {
                let r = s.members.get(id).cloned().unwrap_or_default();
                let age = r.at.map(|at| now.saturating_duration_since(at));
                let shown =
                    match age {
                        Some(age) if age <= keep => RelayedGpus {
                            gpus: r.gpus,
                            age_ms: Some(age.as_millis() as u64),
                            problem: r.problem,
                        },
                        _ => RelayedGpus {
                            gpus: Vec::new(),
                            age_ms: None,
                            problem: Some(r.problem.unwrap_or_else(|| {
                                "no data yet: the node was not asked yet".into()
                            })),
                        },
                    };
                (*id, shown)
            })
            .collect()
    }

    /// Records one refresh's answers (and forgets members no longer asked).
    fn record(&self, answers: Vec<(u64, Result<Vec<GpuTelemetry>, String>)>, now: Instant) {
        let mut s = self.lock();
        let asked: std::collections::BTreeSet<u64> = answers.iter().map(|(id, _)| *id).collect();
        s.members.retain(|id, _| asked.contains(id));
        for (id, answer) in answers {
            let entry = s.members.entry(id).or_default();
            match answer {
                Ok(gpus) => {
                    *entry = Relayed {
                        gpus,
                        at: Some(now),
                        problem: None,
                    }
                }
                // The last samples stay (and age) until they are too old.
                Err(why) => entry.problem = Some(why),
            }
        }
        s.in_flight = false;
    }

    /// Asks every one of `members` for its samples, each bounded by the
    /// timeout, and records the answers.
    async fn refresh(self, ledger: LedgerClient, members: Vec<u64>, timing: RelayTiming) {
        let answers = futures::stream::iter(members)
            .map(|id| {
                let ledger = ledger.clone();
                async move {
                    let answer = match tokio::time::timeout(
                        timing.timeout,
                        ledger.call_member(id, &Request::GpuTelemetry),
                    )
                    .await
                    {
                        Ok(Ok(Response::GpuTelemetry(gpus))) => Ok(gpus),
                        Ok(Ok(_)) => Err(
                            "no data: the node answered something else (an older version?)".into(),
                        ),
                        Ok(Err(e)) => Err(format!("no data: {}", e.message)),
                        Err(_) => Err(format!(
                            "no data: no answer within {} ms",
                            timing.timeout.as_millis()
                        )),
                    };
                    (id, answer)
                }
            })
            .buffer_unordered(RELAY_CONCURRENCY)
            .collect::<Vec<_>>()
            .await;
        self.record(answers, Instant::now());
    }
}

/// Starts a refresh of the relay in the background when one is due;
/// never waits for it.
fn refresh_soon(app: &Node, members: &[u64]) {
    let timing = RelayTiming::of(app);
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
            let owners = crate::api::views::gpu_owners(&d.ledger);
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
    let mut relayed = app
        .gpu_relay()
        .view(&remote_ids, Instant::now(), RelayTiming::of(app));
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
        at_ms: crate::node::clock::wall_ms(),
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
        let timing = RelayTiming::of(&app);
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

    const TIMING: RelayTiming = RelayTiming {
        timeout: Duration::from_millis(1000),
        max_age: Duration::from_millis(2000),
    };

    fn gpu(index: u32, temp_c: u32) -> GpuTelemetry {
        GpuTelemetry {
            index,
            temp_c,
            ..Default::default()
        }
    }

    #[test]
    fn one_refresh_per_period_however_many_readers() {
        let relay = Relay::default();
        let t0 = Instant::now();
        assert!(relay.never_asked());
        assert!(relay.due(t0, TIMING));
        // Every other reader, while it runs and until the answers age.
        for _ in 0..100 {
            assert!(!relay.due(t0, TIMING));
        }
        relay.record(vec![(2, Ok(vec![gpu(0, 60)]))], t0);
        assert!(!relay.due(t0 + Duration::from_millis(1999), TIMING));
        assert!(relay.due(t0 + TIMING.max_age, TIMING));
        assert!(!relay.never_asked());
    }

    #[test]
    fn a_member_that_does_not_answer_is_no_data_and_old_samples_age_out() {
        let relay = Relay::default();
        let t0 = Instant::now();
        let before = relay.view(&[2, 3], t0, TIMING);
        assert!(before[&2].gpus.is_empty());
        assert!(before[&2]
            .problem
            .as_deref()
            .is_some_and(|p| p.contains("no data")));

        relay.due(t0, TIMING);
        relay.record(
            vec![
                (2, Ok(vec![gpu(0, 60), gpu(1, 61)])),
                (3, Err("no data: no answer within 1000 ms".into())),
            ],
            t0,
        );
        let v = relay.view(&[2, 3], t0 + Duration::from_millis(300), TIMING);
        assert_eq!(v[&2].gpus.len(), 2);
        assert_eq!(v[&2].age_ms, Some(300));
        assert_eq!(v[&2].problem, None);
        assert!(v[&3].gpus.is_empty());
        assert_eq!(v[&3].age_ms, None);
        assert_eq!(
            v[&3].problem.as_deref(),
            Some("no data: no answer within 1000 ms")
        );

        // n2 stops answering: its last samples are shown, with their age
        // and why, for a few periods, then no data.
        let t1 = t0 + TIMING.max_age;
        relay.due(t1, TIMING);
        relay.record(
            vec![
                (2, Err("no data: node 2: refused".into())),
                (3, Err("x".into())),
            ],
            t1,
        );
        let v = relay.view(&[2], t1, TIMING);
        assert_eq!(v[&2].gpus.len(), 2);
        assert_eq!(v[&2].age_ms, Some(2000));
        assert!(v[&2].problem.is_some());
        let v = relay.view(&[2], t0 + TIMING.max_age * (RELAY_KEEP_PERIODS + 1), TIMING);
        assert!(v[&2].gpus.is_empty());
        assert_eq!(v[&2].problem.as_deref(), Some("no data: node 2: refused"));
    }

    #[test]
    fn a_member_that_left_is_forgotten() {
        let relay = Relay::default();
        let t0 = Instant::now();
        relay.record(
            vec![(2, Ok(vec![gpu(0, 60)])), (3, Ok(vec![gpu(0, 50)]))],
            t0,
        );
        relay.record(vec![(2, Ok(vec![gpu(0, 61)]))], t0);
        let v = relay.view(&[3], t0, TIMING);
        assert!(v[&3].gpus.is_empty());
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
