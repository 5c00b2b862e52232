//! The pending queue of a [`super::SchedCache`], kept sorted and validated
//! between passes and updated only at the positions the caller says changed.
//!
//! # Why
//! On an overloaded cluster the queue holds tens of thousands of jobs while
//! a pass starts a handful. Validating every request, hashing every id and
//! sorting the whole queue at every pass made the cost of a replay grow
//! with the square of the backlog. The index does that work once per job
//! that enters or leaves the queue, so that a FIFO pass costs what it
//! decides: it walks the sorted queue from its head and stops at the first
//! job that blocks.
//!
//! # What it must equal
//! The index answers exactly what `Pass::validate_pending` followed by
//! FIFO's sort would answer on the same `SchedInput::pending`, provided the
//! caller's [`super::PendingChanges`] are truthful. Two things it does not
//! keep, because they depend on more than the entry itself, are checked at
//! every pass instead: whether a pending job is also running (the running
//! list is short: one entry per allocation) and whether an id is listed
//! twice (then the index declines and the pass reads the whole queue).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use super::fairshare::PendingJob;
use super::model::{GangRequest, JobId};

type PendingEntry = (PendingJob, GangRequest);

/// A tenant's queue order: higher effective priority first, then older,
/// then id (`fairshare::job_precedence`); the position last.
pub(crate) type PrecedenceKey = (Reverse<i64>, u64, JobId, usize);

/// Gang shape of a request: (GPUs per node, nodes).
pub(crate) type ShapeClass = (u32, u32);

/// What the index remembers of the entry at one position.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Listed {
    id: JobId,
    submitted_seq: u64,
    tenant: String,
    precedence: i64,
    shape: ShapeClass,
    time_limit_s: u64,
    /// The request can never run, whatever else the pass sees.
    invalid: bool,
}

/// See the module documentation.
#[derive(Default)]
pub(crate) struct PendingIndex {
    /// Per position of `SchedInput::pending`, as last read.
    at: Vec<Listed>,
    /// Valid entries in FIFO order: (submitted_seq, id, position).
    fifo: BTreeSet<(u64, JobId, usize)>,
    /// Valid entries per tenant name, in the tenant's queue order.
    by_tenant: BTreeMap<String, BTreeSet<PrecedenceKey>>,
    /// Valid entries per gang shape: how many ask for each time limit.
    /// Lets a pass prove that nothing left in the queue can start.
    by_shape: BTreeMap<ShapeClass, BTreeMap<u64, u32>>,
    /// Positions of entries that are invalid on their own.
    invalid: BTreeSet<usize>,
    /// Positions per id, to notice duplicates without a pass over the queue.
    listings: HashMap<JobId, Vec<usize>>,
    /// Ids listed more than once.
    duplicated: usize,
    /// Sorted, deduplicated tenant names the entries were judged against.
    tenants: Vec<String>,
    /// Whether the index was built at least once.
    built: bool,
    /// Scratch: positions to re-read, sorted and deduplicated.
    touched: Vec<usize>,
}

impl PendingIndex {
    /// Brings the index up to date with `pending`. `changed` lists the
    /// positions whose entries may differ from the last call (`None`:
    /// anything may have changed), as [`super::PendingChanges::Only`]
    /// describes; positions past the old length are read even if unlisted
    /// (cheap insurance), and positions past the new length are dropped.
    pub(crate) fn sync(
        &mut self,
        pending: &[PendingEntry],
        tenant_names: &[String],
        changed: Option<&[usize]>,
    ) {
        let tenants_changed = self.tenants.len() != tenant_names.len()
            || self.tenants.iter().zip(tenant_names).any(|(a, b)| a != b);
        let Some(changed) = changed.filter(|_| self.built && !tenants_changed) else {
            self.rebuild(pending, tenant_names);
            return;
        };
        let old_len = self.at.len();
        let new_len = pending.len();
        let mut touched = std::mem::take(&mut self.touched);
        touched.clear();
        touched.extend(
            changed
                .iter()
                .copied()
                .filter(|&p| p < old_len.max(new_len)),
        );
        touched.extend(new_len.min(old_len)..old_len.max(new_len));
        touched.sort_unstable();
        touched.dedup();
        // Out with every touched entry as it was, then in with what is
        // there now: an entry moved from the end into a hole is taken out
        // at its old position and put in at its new one.
        for &position in &touched {
            if position < old_len {
                self.forget(position);
            }
        }
        self.at.truncate(new_len);
        for &position in &touched {
            if let Some(entry) = pending.get(position) {
                self.learn(position, entry);
            }
        }
        self.touched = touched;
    }

    fn rebuild(&mut self, pending: &[PendingEntry], tenant_names: &[String]) {
        self.at.clear();
        self.fifo.clear();
        self.by_tenant.clear();
        self.by_shape.clear();
        self.invalid.clear();
        self.listings.clear();
        self.duplicated = 0;
        self.tenants.clear();
        self.tenants.extend_from_slice(tenant_names);
        for (position, entry) in pending.iter().enumerate() {
            self.learn(position, entry);
        }
        self.built = true;
    }

    /// Reads the entry at `position`, which is the end of `at` or a
    /// position whose old entry was forgotten.
    fn learn(&mut self, position: usize, (job, request): &PendingEntry) {
        let invalid = static_problem(job, request, |name| {
            self.tenants
                .binary_search_by(|known| known.as_str().cmp(name))
                .is_ok()
        })
        .is_some();
        let listed = Listed {
            id: job.id,
            submitted_seq: job.submitted_seq,
            tenant: job.tenant.clone(),
            precedence: job.effective_priority(),
            shape: (request.gpus_per_node, request.nodes),
            time_limit_s: job.time_limit_s,
            invalid,
        };
        let listings = self.listings.entry(job.id).or_default();
        listings.push(position);
        if listings.len() == 2 {
            self.duplicated += 1;
        }
        if invalid {
            self.invalid.insert(position);
        } else {
            self.fifo.insert((job.submitted_seq, job.id, position));
            self.by_tenant
                .entry(listed.tenant.clone())
                .or_default()
                .insert(precedence_key(&listed, position));
            *self
                .by_shape
                .entry(listed.shape)
                .or_default()
                .entry(listed.time_limit_s)
                .or_default() += 1;
        }
        match self.at.get_mut(position) {
            Some(slot) => *slot = listed,
            None => self.at.push(listed),
        }
    }

    fn forget(&mut self, position: usize) {
        let Some(listed) = self.at.get(position).cloned() else {
            return;
        };
        if let Some(listings) = self.listings.get_mut(&listed.id) {
            listings.retain(|&p| p != position);
            match listings.len() {
                0 => {
                    self.listings.remove(&listed.id);
                }
                1 => self.duplicated -= 1,
                _ => {}
            }
        }
        if listed.invalid {
            self.invalid.remove(&position);
            return;
        }
        self.fifo
            .remove(&(listed.submitted_seq, listed.id, position));
        if let Some(queue) = self.by_tenant.get_mut(&listed.tenant) {
            queue.remove(&precedence_key(&listed, position));
            if queue.is_empty() {
                self.by_tenant.remove(&listed.tenant);
            }
        }
        if let Some(limits) = self.by_shape.get_mut(&listed.shape) {
            if let Some(count) = limits.get_mut(&listed.time_limit_s) {
                *count -= 1;
                if *count == 0 {
                    limits.remove(&listed.time_limit_s);
                }
            }
            if limits.is_empty() {
                self.by_shape.remove(&listed.shape);
            }
        }
    }

    /// Makes the next `sync` read the whole queue, for when a pass ran
    /// without telling the index what changed.
    pub(crate) fn forget_all(&mut self) {
        self.built = false;
    }

    /// Whether the index can stand in for a read of the whole queue.
    pub(crate) fn usable(&self, pending_len: usize) -> bool {
        self.built && self.duplicated == 0 && self.at.len() == pending_len
    }

    /// Whether `id` is listed.
    pub(crate) fn contains(&self, id: JobId) -> bool {
        self.listings.contains_key(&id)
    }

    /// Where `id` is listed, if exactly once.
    pub(crate) fn position_of(&self, id: JobId) -> Option<usize> {
        match self.listings.get(&id).map(Vec::as_slice) {
            Some(&[position]) => Some(position),
            _ => None,
        }
    }

    /// Valid entries of the tenant named `tenant`, in its queue order.
    pub(crate) fn tenant_queue(&self, tenant: &str) -> impl Iterator<Item = usize> + '_ {
        self.by_tenant
            .get(tenant)
            .into_iter()
            .flat_map(|queue| queue.iter().map(|&(_, _, _, position)| position))
    }

    /// How many valid entries the tenant named `tenant` has.
    pub(crate) fn tenant_len(&self, tenant: &str) -> usize {
        self.by_tenant.get(tenant).map_or(0, BTreeSet::len)
    }

    /// Valid entries per gang shape, with how many ask for each time limit.
    pub(crate) fn shapes(&self) -> impl Iterator<Item = (ShapeClass, &BTreeMap<u64, u32>)> + '_ {
        self.by_shape.iter().map(|(&shape, limits)| (shape, limits))
    }

    /// Whether the entry at `position` is valid on its own.
    pub(crate) fn is_valid(&self, position: usize) -> bool {
        self.at.get(position).is_some_and(|listed| !listed.invalid)
    }

    /// Number of valid entries.
    pub(crate) fn valid_len(&self) -> usize {
        self.fifo.len()
    }

    /// Positions of valid entries, oldest submission first.
    pub(crate) fn fifo_order(&self) -> impl Iterator<Item = usize> + '_ {
        self.fifo.iter().map(|&(_, _, position)| position)
    }

    /// Positions of entries that are invalid on their own, ascending.
    pub(crate) fn invalid_positions(&self) -> impl Iterator<Item = usize> + '_ {
        self.invalid.iter().copied()
    }
}

fn precedence_key(listed: &Listed, position: usize) -> PrecedenceKey {
    (
        Reverse(listed.precedence),
        listed.submitted_seq,
        listed.id,
        position,
    )
}

/// Why a request can never run, judged on the entry alone: every check of
/// `Pass::validate_pending` except duplicates and "already running", in
/// the same order, with the same words. `known_tenant` says whether a
/// tenant name exists.
pub(crate) fn static_problem(
    job: &PendingJob,
    request: &GangRequest,
    known_tenant: impl FnOnce(&str) -> bool,
) -> Option<String> {
    if request.job != job.id {
        Some(format!(
            "gang request is for job {}, not {}",
            request.job, job.id
        ))
    } else if request.tenant != job.tenant {
        Some(format!(
            "gang request is for tenant {}, job belongs to {}",
            request.tenant, job.tenant
        ))
    } else if request.nodes == 0 || request.gpus_per_node == 0 {
        Some("a gang needs at least one node and one GPU per node".to_string())
    } else if u64::from(job.gpus) != u64::from(request.nodes) * u64::from(request.gpus_per_node) {
        Some(format!(
            "job asks for {} GPUs but its gang is {} nodes x {} GPUs",
            job.gpus, request.nodes, request.gpus_per_node
        ))
    } else if request
        .max_rtt_ms
        .is_some_and(|limit| limit.is_nan() || limit < 0.0)
    {
        Some("max_rtt_ms must be a non-negative number".to_string())
    } else if !known_tenant(&job.tenant) {
        Some(format!("unknown tenant {}", job.tenant))
    } else {
        None
    }
}
