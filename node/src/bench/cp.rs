//! `shoal bench cp`: `shoal cp --replica N` of a directory of `--size`
//! bytes into a four-node in-process mesh, for incompressible and
//! compressible data, a re-copy of unchanged data, and the baseline of N
//! plain local copies (fsynced) of the same files on the same disk.

use crate::agent::testkit::LocalCluster;
use crate::cli::cp::{cp, CpArgs};
use serde::Serialize;
use std::io::Write;
use std::path::Path;
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

const FILE_BYTES: u64 = 256 << 20;

fn write_files(dir: &Path, bytes: u64, compressible: bool) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut state: u64 = 0x2545_F491_4F6C_DD1D;
    let mut left = bytes;
    let mut index = 0;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let size = left.min(FILE_BYTES);
        let mut file = std::fs::File::create(dir.join(format!("part-{index:03}.bin")))?;
        let mut written = 0;
        while written < size {
            for (i, word) in buf.chunks_exact_mut(8).enumerate() {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                // Compressible data: mostly a repeating pattern (like logs or
                // sparse tensors), one random word in eight.
                let value = if compressible && i % 8 != 0 {
                    (i as u64) & 0xff
                } else {
                    state
                };
                word.copy_from_slice(&value.to_le_bytes());
            }
            let n = (size - written).min(buf.len() as u64) as usize;
            file.write_all(&buf[..n])?;
            written += n as u64;
        }
        file.sync_all()?;
        left -= size;
        index += 1;
    }
    Ok(())
}

fn copies_with_fsync(from: &Path, to: &Path, n: u32) -> anyhow::Result<f64> {
    let started = Instant::now();
    for i in 0..n {
        let dest = to.join(format!("copy-{i}"));
        std::fs::create_dir_all(&dest)?;
        for entry in std::fs::read_dir(from)? {
            let entry = entry?;
            let target = dest.join(entry.file_name());
            std::fs::copy(entry.path(), &target)?;
            std::fs::File::open(&target)?.sync_all()?;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    std::fs::remove_dir_all(to)?;
    Ok(seconds)
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
        write_files(&src, bytes, compressible)?;
        let baseline = copies_with_fsync(&src, &cluster.root().join("baseline"), replica)?;
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
