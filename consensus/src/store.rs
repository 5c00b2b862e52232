//! openraft storage on redb: one database file per node holding the log, the
//! vote, the committed index and the latest state-machine snapshot.
//!
//! The state machine itself lives in memory (the ledger is small: members,
//! tenants, jobs, manifests' ids — never bulk data). It is rebuilt at start-up
//! from the last snapshot plus the committed log, which openraft replays
//! because we persist the committed index.
//!
//! Every redb write transaction commits with fsync (redb's default
//! durability), and openraft batches appends, so one fsync covers many
//! client writes under load.

// openraft fixes `StorageError` as the error type of every storage method;
// it is large, but boxing it is not ours to choose.
#![allow(clippy::result_large_err)]

use crate::ledger::{ApplyChecks, Ledger, LedgerResponse};
use crate::types::{
    Entry, LogId, NodeId, SnapshotMeta, StorageError, StoredMembership, TypeConfig, Vote,
};
use openraft::storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine, Snapshot};
use openraft::{
    EntryPayload, ErrorSubject, ErrorVerb, RaftLogReader, RaftSnapshotBuilder, StorageIOError,
};
use redb::{Database, Durability, ReadableTable, TableDefinition};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::io::Cursor;
use std::ops::RangeBounds;
use std::path::Path;
use std::sync::{Arc, RwLock};

pub(crate) const LOGS: TableDefinition<u64, &[u8]> = TableDefinition::new("raft_log");
pub(crate) const META: TableDefinition<&str, &[u8]> = TableDefinition::new("raft_meta");
pub(crate) const SNAPSHOT: TableDefinition<&str, &[u8]> = TableDefinition::new("snapshot");

pub(crate) const KEY_VOTE: &str = "vote";
pub(crate) const KEY_COMMITTED: &str = "committed";
pub(crate) const KEY_PURGED: &str = "last_purged";
pub(crate) const KEY_SNAP_META: &str = "meta";
pub(crate) const KEY_SNAP_DATA: &str = "data";

/// Version byte in front of every snapshot so that an old binary refuses a
/// newer snapshot with a clear error instead of misreading it.
/// Version 2 added tenants and jobs to the ledger; version 3 gave API
/// tokens a tenant; version 4 gave job specs memory and CPUs per rank,
/// members their isolation, tenants ledger limits, events a resource and a
/// repeat count, tokens ids, uses, expiry and revocation, and took the CA
/// private key out of the cluster record; version 5 says whether a
/// member's API is HTTPS; version 6 added the CA state (a rotation in
/// progress, retired CAs, what each member trusts); version 7 gave members
/// their release and the protocol versions they speak; version 8 gave job
/// specs `requeue`, allocations their OOM-killed ranks, and job states
/// `timeout`, `node_fail` and `out_of_memory`; version 9 gave job specs
/// their tasks per node, dependencies and warning signal, jobs their hold,
/// and the ledger its peer regions (federation); version 10 gave job specs
/// their node choice (nodelist, exclude, exclusive) and a hold at submit,
/// allocations their signals and master port, and the workload its users;
/// version 11 gave job specs their checkpoint copies (`--ckpt-replicas
/// L+R`), checkpoints the regions holding them, and the federation state
/// the copies sent and held; version 12 gave the ledger the answers of
/// recent routed writes (`recent_writes`, exactly-once retries), then its
/// last field, so a version 11 snapshot decodes as itself with an empty
/// table appended; version 13 gave the ledger the tenants capped across
/// regions (`global_caps`), appended empty to older snapshots the same
/// way; version 14 gave it which members may vote (`voter_eligibility`)
/// and the jobs an admin holds (`admin_holds`), now its last fields.
pub const SNAPSHOT_VERSION: u8 = 14;
/// The oldest snapshot version this binary decodes.
const OLDEST_DECODED_VERSION: u8 = 11;
/// Decoding bound for snapshots and log entries.
pub const MAX_DECODE: u64 = 1 << 30;

fn io_err(
    subject: ErrorSubject<NodeId>,
    verb: ErrorVerb,
    e: impl std::fmt::Display,
) -> StorageError {
    StorageIOError::new(subject, verb, openraft::AnyError::error(e.to_string())).into()
}

pub(crate) fn read_err(e: impl std::fmt::Display) -> StorageError {
    io_err(ErrorSubject::Store, ErrorVerb::Read, e)
}

pub(crate) fn write_err(e: impl std::fmt::Display) -> StorageError {
    io_err(ErrorSubject::Store, ErrorVerb::Write, e)
}

fn bincode_opts() -> impl bincode::Options {
    use bincode::Options;
    bincode::DefaultOptions::new()
        .with_fixint_encoding()
        .allow_trailing_bytes()
        .with_limit(MAX_DECODE)
}

pub fn encode<T: Serialize>(v: &T) -> Result<Vec<u8>, bincode::Error> {
    use bincode::Options;
    bincode_opts().serialize(v)
}

pub fn decode<T: for<'de> Deserialize<'de>>(b: &[u8]) -> Result<T, bincode::Error> {
    use bincode::Options;
    bincode_opts().deserialize(b)
}

/// Opens (or creates) the node's Raft database.
/// Opens (or creates) the node's Raft database, readable by its owner only:
/// it holds every tenant's metadata and, today, the cluster CA.
pub fn open_db(path: &Path) -> Result<Arc<Database>, redb::DatabaseError> {
    let db = Database::create(path)?;
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))
        .map_err(|e| redb::DatabaseError::Storage(redb::StorageError::Io(e)))?;
    Ok(Arc::new(db))
}

/// The log store. Clones share the database, which is how openraft's
/// replication tasks get their readers.
#[derive(Clone)]
pub struct LogStore {
    db: Arc<Database>,
    /// The latest committed index not yet written: it goes into the next
    /// write transaction (an append, a vote, a truncation or a purge)
    /// instead of a transaction of its own on every commit.
    unsaved_committed: Arc<std::sync::Mutex<Option<Option<LogId>>>>,
    on_append: Option<AppendObserver>,
}

/// Called with the time each durable write of log entries took (its redb
/// transaction and fsync): the disk's share of a write's latency, on the
/// leader and on every follower.
pub type AppendObserver = Arc<dyn Fn(std::time::Duration) + Send + Sync>;

impl LogStore {
    pub fn new(db: Arc<Database>) -> Result<Self, StorageError> {
        let tx = db.begin_write().map_err(write_err)?;
        tx.open_table(LOGS).map_err(write_err)?;
        tx.open_table(META).map_err(write_err)?;
        tx.commit().map_err(write_err)?;
        Ok(LogStore {
            db,
            unsaved_committed: Arc::default(),
            on_append: None,
        })
    }

    /// The store, calling `observer` after each durable write of entries.
    pub fn with_append_observer(mut self, observer: AppendObserver) -> Self {
        self.on_append = Some(observer);
        self
    }

    /// A write transaction that also carries the committed index held back
    /// by `save_committed`.
    fn begin_write(&self) -> Result<redb::WriteTransaction, StorageError> {
        let tx = self.db.begin_write().map_err(write_err)?;
        let unsaved = match self.unsaved_committed.lock() {
            Ok(mut g) => g.take(),
            Err(poisoned) => poisoned.into_inner().take(),
        };
        if let Some(committed) = unsaved {
            let bytes = encode(&committed).map_err(write_err)?;
            let mut t = tx.open_table(META).map_err(write_err)?;
            t.insert(KEY_COMMITTED, bytes.as_slice())
                .map_err(write_err)?;
        }
        Ok(tx)
    }

    /// Writes `entries` to the log in one durable transaction.
    fn write_entries(&self, entries: impl IntoIterator<Item = Entry>) -> Result<(), StorageError> {
        let started = std::time::Instant::now();
        let tx = self.begin_write()?;
        {
            let mut t = tx.open_table(LOGS).map_err(write_err)?;
            for e in entries {
                let bytes = encode(&e).map_err(write_err)?;
                t.insert(e.log_id.index, bytes.as_slice())
                    .map_err(write_err)?;
            }
        }
        tx.commit().map_err(write_err)?;
        if let Some(observe) = &self.on_append {
            observe(started.elapsed());
        }
        Ok(())
    }

    fn get_meta<T: for<'de> Deserialize<'de>>(&self, key: &str) -> Result<Option<T>, StorageError> {
        let tx = self.db.begin_read().map_err(read_err)?;
        let t = tx.open_table(META).map_err(read_err)?;
        match t.get(key).map_err(read_err)? {
            Some(v) => Ok(Some(decode(v.value()).map_err(read_err)?)),
            None => Ok(None),
        }
    }

    fn put_meta<T: Serialize>(&self, key: &str, v: &T, durable: bool) -> Result<(), StorageError> {
        let bytes = encode(v).map_err(write_err)?;
        let mut tx = self.begin_write()?;
        if !durable {
            tx.set_durability(Durability::None);
        }
        {
            let mut t = tx.open_table(META).map_err(write_err)?;
            t.insert(key, bytes.as_slice()).map_err(write_err)?;
        }
        tx.commit().map_err(write_err)
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + Send>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let tx = self.db.begin_read().map_err(read_err)?;
        let t = tx.open_table(LOGS).map_err(read_err)?;
        let mut out = Vec::new();
        for item in t.range(range).map_err(read_err)? {
            let (_, v) = item.map_err(read_err)?;
            out.push(decode(v.value()).map_err(read_err)?);
        }
        Ok(out)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let last_purged: Option<LogId> = self.get_meta(KEY_PURGED)?;
        let tx = self.db.begin_read().map_err(read_err)?;
        let t = tx.open_table(LOGS).map_err(read_err)?;
        let last = match t.last().map_err(read_err)? {
            Some((_, v)) => {
                let e: Entry = decode(v.value()).map_err(read_err)?;
                Some(e.log_id)
            }
            None => last_purged,
        };
        Ok(LogState {
            last_purged_log_id: last_purged,
            last_log_id: last,
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.put_meta(KEY_VOTE, vote, true)
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        self.get_meta(KEY_VOTE)
    }

    /// The committed index only lets a restarting node re-apply its log
    /// before hearing from the leader (and `recovery` report how much of
    /// the log was past it); a value that lags is harmless, so it is held
    /// in memory and rides along with the next write transaction (on a busy
    /// node, the next append) instead of costing a redb commit of its own
    /// every time the index moves: 8-9 % more single-client writes/s
    /// (docs/BENCHMARKS.md).
    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        match self.unsaved_committed.lock() {
            Ok(mut g) => *g = Some(committed),
            Err(poisoned) => *poisoned.into_inner() = Some(committed),
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        let unsaved = match self.unsaved_committed.lock() {
            Ok(g) => *g,
            Err(poisoned) => *poisoned.into_inner(),
        };
        match unsaved {
            Some(committed) => Ok(committed),
            None => Ok(self.get_meta::<Option<LogId>>(KEY_COMMITTED)?.flatten()),
        }
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let res = self.write_entries(entries);
        callback.log_io_completed(
            res.as_ref()
                .map(|_| ())
                .map_err(|e| std::io::Error::other(e.to_string())),
        );
        res
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let tx = self.begin_write()?;
        {
            let mut t = tx.open_table(LOGS).map_err(write_err)?;
            t.retain_in(log_id.index.., |_, _| false)
                .map_err(write_err)?;
        }
        tx.commit().map_err(write_err)
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let bytes = encode(&log_id).map_err(write_err)?;
        // Purging is lazy by nature: if a crash undoes it, the entries are
        // simply purged again later.
        let mut tx = self.begin_write()?;
        tx.set_durability(Durability::None);
        {
            let mut meta = tx.open_table(META).map_err(write_err)?;
            meta.insert(KEY_PURGED, bytes.as_slice())
                .map_err(write_err)?;
            let mut t = tx.open_table(LOGS).map_err(write_err)?;
            t.retain_in(..=log_id.index, |_, _| false)
                .map_err(write_err)?;
        }
        tx.commit().map_err(write_err)
    }
}

/// What the state machine holds: the ledger plus the Raft bookkeeping that
/// must be snapshotted with it.
#[derive(Serialize, Deserialize, Clone, Debug, Default)]
pub struct StateMachineData {
    pub last_applied: Option<LogId>,
    pub membership: StoredMembership,
    pub ledger: Ledger,
}

/// Shared read access to the applied ledger for the rest of the node.
pub type LedgerHandle = Arc<RwLock<StateMachineData>>;

/// Called after every entry a replica applies, with the entry's index and
/// the ledger it left: how a chaos run checks invariants at every index of
/// every node's log, not only in the states it happens to sample.
pub type ApplyObserver = Arc<dyn Fn(u64, &Ledger) + Send + Sync>;

/// The state-machine store: the in-memory ledger and its durable snapshot.
pub struct StateMachineStore {
    db: Arc<Database>,
    data: LedgerHandle,
    snapshot_seq: u64,
    checks: ApplyChecks,
    observer: Option<ApplyObserver>,
}

/// The snapshot encoding: the version byte, then the zstd-compressed
/// bincode of the state machine. Backups (`shoal snapshot save`) carry
/// exactly these bytes.
pub fn encode_snapshot(data: &StateMachineData) -> Result<Vec<u8>, StorageError> {
    let plain = encode(data).map_err(write_err)?;
    let mut out = vec![SNAPSHOT_VERSION];
    out.extend(zstd::encode_all(plain.as_slice(), 3).map_err(write_err)?);
    Ok(out)
}

/// Decodes [`encode_snapshot`]'s bytes; a version this binary does not
/// know is a clear error.
pub fn decode_snapshot(bytes: &[u8]) -> Result<StateMachineData, StorageError> {
    match bytes.split_first() {
        Some((&v, body)) if (OLDEST_DECODED_VERSION..=SNAPSHOT_VERSION).contains(&v) => {
            let mut plain = Vec::new();
            let mut dec = zstd::Decoder::new(body).map_err(read_err)?;
            std::io::Read::read_to_end(&mut std::io::Read::take(&mut dec, MAX_DECODE), &mut plain)
                .map_err(read_err)?;
            // The ledger is the last field of the state machine, and the
            // fields each version added are the last of the ledger.
            if v <= 11 {
                plain.extend(
                    encode(&crate::once::RecentWrites::<LedgerResponse>::default())
                        .map_err(read_err)?,
                );
            }
            if v <= 12 {
                let none: BTreeMap<String, crate::escrow::GlobalCap> = BTreeMap::new();
                plain.extend(encode(&none).map_err(read_err)?);
            }
            if v <= 13 {
                let every_member_eligible = crate::voters::VoterEligibility::default();
                plain.extend(encode(&every_member_eligible).map_err(read_err)?);
                let no_admin_holds: std::collections::BTreeSet<crate::workload::JobId> =
                    std::collections::BTreeSet::new();
                plain.extend(encode(&no_admin_holds).map_err(read_err)?);
            }
            decode(&plain).map_err(read_err)
        }
        Some((v, _)) if *v > SNAPSHOT_VERSION => Err(read_err(format!(
            "snapshot format version {v} is newer than this binary understands ({SNAPSHOT_VERSION})"
        ))),
        Some((v, _)) => Err(read_err(format!(
            "snapshot format version {v} predates this binary ({SNAPSHOT_VERSION}); \
             re-create the cluster's data directories with this release"
        ))),
        None => Err(read_err("empty snapshot")),
    }
}

impl StateMachineStore {
    /// Opens the store and loads the last snapshot, if any.
    pub fn new(db: Arc<Database>) -> Result<Self, StorageError> {
        let tx = db.begin_write().map_err(write_err)?;
        tx.open_table(SNAPSHOT).map_err(write_err)?;
        tx.commit().map_err(write_err)?;
        let mut data = StateMachineData {
            ledger: Ledger::new(),
            ..Default::default()
        };
        let mut snapshot_seq = 0;
        if let Some((meta, bytes)) = read_snapshot(&db)? {
            data = decode_snapshot(&bytes)?;
            snapshot_seq = meta.last_log_id.map(|l| l.index).unwrap_or(0);
        }
        Ok(StateMachineStore {
            db,
            data: Arc::new(RwLock::new(data)),
            snapshot_seq,
            checks: ApplyChecks::default(),
            observer: None,
        })
    }

    /// The store, calling `observer` after each entry it applies.
    pub fn with_observer(mut self, observer: Option<ApplyObserver>) -> Self {
        self.observer = observer;
        self
    }

    /// The store, applying entries with `checks` (every replica of a
    /// cluster must use the same).
    pub fn with_checks(mut self, checks: ApplyChecks) -> Self {
        self.checks = checks;
        self
    }

    pub fn handle(&self) -> LedgerHandle {
        self.data.clone()
    }

    fn write_snapshot(&self, meta: &SnapshotMeta, bytes: &[u8]) -> Result<(), StorageError> {
        let m = encode(meta).map_err(write_err)?;
        let tx = self.db.begin_write().map_err(write_err)?;
        {
            let mut t = tx.open_table(SNAPSHOT).map_err(write_err)?;
            t.insert(KEY_SNAP_META, m.as_slice()).map_err(write_err)?;
            t.insert(KEY_SNAP_DATA, bytes).map_err(write_err)?;
        }
        tx.commit().map_err(write_err)
    }
}

pub(crate) fn read_snapshot(
    db: &Database,
) -> Result<Option<(SnapshotMeta, Vec<u8>)>, StorageError> {
    let tx = db.begin_read().map_err(read_err)?;
    let t = tx.open_table(SNAPSHOT).map_err(read_err)?;
    let meta = t.get(KEY_SNAP_META).map_err(read_err)?;
    let data = t.get(KEY_SNAP_DATA).map_err(read_err)?;
    match (meta, data) {
        (Some(m), Some(d)) => Ok(Some((
            decode(m.value()).map_err(read_err)?,
            d.value().to_vec(),
        ))),
        _ => Ok(None),
    }
}

/// Applies one log entry to the state machine: what every replica does
/// with each committed entry.
pub(crate) fn apply_entry(
    d: &mut StateMachineData,
    e: Entry,
    checks: &ApplyChecks,
) -> LedgerResponse {
    d.last_applied = Some(e.log_id);
    match e.payload {
        EntryPayload::Blank => LedgerResponse::Ok,
        EntryPayload::Normal(req) => d.ledger.apply_with(e.log_id.index, &req, checks),
        EntryPayload::Membership(m) => {
            d.membership = StoredMembership::new(Some(e.log_id), m);
            LedgerResponse::Ok
        }
    }
}

/// Builds snapshots from a copy of the state taken under the lock, so the
/// state machine keeps applying while the snapshot is encoded.
pub struct SnapshotBuilder {
    db: Arc<Database>,
    data: LedgerHandle,
    seq: u64,
}

impl RaftSnapshotBuilder<TypeConfig> for SnapshotBuilder {
    async fn build_snapshot(&mut self) -> Result<Snapshot<TypeConfig>, StorageError> {
        let copy = self
            .data
            .read()
            .map_err(|e| read_err(e.to_string()))?
            .clone();
        let bytes = encode_snapshot(&copy)?;
        let snapshot_id = match copy.last_applied {
            Some(l) => format!("{}-{}-{}", l.leader_id, l.index, self.seq),
            None => format!("--{}", self.seq),
        };
        let meta = SnapshotMeta {
            last_log_id: copy.last_applied,
            last_membership: copy.membership.clone(),
            snapshot_id,
        };
        let store = StateMachineStore {
            db: self.db.clone(),
            data: self.data.clone(),
            snapshot_seq: self.seq,
            checks: ApplyChecks::default(),
            observer: None,
        };
        store.write_snapshot(&meta, &bytes)?;
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
    }
}

impl RaftStateMachine<TypeConfig> for StateMachineStore {
    type SnapshotBuilder = SnapshotBuilder;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let d = self.data.read().map_err(|e| read_err(e.to_string()))?;
        Ok((d.last_applied, d.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<LedgerResponse>, StorageError>
    where
        I: IntoIterator<Item = Entry> + Send,
        I::IntoIter: Send,
    {
        let mut d = self.data.write().map_err(|e| write_err(e.to_string()))?;
        Ok(entries
            .into_iter()
            .map(|e| {
                let index = e.log_id.index;
                let response = apply_entry(&mut d, e, &self.checks);
                if let Some(observe) = &self.observer {
                    observe(index, &d.ledger);
                }
                response
            })
            .collect())
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.snapshot_seq += 1;
        SnapshotBuilder {
            db: self.db.clone(),
            data: self.data.clone(),
            seq: self.snapshot_seq,
        }
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let mut new = decode_snapshot(&bytes)?;
        new.last_applied = meta.last_log_id;
        new.membership = meta.last_membership.clone();
        self.write_snapshot(meta, &bytes)?;
        let mut d = self.data.write().map_err(|e| write_err(e.to_string()))?;
        *d = new;
        if let (Some(observe), Some(last)) = (&self.observer, meta.last_log_id) {
            observe(last.index, &d.ledger);
        }
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot<TypeConfig>>, StorageError> {
        Ok(read_snapshot(&self.db)?.map(|(meta, bytes)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use openraft::testing::{StoreBuilder, Suite};

    #[test]
    fn the_raft_database_is_private_to_the_agent() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().expect("dir");
        let path = dir.path().join("raft.redb");
        drop(open_db(&path).expect("open"));
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    }

    struct RedbBuilder;

    impl StoreBuilder<TypeConfig, LogStore, StateMachineStore, tempfile::TempDir> for RedbBuilder {
        async fn build(
            &self,
        ) -> Result<(tempfile::TempDir, LogStore, StateMachineStore), StorageError> {
            let dir = tempfile::tempdir().map_err(write_err)?;
            let db = open_db(&dir.path().join("raft.redb")).map_err(write_err)?;
            Ok((dir, LogStore::new(db.clone())?, StateMachineStore::new(db)?))
        }
    }

    /// The committed index costs no transaction of its own: it is read back
    /// at once, and reaches the disk with the next append.
    #[test]
    fn the_committed_index_rides_along_with_the_next_append() -> Result<(), StorageError> {
        use openraft::{CommittedLeaderId, EntryPayload};
        let dir = tempfile::tempdir().map_err(write_err)?;
        let path = dir.path().join("raft.redb");
        let at = |index| LogId::new(CommittedLeaderId::new(1, 1), index);
        let entry = |index| Entry {
            log_id: at(index),
            payload: EntryPayload::Blank,
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .map_err(write_err)?;
        rt.block_on(async {
            let db = open_db(&path).map_err(write_err)?;
            let mut logs = LogStore::new(db.clone())?;
            logs.write_entries([entry(1), entry(2)])?;
            logs.save_committed(Some(at(2))).await?;
            assert_eq!(logs.read_committed().await?, Some(at(2)));
            let fresh = LogStore::new(db.clone())?.read_committed().await?;
            assert_eq!(fresh, None, "not written until the next append");
            logs.write_entries([entry(3)])?;
            drop(logs);
            drop(db);
            let db = open_db(&path).map_err(write_err)?;
            assert_eq!(LogStore::new(db)?.read_committed().await?, Some(at(2)));
            Ok(())
        })
    }

    /// openraft's own conformance suite against our redb stores.
    #[test]
    fn openraft_storage_suite_passes() -> Result<(), StorageError> {
        Suite::test_all(RedbBuilder)
    }

    /// Version 11 and 12 snapshots are the current one without the (then
    /// empty) fields added since at the ledger's end, and decode to the
    /// same state.
    #[test]
    fn older_snapshots_decode_with_the_newer_fields_empty() {
        let mut data = StateMachineData::default();
        data.ledger.attrs.insert("k".into(), "v".into());
        data.ledger.next_node_id = 4;
        let plain = encode(&data).expect("encode");
        let table =
            encode(&crate::once::RecentWrites::<LedgerResponse>::default()).expect("encode");
        let caps = encode(&data.ledger.global_caps).expect("encode");
        let eligibility = encode(&data.ledger.voter_eligibility).expect("encode");
        let holds = encode(&data.ledger.admin_holds).expect("encode");
        let v13 = &plain[..plain.len() - eligibility.len() - holds.len()];
        let v12 = &v13[..v13.len() - caps.len()];
        let v11 = &v12[..v12.len() - table.len()];
        for (version, body) in [(11u8, v11), (12, v12), (13, v13)] {
            let mut bytes = vec![version];
            bytes.extend(zstd::encode_all(body, 3).expect("zstd"));
            let old = decode_snapshot(&bytes).expect("an older snapshot");
            assert_eq!(old.ledger, data.ledger, "version {version}");
            assert!(old.ledger.recent_writes.is_empty());
            assert!(old.ledger.global_caps.is_empty());
        }
        let current = encode_snapshot(&data).expect("encode");
        assert_eq!(current[0], SNAPSHOT_VERSION);
        assert_eq!(
            decode_snapshot(&current).expect("decode").ledger,
            data.ledger
        );
    }

    #[test]
    fn snapshot_with_unknown_version_is_refused() {
        let err = decode_snapshot(&[SNAPSHOT_VERSION + 1, 1, 2, 3]).expect_err("must refuse");
        let want = format!("version {}", SNAPSHOT_VERSION + 1);
        assert!(err.to_string().contains(&want), "{err}");
    }
}
