//! `shoal bench cp`: `shoal cp --replica N` of a directory of `--size`
//! bytes into a four-node in-process mesh, for incompressible and
//! compressible data, a re-copy of unchanged data, and the baseline of N
//! plain local copies (fsynced) of the same files on the same disk.

use super::data::{timed_copies_with_fsync, write_files, DataSet};
use crate::agent::testkit::LocalCluster;
use crate::cli::cp::{cp, CpArgs};
use serde::Serialize;
use std::time::{Duration, Instant};

#[derive(Serialize, Debug)]
pub struct CpBenchRow {
    pub data: String,
    pub bytes: u64,
    pub replica: u32,
    pub copy_s: f64,
    pub recopy_unchanged_s: f64,
    pub baseline_cp_s: f64,
    pub ratio_vs_cp: f64,
}

pub async fn run(bytes: u64, replica: u32) -> anyhow::Result<Vec<CpBenchRow>> {
    if bytes == 0 || replica == 0 || replica > 4 {
        anyhow::bail!("--size must be positive and --replica 1-4");
    }
    let cluster = LocalCluster::start(4, |_, cfg| cfg.executor.enabled = false).await?;
    cluster
        .wait_all_alive(Duration::from_secs(30))
        .await
        .map_err(anyhow::Error::msg)?;
    let client = cluster.client(0);
    let mut rows = Vec::new();
    for (label, compressible) in [("incompressible", false), ("compressible", true)] {
        let src = cluster.root().join(format!("src-{label}"));
        write_files(
            &src,
            bytes,
            &DataSet {
                prefix: "part",
                seed: 0x2545_F491_4F6C_DD1D,
                compressible,
            },
        )?;
        let baseline = timed_copies_with_fsync(&src, &cluster.root().join("baseline"), replica)?;
        let args = |force| CpArgs {
            replica,
            recursive: true,
            force,
            allow_degraded: false,
            paths: vec![src.display().to_string(), format!("mesh:/bench/{label}")],
        };
        let started = Instant::now();
        cp(&client, &args(false), false).await?;
        let copy_s = started.elapsed().as_secs_f64();
        let started = Instant::now();
        cp(&client, &args(true), false).await?;
        let recopy = started.elapsed().as_secs_f64();
        rows.push(CpBenchRow {
            data: label.to_string(),
            bytes,
            replica,
            copy_s,
            recopy_unchanged_s: recopy,
            baseline_cp_s: baseline,
            ratio_vs_cp: copy_s / baseline.max(1e-9),
        });
        std::fs::remove_dir_all(&src)?;
    }
    cluster.shutdown().await;
    Ok(rows)
}

pub fn print(rows: &[CpBenchRow]) {
    println!(
        "{:<15} {:>10} {:>8} {:>10} {:>12} {:>14} {:>8}",
        "data", "MiB", "replica", "cp s", "re-copy s", "N × cp s", "ratio"
    );
    for r in rows {
        println!(
            "{:<15} {:>10.0} {:>8} {:>10.2} {:>12.2} {:>14.2} {:>8.2}",
            r.data,
            r.bytes as f64 / (1 << 20) as f64,
            r.replica,
            r.copy_s,
            r.recopy_unchanged_s,
            r.baseline_cp_s,
            r.ratio_vs_cp
        );
    }
}
