//! Checks of a job's spec at submit: its own bounds, and whether the
//! cluster could ever run it.

use super::*;

pub(crate) fn validate_spec(spec: &JobSpec) -> Result<(), String> {
    if spec.nodes == 0 {
        return Err("a job needs at least one node (-N)".into());
    }
    if spec.gpus_per_node == 0 {
        return Err("a job needs at least one GPU per node (--gpus-per-node)".into());
    }
    if spec.nodes > 100_000 || spec.gpus_per_node > 1024 {
        return Err(format!(
            "{} nodes × {} GPUs is not a plausible request",
            spec.nodes, spec.gpus_per_node
        ));
    }
    if spec.time_limit_s == 0 {
        return Err("the time limit (-t) must be positive".into());
    }
    if spec.mem_bytes == Some(0) {
        return Err("the memory of a rank (--mem) must be positive".into());
    }
    if spec.cpus_per_task == Some(0) {
        return Err("the CPUs of a rank (--cpus-per-task) must be positive".into());
    }
    let tasks = spec.tasks_per_node();
    if tasks > 1024 {
        return Err(format!("{tasks} tasks per node is not a plausible request"));
    }
    if !spec.gpus_per_node.is_multiple_of(tasks) {
        return Err(format!(
            "{tasks} tasks per node cannot share {} GPUs per node equally (--ntasks-per-node must divide the GPUs per node)",
            spec.gpus_per_node
        ));
    }
    if !spec.name.is_empty() && spec.name.len() > 128 {
        return Err("job names are at most 128 characters".into());
    }
    let bytes: usize = spec.command.iter().map(String::len).sum::<usize>()
        + spec
            .env
            .iter()
            .map(|(k, v)| k.len() + v.len())
            .sum::<usize>();
    if bytes > MAX_JOB_SPEC_BYTES {
        return Err(format!(
            "the command and environment take {bytes} bytes; the limit is {MAX_JOB_SPEC_BYTES}"
        ));
    }
    if spec.env.keys().any(|k| k.is_empty() || k.contains('=')) {
        return Err("environment names must be non-empty and contain no '='".into());
    }
    if spec.ckpt_peer_copies > crate::workload::MAX_PEER_COPIES {
        return Err(format!(
            "--ckpt-replicas: at most {} copies in the job's region besides the writer's, not {}",
            crate::workload::MAX_PEER_COPIES,
            spec.ckpt_peer_copies
        ));
    }
    if spec.ckpt_region_copies > crate::workload::MAX_REGION_COPIES {
        return Err(format!(
            "--ckpt-replicas: at most {} copy in another region, not {}",
            crate::workload::MAX_REGION_COPIES,
            spec.ckpt_region_copies
        ));
    }
    Ok(())
}

/// Refuses a job that no set of the cluster's members could ever host:
/// too many GPUs on one node, a GPU model no member has, labels no member
/// carries, or more nodes than qualify. Every member that has not left
/// counts, whatever its state (a node that is down, suspect or drained for
/// maintenance may come back), and all of its GPUs count, faulty or drained
/// ones included (an operator may return them to service): the question is
/// whether the job could *ever* run, not whether it can run now. A node
/// hosts one rank on GPUs of a single model ([`gpu_model_matches`] for a
/// named model), as the scheduler places it. A ledger without members (a
/// cluster being built, unit tests of other parts) cannot judge and admits
/// the job. One pass over the members and their GPUs.
pub(crate) fn check_feasible(
    spec: &JobSpec,
    members: &BTreeMap<NodeId, Member>,
) -> Result<(), String> {
    let current: Vec<&Member> = members
        .values()
        .filter(|m| m.state != MemberState::Left)
        .collect();
    if current.is_empty() {
        return Ok(());
    }
    let current: Vec<&Member> = current
        .into_iter()
        .filter(|m| spec.choice.allows(m.id))
        .collect();
    if current.is_empty() {
        return Err("no node of the cluster is outside --exclude".into());
    }
    let labels = || {
        spec.required_labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let wanted = |model: &str| {
        spec.gpu_model
            .as_deref()
            .is_none_or(|w| gpu_model_matches(w, model))
    };
    let mut labelled = 0usize;
    // Models seen on labelled members, and the largest single-model count
    // of a wanted model on one labelled member (with that model).
    let mut models: BTreeSet<&str> = BTreeSet::new();
    let mut largest: Option<(u32, &str)> = None;
    let mut hosts = 0u32;
    for member in &current {
        if !spec
            .required_labels
            .iter()
            .all(|(k, v)| member.spec.labels.get(k) == Some(v))
        {
            continue;
        }
        labelled += 1;
        let mut per_model: BTreeMap<&str, u32> = BTreeMap::new();
        for gpu in &member.spec.gpus {
            models.insert(gpu.model.as_str());
            if wanted(&gpu.model) {
                *per_model.entry(gpu.model.as_str()).or_default() += 1;
            }
        }
        let best = per_model
            .iter()
            .map(|(model, count)| (*count, *model))
            .max_by(|a, b| a.0.cmp(&b.0).then(b.1.cmp(a.1)));
        if let Some((count, model)) = best {
            if largest.is_none_or(|(c, _)| count > c) {
                largest = Some((count, model));
            }
            if count >= spec.gpus_per_node {
                hosts += 1;
            }
        }
    }
    let mut where_ = if spec.required_labels.is_empty() {
        String::new()
    } else {
        format!(" labelled {}", labels())
    };
    if !spec.choice.only.is_empty() {
        where_.push_str(" in --nodelist");
    } else if !spec.choice.exclude.is_empty() {
        where_.push_str(" outside --exclude");
    }
    if labelled == 0 {
        let what = if spec.required_labels.len() == 1 {
            "label"
        } else {
            "labels"
        };
        return Err(format!("no node carries {what} {}", labels()));
    }
    if let Some(model) = &spec.gpu_model {
        if largest.is_none() {
            let known: Vec<&str> = models.into_iter().collect();
            let known = if known.is_empty() {
                "none".to_string()
            } else {
                known.join(", ")
            };
            return Err(format!(
                "no node{where_} has GPU model {model} (models: {known})"
            ));
        }
    }
    if largest.is_none_or(|(count, _)| count < spec.gpus_per_node) {
        let largest = match largest {
            Some((count, model)) => format!("largest: {count} × {model}"),
            None => "none has any".to_string(),
        };
        let kind = spec
            .gpu_model
            .as_deref()
            .map_or(String::new(), |m| format!(" {m}"));
        return Err(format!(
            "no node{where_} has {}{kind} GPUs ({largest})",
            spec.gpus_per_node
        ));
    }
    if hosts < spec.nodes {
        let kind = spec
            .gpu_model
            .as_deref()
            .map_or(String::new(), |m| format!(" {m}"));
        return Err(format!(
            "the job needs {} nodes with {}{kind} GPUs each{where_}, but only {hosts} of the cluster's {} nodes have them",
            spec.nodes,
            spec.gpus_per_node,
            current.len()
        ));
    }
    Ok(())
}

/// The nodes a job names (`--nodelist`, `--exclude`) must be members; a
/// nodelist names the whole gang, and no node is both listed and excluded.
pub(super) fn check_node_choice(
    spec: &JobSpec,
    members: &BTreeMap<NodeId, Member>,
) -> Result<(), String> {
    let choice = &spec.choice;
    for (flag, ids) in [("--nodelist", &choice.only), ("--exclude", &choice.exclude)] {
        if ids.len() > MAX_NAMED_NODES {
            return Err(format!(
                "{flag} names {} nodes; at most {MAX_NAMED_NODES}",
                ids.len()
            ));
        }
        if !ids.windows(2).all(|w| w[0] < w[1]) {
            return Err(format!("{flag}: node ids must be sorted and distinct"));
        }
        if let Some(id) = ids
            .iter()
            .find(|id| members.get(id).is_none_or(|m| m.state == MemberState::Left))
        {
            return Err(format!("{flag}: node {id} is not a member of the cluster"));
        }
    }
    if let Some(id) = choice.only.iter().find(|id| !choice.allows(**id)) {
        let name = members
            .get(id)
            .map_or(id.to_string(), |m| m.spec.name.clone());
        return Err(format!(
            "node {name} is both in --nodelist and in --exclude"
        ));
    }
    let listed = choice.only.len();
    if listed > 0 && listed != spec.nodes as usize {
        return Err(format!(
            "--nodelist names {listed} node(s) but the job asks for {} (-N): a job runs on exactly the nodes listed",
            spec.nodes
        ));
    }
    Ok(())
}
