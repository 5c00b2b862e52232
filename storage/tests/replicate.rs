//! Replication orchestration against the in-memory transport with injected faults.

use std::fs;
use std::path::Path;

use shoal_storage::{
    build_manifest_with, replicate_chained, replicate_manifest, restore_from_nearest_replicas,
    restore_from_replicas, restore_from_replicas_parallel, restore_manifest_with, BuildOptions,
    ChunkStore, ChunkTransport, Manifest, MemoryTransport, RestoreOptions, StorageError,
    StoreConfig, TransportError,
};

const FAST_STORE: StoreConfig = StoreConfig {
    capacity_bytes: None,
    fsync: false,
};

struct Fixture {
    work: tempfile::TempDir,
    store: ChunkStore,
    manifest: Manifest,
}

/// A small tree (two files, 12 distinct chunks of 1 KiB) built into a local store.
fn fixture() -> Fixture {
    let work = tempfile::tempdir().expect("tempdir");
    let source = work.path().join("source");
    fs::create_dir_all(source.join("shards")).expect("mkdir");
    let text: Vec<u8> = (0..700)
        .flat_map(|i| format!("param {i}\n").into_bytes())
        .collect();
    fs::write(source.join("config.txt"), &text[..5000]).expect("write");
    let weights: Vec<u8> = (0..7000u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    fs::write(source.join("shards/0.bin"), &weights).expect("write");
    let store = ChunkStore::open(work.path().join("local"), FAST_STORE).expect("store");
    let options = BuildOptions {
        chunk_size: 1024,
        ..BuildOptions::default()
    };
    let (manifest, _) = build_manifest_with(&source, &store, &options).expect("build");
    assert_eq!(manifest.unique_chunks().len(), 12);
    Fixture {
        work,
        store,
        manifest,
    }
}

fn holds_everything(transport: &MemoryTransport, node: u64, manifest: &Manifest) -> bool {
    manifest.chunk_ids().is_subset(&transport.chunk_ids(node))
}

#[test]
fn quorum_reached_with_one_target_down_and_rerun_sends_only_missing() {
    let fixture = fixture();
    let transport = MemoryTransport::with_nodes([1, 2, 3]);
    transport.set_down(3, true);

    let report = replicate_manifest(&fixture.manifest, &fixture.store, &[1, 2, 3], &transport, 2)
        .expect("replicate");
    assert!(report.quorum_reached);
    assert_eq!(report.complete_nodes(), vec![1, 2]);
    let failed = report.failed_nodes();
    assert_eq!(failed.len(), 1);
    assert!(matches!(
        failed[0],
        (3, TransportError::Unreachable { node: 3, .. })
    ));
    assert!(holds_everything(&transport, 1, &fixture.manifest));
    assert!(holds_everything(&transport, 2, &fixture.manifest));
    assert_eq!(transport.push_calls(1), 12);
    assert_eq!(transport.push_calls(2), 12);

    // Node 3 returns: a re-run pushes only to it, and only what it lacks.
    transport.set_down(3, false);
    let report = replicate_manifest(&fixture.manifest, &fixture.store, &[1, 2, 3], &transport, 3)
        .expect("replicate again");
    assert!(report.quorum_reached);
    assert_eq!(transport.push_calls(1), 12, "nothing re-sent to node 1");
    assert_eq!(transport.push_calls(2), 12, "nothing re-sent to node 2");
    assert_eq!(transport.push_calls(3), 12);
    assert_eq!(report.targets[0].chunks_already_present, 12);

    // Fully replicated: a third run sends nothing at all.
    let report = replicate_manifest(&fixture.manifest, &fixture.store, &[1, 2, 3], &transport, 3)
        .expect("replicate a third time");
    assert_eq!(report.chunks_pushed(), 0);
    assert!(report.quorum_reached);
}

#[test]
fn partially_present_target_receives_only_the_rest() {
    let fixture = fixture();
    let transport = MemoryTransport::with_nodes([7]);
    for chunk in fixture.manifest.unique_chunks().iter().take(5) {
        transport.insert(7, &fixture.store.get_encoded(&chunk.id).expect("local"));
    }
    let report = replicate_manifest(&fixture.manifest, &fixture.store, &[7], &transport, 1)
        .expect("replicate");
    assert_eq!(transport.push_calls(7), 7);
    assert_eq!(report.targets[0].chunks_already_present, 5);
    assert_eq!(report.targets[0].chunks_pushed, 7);
    assert!(holds_everything(&transport, 7, &fixture.manifest));
}

#[test]
fn store_full_target_is_reported_and_can_break_quorum() {
    let fixture = fixture();
    let transport = MemoryTransport::with_nodes([1, 2, 3]);
    transport.set_capacity(2, Some(3000));

    let report = replicate_manifest(&fixture.manifest, &fixture.store, &[1, 2, 3], &transport, 2)
        .expect("replicate");
    assert!(report.quorum_reached);
    assert_eq!(report.complete_nodes(), vec![1, 3]);
    assert!(matches!(
        report.failed_nodes()[..],
        [(2, TransportError::StoreFull { node: 2, .. })]
    ));

    let report = replicate_manifest(&fixture.manifest, &fixture.store, &[1, 2, 3], &transport, 3)
        .expect("replicate with quorum 3");
    assert!(
        !report.quorum_reached,
        "a full target must not count towards the quorum"
    );
}

#[test]
fn invalid_quorum_is_an_argument_error() {
    let fixture = fixture();
    let transport = MemoryTransport::with_nodes([1, 2]);
    for quorum in [0, 3] {
        assert!(matches!(
            replicate_manifest(
                &fixture.manifest,
                &fixture.store,
                &[1, 2, 2],
                &transport,
                quorum
            ),
            Err(StorageError::InvalidArgument(_))
        ));
    }
}

fn restore_dir(fixture: &Fixture, store: &ChunkStore, name: &str) -> std::path::PathBuf {
    let dest = fixture.work.path().join(name);
    restore_manifest_with(
        &fixture.manifest,
        store,
        &dest,
        &RestoreOptions { fsync: false },
    )
    .expect("restore");
    dest
}

fn same_file(a: &Path, b: &Path) {
    assert_eq!(fs::read(a).expect("read a"), fs::read(b).expect("read b"));
}

#[test]
fn corrupt_local_chunk_is_scrubbed_and_refetched_from_a_good_holder() {
    let fixture = fixture();
    let transport = MemoryTransport::with_nodes([1, 2]);
    replicate_manifest(&fixture.manifest, &fixture.store, &[1, 2], &transport, 2)
        .expect("replicate");

    // Bit-rot on the local copy: get refuses it, scrub quarantines it.
    let victim = fixture.manifest.files[1].chunks[2].id;
    let path = fixture.store.chunk_path(&victim);
    let mut bytes = fs::read(&path).expect("read");
    bytes[10] ^= 0x01;
    fs::write(&path, &bytes).expect("corrupt");
    assert!(fixture
        .store
        .get(&victim)
        .expect_err("corrupt")
        .is_corruption());
    let scrub = fixture.store.scrub().expect("scrub");
    assert_eq!(scrub.corrupt, vec![victim]);
    assert!(!fixture.store.contains(&victim).expect("contains"));

    // Holder 1's copy is also rotten; holder 2's is good. The rotten one is never used.
    assert!(transport.corrupt_stored(1, &victim));
    let report = restore_from_replicas(&fixture.manifest, &[1, 2], &transport, &fixture.store)
        .expect("refetch");
    assert_eq!(report.fetched, 1);
    assert_eq!(report.already_local, 11);
    assert_eq!(report.corrupt_copies, vec![(1, victim)]);
    assert_eq!(fixture.store.get(&victim).expect("good copy").len(), 1024);
    assert!(fixture.store.scrub().expect("rescrub").corrupt.is_empty());

    let dest = restore_dir(&fixture, &fixture.store, "restored");
    same_file(
        &fixture.work.path().join("source/shards/0.bin"),
        &dest.join("shards/0.bin"),
    );
}

#[test]
fn fresh_restore_falls_back_across_down_and_corrupting_holders() {
    let fixture = fixture();
    let transport = MemoryTransport::with_nodes([1, 2, 3]);
    replicate_manifest(&fixture.manifest, &fixture.store, &[1, 2, 3], &transport, 3)
        .expect("replicate");
    transport.set_corrupt_fetches(1, true);
    transport.set_down(2, true);

    let fresh = ChunkStore::open(fixture.work.path().join("fresh"), FAST_STORE).expect("store");
    let report =
        restore_from_replicas(&fixture.manifest, &[1, 2, 3], &transport, &fresh).expect("fetch");
    assert_eq!(report.fetched, 12);
    assert_eq!(report.corrupt_copies.len(), 12);
    assert!(report.corrupt_copies.iter().all(|(node, _)| *node == 1));
    assert_eq!(report.failed_attempts.len(), 12);
    assert!(report.failed_attempts.iter().all(|(node, _, _)| *node == 2));
    assert_eq!(transport.fetch_calls(3), 12);

    let dest = restore_dir(&fixture, &fresh, "fresh-restore");
    let source = fixture.work.path().join("source");
    same_file(&source.join("config.txt"), &dest.join("config.txt"));
    same_file(&source.join("shards/0.bin"), &dest.join("shards/0.bin"));

    // A second run fetches nothing: everything is local now.
    let again =
        restore_from_replicas(&fixture.manifest, &[1, 2, 3], &transport, &fresh).expect("fetch");
    assert_eq!(again.fetched, 0);
    assert_eq!(again.already_local, 12);
}

#[test]
fn parallel_restore_spreads_over_holders_and_skips_bad_ones() {
    let fixture = fixture();
    let transport = MemoryTransport::with_nodes([1, 2, 3]);
    replicate_manifest(&fixture.manifest, &fixture.store, &[1, 2, 3], &transport, 3)
        .expect("replicate");
    transport.set_corrupt_fetches(1, true);
    let fresh = ChunkStore::open(fixture.work.path().join("fresh"), FAST_STORE).expect("store");
    let report =
        restore_from_replicas_parallel(&fixture.manifest, &[1, 2, 3], &transport, &fresh, 3)
            .expect("fetch");
    assert_eq!(report.chunks_total, 12);
    assert_eq!(report.fetched, 12);
    assert!(report.corrupt_copies.iter().all(|(node, _)| *node == 1));
    // Each worker starts with a different holder, so the good ones share the load.
    assert!(transport.fetch_calls(2) > 0 && transport.fetch_calls(3) > 0);
    let dest = restore_dir(&fixture, &fresh, "parallel-restore");
    same_file(
        &fixture.work.path().join("source/shards/0.bin"),
        &dest.join("shards/0.bin"),
    );
    transport.set_down(2, true);
    transport.set_down(3, true);
    let empty = ChunkStore::open(fixture.work.path().join("empty"), FAST_STORE).expect("store");
    assert!(matches!(
        restore_from_replicas_parallel(&fixture.manifest, &[1, 2, 3], &transport, &empty, 4),
        Err(StorageError::ChunkUnavailable { .. })
    ));
}

#[test]
fn nearest_restore_asks_only_the_near_holders_until_they_fail() {
    let fixture = fixture();
    let transport = MemoryTransport::with_nodes([1, 2, 3]);
    replicate_manifest(&fixture.manifest, &fixture.store, &[1, 2, 3], &transport, 3)
        .expect("replicate");
    // Holders nearest first: 2 and 3 are near, 1 is far.
    let fresh = ChunkStore::open(fixture.work.path().join("near"), FAST_STORE).expect("store");
    let report =
        restore_from_nearest_replicas(&fixture.manifest, &[2, 3, 1], 2, &transport, &fresh, 4)
            .expect("fetch");
    assert_eq!(report.fetched, 12);
    assert_eq!(transport.fetch_calls(1), 0);
    assert!(transport.fetch_calls(2) > 0 && transport.fetch_calls(3) > 0);
    // The near ones gone, the far one serves everything.
    transport.set_down(2, true);
    transport.set_down(3, true);
    let again = ChunkStore::open(fixture.work.path().join("far"), FAST_STORE).expect("store");
    let report =
        restore_from_nearest_replicas(&fixture.manifest, &[2, 3, 1], 2, &transport, &again, 4)
            .expect("fetch");
    assert_eq!(report.fetched, 12);
    assert_eq!(transport.fetch_calls(1), 12);
}

#[test]
fn no_good_copy_is_a_typed_error_listing_every_attempt() {
    let fixture = fixture();
    let transport = MemoryTransport::with_nodes([1, 2]);
    replicate_manifest(&fixture.manifest, &fixture.store, &[1, 2], &transport, 2)
        .expect("replicate");
    transport.set_corrupt_fetches(1, true);
    transport.set_down(2, true);
    let fresh = ChunkStore::open(fixture.work.path().join("fresh"), FAST_STORE).expect("store");
    match restore_from_replicas(&fixture.manifest, &[1, 2], &transport, &fresh) {
        Err(StorageError::ChunkUnavailable { attempts, .. }) => {
            assert_eq!(attempts.len(), 2);
            assert_eq!(attempts[0].0, 1);
            assert_eq!(attempts[1].0, 2);
        }
        other => panic!("expected ChunkUnavailable, got {other:?}"),
    }
    assert_eq!(fresh.stats().chunks, 0, "no unverified bytes were stored");
}

#[test]
fn receiver_rejects_forged_push() {
    let transport = MemoryTransport::with_nodes([1]);
    let good = shoal_storage::encode_chunk(b"real content").expect("encode");
    let mut bytes = good.bytes().to_vec();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    let forged = shoal_storage::EncodedChunk::from_wire(good.id(), bytes).expect("frame");
    assert!(matches!(
        transport.push(1, &forged),
        Err(TransportError::Rejected { node: 1, .. })
    ));
    assert!(transport.chunk_ids(1).is_empty());
}

#[test]
fn a_chain_sends_each_chunk_once_from_the_source_and_skips_a_dead_node() {
    let fixture = fixture();
    let transport = MemoryTransport::with_nodes([1, 2, 3]);
    let frame_bytes: u64 = fixture
        .manifest
        .unique_chunks()
        .iter()
        .map(|c| {
            fixture
                .store
                .get_encoded(&c.id)
                .expect("local")
                .stored_len()
        })
        .sum();
    let report = replicate_chained(
        &fixture.manifest,
        &fixture.store,
        &[1, 2, 3],
        &transport,
        2,
        4,
    )
    .expect("replicate");
    assert!(report.quorum_reached);
    assert_eq!(report.complete_nodes(), vec![1, 2, 3]);
    for node in [1, 2, 3] {
        assert!(holds_everything(&transport, node, &fixture.manifest));
    }
    assert_eq!(
        report.source_bytes, frame_bytes,
        "one copy leaves the source"
    );
    assert_eq!(
        report.targets.iter().map(|t| t.bytes_pushed).sum::<u64>(),
        3 * frame_bytes
    );
    // The plain fan-out sends three copies, for comparison.
    let fanout = MemoryTransport::with_nodes([1, 2, 3]);
    let plain = replicate_manifest(&fixture.manifest, &fixture.store, &[1, 2, 3], &fanout, 2)
        .expect("replicate");
    assert_eq!(plain.source_bytes, 3 * frame_bytes);

    // The chain's head is down: the source sends to the next node instead
    // (two sends per chunk), the head is reported, the quorum still holds.
    let transport = MemoryTransport::with_nodes([1, 2, 3]);
    transport.set_down(1, true);
    let report = replicate_chained(
        &fixture.manifest,
        &fixture.store,
        &[1, 2, 3],
        &transport,
        2,
        3,
    )
    .expect("replicate");
    assert!(report.quorum_reached);
    assert_eq!(report.complete_nodes(), vec![2, 3]);
    assert!(matches!(
        report.failed_nodes()[..],
        [(1, TransportError::Unreachable { node: 1, .. })]
    ));
    assert!(report.source_bytes <= 2 * frame_bytes);

    // A full middle node is skipped; the others complete; a re-run after it
    // has room sends only to it, and only one copy leaves the source.
    let transport = MemoryTransport::with_nodes([1, 2, 3]);
    transport.set_capacity(2, Some(1));
    let report = replicate_chained(
        &fixture.manifest,
        &fixture.store,
        &[1, 2, 3],
        &transport,
        2,
        2,
    )
    .expect("replicate");
    assert_eq!(report.complete_nodes(), vec![1, 3]);
    transport.set_capacity(2, None);
    let report = replicate_chained(
        &fixture.manifest,
        &fixture.store,
        &[1, 2, 3],
        &transport,
        3,
        2,
    )
    .expect("replicate again");
    assert_eq!(report.complete_nodes(), vec![1, 2, 3]);
    assert_eq!(report.targets[0].chunks_pushed, 0);
    assert_eq!(report.targets[2].chunks_pushed, 0);
    assert_eq!(report.source_bytes, frame_bytes);
}
