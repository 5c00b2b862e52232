#!/usr/bin/env bash
# What real agents cost at idle: NODES (default 4) `shoal agent` processes on
# loopback (s1 bootstraps, the others join with a voter token, so s1-s3
# vote and the rest are learners), each with eight simulated GPUs. After
# WARM seconds up, each agent's CPU (user + system, from /proc/<pid>/stat)
# is read over SECS seconds, with its resident memory at the end; one line
# per agent and its role.
#
# Needs a release build of shoal. Usage:
#   bench/agent-idle.sh [nodes] [warm-seconds] [seconds]     (default: 4 40 30)
set -euo pipefail
nodes=${1:-4}
warm=${2:-40}
secs=${3:-30}
root=$(mktemp -d /tmp/shoal-idle-XXXX)
shoal=${SHOAL_BIN:-$(dirname "$0")/../target/release/shoal}
. "$(dirname "$0")/shoal-cluster.sh"
pids=()
cleanup() { { kill -9 "${pids[@]}"; wait "${pids[@]}"; } 2>/dev/null || true; rm -rf "$root"; }
trap cleanup EXIT
ticks=$(getconf CLK_TCK)

start_shoal_cluster "$nodes" --sim-gpus 8xH100-80GB
sleep "$warm"
before=()
for p in "${pids[@]}"; do before+=("$(cpu_ticks "$p")"); done
sleep "$secs"
for i in "${!pids[@]}"; do
  p=${pids[$i]}
  used=$(( $(cpu_ticks "$p") - before[i] ))
  rss_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$p/status")
  id=$((i + 1))
  role=learner
  [ "$id" -le 3 ] && role=voter
  [ "$id" = "$leader" ] && role=leader
  awk -v n="s$id" -v r="$role" -v u="$used" -v t="$ticks" -v s="$secs" -v m="$rss_kb" \
    'BEGIN { printf "%s %-7s cpu %.2f %% of a core  rss %.1f MB\n", n, r, 100 * u / t / s, m / 1024 }'
done
