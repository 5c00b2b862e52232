//! # shoal-storage
//!
//! The storage core of Shoal: content-addressed chunks, manifests, a crash-safe local
//! chunk store, failure-domain-aware replica placement and replication orchestration.
//!
//! The crate is synchronous and sans-network. The node crate drives it from tokio via
//! `spawn_blocking` and moves bytes between peers by implementing
//! [`replicate::ChunkTransport`] over QUIC.
//!
//! | module | role |
//! | --- | --- |
//! | [`chunk`] | [`ChunkId`] (BLAKE3 of plain bytes), the versioned frame, zstd-or-raw encoding, verified decoding |
//! | [`chunker`] | streaming fixed-size splitting of a `Read` |
//! | [`manifest`] | [`Manifest`] of a directory tree; `build_manifest`, atomic `restore_manifest` |
//! | [`store`] | [`ChunkStore`]: fan-out directories, atomic writes, capacity, scrub, gc |
//! | [`placement`] | rendezvous hashing with zone/rack spreading; repair plans |
//! | [`replicate`] | the transport trait, quorum replication, verified fetch with fallback |
//! | [`memory_transport`] | in-memory transport with fault injection, for tests |
//!
//! Integrity rule, everywhere: bytes are only ever returned or stored after hashing to
//! the id they were asked for. A corrupt chunk is an error, never data.

pub mod chunk;
pub mod chunker;
mod durable_file;
pub mod error;
pub mod manifest;
pub mod memory_transport;
pub mod placement;
pub mod replicate;
pub mod store;
pub mod walk;

pub use chunk::{
    decode_chunk, encode_chunk, encode_chunk_with, ChunkId, CodecConfig, EncodedChunk,
};
pub use chunker::Chunker;
pub use error::{Result, StorageError};
pub use manifest::{
    build_manifest, build_manifest_with, restore_manifest, restore_manifest_with, BuildOptions,
    BuildStats, ChunkRef, DirEntry, FileEntry, Manifest, RestoreOptions, SymlinkPolicy,
};
pub use memory_transport::MemoryTransport;
pub use placement::{place_replicas, repair_plan, NodeInfo, RepairPlan};
pub use replicate::{
    replicate_chained, replicate_manifest, restore_from_nearest_replicas, restore_from_replicas,
    restore_from_replicas_parallel, ChainPush, ChunkTransport, FetchReport, ReplicationReport,
    TransportError,
};
pub use store::{ChunkStore, GcReport, ScrubReport, StoreConfig, StoreStats};
