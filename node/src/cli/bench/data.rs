//! Benchmark inputs and baselines: deterministic data sets and the plain
//! fsynced copies Shoal's numbers are compared with.

use std::io::Write;
use std::path::Path;
use std::time::Instant;

/// Largest file of a generated data set.
const FILE_BYTES: u64 = 256 << 20;

/// Marsaglia's xorshift64: deterministic, fast enough that generating data
/// never dominates a measurement. Not for anything that needs randomness.
#[derive(Clone, Debug)]
pub struct Xorshift(u64);

impl Xorshift {
    /// A stream from `seed` (0 is replaced: xorshift never leaves 0).
    pub fn new(seed: u64) -> Self {
        Xorshift(if seed == 0 {
            0x9E37_79B9_7F4A_7C15
        } else {
            seed
        })
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// `len` bytes of the stream.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        (0..len).map(|_| self.next_u64() as u8).collect()
    }
}

/// What [`write_files`] writes.
pub struct DataSet<'a> {
    /// File names are `<prefix>-NNN.bin`.
    pub prefix: &'a str,
    pub seed: u64,
    /// Mostly a repeating pattern (like logs or sparse tensors), one random
    /// word in eight; otherwise every word is random.
    pub compressible: bool,
}

/// Writes `bytes` of `set` into `dir` as files of at most 256 MiB, each
/// fsynced.
pub fn write_files(dir: &Path, bytes: u64, set: &DataSet) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    let mut rng = Xorshift::new(set.seed);
    let mut left = bytes;
    let mut index = 0;
    let mut buf = vec![0u8; 1 << 20];
    while left > 0 {
        let size = left.min(FILE_BYTES);
        let name = format!("{}-{index:03}.bin", set.prefix);
        let mut file = std::fs::File::create(dir.join(name))?;
        let mut written = 0;
        while written < size {
            for (i, word) in buf.chunks_exact_mut(8).enumerate() {
                let random = rng.next_u64();
                let value = if set.compressible && i % 8 != 0 {
                    (i as u64) & 0xff
                } else {
                    random
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

/// `n` copies of the files of `from` under `to`, each fsynced: the seconds
/// they took. `to` is removed afterwards. Whatever earlier steps left dirty
/// in the page cache is written back first (`sync(2)`), or its writeback
/// would be timed as part of the copies.
pub fn timed_copies_with_fsync(from: &Path, to: &Path, n: u32) -> std::io::Result<f64> {
    // SAFETY: sync(2) takes no arguments and cannot fail.
    unsafe { libc::sync() };
    let started = Instant::now();
    for i in 0..n {
        copy_files_fsync(from, &to.join(format!("copy-{i}")))?;
    }
    let seconds = started.elapsed().as_secs_f64();
    std::fs::remove_dir_all(to)?;
    Ok(seconds)
}

/// Copies the files of `from` into `to` and fsyncs each: the baseline a
/// replicated copy is measured against.
pub fn copy_files_fsync(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let dest = to.join(entry.file_name());
        std::fs::copy(entry.path(), &dest)?;
        std::fs::File::open(&dest)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_stream_is_reproducible_and_never_stuck_at_zero() {
        let a: Vec<u64> = (0..4)
            .map({
                let mut r = Xorshift::new(7);
                move |_| r.next_u64()
            })
            .collect();
        let mut r = Xorshift::new(7);
        assert_eq!(a, (0..4).map(|_| r.next_u64()).collect::<Vec<_>>());
        assert_ne!(Xorshift::new(0).next_u64(), 0);
    }

    #[test]
    fn files_add_up_to_the_size_asked_for() {
        let dir = tempfile::tempdir().expect("tempdir");
        let set = DataSet {
            prefix: "part",
            seed: 1,
            compressible: true,
        };
        write_files(dir.path(), 3 << 20 | 5, &set).expect("write");
        let total: u64 = std::fs::read_dir(dir.path())
            .expect("read")
            .map(|e| e.expect("entry").metadata().expect("meta").len())
            .sum();
        assert_eq!(total, 3 << 20 | 5);
    }
}
