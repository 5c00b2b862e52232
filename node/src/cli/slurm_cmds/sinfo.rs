//! `sinfo`: nodes grouped by state, in Slurm's columns.

use super::*;

#[derive(Debug, Default)]
pub struct SinfoOpts {
    pub node_oriented: bool,
    pub long: bool,
    pub summarize: bool,
    pub format: Option<String>,
    pub noheader: bool,
    pub nodes: Vec<String>,
    pub json: bool,
}

pub(super) const SINFO_FIELDS: &str = "PalDtTNGFERn";

pub fn parse_sinfo(args: &[String]) -> Result<SinfoOpts, String> {
    let mut o = SinfoOpts::default();
    let mut r = Reader::new("sinfo", args);
    while let Some((name, inline, shown)) = r.next_option()? {
        match name.as_str() {
            "N" | "Node" => {
                o.node_oriented = true;
                r.switch(inline, &shown);
            }
            "l" | "long" => {
                o.long = true;
                r.switch(inline, &shown);
            }
            "s" | "summarize" => {
                o.summarize = true;
                r.switch(inline, &shown);
            }
            "h" | "noheader" => {
                o.noheader = true;
                r.switch(inline, &shown);
            }
            "a" | "all" | "v" | "verbose" => r.switch(inline, &shown),
            "o" | "format" => o.format = Some(r.value(inline, &shown)?),
            "p" | "partition" => {
                r.value(inline, &shown)?; // one partition: every name is it
            }
            "n" | "nodes" => o.nodes.extend(list(&r.value(inline, &shown)?)),
            "json" => o.json = true,
            _ => return Err(r.unsupported(&shown)),
        }
    }
    if let Some(f) = &o.format {
        parse_format("sinfo", f, SINFO_FIELDS)?;
    }
    Ok(o)
}

/// A node's (compact, long) Slurm state: idle, mix, alloc from its GPUs;
/// drain (drng while jobs still hold GPUs), down; `*` when it is suspect
/// (not responding).
pub fn node_state(n: &NodeInfo) -> (String, String) {
    let used = n.gpus_total.saturating_sub(n.gpus_free);
    let (short, long) = match n.state {
        MemberState::Down | MemberState::Left => ("down", "DOWN"),
        _ if n.drained && used > 0 => ("drng", "DRAINING"),
        _ if n.drained => ("drain", "DRAINED"),
        _ if used == 0 => ("idle", "IDLE"),
        _ if n.gpus_free == 0 => ("alloc", "ALLOCATED"),
        _ => ("mix", "MIXED"),
    };
    let star = if n.state == MemberState::Suspect {
        "*"
    } else {
        ""
    };
    (format!("{short}{star}"), format!("{long}{star}"))
}

/// `gpu:MODEL:N[,gpu:MODEL2:M]`.
pub(super) fn gres(n: &NodeInfo) -> String {
    let mut models: Vec<(String, u32)> = Vec::new();
    for g in &n.gpus {
        match models.iter_mut().find(|(m, _)| *m == g.model) {
            Some((_, c)) => *c += 1,
            None => models.push((g.model.clone(), 1)),
        }
    }
    if models.is_empty() {
        return "(null)".into();
    }
    models
        .iter()
        .map(|(m, c)| format!("gpu:{m}:{c}"))
        .collect::<Vec<_>>()
        .join(",")
}

/// One line of sinfo: a group of nodes (one node with -N).
pub(super) struct NodeGroup<'a> {
    nodes: Vec<&'a NodeInfo>,
}

pub(super) fn sinfo_header(kind: char) -> String {
    match kind {
        'P' => "PARTITION",
        'a' => "AVAIL",
        'l' => "TIMELIMIT",
        'D' => "NODES",
        't' | 'T' => "STATE",
        'N' => "NODELIST",
        'n' => "HOSTNAMES",
        'G' => "GRES",
        'F' => "NODES(A/I/O/T)",
        'E' | 'R' => "REASON",
        _ => "?",
    }
    .to_string()
}

pub(super) fn sinfo_field(g: &NodeGroup, kind: char) -> String {
    let first = g.nodes.first();
    match kind {
        'P' => format!("{PARTITION}*"),
        'a' => "up".into(),
        'l' => "infinite".into(),
        'D' => g.nodes.len().to_string(),
        't' => first.map(|n| node_state(n).0).unwrap_or_default(),
        'T' => first.map(|n| node_state(n).1).unwrap_or_default(),
        'N' | 'n' => g
            .nodes
            .iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(","),
        'G' => {
            let mut all: Vec<String> = g.nodes.iter().map(|n| gres(n)).collect();
            all.dedup();
            all.join(",")
        }
        'F' => {
            let (mut a, mut i, mut o) = (0, 0, 0);
            for n in &g.nodes {
                match node_state(n).0.trim_end_matches('*') {
                    "alloc" | "mix" => a += 1,
                    "idle" => i += 1,
                    _ => o += 1,
                }
            }
            format!("{a}/{i}/{o}/{}", g.nodes.len())
        }
        'E' | 'R' => {
            let reasons: Vec<&str> = g
                .nodes
                .iter()
                .filter(|n| n.drained)
                .map(|_| "drained")
                .collect();
            if reasons.is_empty() {
                "none".into()
            } else {
                reasons[0].into()
            }
        }
        _ => String::new(),
    }
}

pub fn sinfo_text(o: &SinfoOpts, nodes: &[NodeInfo]) -> anyhow::Result<String> {
    let fmt = o.format.clone().unwrap_or_else(|| {
        match (o.node_oriented, o.long, o.summarize) {
            (_, _, true) => "%#P %.5a %.10l %.15F %N",
            (true, true, _) => "%#N %.6D %#P %.11T %.20G %E",
            (true, false, _) => "%#N %.6D %#P %6t",
            (false, true, _) => "%#P %.5a %.10l %.6D %.11T %N",
            (false, false, _) => "%#P %.5a %.10l %.6D %.6t %N",
        }
        .to_string()
    });
    let pieces = parse_format("sinfo", &fmt, SINFO_FIELDS).map_err(anyhow::Error::msg)?;
    let mut nodes: Vec<&NodeInfo> = nodes
        .iter()
        .filter(|n| n.state != MemberState::Left)
        .filter(|n| o.nodes.is_empty() || o.nodes.contains(&n.name))
        .collect();
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    let groups: Vec<NodeGroup> = if o.node_oriented {
        nodes
            .into_iter()
            .map(|n| NodeGroup { nodes: vec![n] })
            .collect()
    } else if o.summarize {
        vec![NodeGroup { nodes }]
    } else {
        // One line per state, in order of first appearance.
        let mut groups: Vec<(String, NodeGroup)> = Vec::new();
        for n in nodes {
            let s = node_state(n).1;
            match groups.iter_mut().find(|(k, _)| *k == s) {
                Some((_, g)) => g.nodes.push(n),
                None => groups.push((s, NodeGroup { nodes: vec![n] })),
            }
        }
        groups.into_iter().map(|(_, g)| g).collect()
    };
    let header: &dyn Fn(char) -> String = &sinfo_header;
    Ok(render(
        &pieces,
        &groups,
        (!o.noheader).then_some(header),
        &sinfo_field,
    ))
}
