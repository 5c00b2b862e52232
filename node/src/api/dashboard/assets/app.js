// The dashboard's shell: sign-in, the API and live-stream client, the
// shared state the pages read, and the hash router. Pages are in views.js.
import * as views from "./views.js";

const TOKEN_KEY = "shoal.token";
// Bounds on what a page keeps, so one left open for days stays small.
export const MAX_EVENTS = 500;
export const MAX_POINTS = 720; // one per second: 12 minutes of history

export const state = {
  hello: null,
  nodes: [],
  jobs: new Map(),
  events: [],
  telemetry: null,
  live: false,
  // job id -> {t: [], series: Map(node -> [])}, for running jobs only
  util: new Map(),
  // tenant -> [] of GPUs in use, with shared timestamps
  usage: { t: [], series: new Map() },
};

export function token() {
  return sessionStorage.getItem(TOKEN_KEY);
}

export class ApiError extends Error {
  constructor(status, message) { super(message); this.status = status; }
}

export async function api(path, opts = {}) {
  const resp = await fetch(path, {
    ...opts,
    headers: { ...(opts.headers || {}), Authorization: `Bearer ${token()}` },
  });
  if (resp.status === 401) { signOut("The token was refused: sign in again."); }
  if (!resp.ok) {
    let msg = `${resp.status}`;
    try { const body = await resp.json(); msg = body.message || msg; } catch (_) { /* not JSON */ }
    throw new ApiError(resp.status, msg);
  }
  const type = resp.headers.get("content-type") || "";
  return type.includes("json") ? resp.json() : resp.text();
}

// --- live stream: SSE read through fetch, since EventSource cannot send
// an Authorization header.
let streamAbort = null;
let lastEventId = null;
let listeners = new Set();

export function onChange(fn) { listeners.add(fn); return () => listeners.delete(fn); }
function changed(kind) { for (const fn of listeners) { try { fn(kind); } catch (e) { console.error(e); } } }

function setLive(on) {
  state.live = on;
  const el = document.getElementById("live");
  el.textContent = on ? "live" : "reconnecting";
  el.classList.toggle("on", on);
}

// How many stream messages this page has handled, by kind (for the
// console and the soak test: window.shoal.received).
const received = {};
window.shoal = { state, received };

function handle(name, data, id) {
  if (id) lastEventId = id;
  received[name] = (received[name] || 0) + 1;
  switch (name) {
    case "hello": {
      state.hello = data;
      document.getElementById("who").textContent =
        `${data.tenant ? "tenant " + data.tenant : "admin"} · via ${data.node}`;
      break;
    }
    case "jobs": state.jobs = new Map(data.map((j) => [j.id, j])); break;
    case "job": state.jobs.set(data.id, data); break;
    case "nodes": state.nodes = data; break;
    case "event":
      state.events.push(data);
      if (state.events.length > MAX_EVENTS) state.events.splice(0, state.events.length - MAX_EVENTS);
      break;
    case "telemetry": state.telemetry = data; record(data); break;
    case "problem": showProblem(data.message); break;
    default: return;
  }
  changed(name);
}

function push(arr, v) { arr.push(v); if (arr.length > MAX_POINTS) arr.shift(); }

// GPU utilization per job and node over time (running jobs only; history
// of jobs that ended is dropped).
function record(t) {
  const now = t.at_ms / 1000;
  const running = new Set([...state.jobs.values()].filter((j) => j.state === "running").map((j) => j.id));
  for (const id of state.util.keys()) if (!running.has(id)) state.util.delete(id);
  for (const id of running) {
    const job = state.jobs.get(id);
    let h = state.util.get(id);
    if (!h) { h = { t: [], series: new Map() }; state.util.set(id, h); }
    push(h.t, now);
    for (const name of job.nodes) {
      const n = t.nodes.find((x) => x.name === name);
      const v = n && n.job_util[id] !== undefined ? n.job_util[id] : null;
      if (!h.series.has(name)) h.series.set(name, new Array(h.t.length - 1).fill(null));
      push(h.series.get(name), v);
    }
    for (const [name, s] of h.series) if (!job.nodes.includes(name)) push(s, null);
  }
}

// Each sign-in starts a new generation; an older loop stops at its next turn.
let streamGen = 0;

async function runStream() {
  const gen = ++streamGen;
  while (token() && gen === streamGen) {
    const ctl = new AbortController();
    streamAbort = ctl;
    try {
      const headers = { Authorization: `Bearer ${token()}` };
      if (lastEventId) headers["Last-Event-ID"] = lastEventId;
      const resp = await fetch("/v1/stream", { headers, signal: ctl.signal });
      if (resp.status === 401) { signOut("The token was refused: sign in again."); return; }
      if (!resp.ok || !resp.body) throw new Error(`stream: ${resp.status}`);
      setLive(true);
      const reader = resp.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value;
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const block = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          let name = "message", data = "", id = null;
          for (const line of block.split("\n")) {
            if (line.startsWith("event:")) name = line.slice(6).trim();
            else if (line.startsWith("data:")) data += (data ? "\n" : "") + line.slice(5).replace(/^ /, "");
            else if (line.startsWith("id:")) id = line.slice(3).trim();
          }
          if (data) { try { handle(name, JSON.parse(data), id); } catch (e) { console.error(e); } }
        }
      }
    } catch (e) {
      if (ctl.signal.aborted) return;
      console.warn("live stream:", e);
    }
    setLive(false);
    await new Promise((r) => setTimeout(r, 1000));
  }
}

export function showProblem(msg) {
  const el = document.getElementById("problem");
  el.textContent = msg || "";
  el.hidden = !msg;
}

function signOut(why) {
  sessionStorage.removeItem(TOKEN_KEY);
  resetState();
  location.hash = "";
  showSignin(why);
}

function showSignin(why) {
  document.getElementById("signin").hidden = false;
  document.getElementById("page").hidden = true;
  document.getElementById("signout").hidden = true;
  document.getElementById("signin-error").textContent = why || "";
}

// What the previous token was shown is forgotten, so a tenant signing in
// after an admin in the same tab sees only its own.
function resetState() {
  if (streamAbort) streamAbort.abort();
  lastEventId = null;
  Object.assign(state, {
    hello: null, nodes: [], jobs: new Map(), events: [], telemetry: null,
    util: new Map(), usage: { t: [], series: new Map() },
  });
  document.getElementById("who").textContent = "";
  showProblem("");
}

function start() {
  resetState();
  document.getElementById("signin").hidden = true;
  document.getElementById("page").hidden = false;
  document.getElementById("signout").hidden = false;
  runStream();
  route();
}

// --- router: #/map, #/jobs, #/job/ID, #/tenants, #/events, #/proximity
let current = null;
function route() {
  if (!token()) return;
  const hash = location.hash.replace(/^#\/?/, "") || "map";
  const [page, arg] = hash.split("/");
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.page === page) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  if (current && current.stop) current.stop();
  const el = document.getElementById("page");
  el.replaceChildren();
  const make = views.pages[page] || views.pages.map;
  current = make(el, arg);
}

window.addEventListener("hashchange", () => {
  if (takeTokenFromHash()) start(); else route();
});

// `#token=T` signs in directly (`#token=T&/job/7` also opens a page); the
// fragment never reaches the server, and the token is removed from the
// address bar (and history) at once.
function takeTokenFromHash() {
  const m = location.hash.match(/^#token=([^&]+)(?:&(\/.*))?$/);
  if (!m) return false;
  sessionStorage.setItem(TOKEN_KEY, decodeURIComponent(m[1]));
  history.replaceState(null, "", location.pathname + "#" + (m[2] || "/map"));
  return true;
}

document.getElementById("signin").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const t = document.getElementById("token").value.trim();
  sessionStorage.setItem(TOKEN_KEY, t);
  try {
    await api("/v1/quota");
    document.getElementById("token").value = "";
    if (!location.hash || location.hash === "#") location.hash = "#/map";
    start();
  } catch (e) {
    sessionStorage.removeItem(TOKEN_KEY);
    showSignin(e.status === 401 || e.status === 403 ? "That token was refused." : `Sign-in failed: ${e.message}`);
  }
});
document.getElementById("signout").addEventListener("click", () => signOut(""));

takeTokenFromHash();
if (token()) start(); else showSignin("");
