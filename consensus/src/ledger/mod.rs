//! The ledger state machine. `apply` is a pure function of the state and the
//! command: no clock reads, no randomness, no I/O. Time enters as `now_ms`,
//! stamped by the leader when it proposes the command (DESIGN invariant 7), so
//! every replica computes the same result.

pub mod access;
mod ca;
mod copies;
mod federation;
mod global_tenants;
pub mod limits;
pub mod node_access;
mod tokens;
mod view;
pub use view::trial_start;

use serde::{Deserialize, Serialize};
use shoal_sdk::MemberState;
use std::collections::BTreeMap;

use crate::ids::NodeId;
use crate::workload::Workload;

pub use crate::ids::{validate_name, MAX_NAME};
pub use crate::members::{ClusterInfo, GpuFaultReport, Member, MemberSpec};

pub use crate::tokens::{ApiToken, JoinToken};

pub use crate::command::{Command, LedgerRequest, LedgerResponse};

/// Decodes and checks a manifest's bytes (a `mesh:/` object's or a
/// checkpoint part's). The ledger keeps manifests opaque — their format
/// belongs to the storage crate, which this crate does not depend on — so
/// the node supplies the check. It is part of the state machine: every
/// replica must run the same one, as they run the same `apply`.
pub type ManifestCheck = fn(&[u8]) -> Result<(), String>;

/// The checks `apply` makes with code from outside this crate.
#[derive(Clone, Copy, Debug, Default)]
pub struct ApplyChecks {
    /// `None` accepts any bytes (tests and the simulator, which make up
    /// their manifests).
    pub manifest: Option<ManifestCheck>,
    /// A planted bug, for showing that the chaos checker catches one:
    /// placements of a committed plan are applied without re-validating
    /// them against the state they land on. Only an in-process chaos run
    /// (`shoal bench chaos --plant skip-plan-validation`) sets it; no
    /// configuration file or API can.
    pub skip_plan_validation: bool,
}

/// Limits that keep the ledger (and therefore every snapshot) small.
pub const MAX_ATTR_KEY: usize = 256;
pub const MAX_ATTR_VALUE: usize = 4096;

#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
pub struct Ledger {
    pub cluster: Option<ClusterInfo>,
    pub members: BTreeMap<NodeId, Member>,
    pub next_node_id: NodeId,
    pub join_tokens: BTreeMap<String, JoinToken>,
    pub api_tokens: BTreeMap<String, ApiToken>,
    pub attrs: BTreeMap<String, String>,
    pub workload: Workload,
    pub events: crate::events::EventLog,
    pub namespace: crate::namespace::Namespace,
    /// CA rotations and what each member trusts ([`crate::ca`]).
    pub ca: crate::ca::CaState,
    /// The largest leader timestamp applied; time never runs backwards in
    /// the ledger even if a new leader's clock is behind.
    pub clock_ms: u64,
    /// Peer regions ([`crate::federation`]).
    pub federation: crate::federation::FederationState,
    /// The answers of recent routed writes ([`crate::once`]).
    pub recent_writes: crate::once::RecentWrites<LedgerResponse>,
    /// Tenants whose GPUs are capped across regions, and this region's
    /// part of each cap ([`crate::escrow`]).
    pub global_caps: BTreeMap<String, crate::escrow::GlobalCap>,
    /// Which members may vote ([`crate::voters::VoterEligibility`]).
    pub voter_eligibility: crate::voters::VoterEligibility,
    /// Jobs an admin token put on hold: a tenant may not release them
    /// (`scontrol hold` by an operator, as under Slurm). Last, with the
    /// field before it, so an older snapshot decodes with both empty
    /// appended.
    pub admin_holds: std::collections::BTreeSet<crate::workload::JobId>,
}

impl Ledger {
    pub fn new() -> Self {
        Ledger {
            next_node_id: 1,
            ..Default::default()
        }
    }

    /// Applies the command at log position `index`, accepting any manifest
    /// bytes. Deterministic: the result depends only on `self`, `index` and
    /// `req`.
    pub fn apply(&mut self, index: u64, req: &LedgerRequest) -> LedgerResponse {
        self.apply_with(index, req, &ApplyChecks::default())
    }

    /// [`Ledger::apply`], refusing what `checks` refuse.
    pub fn apply_with(
        &mut self,
        index: u64,
        req: &LedgerRequest,
        checks: &ApplyChecks,
    ) -> LedgerResponse {
        self.clock_ms = self.clock_ms.max(req.now_ms);
        self.apply_command(index, &req.cmd, checks)
    }

    fn apply_command(&mut self, index: u64, cmd: &Command, checks: &ApplyChecks) -> LedgerResponse {
        let now = self.clock_ms;
        match cmd {
            Command::Batch(cmds) => LedgerResponse::Batch(
                cmds.iter()
                    .map(|c| match c {
                        Command::Batch(_) => LedgerResponse::Rejected("batches do not nest".into()),
                        c => self.apply_command(index, c, checks),
                    })
                    .collect(),
            ),
            Command::Bootstrap {
                cluster_id,
                region,
                ca_cert_pem,
                admin_token_hash,
                first_member,
                spec,
            } => {
                if self.cluster.is_some() {
                    return LedgerResponse::Rejected("the cluster is already bootstrapped".into());
                }
                self.cluster = Some(ClusterInfo {
                    cluster_id: cluster_id.clone(),
                    region: region.clone(),
                    ca_cert_pem: ca_cert_pem.clone(),
                    created_at_ms: now,
                });
                self.api_tokens.insert(
                    admin_token_hash.clone(),
                    ApiToken::new(admin_token_hash, "admin".into(), None, None, now),
                );
                self.insert_member(*first_member, spec.clone(), now);
                self.next_node_id = self.next_node_id.max(first_member + 1);
                self.workload.ensure_default_tenant(now);
                LedgerResponse::NodeId(*first_member)
            }
            Command::AddMember { spec, token_hash } => {
                if self.cluster.is_none() {
                    return LedgerResponse::Rejected("the cluster is not bootstrapped yet".into());
                }
                if let Err(reason) = self.join_token_valid(token_hash, now) {
                    return LedgerResponse::Rejected(reason);
                }
                if let Err(e) = validate_name(&spec.name) {
                    return LedgerResponse::Rejected(e);
                }
                if let Some(m) = self
                    .members
                    .values()
                    .find(|m| m.spec.name == spec.name && m.state != MemberState::Left)
                {
                    return LedgerResponse::Rejected(format!(
                        "a node named '{}' is already a member (id {})",
                        spec.name, m.id
                    ));
                }
                if let Some(effective) = self.effective_protocol() {
                    let (min, max) = spec.protocol();
                    if !(min..=max).contains(&effective) {
                        return LedgerResponse::Rejected(format!(
                            "node '{}' speaks protocol {min}..{max}, but the cluster's \
                             effective protocol is {effective} (the newest version every \
                             member speaks) and the ledger may hold entries of it; run a \
                             release that speaks it",
                            spec.name
                        ));
                    }
                }
                let id = self.next_node_id;
                self.next_node_id += 1;
                self.insert_member(id, spec.clone(), now);
                self.consume_join_token(token_hash, id);
                if !self.voter_eligibility.voter_tokens.contains(token_hash) {
                    self.voter_eligibility.learners_only.insert(id);
                }
                LedgerResponse::NodeId(id)
            }
            Command::UpdateMember { id, spec } => match self.members.get_mut(id) {
                Some(m) if m.spec.name == spec.name => {
                    m.spec = spec.clone();
                    LedgerResponse::Ok
                }
                Some(m) => LedgerResponse::Rejected(format!(
                    "node {id} is named '{}', not '{}'",
                    m.spec.name, spec.name
                )),
                None => LedgerResponse::Rejected(format!("no member with id {id}")),
            },
            Command::SetMemberState { id, state } => match self.members.get_mut(id) {
                Some(m) if m.state == MemberState::Left => {
                    LedgerResponse::Rejected(format!("node {id} has left the cluster"))
                }
                Some(m) => {
                    if m.state != *state {
                        m.state = *state;
                        m.state_since_ms = now;
                        let member = m.clone();
                        self.workload.on_member_state(&member, &self.members, now);
                        if member.state == MemberState::Down {
                            self.events.record(
                                &crate::events::EventSpec {
                                    severity: crate::events::Severity::Critical,
                                    kind: "node_down".into(),
                                    node: Some(member.id),
                                    gpu: None,
                                    job: None,
                                    message: format!(
                                        "node {} stopped answering heartbeats",
                                        member.spec.name
                                    ),
                                    resource: None,
                                },
                                now,
                            );
                        }
                    }
                    LedgerResponse::Ok
                }
                None => LedgerResponse::Rejected(format!("no member with id {id}")),
            },
            Command::CreateJoinToken {
                hash,
                expires_at_ms,
                uses,
            } => answer(self.create_join_token(hash, *expires_at_ms, *uses, now)),
            Command::CreateVoterJoinToken {
                hash,
                expires_at_ms,
                uses,
            } => answer(
                self.create_join_token(hash, *expires_at_ms, *uses, now)
                    .map(|()| {
                        self.voter_eligibility.voter_tokens.insert(hash.clone());
                    }),
            ),
            Command::RevokeJoinToken { id } => answer(self.revoke_join_token(id)),
            Command::CreateApiToken {
                hash,
                name,
                tenant,
                expires_at_ms,
            } => answer(self.create_api_token(hash, name, tenant, *expires_at_ms, now)),
            Command::RevokeApiToken { id } => answer(self.revoke_api_token(id, now)),
            Command::RotateApiToken { name, hash } => {
                answer(self.rotate_api_token(name, hash, now))
            }
            Command::TouchApiToken { id } => answer(self.touch_api_token(id, now)),
            Command::AddPeerRegion { peer } => answer(self.add_peer_region(peer, now)),
            Command::RemovePeerRegion { name } => answer(self.remove_peer_region(name)),
            Command::SetGlobalCaps {
                tenant,
                gpus,
                gpu_seconds,
            } => answer(self.set_global_caps(tenant, *gpus, *gpu_seconds)),
            Command::SealPeerSecret { region } => answer(self.seal_peer_secret(region)),
            // A peer's shared tenant, adopted by name (`Global`) or, over a
            // local tenant of that name, by an admin's consent (`Local`).
            Command::AdoptGlobalTenant {
                tenant,
                home,
                gpus,
                gpu_seconds,
                limits,
            }
            | Command::AdoptLocalTenant {
                tenant,
                home,
                gpus,
                gpu_seconds,
                limits,
            } => answer(self.adopt_global_tenant(
                tenant,
                home,
                (*gpus, *gpu_seconds),
                limits,
                matches!(cmd, Command::AdoptLocalTenant { .. }),
                now,
            )),
            Command::ShareRound {
                tenant,
                gpus,
                gpu_seconds,
            } => answer(self.share_round(tenant, gpus.as_ref(), gpu_seconds.as_ref())),
            Command::SetPeerCa {
                region,
                ca_cert_pem,
            } => answer(self.set_peer_ca(region, ca_cert_pem)),
            Command::CheckpointCopied { job, step, region } => {
                answer(self.checkpoint_copied(*job, *step, region))
            }
            Command::RecordForeignCheckpoint {
                origin,
                origin_job,
                spec,
                checkpoint,
                origin_index,
            } => answer(self.record_foreign_checkpoint(
                origin,
                *origin_job,
                spec,
                checkpoint,
                *origin_index,
                now,
            )),
            Command::ForgetForeignJob { origin, origin_job } => {
                answer(self.forget_foreign_job(origin, *origin_job))
            }
            Command::AdoptForeignJob {
                origin,
                origin_job,
                wait_ms,
            } => {
                match self.adopt_foreign_job(origin, *origin_job, now.saturating_add(*wait_ms), now)
                {
                    Ok(id) => LedgerResponse::JobId(id),
                    Err(e) => LedgerResponse::Rejected(e),
                }
            }
            Command::JobMoved {
                job,
                region,
                remote_job,
            } => answer(self.job_moved(*job, region, *remote_job, now)),
            Command::Once { id, cmd } => {
                if let Some(answer) = self.recent_writes.answer(id) {
                    return answer.clone();
                }
                if matches!(**cmd, Command::Once { .. }) {
                    return LedgerResponse::Rejected("write ids do not nest".into());
                }
                let answer = self.apply_command(index, cmd, checks);
                self.recent_writes.record(*id, answer.clone(), now);
                answer
            }
            Command::AsTenant { tenant, cmd } => {
                if matches!(
                    **cmd,
                    Command::AsTenant { .. }
                        | Command::AsNode { .. }
                        | Command::Batch(_)
                        | Command::Once { .. }
                ) {
                    return LedgerResponse::Rejected("tenant commands do not nest".into());
                }
                match crate::ledger::access::authorize(self, tenant, cmd) {
                    Ok(()) => {}
                    Err(crate::ledger::access::Refusal::Denied(reason)) => {
                        return LedgerResponse::Denied(reason)
                    }
                    Err(crate::ledger::access::Refusal::Hidden(reason)) => {
                        return LedgerResponse::Hidden(reason)
                    }
                }
                match (crate::ledger::limits::check(self, cmd), &**cmd) {
                    (Err(reason), _) => LedgerResponse::Rejected(reason),
                    (Ok(()), Command::HoldJob { job, hold }) => {
                        answer(self.set_hold(*job, *hold, false))
                    }
                    (Ok(()), _) => self.apply_command(index, cmd, checks),
                }
            }
            Command::AsNode { node, cmd } => {
                let refusal = if matches!(
                    **cmd,
                    Command::AsTenant { .. }
                        | Command::AsNode { .. }
                        | Command::Batch(_)
                        | Command::Once { .. }
                ) {
                    Some(format!("node {node} may not nest commands"))
                } else {
                    crate::ledger::node_access::authorize(self, *node, cmd).err()
                };
                match refusal {
                    None => self.apply_command(index, cmd, checks),
                    Some(reason) => {
                        self.events.record(
                            &crate::events::EventSpec {
                                severity: crate::events::Severity::Warning,
                                kind: crate::events::AUDIT.into(),
                                node: Some(*node),
                                gpu: None,
                                job: None,
                                resource: None,
                                message: format!("refused a command from a member: {reason}"),
                            },
                            now,
                        );
                        LedgerResponse::Denied(reason)
                    }
                }
            }
            Command::PutAttr { key, value } => {
                if key.is_empty() || key.len() > MAX_ATTR_KEY || value.len() > MAX_ATTR_VALUE {
                    return LedgerResponse::Rejected(format!(
                        "attribute keys are 1-{MAX_ATTR_KEY} bytes and values at most {MAX_ATTR_VALUE} bytes"
                    ));
                }
                self.attrs.insert(key.clone(), value.clone());
                LedgerResponse::Ok
            }
            Command::CreateTenant { name, limits } => {
                answer(self.workload.create_tenant(name, limits, now))
            }
            Command::UpdateTenant { name, update } => {
                answer(self.workload.update_tenant(name, update))
            }
            Command::SubmitJob { spec } => {
                if let Err(reason) = self.fits_global_caps(spec) {
                    return LedgerResponse::Rejected(reason);
                }
                match self.workload.submit(spec, &self.members, now) {
                    Ok(id) => LedgerResponse::JobId(id),
                    Err(reason) => LedgerResponse::Rejected(reason),
                }
            }
            Command::CancelJob { job } => answer(self.workload.cancel(*job, now)),
            Command::HoldJob { job, hold } => answer(self.set_hold(*job, *hold, true)),
            Command::SignalJob { job, signal } => answer(self.workload.signal(*job, *signal)),
            Command::RequeueJob { job } => answer(self.workload.requeue(*job, now)),
            Command::SetUser { name, tenant } => {
                answer(self.workload.set_user(name, tenant.as_deref()))
            }
            Command::SetMasterPort { job, epoch, port } => {
                answer(self.workload.set_master_port(*job, *epoch, *port))
            }
            Command::SetTimeLimit { job, time_limit_s } => {
                answer(self.workload.set_time_limit(*job, *time_limit_s, now))
            }
            Command::Schedule(plan) => {
                let validate = !checks.skip_plan_validation;
                let shares = self.regional_shares();
                let outcome =
                    self.workload
                        .apply_plan(plan, &self.members, index, now, validate, &shares);
                LedgerResponse::Scheduled {
                    started: outcome.started,
                    refused: outcome.refused,
                }
            }
            Command::RankExited {
                job,
                epoch,
                rank,
                exit_code,
                end,
            } => answer(self.workload.rank_exited(
                *job,
                *epoch,
                *rank,
                *exit_code,
                *end,
                &self.members,
                now,
            )),
            Command::CheckpointPart {
                job,
                epoch,
                rank,
                step,
                part,
            } => {
                if let Err(e) = checks.check_manifest(&part.manifest) {
                    return LedgerResponse::Rejected(format!(
                        "invalid manifest for checkpoint {step} of job {job}, rank {rank}: {e}"
                    ));
                }
                answer(
                    self.workload
                        .checkpoint_part(*job, *epoch, *rank, *step, part, now),
                )
            }
            Command::ReleaseJob { job, epoch } => {
                answer(self.workload.release(*job, *epoch, &self.members, now))
            }
            Command::PutObject { object, replace } => {
                if let Err(e) = checks.check_manifest(&object.manifest) {
                    return LedgerResponse::Rejected(format!(
                        "invalid manifest for mesh:{}: {e}",
                        object.path
                    ));
                }
                let mut object = object.clone();
                object.mtime_ms = now;
                answer(self.namespace.put(&object, *replace))
            }
            Command::RemoveObject { path } => answer(self.namespace.remove(path).map(|_| ())),
            Command::SetObjectHolders { path, holders } => {
                answer(self.namespace.set_holders(path, holders))
            }
            Command::RecordEvent(spec) => {
                self.events.record(spec, now);
                LedgerResponse::Ok
            }
            Command::SetDrain { id, drain } => {
                if !self.members.contains_key(id) {
                    return LedgerResponse::Rejected(format!("no member with id {id}"));
                }
                self.workload.set_drain(*id, *drain, now);
                LedgerResponse::Ok
            }
            Command::SetGpuFault { node, gpu, fault } => {
                let Some(member) = self.members.get(node) else {
                    return LedgerResponse::Rejected(format!("no member with id {node}"));
                };
                if !member.spec.gpus.iter().any(|g| g.index == *gpu) {
                    return LedgerResponse::Rejected(format!(
                        "{} has no GPU {gpu}",
                        member.spec.name
                    ));
                }
                if fault.as_ref().is_some_and(|f| f.reason.len() > 256) {
                    return LedgerResponse::Rejected(
                        "a GPU fault's reason is at most 256 bytes".into(),
                    );
                }
                let fault = fault.as_ref().map(|f| crate::workload::GpuFault {
                    reason: f.reason.clone(),
                    detected: f.detected,
                    since_ms: now,
                });
                self.workload.set_gpu_fault(*node, *gpu, fault, now);
                LedgerResponse::Ok
            }
            Command::SetCheckpointHolders {
                job,
                step,
                rank,
                holders,
            } => answer(
                self.workload
                    .set_checkpoint_holders(*job, *step, *rank, holders),
            ),
            Command::StartCaRotation { .. } => self.start_ca_rotation(cmd, now),
            Command::AdvanceCaRotation { from } => self.advance_ca_rotation(*from, now),
            Command::ReportCredentials {
                node,
                trusted,
                cert_ca,
            } => self.report_credentials(*node, trusted, cert_ca, now),
        }
    }

    /// `shoal hold|release`: an admin's hold is recorded, so that only an
    /// admin releases it; a tenant's hold its tenant may release.
    fn set_hold(
        &mut self,
        job: crate::workload::JobId,
        hold: bool,
        by_admin: bool,
    ) -> Result<(), String> {
        self.workload.hold(job, hold)?;
        if hold && by_admin {
            self.admin_holds.insert(job);
        } else if !hold {
            self.admin_holds.remove(&job);
        }
        let jobs = &self.workload.jobs;
        self.admin_holds
            .retain(|id| jobs.get(id).is_some_and(|j| j.held && !j.state.is_final()));
        Ok(())
    }

    /// The cluster's effective protocol: the newest version every member
    /// (that has not left) speaks, i.e. the lowest of their newest. A command
    /// format of protocol `v` may be proposed only once this is at least `v`:
    /// a member that does not speak it could not apply the entry. `None`
    /// without members.
    pub fn effective_protocol(&self) -> Option<u16> {
        self.members
            .values()
            .filter(|m| m.state != MemberState::Left)
            .map(|m| m.spec.protocol().1)
            .min()
    }

    pub(crate) fn insert_member(&mut self, id: NodeId, spec: MemberSpec, now: u64) {
        self.members.insert(
            id,
            Member {
                id,
                spec,
                state: MemberState::Alive,
                joined_at_ms: now,
                state_since_ms: now,
            },
        );
    }

    /// Members that have not left, in id order.
    pub fn active_members(&self) -> impl Iterator<Item = &Member> {
        self.members
            .values()
            .filter(|m| m.state != MemberState::Left)
    }

    pub fn member_by_name_or_id(&self, key: &str) -> Option<&Member> {
        if let Ok(id) = key.parse::<NodeId>() {
            if let Some(m) = self.members.get(&id) {
                return Some(m);
            }
        }
        self.members.values().find(|m| m.spec.name == key)
    }
}

impl ApplyChecks {
    fn check_manifest(&self, bytes: &[u8]) -> Result<(), String> {
        match self.manifest {
            Some(check) => check(bytes),
            None => Ok(()),
        }
    }
}

fn answer(result: Result<(), String>) -> LedgerResponse {
    match result {
        Ok(()) => LedgerResponse::Ok,
        Err(reason) => LedgerResponse::Rejected(reason),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(name: &str) -> MemberSpec {
        MemberSpec {
            name: name.into(),
            rpc_addr: "127.0.0.1:7071".into(),
            api_addr: "127.0.0.1:7070".into(),
            labels: BTreeMap::new(),
            gpus: vec![],
            gossip_peer_id: String::new(),
            gossip_addr: String::new(),
            ..Default::default()
        }
    }

    fn bootstrapped() -> Ledger {
        let mut l = Ledger::new();
        let r = l.apply(
            1,
            &LedgerRequest {
                now_ms: 1000,
                cmd: Command::Bootstrap {
                    cluster_id: "c".into(),
                    region: "r".into(),
                    ca_cert_pem: "cert".into(),
                    admin_token_hash: "admin".into(),
                    first_member: 1,
                    spec: spec("n1"),
                },
            },
        );
        assert_eq!(r, LedgerResponse::NodeId(1));
        l
    }

    #[test]
    fn a_repeated_write_id_is_answered_from_the_record_and_applied_once() {
        let mut l = bootstrapped();
        let once = |origin: NodeId, nonce: u64, cmd: Command| Command::Once {
            id: crate::once::WriteId { origin, nonce },
            cmd: Box::new(cmd),
        };
        let at =
            |l: &mut Ledger, ms: u64, cmd: Command| l.apply(2, &LedgerRequest { now_ms: ms, cmd });
        let create = Command::CreateTenant {
            name: "vision".into(),
            limits: Default::default(),
        };
        assert_eq!(
            at(&mut l, 1100, once(1, 9, create.clone())),
            LedgerResponse::Ok
        );
        let created_at = l.workload.tenants["vision"].created_at_ms;
        // The retry of a write whose first attempt committed.
        assert_eq!(
            at(&mut l, 1200, once(1, 9, create.clone())),
            LedgerResponse::Ok
        );
        assert_eq!(l.workload.tenants["vision"].created_at_ms, created_at);
        // Another member's write with the same nonce is another write.
        let again = at(&mut l, 1300, once(2, 9, create.clone()));
        assert!(
            matches!(&again, LedgerResponse::Rejected(m) if m.contains("exists")),
            "{again:?}"
        );

        let object = crate::ledger::access::tests::object("/data", "default");
        let put = Command::PutObject {
            object,
            replace: false,
        };
        assert_eq!(at(&mut l, 1400, put), LedgerResponse::Ok);
        let remove = Command::RemoveObject {
            path: "/data".into(),
        };
        assert_eq!(
            at(&mut l, 1500, once(1, 10, remove.clone())),
            LedgerResponse::Ok
        );
        assert_eq!(
            at(&mut l, 1600, once(1, 10, remove.clone())),
            LedgerResponse::Ok,
            "a removal's retry is not answered 'does not exist'"
        );
        let unrouted = at(&mut l, 1700, remove);
        assert!(
            matches!(&unrouted, LedgerResponse::Rejected(m) if m.contains("does not exist")),
            "{unrouted:?}"
        );

        // Only the leader wraps a write: never inside another wrapper.
        let nested = at(
            &mut l,
            1800,
            once(
                1,
                11,
                once(
                    1,
                    12,
                    Command::PutAttr {
                        key: "k".into(),
                        value: "v".into(),
                    },
                ),
            ),
        );
        assert!(matches!(nested, LedgerResponse::Rejected(_)), "{nested:?}");
        let forged = at(
            &mut l,
            1900,
            Command::AsNode {
                node: 1,
                cmd: Box::new(once(
                    2,
                    13,
                    Command::PutAttr {
                        key: "k".into(),
                        value: "v".into(),
                    },
                )),
            },
        );
        assert!(matches!(forged, LedgerResponse::Denied(_)), "{forged:?}");
        assert!(!l.attrs.contains_key("k"));
    }

    #[test]
    fn the_effective_protocol_is_the_newest_every_member_speaks_and_a_joiner_must_speak_it() {
        let mut l = bootstrapped();
        assert_eq!(
            l.effective_protocol(),
            Some(1),
            "unrecorded ranges read as 1..1"
        );
        let at =
            |l: &mut Ledger, ms: u64, cmd: Command| l.apply(1, &LedgerRequest { now_ms: ms, cmd });
        at(
            &mut l,
            1100,
            Command::CreateJoinToken {
                hash: "t".into(),
                expires_at_ms: 50_000,
                uses: 10,
            },
        );
        let speaking = |name: &str, min: u16, max: u16| MemberSpec {
            protocol_min: min,
            protocol_max: max,
            version: "0.2.0".into(),
            ..spec(name)
        };
        let add = |spec: MemberSpec| Command::AddMember {
            spec,
            token_hash: "t".into(),
        };
        // Mid-upgrade: a node of the next release joins; nothing changes yet.
        assert_eq!(
            at(&mut l, 1200, add(speaking("n2", 1, 2))),
            LedgerResponse::NodeId(2)
        );
        assert_eq!(l.effective_protocol(), Some(1));
        // One that dropped version 1 must wait until every member speaks 2.
        let r = at(&mut l, 1300, add(speaking("n3", 2, 2)));
        assert!(
            matches!(&r, LedgerResponse::Rejected(m) if m.contains("speaks protocol 2..2") && m.contains("effective protocol is 1")),
            "{r:?}"
        );
        // The last old member is upgraded in place.
        let r = at(
            &mut l,
            1400,
            Command::UpdateMember {
                id: 1,
                spec: speaking("n1", 1, 2),
            },
        );
        assert_eq!(r, LedgerResponse::Ok);
        assert_eq!(l.effective_protocol(), Some(2));
        assert_eq!(l.members[&1].spec.version, "0.2.0");
        assert_eq!(
            at(&mut l, 1500, add(speaking("n3", 2, 2))),
            LedgerResponse::NodeId(3)
        );
        // Now an old release cannot join: the ledger may hold version 2 entries.
        let r = at(&mut l, 1600, add(speaking("n4", 1, 1)));
        assert!(matches!(r, LedgerResponse::Rejected(_)), "{r:?}");
    }

    #[test]
    fn join_requires_a_live_token_and_a_unique_name() {
        let mut l = bootstrapped();
        let add = |name: &str| Command::AddMember {
            spec: spec(name),
            token_hash: "t".into(),
        };
        let r = l.apply(
            1,
            &LedgerRequest {
                now_ms: 1100,
                cmd: add("n2"),
            },
        );
        assert_eq!(r, LedgerResponse::Rejected("unknown join token".into()));
        l.apply(
            1,
            &LedgerRequest {
                now_ms: 1200,
                cmd: Command::CreateJoinToken {
                    hash: "t".into(),
                    expires_at_ms: 5000,
                    uses: 5,
                },
            },
        );
        assert_eq!(
            l.apply(
                1,
                &LedgerRequest {
                    now_ms: 1300,
                    cmd: add("n2")
                }
            ),
            LedgerResponse::NodeId(2)
        );
        assert!(matches!(
            l.apply(
                1,
                &LedgerRequest {
                    now_ms: 1400,
                    cmd: add("n2")
                }
            ),
            LedgerResponse::Rejected(_)
        ));
        assert_eq!(
            l.apply(
                1,
                &LedgerRequest {
                    now_ms: 6000,
                    cmd: add("n3")
                }
            ),
            LedgerResponse::Rejected("the join token t has expired".into())
        );
    }

    #[test]
    fn a_batch_answers_each_command_and_refuses_nesting() {
        let mut l = bootstrapped();
        let put = |k: &str| Command::PutAttr {
            key: k.into(),
            value: "v".into(),
        };
        let r = l.apply(
            1,
            &LedgerRequest {
                now_ms: 2000,
                cmd: Command::Batch(vec![
                    put("a"),
                    put(""),
                    Command::Batch(vec![put("c")]),
                    put("b"),
                ]),
            },
        );
        match r {
            LedgerResponse::Batch(v) => {
                assert_eq!(v.len(), 4);
                assert_eq!(v[0], LedgerResponse::Ok);
                assert!(matches!(v[1], LedgerResponse::Rejected(_)));
                assert!(matches!(v[2], LedgerResponse::Rejected(_)));
                assert_eq!(v[3], LedgerResponse::Ok);
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(l.attrs.len(), 2);
    }

    #[test]
    fn ledger_clock_never_runs_backwards() {
        let mut l = bootstrapped();
        l.apply(
            1,
            &LedgerRequest {
                now_ms: 500,
                cmd: Command::PutAttr {
                    key: "k".into(),
                    value: "v".into(),
                },
            },
        );
        assert_eq!(l.clock_ms, 1000);
    }

    fn arb_cmd() -> impl Strategy<Value = LedgerRequest> {
        let name = prop::sample::select(vec!["a", "b", "c", "bad name", ""]);
        let cmd = prop_oneof![
            (name.clone(), prop::sample::select(vec!["t1", "t2"])).prop_map(|(n, t)| {
                Command::AddMember {
                    spec: spec(n),
                    token_hash: t.into(),
                }
            }),
            (
                0u64..6,
                prop::sample::select(vec![
                    MemberState::Alive,
                    MemberState::Suspect,
                    MemberState::Down,
                    MemberState::Left
                ])
            )
                .prop_map(|(id, state)| Command::SetMemberState { id, state }),
            (
                prop::sample::select(vec!["t1", "t2"]),
                0u64..20_000,
                0u32..3
            )
                .prop_map(|(h, e, uses)| Command::CreateJoinToken {
                    hash: h.into(),
                    expires_at_ms: e,
                    uses,
                }),
            prop::sample::select(vec!["t1", "t2"])
                .prop_map(|id| Command::RevokeJoinToken { id: id.into() }),
            ("[a-z]{0,3}", "[a-z]{0,3}").prop_map(|(key, value)| Command::PutAttr { key, value }),
        ];
        let cmd = prop_oneof![
            4 => cmd.clone(),
            1 => prop::collection::vec(cmd, 0..4).prop_map(Command::Batch),
        ];
        (0u64..20_000, cmd).prop_map(|(now_ms, cmd)| LedgerRequest { now_ms, cmd })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        /// Determinism (invariant 7): two replicas applying the same log end in
        /// the same state with the same answers; and names stay unique among
        /// active members; node ids are never reused; join tokens admit at
        /// most their uses.
        #[test]
        fn replicas_applying_the_same_log_agree(cmds in prop::collection::vec(arb_cmd(), 0..60)) {
            let mut a = bootstrapped();
            let mut b = bootstrapped();
            let mut seen_ids = std::collections::BTreeSet::from([1u64]);
            for c in &cmds {
                let ra = a.apply(1, c);
                let rb = b.apply(1, c);
                prop_assert_eq!(&ra, &rb);
                let answers = match ra {
                    LedgerResponse::Batch(v) => v,
                    other => vec![other],
                };
                for a in answers {
                    if let LedgerResponse::NodeId(id) = a {
                        prop_assert!(seen_ids.insert(id), "node id {} reused", id);
                    }
                }
                let mut names: Vec<_> = a.active_members().map(|m| m.spec.name.clone()).collect();
                let n = names.len();
                names.sort();
                names.dedup();
                prop_assert_eq!(names.len(), n);
                // A join token never admits more nodes than it has uses.
                for t in a.join_tokens.values() {
                    prop_assert_eq!(t.admitted.len() as u32 + t.uses_left, t.max_uses);
                }
            }
            prop_assert_eq!(a, b);
        }
    }
}
