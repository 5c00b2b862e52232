//! `shoal status` and `shoal nodes` as text.

use super::*;

pub(super) fn format_status(s: &StatusResponse) -> String {
    let name_of = |id: u64| {
        s.members
            .iter()
            .find(|m| m.id == id)
            .map(|m| m.name.clone())
            .unwrap_or_else(|| "?".into())
    };
    let mut out = String::new();
    out.push_str(&format!(
        "cluster  {}  (region {})\n",
        s.cluster_id, s.region
    ));
    if !s.ca_fingerprint.is_empty() {
        out.push_str(&format!("ca       {}\n", s.ca_fingerprint));
    }
    match s.leader {
        Some(l) => out.push_str(&format!(
            "leader   {} ({})  term {}  commit {}\n",
            l,
            name_of(l),
            s.term,
            s.commit_index
        )),
        None => out.push_str("leader   none\n"),
    }
    if !s.ca_fingerprint.is_empty() {
        out.push_str(&format!("ca       {}", s.ca_fingerprint));
        match &s.ca_rotation {
            Some(phase) => out.push_str(&format!("  (rotation: {phase}; shoal ca status)\n")),
            None => out.push('\n'),
        }
    }
    out.push_str(&format!(
        "voters   {}\n",
        s.voters
            .iter()
            .map(|v| format!("{v} ({})", name_of(*v)))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    if let Some(p) = s.effective_protocol {
        out.push_str(&format!(
            "protocol {p}  (the newest version every member speaks)\n"
        ));
    }
    out.push_str(&format!(
        "{:<6}{:<20}{:<10}{:<9}{:<12}{}\n",
        "ID", "NAME", "STATE", "ROLE", "VERSION", "PROTOCOL"
    ));
    for m in &s.members {
        let role = if s.leader == Some(m.id) {
            "leader"
        } else if s.voters.contains(&m.id) {
            "voter"
        } else if s.learners.contains(&m.id) {
            "learner"
        } else {
            "relayed"
        };
        let dash = |v: &str| {
            if v.is_empty() {
                "-".to_string()
            } else {
                v.to_string()
            }
        };
        out.push_str(&format!(
            "{:<6}{:<20}{:<10}{:<9}{:<12}{}\n",
            m.id,
            m.name,
            m.state,
            role,
            dash(&m.version),
            dash(&m.protocol)
        ));
    }
    out
}

pub(super) fn format_nodes(nodes: &[NodeInfo]) -> String {
    let mut out = format!(
        "{:<5}{:<16}{:<9}{:<23}{:<11}{:<14}{:<6}{:<10}{:<26}{}\n",
        "ID", "NAME", "STATE", "ADDR", "GPUS", "MODEL", "UTIL", "SEEN", "ISOLATION", "LABELS"
    );
    for n in nodes {
        let mut models: Vec<&str> = n.gpus.iter().map(|g| g.model.as_str()).collect();
        models.dedup();
        let labels = n
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        let seen = match n.last_seen_ms {
            Some(ms) if ms < 1000 => format!("{ms}ms"),
            Some(ms) => format!("{:.1}s", ms as f64 / 1000.0),
            None => "-".into(),
        };
        out.push_str(&format!(
            "{:<5}{:<16}{:<9}{:<23}{:<11}{:<14}{:<6}{:<10}{:<26}{}\n",
            n.id,
            n.name,
            if n.drained {
                format!("{}*", n.state)
            } else {
                n.state.to_string()
            },
            n.addr,
            format!("{}/{}", n.gpus_free, n.gpus_total),
            if models.is_empty() {
                "-".to_string()
            } else {
                models.join("+")
            },
            n.gpu_util
                .filter(|_| n.gpus_total > 0)
                .map(|u| format!("{:.0}%", u * 100.0))
                .unwrap_or_else(|| "-".into()),
            seen,
            isolation_text(&n.isolation, &n.isolation_controllers),
            if labels.is_empty() {
                "-".to_string()
            } else {
                labels
            }
        ));
    }
    // GPUs that take no work, one line each, so nobody wonders why.
    for n in nodes {
        for g in n
            .gpus
            .iter()
            .filter(|g| g.health != "ok" && !g.health.is_empty())
        {
            out.push_str(&format!(
                "  GPU {}:{} {}: {}\n",
                n.name,
                g.index,
                g.health,
                g.health_reason.as_deref().unwrap_or("-")
            ));
        }
    }
    out
}

/// `none`, `cgroup (kill only)`, `cgroup (memory,cpu,pids)`; `-` for a node
/// that has not said (an older agent).
pub(super) fn isolation_text(mode: &str, controllers: &[String]) -> String {
    match (mode, controllers) {
        ("", _) => "-".into(),
        ("cgroup", []) => "cgroup (kill only)".into(),
        ("cgroup", c) => format!("cgroup ({})", c.join(",")),
        (other, _) => other.to_string(),
    }
}
