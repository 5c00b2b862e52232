//! Disaster recovery of a data dir, offline (no agent runs on it):
//!
//! - [`restore`]: a ledger backup (`shoal snapshot save`) into a new data
//!   dir, as the only member of a new one-voter cluster;
//! - [`inspect`] then [`force_new_cluster`]: a stopped survivor's own
//!   ledger, when a majority of the voters is gone for good, becomes a
//!   one-voter cluster of that node alone, keeping its identity.
//!
//! Both keep every tenant, job, `mesh:/` object, checkpoint record and API
//! token of the ledger; every other member is marked left (so nothing is
//! placed on it, its certificate is refused, and its gangs are requeued
//! from their latest checkpoint by the same path as any lost node), and
//! the join tokens made for the old cluster are revoked. Other nodes then
//! join the recovered one with new join tokens and empty data dirs.
//!
//! The cluster CA key is not in the ledger (voters keep it on disk). A
//! recovery keeps the cluster's CA when it has the key (the survivor's own
//! `ca.key`, or `--ca-key` from a surviving voter's data dir); without it
//! it makes a new CA and puts its certificate in the ledger, which makes
//! every certificate of the old cluster worthless — harmless, since every
//! other node joins again anyway.

use crate::backup;
use crate::identity::{self, Identity, RuntimeInfo};
use crate::trust::ca_key;
use serde::Serialize;
use shoal_consensus::recovery::{self, LocalState, Reseated, Survivor};
use shoal_consensus::store::{open_db, LogStore, StateMachineStore};
use shoal_consensus::types::Vote;
use shoal_consensus::{MemberSpec, NodeId};
use shoal_mesh::CaBundle;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What a restore is asked to make.
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    pub file: PathBuf,
    pub data_dir: PathBuf,
    /// The new node's name.
    pub name: String,
    /// Where peers reach its RPC (Raft, joins); the agent corrects the
    /// record if it starts elsewhere.
    pub rpc_addr: SocketAddr,
    pub api_addr: SocketAddr,
    pub api_tls: bool,
    /// A copy of the cluster CA key (a voter's `<data-dir>/ca.key`); None
    /// makes a new CA.
    pub ca_key: Option<PathBuf>,
    pub cert_lifetime: Duration,
}

/// What a restore or a forced new cluster did (`--json`).
#[derive(Clone, Debug, Serialize)]
pub struct RecoveryReport {
    pub data_dir: String,
    pub cluster_id: String,
    /// The log index the recovered ledger is as of.
    pub index: u64,
    pub term: u64,
    pub node_id: NodeId,
    pub name: String,
    pub rpc_addr: String,
    /// Members marked left.
    pub removed: Vec<String>,
    /// Jobs that lost their nodes and wait to be placed again.
    pub requeued: Vec<u64>,
    /// Jobs that lost their nodes with no restarts left.
    pub failed: Vec<u64>,
    pub join_tokens_revoked: usize,
    /// `kept` (the old CA key was at hand) or `new`.
    pub ca: String,
    pub jobs: usize,
    pub tenants: usize,
    pub objects: usize,
    pub api_tokens: usize,
    /// Log entries applied that were past the last commit index the node
    /// knew of (force-new-cluster only).
    pub entries_past_commit: u64,
    /// Where the database was before (force-new-cluster only).
    pub previous_db: Option<String>,
}

fn counts(report: &mut RecoveryReport, data: &shoal_consensus::store::StateMachineData) {
    report.jobs = data.ledger.workload.jobs.len();
    report.tenants = data.ledger.workload.tenants.len();
    report.objects = data.ledger.namespace.objects.len();
    report.api_tokens = data.ledger.api_tokens.len();
}

fn reseated_report(
    data_dir: &Path,
    data: &shoal_consensus::store::StateMachineData,
    r: &Reseated,
    name: &str,
    rpc_addr: &str,
    new_ca: bool,
) -> RecoveryReport {
    let at = data.last_applied;
    let mut report = RecoveryReport {
        data_dir: data_dir.display().to_string(),
        cluster_id: data
            .ledger
            .cluster
            .as_ref()
            .map(|c| c.cluster_id.clone())
            .unwrap_or_default(),
        index: at.map_or(0, |l| l.index),
        term: at.map_or(0, |l| l.leader_id.term),
        node_id: r.node_id,
        name: name.to_string(),
        rpc_addr: rpc_addr.to_string(),
        removed: r.removed.iter().map(|(_, n)| n.clone()).collect(),
        requeued: r.requeued.clone(),
        failed: r.failed.clone(),
        join_tokens_revoked: r.join_tokens_revoked.len(),
        ca: if new_ca { "new" } else { "kept" }.into(),
        jobs: 0,
        tenants: 0,
        objects: 0,
        api_tokens: 0,
        entries_past_commit: 0,
        previous_db: None,
    };
    counts(&mut report, data);
    report
}

/// A copy of the cluster CA key from `path`, checked against the ledger's CA.
fn ca_from_file(path: &Path, ca_cert_pem: &str) -> Result<CaBundle, String> {
    let file = std::fs::read_to_string(path)
        .map_err(|e| format!("cannot read the CA key {}: {e}", path.display()))?;
    // A voter's ca.key holds two keys during a rotation: take the one of
    // the ledger's CA.
    ca_key::split_keys(&file)
        .into_iter()
        .map(|key_pem| CaBundle {
            cert_pem: ca_cert_pem.to_string(),
            key_pem,
        })
        .find(CaBundle::key_matches)
        .ok_or_else(|| {
            format!(
                "the CA key in {} is not the key of this cluster's CA",
                path.display()
            )
        })
}

fn ledger_ca(data: &shoal_consensus::store::StateMachineData) -> Result<String, String> {
    data.ledger
        .cluster
        .as_ref()
        .map(|c| c.ca_cert_pem.clone())
        .ok_or_else(|| "the ledger has no cluster record".to_string())
}

/// Refuses a data dir that holds anything.
fn check_empty(dir: &Path) -> Result<(), String> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => match entries.next() {
            None => Ok(()),
            Some(_) => Err(format!(
                "{} is not empty: a restore writes only into a new or empty data dir",
                dir.display()
            )),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotADirectory => {
            Err(format!("{} is not a directory", dir.display()))
        }
        Err(e) => Err(format!("cannot read {}: {e}", dir.display())),
    }
}

/// Restores the backup `o.file` into the new data dir `o.data_dir`: its
/// ledger as of the backup, with one member — a new node named `o.name`
/// with a fresh identity — as the only voter. Nothing is written unless
/// the backup checks out and every part is ready: the data dir is built
/// beside its destination and renamed into place.
pub fn restore(o: &RestoreOptions) -> Result<RecoveryReport, String> {
    check_empty(&o.data_dir)?;
    shoal_consensus::ledger::validate_name(&o.name)?;
    let (header, mut data) = backup::read_file(&o.file)?;
    let gossip_key = shoal_mesh::gossip::Keypair::generate_ed25519();
    let gossip_bytes = gossip_key
        .to_protobuf_encoding()
        .map_err(|e| format!("cannot encode a gossip key: {e}"))?;
    let spec = MemberSpec {
        name: o.name.clone(),
        rpc_addr: o.rpc_addr.to_string(),
        api_addr: o.api_addr.to_string(),
        api_tls: o.api_tls,
        gossip_peer_id: gossip_key.public().to_peer_id().to_string(),
        ..Default::default()
    };
    let rpc_addr = o.rpc_addr.to_string();
    let why = format!(
        "restored from the snapshot of cluster {} at index {} taken on {} ({})",
        header.cluster_id, header.index, header.node, header.created_at
    );
    let now = crate::clock::wall_ms();
    let reseated = recovery::reseat(
        &mut data,
        Survivor::New(Box::new(spec)),
        &rpc_addr,
        now,
        &why,
        &super::apply_checks(),
    )?;
    let (ca, new_ca) = match &o.ca_key {
        Some(path) => (ca_from_file(path, &ledger_ca(&data)?)?, false),
        None => {
            let ca = CaBundle::generate(&header.cluster_id).map_err(|e| e.to_string())?;
            recovery::replace_ca_cert(&mut data, &ca.cert_pem)?;
            (ca, true)
        }
    };
    let credentials = ca
        .issue_for(&o.name, reseated.node_id, o.cert_lifetime)
        .map_err(|e| format!("cannot issue the node's certificate: {e}"))?;
    let ident = Identity {
        node_id: reseated.node_id,
        name: o.name.clone(),
        cluster_id: header.cluster_id.clone(),
        credentials,
    };
    let vote = Vote::new(header.term, reseated.node_id);

    let staging = staging_dir(&o.data_dir)?;
    // What an interrupted restore of this pid left.
    let _ = std::fs::remove_dir_all(&staging);
    let built = (|| -> Result<(), String> {
        identity::ensure_data_dir(&staging)
            .map_err(|e| format!("cannot create {}: {e}", staging.display()))?;
        identity::save_identity(&staging, &ident)?;
        ca_key::store(&staging, &ca.key_pem)
            .map_err(|e| format!("cannot write the CA key: {e}"))?;
        identity::write_private(
            &staging.join(identity::GOSSIP_KEY_FILE),
            &gossip_bytes,
            0o600,
        )
        .map_err(|e| format!("cannot write the gossip key: {e}"))?;
        write_db(&staging.join(identity::RAFT_DB_FILE), &data, &vote)?;
        if o.data_dir.exists() {
            std::fs::remove_dir(&o.data_dir)
                .map_err(|e| format!("cannot replace {}: {e}", o.data_dir.display()))?;
        }
        std::fs::rename(&staging, &o.data_dir).map_err(|e| {
            format!(
                "cannot move the restored data dir into {}: {e}",
                o.data_dir.display()
            )
        })?;
        sync_parent(&o.data_dir);
        Ok(())
    })();
    if let Err(e) = built {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(e);
    }
    Ok(reseated_report(
        &o.data_dir,
        &data,
        &reseated,
        &o.name,
        &rpc_addr,
        new_ca,
    ))
}

/// A directory beside `dest` (same file system, so a rename moves it).
fn staging_dir(dest: &Path) -> Result<PathBuf, String> {
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    std::fs::create_dir_all(&parent)
        .map_err(|e| format!("cannot create {}: {e}", parent.display()))?;
    let base = dest
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "data".into());
    Ok(parent.join(format!(".{base}.restoring-{}", std::process::id())))
}

fn sync_parent(path: &Path) {
    if let Some(dir) = path.parent() {
        if let Ok(d) = std::fs::File::open(dir) {
            let _ = d.sync_all();
        }
    }
}

/// A new Raft database at `path` holding `data` alone.
fn write_db(
    path: &Path,
    data: &shoal_consensus::store::StateMachineData,
    vote: &Vote,
) -> Result<(), String> {
    let db = open_db(path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
    LogStore::new(db.clone()).map_err(|e| e.to_string())?;
    StateMachineStore::new(db.clone()).map_err(|e| e.to_string())?;
    recovery::write_as_only_state(&db, data, vote).map_err(|e| e.to_string())
}

/// The pid of the agent that runs on `data_dir`, if one does (as its
/// `agent.json` says and the process table confirms).
pub fn running_agent(data_dir: &Path) -> Option<u32> {
    let text = std::fs::read(data_dir.join(identity::RUNTIME_FILE)).ok()?;
    let info: RuntimeInfo = serde_json::from_slice(&text).ok()?;
    let pid = info.pid;
    if pid == 0 || pid == std::process::id() {
        return None;
    }
    let pid_t = libc::pid_t::try_from(pid).ok()?;
    // SAFETY: signal 0 only checks that the process exists.
    let alive = unsafe { libc::kill(pid_t, 0) } == 0
        || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM);
    if !alive {
        return None;
    }
    // A zombie has exited.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    (state != Some("Z")).then_some(pid)
}

/// A stopped node's ledger, read and held (the database stays locked
/// until the plan is carried out or dropped).
pub struct RecoverPlan {
    data_dir: PathBuf,
    db: std::sync::Arc<recovery::Database>,
    pub identity: Identity,
    pub state: LocalState,
    /// Where peers reach this node's RPC, as the Raft membership has it.
    pub rpc_addr: String,
    /// The other members that the new cluster will not have: (id, name).
    pub others: Vec<(NodeId, String)>,
}

/// Reads the ledger of the stopped node in `data_dir` for
/// [`force_new_cluster`]; changes nothing.
pub fn inspect(data_dir: &Path) -> Result<RecoverPlan, String> {
    let ident = identity::load_identity(data_dir)?.ok_or_else(|| {
        format!(
            "{} holds no node identity: there is nothing to recover",
            data_dir.display()
        )
    })?;
    if let Some(pid) = running_agent(data_dir) {
        return Err(format!(
            "an agent (pid {pid}) is running on {}: stop it first (if process {pid} is not a shoal agent, remove {})",
            data_dir.display(),
            data_dir.join(identity::RUNTIME_FILE).display()
        ));
    }
    let path = data_dir.join(identity::RAFT_DB_FILE);
    if !path.exists() {
        return Err(format!(
            "{} does not exist: there is no ledger to recover",
            path.display()
        ));
    }
    let db = match recovery::open_stopped(&path) {
        Ok(db) => db,
        Err(recovery::OpenError::InUse) => {
            return Err(format!(
                "{} is in use by another process: stop the agent on {} first",
                path.display(),
                data_dir.display()
            ))
        }
        Err(e) => return Err(format!("cannot open {}: {e}", path.display())),
    };
    let state = recovery::read_local_state(&db, &super::apply_checks())
        .map_err(|e| format!("cannot read the ledger in {}: {e}", path.display()))?;
    let ledger = &state.data.ledger;
    let cluster = ledger.cluster.as_ref().ok_or_else(|| {
        format!(
            "the ledger in {} has no cluster record: there is nothing to recover",
            path.display()
        )
    })?;
    if cluster.cluster_id != ident.cluster_id {
        return Err(format!(
            "the ledger in {} is of cluster {}, but this node belongs to {}",
            path.display(),
            cluster.cluster_id,
            ident.cluster_id
        ));
    }
    let me = ident.node_id;
    let member = ledger.members.get(&me).ok_or_else(|| {
        format!("node {me} is not in its own ledger: it never finished joining; there is nothing to recover")
    })?;
    let rpc_addr = state
        .data
        .membership
        .membership()
        .get_node(&me)
        .map(|n| n.addr.clone())
        .unwrap_or_else(|| member.spec.rpc_addr.clone());
    let others = ledger
        .active_members()
        .filter(|m| m.id != me)
        .map(|m| (m.id, m.spec.name.clone()))
        .collect();
    Ok(RecoverPlan {
        data_dir: data_dir.to_path_buf(),
        db,
        identity: ident,
        state,
        rpc_addr,
        others,
    })
}

impl RecoverPlan {
    pub fn cluster_id(&self) -> &str {
        &self.identity.cluster_id
    }

    pub fn index(&self) -> u64 {
        self.state.data.last_applied.map_or(0, |l| l.index)
    }
}

/// Makes the node of `plan` the only member and voter of its cluster:
/// its ledger (every entry it holds applied, see [`inspect`]) becomes the
/// snapshot a new one-voter Raft starts from. The old database is kept
/// beside the new one as `raft.redb.pre-recover-<unix time>`.
pub fn force_new_cluster(
    plan: RecoverPlan,
    ca_key_file: Option<&Path>,
    cert_lifetime: Duration,
) -> Result<RecoveryReport, String> {
    let RecoverPlan {
        data_dir,
        db,
        identity: ident,
        mut state,
        rpc_addr,
        ..
    } = plan;
    let me = ident.node_id;
    let now = crate::clock::wall_ms();
    let reseated = recovery::reseat(
        &mut state.data,
        Survivor::Member(me),
        &rpc_addr,
        now,
        "forced a new cluster (shoal recover --force-new-cluster)",
        &super::apply_checks(),
    )?;

    // The CA: the ledger's when its key is at hand, else the one this
    // node's certificate chains to (a rerun after an interrupted
    // recovery), else a new one.
    let ledger_cert = ledger_ca(&state.data)?;
    // Keys one by one (two during a CA rotation), against single
    // certificates: the node's trust bundle is never taken for a CA.
    let own_ledger_key = ca_key::key_for(&data_dir, &ledger_cert);
    let own_signer = shoal_mesh::tls::split_certs(&ident.credentials.ca_pem)
        .into_iter()
        .filter(|c| shoal_mesh::tls::issued_by(&ident.credentials.cert_pem, c))
        .find(|c| ca_key::key_for(&data_dir, c).is_some());
    let mut new_ident = None;
    let mut key_to_store = None;
    let new_ca = match (&own_ledger_key, &own_signer, ca_key_file) {
        (Some(_), _, _) => false,
        (None, Some(signer), _) => {
            recovery::replace_ca_cert(&mut state.data, signer)?;
            false
        }
        (None, None, Some(path)) => {
            let ca = ca_from_file(path, &ledger_cert)?;
            key_to_store = Some(ca.key_pem);
            false
        }
        _ => {
            let ca = CaBundle::generate(&ident.cluster_id).map_err(|e| e.to_string())?;
            recovery::replace_ca_cert(&mut state.data, &ca.cert_pem)?;
            let credentials = ca
                .issue_for(&ident.name, me, cert_lifetime)
                .map_err(|e| format!("cannot issue the node's certificate: {e}"))?;
            new_ident = Some(Identity {
                credentials,
                ..ident.clone()
            });
            key_to_store = Some(ca.key_pem);
            true
        }
    };
    let term = state.data.last_applied.map_or(0, |l| l.leader_id.term);
    let vote = state.vote.unwrap_or_else(|| Vote::new(term, me));

    let path = data_dir.join(identity::RAFT_DB_FILE);
    let fresh = data_dir.join(format!("{}.recovering", identity::RAFT_DB_FILE));
    let _ = std::fs::remove_file(&fresh);
    if let Err(e) = write_db(&fresh, &state.data, &vote) {
        let _ = std::fs::remove_file(&fresh);
        return Err(e);
    }
    if let Some(key) = &key_to_store {
        ca_key::store(&data_dir, key).map_err(|e| format!("cannot write the CA key: {e}"))?;
    }
    if let Some(id) = &new_ident {
        identity::save_identity(&data_dir, id)?;
    }
    drop(db);
    let previous = data_dir.join(format!(
        "{}.pre-recover-{}",
        identity::RAFT_DB_FILE,
        now / 1000
    ));
    std::fs::rename(&path, &previous)
        .map_err(|e| format!("cannot move {} aside: {e}", path.display()))?;
    std::fs::rename(&fresh, &path).map_err(|e| {
        format!(
            "cannot put the recovered ledger in place ({} is at {}): {e}",
            path.display(),
            previous.display()
        )
    })?;
    sync_parent(&path);
    let mut report = reseated_report(
        &data_dir,
        &state.data,
        &reseated,
        &ident.name,
        &rpc_addr,
        new_ca,
    );
    report.entries_past_commit = state.past_commit;
    report.previous_db = Some(previous.display().to_string());
    Ok(report)
}
