//! Backfill reservations and preemption: where the head job will start, and which lower-priority or over-share jobs are evicted so that a job can start now.

use super::*;

impl<'a> Pass<'a> {
    /// Earliest time the gang fits if every job runs to its time limit, and
    /// the GPUs it would use then. Binary search over release times: freeing
    /// GPUs only ever helps, so placeability is (near enough) monotone.
    pub(super) fn reserve(&self, request: &GangRequest) -> Option<Reservation> {
        let mut times: Vec<u64> = self.jobs.release_at.iter().flatten().copied().collect();
        times.sort_unstable();
        times.dedup();
        // Per flat GPU: when it is free at the latest (`None`: never).
        let free_from: Vec<Option<u64>> = self
            .holder
            .iter()
            .map(|&slot| match slot {
                FREE => Some(0),
                slot => self.jobs.release_at.get(slot as usize).copied().flatten(),
            })
            .collect();
        // Per node: when it first has `gpus_per_node` usable GPUs, so each
        // probe skips nodes that cannot help without looking at their GPUs.
        let need = usize::try_from(request.gpus_per_node).unwrap_or(usize::MAX);
        let mut release_times: Vec<u64> = Vec::new();
        let node_ready_at: Vec<Option<u64>> = (0..self.input.nodes.len())
            .map(|position| {
                if !self.cluster.hostable[position] || need == 0 {
                    return None;
                }
                release_times.clear();
                release_times.extend(
                    self.cluster
                        .gpu_range(position)
                        .filter(|&gpu| self.cluster.shape.gpu_unique[gpu])
                        .filter_map(|gpu| free_from[gpu]),
                );
                if release_times.len() < need {
                    return None;
                }
                release_times.select_nth_unstable(need - 1);
                Some(release_times[need - 1])
            })
            .collect();
        // A gang fits at no time before `nodes` nodes are ready: those
        // probes of the search below are answered without a placement.
        // The search itself, and so its answer, stays as it is.
        let mut ready_times: Vec<u64> = node_ready_at.iter().flatten().copied().collect();
        ready_times.sort_unstable();
        let first_possible = usize::try_from(request.nodes)
            .ok()
            .and_then(|nodes| nodes.checked_sub(1))
            .and_then(|last| ready_times.get(last))
            .copied();
        let fits_at = |time: u64| {
            if first_possible.is_none_or(|first| time < first) {
                return None;
            }
            let bound: Vec<u32> = node_ready_at
                .iter()
                .map(|ready| match ready {
                    Some(at) if *at <= time => u32::MAX,
                    _ => 0,
                })
                .collect();
            place_indexed(
                &self.cluster,
                self.prox,
                request,
                &|gpu| free_from[gpu].is_some_and(|end| end <= time),
                Some(&bound),
            )
            .ok()
        };
        let last = *times.last()?;
        let mut found = fits_at(last).map(|placement| (last, placement))?;
        let (mut low, mut high) = (0usize, times.len() - 1);
        while low < high {
            let middle = low + (high - low) / 2;
            match fits_at(times[middle]) {
                Some(placement) => {
                    found = (times[middle], placement);
                    high = middle;
                }
                None => low = middle + 1,
            }
        }
        let (shadow_s, placement) = found;
        let mut reserved = vec![false; self.holder.len()];
        for (node_id, indices) in &placement.nodes {
            let Some(position) = self.position_of(*node_id) else {
                continue;
            };
            for gpu in self.cluster.gpu_range(position) {
                if request.choice.exclusive || indices.contains(&self.cluster.gpu(gpu).index) {
                    reserved[gpu] = true;
                }
            }
        }
        Some(Reservation {
            job: request.job,
            shadow_s,
            reserved,
        })
    }

    /// Tries to make room for `job` by preempting; commits and returns true
    /// on success, changes nothing otherwise.
    ///
    /// Priority here is the base `priority` on both sides: `boost` only
    /// orders a tenant's own queue. Comparing `priority + boost` with a
    /// running job's priority let every requeued victim (boost 1) out-rank
    /// every running job of priority 0, so each preemption caused the next.
    pub(super) fn try_preempt(&mut self, job: &PendingJob, request: &GangRequest) -> bool {
        let Some(preemptor_tenant) = self.tree.index_of(&job.tenant) else {
            return false;
        };
        // Deferred by `run` until a preemption is tried.
        self.tenant_holdings();
        let now = self.input.now_s;
        let own_active: Vec<bool> = (0..self.tree.len())
            .map(|t| {
                self.usage.own_share(t) > 0.0
                    || self.tenants_waiting.get(t).copied().unwrap_or(false)
            })
            .collect();
        let fair = self.tree.fair_fractions(&own_active);
        let below_fair_share =
            self.usage.own_share(preemptor_tenant) + SHARE_EPSILON < fair[preemptor_tenant];

        // Per tenant, once: a victim's tenant is judged by index, so the
        // walk over the running jobs below looks no name up and computes
        // no share (both showed up in profiles of long replays).
        let above_fair_share: Vec<bool> = (0..self.tree.len())
            .map(|t| self.usage.own_share(t) > fair[t] + SHARE_EPSILON)
            .collect();
        let running_tenants = &self.running_tenants;
        let mut candidates: Vec<&'a RunningJob> = self
            .input
            .running
            .iter()
            .zip(&self.running_slots)
            .zip(running_tenants.iter().chain(std::iter::repeat(&None)))
            .filter(|((victim, _), _)| victim.preemptible && now < victim.deadline_s())
            .filter(|((_, &slot), _)| !self.jobs.preempted[slot])
            .filter(|((victim, _), &victim_tenant)| {
                // Priority ranks a tenant's own jobs only: across tenants,
                // fair share alone decides, or one tenant's --priority
                // would preempt everyone.
                (below_fair_share && victim_tenant.is_some_and(|t| above_fair_share[t]))
                    || (victim_tenant == Some(preemptor_tenant) && job.priority > victim.priority)
            })
            .map(|((victim, _), _)| victim)
            .collect();
        // Who holds what on the nodes the gang could use takes a walk over
        // their GPUs: only worth it when someone may be preempted at all,
        // which on a cluster where every tenant is within its share is
        // nobody.
        if candidates.is_empty() {
            return false;
        }
        let holdings = self.gpus_held_on_useful_nodes(request);
        candidates.retain(|victim| holdings.contains_key(&victim.id));
        candidates.sort_by_key(|victim| {
            (
                victim.gpus,
                Reverse(victim.last_checkpoint_s.unwrap_or(victim.started_s)),
                victim.id,
            )
        });
        // Dedup in case the caller listed a running job twice.
        candidates.dedup_by_key(|victim| victim.id);

        // Cheap necessary condition before each full placement attempt:
        // enough nodes with enough usable GPUs once the victims are gone.
        let need = request.gpus_per_node;
        let mut usable_per_node: BTreeMap<usize, u32> = self.free_gpus_on_useful_nodes(request);
        let wanted_nodes = usize::try_from(request.nodes).unwrap_or(usize::MAX);
        let mut nodes_enough = usable_per_node.values().filter(|&&c| c >= need).count();

        let mut chosen: Vec<&'a RunningJob> = Vec::new();
        let mut fits = false;
        for victim in candidates {
            chosen.push(victim);
            for &(position, count) in holdings.get(&victim.id).map_or(&[][..], Vec::as_slice) {
                let entry = usable_per_node.entry(position).or_default();
                let before = *entry;
                *entry = entry.saturating_add(count);
                if before < need && *entry >= need {
                    nodes_enough += 1;
                }
            }
            if nodes_enough >= wanted_nodes && self.place_without(request, &chosen).is_ok() {
                fits = true;
                break;
            }
        }
        if !fits {
            return false;
        }
        // Greedy by size can overshoot; drop victims the gang can do without,
        // largest first.
        for position in (0..chosen.len()).rev() {
            let mut fewer = chosen.clone();
            fewer.remove(position);
            if self.place_without(request, &fewer).is_ok() {
                chosen = fewer;
            }
        }
        let Ok(placement) = self.place_without(request, &chosen) else {
            return false;
        };
        // An exclusive gang is charged its nodes whole: no one is evicted
        // for a gang its tenant's quota then refuses.
        if request.choice.exclusive && !self.whole_nodes_within_quota(job, &placement) {
            return false;
        }
        for victim in chosen {
            self.evict(victim, job.id);
        }
        self.commit(job, placement, request.choice.exclusive)
    }

    /// Whether `job`'s tenant may hold every GPU of `placement`'s nodes.
    pub(super) fn whole_nodes_within_quota(&self, job: &PendingJob, placement: &Placement) -> bool {
        let whole: u32 = placement
            .nodes
            .iter()
            .filter_map(|(node_id, _)| self.position_of(*node_id))
            .map(|position| self.cluster.gpu_range(position).count() as u32)
            .sum();
        if whole <= job.gpus {
            return true;
        }
        let whole = PendingJob {
            gpus: whole,
            ..job.clone()
        };
        self.tree
            .index_of(&job.tenant)
            .is_none_or(|tenant| self.tree.check_quota(tenant, &whole).is_ok())
    }

    /// Places the gang as if `victims` had already been stopped.
    pub(super) fn place_without(
        &self,
        request: &GangRequest,
        victims: &[&RunningJob],
    ) -> Result<Placement, Unplaceable> {
        let mut is_victim = vec![false; self.jobs.ids.len()];
        for victim in victims {
            if let Some(slot) = self.jobs.get(victim.id) {
                is_victim[slot] = true;
            }
        }
        let holder = &self.holder;
        place_indexed(
            &self.cluster,
            self.prox,
            request,
            &|gpu| {
                let slot = holder[gpu];
                slot == FREE || is_victim.get(slot as usize).copied().unwrap_or(false)
            },
            None,
        )
    }

    /// Nodes that could host a member of this gang at all (healthy, labelled,
    /// first view of their id), regardless of what is busy, each with its
    /// flat GPUs of the wanted model.
    pub(super) fn useful_nodes(&self, request: &GangRequest) -> Vec<(usize, Vec<usize>)> {
        // A model the cluster lacks matches no GPU.
        let wanted: Option<Vec<u32>> = request
            .gpu_model
            .as_deref()
            .map(|model| self.cluster.model_ids(model));
        self.input
            .nodes
            .iter()
            .enumerate()
            .filter(|&(position, node)| {
                node.healthy
                    && self.position_of(node.id) == Some(position)
                    && request.choice.allows(node.id)
                    && request
                        .required_labels
                        .iter()
                        .all(|(key, value)| node.labels.get(key) == Some(value))
            })
            .map(|(position, _)| {
                let gpus = self
                    .cluster
                    .gpu_range(position)
                    .filter(|&gpu| match &wanted {
                        None => true,
                        Some(models) => models.contains(&self.cluster.shape.gpu_model[gpu]),
                    })
                    .collect();
                (position, gpus)
            })
            .collect()
    }

    /// Per running job: (useful node position, GPUs it holds there).
    pub(super) fn gpus_held_on_useful_nodes(
        &self,
        request: &GangRequest,
    ) -> BTreeMap<JobId, Vec<(usize, u32)>> {
        let mut held: Vec<(JobId, usize)> = Vec::new();
        for (position, gpus) in self.useful_nodes(request) {
            for gpu in gpus {
                if let Some(job) = self.jobs.id(self.holder[gpu]) {
                    held.push((job, position));
                }
            }
        }
        held.sort_unstable();
        let mut holdings: BTreeMap<JobId, Vec<(usize, u32)>> = BTreeMap::new();
        for (job, position) in held {
            let per_node = holdings.entry(job).or_default();
            match per_node.last_mut() {
                Some((last, count)) if *last == position => *count += 1,
                _ => per_node.push((position, 1)),
            }
        }
        holdings
    }

    pub(super) fn free_gpus_on_useful_nodes(&self, request: &GangRequest) -> BTreeMap<usize, u32> {
        self.useful_nodes(request)
            .into_iter()
            .map(|(position, gpus)| {
                let count = gpus.iter().filter(|&&gpu| self.holder[gpu] == FREE).count();
                (position, u32::try_from(count).unwrap_or(u32::MAX))
            })
            .collect()
    }

    /// Frees a victim's GPUs in the overlay and records compensation.
    pub(super) fn evict(&mut self, victim: &RunningJob, for_job: JobId) {
        let mut freed = Held::default();
        if let Some(slot) = self.jobs.get(victim.id) {
            let slot = slot as u32;
            for (position, node) in self.input.nodes.iter().enumerate() {
                for gpu in self.cluster.gpu_range(position) {
                    if self.holder[gpu] != slot {
                        continue;
                    }
                    self.holder[gpu] = FREE;
                    let model = self.cluster.shape.gpu_model[gpu];
                    if node.healthy {
                        freed.add(model, 1);
                    }
                    if self.counts_as_usable(position, gpu) {
                        self.free_usable[position] += 1;
                        if let Some(free) = self.free_by_model.get_mut(model as usize) {
                            *free += 1;
                        }
                    }
                }
            }
            self.jobs.release_at[slot as usize] = None;
            self.jobs.preempted[slot as usize] = true;
        }
        let resources = resources_of(&self.cluster, freed.iter().map(|(m, c)| (m as usize, c)));
        if let Some(tenant) = self.tree.index_of(&victim.tenant) {
            self.tree.release_gpus(tenant, victim.gpus);
            self.usage.release(tenant, &resources);
        }
        // Freed GPUs may make earlier failures placeable.
        self.memo.clear();
        self.epoch += 1;
        let lost_since = victim.last_checkpoint_s.unwrap_or(victim.started_s);
        let lost_s = self.input.now_s.saturating_sub(lost_since);
        self.plan.preemptions.push(Preemption {
            victim: victim.id,
            for_job,
            refund_gpu_s: f64::from(victim.gpus) * lost_s as f64,
        });
    }
}
