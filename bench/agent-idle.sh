#!/usr/bin/env bash
# What real agents cost at idle: NODES (default 4) `shoal agent` processes on
# loopback (s1 bootstraps, the others join with a voter token), each with
# eight simulated GPUs. After WARM seconds up, each agent's CPU (user +
# system, from /proc/<pid>/stat) and how often its threads were switched to
# (voluntary and involuntary context switches, from /proc/<pid>/task/*/status:
# at idle an agent's cost is mostly its wake-ups) are read over SECS seconds,
# with its memory at the end: resident (RSS), and of it what is the process's own
# (anonymous; the rest is the binary's and libraries' pages, shared with
# every other process that maps them). One line per agent with its role
# as the ledger has it: leader, voter, learner or relayed (a member that
# is no Raft replica; the 8th and later with 5 voters and 2 learners).
#
# Needs a release build of shoal. Usage:
#   bench/agent-idle.sh [nodes] [warm-seconds] [seconds]     (default: 4 40 30)
# SHOAL_BIN picks the binary; the agents inherit the environment.
set -euo pipefail
nodes=${1:-4}
warm=${2:-40}
secs=${3:-30}
shoal=${SHOAL_BIN:-$(dirname "$0")/../target/release/shoal}
. "$(dirname "$0")/shoal-cluster.sh"
cluster_workdir idle

start_shoal_cluster "$nodes" --sim-gpus 8xH100-80GB
sleep "$warm"
# Context switches of all of a process's threads so far.
switches() {
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '/^(non)?voluntary_ctxt_switches/ {n += $2} END {print n + 0}'
}
before=()
switched=()
for p in "${pids[@]}"; do
  before+=("$(cpu_ticks "$p")")
  switched+=("$(switches "$p")")
done
sleep "$secs"
# Each agent's role, by its name (node ids follow the order of the joins).
roles=$(SHOAL_TOKEN="$admin" "$shoal" --api "http://127.0.0.1:$port" status --json | python3 -c '
import json, sys
st = json.load(sys.stdin)
for m in st["members"]:
    role = "relayed"
    if m["id"] in st["learners"]: role = "learner"
    if m["id"] in st["voters"]: role = "voter"
    if m["id"] == st["leader"]: role = "leader"
    print(m["name"], role)')
for i in "${!pids[@]}"; do
  p=${pids[$i]}
  used=$(( $(cpu_ticks "$p") - before[i] ))
  woke=$(( $(switches "$p") - switched[i] ))
  rss_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status")
  id=$((i + 1))
  anon_kb=$(awk '/^RssAnon/ {print $2}' "/proc/$p/status")
  role=$(echo "$roles" | awk -v n="s$id" '$1 == n {print $2}')
  awk -v n="s$id" -v r="$role" -v u="$used" -v t="$ticks" -v s="$secs" -v m="$rss_kb" -v a="$anon_kb" -v w="$woke" \
    'BEGIN { printf "%s %-7s cpu %.2f %% of a core  switched to %.0f/s  rss %.1f MB (own %.1f MB)\n", n, r, 100 * u / t / s, w / s, m / 1024, a / 1024 }'
done
