#!/usr/bin/env bash
# Side-by-side ledger write benchmark: 3 etcd members vs 3 shoal agents on
# loopback, both driven by wrk through their HTTP/JSON APIs (etcd's v3 JSON
# gateway, Shoal's /v1/attrs), at the leader, 1/16/64 connections.
#
# Needs: etcd (Debian etcd-server), wrk, and a release build of shoal
# (cargo build --release). Usage: bench/ledger-vs-etcd.sh [seconds]
set -euo pipefail
secs=${1:-10}
root=$(mktemp -d /tmp/shoal-bench-XXXX)
shoal=${SHOAL_BIN:-$(dirname "$0")/../target/release/shoal}
. "$(dirname "$0")/shoal-cluster.sh"
pids=()
stop_all() { { kill -9 "${pids[@]}"; wait "${pids[@]}"; } 2>/dev/null || true; pids=(); }
cleanup() { stop_all; rm -rf "$root"; }
trap cleanup EXIT

run_wrk() { # url lua conns
  local threads=$(( $3 < 2 ? 1 : 2 ))
  wrk -t"$threads" -c"$3" -d"${secs}s" --latency -s "$2" "$1" 2>&1 |
    awk -v c="$3" '/Requests\/sec/ {rps=$2} /^ +50%/ {p50=$2} /^ +99%/ {p99=$2} /Non-2xx/ {err=$4}
      END {printf "%8d %12s %10s %10s %s\n", c, rps, p50, p99, (err ? "non-2xx:" err : "")}'
}

echo "== etcd $(etcd --version | head -1 | awk '{print $3}'), 3 members =="
cluster=e1=http://127.0.0.1:23800,e2=http://127.0.0.1:23810,e3=http://127.0.0.1:23820
for i in 0 1 2; do
  etcd --name e$((i+1)) --data-dir "$root/e$i" \
    --listen-client-urls http://127.0.0.1:2379$i --advertise-client-urls http://127.0.0.1:2379$i \
    --listen-peer-urls http://127.0.0.1:238${i}0 --initial-advertise-peer-urls http://127.0.0.1:238${i}0 \
    --initial-cluster "$cluster" --initial-cluster-state new --initial-cluster-token bench \
    --log-level error > "$root/e$i.log" 2>&1 &
  pids+=($!)
done
leader_url=""
for _ in $(seq 1 100); do
  for i in 0 1 2; do
    s=$(curl -s -X POST -d '{}' http://127.0.0.1:2379$i/v3/maintenance/status || true)
    me=$(echo "$s" | sed -n 's/.*"member_id":"\([0-9]*\)".*/\1/p')
    ld=$(echo "$s" | sed -n 's/.*"leader":"\([0-9]*\)".*/\1/p')
    if [ -n "$me" ] && [ "$me" = "$ld" ]; then leader_url=http://127.0.0.1:2379$i; fi
  done
  [ -n "$leader_url" ] && break
  sleep 0.2
done
[ -n "$leader_url" ] || { echo "etcd did not elect a leader"; exit 1; }
cat > "$root/etcd.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.body = '{"key":"YmVuY2g=","value":"' .. string.rep("dg", 32) .. '"}'
LUA
printf "%8s %12s %10s %10s\n" conns writes/s p50 p99
for c in 1 16 64; do run_wrk "$leader_url/v3/kv/put" "$root/etcd.lua" $c; done
stop_all

echo "== shoal $("$shoal" --version | awk '{print $2}'), 3 agents =="
start_shoal_cluster
cat > "$root/shoal.lua" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["Authorization"] = "Bearer $admin"
wrk.body = '{"key":"bench","value":"' .. string.rep("v", 64) .. '"}'
LUA
printf "%8s %12s %10s %10s\n" conns writes/s p50 p99
for c in 1 16 64; do run_wrk "http://127.0.0.1:$port/v1/attrs" "$root/shoal.lua" $c; done
