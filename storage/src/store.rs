//! Local content-addressed chunk store.
//!
//! # Layout
//!
//! ```text
//! <root>/LOCK                 exclusive-lock file: one ChunkStore owns a root at a time
//! <root>/objects/ab/cdef…     chunk frames, named by hex id, fanned out by first byte
//! <root>/tmp/                 in-flight writes (same filesystem, emptied on open)
//! <root>/quarantine/          corrupt chunks moved aside by scrub, kept for forensics
//! ```
//!
//! Files hold the exact frame produced by [`crate::chunk::encode_chunk`], so
//! [`ChunkStore::get_encoded`] can ship stored bytes to a peer without recompressing.
//!
//! # Crash safety
//!
//! A chunk becomes visible only by `rename(2)` of a fully written, fsynced temp file
//! (written past the page cache where the filesystem allows, [`crate::durable_file`]),
//! followed by an fsync of the fan-out directory: after a crash a chunk is either
//! complete or absent, never torn. Leftover temp files are deleted on the next open.
//! Fsync can be disabled (tests, benchmarks that measure throughput without a
//! durability guarantee) via [`StoreConfig::fsync`].
//!
//! # Concurrency
//!
//! `ChunkStore` is `Send + Sync`; the node shares it behind an `Arc` across blocking
//! tasks. Writes do their I/O outside the internal lock; only the existence check,
//! capacity reservation and rename are serialized, so concurrent puts of the same
//! chunk store it once and count it once.

use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions, TryLockError};
use std::io::{ErrorKind, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::chunk::{
    check_chunk, decode_frame, decode_frame_borrowed, ChunkId, EncodedChunk, FLAG_ZSTD,
    FRAME_HEADER_LEN,
};
use crate::durable_file::DurableWriter;
use crate::error::{io_err, Result, StorageError};

const OBJECTS_DIR: &str = "objects";
const TMP_DIR: &str = "tmp";
const QUARANTINE_DIR: &str = "quarantine";
const LOCK_FILE: &str = "LOCK";

/// Configuration of a [`ChunkStore`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Maximum bytes of chunk frames the store may hold; `None` = unlimited.
    /// Exceeding it yields [`StorageError::StoreFull`] so callers can choose another peer.
    pub capacity_bytes: Option<u64>,
    /// fsync chunk files and directories before reporting a write as done.
    /// Keep `true` in production; disabling trades durability for speed.
    pub fsync: bool,
}

impl Default for StoreConfig {
    fn default() -> Self {
        StoreConfig {
            capacity_bytes: None,
            fsync: true,
        }
    }
}

/// Usage snapshot returned by [`ChunkStore::stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreStats {
    /// Bytes of chunk frames on disk (what counts against capacity).
    pub bytes: u64,
    /// Number of chunks stored.
    pub chunks: u64,
    /// Configured capacity, if any.
    pub capacity_bytes: Option<u64>,
}

impl StoreStats {
    /// Bytes that can still be written before `StoreFull`; `None` = unlimited.
    pub fn free_bytes(&self) -> Option<u64> {
        self.capacity_bytes
            .map(|capacity| capacity.saturating_sub(self.bytes))
    }
}

/// Result of a successful [`ChunkStore::put`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// The chunk was written; `stored_len` bytes were added to the store.
    Stored { stored_len: u64 },
    /// The chunk was already present (dedup); nothing was written.
    AlreadyPresent { stored_len: u64 },
}

impl PutOutcome {
    /// Frame length of the stored copy.
    pub fn stored_len(&self) -> u64 {
        match *self {
            PutOutcome::Stored { stored_len } | PutOutcome::AlreadyPresent { stored_len } => {
                stored_len
            }
        }
    }

    /// True if this put wrote new bytes.
    pub fn is_new(&self) -> bool {
        matches!(self, PutOutcome::Stored { .. })
    }
}

/// Result of [`ChunkStore::scrub`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ScrubReport {
    /// Chunks re-hashed.
    pub checked: u64,
    /// Frame bytes read.
    pub bytes_checked: u64,
    /// Chunks whose content did not match their id; each was moved to `quarantine/`.
    pub corrupt: Vec<ChunkId>,
}

/// Result of [`ChunkStore::gc`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcReport {
    /// Chunks kept because they are referenced.
    pub kept: u64,
    /// Unreferenced chunks deleted.
    pub deleted: u64,
    /// Frame bytes freed.
    pub bytes_freed: u64,
}

#[derive(Debug, Default)]
struct Usage {
    bytes: u64,
    chunks: u64,
    /// Bytes promised to in-flight writes, so concurrent puts cannot overshoot capacity.
    reserved: u64,
}

/// A content-addressed chunk store on the local filesystem. See the module docs.
#[derive(Debug)]
pub struct ChunkStore {
    root: PathBuf,
    objects: PathBuf,
    tmp: PathBuf,
    quarantine: PathBuf,
    config: StoreConfig,
    usage: Mutex<Usage>,
    temp_counter: AtomicU64,
    durable: DurableWriter,
    /// Held (locked) for the store's lifetime; dropping it releases the lock.
    _lock: File,
}

impl ChunkStore {
    /// Opens (creating if needed) a store under `root`.
    ///
    /// Takes an exclusive lock on `<root>/LOCK` ([`StorageError::StoreLocked`] if
    /// another owner holds it), deletes leftover temp files from a previous crash and
    /// scans the objects directory to learn current usage (one `stat` per chunk).
    pub fn open(root: impl AsRef<Path>, config: StoreConfig) -> Result<Self> {
        let root = root.as_ref().to_path_buf();
        let objects = root.join(OBJECTS_DIR);
        let tmp = root.join(TMP_DIR);
        let quarantine = root.join(QUARANTINE_DIR);
        for dir in [&root, &objects, &tmp, &quarantine] {
            fs::create_dir_all(dir).map_err(io_err("creating store directory", dir))?;
        }
        let lock_path = root.join(LOCK_FILE);
        let lock = OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .mode(0o600)
            .open(&lock_path)
            .map_err(io_err("opening store lock", &lock_path))?;
        match lock.try_lock() {
            Ok(()) => {}
            Err(TryLockError::WouldBlock) => {
                return Err(StorageError::StoreLocked { path: root });
            }
            Err(TryLockError::Error(source)) => {
                return Err(StorageError::io("locking store", &lock_path, source));
            }
        }
        for entry in fs::read_dir(&tmp).map_err(io_err("listing temp directory", &tmp))? {
            let entry = entry.map_err(io_err("listing temp directory", &tmp))?;
            let path = entry.path();
            fs::remove_file(&path).map_err(io_err("removing stale temp file", &path))?;
        }
        if config.fsync {
            sync_dir(&root)?;
        }
        let store = ChunkStore {
            root,
            objects,
            tmp,
            quarantine,
            config,
            usage: Mutex::new(Usage::default()),
            temp_counter: AtomicU64::new(0),
            durable: DurableWriter::new(),
            _lock: lock,
        };
        let mut usage = Usage::default();
        store.for_each_chunk_file(|_, _, len| {
            usage.bytes += len;
            usage.chunks += 1;
            Ok(())
        })?;
        *store.lock_usage() = usage;
        Ok(store)
    }

    /// The store's root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The store's configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Path of the file that holds (or would hold) chunk `id`.
    pub fn chunk_path(&self, id: &ChunkId) -> PathBuf {
        let hex = id.to_hex();
        self.objects.join(&hex[..2]).join(&hex[2..])
    }

    fn lock_usage(&self) -> MutexGuard<'_, Usage> {
        // Usage counters stay consistent even if a panicking thread held the lock:
        // every update is a single arithmetic statement.
        self.usage
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Stores a chunk. Unverified chunks (from [`EncodedChunk::from_wire`]) are decoded
    /// and hashed first, so a store never holds bytes under the wrong id (until bit-rot,
    /// which [`ChunkStore::scrub`] finds). Already-present chunks are not rewritten.
    pub fn put(&self, chunk: &EncodedChunk) -> Result<PutOutcome> {
        if !chunk.is_verified() {
            check_chunk(chunk)?;
        }
        let id = chunk.id();
        let final_path = self.chunk_path(&id);
        let needed = chunk.stored_len();
        {
            let mut usage = self.lock_usage();
            if let Some(stored_len) = self.existing_len(&final_path)? {
                return Ok(PutOutcome::AlreadyPresent { stored_len });
            }
            if let Some(capacity) = self.config.capacity_bytes {
                let committed = usage.bytes + usage.reserved;
                if committed.saturating_add(needed) > capacity {
                    return Err(StorageError::StoreFull {
                        store: self.root.clone(),
                        id,
                        needed,
                        used: committed,
                        capacity,
                    });
                }
            }
            usage.reserved += needed;
        }
        let result = self.write_and_publish(chunk, &final_path);
        let mut usage = self.lock_usage();
        usage.reserved -= needed;
        match result {
            Ok(true) => {
                usage.bytes += needed;
                usage.chunks += 1;
                Ok(PutOutcome::Stored { stored_len: needed })
            }
            Ok(false) => Ok(PutOutcome::AlreadyPresent { stored_len: needed }),
            Err(error) => Err(error),
        }
    }

    /// Writes the temp file and renames it into place. Returns `Ok(false)` when a
    /// concurrent writer published the same chunk first.
    fn write_and_publish(&self, chunk: &EncodedChunk, final_path: &Path) -> Result<bool> {
        self.ensure_fan_out_dir(final_path)?;
        let sequence = self.temp_counter.fetch_add(1, Ordering::Relaxed);
        let temp_path = self.tmp.join(format!("{}.{sequence}.tmp", chunk.id()));
        let write_result = if self.config.fsync {
            self.durable
                .write_new(&temp_path, chunk.bytes())
                .map_err(io_err("writing temp chunk file", &temp_path))
        } else {
            (|| {
                let mut file = OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(&temp_path)
                    .map_err(io_err("creating temp chunk file", &temp_path))?;
                file.write_all(chunk.bytes())
                    .map_err(io_err("writing temp chunk file", &temp_path))
            })()
        };
        if let Err(error) = write_result {
            let _ = fs::remove_file(&temp_path);
            return Err(error);
        }
        let published = {
            // Serialize "exists? then rename" so two writers of one id count it once.
            let _usage = self.lock_usage();
            if final_path.exists() {
                false
            } else {
                fs::rename(&temp_path, final_path).map_err(|source| {
                    let _ = fs::remove_file(&temp_path);
                    StorageError::io("publishing chunk file", final_path, source)
                })?;
                true
            }
        };
        if !published {
            let _ = fs::remove_file(&temp_path);
            return Ok(false);
        }
        if self.config.fsync {
            if let Some(parent) = final_path.parent() {
                sync_dir(parent)?;
            }
        }
        Ok(true)
    }

    /// Creates the fan-out directory of `final_path` on first use (lazily: creating all
    /// 256 up front costs hundreds of milliseconds on slow filesystems), making the
    /// creation durable before any chunk inside it is published.
    fn ensure_fan_out_dir(&self, final_path: &Path) -> Result<()> {
        let Some(dir) = final_path.parent() else {
            return Ok(());
        };
        if dir.is_dir() {
            return Ok(());
        }
        match fs::create_dir(dir) {
            Ok(()) => {
                if self.config.fsync {
                    sync_dir(&self.objects)?;
                }
                Ok(())
            }
            Err(error) if error.kind() == ErrorKind::AlreadyExists => Ok(()),
            Err(error) => Err(StorageError::io("creating fan-out directory", dir, error)),
        }
    }

    fn existing_len(&self, path: &Path) -> Result<Option<u64>> {
        match fs::metadata(path) {
            Ok(metadata) => Ok(Some(metadata.len())),
            Err(error) if error.kind() == ErrorKind::NotFound => Ok(None),
            Err(error) => Err(StorageError::io("inspecting chunk file", path, error)),
        }
    }

    fn read_frame(&self, id: &ChunkId) -> Result<Vec<u8>> {
        let path = self.chunk_path(id);
        match fs::read(&path) {
            Ok(bytes) => Ok(bytes),
            Err(error) if error.kind() == ErrorKind::NotFound => Err(StorageError::ChunkNotFound {
                id: *id,
                store: self.root.clone(),
            }),
            Err(error) => Err(StorageError::io("reading chunk file", path, error)),
        }
    }

    /// Reads chunk `id`'s frame into `frame` (reused across calls by hot loops).
    pub(crate) fn read_frame_into(&self, id: &ChunkId, frame: &mut Vec<u8>) -> Result<()> {
        let path = self.chunk_path(id);
        let mut file = match File::open(&path) {
            Ok(file) => file,
            Err(error) if error.kind() == ErrorKind::NotFound => {
                return Err(StorageError::ChunkNotFound {
                    id: *id,
                    store: self.root.clone(),
                })
            }
            Err(error) => return Err(StorageError::io("opening chunk file", path, error)),
        };
        frame.clear();
        file.read_to_end(frame)
            .map_err(io_err("reading chunk file", &path))?;
        Ok(())
    }

    /// Returns the plain bytes of chunk `id`, verified against the id.
    /// A corrupt chunk is an error (see [`StorageError::is_corruption`]), never data.
    pub fn get(&self, id: &ChunkId) -> Result<Vec<u8>> {
        let mut frame = self.read_frame(id)?;
        let mut scratch = Vec::new();
        decode_frame_borrowed(&frame, id, &mut scratch)?;
        // The frame decoded and verified, so its header is well-formed.
        if frame[1] & FLAG_ZSTD != 0 {
            return Ok(scratch);
        }
        // Raw frame, verified in place: strip the header instead of copying the payload.
        frame.drain(..FRAME_HEADER_LEN);
        Ok(frame)
    }

    /// Returns the stored frame for shipping to a peer without recompressing.
    /// The header is checked but the content is *not* re-hashed here: the receiver
    /// verifies on `put`, and a bad copy makes it fall back to another holder.
    pub fn get_encoded(&self, id: &ChunkId) -> Result<EncodedChunk> {
        EncodedChunk::from_wire(*id, self.read_frame(id)?)
    }

    /// Whether chunk `id` is stored (not verified; see [`ChunkStore::scrub`]).
    pub fn contains(&self, id: &ChunkId) -> Result<bool> {
        Ok(self.existing_len(&self.chunk_path(id))?.is_some())
    }

    /// Frame length of chunk `id`, or `None` if absent.
    pub fn stored_len(&self, id: &ChunkId) -> Result<Option<u64>> {
        self.existing_len(&self.chunk_path(id))
    }

    /// Deletes chunk `id`. Returns whether it was present.
    pub fn delete(&self, id: &ChunkId) -> Result<bool> {
        let path = self.chunk_path(id);
        let mut usage = self.lock_usage();
        let Some(len) = self.existing_len(&path)? else {
            return Ok(false);
        };
        match fs::remove_file(&path) {
            Ok(()) => {
                usage.bytes = usage.bytes.saturating_sub(len);
                usage.chunks = usage.chunks.saturating_sub(1);
                Ok(true)
            }
            Err(error) if error.kind() == ErrorKind::NotFound => Ok(false),
            Err(error) => Err(StorageError::io("deleting chunk file", path, error)),
        }
    }

    /// All stored chunk ids in ascending order. Files in `objects/` whose names are not
    /// chunk ids are ignored.
    pub fn list(&self) -> Result<Vec<ChunkId>> {
        let mut ids = Vec::new();
        self.for_each_chunk_file(|id, _, _| {
            ids.push(id);
            Ok(())
        })?;
        Ok(ids)
    }

    /// Current usage (maintained in memory; no disk access).
    pub fn stats(&self) -> StoreStats {
        let usage = self.lock_usage();
        StoreStats {
            bytes: usage.bytes,
            chunks: usage.chunks,
            capacity_bytes: self.config.capacity_bytes,
        }
    }

    /// Re-hashes every chunk. Chunks whose bytes no longer match their id (bit-rot,
    /// torn writes from outside the store, tampering) are moved to `quarantine/` so they
    /// are never served again, and reported so the caller can re-fetch them from a peer.
    pub fn scrub(&self) -> Result<ScrubReport> {
        let mut report = ScrubReport::default();
        for id in self.list()? {
            let frame = match self.read_frame(&id) {
                Ok(frame) => frame,
                // Deleted concurrently (e.g. by gc): nothing to check.
                Err(StorageError::ChunkNotFound { .. }) => continue,
                Err(error) => return Err(error),
            };
            report.checked += 1;
            report.bytes_checked += frame.len() as u64;
            match decode_frame(&frame, &id) {
                Ok(_) => {}
                Err(error) if error.is_corruption() => {
                    self.quarantine(&id)?;
                    report.corrupt.push(id);
                }
                Err(error) => return Err(error),
            }
        }
        Ok(report)
    }

    fn quarantine(&self, id: &ChunkId) -> Result<()> {
        let source = self.chunk_path(id);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|elapsed| elapsed.as_nanos())
            .unwrap_or(0);
        let destination = self.quarantine.join(format!("{id}.{nanos}"));
        let mut usage = self.lock_usage();
        let Some(len) = self.existing_len(&source)? else {
            return Ok(());
        };
        fs::rename(&source, &destination).map_err(io_err("quarantining chunk file", &source))?;
        usage.bytes = usage.bytes.saturating_sub(len);
        usage.chunks = usage.chunks.saturating_sub(1);
        Ok(())
    }

    /// Deletes every chunk not in `live`.
    ///
    /// The live set must include chunks of manifests still being built or received:
    /// a chunk written after the caller computed `live` but not in it is deleted. The
    /// node should therefore hold its write gate (or add in-flight manifests) while
    /// collecting.
    pub fn gc(&self, live: &BTreeSet<ChunkId>) -> Result<GcReport> {
        self.gc_older_than(live, std::time::Duration::ZERO)
    }

    /// Deletes every chunk not in `live` whose file is older than `grace`:
    /// chunks of manifests still being written (an upload, a checkpoint
    /// being replicated) are not referenced anywhere yet, and are younger.
    pub fn gc_older_than(
        &self,
        live: &BTreeSet<ChunkId>,
        grace: std::time::Duration,
    ) -> Result<GcReport> {
        let now = std::time::SystemTime::now();
        let mut report = GcReport::default();
        let mut garbage = Vec::new();
        self.for_each_chunk_file(|id, path, len| {
            let young = fs::metadata(path)
                .and_then(|m| m.modified())
                .map(|t| now.duration_since(t).unwrap_or_default() < grace)
                // Unknown age: keep it, a later pass will see it again.
                .unwrap_or(true);
            if live.contains(&id) || young {
                report.kept += 1;
            } else {
                garbage.push((id, len));
            }
            Ok(())
        })?;
        for (id, len) in garbage {
            if self.delete(&id)? {
                report.deleted += 1;
                report.bytes_freed += len;
            }
        }
        Ok(report)
    }

    /// Visits every chunk file in id order as `(id, path, frame_len)`.
    fn for_each_chunk_file(
        &self,
        mut visit: impl FnMut(ChunkId, &Path, u64) -> Result<()>,
    ) -> Result<()> {
        for prefix in 0..=255u8 {
            let prefix_hex = format!("{prefix:02x}");
            let dir = self.objects.join(&prefix_hex);
            let entries = match fs::read_dir(&dir) {
                Ok(entries) => entries,
                Err(error) if error.kind() == ErrorKind::NotFound => continue,
                Err(error) => {
                    return Err(StorageError::io("listing fan-out directory", dir, error))
                }
            };
            let mut files = Vec::new();
            for entry in entries {
                let entry = entry.map_err(io_err("listing fan-out directory", &dir))?;
                let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
                    continue;
                };
                let Ok(id) = ChunkId::from_hex(&format!("{prefix_hex}{name}")) else {
                    continue;
                };
                // Only accept the canonical lowercase name, so each id maps to one file.
                if name != id.to_hex()[2..] {
                    continue;
                }
                files.push((id, entry.path()));
            }
            files.sort_unstable_by_key(|(id, _)| *id);
            for (id, path) in files {
                let len = match fs::metadata(&path) {
                    Ok(metadata) => metadata.len(),
                    Err(error) if error.kind() == ErrorKind::NotFound => continue,
                    Err(error) => {
                        return Err(StorageError::io("inspecting chunk file", path, error))
                    }
                };
                visit(id, &path, len)?;
            }
        }
        Ok(())
    }
}

/// fsyncs a directory so that renames/creations inside it are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|handle| handle.sync_all())
        .map_err(io_err("syncing directory", dir))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chunk::encode_chunk;

    fn open(dir: &Path) -> ChunkStore {
        ChunkStore::open(dir, StoreConfig::default()).expect("open store")
    }

    #[test]
    fn put_get_contains_delete_list_stats() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let a = encode_chunk(b"alpha").expect("encode");
        let b = encode_chunk(&[0u8; 10_000]).expect("encode");
        assert!(store.put(&a).expect("put").is_new());
        assert!(!store.put(&a).expect("put again").is_new());
        store.put(&b).expect("put b");
        assert_eq!(store.get(&a.id()).expect("get"), b"alpha");
        assert_eq!(store.get(&b.id()).expect("get"), vec![0u8; 10_000]);
        assert_eq!(store.get_encoded(&b.id()).expect("raw").bytes(), b.bytes());
        assert!(store.contains(&a.id()).expect("contains"));
        let mut expected = vec![a.id(), b.id()];
        expected.sort();
        assert_eq!(store.list().expect("list"), expected);
        let stats = store.stats();
        assert_eq!(stats.chunks, 2);
        assert_eq!(stats.bytes, a.stored_len() + b.stored_len());
        assert!(store.delete(&a.id()).expect("delete"));
        assert!(!store.delete(&a.id()).expect("delete twice"));
        assert!(matches!(
            store.get(&a.id()),
            Err(StorageError::ChunkNotFound { .. })
        ));
        assert_eq!(store.stats().chunks, 1);
    }

    #[test]
    fn usage_survives_reopen_and_lock_is_exclusive() {
        let dir = tempfile::tempdir().expect("tempdir");
        let chunk = encode_chunk(b"persisted").expect("encode");
        {
            let store = open(dir.path());
            store.put(&chunk).expect("put");
            assert!(matches!(
                ChunkStore::open(dir.path(), StoreConfig::default()),
                Err(StorageError::StoreLocked { .. })
            ));
            fs::write(dir.path().join(TMP_DIR).join("junk.tmp"), b"x").expect("junk");
        }
        let store = open(dir.path());
        assert_eq!(store.stats().chunks, 1);
        assert_eq!(store.stats().bytes, chunk.stored_len());
        assert_eq!(
            fs::read_dir(dir.path().join(TMP_DIR)).expect("tmp").count(),
            0,
            "stale temp files are removed on open"
        );
    }

    #[test]
    fn capacity_limit_is_typed_store_full() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = encode_chunk(&[1u8; 100]).expect("encode");
        let store = ChunkStore::open(
            dir.path(),
            StoreConfig {
                capacity_bytes: Some(first.stored_len() + 10),
                fsync: false,
            },
        )
        .expect("open");
        store.put(&first).expect("fits");
        let second = encode_chunk(b"this one does not fit").expect("encode");
        match store.put(&second) {
            Err(StorageError::StoreFull { id, capacity, .. }) => {
                assert_eq!(id, second.id());
                assert_eq!(capacity, first.stored_len() + 10);
            }
            other => panic!("expected StoreFull, got {other:?}"),
        }
        // Re-putting a present chunk is not a capacity problem.
        assert!(!store.put(&first).expect("dedup").is_new());
        assert_eq!(store.stats().free_bytes(), Some(10));
    }

    #[test]
    fn unverified_corrupt_put_is_rejected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let good = encode_chunk(b"payload bytes").expect("encode");
        let mut bytes = good.bytes().to_vec();
        let last = bytes.len() - 1;
        bytes[last] ^= 1;
        let forged = EncodedChunk::from_wire(good.id(), bytes).expect("frame ok");
        assert!(store.put(&forged).expect_err("corrupt").is_corruption());
        assert!(!store.contains(&good.id()).expect("contains"));
        let honest = EncodedChunk::from_wire(good.id(), good.bytes().to_vec()).expect("frame");
        assert!(store.put(&honest).expect("verified put").is_new());
    }

    #[test]
    fn bit_flip_is_caught_by_get_and_quarantined_by_scrub() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let victim = encode_chunk(&vec![5u8; 50_000]).expect("encode");
        let bystander = encode_chunk(b"healthy").expect("encode");
        store.put(&victim).expect("put");
        store.put(&bystander).expect("put");
        let path = store.chunk_path(&victim.id());
        let mut bytes = fs::read(&path).expect("read");
        let middle = bytes.len() / 2;
        bytes[middle] ^= 0xff;
        fs::write(&path, &bytes).expect("corrupt it");

        assert!(store
            .get(&victim.id())
            .expect_err("corrupt")
            .is_corruption());
        let report = store.scrub().expect("scrub");
        assert_eq!(report.checked, 2);
        assert_eq!(report.corrupt, vec![victim.id()]);
        assert!(!store.contains(&victim.id()).expect("contains"));
        assert_eq!(store.stats().chunks, 1);
        assert_eq!(
            fs::read_dir(dir.path().join(QUARANTINE_DIR))
                .expect("q")
                .count(),
            1
        );
        assert_eq!(store.get(&bystander.id()).expect("get"), b"healthy");
        assert!(store.scrub().expect("rescrub").corrupt.is_empty());
    }

    #[test]
    fn gc_deletes_only_unreferenced_chunks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let chunks: Vec<EncodedChunk> = (0..6u8)
            .map(|i| encode_chunk(&[i; 64]).expect("encode"))
            .collect();
        for chunk in &chunks {
            store.put(chunk).expect("put");
        }
        let live: BTreeSet<ChunkId> = chunks[..2].iter().map(EncodedChunk::id).collect();
        let report = store.gc(&live).expect("gc");
        assert_eq!(report.kept, 2);
        assert_eq!(report.deleted, 4);
        assert_eq!(
            report.bytes_freed,
            chunks[2..]
                .iter()
                .map(EncodedChunk::stored_len)
                .sum::<u64>()
        );
        assert_eq!(store.list().expect("list").len(), 2);
        assert_eq!(store.stats().chunks, 2);
    }

    #[test]
    fn gc_keeps_young_unreferenced_chunks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = open(dir.path());
        let chunk = encode_chunk(&[7u8; 64]).expect("encode");
        store.put(&chunk).expect("put");
        let report = store
            .gc_older_than(&BTreeSet::new(), std::time::Duration::from_secs(3600))
            .expect("gc");
        assert_eq!((report.kept, report.deleted), (1, 0));
        assert_eq!(store.gc(&BTreeSet::new()).expect("gc").deleted, 1);
    }

    #[test]
    fn concurrent_puts_of_same_chunk_count_once() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = std::sync::Arc::new(open(dir.path()));
        let chunk = encode_chunk(&[9u8; 4096]).expect("encode");
        let handles: Vec<_> = (0..4)
            .map(|_| {
                let store = store.clone();
                let chunk = chunk.clone();
                std::thread::spawn(move || store.put(&chunk).map(|o| o.is_new()))
            })
            .collect();
        let mut new_writes = 0;
        for handle in handles {
            if handle.join().expect("thread").expect("put") {
                new_writes += 1;
            }
        }
        assert_eq!(new_writes, 1);
        assert_eq!(store.stats().chunks, 1);
        assert_eq!(store.stats().bytes, chunk.stored_len());
    }
}
