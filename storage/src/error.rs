//! Error types shared by every module of the storage core.
//!
//! Every variant carries enough context (path, chunk id, node) for an operator
//! to act on it without a debugger. Callers that need to branch (e.g. pick another
//! peer when a store is full) match on the typed variants; nothing is stringly typed
//! except free-form I/O or codec detail.

use std::io;
use std::path::PathBuf;

use crate::chunk::ChunkId;

/// Convenience alias used throughout the crate.
pub type Result<T, E = StorageError> = std::result::Result<T, E>;

/// Everything that can go wrong in chunk encoding, the local store, manifests and
/// replication orchestration.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// An I/O operation on a concrete path failed.
    #[error("{action} {path}: {source}")]
    Io {
        /// What we were doing, e.g. "reading chunk file".
        action: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },

    /// The chunk frame uses a format version this build does not understand.
    #[error(
        "chunk frame has unsupported format version {found} (this build reads version {supported})"
    )]
    UnsupportedVersion { found: u8, supported: u8 },

    /// The chunk frame has flag bits this build does not understand.
    #[error("chunk frame has unknown flag bits {flags:#04x}")]
    UnknownFlags { flags: u8 },

    /// The chunk frame is structurally invalid (truncated header, length mismatch, ...).
    #[error("malformed chunk frame{}: {reason}", id_suffix(.id))]
    MalformedChunk { id: Option<ChunkId>, reason: String },

    /// A chunk (plain or declared) exceeds the configured maximum chunk size.
    #[error("chunk of {len} bytes exceeds the maximum chunk size of {max} bytes")]
    ChunkTooLarge { len: u64, max: u64 },

    /// The content hash of decoded bytes does not match the id they were requested under.
    #[error("chunk {expected} is corrupt: its content hashes to {actual}")]
    HashMismatch { expected: ChunkId, actual: ChunkId },

    /// zstd failed to compress or decompress.
    #[error("zstd {action} failed for chunk {id}: {source}")]
    Codec {
        action: &'static str,
        id: ChunkId,
        #[source]
        source: io::Error,
    },

    /// The chunk is not present in the local store.
    #[error("chunk {id} not found in store {store}")]
    ChunkNotFound { id: ChunkId, store: PathBuf },

    /// Writing the chunk would exceed the store's configured capacity.
    /// Callers should place the chunk on another peer.
    #[error(
        "store {store} is full: storing chunk {id} needs {needed} bytes, {used} of {capacity} used"
    )]
    StoreFull {
        store: PathBuf,
        id: ChunkId,
        needed: u64,
        used: u64,
        capacity: u64,
    },

    /// Another process (or another `ChunkStore` in this process) holds the store lock.
    #[error("store {path} is locked by another owner")]
    StoreLocked { path: PathBuf },

    /// A manifest path is not a safe relative path.
    #[error("invalid manifest path {path:?}: {reason}")]
    InvalidPath { path: String, reason: &'static str },

    /// A manifest is internally inconsistent (unsorted, sizes do not add up, ...).
    #[error("invalid manifest: {reason}")]
    InvalidManifest { reason: String },

    /// A manifest could not be encoded or decoded.
    #[error("manifest encoding: {0}")]
    ManifestEncoding(#[from] bincode::Error),

    /// The source tree contains a symlink and the policy is to refuse them.
    #[error("refusing symlink {path} (symlinks are not captured; use SymlinkPolicy::Skip to ignore them)")]
    SymlinkRefused { path: PathBuf },

    /// The source tree contains a FIFO, socket or device node.
    #[error("refusing special file {path} (only regular files and directories are captured)")]
    SpecialFileRefused { path: PathBuf },

    /// A file name is not valid UTF-8 and cannot be represented in a manifest.
    #[error("file name is not valid UTF-8: {path}")]
    NonUtf8Path { path: PathBuf },

    /// A file's content did not match the manifest while restoring.
    #[error("restoring {path}: {reason}")]
    RestoreMismatch { path: String, reason: String },

    /// The restore destination already exists; restores never overwrite.
    #[error("restore destination {path} already exists")]
    DestinationExists { path: PathBuf },

    /// A caller passed an argument that cannot work (e.g. quorum larger than targets).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// No holder could supply a verified copy of a chunk.
    #[error("chunk {id} unavailable: {}", describe_attempts(.attempts))]
    ChunkUnavailable {
        id: ChunkId,
        /// `(node, why that node could not supply the chunk)`, in the order tried.
        attempts: Vec<(u64, String)>,
    },
}

fn id_suffix(id: &Option<ChunkId>) -> String {
    match id {
        Some(id) => format!(" for chunk {id}"),
        None => String::new(),
    }
}

fn describe_attempts(attempts: &[(u64, String)]) -> String {
    if attempts.is_empty() {
        return "no holders to ask".to_string();
    }
    attempts
        .iter()
        .map(|(node, why)| format!("node {node}: {why}"))
        .collect::<Vec<_>>()
        .join("; ")
}

impl StorageError {
    /// Builds an [`StorageError::Io`] with context; used as `.map_err(io_err("reading", &path))`.
    pub(crate) fn io(action: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StorageError::Io {
            action,
            path: path.into(),
            source,
        }
    }

    /// True when the error means the chunk bytes themselves are bad (as opposed to
    /// I/O trouble or absence): the copy must be discarded and fetched elsewhere.
    pub fn is_corruption(&self) -> bool {
        matches!(
            self,
            StorageError::HashMismatch { .. }
                | StorageError::MalformedChunk { .. }
                | StorageError::UnknownFlags { .. }
                | StorageError::UnsupportedVersion { .. }
                | StorageError::ChunkTooLarge { .. }
                | StorageError::Codec { .. }
        )
    }
}

/// Closure helper: `.map_err(io_err("opening", &path))`.
pub(crate) fn io_err<'a>(
    action: &'static str,
    path: &'a std::path::Path,
) -> impl FnOnce(io::Error) -> StorageError + 'a {
    move |source| StorageError::io(action, path, source)
}
