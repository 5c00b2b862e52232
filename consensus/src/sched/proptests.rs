//! Property tests: random clusters and job streams, every plan checked by
//! [`check_plan`]. Clusters are generated from a seed so cases stay small to
//! print and cheap to build.

use std::collections::{BTreeMap, BTreeSet};

use proptest::prelude::*;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::testkit::*;
use super::*;

const MODELS: [&str; 3] = ["H100", "A100", "L4"];
const TENANTS: [(&str, Option<&str>); 4] = [
    ("org", None),
    ("a", Some("org")),
    ("b", Some("org")),
    ("c", None),
];

fn random_input(seed: u64, policy: Policy) -> SchedInput {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let node_count = rng.random_range(1..=64u64);
    let model_count = rng.random_range(1..=MODELS.len());
    let racks = rng.random_range(1..=6u32);
    let zones = rng.random_range(1..=3u32);
    let now = rng.random_range(0..10_000u64);

    let mut nodes: Vec<NodeView> = (1..=node_count)
        .map(|id| {
            let rack = rng.random_range(0..racks);
            let model = MODELS[rng.random_range(0..model_count)];
            let gpus = rng.random_range(1..=8u32);
            let mut view = node(id, &format!("r{rack}"), gpus, model);
            view.labels = labels("eu", &format!("z{}", rack % zones), &format!("r{rack}"));
            view.healthy = rng.random_bool(0.9);
            if rng.random_bool(0.3) {
                view.labels.insert("pool".into(), "spot".into());
            }
            for gpu in &mut view.gpus {
                gpu.numa_node = Some(gpu.index / 4);
                gpu.nvlink_peers = (0..gpus)
                    .filter(|&p| p != gpu.index && rng.random_bool(0.5))
                    .collect();
            }
            view
        })
        .collect();

    let mut running = Vec::new();
    let mut in_use: BTreeMap<&str, u32> = BTreeMap::new();
    let mut next_running_id = 10_000;
    for node_index in 0..nodes.len() {
        let free = nodes[node_index].gpus.len() as u32;
        let taken = rng.random_range(0..=free);
        if taken == 0 {
            continue;
        }
        let tenant = TENANTS[rng.random_range(0..TENANTS.len())].0;
        let node_id = nodes[node_index].id;
        let mut job = occupy(
            &mut nodes,
            node_id,
            taken,
            next_running_id,
            tenant,
            0,
            rng.random_range(1..20_000),
        );
        job.preemptible = rng.random_bool(0.7);
        job.priority = rng.random_range(-2..=2);
        job.last_checkpoint_s = rng.random_bool(0.5).then(|| rng.random_range(0..=now));
        *in_use.entry(tenant).or_default() += taken;
        running.push(job);
        next_running_id += 1;
    }

    let tenants: Vec<TenantView> = TENANTS
        .iter()
        .map(|(name, parent)| {
            let mut view = tenant(name, rng.random_range(1..=4u32) as f64);
            view.parent = parent.map(str::to_string);
            view.gpus_in_use = in_use.get(name).copied().unwrap_or(0);
            view.max_gpus = rng.random_bool(0.4).then(|| rng.random_range(0..=96));
            if rng.random_bool(0.2) {
                view.gpu_hours_limit = Some(rng.random_range(0.0..50.0));
            }
            view
        })
        .collect();

    let job_count = rng.random_range(0..=20u64);
    let pending = (1..=job_count)
        .map(|id| {
            let tenant = TENANTS[rng.random_range(1..TENANTS.len())].0;
            let (mut job, mut request) = pending(
                id,
                tenant,
                rng.random_range(1..=4),
                rng.random_range(1..=8),
                rng.random_range(1..7200),
            );
            job.submitted_seq = rng.random_range(0..1000);
            job.priority = rng.random_range(-2..=2);
            request.gpu_model = rng
                .random_bool(0.6)
                .then(|| MODELS[rng.random_range(0..model_count)].to_string());
            request.same = match rng.random_range(0..5) {
                0 => Some(TopologyTier::Rack),
                1 => Some(TopologyTier::Zone),
                _ => None,
            };
            request.max_rtt_ms = rng.random_bool(0.2).then(|| rng.random_range(0.0..5.0));
            if rng.random_bool(0.1) {
                request.required_labels.insert("pool".into(), "spot".into());
            }
            (job, request)
        })
        .collect();

    SchedInput {
        now_s: now,
        nodes,
        tenants,
        running,
        pending,
        policy,
    }
}

fn policy_strategy() -> impl Strategy<Value = Policy> {
    prop_oneof![
        Just(Policy::Fifo),
        Just(Policy::Hdrf),
        Just(Policy::HdrfPreempt)
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn passes_keep_every_promise(seed in any::<u64>(), policy in policy_strategy()) {
        let input = random_input(seed, policy);
        let prox = TopologyProximity::new(&input.nodes);
        let plan = schedule(&input, &prox);
        if let Err(broken) = check_plan(&input, &plan) {
            return Err(TestCaseError::fail(format!("{broken}\nplan: {plan:?}")));
        }
        prop_assert_eq!(&plan, &schedule(&input, &prox));
    }

    /// The cache must follow every kind of change a caller can make
    /// between passes: allocations it lists, models it lists, health it
    /// need not list, and GPU counts it forgets to list. A cache that
    /// leaves out waiting reasons must plan the same, with only the
    /// `invalid:` reasons.
    #[test]
    fn cached_passes_decide_like_fresh_passes(seed in any::<u64>(), policy in policy_strategy()) {
        let mut input = random_input(seed, policy);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0xcac4e);
        let mut cache = SchedCache::default();
        let mut terse = SchedCache::without_waiting_reasons();
        let mut changed: Vec<usize> = Vec::new();
        for round in 0..6 {
            let prox = TopologyProximity::new(&input.nodes);
            let fresh = schedule(&input, &prox);
            let changes = if round == 0 { NodeChanges::All } else { NodeChanges::Only(&changed) };
            let cached = cache.schedule(&input, &prox, changes);
            prop_assert_eq!(&cached, &fresh, "round {}", round);
            // The kept overlay equals one rebuilt from the views.
            if let Some(shape) = &cache.shape {
                let mut rebuilt = pass::Overlay::default();
                rebuilt.rebuild(shape, &input.nodes);
                prop_assert_eq!(cache.overlay.normalized(), rebuilt.normalized(), "round {}", round);
            }
            let mut expected = fresh.clone();
            expected.pending_reasons.retain(|_, reason| reason.starts_with("invalid:"));
            prop_assert_eq!(&terse.schedule(&input, &prox, changes), &expected, "round {}", round);

            changed.clear();
            for placement in &fresh.placements {
                apply(&mut input.nodes, placement);
                for (node_id, _) in &placement.nodes {
                    changed.extend(input.nodes.iter().position(|n| n.id == *node_id));
                }
                input.pending.retain(|(job, _)| job.id != placement.job);
            }
            if input.nodes.is_empty() {
                continue;
            }
            let node_count = input.nodes.len();
            // A job ends somewhere: its GPUs are free again.
            let freed = rng.random_range(0..node_count);
            for gpu in &mut input.nodes[freed].gpus {
                gpu.allocated_to = None;
            }
            changed.push(freed);
            // A node reports another model (may renumber the model ids).
            if rng.random_bool(0.3) {
                let swapped = rng.random_range(0..node_count);
                for gpu in &mut input.nodes[swapped].gpus {
                    gpu.model = MODELS[rng.random_range(0..MODELS.len())].to_string();
                }
                changed.push(swapped);
            }
            // Health is read afresh every pass, so it is never listed.
            let flipped = rng.random_range(0..node_count);
            input.nodes[flipped].healthy = !input.nodes[flipped].healthy;
            // A GPU appears on an unlisted node: the size check must notice.
            if rng.random_bool(0.2) {
                let grown = rng.random_range(0..node_count);
                let next_index = input.nodes[grown].gpus.len() as u32 + 100;
                let model = input.nodes[grown].gpus.first().map_or("H100".to_string(), |g| g.model.clone());
                input.nodes[grown].gpus.push(gpu(next_index, &model));
            }
            input.now_s += 60;
        }
    }

    /// A cache told which queue positions changed must plan what a fresh
    /// pass plans (less the waiting reasons), whatever the caller does to
    /// the queue between passes: placed jobs leave by `swap_remove`, jobs
    /// arrive at the end or replace others in place, invalid requests,
    /// duplicated ids, jobs listed as pending and running at once, and
    /// tenants that come and go.
    #[test]
    fn incremental_queue_decides_like_fresh_passes(seed in any::<u64>(), policy in policy_strategy()) {
        let mut input = random_input(seed, policy);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x9e0e);
        let mut terse = SchedCache::without_waiting_reasons();
        let mut changed_nodes: Vec<usize> = Vec::new();
        let mut changed: Vec<usize> = Vec::new();
        let mut next_id = 500;
        for round in 0..8 {
            let prox = TopologyProximity::new(&input.nodes);
            // The straightforward pass: everything read afresh. (Not
            // `schedule` with its reasons filtered: a duplicate's `invalid:`
            // reason is overwritten there by its original's waiting reason.)
            let expected = SchedCache::without_waiting_reasons()
                .schedule(&input, &prox, NodeChanges::All);
            let fresh = schedule(&input, &prox);
            prop_assert_eq!(&expected.placements, &fresh.placements);
            prop_assert_eq!(&expected.preemptions, &fresh.preemptions);
            let (nodes, queue) = if round == 0 {
                (NodeChanges::All, PendingChanges::All)
            } else {
                (NodeChanges::Only(&changed_nodes), PendingChanges::Only(&changed))
            };
            let planned = terse.schedule_incremental(&input, &prox, nodes, queue);
            prop_assert_eq!(&planned, &expected, "round {}", round);

            changed.clear();
            changed_nodes.clear();
            for placement in &expected.placements {
                apply(&mut input.nodes, placement);
                for (node_id, _) in &placement.nodes {
                    changed_nodes.extend(input.nodes.iter().position(|n| n.id == *node_id));
                }
                if let Some(position) = input.pending.iter().position(|(job, _)| job.id == placement.job) {
                    input.pending.swap_remove(position);
                    if position < input.pending.len() {
                        changed.push(position);
                    }
                }
            }
            // Arrivals at the end.
            for _ in 0..rng.random_range(0..4) {
                let tenant = TENANTS[rng.random_range(0..TENANTS.len())].0;
                let (mut job, request) = pending(
                    next_id,
                    tenant,
                    rng.random_range(1..=3),
                    rng.random_range(1..=4),
                    rng.random_range(1..7200),
                );
                next_id += 1;
                job.submitted_seq = rng.random_range(0..1000);
                match rng.random_range(0..8) {
                    // Invalid on its own.
                    0 => job.gpus += 1,
                    // A duplicate of a queued id.
                    1 => {
                        if let Some((queued, _)) = input.pending.first() {
                            job.id = queued.id;
                        }
                    }
                    // Pending and running at once.
                    2 => {
                        if let Some(running) = input.running.first() {
                            job.id = running.id;
                        }
                    }
                    _ => {}
                }
                let mut request = request;
                request.job = job.id;
                changed.push(input.pending.len());
                input.pending.push((job, request));
            }
            // A job replaced in place, e.g. requeued with a boost.
            if !input.pending.is_empty() && rng.random_bool(0.4) {
                let position = rng.random_range(0..input.pending.len());
                input.pending[position].0.boost += 1;
                input.pending[position].0.submitted_seq = rng.random_range(0..1000);
                changed.push(position);
            }
            // A job leaves from the middle (cancelled).
            if !input.pending.is_empty() && rng.random_bool(0.4) {
                let position = rng.random_range(0..input.pending.len());
                input.pending.swap_remove(position);
                if position < input.pending.len() {
                    changed.push(position);
                }
            }
            // A tenant appears or disappears: validity changes everywhere.
            if rng.random_bool(0.15) {
                if input.tenants.len() > 1 && rng.random_bool(0.5) {
                    input.tenants.pop();
                } else {
                    input.tenants.push(tenant("late", 1.0));
                }
            }
            input.now_s += 60;
        }
    }

    /// Passes skip summing tenants' holdings when nothing reads them (FIFO,
    /// or at most one job to order without preemption); the plans must be
    /// those of a pass that always sums them.
    #[test]
    fn skipping_unused_tenant_holdings_changes_no_plan(seed in any::<u64>(), policy in policy_strategy()) {
        let mut input = random_input(seed, policy);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x4e1d);
        // Short queues too, where the skip applies under hdrf.
        if rng.random_bool(0.5) {
            input.pending.truncate(rng.random_range(0..=input.pending.len().min(3)));
        }
        let prox = TopologyProximity::new(&input.nodes);
        let skipping = schedule(&input, &prox);
        pass::ALWAYS_SUM_HOLDINGS.with(|always| always.set(true));
        let summing = schedule(&input, &prox);
        pass::ALWAYS_SUM_HOLDINGS.with(|always| always.set(false));
        prop_assert_eq!(skipping, summing);
    }

    /// Priority ranks a tenant's jobs against each other only: adding the
    /// same amount — a million, say — to the priority of every job of one
    /// tenant, waiting or running, changes no decision of any pass. So a
    /// tenant's `--priority 1000000` neither overtakes nor preempts another
    /// tenant's work; fair share and the preemption rules alone decide.
    #[test]
    fn one_tenants_priorities_shifted_together_change_no_plan(
        seed in any::<u64>(),
        policy in policy_strategy(),
        which in 0..TENANTS.len(),
        shift in prop_oneof![Just(1_000_000i32), Just(-1_000_000), -5i32..5],
    ) {
        let input = random_input(seed, policy);
        let tenant = TENANTS[which].0;
        let mut shifted = input.clone();
        for (job, _) in shifted.pending.iter_mut().filter(|(job, _)| job.tenant == tenant) {
            job.priority += shift;
        }
        for job in shifted.running.iter_mut().filter(|job| job.tenant == tenant) {
            job.priority += shift;
        }
        let prox = TopologyProximity::new(&input.nodes);
        prop_assert_eq!(schedule(&input, &prox), schedule(&shifted, &prox));
    }

    #[test]
    fn hdrf_order_is_a_permutation(seed in any::<u64>()) {
        let input = random_input(seed, Policy::Hdrf);
        let demands: Vec<PendingDemand<'_>> = input
            .pending
            .iter()
            .map(|(job, request)| PendingDemand {
                job,
                resources: ResourceVector::gpus(request.gpu_model.as_deref(), job.gpus),
            })
            .collect();
        let mut capacity = ResourceVector::default();
        for node in &input.nodes {
            for gpu in &node.gpus {
                capacity.add_gpus(Some(&gpu.model), 1);
            }
        }
        let order = order_pending(&input.tenants, &capacity, &[], &demands);
        let expected: BTreeSet<JobId> = input.pending.iter().map(|(job, _)| job.id).collect();
        prop_assert_eq!(order.len(), expected.len());
        prop_assert_eq!(order.into_iter().collect::<BTreeSet<_>>(), expected);
    }

    #[test]
    fn placements_survive_unknown_and_hostile_rtts(seed in any::<u64>()) {
        let input = random_input(seed, Policy::Hdrf);
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5eed);
        let mut prox = MatrixProximity::new(None);
        for a in &input.nodes {
            for b in &input.nodes {
                if rng.random_bool(0.3) {
                    let rtt = match rng.random_range(0..4) {
                        0 => f64::NAN,
                        1 => -1.0,
                        _ => rng.random_range(0.0..20.0),
                    };
                    prox.set(a.id, b.id, rtt);
                }
            }
        }
        for (_, request) in &input.pending {
            if let Ok(placement) = place_gang(&input.nodes, &prox, request) {
                let nodes: BTreeSet<NodeId> = placement.nodes.iter().map(|(n, _)| *n).collect();
                prop_assert_eq!(nodes.len(), request.nodes as usize);
                prop_assert!(placement.diameter_ms.is_finite() && placement.diameter_ms >= 0.0);
                for (node_id, gpus) in &placement.nodes {
                    prop_assert_eq!(gpus.len(), request.gpus_per_node as usize);
                    let node = input.nodes.iter().find(|n| n.id == *node_id).unwrap();
                    for index in gpus {
                        let gpu = node.gpus.iter().find(|g| g.index == *index).unwrap();
                        prop_assert!(gpu.allocated_to.is_none());
                    }
                }
            }
        }
    }
}
