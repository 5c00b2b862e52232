//! The crate's module graph as a test: which module names which (through
//! `crate::` and `super::` paths, outside `#[cfg(test)]` modules), and that
//! the graph has no cycle — no module reaches up into one that depends on it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type ModPath = Vec<String>;

/// Every module of the crate under `src`, by path, with its source.
fn modules(src: &Path) -> BTreeMap<ModPath, String> {
    let mut out = BTreeMap::new();
    let mut dirs = vec![src.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                dirs.push(path);
                continue;
            }
            if path.extension().and_then(|e| e.to_str()) != Some("rs") {
                continue;
            }
            // The binary's `main.rs` is a crate of its own, on the library.
            if path.file_name().is_some_and(|n| n == "main.rs") && dir.join("lib.rs").exists() {
                continue;
            }
            let Ok(rel) = path.strip_prefix(src) else {
                continue;
            };
            let mut parts: ModPath = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            if matches!(
                parts.last().map(String::as_str),
                Some("mod" | "lib" | "main")
            ) {
                parts.pop();
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            out.insert(parts, text);
        }
    }
    // Test modules may reach anywhere; the architecture is the rest: a
    // file declared `#[cfg(test)] mod x;` is left out with its children,
    // and an inline `#[cfg(test)] mod x { … }` (last in its file) is cut.
    let mut test_only = BTreeSet::new();
    for (module, text) in &out {
        for (at, _) in text.match_indices("#[cfg(test)]\n") {
            let rest = text[at + "#[cfg(test)]\n".len()..].trim_start_matches("pub ");
            if let Some(decl) = rest.strip_prefix("mod ") {
                let name = path_at(decl);
                if decl[name.iter().map(String::len).sum::<usize>()..].starts_with(';') {
                    test_only.extend(name.first().map(|n| {
                        module
                            .iter()
                            .cloned()
                            .chain([n.clone()])
                            .collect::<ModPath>()
                    }));
                }
            }
        }
    }
    out.retain(|module, _| !test_only.iter().any(|t| module.starts_with(t)));
    for text in out.values_mut() {
        if let Some(at) = text.find("#[cfg(test)]\nmod tests {") {
            text.truncate(at);
        }
    }
    out
}

/// The `::`-separated identifiers starting at `text`.
fn path_at(text: &str) -> ModPath {
    let mut out = Vec::new();
    let mut rest = text;
    loop {
        let len = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if len == 0 {
            break;
        }
        out.push(rest[..len].to_string());
        rest = &rest[len..];
        match rest.strip_prefix("::") {
            Some(r) => rest = r,
            None => break,
        }
    }
    out
}

/// Every path a module names below the crate root, resolved to absolute.
fn referenced_paths(module: &[String], code: &str) -> Vec<ModPath> {
    let mut out = Vec::new();
    for (at, _) in code.match_indices("crate::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        let rest = &code[at + "crate::".len()..];
        let path = path_at(rest);
        // `use crate::a::{b, c::D}`: one path per item.
        let after = &rest[path
            .iter()
            .map(|p| p.len() + 2)
            .sum::<usize>()
            .min(rest.len())..];
        if let (Some(group), true) = (after.strip_prefix('{'), rest.contains('{')) {
            let end = group.find('}').unwrap_or(group.len());
            for item in group[..end].split(',') {
                let item = path_at(item.trim());
                if !item.is_empty() && item[0] != "self" {
                    out.push(path.iter().cloned().chain(item).collect());
                }
            }
        }
        out.push(path);
    }
    for (at, _) in code.match_indices("super::") {
        let before = code[..at].chars().next_back();
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':') {
            continue;
        }
        let path = path_at(&code[at..]);
        let ups = path.iter().take_while(|p| *p == "super").count();
        if ups > module.len() {
            continue;
        }
        let base = &module[..module.len() - ups];
        out.push(
            base.iter()
                .cloned()
                .chain(path[ups..].iter().cloned())
                .collect(),
        );
    }
    out
}

/// Module → the modules it names (the longest prefix of each named path
/// that is a module, following `pub use` re-exports).
fn graph(src: &Path) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let mods = modules(src);
    let resolve = |path: &[String]| -> ModPath {
        (0..=path.len())
            .rev()
            .map(|n| path[..n].to_vec())
            .find(|p| mods.contains_key(p))
            .unwrap_or_default()
    };
    let mut reexports: BTreeMap<(ModPath, String), ModPath> = BTreeMap::new();
    for (module, code) in &mods {
        for (at, _) in code.match_indices("pub use ") {
            let path = path_at(&code[at + "pub use ".len()..]);
            let Some((name, base)) = path.split_last() else {
                continue;
            };
            let absolute: ModPath = match base.first().map(String::as_str) {
                Some("crate") => base[1..].to_vec(),
                _ => module.iter().chain(base).cloned().collect(),
            };
            reexports.insert((module.clone(), name.clone()), resolve(&absolute));
        }
    }
    let mut out = BTreeMap::new();
    for (module, code) in &mods {
        let mut deps = BTreeSet::new();
        for path in referenced_paths(module, code) {
            let mut target = resolve(&path);
            if let Some(next) = path.get(target.len()) {
                if let Some(defined) = reexports.get(&(target.clone(), next.clone())) {
                    target = defined.clone();
                }
            }
            // A module may name itself and its ancestors (re-exports, docs).
            if !target.is_empty() && !module.starts_with(&target) {
                deps.insert(target);
            }
        }
        out.insert(module.clone(), deps);
    }
    out
}

/// The strongly connected components with more than one module.
fn cycles(graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> Vec<Vec<ModPath>> {
    // Kosaraju: order by finish time, then walk the reversed graph.
    fn finish(
        v: &ModPath,
        g: &BTreeMap<ModPath, BTreeSet<ModPath>>,
        seen: &mut BTreeSet<ModPath>,
        order: &mut Vec<ModPath>,
    ) {
        if !seen.insert(v.clone()) {
            return;
        }
        for w in g.get(v).into_iter().flatten() {
            finish(w, g, seen, order);
        }
        order.push(v.clone());
    }
    let mut seen = BTreeSet::new();
    let mut order = Vec::new();
    for v in graph.keys() {
        finish(v, graph, &mut seen, &mut order);
    }
    let mut reversed: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (v, ws) in graph {
        for w in ws {
            reversed.entry(w.clone()).or_default().insert(v.clone());
        }
    }
    let mut assigned = BTreeSet::new();
    let mut out = Vec::new();
    for v in order.iter().rev() {
        if assigned.contains(v) {
            continue;
        }
        let mut component = Vec::new();
        let mut stack = vec![v.clone()];
        while let Some(x) = stack.pop() {
            if !assigned.insert(x.clone()) {
                continue;
            }
            component.push(x.clone());
            stack.extend(reversed.get(&x).into_iter().flatten().cloned());
        }
        if component.len() > 1 {
            component.sort();
            out.push(component);
        }
    }
    out
}

fn name(path: &[String]) -> String {
    if path.is_empty() {
        "crate".into()
    } else {
        path.join("::")
    }
}

/// The graph between top-level modules: an edge wherever a module, or
/// any module below it, names another top-level module or one below it.
fn top_level(graph: &BTreeMap<ModPath, BTreeSet<ModPath>>) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (module, deps) in graph {
        let Some(from) = module.first() else {
            continue;
        };
        let entry = out.entry(from.clone()).or_default();
        entry.extend(
            deps.iter()
                .filter_map(|d| d.first())
                .filter(|to| *to != from)
                .cloned(),
        );
    }
    out
}

/// What breaks a crate's declared layers: a top-level module in no layer
/// (or in two), and every `crate::` path that does not point down them —
/// to a module of the same layer or of one above.
fn layer_breaches(
    graph: &BTreeMap<ModPath, BTreeSet<ModPath>>,
    layers: &[(&str, &[&str])],
) -> Vec<String> {
    let mut out = Vec::new();
    let mut layer_of = BTreeMap::new();
    for (index, (_, modules)) in layers.iter().enumerate() {
        for m in *modules {
            if layer_of.insert(m.to_string(), index).is_some() {
                out.push(format!("`{m}` is in two layers"));
            }
        }
    }
    let tops = top_level(graph);
    for m in tops.keys() {
        if !layer_of.contains_key(m) {
            out.push(format!(
                "`{m}` is in no layer: place it in the crate's declared layers"
            ));
        }
    }
    for (from, deps) in &tops {
        let Some(&at) = layer_of.get(from) else {
            continue;
        };
        for to in deps {
            let Some(&target) = layer_of.get(to) else {
                continue;
            };
            if target >= at {
                let examples: Vec<String> = graph
                    .iter()
                    .filter(|(m, d)| {
                        m.first() == Some(from) && d.iter().any(|x| x.first() == Some(to))
                    })
                    .map(|(m, _)| name(m))
                    .take(3)
                    .collect();
                out.push(format!(
                    "`{from}` ({}) names `{to}` ({}), which is not below it (in {})",
                    layers[at].0,
                    layers[target].0,
                    examples.join(", ")
                ));
            }
        }
    }
    out
}

/// consensus/'s layers, lowest first: each module names only modules of
/// the layers below its own. The ledger (`ledger/`) owns the state and the
/// dispatch; each concern's records and rules sit below it and know
/// nothing of the ledger, and `ledger/` holds the transitions that read or
/// write more than one concern.
const CONSENSUS_LAYERS: &[(&str, &[&str])] = &[
    ("pure cores", &["ids", "sched", "escrow"]),
    (
        "records",
        &[
            "members",
            "events",
            "namespace",
            "voters",
            "replicas",
            "tokens",
            "once",
        ],
    ),
    ("concerns", &["ca", "workload"]),
    ("regions", &["federation"]),
    ("the log's commands", &["command"]),
    ("the state machine", &["ledger", "types"]),
    ("storage and transport", &["store", "network"]),
    ("disaster recovery", &["recovery"]),
];

/// node/'s layers, lowest first (the crate docs say what each holds).
const NODE_LAYERS: &[(&str, &[&str])] = &[
    (
        "wire, test faults and pure helpers",
        &["proto", "faults", "clock", "procstat", "hostlist"],
    ),
    (
        "the host's own facts",
        &["identity", "credentials", "backup", "gpu", "peers"],
    ),
    ("federation state", &["federation"]),
    ("configuration and metrics", &["config", "metrics"]),
    ("ledger access", &["ledger_client"]),
    (
        "trust, views and the worker loop",
        &["trust", "gpu_relay", "views", "worker"],
    ),
    ("member transport", &["rpc"]),
    ("checkpoints", &["ckpt"]),
    ("the node's root", &["node"]),
    ("what works on the whole node", &["regions", "anomaly"]),
    ("job execution", &["executor"]),
    ("servers and loops", &["rpc_handler", "workers", "api"]),
    ("start-up", &["agent"]),
    ("the command line", &["cli"]),
];

/// Checks the crate whose sources are at `src` (relative to node/): no
/// import cycle among its modules, and every path pointing down `layers`.
fn check_crate(src: &str, layers: &[(&str, &[&str])]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join(src);
    let g = graph(&dir);
    assert!(
        g.len() > 20,
        "found only {} modules under {}",
        g.len(),
        dir.display()
    );
    let shown: Vec<String> = cycles(&g)
        .iter()
        .map(|c| c.iter().map(|m| name(m)).collect::<Vec<_>>().join(" <-> "))
        .collect();
    assert!(
        shown.is_empty(),
        "import cycles under {src}:\n{}",
        shown.join("\n")
    );
    let breaches = layer_breaches(&g, layers);
    assert!(
        breaches.is_empty(),
        "layers of {src}:\n{}",
        breaches.join("\n")
    );
}

#[test]
fn node_is_a_tree_in_its_declared_layers() {
    check_crate("src", NODE_LAYERS);
}

#[test]
fn consensus_is_a_tree_in_its_declared_layers() {
    check_crate("../consensus/src", CONSENSUS_LAYERS);
}

/// The module graph of a crate made of `files` (path, source).
fn graph_of(files: &[(&str, &str)]) -> BTreeMap<ModPath, BTreeSet<ModPath>> {
    let dir = tempfile::tempdir().expect("tempdir");
    for (rel, text) in files {
        let path = dir.path().join(rel);
        std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
        std::fs::write(path, text).expect("write");
    }
    graph(dir.path())
}

fn m(s: &str) -> ModPath {
    s.split("::").map(String::from).collect()
}

#[test]
fn the_checker_sees_a_cycle_and_a_re_export() {
    let g = graph_of(&[
        ("lib.rs", "pub mod a;\npub mod b;\npub mod c;\n"),
        ("a/mod.rs", "pub mod inner;\npub use inner::Thing;\n"),
        ("a/inner.rs", "use crate::b::helper;\n"),
        ("b.rs", "use crate::{c::Other, a::Thing};\n"),
        ("c.rs", "#[cfg(test)]\nmod tests { use crate::b; }\n"),
    ]);
    assert_eq!(g[&m("b")], [m("a::inner"), m("c")].into());
    assert!(g[&m("c")].is_empty(), "test modules do not count");
    assert_eq!(cycles(&g), vec![vec![m("a::inner"), m("b")]]);
    let layers: &[(&str, &[&str])] = &[("low", &["c", "a"]), ("high", &["b"])];
    let breaches = layer_breaches(&g, layers);
    assert_eq!(breaches.len(), 1, "{breaches:?}");
    assert!(
        breaches[0].starts_with("`a` (low) names `b` (high)"),
        "{breaches:?}"
    );
}

#[test]
fn the_checker_leaves_out_test_modules_and_places_every_module() {
    let g = graph_of(&[
        (
            "lib.rs",
            "pub mod a;\npub mod b;\n#[cfg(test)]\nmod harness;\npub mod c;\n",
        ),
        (
            "a.rs",
            "#[cfg(test)]\nmod tests;\npub fn f() {}\nuse crate::b::g;\n",
        ),
        ("a/tests.rs", "use crate::c::h;\n"),
        ("b.rs", "pub fn g() {}\n"),
        ("c.rs", "use crate::a::f;\n"),
        ("harness.rs", "use crate::c::h;\n"),
    ]);
    assert!(!g.contains_key(&m("harness")) && !g.contains_key(&m("a::tests")));
    assert_eq!(
        g[&m("a")],
        [m("b")].into(),
        "code after a test module's declaration counts"
    );
    let layers: &[(&str, &[&str])] = &[("low", &["b"]), ("mid", &["a"])];
    assert_eq!(
        layer_breaches(&g, layers),
        vec!["`c` is in no layer: place it in the crate's declared layers".to_string()]
    );
}

/// Every source file of the workspace's crates stays readable in one
/// sitting: at most this many lines, test modules in files of their own
/// (`tests.rs`, `proptests.rs`) aside.
const MAX_SOURCE_LINES: usize = 1200;

#[test]
fn no_source_file_is_over_1200_lines() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut long = Vec::new();
    for krate in [
        "sdk",
        "mesh",
        "consensus",
        "storage",
        "sim",
        "chaos",
        "node",
    ] {
        let mut dirs = vec![root.join(krate).join("src")];
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("a source folder").flatten() {
                let path = entry.path();
                if path.is_dir() {
                    dirs.push(path);
                    continue;
                }
                let name = entry.file_name().to_string_lossy().into_owned();
                if !name.ends_with(".rs") || name == "tests.rs" || name == "proptests.rs" {
                    continue;
                }
                let lines = std::fs::read_to_string(&path)
                    .expect("a source file")
                    .lines()
                    .count();
                if lines > MAX_SOURCE_LINES {
                    long.push(format!("{} ({lines} lines)", path.display()));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "over {MAX_SOURCE_LINES} lines; cut along a seam: {long:?}"
    );
}
