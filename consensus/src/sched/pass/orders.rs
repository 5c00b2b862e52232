//! The orders a pass offers waiting jobs in: FIFO (with the pending index's shortcuts) and hierarchical dominant-resource fairness (HDRF), each stopping once nothing more can start.

use super::*;

impl<'a> Pass<'a> {
    pub(super) fn run_fifo(&mut self, mut queue: Vec<&'a PendingEntry>) {
        queue.sort_by_key(|(job, _)| (job.submitted_seq, job.id));
        // Built once: everything behind the blocker gets the same words.
        let mut waiting_behind: Option<String> = None;
        for (job, request) in queue {
            if let Some(reason) = &waiting_behind {
                // Nothing behind a blocked job starts; only its reason is left.
                if !self.waiting_reasons {
                    break;
                }
                let reason = reason.clone();
                self.note(job.id, reason);
                continue;
            }
            if let Err(reason) = self.admit(job) {
                self.note(job.id, reason);
                waiting_behind = Some(format!("fifo: waiting behind job {}", job.id));
                continue;
            }
            match self.place_in(Area::Free, request, None) {
                Ok(placement) => {
                    if !self.commit(job, placement, request.choice.exclusive) {
                        waiting_behind = Some(format!("fifo: waiting behind job {}", job.id));
                    }
                }
                Err(unplaceable) => {
                    self.note(job.id, unplaceable.reason);
                    waiting_behind = Some(format!("fifo: waiting behind job {}", job.id));
                }
            }
        }
    }

    /// `run` over the index instead of `validate_pending`, without waiting
    /// reasons: the same invalid reasons, the same plan, and only the part
    /// of the queue visited that can still change it.
    pub(super) fn run_indexed(&mut self, index: &'a PendingIndex) {
        let input = self.input;
        // A pending job that is also running is invalid, and that reason
        // comes before any other (as in `validate_pending`).
        let mut running_too: Vec<JobId> = input
            .running
            .iter()
            .map(|job| job.id)
            .filter(|&id| index.contains(id))
            .collect();
        running_too.sort_unstable();
        running_too.dedup();
        for position in index.invalid_positions() {
            let Some((job, request)) = input.pending.get(position) else {
                continue;
            };
            if running_too.binary_search(&job.id).is_ok() {
                continue;
            }
            let tree = &self.tree;
            if let Some(problem) =
                static_problem(job, request, |name| tree.index_of(name).is_some())
            {
                self.plan
                    .pending_reasons
                    .insert(job.id, format!("{INVALID_PREFIX} {problem}"));
            }
        }
        for &id in &running_too {
            self.plan
                .pending_reasons
                .insert(id, format!("{INVALID_PREFIX} job {id} is already running"));
        }
        // Valid entries the running list makes invalid, by position.
        let mut excluded: Vec<usize> = running_too
            .iter()
            .filter_map(|&id| index.position_of(id))
            .filter(|&position| index.is_valid(position))
            .collect();
        excluded.sort_unstable();

        match input.policy {
            Policy::Fifo => self.run_fifo_indexed(index, &excluded),
            Policy::Hdrf | Policy::HdrfPreempt => {
                let mut excluded_per_tenant: BTreeMap<&str, usize> = BTreeMap::new();
                for &position in &excluded {
                    if let Some((job, _)) = input.pending.get(position) {
                        *excluded_per_tenant.entry(job.tenant.as_str()).or_default() += 1;
                    }
                }
                let waiting_in = |name: &str| {
                    index
                        .tenant_len(name)
                        .saturating_sub(excluded_per_tenant.get(name).copied().unwrap_or(0))
                };
                for tenant in 0..self.tree.len() {
                    let waiting = waiting_in(self.tree.name(tenant)) > 0;
                    if let Some(flag) = self.tenants_waiting.get_mut(tenant) {
                        *flag = waiting;
                    }
                }
                let valid = index.valid_len().saturating_sub(excluded.len());
                let held_by_tenant = if valid > 1 || always_sum_holdings() {
                    self.tenant_holdings()
                } else {
                    Vec::new()
                };
                let allocations = self.allocations(&held_by_tenant);
                let capacity = resources_of(
                    &self.cluster,
                    self.capacity_by_model.iter().copied().enumerate(),
                );
                let excluded = &excluded;
                let space = ResourceSpace::new(&capacity);
                let projecting = &space;
                // One demand per (model, size), shared: building one per
                // job taken from the order showed up in profiles.
                let demands: RefCell<SharedDemands<'_>> = RefCell::default();
                let demands = &demands;
                let order = FairOrder::new(&input.tenants, space.clone(), &allocations, |name| {
                    let items = index
                        .tenant_queue(name)
                        .filter(move |position| excluded.binary_search(position).is_err())
                        .filter_map(move |position| {
                            let (job, request) = input.pending.get(position)?;
                            let key = (request.gpu_model.as_deref(), job.gpus);
                            let mut demands = demands.borrow_mut();
                            let demand = match demands.iter().find(|(known, _)| *known == key) {
                                Some((_, demand)) => Rc::clone(demand),
                                None => {
                                    let demand: Projected = Rc::from(
                                        projecting.project(&ResourceVector::gpus(key.0, key.1)),
                                    );
                                    demands.push((key, Rc::clone(&demand)));
                                    demand
                                }
                            };
                            Some((demand, position))
                        });
                    (waiting_in(name), Box::new(items))
                });
                let entries = order.filter_map(|(tenant, position)| {
                    input
                        .pending
                        .get(position)
                        .map(|entry| (Some(tenant), entry))
                });
                let allow_preemption = input.policy == Policy::HdrfPreempt;
                self.walk_fair_order(entries, allow_preemption, Some(index));
            }
        }
    }

    /// `run_fifo` without waiting reasons, reading the index's order.
    pub(super) fn run_fifo_indexed(&mut self, index: &'a PendingIndex, excluded: &[usize]) {
        let input = self.input;
        for position in index.fifo_order() {
            if excluded.binary_search(&position).is_ok() {
                continue;
            }
            let Some((job, request)) = input.pending.get(position) else {
                continue;
            };
            // Nothing behind a blocked job starts.
            if self.admit(job).is_err() {
                break;
            }
            let Ok(placement) = self.place_in(Area::Free, request, None) else {
                break;
            };
            if !self.commit(job, placement, request.choice.exclusive) {
                break;
            }
        }
    }

    /// Tenants' holdings as `order_pending` takes them.
    pub(super) fn allocations(&self, held_by_tenant: &[ResourceVector]) -> Vec<TenantAllocation> {
        held_by_tenant
            .iter()
            .enumerate()
            .filter(|(_, resources)| !resources.0.is_empty())
            .map(|(tenant, resources)| TenantAllocation {
                tenant: self.tree.name(tenant).to_string(),
                resources: resources.clone(),
            })
            .collect()
    }

    /// Once a reservation holds, no job is preempted for and GPUs only get
    /// scarcer, so a job can still start only if some node set has room
    /// for its shape outside the reservation, or on free GPUs if it ends
    /// before the reservation's start. True when no job in the index
    /// (less those this pass placed, `placed`) passes that necessary test:
    /// the rest of the walk could not change the plan.
    pub(super) fn nothing_more_can_start(
        &self,
        index: &PendingIndex,
        reservation: &Reservation,
        placed: &[(ShapeClass, u64)],
    ) -> bool {
        // Per node: usable free GPUs, and those of them outside the
        // reservation; as "nodes with at least g" counts.
        let mut free_at_least: Vec<usize> = Vec::new();
        let mut outside_at_least: Vec<usize> = Vec::new();
        for position in 0..self.input.nodes.len() {
            let free = self.free_usable.get(position).copied().unwrap_or(0) as usize;
            let outside = self
                .cluster
                .gpu_range(position)
                .filter(|&gpu| {
                    self.holder[gpu] == FREE
                        && !reservation.reserved.get(gpu).copied().unwrap_or(false)
                        && self.counts_as_usable(position, gpu)
                })
                .count();
            for (counts, value) in [(&mut free_at_least, free), (&mut outside_at_least, outside)] {
                if counts.len() <= value {
                    counts.resize(value + 1, 0);
                }
                counts[value] += 1;
            }
        }
        for counts in [&mut free_at_least, &mut outside_at_least] {
            for value in (1..counts.len()).rev() {
                counts[value - 1] += counts[value];
            }
        }
        let nodes_with = |counts: &[usize], gpus: u32| -> usize {
            usize::try_from(gpus)
                .ok()
                .and_then(|g| counts.get(g))
                .copied()
                .unwrap_or(0)
        };
        let now = self.input.now_s;
        for (shape, limits) in index.shapes() {
            let (gpus_per_node, nodes) = shape;
            let nodes = usize::try_from(nodes).unwrap_or(usize::MAX);
            if nodes_with(&free_at_least, gpus_per_node) < nodes {
                continue;
            }
            // The shortest time limit of this shape not placed already.
            let shortest = limits.iter().find_map(|(&limit, &count)| {
                let taken = placed
                    .iter()
                    .filter(|&&(s, l)| s == shape && l == limit)
                    .count();
                (count as usize > taken).then_some(limit)
            });
            let Some(shortest) = shortest else {
                continue;
            };
            if nodes_with(&outside_at_least, gpus_per_node) >= nodes
                || now.saturating_add(shortest) <= reservation.shadow_s
            {
                return false;
            }
        }
        true
    }

    pub(super) fn run_hdrf(
        &mut self,
        valid: Vec<&'a PendingEntry>,
        held_by_tenant: &[ResourceVector],
        allow_preemption: bool,
    ) {
        let by_id: BTreeMap<JobId, &'a PendingEntry> =
            valid.iter().map(|entry| (entry.0.id, *entry)).collect();
        let order = {
            let allocations = self.allocations(held_by_tenant);
            // One demand vector per (model, size), cloned: formatting the
            // model key per pending job showed up in profiles.
            let mut demand_of: BTreeMap<(Option<&str>, u32), ResourceVector> = BTreeMap::new();
            let demands: Vec<PendingDemand<'_>> = valid
                .iter()
                .map(|(job, request)| {
                    let model = request.gpu_model.as_deref();
                    PendingDemand {
                        job,
                        resources: demand_of
                            .entry((model, job.gpus))
                            .or_insert_with(|| ResourceVector::gpus(model, job.gpus))
                            .clone(),
                    }
                })
                .collect();
            let capacity = resources_of(
                &self.cluster,
                self.capacity_by_model.iter().copied().enumerate(),
            );
            order_pending(&self.input.tenants, &capacity, &allocations, &demands)
        };
        let entries = order
            .into_iter()
            .filter_map(|id| by_id.get(&id).map(|&entry| (None, entry)));
        self.walk_fair_order(entries, allow_preemption, None);
    }

    /// HDRF's walk over the queue in fair order, with EASY backfill behind
    /// the first job that cannot start. With `index`, the walk stops as
    /// soon as `nothing_more_can_start` proves the rest would change
    /// nothing (only when waiting reasons are left out).
    pub(super) fn walk_fair_order(
        &mut self,
        order: impl Iterator<Item = (Option<usize>, &'a PendingEntry)>,
        allow_preemption: bool,
        index: Option<&'a PendingIndex>,
    ) {
        let now = self.input.now_s;
        let mut reservation: Option<Reservation> = None;
        // Shapes and time limits placed so far, for the stop test.
        let mut placed: Vec<(ShapeClass, u64)> = Vec::new();
        for (tenant, (job, request)) in order {
            // The fair order knows the tenant; looking its name up again
            // was the largest cost of a long walk.
            let admitted = match tenant {
                Some(tenant) => self
                    .tree
                    .check_quota(tenant, job)
                    .map_err(|denied| denied.reason),
                None => self.admit(job),
            };
            if let Err(reason) = admitted {
                self.note(job.id, reason);
                continue;
            }
            let epoch = self.epoch;
            let Some(held_for_head) = &reservation else {
                match self.place_in(Area::Free, request, None) {
                    Ok(placement) => {
                        // Refused only past its quota, as `admit` refuses.
                        self.commit(job, placement, request.choice.exclusive);
                    }
                    Err(unplaceable) => {
                        if allow_preemption && self.try_preempt(job, request) {
                            if index.is_some() {
                                placed.push((
                                    (request.gpus_per_node, request.nodes),
                                    job.time_limit_s,
                                ));
                            }
                            continue;
                        }
                        reservation = self.reserve(request);
                        let reason = match &reservation {
                            Some(r) => format!(
                                "{}; reserved to start by t={}s",
                                unplaceable.reason, r.shadow_s
                            ),
                            None => format!(
                                "{}; does not fit even after every running job ends",
                                unplaceable.reason
                            ),
                        };
                        self.note(job.id, reason);
                        if let (Some(index), Some(held)) = (index, &reservation) {
                            if self.nothing_more_can_start(index, held, &placed) {
                                break;
                            }
                        }
                        continue;
                    }
                }
                if index.is_some() && self.epoch != epoch {
                    placed.push(((request.gpus_per_node, request.nodes), job.time_limit_s));
                }
                continue;
            };

            // Backfill: stay off the reserved GPUs, or be gone before the
            // head job needs them.
            let outside_reservation = self.place_in(
                Area::OutsideReservation,
                request,
                Some(&held_for_head.reserved),
            );
            let ends_in_time = now.saturating_add(job.time_limit_s) <= held_for_head.shadow_s;
            let decision = match outside_reservation {
                Ok(placement) => Ok(placement),
                // A job that would outlast the reservation waits whether or
                // not it fits on free GPUs; only the words depend on that,
                // so without waiting reasons the search (a full placement
                // when it fits) is skipped. What the memo would have learnt
                // from it, a later search finds again.
                Err(_) if !ends_in_time && !self.waiting_reasons => Err(String::new()),
                Err(_) => match self.place_in(Area::Free, request, None) {
                    Ok(placement) if ends_in_time => Ok(placement),
                    Ok(_) => Err(format!(
                        "backfill: would delay job {} reserved to start by t={}s",
                        held_for_head.job, held_for_head.shadow_s
                    )),
                    Err(unplaceable) => Err(unplaceable.reason),
                },
            };
            match decision {
                Ok(placement) => {
                    if !self.commit(job, placement, request.choice.exclusive) {
                        continue;
                    }
                    if let (Some(index), Some(held)) = (index, &reservation) {
                        placed.push(((request.gpus_per_node, request.nodes), job.time_limit_s));
                        if self.nothing_more_can_start(index, held, &placed) {
                            break;
                        }
                    }
                }
                Err(reason) => self.note(job.id, reason),
            }
        }
    }
}
