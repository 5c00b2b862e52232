#!/usr/bin/env python3
"""Prints the import graph between the modules of a crate's src/ and fails
if it has a cycle. A module depends on another when it names a path under
`crate::` (or `super::`) that resolves to that module's file; re-exports are
followed to the module that defines the name when it is `pub use`d.

usage: scripts/module-graph.py [node/src] [--edges]
"""
import os
import re
import sys

root = next((a for a in sys.argv[1:] if not a.startswith("--")), "node/src")
show_edges = "--edges" in sys.argv

modules = {}  # module path (tuple) -> file
for dirpath, _, files in os.walk(root):
    for f in files:
        if not f.endswith(".rs"):
            continue
        rel = os.path.relpath(os.path.join(dirpath, f), root)[:-3].split(os.sep)
        if rel[-1] in ("mod", "lib", "main"):
            rel = rel[:-1]
        modules[tuple(rel)] = os.path.join(dirpath, f)

def strip_tests(text):
    # Test modules may reach anywhere; the architecture is about the rest.
    m = re.search(r"#\[cfg\(test\)\]\s*mod\s+\w+\s*\{", text)
    return text[: m.start()] if m else text

def resolve(path):
    """The longest prefix of `path` that is a module."""
    for n in range(len(path), -1, -1):
        if tuple(path[:n]) in modules:
            return tuple(path[:n])
    return ()

reexports = {}  # (module, name) -> module defining it
for mod, f in modules.items():
    text = strip_tests(open(f).read())
    for m in re.finditer(r"pub use ([\w:]+)::(\w+);", text):
        base = m.group(1).split("::")
        if base[0] == "crate":
            target = base[1:]
        elif base[0] in ("self",):
            target = list(mod) + base[1:]
        else:
            target = list(mod) + base
        reexports[(mod, m.group(2))] = resolve(target)

graph = {m: set() for m in modules}
for mod, f in modules.items():
    text = strip_tests(open(f).read())
    refs = []
    for m in re.finditer(r"\bcrate((?:::\w+)+)", text):
        refs.append(m.group(1).split("::")[1:])
    for m in re.finditer(r"\b((?:super::)+)((?:\w+::)*\w+)", text):
        ups = m.group(1).count("super::")
        base = list(mod[: len(mod) - ups]) if ups <= len(mod) else []
        refs.append(base + m.group(2).split("::"))
    # `use crate::a::{b, c}` groups
    for m in re.finditer(r"use crate::([\w:]*)\{([^}]*)\}", text):
        prefix = [p for p in m.group(1).split("::") if p]
        for item in m.group(2).split(","):
            item = item.strip().split(" ")[0]
            if item and item != "self":
                refs.append(prefix + item.split("::"))
    for path in refs:
        target = resolve(path)
        # Follow a re-export: `crate::node::LedgerClient` is node::client's.
        n = len(target)
        if n < len(path) and (target, path[n]) in reexports:
            target = reexports[(target, path[n])]
        if target and target != mod and target != mod[: len(target)]:
            graph[mod].add(target)

def name(m):
    return "::".join(m) or "crate"

if show_edges:
    for m in sorted(graph):
        print(f"{name(m)} -> {', '.join(name(t) for t in sorted(graph[m]))}")

# Tarjan's strongly connected components.
index, low, stack, on, sccs = {}, {}, [], set(), []
counter = [0]
sys.setrecursionlimit(10000)
def visit(v):
    index[v] = low[v] = counter[0]; counter[0] += 1
    stack.append(v); on.add(v)
    for w in graph[v]:
        if w not in index:
            visit(w); low[v] = min(low[v], low[w])
        elif w in on:
            low[v] = min(low[v], index[w])
    if low[v] == index[v]:
        comp = []
        while True:
            w = stack.pop(); on.discard(w); comp.append(w)
            if w == v:
                break
        if len(comp) > 1:
            sccs.append(comp)
for v in graph:
    if v not in index:
        visit(v)
for comp in sccs:
    print("cycle:", " <-> ".join(sorted(name(m) for m in comp)))
print(f"{len(modules)} modules, {sum(len(v) for v in graph.values())} imports, {len(sccs)} cycles")
sys.exit(1 if sccs else 0)
