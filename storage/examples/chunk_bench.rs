//! Throughput of build_manifest / restore_manifest against a plain `std::fs::copy`.
//!
//! ```text
//! cargo run --release -j 1 --example chunk_bench            # 1 GiB per data set
//! cargo run --release -j 1 --example chunk_bench -- 256     # 256 MiB per data set
//! ```
//!
//! Writes one file of incompressible (random) data and one of compressible data
//! (text-like lines with repetition) into a temp dir on the working directory's disk
//! (override with `SHOAL_BENCH_DIR`), then times, per data set:
//! * `fs::copy` of the file (the floor: read + write, no hashing),
//! * `build_manifest` into a fresh store (hash + zstd probe/compress + write chunk files),
//! * `build_manifest` again (all dedup hits: read + hash only),
//! * `restore_manifest` (read chunk files + decompress + verify hash + write).
//!
//! Both fsync-on (production) and fsync-off store configurations are reported.

use std::fs;
use std::io::{BufWriter, Write};
use std::path::Path;
use std::time::Instant;

use shoal_storage::{
    build_manifest_with, restore_manifest_with, BuildOptions, ChunkStore, RestoreOptions,
    StoreConfig,
};

type BenchResult<T> = Result<T, Box<dyn std::error::Error>>;

fn write_random(path: &Path, bytes: u64) -> BenchResult<()> {
    let mut out = BufWriter::with_capacity(1 << 20, fs::File::create(path)?);
    let mut state: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut block = vec![0u8; 1 << 20];
    for _ in 0..bytes / block.len() as u64 {
        for word in block.chunks_exact_mut(8) {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            word.copy_from_slice(&state.to_le_bytes());
        }
        out.write_all(&block)?;
    }
    out.flush()?;
    out.get_ref().sync_all()?;
    Ok(())
}

fn write_compressible(path: &Path, bytes: u64) -> BenchResult<()> {
    let mut out = BufWriter::with_capacity(1 << 20, fs::File::create(path)?);
    let mut written = 0u64;
    let mut line = 0u64;
    while written < bytes {
        let text = format!(
            "step={line} loss={:.6} lr=3.0e-4 grad_norm={:.4} tokens_per_s={}\n",
            1.0 / (1.0 + line as f64 * 1e-4),
            (line % 977) as f64 / 313.0,
            40_000 + (line * 7919) % 5_000
        );
        let take = text.len().min((bytes - written) as usize);
        out.write_all(&text.as_bytes()[..take])?;
        written += take as u64;
        line += 1;
    }
    out.flush()?;
    out.get_ref().sync_all()?;
    Ok(())
}

fn mb_per_s(bytes: u64, seconds: f64) -> f64 {
    bytes as f64 / 1e6 / seconds
}

fn drop_store_dir(path: &Path) -> BenchResult<()> {
    if path.exists() {
        fs::remove_dir_all(path)?;
    }
    Ok(())
}

fn bench(label: &str, work: &Path, bytes: u64, fsync: bool) -> BenchResult<()> {
    let source_dir = work.join(format!("src-{label}"));
    let file = source_dir.join("data.bin");

    let copy_target = work.join(format!("copy-{label}.bin"));
    let start = Instant::now();
    fs::copy(&file, &copy_target)?;
    if fsync {
        fs::File::open(&copy_target)?.sync_all()?;
    }
    let copy_s = start.elapsed().as_secs_f64();
    fs::remove_file(&copy_target)?;

    let store_dir = work.join(format!("store-{label}"));
    drop_store_dir(&store_dir)?;
    let store = ChunkStore::open(
        &store_dir,
        StoreConfig {
            capacity_bytes: None,
            fsync,
        },
    )?;
    let options = BuildOptions::default();
    let start = Instant::now();
    let (manifest, stats) = build_manifest_with(&source_dir, &store, &options)?;
    let build_s = start.elapsed().as_secs_f64();

    let start = Instant::now();
    let (_, again) = build_manifest_with(&source_dir, &store, &options)?;
    let rebuild_s = start.elapsed().as_secs_f64();
    assert_eq!(again.chunks_new, 0);

    let dest = work.join(format!("restore-{label}"));
    drop_store_dir(&dest)?;
    let start = Instant::now();
    restore_manifest_with(&manifest, &store, &dest, &RestoreOptions { fsync })?;
    let restore_s = start.elapsed().as_secs_f64();
    fs::remove_dir_all(&dest)?;

    let compressed_chunks = manifest.files[0]
        .chunks
        .iter()
        .filter(|chunk| chunk.stored_len < chunk.plain_len)
        .count();
    println!(
        "{label:<14} fsync={fsync:<5} size={} MiB stored={} MiB ({} of {} chunks compressed)",
        bytes >> 20,
        stats.bytes_stored_new >> 20,
        compressed_chunks,
        stats.chunks_total
    );
    println!(
        "  fs::copy          {:>7.3} s  {:>8.1} MB/s  (floor)",
        copy_s,
        mb_per_s(bytes, copy_s)
    );
    for (name, seconds) in [
        ("build_manifest", build_s),
        ("rebuild (dedup)", rebuild_s),
        ("restore_manifest", restore_s),
    ] {
        println!(
            "  {name:<17} {seconds:>7.3} s  {:>8.1} MB/s  ({:.2}x copy time)",
            mb_per_s(bytes, seconds),
            seconds / copy_s
        );
    }
    drop(store);
    drop_store_dir(&store_dir)?;
    Ok(())
}

fn main() -> BenchResult<()> {
    let mib: u64 = match std::env::args().nth(1) {
        Some(arg) => arg.parse()?,
        None => 1024,
    };
    let bytes = mib << 20;
    let base = std::env::var_os("SHOAL_BENCH_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or(std::env::current_dir()?);
    let work = tempfile::tempdir_in(base)?;
    println!(
        "work dir: {} ({} MiB per data set)",
        work.path().display(),
        mib
    );
    for (label, writer) in [
        (
            "incompressible",
            write_random as fn(&Path, u64) -> BenchResult<()>,
        ),
        ("compressible", write_compressible),
    ] {
        let source_dir = work.path().join(format!("src-{label}"));
        fs::create_dir_all(&source_dir)?;
        writer(&source_dir.join("data.bin"), bytes)?;
        for fsync in [true, false] {
            bench(label, work.path(), bytes, fsync)?;
        }
        fs::remove_dir_all(&source_dir)?;
    }
    Ok(())
}
