//! Checkpoint copies from and to peer regions: foreign jobs kept and
//! adopted ([`crate::federation::copies`] holds the records and rules).

use super::Ledger;
use crate::federation::copies::*;
use crate::workload::{Checkpoint, JobId, JobSpec, MAX_MANIFEST_BYTES};

impl Ledger {
    fn require_peer(&self, region: &str) -> Result<(), String> {
        if self.federation.peers.contains_key(region) {
            Ok(())
        } else {
            Err(format!("no peer region named '{region}'"))
        }
    }

    /// `Command::CheckpointCopied`: `region` holds step `step` of `job`
    /// (`None`: a copy to it is starting; from now on it may take the job over).
    pub(crate) fn checkpoint_copied(
        &mut self,
        job: JobId,
        step: Option<u64>,
        region: &str,
    ) -> Result<(), String> {
        self.require_peer(region)?;
        let spec = &self
            .workload
            .jobs
            .get(&job)
            .ok_or_else(|| format!("no job {job}"))?
            .spec;
        if spec.ckpt_region_copies == 0 {
            return Err(format!(
                "job {job} asked for no copies in other regions (--ckpt-replicas L+R)"
            ));
        }
        let copies = self.federation.copies_out.entry(job).or_default();
        if !copies.contains_key(region) && copies.len() >= spec.ckpt_region_copies as usize {
            return Err(format!(
                "job {job} already has its {} region copies",
                spec.ckpt_region_copies
            ));
        }
        let held = copies.entry(region.to_string()).or_default();
        if let Some(step) = step {
            *held = (*held).max(step);
            if let Some(c) = self
                .workload
                .checkpoints
                .get_mut(&job)
                .and_then(|catalog| catalog.iter_mut().find(|c| c.step == step))
            {
                if !c.regions.iter().any(|r| r == region) {
                    c.regions.push(region.to_string());
                }
            }
        }
        Ok(())
    }

    /// `Command::RecordForeignCheckpoint`: a peer region's job and a
    /// committed step of it, now held by this region's nodes.
    pub(crate) fn record_foreign_checkpoint(
        &mut self,
        origin: &str,
        origin_job: JobId,
        spec: &JobSpec,
        checkpoint: &Checkpoint,
        origin_index: u64,
        now_ms: u64,
    ) -> Result<(), String> {
        self.require_peer(origin)?;
        crate::workload::validate_spec(spec)?;
        let refuses_local = self
            .effective_protocol()
            .is_some_and(|p| p >= SHARED_ONLY_SINCE_PROTOCOL);
        if refuses_local && self.global_tenant_id(&spec.tenant).is_none() {
            return Err(format!(
                "region {origin} sent a copy of a job of tenant '{}', which this region does not \
                 share across regions: it would become that tenant's job here",
                spec.tenant
            ));
        }
        if checkpoint.committed_at_ms.is_none()
            || checkpoint.parts.len() as u32 != checkpoint.ranks
            || checkpoint.ranks == 0
        {
            return Err(format!(
                "step {} of {origin}:{origin_job} is not a committed step with every rank's part",
                checkpoint.step
            ));
        }
        if checkpoint
            .parts
            .values()
            .any(|p| p.manifest.len() > MAX_MANIFEST_BYTES || p.holders.is_empty())
        {
            return Err("a copied part has no holder or an oversized manifest".into());
        }
        if let Some(bad) = checkpoint
            .parts
            .values()
            .flat_map(|p| &p.holders)
            .find(|h| !self.members.contains_key(h))
        {
            return Err(format!("holder {bad} of a copied part is no member here"));
        }
        let jobs = self
            .federation
            .foreign
            .entry(origin.to_string())
            .or_default();
        let full = jobs.len() >= MAX_FOREIGN_JOBS;
        match jobs.get_mut(&origin_job) {
            Some(known) if known.adopted_as.is_some() => Err(format!(
                "job {origin}:{origin_job} was taken over here as job {}; region {origin} must stop it",
                known.adopted_as.unwrap_or_default()
            )),
            Some(known) if known.checkpoint.step >= checkpoint.step => Ok(()),
            Some(known) => {
                known.spec = spec.clone();
                known.checkpoint = checkpoint.clone();
                known.origin_index = origin_index;
                known.received_at_ms = now_ms;
                Ok(())
            }
            None if full => Err(format!(
                "this region holds copies of {MAX_FOREIGN_JOBS} jobs of {origin} already"
            )),
            None => {
                jobs.insert(
                    origin_job,
                    ForeignJob {
                        spec: spec.clone(),
                        checkpoint: checkpoint.clone(),
                        origin_index,
                        received_at_ms: now_ms,
                        adopted_as: None,
                    },
                );
                Ok(())
            }
        }
    }

    /// `Command::ForgetForeignJob`: the job ended in its region; its copy
    /// here is no longer a restore point. An adopted job's record stays:
    /// the origin learns from it that the job moved.
    pub(crate) fn forget_foreign_job(
        &mut self,
        origin: &str,
        origin_job: JobId,
    ) -> Result<(), String> {
        let Some(jobs) = self.federation.foreign.get_mut(origin) else {
            return Err(format!("no copies of region {origin}'s jobs here"));
        };
        match jobs.get(&origin_job) {
            Some(j) if j.adopted_as.is_some() => Err(format!(
                "job {origin}:{origin_job} was taken over here; its record stays"
            )),
            Some(_) => {
                jobs.remove(&origin_job);
                Ok(())
            }
            None => Err(format!("no copy of job {origin}:{origin_job} here")),
        }
    }

    /// `Command::AdoptForeignJob`: region `origin` is lost; its job becomes
    /// a job of this region, restored from the copied step and placed no
    /// earlier than `not_before_ms` (when the origin's ranks are fenced).
    /// Its tenant must exist here, and the job must fit this region, as for
    /// a submission.
    pub(crate) fn adopt_foreign_job(
        &mut self,
        origin: &str,
        origin_job: JobId,
        not_before_ms: u64,
        now_ms: u64,
    ) -> Result<JobId, String> {
        let record = self
            .federation
            .foreign
            .get(origin)
            .and_then(|jobs| jobs.get(&origin_job))
            .ok_or_else(|| format!("no copy of job {origin}:{origin_job} here"))?;
        if let Some(id) = record.adopted_as {
            return Err(format!(
                "job {origin}:{origin_job} was taken over here already, as job {id}"
            ));
        }
        // What named the origin's jobs and nodes means nothing here.
        let mut spec = record.spec.clone();
        spec.dependencies.clear();
        spec.choice = Default::default();
        spec.submit_held = false;
        let checkpoint = record.checkpoint.clone();
        let id = self
            .workload
            .submit(&spec, &self.members, now_ms)
            .map_err(|e| format!("job {origin}:{origin_job} cannot run here: {e}"))?;
        let step = checkpoint.step;
        if let Some(job) = self.workload.jobs.get_mut(&id) {
            job.not_before_ms = Some(not_before_ms);
            job.last_ckpt_step = Some(step);
            job.last_ckpt_at_ms = checkpoint.committed_at_ms;
            job.reason = format!(
                "taken over from region {origin} (job {origin}:{origin_job}) at step {step}; starts once {origin}'s ranks are fenced"
            );
        }
        let mut restored = checkpoint;
        restored.regions.clear();
        self.workload.checkpoints.insert(id, vec![restored]);
        if let Some(record) = self
            .federation
            .foreign
            .get_mut(origin)
            .and_then(|jobs| jobs.get_mut(&origin_job))
        {
            record.adopted_as = Some(id);
        }
        Ok(id)
    }

    /// `Command::JobMoved`: `region`, which held a copy of `job`, took it
    /// over as its job `remote_job`; it ends here.
    pub(crate) fn job_moved(
        &mut self,
        job: JobId,
        region: &str,
        remote_job: JobId,
        now_ms: u64,
    ) -> Result<(), String> {
        if !self
            .federation
            .copies_out
            .get(&job)
            .is_some_and(|c| c.contains_key(region))
        {
            return Err(format!("region {region} holds no copy of job {job}"));
        }
        let reason = format!(
            "moved to region {region} as {region}:{remote_job}: this region was lost and {region} resumed it from its copy"
        );
        self.workload.moved_away(job, reason, now_ms)
    }

    /// The jobs this region took over from `origin`.
    pub fn adoptions_from(&self, origin: &str) -> Vec<Adoption> {
        self.federation
            .foreign
            .get(origin)
            .map(|jobs| {
                jobs.iter()
                    .filter_map(|(origin_job, j)| {
                        j.adopted_as.map(|job| Adoption {
                            origin_job: *origin_job,
                            job,
                        })
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Regions that hold (or are being sent) a copy of `job`'s checkpoints,
    /// and so may take it over: its ranks run only under their lease.
    pub fn copy_regions(&self, job: JobId) -> Vec<&str> {
        self.federation
            .copies_out
            .get(&job)
            .map(|c| c.keys().map(String::as_str).collect())
            .unwrap_or_default()
    }

    /// Jobs of this region that keep copies elsewhere and have not ended.
    pub fn live_copied_jobs(&self) -> Vec<JobId> {
        self.workload
            .jobs
            .values()
            .filter(|j| j.spec.ckpt_region_copies > 0 && !j.state.is_final())
            .map(|j| j.id)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::federation::PeerRegion;
    use crate::workload::{CkptPart, JobState};
    use std::collections::BTreeMap;

    fn peer(name: &str) -> PeerRegion {
        PeerRegion {
            name: name.into(),
            cluster_id: "c".into(),
            ca_cert_pem: "pem".into(),
            api_urls: vec!["https://10.0.0.1:7070".into()],
            outbound_secret_hash: "out".into(),
            inbound_token_hash: format!("hash-{name}"),
            joined_at_ms: 0,
        }
    }

    fn ledger_with_peer() -> Ledger {
        let mut l = Ledger::new();
        l.workload.ensure_default_tenant(0);
        let gpu = shoal_sdk::GpuInfo {
            index: 0,
            model: "H100".into(),
            memory_mb: 81_920,
            uuid: "GPU-0".into(),
            allocated_to: None,
            numa_node: None,
            nvlink_peers: vec![],
            mig_enabled: false,
            health: String::new(),
            health_reason: None,
        };
        let member = crate::ledger::MemberSpec {
            name: "n1".into(),
            gpus: vec![gpu],
            ..Default::default()
        };
        l.insert_member(1, member, 0);
        l.add_peer_region(&peer("eu-1"), 0).expect("peer");
        l
    }

    fn spec() -> JobSpec {
        JobSpec {
            tenant: "default".into(),
            nodes: 1,
            gpus_per_node: 1,
            time_limit_s: 60,
            command: vec!["train".into()],
            ckpt_region_copies: 1,
            ..Default::default()
        }
    }

    fn step(step: u64) -> Checkpoint {
        Checkpoint {
            step,
            epoch: 7,
            ranks: 1,
            parts: BTreeMap::from([(
                0,
                CkptPart {
                    manifest: vec![1, 2, 3],
                    bytes: 3,
                    holders: vec![1],
                },
            )]),
            committed_at_ms: Some(5),
            regions: vec![],
        }
    }

    #[test]
    fn a_copy_is_recorded_only_for_a_tenant_shared_across_regions() {
        // Every member at the protocol that refuses them.
        let mut l = ledger_with_peer();
        if let Some(m) = l.members.get_mut(&1) {
            m.spec.protocol_max = SHARED_ONLY_SINCE_PROTOCOL;
        }
        // The default tenant is this region's own: a copy of a job of it
        // would become its job here.
        let refused = l.record_foreign_checkpoint("eu-1", 42, &spec(), &step(3), 10, 1);
        assert!(
            refused
                .as_ref()
                .is_err_and(|e| e.contains("does not share across regions")),
            "{refused:?}"
        );
        assert!(l
            .federation
            .foreign
            .get("eu-1")
            .is_none_or(|j| j.is_empty()));
        // A tenant shared with eu-1 (eu-1 its home) is copied.
        let limits = crate::workload::TenantLimits::default();
        l.adopt_global_tenant("lab", "eu-1", (Some(8), None), &limits, false, 1)
            .expect("adopt lab");
        let lab = JobSpec {
            tenant: "lab".into(),
            ..spec()
        };
        l.record_foreign_checkpoint("eu-1", 42, &lab, &step(3), 10, 2)
            .expect("a shared tenant's copy");
        // Members of an older release record any tenant's, as they did:
        // every replica must decide alike.
        let mut older = ledger_with_peer();
        older
            .record_foreign_checkpoint("eu-1", 42, &spec(), &step(3), 10, 1)
            .expect("recorded while a member speaks an older protocol");
    }

    #[test]
    fn an_adopted_copy_becomes_a_job_restored_from_its_step_and_waits_for_the_fence() {
        let mut l = ledger_with_peer();
        l.record_foreign_checkpoint("eu-1", 42, &spec(), &step(3), 10, 1)
            .expect("record");
        // An older step never replaces a newer one.
        l.record_foreign_checkpoint("eu-1", 42, &spec(), &step(2), 11, 2)
            .expect("idempotent");
        assert_eq!(l.federation.foreign["eu-1"][&42].checkpoint.step, 3);
        let id = l.adopt_foreign_job("eu-1", 42, 9_000, 100).expect("adopt");
        let job = &l.workload.jobs[&id];
        assert_eq!(job.state, JobState::Pending);
        assert_eq!(job.last_ckpt_step, Some(3));
        assert!(!job.schedulable(&l.workload.jobs, 8_999));
        assert!(job.schedulable(&l.workload.jobs, 9_000));
        assert_eq!(l.workload.latest_checkpoint(id).map(|c| c.step), Some(3));
        assert_eq!(
            l.adoptions_from("eu-1"),
            vec![Adoption {
                origin_job: 42,
                job: id
            }]
        );
        // Adopted once: a second adoption, a newer copy and a forget are refused.
        assert!(l.adopt_foreign_job("eu-1", 42, 9_000, 100).is_err());
        assert!(l
            .record_foreign_checkpoint("eu-1", 42, &spec(), &step(4), 12, 3)
            .is_err());
        assert!(l.forget_foreign_job("eu-1", 42).is_err());
    }

    #[test]
    fn copies_come_only_from_peers_and_only_committed_whole_steps() {
        let mut l = ledger_with_peer();
        assert!(l
            .record_foreign_checkpoint("us-9", 1, &spec(), &step(1), 1, 1)
            .is_err());
        let mut partial = step(1);
        partial.ranks = 2;
        assert!(l
            .record_foreign_checkpoint("eu-1", 1, &spec(), &partial, 1, 1)
            .is_err());
        let mut uncommitted = step(1);
        uncommitted.committed_at_ms = None;
        assert!(l
            .record_foreign_checkpoint("eu-1", 1, &spec(), &uncommitted, 1, 1)
            .is_err());
        l.record_foreign_checkpoint("eu-1", 1, &spec(), &step(1), 1, 1)
            .expect("record");
        l.forget_foreign_job("eu-1", 1).expect("forget");
        assert!(l.adopt_foreign_job("eu-1", 1, 0, 0).is_err());
        // Leaving the federation drops what the peer sent.
        l.record_foreign_checkpoint("eu-1", 2, &spec(), &step(1), 1, 1)
            .expect("record");
        l.remove_peer_region("eu-1").expect("leave");
        assert!(l.federation.foreign.is_empty());
    }

    #[test]
    fn a_moved_job_ends_here_and_frees_its_gpus() {
        let mut l = ledger_with_peer();
        let id = l.workload.submit(&spec(), &l.members, 0).expect("submit");
        // Only a region that holds a copy may have taken it over.
        assert!(l.job_moved(id, "eu-1", 9, 10).is_err());
        l.checkpoint_copied(id, None, "eu-1").expect("copying");
        assert_eq!(l.copy_regions(id), vec!["eu-1"]);
        assert_eq!(l.live_copied_jobs(), vec![id]);
        l.job_moved(id, "eu-1", 9, 10).expect("moved");
        let job = &l.workload.jobs[&id];
        assert_eq!(job.state, JobState::Cancelled);
        assert!(job.reason.contains("eu-1:9"), "{}", job.reason);
        assert!(l.live_copied_jobs().is_empty());
        // A job that asked for no region copy cannot be copied.
        let plain = JobSpec {
            ckpt_region_copies: 0,
            ..spec()
        };
        let other = l.workload.submit(&plain, &l.members, 0).expect("submit");
        assert!(l.checkpoint_copied(other, None, "eu-1").is_err());
    }
}
