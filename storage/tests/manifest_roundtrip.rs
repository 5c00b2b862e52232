//! Build → restore round trips, dedup and atomic restore, on real temp directories.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use proptest::prelude::*;
use shoal_storage::{
    build_manifest_with, restore_manifest_with, BuildOptions, ChunkStore, Manifest, RestoreOptions,
    StorageError, StoreConfig, SymlinkPolicy,
};

const FAST_STORE: StoreConfig = StoreConfig {
    capacity_bytes: None,
    fsync: false,
};
const FAST_RESTORE: RestoreOptions = RestoreOptions { fsync: false };

fn small_chunks() -> BuildOptions {
    BuildOptions {
        chunk_size: 1024,
        ..BuildOptions::default()
    }
}

/// What a tree looks like: relative path → (mode, Some(content) for files / None for dirs).
type Snapshot = BTreeMap<String, (u32, Option<Vec<u8>>)>;

fn snapshot(root: &Path) -> Snapshot {
    fn walk(root: &Path, dir: &Path, out: &mut Snapshot) {
        for entry in fs::read_dir(dir).expect("read_dir") {
            let entry = entry.expect("entry");
            let path = entry.path();
            let relative = path
                .strip_prefix(root)
                .expect("prefix")
                .to_str()
                .expect("utf8")
                .to_string();
            let metadata = fs::symlink_metadata(&path).expect("metadata");
            let mode = metadata.permissions().mode() & 0o777;
            if metadata.is_dir() {
                out.insert(relative, (mode, None));
                walk(root, &path, out);
            } else {
                out.insert(relative, (mode, Some(fs::read(&path).expect("read"))));
            }
        }
    }
    let mut out = Snapshot::new();
    walk(root, root, &mut out);
    out
}

#[derive(Debug, Clone)]
enum Spec {
    File { content: Vec<u8>, mode: u32 },
    Dir { mode: u32 },
}

fn tree_strategy() -> impl Strategy<Value = BTreeMap<String, Spec>> {
    let name = prop::sample::select(vec!["a", "b", "c.txt", "d d", "e-1.bin", "ü"]);
    let path = prop::collection::vec(name, 1..4).prop_map(|parts| parts.join("/"));
    let content = prop_oneof![
        Just(Vec::new()),
        prop::collection::vec(any::<u8>(), 0..3000),
        (any::<u8>(), 0usize..5000).prop_map(|(byte, len)| vec![byte; len]),
    ];
    let spec = prop_oneof![
        3 => (content, prop::sample::select(vec![0o644u32, 0o600, 0o755, 0o444]))
            .prop_map(|(content, mode)| Spec::File { content, mode }),
        1 => prop::sample::select(vec![0o755u32, 0o700]).prop_map(|mode| Spec::Dir { mode }),
    ];
    prop::collection::btree_map(path, spec, 0..12)
}

/// Writes the specs that are mutually consistent (a file never sits below a file).
fn materialize(root: &Path, specs: &BTreeMap<String, Spec>) {
    for (path, spec) in specs {
        let target = root.join(path);
        let blocked = target
            .ancestors()
            .skip(1)
            .take_while(|ancestor| *ancestor != root)
            .any(|ancestor| ancestor.is_file());
        if blocked || target.exists() {
            continue;
        }
        match spec {
            Spec::File { content, mode } => {
                if let Some(parent) = target.parent() {
                    fs::create_dir_all(parent).expect("mkdir");
                }
                fs::write(&target, content).expect("write");
                fs::set_permissions(&target, fs::Permissions::from_mode(*mode)).expect("chmod");
            }
            Spec::Dir { mode } => {
                fs::create_dir_all(&target).expect("mkdir");
                fs::set_permissions(&target, fs::Permissions::from_mode(*mode)).expect("chmod");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn random_trees_round_trip_and_dedup(specs in tree_strategy()) {
        let work = tempfile::tempdir().expect("tempdir");
        let source = work.path().join("source");
        fs::create_dir(&source).expect("mkdir");
        materialize(&source, &specs);
        let store = ChunkStore::open(work.path().join("store"), FAST_STORE).expect("store");

        let (manifest, stats) = build_manifest_with(&source, &store, &small_chunks()).expect("build");
        manifest.validate().expect("valid");
        prop_assert_eq!(Manifest::from_bytes(&manifest.to_bytes().expect("enc")).expect("dec"), manifest.clone());

        let dest = work.path().join("restored");
        restore_manifest_with(&manifest, &store, &dest, &FAST_RESTORE).expect("restore");
        prop_assert_eq!(snapshot(&source), snapshot(&dest));

        // Re-adding the same tree writes nothing new and yields the identical manifest.
        let (again, again_stats) = build_manifest_with(&source, &store, &small_chunks()).expect("rebuild");
        prop_assert_eq!(again_stats.chunks_new, 0);
        prop_assert_eq!(again_stats.chunks_deduplicated, stats.chunks_total);
        prop_assert_eq!(again.manifest_id().expect("id"), manifest.manifest_id().expect("id"));
    }
}

#[test]
fn copy_of_tree_dedups_against_original() {
    let work = tempfile::tempdir().expect("tempdir");
    let source = work.path().join("source");
    fs::create_dir_all(source.join("shards")).expect("mkdir");
    let shard: Vec<u8> = (0..10_000u32).flat_map(|i| i.to_le_bytes()).collect();
    fs::write(source.join("shards/0.bin"), &shard).expect("write");
    fs::write(source.join("shards/1.bin"), &shard).expect("write same content");
    fs::write(source.join("empty"), b"").expect("write");
    let store = ChunkStore::open(work.path().join("store"), FAST_STORE).expect("store");
    let (manifest, stats) = build_manifest_with(&source, &store, &small_chunks()).expect("build");
    // 40,000 bytes = 40 chunks per shard; the second shard is entirely dedup hits.
    assert_eq!(stats.chunks_total, 80);
    assert_eq!(stats.chunks_new, 40);
    assert_eq!(stats.chunks_deduplicated, 40);
    assert_eq!(stats.files, 3);
    assert_eq!(manifest.total_bytes, 80_000);
    assert_eq!(manifest.files[0].path, "empty");
    assert!(manifest.files[0].chunks.is_empty());
}

#[test]
fn failed_restore_leaves_no_destination() {
    let work = tempfile::tempdir().expect("tempdir");
    let source = work.path().join("source");
    fs::create_dir_all(source.join("sub")).expect("mkdir");
    fs::write(source.join("a.bin"), vec![1u8; 5000]).expect("write");
    fs::write(source.join("sub/z.bin"), vec![2u8; 5000]).expect("write");
    let store = ChunkStore::open(work.path().join("store"), FAST_STORE).expect("store");
    let (manifest, _) = build_manifest_with(&source, &store, &small_chunks()).expect("build");

    // Remove a chunk only the *last* file uses, so the restore fails midway.
    let last_chunk = manifest.files[1].chunks[0].id;
    assert!(store.delete(&last_chunk).expect("delete"));
    let parent = work.path().join("restores");
    fs::create_dir(&parent).expect("mkdir");
    let dest = parent.join("ckpt");
    let error = restore_manifest_with(&manifest, &store, &dest, &FAST_RESTORE)
        .expect_err("missing chunk must fail the restore");
    assert!(
        matches!(error, StorageError::ChunkNotFound { id, .. } if id == last_chunk),
        "{error}"
    );
    assert!(
        !dest.exists(),
        "destination must not exist after a failed restore"
    );
    assert_eq!(
        fs::read_dir(&parent).expect("ls").count(),
        0,
        "staging directory must be cleaned up"
    );

    // A corrupt chunk is equally fatal, and equally invisible.
    let (manifest, _) = build_manifest_with(&source, &store, &small_chunks()).expect("rebuild");
    let victim = manifest.files[1].chunks[0].id;
    let path = store.chunk_path(&victim);
    let mut bytes = fs::read(&path).expect("read");
    let last = bytes.len() - 1;
    bytes[last] ^= 1;
    fs::write(&path, &bytes).expect("corrupt");
    let error = restore_manifest_with(&manifest, &store, &dest, &FAST_RESTORE)
        .expect_err("corrupt chunk must fail the restore");
    assert!(
        matches!(error, StorageError::RestoreMismatch { .. }),
        "{error}"
    );
    assert!(!dest.exists());
    assert_eq!(fs::read_dir(&parent).expect("ls").count(), 0);
}

#[test]
fn restore_refuses_existing_destination_and_unsafe_manifests() {
    let work = tempfile::tempdir().expect("tempdir");
    let store = ChunkStore::open(work.path().join("store"), FAST_STORE).expect("store");
    let existing = work.path().join("existing");
    fs::create_dir(&existing).expect("mkdir");
    assert!(matches!(
        restore_manifest_with(&Manifest::empty(), &store, &existing, &FAST_RESTORE),
        Err(StorageError::DestinationExists { .. })
    ));
    let mut hostile = Manifest::empty();
    hostile.dirs.push(shoal_storage::DirEntry {
        path: "../escape".to_string(),
        mode: 0o755,
    });
    assert!(matches!(
        restore_manifest_with(&hostile, &store, work.path().join("new"), &FAST_RESTORE),
        Err(StorageError::InvalidPath { .. })
    ));
    assert!(!work.path().join("escape").exists());
}

#[test]
fn read_only_directories_round_trip() {
    let work = tempfile::tempdir().expect("tempdir");
    let source = work.path().join("source");
    fs::create_dir_all(source.join("locked")).expect("mkdir");
    fs::write(source.join("locked/file"), b"inside").expect("write");
    fs::set_permissions(source.join("locked"), fs::Permissions::from_mode(0o555)).expect("chmod");
    let store = ChunkStore::open(work.path().join("store"), FAST_STORE).expect("store");
    let (manifest, _) = build_manifest_with(&source, &store, &small_chunks()).expect("build");
    let dest = work.path().join("dest");
    restore_manifest_with(&manifest, &store, &dest, &RestoreOptions::default()).expect("restore");
    assert_eq!(snapshot(&source), snapshot(&dest));
    for dir in [&source, &dest] {
        fs::set_permissions(dir.join("locked"), fs::Permissions::from_mode(0o755)).expect("chmod");
    }
}

#[test]
fn symlinks_are_refused_by_default_and_skipped_on_request() {
    let work = tempfile::tempdir().expect("tempdir");
    let source = work.path().join("source");
    fs::create_dir(&source).expect("mkdir");
    fs::write(source.join("step_1000"), b"weights").expect("write");
    std::os::unix::fs::symlink("step_1000", source.join("latest")).expect("symlink");
    let store = ChunkStore::open(work.path().join("store"), FAST_STORE).expect("store");
    assert!(matches!(
        build_manifest_with(&source, &store, &small_chunks()),
        Err(StorageError::SymlinkRefused { .. })
    ));
    let skip = BuildOptions {
        symlinks: SymlinkPolicy::Skip,
        ..small_chunks()
    };
    let (manifest, stats) = build_manifest_with(&source, &store, &skip).expect("build");
    assert_eq!(manifest.files.len(), 1);
    assert_eq!(stats.skipped, vec![source.join("latest")]);
}
