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
type FloatGauge = Gauge<f64, std::sync::atomic::AtomicU64>;
type FloatCounter = Counter<f64, std::sync::atomic::AtomicU64>;

/// The conventional `process_*` series (as the Go and Python clients export
/// them), without a prefix so standard dashboards find them.
pub struct ProcessSeries {
    registry: Registry,
    pub cpu_seconds: FloatCounter,
    pub resident_memory_bytes: Gauge,
    pub virtual_memory_bytes: Gauge,
    pub open_fds: Gauge,
    pub max_fds: Gauge,
    pub start_time_seconds: FloatGauge,
    pub threads: Gauge,
}

impl ProcessSeries {
    fn new() -> Self {
        let mut registry = Registry::default();
        let p = ProcessSeries {
            registry: Registry::default(),
            cpu_seconds: FloatCounter::default(),
            resident_memory_bytes: Gauge::default(),
            virtual_memory_bytes: Gauge::default(),
            open_fds: Gauge::default(),
            max_fds: Gauge::default(),
            start_time_seconds: FloatGauge::default(),
            threads: Gauge::default(),
        };
        registry.register(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds",
            p.cpu_seconds.clone(),
        );
        registry.register(
            "process_resident_memory_bytes",
            "Resident memory size in bytes",
            p.resident_memory_bytes.clone(),
        );
        registry.register(
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes",
            p.virtual_memory_bytes.clone(),
        );
        registry.register(
            "process_open_fds",
            "Number of open file descriptors",
            p.open_fds.clone(),
        );
        registry.register(
            "process_max_fds",
            "Maximum number of open file descriptors",
            p.max_fds.clone(),
        );
        registry.register(
            "process_start_time_seconds",
            "Start time of the process since the Unix epoch in seconds",
            p.start_time_seconds.clone(),
        );
        registry.register(
            "process_threads",
            "Number of OS threads in the process",
            p.threads.clone(),
        );
        ProcessSeries { registry, ..p }
    }
}

/// dcgm-exporter's series names, so existing GPU dashboards work unchanged.
/// Registered without the `shoal_` prefix, in a registry of their own.
pub struct DcgmSeries {
    registry: Registry,
    pub gpu_util: Family<Labels, Gauge>,
    pub fb_used: Family<Labels, Gauge>,
    pub fb_free: Family<Labels, Gauge>,
    pub gpu_temp: Family<Labels, Gauge>,
    pub power_usage: Family<Labels, FloatGauge>,
    pub ecc_sbe: Family<Labels, Gauge>,
    pub ecc_dbe: Family<Labels, Gauge>,
    pub xid: Family<Labels, Gauge>,
    pub throttle: Family<Labels, Gauge>,
}

impl DcgmSeries {
    fn new() -> Self {
        let mut registry = Registry::default();
        let d = DcgmSeries {
            registry: Registry::default(),
            gpu_util: Family::default(),
            fb_used: Family::default(),
            fb_free: Family::default(),
            gpu_temp: Family::default(),
            power_usage: Family::default(),
            ecc_sbe: Family::default(),
            ecc_dbe: Family::default(),
            xid: Family::default(),
            throttle: Family::default(),
        };
        registry.register(
            "DCGM_FI_DEV_GPU_UTIL",
            "GPU utilization (in %)",
            d.gpu_util.clone(),
        );
        registry.register(
            "DCGM_FI_DEV_FB_USED",
            "Framebuffer memory used (in MiB)",
            d.fb_used.clone(),
        );
        registry.register(
            "DCGM_FI_DEV_FB_FREE",
            "Framebuffer memory free (in MiB)",
            d.fb_free.clone(),
        );
        registry.register(
            "DCGM_FI_DEV_GPU_TEMP",
            "GPU temperature (in C)",
            d.gpu_temp.clone(),
        );
        registry.register(
            "DCGM_FI_DEV_POWER_USAGE",
            "Power draw (in W)",
            d.power_usage.clone(),
        );
        registry.register(
            "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
            "Total number of single-bit volatile ECC errors",
            d.ecc_sbe.clone(),
        );
        registry.register(
            "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
            "Total number of double-bit volatile ECC errors",
            d.ecc_dbe.clone(),
        );
        registry.register(
            "DCGM_FI_DEV_XID_ERRORS",
            "Value of the last XID error encountered",
            d.xid.clone(),
        );
        registry.register(
            "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS",
            "Number of active clock throttle reasons",
            d.throttle.clone(),
        );
        DcgmSeries { registry, ..d }
    }

    /// Replaces every series with the latest samples. `labels_of` gives the
    /// identifying labels of a GPU index (gpu, UUID, device, modelName,
    /// Hostname, shoal_job).
    pub fn update(&self, samples: &[crate::gpu::GpuSample], labels_of: impl Fn(u32) -> Labels) {
        for family in [
            &self.gpu_util,
            &self.fb_used,
            &self.fb_free,
            &self.gpu_temp,
            &self.ecc_sbe,
            &self.ecc_dbe,
            &self.xid,
            &self.throttle,
        ] {
            family.clear();
        }
        self.power_usage.clear();
        for s in samples {
            let labels = labels_of(s.index);
            let as_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
            self.gpu_util
                .get_or_create(&labels)
                .set(i64::from(s.util_pct));
            self.fb_used
                .get_or_create(&labels)
                .set(as_i64(s.fb_used_mb));
            self.fb_free
                .get_or_create(&labels)
                .set(as_i64(s.fb_free_mb));
            self.gpu_temp
                .get_or_create(&labels)
                .set(i64::from(s.temp_c));
            self.power_usage.get_or_create(&labels).set(s.power_w);
            self.ecc_sbe
                .get_or_create(&labels)
                .set(as_i64(s.ecc_sbe_total));
            self.ecc_dbe
                .get_or_create(&labels)
                .set(as_i64(s.ecc_dbe_total));
            self.xid.get_or_create(&labels).set(as_i64(s.last_xid));
            self.throttle
                .get_or_create(&labels)
                .set(s.throttle.len() as i64);
        }
    }
}

fn api_latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

pub struct Metrics {
    registry: Registry,
    pub raft_term: Gauge,
    pub raft_is_leader: Gauge,
    pub raft_commit_index: Gauge,
    pub raft_last_log_index: Gauge,
    pub raft_voters: Gauge,
    pub members: Family<Labels, Gauge>,
    pub proposal_seconds: Histogram,
    pub log_append_seconds: Histogram,
    pub api_requests: Family<Labels, Counter>,
    pub sched_pass_seconds: Histogram,
    pub placements: Counter,
    pub jobs: Family<Labels, Gauge>,
    pub jobs_pending: Family<Labels, Gauge>,
    pub rank_exits: Family<Labels, Counter>,
    pub gpus: Family<Labels, Gauge>,
    pub tenant_gpus: Family<Labels, Gauge>,
    pub tenant_gpu_hours: Family<Labels, FloatGauge>,
    pub tenant_gpu_hours_limit: Family<Labels, FloatGauge>,
    pub ckpt_under_replicated: Gauge,
    pub gossip_messages: Family<Labels, Counter>,
    pub gossip_rejected: Counter,
    pub gossip_advert_delay: Histogram,
    pub gossip_bytes: Family<Labels, Counter>,
    pub rpc_bytes: Family<Labels, Counter>,
    pub rpc_requests: Family<Labels, Counter>,
    pub lease_renewals: Family<Labels, Counter>,
    pub gossip_peers_heard: Gauge,
    pub fd_peers: Family<Labels, Gauge>,
    pub fd_transitions: Family<Labels, Counter>,
    pub fd_phi: Family<Labels, FloatGauge>,
    pub fd_local_health: Gauge,
    pub anomaly_events: Family<Labels, Counter>,
    pub gpu_sample_rounds: Counter,
    pub api_request_seconds: Family<Labels, Histogram, fn() -> Histogram>,
    pub ckpt_parts: Family<Labels, Counter>,
    pub ckpt_bytes: Counter,
    pub ckpt_part_seconds: Histogram,
    pub chunks_collected: Counter,
    pub dcgm: DcgmSeries,
    pub process: ProcessSeries,
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
            log_append_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 14)),
            api_requests: Family::default(),
            sched_pass_seconds: Histogram::new(exponential_buckets(0.00005, 2.0, 16)),
            placements: Counter::default(),
            jobs: Family::default(),
            jobs_pending: Family::default(),
            rank_exits: Family::default(),
            gpus: Family::default(),
            tenant_gpus: Family::default(),
            tenant_gpu_hours: Family::default(),
            tenant_gpu_hours_limit: Family::default(),
            ckpt_under_replicated: Gauge::default(),
            gossip_messages: Family::default(),
            gossip_rejected: Counter::default(),
            gossip_advert_delay: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            gossip_bytes: Family::default(),
            rpc_bytes: Family::default(),
            rpc_requests: Family::default(),
            lease_renewals: Family::default(),
            gossip_peers_heard: Gauge::default(),
            fd_peers: Family::default(),
            fd_transitions: Family::default(),
            fd_phi: Family::default(),
            fd_local_health: Gauge::default(),
            anomaly_events: Family::default(),
            gpu_sample_rounds: Counter::default(),
            api_request_seconds: Family::new_with_constructor(api_latency_histogram),
            ckpt_parts: Family::default(),
            ckpt_bytes: Counter::default(),
            ckpt_part_seconds: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            chunks_collected: Counter::default(),
            dcgm: DcgmSeries::new(),
            process: ProcessSeries::new(),
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
            "raft_log_append_seconds",
            "Time to write one batch of Raft log entries durably (transaction and fsync)",
            m.log_append_seconds.clone(),
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
            "jobs_pending",
            "Pending jobs by tenant and class of reason (quota, budget, fifo, backfill, invalid, resources)",
            m.jobs_pending.clone(),
        );
        registry.register(
            "job_rank_exits",
            "Job ranks this node ran that exited, by outcome",
            m.rank_exits.clone(),
        );
        registry.register(
            "gpus",
            "GPUs of the cluster's alive members by state (allocated or free)",
            m.gpus.clone(),
        );
        registry.register(
            "tenant_gpus_in_use",
            "GPUs held by each tenant's own jobs",
            m.tenant_gpus.clone(),
        );
        registry.register(
            "tenant_gpu_seconds_used",
            "GPU-seconds consumed by each tenant's own jobs, net of refunds",
            m.tenant_gpu_hours.clone(),
        );
        registry.register(
            "tenant_gpu_seconds_limit",
            "GPU-second budget of each tenant that has one",
            m.tenant_gpu_hours_limit.clone(),
        );
        registry.register(
            "checkpoint_parts_under_replicated",
            "Committed checkpoint parts with fewer live holders than written",
            m.ckpt_under_replicated.clone(),
        );
        registry.register(
            "gossip_messages_received",
            "Gossip messages accepted from members, by topic",
            m.gossip_messages.clone(),
        );
        registry.register(
            "gossip_messages_rejected",
            "Gossip messages rejected in validation (non-members, malformed)",
            m.gossip_rejected.clone(),
        );
        registry.register(
            "gossip_advert_delay_seconds",
            "Time from a member publishing a capacity advert to this node receiving it (sender's clock)",
            m.gossip_advert_delay.clone(),
        );
        registry.register(
            "gossip_bytes",
            "Bytes of gossip traffic, by direction",
            m.gossip_bytes.clone(),
        );
        registry.register(
            "rpc_bytes",
            "Bytes through this node's member RPC socket (QUIC: Raft, routed writes, chunks), by direction",
            m.rpc_bytes.clone(),
        );
        registry.register(
            "rpc_requests",
            "Member RPC requests this node served, by request",
            m.rpc_requests.clone(),
        );
        registry.register(
            "lease_renewals",
            "This node's lease renewals that succeeded, by the way they went: straight to the leader, or through the replica it follows the log from",
            m.lease_renewals.clone(),
        );
        registry.register(
            "gossip_peers_heard",
            "Members this node heard from within the last second",
            m.gossip_peers_heard.clone(),
        );
        registry.register(
            "fd_peers",
            "Members by state in this node's own failure detector",
            m.fd_peers.clone(),
        );
        registry.register(
            "fd_transitions",
            "State changes in this node's failure detector, by new state",
            m.fd_transitions.clone(),
        );
        registry.register(
            "fd_phi",
            "Suspicion level (phi) of each member in this node's failure detector",
            m.fd_phi.clone(),
        );
        registry.register(
            "fd_local_health",
            "Lifeguard local health score (0 = healthy; timeouts stretch by 1 + score)",
            m.fd_local_health.clone(),
        );
        registry.register(
            "anomaly_events",
            "Anomalies this node detected and proposed to the event log, by kind",
            m.anomaly_events.clone(),
        );
        registry.register(
            "gpu_sample_rounds",
            "Rounds of GPU samples this node took; the anomaly detectors judge each one",
            m.gpu_sample_rounds.clone(),
        );
        registry.register(
            "api_request_seconds",
            "HTTP API request latency by route",
            m.api_request_seconds.clone(),
        );
        registry.register(
            "checkpoint_parts",
            "Checkpoint parts of this node's ranks, by outcome (recorded, rejected, failed)",
            m.ckpt_parts.clone(),
        );
        registry.register(
            "checkpoint_bytes",
            "Bytes of checkpoint parts this node's ranks wrote and had recorded",
            m.ckpt_bytes.clone(),
        );
        registry.register(
            "checkpoint_part_seconds",
            "From a rank's checkpoint step being done to its part being replicated and recorded",
            m.ckpt_part_seconds.clone(),
        );
        registry.register(
            "chunks_collected",
            "Chunks this node deleted because nothing references them any more",
            m.chunks_collected.clone(),
        );
        Metrics { registry, ..m }
    }

    pub fn count_checkpoint_part(&self, outcome: &str) {
        self.ckpt_parts
            .get_or_create(&vec![("outcome".into(), outcome.to_string())])
            .inc();
    }

    pub fn count_rpc_request(&self, request: &'static str) {
        self.rpc_requests
            .get_or_create(&vec![("request".into(), request.into())])
            .inc();
    }

    pub fn count_lease_renewal(&self, via: &str) {
        self.lease_renewals
            .get_or_create(&vec![("via".into(), via.to_string())])
            .inc();
    }

    pub fn observe_proposal(&self, d: Duration) {
        self.proposal_seconds.observe(d.as_secs_f64());
    }

    pub fn observe_log_append(&self, d: Duration) {
        self.log_append_seconds.observe(d.as_secs_f64());
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

    pub fn observe_request(&self, route: &str, d: Duration) {
        self.api_request_seconds
            .get_or_create(&vec![("route".into(), route.to_string())])
            .observe(d.as_secs_f64());
    }

    pub fn count_request(&self, route: &str, code: u16) {
        self.api_requests
            .get_or_create(&vec![
                ("route".into(), route.to_string()),
                ("code".into(), code.to_string()),
            ])
            .inc();
    }

    /// OpenMetrics text: the DCGM series, the process series, then Shoal's
    /// own, with one `# EOF`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for registry in [&self.dcgm.registry, &self.process.registry, &self.registry] {
            let mut text = String::new();
            if encode(&mut text, registry).is_err() {
                continue;
            }
            out.push_str(text.strip_suffix("# EOF\n").unwrap_or(&text));
        }
        out.push_str("# EOF\n");
        out
    }
}
