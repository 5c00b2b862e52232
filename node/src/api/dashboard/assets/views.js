// The pages. Each takes its element (and the part of the hash after the
// page name), draws from the shared state, redraws on changes, and returns
// {stop} so the router can end its timers and subscriptions.
import { state, api, onChange, MAX_POINTS } from "./app.js";
import { JOB_STATES, FINAL_STATES } from "./states.js";

// --- small DOM helpers (text always through textContent: no HTML
// injection from job names, messages or logs)
function h(tag, attrs = {}, ...kids) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") el.className = v;
    else if (k === "text") el.textContent = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const kid of kids.flat()) if (kid !== null && kid !== undefined) el.append(kid);
  return el;
}
const text = (s) => document.createTextNode(s);

// In-place updates. A redraw builds the new tree with `h` and `update`
// patches the page to match it: unchanged elements stay (with their focus,
// selection, scroll and hover), changed ones are patched attribute by
// attribute, and an element is replaced only by one of another kind or
// identity. Identity is `id`, `data-job`, `data-node` or `data-gpu`: the
// listeners `h` attaches are bound to it, so no element ever takes over
// another's, and a keyed row that moves is moved, not rebuilt.
const IDENTITY = ["id", "data-job", "data-node", "data-gpu"];
function keyOf(n) {
  if (n.nodeType !== 1 || !IDENTITY.some((k) => n.hasAttribute(k))) return null;
  return n.nodeName + IDENTITY.map((k) => `|${n.getAttribute(k) ?? ""}`).join("");
}
function reconcile(old, fresh) {
  if (!old || old.nodeType !== fresh.nodeType || old.nodeName !== fresh.nodeName || keyOf(old) !== keyOf(fresh)) return fresh;
  if (old.isEqualNode(fresh)) return old;
  if (old.nodeType !== 1) { old.textContent = fresh.textContent; return old; }
  for (const { name } of [...old.attributes]) if (!fresh.hasAttribute(name)) old.removeAttribute(name);
  for (const { name, value } of [...fresh.attributes]) if (old.getAttribute(name) !== value) old.setAttribute(name, value);
  patchChildren(old, [...fresh.childNodes]);
  return old;
}
function patchChildren(parent, fresh) {
  const old = [...parent.childNodes];
  const keyed = new Map();
  for (const o of old) { const k = keyOf(o); if (k !== null) keyed.set(k, o); }
  const taken = new Set();
  const want = fresh.map((f, i) => {
    const k = keyOf(f);
    let o = k !== null ? keyed.get(k) : old[i];
    if (o && (taken.has(o) || (k === null && keyOf(o) !== null))) o = undefined;
    const kept = reconcile(o, f);
    if (kept === o) taken.add(o);
    return kept;
  });
  want.forEach((n, i) => { if (parent.childNodes[i] !== n) parent.insertBefore(n, parent.childNodes[i] || null); });
  while (parent.childNodes.length > want.length) parent.lastChild.remove();
}
// `parent.replaceChildren(...kids)`, in place.
function update(parent, ...kids) {
  patchChildren(parent, kids.flat().filter((k) => k !== null && k !== undefined)
    .map((k) => (typeof k === "string" ? text(k) : k)));
}

function fmtBytes(b) {
  const u = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (b >= 1024 && i < u.length - 1) { b /= 1024; i++; }
  return `${b.toFixed(i ? 1 : 0)} ${u[i]}`;
}
function fmtDur(s) {
  if (s === null || s === undefined || s < 0) return "–";
  s = Math.floor(s);
  const d = Math.floor(s / 86400), hh = Math.floor((s % 86400) / 3600), m = Math.floor((s % 3600) / 60), ss = s % 60;
  const p = (n) => String(n).padStart(2, "0");
  return (d ? `${d}-` : "") + `${p(hh)}:${p(m)}:${p(ss)}`;
}
function runningFor(j) {
  if (!j.started_at) return null;
  const end = j.ended_at ? Date.parse(j.ended_at) : Date.now();
  return (end - Date.parse(j.started_at)) / 1000;
}
const nodeName = (id) => (state.nodes.find((n) => n.id === id) || { name: String(id) }).name;
function utilClass(pct) {
  if (pct === null || pct === undefined) return "";
  return pct < 20 ? "u1" : pct < 40 ? "u2" : pct < 60 ? "u3" : pct < 80 ? "u4" : "u5";
}
const telemetryOf = (name) => (state.telemetry ? state.telemetry.nodes.find((n) => n.name === name) : null);

// A GPU's utilization: its own sample on the answering node, else the mean
// over the GPUs its job holds on that node (from the node's gossip advert).
function gpuUtil(node, gpu) {
  const t = telemetryOf(node.name);
  if (!t) return null;
  const s = t.gpus.find((g) => g.index === gpu.index);
  if (s) return s.util_pct;
  if (gpu.allocated_to !== null && t.job_util[gpu.allocated_to] !== undefined) return Math.round(t.job_util[gpu.allocated_to]);
  return gpu.allocated_to === null ? 0 : null;
}

// The hover of a GPU: its job (by name when the token may see it), and
// the GPU's latest sample from whichever node it is on (relayed by the
// node serving the page), or "no data" when that node has not answered.
function gpuTitle(node, gpu, util) {
  const t = telemetryOf(node.name);
  const s = t && t.gpus.find((g) => g.index === gpu.index);
  const lines = [`${node.name} GPU ${gpu.index}: ${gpu.model}`, `health: ${gpu.health}${gpu.health_reason ? " (" + gpu.health_reason + ")" : ""}`];
  if (gpu.allocated_to !== null) {
    const j = state.jobs.get(gpu.allocated_to);
    const name = (s && s.job === gpu.allocated_to && s.job_name) || (j && j.name) || "";
    lines.push(`job ${gpu.allocated_to}${name ? " (" + name + ")" : ""}`);
  } else lines.push("free");
  if (util !== null) lines.push(`utilization ${util}%`);
  if (s) {
    lines.push(`temperature ${s.temp_c} °C`, `power ${s.power_w.toFixed(0)} W`, `memory ${s.fb_used_mb}/${s.fb_total_mb} MiB`);
    if (s.throttle && s.throttle.length) lines.push(`throttled: ${s.throttle.join(", ")}`);
    if (t.gpus_age_ms !== null && t.gpus_age_ms !== undefined && t.gpus_age_ms >= 5000) lines.push(`sampled ${(t.gpus_age_ms / 1000).toFixed(0)} s ago`);
  } else {
    lines.push(`memory ${gpu.memory_mb} MiB`, t && t.gpus_problem ? t.gpus_problem : "no data");
  }
  return lines.join("\n");
}

// --- the map: regions → zones → racks → nodes → GPUs
function nodeTile(node, job) {
  const drained = node.drained;
  const badge = node.state !== "alive" ? node.state : drained ? "drained" : "";
  const tile = h("div", {
    class: `node-tile${drained ? " drained" : ""}${job && job.nodes.includes(node.name) ? " highlight" : ""}`,
    "data-node": node.name, "data-state": node.state,
    title: [`${node.name} (id ${node.id}) — ${node.state}${drained ? ", drained" : ""}`,
      `${node.gpus_free}/${node.gpus_total} GPUs free`,
      node.gpu_util !== null && node.gpu_util !== undefined ? `GPU load ${(node.gpu_util * 100).toFixed(0)}%` : "",
      node.last_seen_ms !== null ? `last heard ${node.last_seen_ms} ms ago` : "",
      node.addr].filter(Boolean).join("\n"),
  },
  h("div", { class: "name" }, h("span", { text: node.name }), badge ? h("span", { class: "badge", text: badge }) : null),
  h("div", { class: "meta", text: `${node.gpus_free}/${node.gpus_total} free` }));
  const gpus = h("div", { class: "gpus" });
  for (const g of node.gpus) {
    const util = gpuUtil(node, g);
    const cls = ["gpu", g.allocated_to !== null ? utilClass(util) : ""];
    if (g.health !== "ok") cls.push("unhealthy");
    if (job) cls.push(g.allocated_to === job.id ? "mine" : "dim");
    gpus.append(h("div", {
      class: cls.join(" "), "data-gpu": g.index, "data-job": g.allocated_to ?? "",
      title: gpuTitle(node, g, util), role: "img",
      "aria-label": `GPU ${g.index} ${g.allocated_to !== null ? "job " + g.allocated_to : "free"}${util !== null ? " " + util + "%" : ""}`,
    }, text(g.health !== "ok" ? "!" : g.allocated_to !== null ? String(g.allocated_to) : "")));
  }
  tile.append(gpus);
  return tile;
}

function legend() {
  return h("div", { class: "legend", "aria-hidden": "true" },
    h("span", { text: "GPU utilization:" }),
    ...["free", "<20%", "20–40%", "40–60%", "60–80%", "≥80%"].map((l, i) =>
      h("span", {}, h("span", { class: `gpu ${i ? "u" + i : ""}` }), text(" " + l))),
    h("span", {}, h("span", { class: "gpu unhealthy", text: "!" }), text(" unhealthy or drained GPU")),
    h("span", { text: "Striped tile: node down. Dashed: drained." }));
}

function topology(nodes, job) {
  const tree = new Map();
  for (const n of nodes) {
    const r = n.labels.region || "region", z = n.labels.zone || "zone –", k = n.labels.rack || "rack –";
    if (!tree.has(r)) tree.set(r, new Map());
    const zones = tree.get(r);
    if (!zones.has(z)) zones.set(z, new Map());
    const racks = zones.get(z);
    if (!racks.has(k)) racks.set(k, []);
    racks.get(k).push(n);
  }
  const out = h("div", { class: "map" });
  for (const [r, zones] of [...tree].sort()) {
    const reg = h("div", { class: "region" }, h("div", { class: "label", text: r }));
    for (const [z, racks] of [...zones].sort()) {
      const zone = h("div", { class: "zone" }, h("div", { class: "label", text: z }));
      const rs = h("div", { class: "racks" });
      for (const [k, ns] of [...racks].sort()) {
        rs.append(h("div", { class: "rack" }, h("div", { class: "label", text: k }),
          h("div", { class: "nodes" }, ns.sort((a, b) => a.name.localeCompare(b.name)).map((n) => nodeTile(n, job)))));
      }
      zone.append(rs);
      reg.append(zone);
    }
    out.append(reg);
  }
  return out;
}

function mapPage(el) {
  const body = h("div");
  el.append(h("h1", { text: "Cluster map" }), legend(), body);
  const draw = () => {
    const n = state.nodes;
    const gpus = n.reduce((a, x) => a + x.gpus_total, 0), free = n.reduce((a, x) => a + x.gpus_free, 0);
    const alive = n.filter((x) => x.state === "alive").length;
    const running = [...state.jobs.values()].filter((j) => j.state === "running").length;
    const pending = [...state.jobs.values()].filter((j) => j.state === "pending" || j.state === "requeued").length;
    update(body,
      h("div", { class: "summary" },
        h("span", {}, h("b", { id: "count-nodes", text: String(n.length) }), text(" nodes")),
        h("span", {}, h("b", { text: String(alive) }), text(" alive")),
        h("span", {}, h("b", { id: "count-gpus", text: String(gpus) }), text(" GPUs")),
        h("span", {}, h("b", { text: String(free) }), text(" free")),
        h("span", {}, h("b", { text: String(running) }), text(" running jobs")),
        h("span", {}, h("b", { text: String(pending) }), text(" waiting"))),
      n.length ? topology(n, null) : h("p", { class: "muted", text: "Waiting for the first update…" }));
  };
  draw();
  const off = onChange((k) => { if (k === "nodes" || k === "telemetry" || k === "jobs" || k === "job") draw(); });
  return { stop: off };
}

// --- jobs

function jobsPage(el) {
  const tenant = h("select", { id: "f-tenant", "aria-label": "Tenant" });
  const st = h("select", { id: "f-state", "aria-label": "State" },
    h("option", { value: "", text: "all states" }), h("option", { value: "active", text: "waiting or running" }),
    JOB_STATES.map((s) => h("option", { value: s, text: s })));
  st.value = "active";
  const table = h("div", { class: "scroll" });
  el.append(h("h1", { text: "Jobs" }),
    h("div", { class: "filters" }, h("label", {}, text("Tenant "), tenant), h("label", {}, text("State "), st)), table);
  const draw = () => {
    const tenants = [...new Set([...state.jobs.values()].map((j) => j.tenant))].sort();
    const keep = tenant.value;
    tenant.replaceChildren(h("option", { value: "", text: "all tenants" }), ...tenants.map((t) => h("option", { value: t, text: t })));
    tenant.value = tenants.includes(keep) ? keep : "";
    const jobs = [...state.jobs.values()].filter((j) =>
      (!tenant.value || j.tenant === tenant.value) &&
      (!st.value || (st.value === "active" ? !FINAL_STATES.includes(j.state) : j.state === st.value)))
      .sort((a, b) => b.id - a.id);
    update(table, h("table", { id: "jobs" },
      h("thead", {}, h("tr", {}, ["Job", "Name", "Tenant", "State", "Why / how it ended", "Size", "Nodes", "Running", "Restarts", "Epoch"]
        .map((c, i) => h("th", { class: i === 6 || i === 9 ? "hide-narrow" : null, text: c })))),
      h("tbody", {}, jobs.length ? jobs.map((j) => h("tr", {
        class: "clickable", tabindex: "0", "data-job": j.id, "data-state": j.state, "data-restarts": j.restarts,
        onclick: () => { location.hash = `#/job/${j.id}`; },
        onkeydown: (e) => { if (e.key === "Enter") location.hash = `#/job/${j.id}`; },
      },
      h("td", { text: String(j.id) }), h("td", { text: j.name }), h("td", { text: j.tenant }),
      h("td", { class: `state state-${j.state}`, text: j.state }),
      h("td", { text: j.reason || "" }),
      h("td", { text: `${j.nodes_requested}×${j.gpus_per_node} GPU` }),
      h("td", { class: "hide-narrow", text: j.nodes.join(", ") }),
      h("td", { text: fmtDur(runningFor(j)) }),
      h("td", { text: `${j.restarts}/${j.max_restarts}` }),
      h("td", { class: "hide-narrow", text: j.epoch ?? "–" }))) :
        h("tr", {}, h("td", { colspan: 10, class: "muted", text: "No jobs match." })))));
  };
  tenant.addEventListener("change", draw);
  st.addEventListener("change", draw);
  draw();
  const off = onChange((k) => { if (k === "jobs" || k === "job") draw(); });
  const tick = setInterval(draw, 1000); // running times
  return { stop: () => { off(); clearInterval(tick); } };
}

// --- one job
function utilChart(host, id) {
  let plot = null, names = [];
  const draw = () => {
    const hist = state.util.get(id);
    if (!hist || hist.t.length < 2) return;
    const now = [...hist.series.keys()];
    if (!plot || now.join() !== names.join()) {
      if (plot) plot.destroy();
      names = now;
      const palette = ["#3b528b", "#21918c", "#b5367a", "#e58e00", "#440154", "#5ec962", "#1f77b4", "#8c564b"];
      plot = new uPlot({
        width: Math.max(280, host.clientWidth - 8), height: 220,
        scales: { y: { range: [0, 100] } },
        axes: [{}, { label: "GPU %" }],
        series: [{}, ...names.map((n, i) => ({ label: n, stroke: palette[i % palette.length], width: 2, spanGaps: false }))],
      }, [hist.t, ...names.map((n) => hist.series.get(n))], host);
    } else {
      plot.setData([hist.t, ...names.map((n) => hist.series.get(n))]);
    }
  };
  return { draw, stop: () => plot && plot.destroy() };
}

function jobPage(el, arg) {
  const id = Number(arg);
  const head = h("div"), gang = h("div"), ranks = h("div", { class: "scroll" }), ckpts = h("div", { class: "scroll" });
  const logPick = h("select", { "aria-label": "Rank" }), logNote = h("p", { class: "muted" });
  const log = h("pre", { class: "log", id: "log", "aria-label": "Log tail" });
  const events = h("div", { class: "scroll" }), chartHost = h("div", { class: "chart", id: "util-chart" });
  el.append(head,
    h("div", { class: "grid2" },
      h("div", { class: "card" }, h("h2", { text: "Gang on the map" }), gang),
      h("div", { class: "card" }, h("h2", { text: "Ranks" }), ranks,
        h("h2", { text: "GPU utilization of the ranks" }), chartHost)),
    h("div", { class: "grid2" },
      h("div", { class: "card" }, h("h2", { text: "Checkpoints" }), ckpts),
      h("div", { class: "card" }, h("h2", {}, text("Log tail, rank "), logPick), logNote, log)),
    h("div", { class: "card" }, h("h2", { text: "Events" }), events));
  const chart = utilChart(chartHost, id);
  let logAt = { rank: null, offset: 0, text: "" };
  let missing = false;

  const drawHead = () => {
    const j = state.jobs.get(id);
    if (!j) {
      head.replaceChildren(h("h1", { text: `Job ${id}` }), h("p", { class: "muted", text: missing ? "No such job (or not yours)." : "Loading…" }));
      return;
    }
    head.replaceChildren(...[h("h1", {}, text(`Job ${j.id} · ${j.name} `), h("span", { class: `state state-${j.state}`, id: "job-state", text: j.state })),
      h("div", { class: "summary" },
        h("span", { text: `tenant ${j.tenant}` }),
        h("span", { text: `${j.nodes_requested} nodes × ${j.gpus_per_node} GPUs` }),
        h("span", { id: "job-epoch", text: `epoch ${j.epoch ?? "–"}` }),
        h("span", { id: "job-restarts", "data-restarts": j.restarts, text: `restarts ${j.restarts}/${j.max_restarts}` }),
        h("span", { text: `preemptions ${j.preemptions}` }),
        h("span", { text: `running ${fmtDur(runningFor(j))}` }),
        h("span", { text: `last checkpoint ${j.last_ckpt_step ?? "none"}` })),
      j.reason ? h("p", { id: "job-reason", text: (j.state === "pending" || j.state === "requeued" ? "Waiting: " : "") + j.reason }) : null,
      h("p", { class: "muted", text: j.command.join(" ") })].filter((x) => x));
    const nodes = state.nodes.filter((n) => j.nodes.includes(n.name));
    update(gang, nodes.length ? topology(nodes, j) : h("p", { class: "muted", text: "Not placed." }));
    update(ranks, h("table", {}, h("thead", {}, h("tr", {}, ["Rank", "Node", "GPUs", "GPU %"].map((c) => h("th", { text: c })))),
      h("tbody", {}, j.nodes.map((n, r) => {
        const t = telemetryOf(n);
        const u = t && t.job_util[j.id] !== undefined ? `${Math.round(t.job_util[j.id])}%` : "–";
        return h("tr", { "data-rank": r }, h("td", { text: String(r) }), h("td", { text: n }),
          h("td", { text: (j.gpus[n] || []).join(", ") }), h("td", { text: u }));
      }))));
    const keep = logPick.value;
    logPick.replaceChildren(...j.nodes.map((n, r) => h("option", { value: r, text: `${r} (${n})` })));
    if (keep !== "" && Number(keep) < j.nodes.length) logPick.value = keep;
    chart.draw();
  };

  const drawEvents = () => {
    const mine = state.events.filter((e) => e.job === id).slice(-50).reverse();
    update(events, eventTable(mine));
  };

  const loadCkpts = async () => {
    try {
      const list = await api(`/v1/jobs/${id}/checkpoints`);
      update(ckpts, h("table", { id: "ckpts" },
        h("thead", {}, h("tr", {}, ["Step", "Size", "Replicas", "Holders per rank", "Epoch", "Committed"].map((c) => h("th", { text: c })))),
        h("tbody", {}, list.length ? list.slice().reverse().map((c) => h("tr", { class: "ckpt", "data-step": c.step, "data-replicas": c.replicas.length },
          h("td", { text: String(c.step) }), h("td", { text: fmtBytes(c.bytes) }),
          h("td", { text: `${c.replicas.length}: ${c.replicas.map(nodeName).join(", ")}` }),
          h("td", { text: c.parts.map((p) => `rank ${p.rank}: ${p.holders.map(nodeName).join(", ")}`).join("; ") }),
          h("td", { text: String(c.epoch) }),
          h("td", { text: c.committed_at || "not yet (a part is missing)" }))) :
          h("tr", {}, h("td", { colspan: 6, class: "muted", text: "No checkpoints yet." })))));
    } catch (e) {
      if (e.status === 404) { missing = true; drawHead(); }
      ckpts.replaceChildren(h("p", { class: "muted", text: e.message }));
    }
  };

  // A rank's log is kept by the node that ran it; the node serving this
  // page relays it from there.
  const loadLog = async () => {
    const j = state.jobs.get(id);
    if (!j || !j.nodes.length) return;
    const rank = Number(logPick.value || 0);
    if (logAt.rank !== rank) logAt = { rank, offset: 0, text: "" };
    logNote.textContent = "";
    try {
      const resp = await fetch(`/v1/jobs/${id}/logs?rank=${rank}&offset=${logAt.offset}`, { headers: { Authorization: `Bearer ${sessionStorage.getItem("shoal.token")}` } });
      if (!resp.ok) { logNote.textContent = `No log yet (${resp.status}).`; return; }
      const start = Number(resp.headers.get("x-shoal-log-start") || logAt.offset);
      const chunk = await resp.text();
      if (start < logAt.offset) logAt.text = ""; // rotated
      logAt.offset = start + new TextEncoder().encode(chunk).length;
      logAt.text = (logAt.text + chunk).slice(-64 * 1024);
      const stick = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.textContent = logAt.text;
      if (stick) log.scrollTop = log.scrollHeight;
    } catch (e) { logNote.textContent = e.message; }
  };

  if (!state.jobs.has(id)) api(`/v1/jobs/${id}`).then((j) => { state.jobs.set(j.id, j); drawHead(); }).catch(() => { missing = true; drawHead(); });
  logPick.addEventListener("change", loadLog);
  drawHead(); drawEvents(); loadCkpts(); loadLog();
  const off = onChange((k) => {
    if (k === "job" || k === "jobs" || k === "nodes" || k === "telemetry") drawHead();
    if (k === "event") drawEvents();
  });
  const slow = setInterval(() => { loadCkpts(); loadLog(); }, 1500);
  return { stop: () => { off(); clearInterval(slow); chart.stop(); } };
}

function eventTable(list) {
  return h("table", { class: "events" },
    h("thead", {}, h("tr", {}, ["Time", "Severity", "Kind", "Where", "Job", "Message"].map((c, i) => h("th", { class: i === 3 ? "hide-narrow" : null, text: c })))),
    h("tbody", {}, list.length ? list.map((e) => h("tr", { "data-event": e.id },
      h("td", { text: new Date(e.at_ms).toLocaleTimeString() }),
      h("td", { class: `sev-${e.severity}`, text: e.severity }),
      h("td", { text: e.kind }),
      h("td", { class: "hide-narrow", text: e.node ? e.node + (e.gpu !== null ? `/gpu${e.gpu}` : "") : "–" }),
      h("td", {}, e.job !== null ? h("a", { href: `#/job/${e.job}`, text: String(e.job) }) : text("–")),
      h("td", { text: e.message + (e.repeats ? ` (×${e.repeats + 1})` : "") }))) :
      h("tr", {}, h("td", { colspan: 6, class: "muted", text: "No events." }))));
}

function eventsPage(el) {
  const q = h("input", { type: "search", placeholder: "filter text", "aria-label": "Filter text" });
  const sev = h("select", { "aria-label": "Severity" }, ["", "info", "warning", "critical"].map((s) => h("option", { value: s, text: s || "any severity" })));
  const kind = h("select", { "aria-label": "Kind" });
  const body = h("div", { class: "scroll" });
  el.append(h("h1", { text: "Events" }), h("div", { class: "filters" }, q, sev, kind, h("span", { class: "muted", text: "newest first, live" })), body);
  const draw = () => {
    const kinds = [...new Set(state.events.map((e) => e.kind))].sort();
    const keep = kind.value;
    kind.replaceChildren(h("option", { value: "", text: "any kind" }), ...kinds.map((k) => h("option", { value: k, text: k })));
    kind.value = kinds.includes(keep) ? keep : "";
    const needle = q.value.toLowerCase();
    const list = state.events.filter((e) => (!sev.value || e.severity === sev.value) && (!kind.value || e.kind === kind.value) &&
      (!needle || `${e.message} ${e.node || ""} ${e.job ?? ""}`.toLowerCase().includes(needle))).slice().reverse();
    update(body, eventTable(list));
  };
  for (const c of [q, sev, kind]) c.addEventListener("input", draw);
  draw();
  return { stop: onChange((k) => { if (k === "event") draw(); }) };
}

// --- tenants
function tenantsPage(el) {
  const table = h("div", { class: "scroll" }), chartHost = h("div", { class: "chart" });
  el.append(h("h1", { text: "Tenants" }), table, h("h2", { text: "GPUs in use over time" }), chartHost);
  let plot = null, names = [];
  const bar = (used, cap) => {
    if (cap === null || cap === undefined) return h("span", { text: "no cap" });
    const pct = cap > 0 ? Math.min(100, (used / cap) * 100) : 100;
    return h("div", { class: `bar${used > cap ? " over" : ""}`, role: "img", "aria-label": `${pct.toFixed(0)}%` }, h("span", { style: `width:${pct}%` }));
  };
  const load = async () => {
    let q;
    try { q = await api("/v1/quota"); } catch (e) { table.replaceChildren(h("p", { class: "error", text: e.message })); return; }
    const u = state.usage;
    u.t.push(Date.now() / 1000);
    for (const r of q) { if (!u.series.has(r.tenant)) u.series.set(r.tenant, new Array(u.t.length - 1).fill(null)); }
    for (const [t, s] of u.series) { const r = q.find((x) => x.tenant === t); s.push(r ? r.gpus_in_use : null); }
    if (u.t.length > MAX_POINTS) { u.t.shift(); for (const s of u.series.values()) s.shift(); }
    update(table, h("table", { id: "tenants" },
      h("thead", {}, h("tr", {}, ["Tenant", "GPUs in use / cap", "", "GPU-hours used / budget", "", "Share", "Weight", "Fair-share usage", "Refunded", "Running", "Waiting"].map((c) => h("th", { text: c })))),
      h("tbody", {}, q.map((r) => h("tr", { "data-tenant": r.tenant },
        h("td", { text: r.tenant }),
        h("td", { text: `${r.gpus_in_use} / ${r.max_gpus ?? "∞"}` }), h("td", {}, bar(r.gpus_in_use, r.max_gpus)),
        h("td", { text: `${r.gpu_hours_used.toFixed(2)} / ${r.gpu_hours_limit ?? "∞"}` }), h("td", {}, bar(r.gpu_hours_used, r.gpu_hours_limit)),
        h("td", { text: `${(r.share * 100).toFixed(1)}%` }), h("td", { text: String(r.weight) }),
        h("td", { text: `${r.fair_usage_gpu_hours.toFixed(2)} h` }), h("td", { text: `${r.gpu_hours_refunded.toFixed(2)} h` }),
        h("td", { text: String(r.running_jobs) }), h("td", { text: String(r.pending_jobs) }))))));
    const now = [...u.series.keys()];
    if (u.t.length < 2) return;
    const data = [u.t, ...now.map((n) => u.series.get(n))];
    if (!plot || now.join() !== names.join()) {
      if (plot) plot.destroy();
      names = now;
      const palette = ["#3b528b", "#21918c", "#b5367a", "#e58e00", "#440154", "#5ec962"];
      plot = new uPlot({ width: Math.max(280, chartHost.clientWidth - 8), height: 220, axes: [{}, { label: "GPUs" }],
        series: [{}, ...names.map((n, i) => ({ label: n, stroke: palette[i % palette.length], width: 2 }))] }, data, chartHost);
    } else plot.setData(data);
  };
  load();
  const tick = setInterval(load, 2000);
  return { stop: () => { clearInterval(tick); if (plot) plot.destroy(); } };
}

// --- proximity: Vivaldi coordinates projected on their two main axes
function project(points) {
  const n = points.length, dim = points[0].length;
  const mean = new Array(dim).fill(0);
  for (const p of points) p.forEach((v, i) => { mean[i] += v / n; });
  const c = points.map((p) => p.map((v, i) => v - mean[i]));
  const axis = (skip) => {
    let v = new Array(dim).fill(0).map((_, i) => 1 / (i + 1.5));
    for (let it = 0; it < 50; it++) {
      const w = new Array(dim).fill(0);
      for (const p of c) { let d = p.reduce((a, x, i) => a + x * v[i], 0); p.forEach((x, i) => { w[i] += d * x; }); }
      if (skip) { const d = w.reduce((a, x, i) => a + x * skip[i], 0); w.forEach((_, i) => { w[i] -= d * skip[i]; }); }
      const len = Math.hypot(...w) || 1;
      v = w.map((x) => x / len);
    }
    return v;
  };
  const a = axis(null), b = axis(a);
  return c.map((p) => [p.reduce((s, x, i) => s + x * a[i], 0), p.reduce((s, x, i) => s + x * b[i], 0)]);
}

function proximityPage(el) {
  const body = h("div");
  el.append(h("h1", { text: "Proximity" }),
    h("p", { class: "muted", text: "Each node's Vivaldi network coordinate, projected on its two main axes: close dots are close on the network. Hover for estimated RTTs." }), body);
  // Its own read of /v1/telemetry: the live stream leaves the pairwise
  // RTTs out.
  let t = null;
  const draw = () => {
    const nodes = t ? t.nodes.filter((n) => n.coord_ms && n.coord_ms.length) : [];
    if (nodes.length < 2) { body.replaceChildren(h("p", { class: "muted", text: "Not enough coordinates yet." })); return; }
    const xy = project(nodes.map((n) => n.coord_ms));
    const xs = xy.map((p) => p[0]), ys = xy.map((p) => p[1]);
    const span = Math.max(Math.max(...xs) - Math.min(...xs), Math.max(...ys) - Math.min(...ys), 0.01);
    const W = 640, H = 420, pad = 50;
    const sx = (x) => pad + ((x - Math.min(...xs)) / span) * (W - 2 * pad);
    const sy = (y) => pad + ((y - Math.min(...ys)) / span) * (H - 2 * pad);
    const NS = "http://www.w3.org/2000/svg";
    const svg = document.createElementNS(NS, "svg");
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`); svg.setAttribute("class", "prox"); svg.setAttribute("role", "img");
    svg.setAttribute("aria-label", "Network coordinates of the nodes");
    nodes.forEach((n, i) => {
      const g = document.createElementNS(NS, "g");
      const title = document.createElementNS(NS, "title");
      const rtts = Object.entries(n.rtt_to_ms).map(([k, v]) => `${k}: ${v.toFixed(2)} ms`).join("\n");
      title.textContent = `${n.name}\nRTT from ${t.node}: ${n.rtt_ms !== null ? n.rtt_ms.toFixed(2) + " ms" : "unknown"}\nheight ${n.height_ms.toFixed(2)} ms, error ${n.coord_error.toFixed(2)}\n${rtts}`;
      const c = document.createElementNS(NS, "circle");
      c.setAttribute("cx", sx(xy[i][0])); c.setAttribute("cy", sy(xy[i][1])); c.setAttribute("r", 9);
      c.setAttribute("data-node", n.name);
      if (n.name === t.node) c.setAttribute("class", "me");
      const label = document.createElementNS(NS, "text");
      label.setAttribute("x", sx(xy[i][0]) + 12); label.setAttribute("y", sy(xy[i][1]) + 4);
      label.textContent = n.name;
      g.append(title, c, label);
      svg.append(g);
    });
    const scale = h("p", { class: "muted", text: `Plot width ≈ ${span.toFixed(2)} ms of network distance. Yellow: the node answering (${t.node}).` });
    const rows = nodes.map((n) => h("tr", {}, h("td", { text: n.name }), h("td", { text: n.rtt_ms !== null ? `${n.rtt_ms.toFixed(2)} ms` : "–" })));
    body.replaceChildren(svg, scale, h("table", { style: "max-width:30rem" }, h("thead", {}, h("tr", {}, h("th", { text: "Node" }), h("th", { text: `RTT from ${t.node}` }))), h("tbody", {}, rows)));
  };
  const load = async () => {
    try { t = await api("/v1/telemetry"); draw(); } catch (e) { body.replaceChildren(h("p", { class: "error", text: e.message })); }
  };
  draw();
  load();
  const tick = setInterval(load, 3000);
  return { stop: () => clearInterval(tick) };
}

export const pages = { map: mapPage, jobs: jobsPage, job: jobPage, tenants: tenantsPage, events: eventsPage, proximity: proximityPage };
