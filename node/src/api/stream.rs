//! `GET /v1/stream`: server-sent events for the dashboard, so pages update
//! within a second without polling every endpoint. Each connection owns a
//! small feed that, every [`TICK`] (`dashboard.stream_tick_ms`), compares what the caller may see now
//! with what it last sent and queues the differences:
//!
//! - `hello` (first): `{"node","tenant","token_name"}`
//! - `jobs` (first, and after many changes): every visible job (`JobInfo`)
//! - `job`: one job that changed
//! - `nodes`: every node (`NodeInfo`, scoped), when their state, drain, GPUs
//!   or holders changed, and every 10 s
//! - `event`: one new entry of the event log, with its id as the SSE id,
//!   so a reconnecting browser resumes after it (`Last-Event-ID`)
//! - `telemetry`: GPU load, per-job utilization, coordinates ([`super::telemetry`],
//!   without the pairwise RTTs), every second
//! - `problem`: why the feed could not read the cluster this tick
//!
//! Memory stays bounded however long a page stays open: the feed computes
//! the next tick only once the previous one's queue has been written out,
//! so a slow client is simply sent less often (it gets the state, not the
//! history), and never makes the node buffer for it. Each node serves at
//! most [`MAX_STREAMS`] feeds at once; more are refused with 503.

use super::{ApiError, AppState};
use crate::api::scope;
use crate::api::telemetry;
use crate::trust::auth::Caller;
use crate::views;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::Extension;
use shoal_sdk::{ApiErrorBody, EventInfo, JobInfo, NodeInfo};
use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// How often a feed looks for changes by default
/// (`dashboard.stream_tick_ms`).
pub const TICK: Duration = Duration::from_millis(500);
/// Concurrent feeds per node.
pub const MAX_STREAMS: usize = 64;
/// Events sent at the start of a feed that does not say where to resume.
const BACKLOG_EVENTS: usize = 100;
/// Events sent per tick at most; a feed further behind skips ahead (and
/// says so in a `problem`), rather than queueing without bound.
const MAX_EVENTS_PER_TICK: usize = 200;
/// Changed jobs sent one by one per tick; more are sent as one `jobs`.
const MAX_JOB_UPDATES: usize = 50;
/// The nodes (from the leader) and telemetry are sent every this many
/// ticks: they change more slowly than jobs and make most of the bytes.
const NODES_EVERY: u64 = 2;
/// Nodes are sent again after this many ticks even when only their
/// `last_seen_ms` and `gpu_util` moved (which change all the time and
/// would otherwise make the nodes most of the stream's bytes).
const NODES_REFRESH: u64 = 20;
/// Slots of [`Feed::problems`].
const LEDGER: usize = 0;
const NODES: usize = 1;

/// The per-node cap on feeds, shared by every connection.
#[derive(Clone)]
pub struct StreamLimit(Arc<Semaphore>);

impl Default for StreamLimit {
    fn default() -> Self {
        StreamLimit(Arc::new(Semaphore::new(MAX_STREAMS)))
    }
}

#[derive(serde::Deserialize, Default)]
pub struct StreamQuery {
    /// Resume after this event id (as `Last-Event-ID` does).
    after: Option<u64>,
}

pub async fn stream(
    State(app): State<AppState>,
    Extension(caller): Extension<Caller>,
    Extension(limit): Extension<StreamLimit>,
    headers: HeaderMap,
    Query(q): Query<StreamQuery>,
) -> Result<Response, ApiError> {
    let permit = limit.0.clone().try_acquire_owned().map_err(|_| {
        ApiError(
            StatusCode::SERVICE_UNAVAILABLE,
            ApiErrorBody {
                code: "unavailable".into(),
                message: format!(
                    "node {} already serves {MAX_STREAMS} live streams; try another node",
                    app.name()
                ),
            },
        )
    })?;
    let resume = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .or(q.after);
    let feed = Feed {
        tick: Duration::from_millis(app.config().dashboard.stream_tick_ms.max(1)),
        shutdown: app.shutdown_signal(),
        app,
        caller,
        jobs: None,
        nodes: None,
        nodes_sent_at: 0,
        after: resume,
        ticks: 0,
        queue: VecDeque::new(),
        problems: [None, None],
        _permit: permit,
    };
    let events = futures::stream::unfold(feed, Feed::next);
    Ok(Sse::new(events)
        .keep_alive(KeepAlive::new().interval(Duration::from_secs(15)))
        .into_response())
}

struct Feed {
    app: AppState,
    tick: Duration,
    caller: Caller,
    /// What the client was last sent; `None` before the first tick.
    jobs: Option<BTreeMap<u64, JobInfo>>,
    /// The nodes last sent, without what changes all the time ([`shape_of`]).
    nodes: Option<Vec<NodeInfo>>,
    nodes_sent_at: u64,
    /// The last event id looked at (sent or not visible to the caller).
    after: Option<u64>,
    ticks: u64,
    queue: VecDeque<Event>,
    /// What went wrong reading the ledger, and the nodes, last time; the
    /// client is told when their sum changes.
    problems: [Option<String>; 2],
    shutdown: tokio::sync::watch::Receiver<bool>,
    _permit: OwnedSemaphorePermit,
}

/// A node without the fields that move on every heartbeat: a change of
/// anything else (state, drain, GPUs, their holders and health) is sent
/// at once.
fn shape_of(n: &NodeInfo) -> NodeInfo {
    NodeInfo {
        last_seen_ms: None,
        gpu_util: None,
        ..n.clone()
    }
}

fn json_event<T: serde::Serialize>(name: &str, v: &T) -> Option<Event> {
    Event::default().event(name).json_data(v).ok()
}

impl Feed {
    async fn next(mut self) -> Option<(Result<Event, Infallible>, Feed)> {
        loop {
            if let Some(ev) = self.queue.pop_front() {
                return Some((Ok(ev), self));
            }
            if *self.shutdown.borrow() {
                return None;
            }
            if self.ticks > 0 {
                tokio::select! {
                    _ = tokio::time::sleep(self.tick) => {}
                    // Ends the response, so the server's graceful shutdown
                    // does not wait on an open page.
                    _ = self.shutdown.changed() => return None,
                }
            }
            self.tick().await;
            self.ticks += 1;
        }
    }

    async fn tick(&mut self) {
        if self.ticks == 0 {
            let hello = serde_json::json!({
                "node": self.app.name(),
                "tenant": self.caller.tenant,
                "token_name": self.caller.name,
            });
            self.queue.extend(json_event("hello", &hello));
        }
        match self.read_ledger() {
            Ok((jobs, events)) => {
                self.diff_jobs(jobs);
                for e in &events {
                    let ev = json_event("event", e).map(|ev| ev.id(e.id.to_string()));
                    self.queue.extend(ev);
                }
                self.set_problem(LEDGER, None);
            }
            Err(e) => self.set_problem(LEDGER, Some(e)),
        }
        if self.ticks.is_multiple_of(NODES_EVERY) {
            let t = telemetry::collect(&self.app, &self.caller, false);
            self.queue.extend(json_event("telemetry", &t));
            match self.app.ledger().nodes().await {
                Ok(nodes) => {
                    let nodes = match self.app.ledger().read() {
                        Ok(d) => scope::nodes(&d.ledger, &self.caller, nodes),
                        Err(_) => return,
                    };
                    self.set_problem(NODES, None);
                    let shape: Vec<NodeInfo> = nodes.iter().map(shape_of).collect();
                    let stale = self.ticks >= self.nodes_sent_at + NODES_REFRESH;
                    if self.nodes.as_ref() != Some(&shape) || stale {
                        self.queue.extend(json_event("nodes", &nodes));
                        self.nodes = Some(shape);
                        self.nodes_sent_at = self.ticks;
                    }
                }
                Err(e) => self.set_problem(
                    NODES,
                    Some(format!(
                        "node {} cannot list the nodes: {}",
                        self.app.name(),
                        e.message
                    )),
                ),
            }
        }
    }

    fn set_problem(&mut self, slot: usize, problem: Option<String>) {
        let before = self.problem_text();
        self.problems[slot] = problem;
        let now = self.problem_text();
        if now != before {
            self.queue.extend(json_event(
                "problem",
                &serde_json::json!({ "message": now }),
            ));
        }
    }

    fn problem_text(&self) -> String {
        let all: Vec<&str> = self.problems.iter().flatten().map(String::as_str).collect();
        all.join("; ")
    }

    /// Visible jobs, and the visible events after `self.after` (which
    /// moves past the invisible ones too), from this node's own replica.
    fn read_ledger(&mut self) -> Result<(Vec<JobInfo>, Vec<EventInfo>), String> {
        let d = self.app.ledger().read().map_err(|e| e.message)?;
        let jobs = views::jobs(&d.ledger, None, None)?;
        let jobs = scope::jobs(&d.ledger, &self.caller, jobs);
        let all = views::events(&d.ledger, self.after.unwrap_or(0));
        let first = self.after.is_none();
        let mut skipped = false;
        let all: Vec<EventInfo> = if first && all.len() > BACKLOG_EVENTS {
            all[all.len() - BACKLOG_EVENTS..].to_vec()
        } else if all.len() > MAX_EVENTS_PER_TICK {
            skipped = true;
            all[all.len() - MAX_EVENTS_PER_TICK..].to_vec()
        } else {
            all
        };
        if let Some(last) = all.last() {
            self.after = Some(last.id);
        } else if first {
            self.after = Some(0);
        }
        let events = scope::events(&d.ledger, &self.caller, all);
        drop(d);
        if skipped {
            // Said once, not kept as a standing problem.
            let msg = "this page fell behind the event log; older events were skipped";
            self.queue.extend(json_event(
                "problem",
                &serde_json::json!({ "message": msg }),
            ));
        }
        Ok((jobs, events))
    }

    fn diff_jobs(&mut self, now: Vec<JobInfo>) {
        let now: BTreeMap<u64, JobInfo> = now.into_iter().map(|j| (j.id, j)).collect();
        let Some(before) = &self.jobs else {
            let all: Vec<&JobInfo> = now.values().collect();
            self.queue.extend(json_event("jobs", &all));
            self.jobs = Some(now);
            return;
        };
        let gone = before.keys().any(|id| !now.contains_key(id));
        let changed: Vec<&JobInfo> = now
            .values()
            .filter(|j| before.get(&j.id) != Some(*j))
            .collect();
        if gone || changed.len() > MAX_JOB_UPDATES {
            let all: Vec<&JobInfo> = now.values().collect();
            self.queue.extend(json_event("jobs", &all));
        } else {
            for j in changed {
                self.queue.extend(json_event("job", j));
            }
        }
        self.jobs = Some(now);
    }
}
