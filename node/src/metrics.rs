//! The node's Prometheus registry. One per node (no globals), so that many
//! nodes can run in one test process. Gauges that mirror Raft and ledger
//! state are refreshed at scrape time; counters and histograms are updated
//! where the events happen.

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::time::Duration;

type Labels = Vec<(String, String)>;

pub struct Metrics {
    registry: Registry,
    pub raft_term: Gauge,
    pub raft_is_leader: Gauge,
    pub raft_commit_index: Gauge,
    pub raft_last_log_index: Gauge,
    pub raft_voters: Gauge,
    pub members: Family<Labels, Gauge>,
    pub proposal_seconds: Histogram,
    pub api_requests: Family<Labels, Counter>,
    pub sched_pass_seconds: Histogram,
    pub placements: Counter,
    pub jobs: Family<Labels, Gauge>,
    pub rank_exits: Family<Labels, Counter>,
}

impl Metrics {
    pub fn new(node_id: u64, name: &str) -> Self {
        let mut registry = Registry::with_prefix("shoal");
        let info: Family<Labels, Gauge> = Family::default();
        info.get_or_create(&vec![
            ("node".into(), node_id.to_string()),
            ("name".into(), name.to_string()),
        ])
        .set(1);
        registry.register(
            "node_info",
            "Constant 1, labelled with this node's id and name",
            info,
        );
        let m = Metrics {
            raft_term: Gauge::default(),
            raft_is_leader: Gauge::default(),
            raft_commit_index: Gauge::default(),
            raft_last_log_index: Gauge::default(),
            raft_voters: Gauge::default(),
            members: Family::default(),
            proposal_seconds: Histogram::new(exponential_buckets(0.0005, 2.0, 14)),
            api_requests: Family::default(),
            sched_pass_seconds: Histogram::new(exponential_buckets(0.00005, 2.0, 16)),
            placements: Counter::default(),
            jobs: Family::default(),
            rank_exits: Family::default(),
            registry: Registry::default(),
        };
        registry.register("raft_term", "Current Raft term", m.raft_term.clone());
        registry.register(
            "raft_is_leader",
            "1 when this node is the Raft leader",
            m.raft_is_leader.clone(),
        );
        registry.register(
            "raft_commit_index",
            "Last log index applied to the ledger",
            m.raft_commit_index.clone(),
        );
        registry.register(
            "raft_last_log_index",
            "Last log index in this node's log",
            m.raft_last_log_index.clone(),
        );
        registry.register(
            "raft_voters",
            "Number of voting members",
            m.raft_voters.clone(),
        );
        registry.register(
            "members",
            "Cluster members by state, as the ledger records them",
            m.members.clone(),
        );
        registry.register(
            "raft_proposal_seconds",
            "Time from proposing a ledger write on the leader to its commit",
            m.proposal_seconds.clone(),
        );
        registry.register(
            "api_requests",
            "HTTP API requests by route and status code",
            m.api_requests.clone(),
        );
        registry.register(
            "scheduler_pass_seconds",
            "Time the leader spends planning one scheduling pass (not committing it)",
            m.sched_pass_seconds.clone(),
        );
        registry.register(
            "scheduler_placements",
            "Gang placements committed by this node as leader",
            m.placements.clone(),
        );
        registry.register("jobs", "Jobs in the ledger by state", m.jobs.clone());
        registry.register(
            "job_rank_exits",
            "Job ranks this node ran that exited, by outcome",
            m.rank_exits.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn observe_proposal(&self, d: Duration) {
        self.proposal_seconds.observe(d.as_secs_f64());
    }

    pub fn observe_sched_pass(&self, d: Duration) {
        self.sched_pass_seconds.observe(d.as_secs_f64());
    }

    pub fn count_placements(&self, n: u64) {
        self.placements.inc_by(n);
    }

    pub fn count_rank_exit(&self, outcome: &str) {
        self.rank_exits
            .get_or_create(&vec![("outcome".into(), outcome.to_string())])
            .inc();
    }

    pub fn count_request(&self, route: &str, code: u16) {
        self.api_requests
            .get_or_create(&vec![
                ("route".into(), route.to_string()),
                ("code".into(), code.to_string()),
            ])
            .inc();
    }

    pub fn render(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
