//! Manifests: the list of files (and their chunks) that make up a directory tree,
//! plus building one from a directory and restoring one atomically.
//!
//! # Encoding and identity
//!
//! A manifest is encoded with bincode (fixed-width little-endian integers, no
//! trailing bytes), which is deterministic for a given value; entries are kept in a
//! canonical order (see [`path_order`]), so the same tree always yields the same bytes
//! and the same [`Manifest::manifest_id`]. The id is BLAKE3 of the encoding — i.e. the
//! [`ChunkId`] the encoded manifest would have if stored as a chunk.
//!
//! # What is captured
//!
//! Regular files (content, size, permission bits `mode & 0o777`) and directories
//! (permission bits; empty directories survive a round trip). Setuid/setgid/sticky bits,
//! owners, timestamps and xattrs are deliberately not captured: restored checkpoints
//! belong to the restoring user. Symlinks and special files (FIFOs, sockets, devices)
//! are refused by default ([`SymlinkPolicy::Refuse`]) because silently dropping, say,
//! a `latest -> step_1000` link would produce an incomplete copy that looks complete;
//! [`SymlinkPolicy::Skip`] ignores them and lists them in [`BuildStats::skipped`].
//! Following symlinks is never done: it could escape the tree or loop.

use std::cmp::Ordering;
use std::collections::BTreeSet;
use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::{SystemTime, UNIX_EPOCH};

use bincode::Options;
use serde::{Deserialize, Serialize};

use crate::chunk::{
    decode_frame_borrowed, encode_chunk_with_id, ChunkId, CodecConfig, DEFAULT_CHUNK_SIZE,
    MAX_CHUNK_SIZE,
};
use crate::chunker::{validate_chunk_size, Chunker};
use crate::error::{io_err, Result, StorageError};
use crate::store::{sync_dir, ChunkStore, PutOutcome};
use crate::walk::{Dir, Kind};

/// Manifest format version written by this build.
pub const MANIFEST_VERSION: u32 = 1;
/// Upper bound on an encoded manifest accepted by [`Manifest::from_bytes`] (256 MiB,
/// ~3.5 M chunk refs ≈ 14 TiB of data at 4 MiB chunks).
pub const MAX_MANIFEST_BYTES: u64 = 256 * 1024 * 1024;

/// A reference from a file to one of its chunks, in file order.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ChunkRef {
    /// Content id (BLAKE3 of the plain bytes).
    pub id: ChunkId,
    /// Plain length: how many bytes of the file this chunk covers.
    pub plain_len: u32,
    /// Frame length as stored/transferred (for capacity planning and progress).
    pub stored_len: u32,
}

/// A regular file in a manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileEntry {
    /// Relative `/`-separated path; see [`validate_relative_path`].
    pub path: String,
    /// Permission bits (`0o777` mask).
    pub mode: u32,
    /// File size in bytes; equals the sum of `chunks[..].plain_len`.
    pub size: u64,
    /// Chunks in file order.
    pub chunks: Vec<ChunkRef>,
}

/// A directory in a manifest (recorded so that empty directories and directory
/// permissions survive a round trip).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirEntry {
    /// Relative `/`-separated path; see [`validate_relative_path`].
    pub path: String,
    /// Permission bits (`0o777` mask).
    pub mode: u32,
}

/// A directory tree as content-addressed chunks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Manifest {
    /// Format version ([`MANIFEST_VERSION`]).
    pub version: u32,
    /// Regular files, in [`path_order`].
    pub files: Vec<FileEntry>,
    /// Directories below the root, in [`path_order`].
    pub dirs: Vec<DirEntry>,
    /// Sum of all file sizes.
    pub total_bytes: u64,
}

/// Canonical entry order: component-wise byte order of `/`-separated paths, which is
/// what a depth-first walk with sorted children produces (`a/x` sorts before `a.txt`).
pub fn path_order(a: &str, b: &str) -> Ordering {
    a.split('/').cmp(b.split('/'))
}

/// Checks that `path` is a safe relative path: non-empty, not absolute, no empty,
/// `.` or `..` components, no NUL and no backslash (which another OS would treat as
/// a separator). Restores join these paths onto a destination, so this is what keeps
/// a hostile manifest from writing outside it.
pub fn validate_relative_path(path: &str) -> Result<()> {
    let invalid = |reason| {
        Err(StorageError::InvalidPath {
            path: path.to_string(),
            reason,
        })
    };
    if path.is_empty() {
        return invalid("empty path");
    }
    if path.starts_with('/') {
        return invalid("absolute path");
    }
    if path.contains('\0') {
        return invalid("contains NUL");
    }
    if path.contains('\\') {
        return invalid("contains a backslash");
    }
    for component in path.split('/') {
        match component {
            "" => return invalid("empty component (leading, trailing or double slash)"),
            "." => return invalid("'.' component"),
            ".." => return invalid("'..' component"),
            _ => {}
        }
    }
    Ok(())
}

fn bincode_options() -> impl Options {
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .with_little_endian()
        .reject_trailing_bytes()
        .with_limit(MAX_MANIFEST_BYTES)
}

impl Manifest {
    /// An empty manifest (no files, no directories).
    pub fn empty() -> Self {
        Manifest {
            version: MANIFEST_VERSION,
            files: Vec::new(),
            dirs: Vec::new(),
            total_bytes: 0,
        }
    }

    /// Deterministic binary encoding.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        Ok(bincode_options().serialize(self)?)
    }

    /// Decodes and [`validate`](Manifest::validate)s a manifest (e.g. received from a peer).
    pub fn from_bytes(bytes: &[u8]) -> Result<Self> {
        let manifest: Manifest = bincode_options().deserialize(bytes)?;
        manifest.validate()?;
        Ok(manifest)
    }

    /// BLAKE3 of [`Manifest::to_bytes`]; equal manifests have equal ids.
    pub fn manifest_id(&self) -> Result<ChunkId> {
        Ok(ChunkId::of(&self.to_bytes()?))
    }

    /// Every distinct chunk id referenced (the live set for [`ChunkStore::gc`]).
    pub fn chunk_ids(&self) -> BTreeSet<ChunkId> {
        self.files
            .iter()
            .flat_map(|file| file.chunks.iter().map(|chunk| chunk.id))
            .collect()
    }

    /// Distinct chunk refs in first-use order (file order, then chunk order), so
    /// transfers proceed roughly file by file.
    pub fn unique_chunks(&self) -> Vec<ChunkRef> {
        let mut seen = BTreeSet::new();
        self.files
            .iter()
            .flat_map(|file| file.chunks.iter())
            .filter(|chunk| seen.insert(chunk.id))
            .copied()
            .collect()
    }

    /// Checks every invariant a restore relies on: known version, safe paths,
    /// canonical order without duplicates, no file used as a directory, chunk lengths
    /// within bounds and adding up to file sizes, and `total_bytes` matching.
    pub fn validate(&self) -> Result<()> {
        let invalid = |reason: String| Err(StorageError::InvalidManifest { reason });
        if self.version != MANIFEST_VERSION {
            return invalid(format!(
                "unsupported manifest version {} (this build reads {MANIFEST_VERSION})",
                self.version
            ));
        }
        for window in self.dirs.windows(2) {
            if path_order(&window[0].path, &window[1].path) != Ordering::Less {
                return invalid(format!(
                    "directories not strictly sorted at {:?}",
                    window[1].path
                ));
            }
        }
        for window in self.files.windows(2) {
            if path_order(&window[0].path, &window[1].path) != Ordering::Less {
                return invalid(format!("files not strictly sorted at {:?}", window[1].path));
            }
        }
        let file_paths: BTreeSet<&str> = self.files.iter().map(|f| f.path.as_str()).collect();
        for dir in &self.dirs {
            validate_relative_path(&dir.path)?;
            if file_paths.contains(dir.path.as_str()) {
                return invalid(format!("{:?} is both a file and a directory", dir.path));
            }
        }
        let mut total: u64 = 0;
        for file in &self.files {
            validate_relative_path(&file.path)?;
            for (index, _) in file.path.match_indices('/') {
                let ancestor = &file.path[..index];
                if file_paths.contains(ancestor) {
                    return invalid(format!(
                        "{:?} is inside {ancestor:?}, which is a file",
                        file.path
                    ));
                }
            }
            let mut size: u64 = 0;
            for chunk in &file.chunks {
                if chunk.plain_len == 0 || chunk.plain_len as usize > MAX_CHUNK_SIZE {
                    return invalid(format!(
                        "{:?}: chunk {} has plain length {}",
                        file.path, chunk.id, chunk.plain_len
                    ));
                }
                size += u64::from(chunk.plain_len);
            }
            if size != file.size {
                return invalid(format!(
                    "{:?}: chunks add up to {size} bytes but size is {}",
                    file.path, file.size
                ));
            }
            total = total
                .checked_add(size)
                .ok_or_else(|| StorageError::InvalidManifest {
                    reason: "total size overflows".to_string(),
                })?;
        }
        if total != self.total_bytes {
            return invalid(format!(
                "files add up to {total} bytes but total_bytes is {}",
                self.total_bytes
            ));
        }
        Ok(())
    }
}

/// What to do with symlinks and special files met while building a manifest.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SymlinkPolicy {
    /// Fail the build (default): an incomplete copy must not look complete.
    #[default]
    Refuse,
    /// Leave them out and list them in [`BuildStats::skipped`].
    Skip,
}

/// Options for [`build_manifest_with`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildOptions {
    /// Chunk size (default 4 MiB, at most [`MAX_CHUNK_SIZE`]).
    pub chunk_size: usize,
    /// Compression settings for new chunks.
    pub codec: CodecConfig,
    /// Symlink / special file handling.
    pub symlinks: SymlinkPolicy,
}

impl Default for BuildOptions {
    fn default() -> Self {
        BuildOptions {
            chunk_size: DEFAULT_CHUNK_SIZE,
            codec: CodecConfig::default(),
            symlinks: SymlinkPolicy::default(),
        }
    }
}

/// Counters from a manifest build.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct BuildStats {
    /// Regular files captured.
    pub files: u64,
    /// Directories captured (excluding the root).
    pub dirs: u64,
    /// Plain bytes read from disk.
    pub bytes_read: u64,
    /// Chunk references produced (including repeats).
    pub chunks_total: u64,
    /// Chunks written to the store by this build.
    pub chunks_new: u64,
    /// Chunks that were already in the store (dedup hits; not re-encoded or rewritten).
    pub chunks_deduplicated: u64,
    /// Frame bytes written to the store by this build.
    pub bytes_stored_new: u64,
    /// Symlinks / special files left out under [`SymlinkPolicy::Skip`].
    pub skipped: Vec<PathBuf>,
}

/// [`build_manifest_with`] with default options (4 MiB chunks, zstd-1, refuse symlinks).
pub fn build_manifest(dir: impl AsRef<Path>, store: &ChunkStore) -> Result<(Manifest, BuildStats)> {
    build_manifest_with(dir, store, &BuildOptions::default())
}

/// Walks `dir` (sorted, depth-first, without following symlinks), streams every
/// regular file through the chunker into `store`, and returns the manifest.
///
/// Chunks are hashed before they are compressed, so chunks already in the store cost
/// one hash and one `stat` — no compression, no write. If the build fails midway, the
/// chunks written so far stay in the store (harmless: unreferenced chunks are removed
/// by [`ChunkStore::gc`]). A file that changes while being read is captured as the
/// bytes actually read; callers should capture quiescent checkpoints.
pub fn build_manifest_with(
    dir: impl AsRef<Path>,
    store: &ChunkStore,
    options: &BuildOptions,
) -> Result<(Manifest, BuildStats)> {
    validate_chunk_size(options.chunk_size)?;
    let root = dir.as_ref();
    let metadata = fs::metadata(root).map_err(io_err("inspecting source directory", root))?;
    if !metadata.is_dir() {
        return Err(StorageError::InvalidArgument(format!(
            "{} is not a directory",
            root.display()
        )));
    }
    let mut stats = BuildStats::default();
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    // Pending directories, as relative path (empty = root) and the directory
    // held open: every entry is examined and opened through its parent's
    // descriptor (crate::walk), so a tree that changes during the walk
    // cannot lead it outside. Processing children in sorted order from a
    // stack (pushed in reverse) gives a sorted depth-first walk.
    let opened_root = Dir::open_root(root).map_err(io_err("opening source directory", root))?;
    // A directory is opened only when it is walked, through its parent's
    // descriptor, so open descriptors are bounded by the depth of the tree,
    // not by how many siblings wait.
    let mut pending: Vec<Pending> = vec![Pending::Root(opened_root)];
    while let Some(next) = pending.pop() {
        let (relative_dir, handle) = match next {
            Pending::Root(dir) => (String::new(), Rc::new(dir)),
            Pending::Sub {
                relative,
                parent,
                name,
                seen,
            } => {
                let absolute = root.join(&relative);
                let dir = parent
                    .open_dir(name.as_ref(), &seen)
                    .map_err(io_err("opening directory", &absolute))?;
                (relative, Rc::new(dir))
            }
        };
        let absolute_dir = if relative_dir.is_empty() {
            root.to_path_buf()
        } else {
            root.join(&relative_dir)
        };
        let mut children = Vec::new();
        for name in handle
            .names()
            .map_err(io_err("listing directory", &absolute_dir))?
        {
            let absolute = absolute_dir.join(&name);
            let name = name.into_string().map_err(|_| StorageError::NonUtf8Path {
                path: absolute.clone(),
            })?;
            children.push((name, absolute));
        }
        children.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut subdirs = Vec::new();
        for (name, absolute) in children {
            let relative = if relative_dir.is_empty() {
                name.clone()
            } else {
                format!("{relative_dir}/{name}")
            };
            validate_relative_path(&relative)?;
            let (kind, seen) = handle
                .kind(name.as_ref())
                .map_err(io_err("inspecting directory entry", &absolute))?;
            match kind {
                Kind::Dir => {
                    dirs.push(DirEntry {
                        path: relative.clone(),
                        mode: seen.st_mode & 0o777,
                    });
                    stats.dirs += 1;
                    subdirs.push(Pending::Sub {
                        relative,
                        parent: handle.clone(),
                        name,
                        seen,
                    });
                }
                Kind::File => {
                    let file = handle
                        .open_file(name.as_ref(), &seen)
                        .map_err(io_err("opening source file", &absolute))?;
                    let mode = seen.st_mode & 0o777;
                    let entry =
                        capture_file(file, &absolute, relative, mode, store, options, &mut stats)?;
                    stats.files += 1;
                    files.push(entry);
                }
                _ if options.symlinks == SymlinkPolicy::Skip => stats.skipped.push(absolute),
                Kind::Symlink => return Err(StorageError::SymlinkRefused { path: absolute }),
                Kind::Special => return Err(StorageError::SpecialFileRefused { path: absolute }),
            }
        }
        pending.extend(subdirs.into_iter().rev());
    }
    files.sort_by(|a, b| path_order(&a.path, &b.path));
    dirs.sort_by(|a, b| path_order(&a.path, &b.path));
    let total_bytes = files.iter().map(|file| file.size).sum();
    let manifest = Manifest {
        version: MANIFEST_VERSION,
        files,
        dirs,
        total_bytes,
    };
    manifest.validate()?;
    Ok((manifest, stats))
}

/// A directory waiting to be walked: the root, or an entry of a directory
/// already open (opened when its turn comes).
enum Pending {
    Root(Dir),
    Sub {
        relative: String,
        parent: Rc<Dir>,
        name: String,
        seen: libc::stat,
    },
}

fn capture_file(
    file: File,
    absolute: &Path,
    relative: String,
    mode: u32,
    store: &ChunkStore,
    options: &BuildOptions,
    stats: &mut BuildStats,
) -> Result<FileEntry> {
    let mut chunker = Chunker::with_chunk_size(file, options.chunk_size)?;
    let mut chunks = Vec::new();
    let mut size = 0u64;
    while let Some(plain) = chunker
        .next_chunk()
        .map_err(io_err("reading source file", absolute))?
    {
        let id = ChunkId::of(plain);
        let plain_len = plain.len() as u32;
        size += u64::from(plain_len);
        stats.bytes_read += u64::from(plain_len);
        stats.chunks_total += 1;
        let stored_len = match store.stored_len(&id)? {
            Some(stored_len) => {
                stats.chunks_deduplicated += 1;
                stored_len
            }
            None => {
                let encoded = encode_chunk_with_id(plain, id, &options.codec)?;
                match store.put(&encoded)? {
                    PutOutcome::Stored { stored_len } => {
                        stats.chunks_new += 1;
                        stats.bytes_stored_new += stored_len;
                        stored_len
                    }
                    PutOutcome::AlreadyPresent { stored_len } => {
                        stats.chunks_deduplicated += 1;
                        stored_len
                    }
                }
            }
        };
        chunks.push(ChunkRef {
            id,
            plain_len,
            stored_len: u32::try_from(stored_len).map_err(|_| StorageError::MalformedChunk {
                id: Some(id),
                reason: format!("stored frame of {stored_len} bytes is implausibly large"),
            })?,
        });
    }
    Ok(FileEntry {
        path: relative,
        mode,
        size,
        chunks,
    })
}

#[cfg(unix)]
fn set_permission_bits(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(path, fs::Permissions::from_mode(mode & 0o777))
}

#[cfg(not(unix))]
fn set_permission_bits(path: &Path, mode: u32) -> std::io::Result<()> {
    let mut permissions = fs::metadata(path)?.permissions();
    permissions.set_readonly(mode & 0o222 == 0);
    fs::set_permissions(path, permissions)
}

/// Options for [`restore_manifest_with`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestoreOptions {
    /// fsync files and directories before the final rename (keep `true` in production).
    pub fsync: bool,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions { fsync: true }
    }
}

/// Counters from a restore.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RestoreStats {
    pub files: u64,
    pub dirs: u64,
    pub bytes_written: u64,
}

/// [`restore_manifest_with`] with fsync enabled.
pub fn restore_manifest(
    manifest: &Manifest,
    store: &ChunkStore,
    dest_dir: impl AsRef<Path>,
) -> Result<RestoreStats> {
    restore_manifest_with(manifest, store, dest_dir, &RestoreOptions::default())
}

/// Recreates the tree described by `manifest` at `dest_dir`, atomically.
///
/// The tree is built in a hidden staging directory next to `dest_dir` (same
/// filesystem), every chunk is verified against its id as it is read, files and
/// directories are fsynced, and only then is the staging directory renamed to
/// `dest_dir`. On any failure the staging directory is removed, so `dest_dir` either
/// holds the complete tree or does not exist. `dest_dir` must not exist beforehand
/// (restores never merge into or overwrite existing data); its parent must exist.
pub fn restore_manifest_with(
    manifest: &Manifest,
    store: &ChunkStore,
    dest_dir: impl AsRef<Path>,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    manifest.validate()?;
    let dest = dest_dir.as_ref();
    if fs::symlink_metadata(dest).is_ok() {
        return Err(StorageError::DestinationExists {
            path: dest.to_path_buf(),
        });
    }
    let name = dest.file_name().ok_or_else(|| {
        StorageError::InvalidArgument(format!(
            "restore destination {} has no final component",
            dest.display()
        ))
    })?;
    let parent = match dest.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.as_nanos())
        .unwrap_or(0);
    let staging = parent.join(format!(
        ".{}.shoal-restore.{}.{nanos}",
        name.to_string_lossy(),
        std::process::id()
    ));
    fs::create_dir(&staging).map_err(io_err("creating restore staging directory", &staging))?;
    let mut guard = StagingGuard {
        path: staging.clone(),
        armed: true,
    };
    let stats = populate_staging(manifest, store, &staging, options)?;
    fs::rename(&staging, dest).map_err(io_err("moving restored tree into place", dest))?;
    guard.armed = false;
    if options.fsync {
        sync_dir(&parent)?;
    }
    Ok(stats)
}

fn populate_staging(
    manifest: &Manifest,
    store: &ChunkStore,
    staging: &Path,
    options: &RestoreOptions,
) -> Result<RestoreStats> {
    let mut stats = RestoreStats::default();
    // Every directory that will exist, including implicit parents of files.
    let mut all_dirs: BTreeSet<String> = manifest.dirs.iter().map(|d| d.path.clone()).collect();
    for file in &manifest.files {
        for (index, _) in file.path.match_indices('/') {
            all_dirs.insert(file.path[..index].to_string());
        }
    }
    for dir in &all_dirs {
        let path = staging.join(dir);
        fs::create_dir_all(&path).map_err(io_err("creating directory", &path))?;
    }
    // Buffers reused across chunks: no per-chunk allocation or page faulting.
    let mut frame = Vec::new();
    let mut scratch = Vec::new();
    for file in &manifest.files {
        let path = staging.join(&file.path);
        let mut output = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(io_err("creating file", &path))?;
        let mut written = 0u64;
        for chunk in &file.chunks {
            store.read_frame_into(&chunk.id, &mut frame)?;
            let plain =
                decode_frame_borrowed(&frame, &chunk.id, &mut scratch).map_err(|error| {
                    StorageError::RestoreMismatch {
                        path: file.path.clone(),
                        reason: error.to_string(),
                    }
                })?;
            if plain.len() != chunk.plain_len as usize {
                return Err(StorageError::RestoreMismatch {
                    path: file.path.clone(),
                    reason: format!(
                        "chunk {} has {} bytes, manifest says {}",
                        chunk.id,
                        plain.len(),
                        chunk.plain_len
                    ),
                });
            }
            output
                .write_all(plain)
                .map_err(io_err("writing restored file", &path))?;
            written += plain.len() as u64;
        }
        set_permission_bits(&path, file.mode).map_err(io_err("setting file mode", &path))?;
        if options.fsync {
            output
                .sync_all()
                .map_err(io_err("syncing restored file", &path))?;
        }
        stats.files += 1;
        stats.bytes_written += written;
    }
    // Deepest first, so a directory's entries are durable before the directory itself.
    if options.fsync {
        for dir in all_dirs.iter().rev() {
            sync_dir(&staging.join(dir))?;
        }
        sync_dir(staging)?;
    }
    // Modes last: a read-only directory must not block writing its contents.
    for dir in manifest.dirs.iter().rev() {
        let path = staging.join(&dir.path);
        set_permission_bits(&path, dir.mode).map_err(io_err("setting directory mode", &path))?;
    }
    stats.dirs = manifest.dirs.len() as u64;
    Ok(stats)
}

/// Removes the staging directory unless the restore completed.
struct StagingGuard {
    path: PathBuf,
    armed: bool,
}

impl Drop for StagingGuard {
    fn drop(&mut self) {
        if self.armed {
            make_tree_writable(&self.path);
            // Best effort: a leftover hidden staging dir is harmless, and Drop cannot
            // report errors. The destination itself was never created.
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Restores owner rwx on every directory so `remove_dir_all` can descend into
/// directories whose restored mode is read-only.
fn make_tree_writable(path: &Path) {
    let Ok(metadata) = fs::symlink_metadata(path) else {
        return;
    };
    if !metadata.is_dir() {
        return;
    }
    let _ = set_permission_bits(path, 0o700);
    if let Ok(entries) = fs::read_dir(path) {
        for entry in entries.flatten() {
            make_tree_writable(&entry.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_validation() {
        for good in [
            "a",
            "a/b",
            "a.b/c d",
            ".hidden",
            "..dots",
            "a/...",
            "ünïcode",
        ] {
            assert!(validate_relative_path(good).is_ok(), "{good}");
        }
        for bad in [
            "", "/abs", "a/../b", "..", ".", "a//b", "a/", "a\0b", "a\\b", "./a",
        ] {
            assert!(
                matches!(
                    validate_relative_path(bad),
                    Err(StorageError::InvalidPath { .. })
                ),
                "{bad:?}"
            );
        }
    }

    #[test]
    fn canonical_order_is_component_wise() {
        let mut paths = vec!["a.txt", "a/x", "a", "b", "a/x/y", "a-b"];
        paths.sort_by(|a, b| path_order(a, b));
        assert_eq!(paths, vec!["a", "a/x", "a/x/y", "a-b", "a.txt", "b"]);
    }

    fn file(path: &str, sizes: &[u32]) -> FileEntry {
        FileEntry {
            path: path.to_string(),
            mode: 0o644,
            size: sizes.iter().map(|s| u64::from(*s)).sum(),
            chunks: sizes
                .iter()
                .map(|s| ChunkRef {
                    id: ChunkId::of(&s.to_le_bytes()),
                    plain_len: *s,
                    stored_len: *s + 6,
                })
                .collect(),
        }
    }

    #[test]
    fn validation_rejects_inconsistent_manifests() {
        let mut manifest = Manifest::empty();
        manifest.files = vec![file("a", &[10, 5]), file("b/c", &[3])];
        manifest.total_bytes = 18;
        manifest.validate().expect("valid");

        let mut unsorted = manifest.clone();
        unsorted.files.swap(0, 1);
        assert!(unsorted.validate().is_err());

        let mut wrong_total = manifest.clone();
        wrong_total.total_bytes = 17;
        assert!(wrong_total.validate().is_err());

        let mut wrong_size = manifest.clone();
        wrong_size.files[0].size = 14;
        assert!(wrong_size.validate().is_err());

        let mut traversal = manifest.clone();
        traversal.files[1].path = "../c".to_string();
        assert!(traversal.validate().is_err());

        let mut file_as_dir = manifest.clone();
        file_as_dir.files = vec![file("a", &[10]), file("a/b", &[8])];
        assert!(file_as_dir.validate().is_err());

        let mut version = manifest.clone();
        version.version = 99;
        assert!(version.validate().is_err());
    }

    #[test]
    fn encoding_is_deterministic_and_validated_on_decode() {
        let mut manifest = Manifest::empty();
        manifest.files = vec![file("x", &[1, 2, 3])];
        manifest.dirs = vec![DirEntry {
            path: "empty".to_string(),
            mode: 0o755,
        }];
        manifest.total_bytes = 6;
        let bytes = manifest.to_bytes().expect("encode");
        assert_eq!(bytes, manifest.clone().to_bytes().expect("encode"));
        assert_eq!(Manifest::from_bytes(&bytes).expect("decode"), manifest);
        assert_eq!(manifest.manifest_id().expect("id"), ChunkId::of(&bytes));
        let mut trailing = bytes.clone();
        trailing.push(0);
        assert!(Manifest::from_bytes(&trailing).is_err());
        assert!(Manifest::from_bytes(&bytes[..bytes.len() - 1]).is_err());
    }
}
