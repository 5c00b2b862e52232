#!/usr/bin/env bash
# Where a ledger write's CPU goes: three `shoal agent` processes on loopback
# (the cluster of bench/ledger-vs-etcd.sh), wrk writing /v1/attrs at the
# leader, and for each step the CPU time (user + system, from /proc) that
# each agent and wrk spent per committed write. On a machine with C cores a
# load that costs T µs of CPU per write cannot exceed C / T writes/s, so this
# tells a CPU-bound step from one that waits.
#
# With PERF=1 the leader is also sampled (`perf record -g`, cpu-clock) at the
# last step and the report's top entries are printed by shared object and
# by symbol.
#
# Needs wrk and a release build of shoal. Usage:
#   bench/ledger-cpu.sh [seconds] [connections...]      (default: 10 1 64)
set -euo pipefail
secs=${1:-10}
shift || true
steps=("$@")
[ ${#steps[@]} -gt 0 ] || steps=(1 64)
shoal=${SHOAL_BIN:-$(dirname "$0")/../target/release/shoal}
. "$(dirname "$0")/shoal-cluster.sh"
cluster_workdir cpu

ctx_switches() { # pid -> context switches of all its threads
  cat /proc/"$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ {s += $2} END {print s + 0}'
}

start_shoal_cluster
cat > "$root/shoal.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $admin"
wrk.body = '{"key":"bench","value":"' .. string.rep("v", 64) .. '"}'
LUA

# What the agents spend with no writes at all (heartbeats, gossip, the
# scheduler's safety-net ticks), so the per-write figures can be read net.
idle0=()
for p in "${pids[@]}"; do idle0+=("$(cpu_ticks "$p")"); done
sleep "$secs"
idle=()
for i in 0 1 2; do idle+=("$(awk -v d=$(( $(cpu_ticks "${pids[$i]}") - idle0[i] )) -v hz="$ticks" -v s="$secs" 'BEGIN {printf "%.0f", d / hz / s * 1e3}')"); done
echo "shoal $("$shoal" --version | awk '{print $2}'), 3 agents, leader s$leader; $(nproc) cores"
echo "idle, CPU ms per second: s1 ${idle[0]}, s2 ${idle[1]}, s3 ${idle[2]}"
echo "CPU µs per write (idle included):"
printf "%6s %10s %10s %10s %10s %10s %10s\n" conns writes/s leader follower follower wrk total
last=${steps[$((${#steps[@]} - 1))]}
for c in "${steps[@]}"; do
  before=()
  for p in "${pids[@]}"; do before+=("$(cpu_ticks "$p")"); done
  ctx_before=(); for p in "${pids[@]}"; do ctx_before+=("$(ctx_switches "$p")"); done
  if [ "${PERF:-0}" = 1 ] && [ "$c" = "$last" ]; then
    perf record -F 999 -g -e cpu-clock -p "$leader_pid" -o "$root/perf.data" -- sleep "$secs" 2>/dev/null &
    perf_pid=$!
  fi
  threads=$(( c < 2 ? 1 : 2 ))
  /usr/bin/time -f "%U %S" -o "$root/wrk.time" wrk -t"$threads" -c"$c" -d"${secs}s" -s "$root/shoal.lua" \
    "http://127.0.0.1:$port/v1/attrs" > "$root/wrk.out" 2>&1
  [ -n "${perf_pid:-}" ] && wait "$perf_pid"
  after=()
  for p in "${pids[@]}"; do after+=("$(cpu_ticks "$p")"); done
  # Requests/sec over the run, and how many requests were made.
  ctx_after=(); for p in "${pids[@]}"; do ctx_after+=("$(ctx_switches "$p")"); done
  rps=$(awk '/Requests\/sec/ {print $2}' "$root/wrk.out")
  reqs=$(awk '/requests in/ {print $1}' "$root/wrk.out")
  [ -n "$reqs" ] && [ "$reqs" -gt 0 ] || { cat "$root/wrk.out" >&2; echo "error: wrk made no requests" >&2; exit 1; }
  if grep -q Non-2xx "$root/wrk.out"; then grep Non-2xx "$root/wrk.out" >&2; fi
  per_write() { awk -v t="$1" -v n="$reqs" -v hz="$ticks" 'BEGIN {printf "%.0f", t / hz * 1e6 / n}'; }
  cols=()
  followers=()
  for i in 0 1 2; do
    d=$(( after[i] - before[i] ))
    if [ $((i + 1)) = "$leader" ]; then lead_us=$(per_write $d); else followers+=("$(per_write $d)"); fi
  done
  wrk_us=$(awk -v n="$reqs" '{printf "%.0f", ($1 + $2) * 1e6 / n}' "$root/wrk.time")
  echo "   context switches per write: $(for i in 0 1 2; do awk -v d=$(( ctx_after[i] - ctx_before[i] )) -v n="$reqs" 'BEGIN {printf "%.1f ", d / n}'; done)"
  total=$(( lead_us + followers[0] + followers[1] + wrk_us ))
  printf "%6s %10s %10s %10s %10s %10s %10s\n" "$c" "$rps" "$lead_us" "${followers[0]}" "${followers[1]}" "$wrk_us" "$total"
done

if [ "${PERF:-0}" = 1 ]; then
  echo "== leader at $last connections, by shared object =="
  perf report -i "$root/perf.data" --no-children --sort dso --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -12
  echo "== leader at $last connections, top symbols =="
  perf report -i "$root/perf.data" --no-children --sort sym --stdio -g none 2>/dev/null | grep -v '^#' | grep -v '^$' | head -40
fi
