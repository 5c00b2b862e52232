//! Writing a new file and making it durable, past the page cache where the
//! filesystem allows it.
//!
//! A chunk is written once, fsynced, and seldom read back soon. Through the
//! page cache each write costs a kernel copy into fresh pages, then writeback
//! of those pages, and the fsync waits for both; with several replicas
//! fsyncing 4 MiB chunks on one disk that was most of a checkpoint's
//! replication time (docs/BENCHMARKS.md, "Replicated checkpoint"). With
//! `O_DIRECT` the device reads the bytes from our buffer and the fsync only
//! commits the file's size and blocks.
//!
//! `O_DIRECT` wants the buffer, the length and the offset aligned to the
//! device's logical block; 4 KiB covers the devices in use. The frame is
//! copied into an aligned scratch buffer, padded with zeros to a whole
//! block, written, and the file cut back to the frame's length before the
//! fsync, so the file holds exactly the frame. A filesystem that refuses
//! `O_DIRECT` (`EINVAL`, e.g. some tmpfs and FUSE mounts) is remembered and
//! written through the page cache from then on.

use std::cell::RefCell;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

/// The alignment `O_DIRECT` is given: a multiple of every logical block size
/// in common use (512 and 4096 bytes).
const ALIGN: usize = 4096;

/// Scratch buffers larger than this are not kept between writes, so an odd
/// huge frame does not pin its size in every thread that wrote one.
const KEEP_SCRATCH_UP_TO: usize = 8 << 20;

thread_local! {
    static SCRATCH: RefCell<Vec<u8>> = const { RefCell::new(Vec::new()) };
}

/// Writes new files durably; remembers whether the filesystem takes
/// `O_DIRECT`.
#[derive(Debug)]
pub(crate) struct DurableWriter {
    direct: AtomicBool,
}

impl DurableWriter {
    pub(crate) fn new() -> Self {
        DurableWriter {
            direct: AtomicBool::new(true),
        }
    }

    /// Creates `path` (which must not exist), writes `bytes` and fsyncs it.
    pub(crate) fn write_new(&self, path: &Path, bytes: &[u8]) -> io::Result<()> {
        if self.direct.load(Ordering::Relaxed) {
            match write_direct(path, bytes) {
                Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                    // The filesystem (or the device's alignment) refuses it:
                    // fall back for good, after removing what was created.
                    let _ = std::fs::remove_file(path);
                    self.direct.store(false, Ordering::Relaxed);
                }
                done => return done,
            }
        }
        let mut file = create(path, 0)?;
        file.write_all(bytes)?;
        file.sync_all()
    }
}

fn create(path: &Path, flags: i32) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .custom_flags(flags)
        .open(path)
}

fn write_direct(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let file = create(path, libc::O_DIRECT)?;
    let padded = bytes.len().div_ceil(ALIGN) * ALIGN;
    SCRATCH.with(|scratch| -> io::Result<()> {
        let mut scratch = scratch.borrow_mut();
        if scratch.len() < padded + ALIGN {
            scratch.resize(padded + ALIGN, 0);
        }
        let start = scratch.as_ptr().align_offset(ALIGN);
        let Some(block) = scratch.get_mut(start..start + padded) else {
            // `align_offset` may decline to align; the caller falls back.
            return Err(io::Error::from_raw_os_error(libc::EINVAL));
        };
        block[..bytes.len()].copy_from_slice(bytes);
        block[bytes.len()..].fill(0);
        let written = (&file).write_all(block);
        if scratch.len() > KEEP_SCRATCH_UP_TO {
            *scratch = Vec::new();
        }
        written
    })?;
    if padded != bytes.len() {
        file.set_len(bytes.len() as u64)?;
    }
    file.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_hold_exactly_the_bytes_at_every_length_around_a_block() {
        let dir = tempfile::tempdir().expect("tempdir");
        let direct = DurableWriter::new();
        let buffered = DurableWriter {
            direct: AtomicBool::new(false),
        };
        for len in [
            0,
            1,
            6,
            ALIGN - 1,
            ALIGN,
            ALIGN + 1,
            3 * ALIGN + 17,
            1 << 20,
        ] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 251) as u8).collect();
            for (name, writer) in [("direct", &direct), ("buffered", &buffered)] {
                let path = dir.path().join(format!("{name}-{len}"));
                writer.write_new(&path, &bytes).expect("write");
                assert_eq!(
                    std::fs::read(&path).expect("read"),
                    bytes,
                    "{name}, length {len}"
                );
            }
        }
        // The scratch buffer of a long frame is not kept for the thread.
        direct
            .write_new(&dir.path().join("long"), &vec![1u8; KEEP_SCRATCH_UP_TO + 1])
            .expect("write");
        assert!(SCRATCH.with(|s| s.borrow().capacity()) <= KEEP_SCRATCH_UP_TO);
    }

    #[test]
    fn an_existing_file_is_never_overwritten() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("taken");
        std::fs::write(&path, b"first").expect("write");
        let error = DurableWriter::new()
            .write_new(&path, b"second")
            .expect_err("create_new");
        assert_eq!(error.kind(), io::ErrorKind::AlreadyExists);
        assert_eq!(std::fs::read(&path).expect("read"), b"first");
    }

    #[test]
    fn a_tmpfs_file_is_written_whether_or_not_it_takes_direct_io() {
        // /dev/shm is tmpfs: kernels before 6.6 refuse O_DIRECT there, so
        // this takes the fallback; newer ones the direct path. The bytes
        // must be the same either way.
        let dir = tempfile::tempdir_in("/dev/shm").expect("a tempdir in /dev/shm (tmpfs)");
        let writer = DurableWriter::new();
        let bytes = vec![7u8; ALIGN + 5];
        let path = dir.path().join("f");
        writer.write_new(&path, &bytes).expect("write");
        assert_eq!(std::fs::read(&path).expect("read"), bytes);
    }
}
