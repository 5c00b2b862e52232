//! `shoal bench ...`: measurements that go into docs/BENCHMARKS.md. They run
//! real nodes in-process on loopback (QUIC, TLS, fsync), never mocks.

pub mod anomaly;
pub mod chaos;
pub mod ckpt;
pub mod cp;
pub mod data;
pub mod gossip;
pub mod place;
pub mod recovery;
pub mod scale;
pub mod submit;

use crate::agent::testkit::LocalCluster;
use clap::Subcommand;
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Subcommand, Debug)]
pub enum BenchCmd {
    /// Committed ledger writes/s and latency through the HTTP API of the leader
    Ledger {
        /// Cluster size
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Comma-separated numbers of concurrent clients
        #[arg(long, default_value = "1,16,64")]
        clients: String,
        /// How long each client count runs
        #[arg(long, default_value = "10s")]
        duration: String,
        /// Bytes per written value
        #[arg(long, default_value_t = 64)]
        value_bytes: usize,
    },
    /// Replicated checkpoint: chunking, quorum, 3 replicas, restore, vs 3 × cp
    Ckpt {
        /// e.g. 1GiB, 512MiB
        #[arg(long, default_value = "1GiB")]
        size: String,
    },
    /// kill -9 of a gang node → running again: detection, fencing wait, re-placement, restore, restart
    Recovery {
        /// Checkpoint size, split over the gang's two ranks, e.g. 1GiB, 64MiB
        #[arg(long, default_value = "1GiB")]
        ckpt_size: String,
        /// Repetitions, each on a fresh cluster
        #[arg(long, default_value_t = 3)]
        runs: usize,
    },
    /// shoal cp --replica N into a 4-node mesh vs N plain local copies
    Cp {
        #[arg(long, default_value = "1GiB")]
        size: String,
        #[arg(long, default_value_t = 3)]
        replica: u32,
    },
    /// Anomaly detection latency per kind over many injections, /metrics scrape cost, sampler CPU
    Anomaly {
        /// Injections per anomaly kind
        #[arg(long, default_value_t = 100)]
        injections: usize,
    },
    /// Capacity-advert propagation through gossip: p50/p99 to reach every node, bytes and CPU per node
    Gossip {
        #[arg(long, default_value_t = 50)]
        nodes: usize,
        /// Capacity changes published, one at a time from random nodes
        #[arg(long, default_value_t = 100)]
        publications: usize,
        /// Pause between publications, milliseconds
        #[arg(long, default_value_t = 100)]
        interval_ms: u64,
        /// Idle phase measured before publishing, seconds
        #[arg(long, default_value_t = 10)]
        idle_s: u64,
        /// Wait after the mesh forms, before measuring, seconds
        #[arg(long, default_value_t = 10)]
        settle_s: u64,
    },
    /// Seeded fault schedules against whole in-process clusters, judged by a history checker (docs/reliability.md)
    Chaos {
        /// Number of seeds to run, from --first-seed on
        #[arg(long, default_value_t = 1)]
        seeds: u64,
        #[arg(long, default_value_t = 1)]
        first_seed: u64,
        /// Replays exactly this one seed (overrides --seeds)
        #[arg(long)]
        seed: Option<u64>,
        /// Cluster size, 3-7
        #[arg(long, default_value_t = 3)]
        nodes: usize,
        /// Workload and fault phase of each seed
        #[arg(long, default_value = "60s")]
        duration: String,
        /// Comma-separated fault kinds, or `all`
        #[arg(long, default_value = "all")]
        kinds: String,
        /// Plants a bug the checker must catch: skip-plan-validation, ack-before-commit
        #[arg(long)]
        plant: Vec<String>,
        /// Lists every seed's faults, not only failing ones
        #[arg(long)]
        verbose: bool,
        /// Prints each seed's schedule without running it
        #[arg(long)]
        dry_run: bool,
    },
    /// What a user waits for: gang submit → placed → ranks started, and one-GPU jobs/s end to end
    Submit {
        /// 2 × 4-GPU gangs, submitted one at a time
        #[arg(long, default_value_t = 50)]
        gangs: usize,
        /// One-GPU jobs running `true`, from 16 concurrent clients (0 skips it)
        #[arg(long, default_value_t = 500)]
        jobs: usize,
    },
    /// Hollow nodes: join time, idle cost per node and on the leader, gangs, writes, down detection, false downs
    Scale {
        #[arg(long, default_value_t = 50)]
        nodes: usize,
        /// Wait once every node is alive everywhere, before measuring
        #[arg(long, default_value = "20s")]
        settle: String,
        /// How long the idle cost is measured
        #[arg(long, visible_alias = "duration", default_value = "20s")]
        idle: String,
        /// Gangs of 8 nodes × 8 GPUs, one at a time, each cancelled once placed
        #[arg(long, default_value_t = 20)]
        gangs: usize,
        /// Joins in flight at once
        #[arg(long, default_value_t = 8)]
        join_parallel: usize,
        /// Where the nodes' data directories go (default /dev/shm)
        #[arg(long)]
        data_dir: Option<std::path::PathBuf>,
        /// Keep every hollow node at the same CPU priority (by default the
        /// relayed members run at nice 10 once the region has formed, so
        /// the leader and replicas get the cores first, as on machines of
        /// their own)
        #[arg(long)]
        same_priority: bool,
    },
    /// Gang placement: pure decisions/s and p99, one full pass, and placements/s through Raft
    Place {
        #[arg(long, default_value_t = 4096)]
        nodes: u64,
        #[arg(long, default_value_t = 10_000)]
        jobs: usize,
        /// Three-node gangs for the end-to-end run on 3 voters, at most 512 (0 skips it)
        #[arg(long, default_value_t = 500)]
        e2e_gangs: usize,
    },
}

#[derive(Serialize, Debug)]
pub struct LedgerBenchRow {
    pub clients: usize,
    pub writes: u64,
    pub errors: u64,
    pub writes_per_s: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub max_ms: f64,
}

pub async fn run(cmd: &BenchCmd, json: bool) -> anyhow::Result<()> {
    match cmd {
        BenchCmd::Chaos {
            seeds,
            first_seed,
            seed,
            nodes,
            duration,
            kinds,
            plant,
            verbose,
            dry_run,
        } => {
            if !(3..=7).contains(nodes) {
                anyhow::bail!("--nodes must be 3-7");
            }
            if *seeds == 0 {
                anyhow::bail!("--seeds must be at least 1");
            }
            let duration =
                shoal_sdk::units::parse_duration(duration).map_err(anyhow::Error::msg)?;
            if duration < Duration::from_secs(5) {
                anyhow::bail!("--duration must be at least 5s");
            }
            let args = crate::cli::bench::chaos::ChaosArgs {
                seeds: match seed {
                    Some(s) => vec![*s],
                    None => (*first_seed..first_seed.saturating_add(*seeds)).collect(),
                },
                nodes: *nodes,
                duration,
                kinds: crate::cli::bench::chaos::parse_kinds(kinds).map_err(anyhow::Error::msg)?,
                planted: plant
                    .iter()
                    .map(|p| crate::cli::bench::chaos::parse_planted(p))
                    .collect::<Result<_, _>>()
                    .map_err(anyhow::Error::msg)?,
                verbose: *verbose,
            };
            if *dry_run {
                crate::cli::bench::chaos::print_schedules(&args, json)?;
                return Ok(());
            }
            let summary = crate::cli::bench::chaos::run_seeds(&args, json).await;
            if json {
                println!("{}", serde_json::to_string_pretty(&summary)?);
            } else {
                crate::cli::bench::chaos::print_summary(&summary);
            }
            if summary.passed < summary.seeds {
                anyhow::bail!(
                    "{} of {} seeds failed",
                    summary.seeds - summary.passed,
                    summary.seeds
                );
            }
            Ok(())
        }
        BenchCmd::Submit { gangs, jobs } => {
            let report = crate::cli::bench::submit::run(*gangs, *jobs).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                crate::cli::bench::submit::print(&report);
            }
            Ok(())
        }
        BenchCmd::Cp { size, replica } => {
            let bytes = shoal_sdk::units::parse_bytes(size).map_err(anyhow::Error::msg)?;
            let rows = crate::cli::bench::cp::run(bytes, *replica).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                crate::cli::bench::cp::print(&rows);
            }
            Ok(())
        }
        BenchCmd::Gossip {
            nodes,
            publications,
            interval_ms,
            idle_s,
            settle_s,
        } => {
            let args = crate::cli::bench::gossip::GossipBenchArgs {
                nodes: *nodes,
                publications: *publications,
                interval: Duration::from_millis(*interval_ms),
                idle: Duration::from_secs(*idle_s),
                settle: Duration::from_secs(*settle_s),
            };
            let report = crate::cli::bench::gossip::run(&args).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                crate::cli::bench::gossip::print(&report);
            }
            Ok(())
        }
        BenchCmd::Scale {
            nodes,
            settle,
            idle,
            gangs,
            join_parallel,
            data_dir,
            same_priority,
        } => {
            let args = crate::cli::bench::scale::ScaleArgs {
                nodes: *nodes,
                settle: shoal_sdk::units::parse_duration(settle).map_err(anyhow::Error::msg)?,
                idle: shoal_sdk::units::parse_duration(idle).map_err(anyhow::Error::msg)?,
                gangs: *gangs,
                join_parallel: *join_parallel,
                data_dir: data_dir.clone(),
                replicas_first: !same_priority,
            };
            let report = crate::cli::bench::scale::run(args).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                crate::cli::bench::scale::print(&report);
            }
            Ok(())
        }
        BenchCmd::Anomaly { injections } => {
            let report = crate::cli::bench::anomaly::run(*injections).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                crate::cli::bench::anomaly::print(&report);
            }
            Ok(())
        }
        BenchCmd::Recovery { ckpt_size, runs } => {
            let bytes = shoal_sdk::units::parse_bytes(ckpt_size).map_err(anyhow::Error::msg)?;
            let report = crate::cli::bench::recovery::run(bytes, *runs).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                crate::cli::bench::recovery::print(&report);
            }
            Ok(())
        }
        BenchCmd::Ckpt { size } => {
            let bytes = shoal_sdk::units::parse_bytes(size).map_err(anyhow::Error::msg)?;
            let report = crate::cli::bench::ckpt::run(bytes).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                crate::cli::bench::ckpt::print(&report);
            }
            Ok(())
        }
        BenchCmd::Place {
            nodes,
            jobs,
            e2e_gangs,
        } => {
            let report = crate::cli::bench::place::run(*nodes, *jobs, *e2e_gangs).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                crate::cli::bench::place::print(&report);
            }
            Ok(())
        }
        BenchCmd::Ledger {
            nodes,
            clients,
            duration,
            value_bytes,
        } => {
            let counts: Vec<usize> = clients
                .split(',')
                .map(|c| c.trim().parse::<usize>())
                .collect::<Result<_, _>>()
                .map_err(|_| {
                    anyhow::anyhow!(
                        "--clients must be a comma-separated list of numbers, e.g. 1,16,64"
                    )
                })?;
            if counts.is_empty() || counts.contains(&0) {
                anyhow::bail!("--clients must list positive numbers");
            }
            if *nodes == 0 || *nodes > 7 {
                anyhow::bail!("--nodes must be 1-7");
            }
            let d = shoal_sdk::units::parse_duration(duration).map_err(anyhow::Error::msg)?;
            let rows = bench_ledger(*nodes, &counts, d, *value_bytes).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&rows)?);
            } else {
                println!(
                    "ledger writes through the leader's HTTP API, {nodes} nodes on loopback, fsync on, {value_bytes}-byte values, {} per step",
                    duration
                );
                println!(
                    "{:>8} {:>10} {:>10} {:>9} {:>9} {:>9}",
                    "clients", "writes", "writes/s", "p50 ms", "p99 ms", "errors"
                );
                for r in &rows {
                    println!(
                        "{:>8} {:>10} {:>10.0} {:>9.2} {:>9.2} {:>9}",
                        r.clients, r.writes, r.writes_per_s, r.p50_ms, r.p99_ms, r.errors
                    );
                }
            }
            Ok(())
        }
    }
}

/// The nearest-rank percentile ([`shoal_sdk::stats::percentile`]); 0
/// without samples.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    shoal_sdk::stats::percentile(sorted, p).unwrap_or(0.0)
}

pub async fn bench_ledger(
    nodes: usize,
    counts: &[usize],
    step: Duration,
    value_bytes: usize,
) -> anyhow::Result<Vec<LedgerBenchRow>> {
    let cluster = LocalCluster::start(nodes, |_, _| {}).await?;
    // The voter count the cluster converges to, from the same policy the
    // leader applies.
    let want_voters = shoal_consensus::voters::target_voter_count(nodes, nodes).unwrap_or(1);
    cluster
        .wait_until(
            "all nodes to agree on a leader",
            Duration::from_secs(20),
            |c| {
                let ok = c.agreed_leader().is_some() && c.agents[0].voters().len() == want_voters;
                async move { ok }
            },
        )
        .await
        .map_err(anyhow::Error::msg)?;
    let leader_idx = cluster
        .agreed_leader()
        .and_then(|l| cluster.agents.iter().position(|a| a.id() == l.id()))
        .ok_or_else(|| anyhow::anyhow!("no leader"))?;
    let value = "v".repeat(value_bytes);
    let mut rows = Vec::new();
    for &clients in counts {
        let deadline = Instant::now() + step;
        let mut tasks = Vec::new();
        for c in 0..clients {
            let client = Arc::new(cluster.client(leader_idx));
            let value = value.clone();
            tasks.push(tokio::spawn(async move {
                let mut lat = Vec::new();
                let mut errors = 0u64;
                let mut i = 0u64;
                while Instant::now() < deadline {
                    let t = Instant::now();
                    match client
                        .put_attr(&format!("bench/{c}/{}", i % 1024), &value)
                        .await
                    {
                        Ok(_) => lat.push(t.elapsed().as_secs_f64() * 1000.0),
                        Err(_) => errors += 1,
                    }
                    i += 1;
                }
                (lat, errors)
            }));
        }
        let started = Instant::now();
        let mut all = Vec::new();
        let mut errors = 0;
        for t in tasks {
            let (lat, e) = t.await?;
            all.extend(lat);
            errors += e;
        }
        let elapsed = started.elapsed().as_secs_f64().max(step.as_secs_f64());
        all.sort_by(|a, b| a.total_cmp(b));
        rows.push(LedgerBenchRow {
            clients,
            writes: all.len() as u64,
            errors,
            writes_per_s: all.len() as f64 / elapsed,
            p50_ms: percentile(&all, 0.50),
            p99_ms: percentile(&all, 0.99),
            max_ms: all.last().copied().unwrap_or(0.0),
        });
    }
    cluster.shutdown().await;
    Ok(rows)
}
