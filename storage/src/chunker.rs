//! Streaming fixed-size chunking.
//!
//! Files are split into fixed-size chunks (default 4 MiB) rather than
//! content-defined ones. Shoal's main payload is training checkpoints, which are
//! rewritten whole at every step: a changed tensor shifts no byte boundaries we
//! could exploit, and unchanged data shows up as whole unchanged files or shards,
//! which fixed-size chunking already deduplicates perfectly (identical file →
//! identical chunk sequence). Fixed boundaries also cost nothing to compute, keep
//! every chunk except a file's last one exactly `chunk_size` long (predictable memory
//! and I/O sizes), and let a reader seek to chunk `offset / chunk_size` directly.
//!
//! The chunker never buffers more than one chunk: memory is `chunk_size` regardless
//! of file size.

use std::io::{self, ErrorKind, Read};

use crate::chunk::{DEFAULT_CHUNK_SIZE, MAX_CHUNK_SIZE};
use crate::error::{Result, StorageError};

/// Splits a reader into consecutive chunks of `chunk_size` bytes (the last one may
/// be shorter; an empty reader yields no chunks).
pub struct Chunker<R> {
    reader: R,
    buffer: Vec<u8>,
    chunk_size: usize,
    finished: bool,
}

impl<R: Read> Chunker<R> {
    /// Chunker with the default 4 MiB chunk size.
    pub fn new(reader: R) -> Self {
        Chunker {
            reader,
            buffer: Vec::new(),
            chunk_size: DEFAULT_CHUNK_SIZE,
            finished: false,
        }
    }

    /// Chunker with an explicit chunk size (1 ..= [`MAX_CHUNK_SIZE`]).
    pub fn with_chunk_size(reader: R, chunk_size: usize) -> Result<Self> {
        validate_chunk_size(chunk_size)?;
        Ok(Chunker {
            reader,
            buffer: Vec::new(),
            chunk_size,
            finished: false,
        })
    }

    /// Reads the next chunk into an internal buffer that is reused across calls, so
    /// steady-state chunking allocates nothing. Returns `None` at end of input.
    pub fn next_chunk(&mut self) -> io::Result<Option<&[u8]>> {
        if self.finished {
            return Ok(None);
        }
        self.buffer.resize(self.chunk_size, 0);
        let mut filled = 0;
        while filled < self.chunk_size {
            match self.reader.read(&mut self.buffer[filled..]) {
                Ok(0) => {
                    self.finished = true;
                    break;
                }
                Ok(read) => filled += read,
                Err(error) if error.kind() == ErrorKind::Interrupted => continue,
                Err(error) => return Err(error),
            }
        }
        if filled == 0 {
            return Ok(None);
        }
        Ok(Some(&self.buffer[..filled]))
    }

    /// The configured chunk size.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }
}

/// Owning iterator form, for callers that want `Vec<u8>` per chunk.
impl<R: Read> Iterator for Chunker<R> {
    type Item = io::Result<Vec<u8>>;

    fn next(&mut self) -> Option<Self::Item> {
        match self.next_chunk() {
            Ok(Some(chunk)) => Some(Ok(chunk.to_vec())),
            Ok(None) => None,
            Err(error) => {
                self.finished = true;
                Some(Err(error))
            }
        }
    }
}

/// Checks that a chunk size is usable: non-zero and within the frame limit.
pub fn validate_chunk_size(chunk_size: usize) -> Result<()> {
    if chunk_size == 0 || chunk_size > MAX_CHUNK_SIZE {
        return Err(StorageError::InvalidArgument(format!(
            "chunk size {chunk_size} must be between 1 and {MAX_CHUNK_SIZE}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reader that returns at most 3 bytes per call and sometimes `Interrupted`.
    struct Trickle {
        data: Vec<u8>,
        position: usize,
        calls: usize,
    }

    impl Read for Trickle {
        fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
            self.calls += 1;
            if self.calls.is_multiple_of(5) {
                return Err(io::Error::new(ErrorKind::Interrupted, "signal"));
            }
            let take = out.len().min(3).min(self.data.len() - self.position);
            out[..take].copy_from_slice(&self.data[self.position..self.position + take]);
            self.position += take;
            Ok(take)
        }
    }

    #[test]
    fn splits_into_fixed_chunks_with_short_tail() {
        let data: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        let reader = Trickle {
            data: data.clone(),
            position: 0,
            calls: 0,
        };
        let chunks: Vec<Vec<u8>> = Chunker::with_chunk_size(reader, 64)
            .expect("chunk size")
            .collect::<io::Result<_>>()
            .expect("read");
        assert_eq!(chunks.len(), 16);
        assert!(chunks[..15].iter().all(|c| c.len() == 64));
        assert_eq!(chunks[15].len(), 1000 - 15 * 64);
        assert_eq!(chunks.concat(), data);
    }

    #[test]
    fn exact_multiple_and_empty_inputs() {
        let chunks: Vec<_> = Chunker::with_chunk_size(&[1u8; 128][..], 64)
            .expect("chunk size")
            .collect::<io::Result<Vec<_>>>()
            .expect("read");
        assert_eq!(chunks.len(), 2);
        let mut empty = Chunker::new(&[][..]);
        assert!(empty.next_chunk().expect("read").is_none());
    }

    #[test]
    fn rejects_bad_chunk_sizes() {
        assert!(Chunker::with_chunk_size(&[][..], 0).is_err());
        assert!(Chunker::with_chunk_size(&[][..], MAX_CHUNK_SIZE + 1).is_err());
    }
}
