//! Seeded synthetic traces with a Philly-like shape, for speed tests and
//! property tests: mostly 1-GPU jobs with a tail of 2–32 GPU gangs,
//! log-uniform run times from a minute to a day, Poisson arrivals, and
//! tenants of Zipf-skewed popularity.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::trace::{TraceJob, ESTIMATED_LIMIT_FACTOR};

/// (GPUs, weight): roughly Philly's mix.
const GPU_MIX: [(u32, u32); 6] = [(1, 800), (2, 50), (4, 70), (8, 60), (16, 15), (32, 5)];
const MIN_RUN_S: f64 = 60.0;
const MAX_RUN_S: f64 = 86_400.0;
const TENANTS: usize = 8;

/// `n_jobs` jobs arriving at a rate that keeps a 1,000-node × 8-GPU cluster
/// about 85% busy on average.
pub fn synthetic_trace(n_jobs: usize, seed: u64) -> Vec<TraceJob> {
    synthetic_trace_for(n_jobs, seed, 8_000, 0.85)
}

/// `n_jobs` jobs whose average GPU demand is `load` × `cluster_gpus`.
pub fn synthetic_trace_for(
    n_jobs: usize,
    seed: u64,
    cluster_gpus: u64,
    load: f64,
) -> Vec<TraceJob> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let total_weight: u32 = GPU_MIX.iter().map(|(_, w)| w).sum();
    let mean_gpus: f64 = GPU_MIX
        .iter()
        .map(|&(g, w)| f64::from(g) * f64::from(w))
        .sum::<f64>()
        / f64::from(total_weight);
    let mean_run_s = (MAX_RUN_S - MIN_RUN_S) / (MAX_RUN_S / MIN_RUN_S).ln();
    let arrivals_per_s = (load.max(1e-6) * cluster_gpus.max(1) as f64) / (mean_gpus * mean_run_s);
    let tenant_weights: Vec<f64> = (1..=TENANTS).map(|rank| 1.0 / rank as f64).collect();
    let tenant_total: f64 = tenant_weights.iter().sum();
    let mut clock = 0.0f64;
    (0..n_jobs)
        .map(|index| {
            let gap: f64 = -(1.0 - rng.random::<f64>()).ln() / arrivals_per_s;
            clock += gap;
            let mut pick = rng.random_range(0..total_weight);
            let gpus = GPU_MIX
                .iter()
                .find(|&&(_, weight)| {
                    let hit = pick < weight;
                    pick = pick.saturating_sub(weight);
                    hit
                })
                .map_or(1, |&(g, _)| g);
            let run_s = (MIN_RUN_S.ln() + rng.random::<f64>() * (MAX_RUN_S / MIN_RUN_S).ln()).exp();
            let mut tenant_pick = rng.random::<f64>() * tenant_total;
            let tenant = tenant_weights
                .iter()
                .position(|&w| {
                    let hit = tenant_pick < w;
                    tenant_pick -= w;
                    hit
                })
                .unwrap_or(TENANTS - 1);
            let duration_s = (run_s.round() as u64).max(1);
            TraceJob {
                id: index as u64,
                tenant: format!("tenant-{tenant}"),
                submit_s: clock.round() as u64,
                gpus,
                duration_s,
                time_limit_s: duration_s * ESTIMATED_LIMIT_FACTOR,
                shape: None,
                status: None,
            }
        })
        .collect()
}
