#!/usr/bin/env bash
# How long a cluster goes without a leader: three `shoal agent` processes on
# loopback. RUNS times: kill -9 the leader, then post a write to a survivor
# every 10 ms (each given 300 ms) until one is accepted; print the time from the kill to that
# write, restart the killed agent from its data dir and wait until all three
# agree on a leader again. Then, with BUSY busy loops (default: two per
# core) taking every core, count the elections (Raft term changes) in
# STARVED seconds in which nothing was killed: each one is a spurious
# election. The agents inherit the environment, so Raft's timing can be
# tried without a config file:
#   SHOAL_RAFT__HEARTBEAT_MS=100 SHOAL_RAFT__ELECTION_TIMEOUT_MIN_MS=300 \
#   SHOAL_RAFT__ELECTION_TIMEOUT_MAX_MS=450 bench/leader-failover.sh
#
# KEEP_SLOW_MS=N copies the agents' logs of every run slower than N ms to
# /tmp/failover-slow-RUN. Needs curl and a release build of shoal. Usage:
#   bench/leader-failover.sh [runs] [starved-seconds]      (default: 10 60)
set -euo pipefail
runs=${1:-10}
starved=${2:-60}
busy=${BUSY:-$((2 * $(nproc)))}
shoal=${SHOAL_BIN:-$(dirname "$0")/../target/release/shoal}
. "$(dirname "$0")/shoal-cluster.sh"
cluster_workdir failover

start_shoal_cluster 3

api_of() { # node name sN -> its API URL
  echo "http://127.0.0.1:$(api_port "${1#s}")"
}
status_at() { # API URL -> status JSON, compact, empty if it does not answer
  SHOAL_TOKEN="$admin" timeout 2 "$shoal" --api "$1" status --json 2>/dev/null | tr -d ' \n' || true
}
# The name of the node with id $2 in status JSON $1.
name_of() {
  python3 -c 'import json,sys; st=json.loads(sys.argv[1]); print(next(m["name"] for m in st["members"] if m["id"]==int(sys.argv[2])))' "$1" "$2"
}
field() { # status JSON, key -> its number
  echo "$1" | sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p"
}
# Waits until s1-s3 all answer and name the same leader; prints it.
agreed_leader() {
  local l1 l2 l3
  for _ in $(seq 1 300); do
    l1=$(field "$(status_at "$(api_of s1)")" leader)
    l2=$(field "$(status_at "$(api_of s2)")" leader)
    l3=$(field "$(status_at "$(api_of s3)")" leader)
    if [ -n "$l1" ] && [ "$l1" = "$l2" ] && [ "$l2" = "$l3" ]; then echo "$l1"; return; fi
    sleep 0.1
  done
  echo "error: the three agents did not agree on a leader in 30 s" >&2
  exit 1
}
restart() { # sN: start that agent again from its data dir
  local i=${1#s}
  "$shoal" agent --name "$1" --data-dir "$root/$1" --api-addr "127.0.0.1:$(api_port "$i")" \
    --rpc-addr "127.0.0.1:$(( $(api_port "$i") + 1 ))" --gossip-addr 127.0.0.1:0 >> "$root/$1.log" 2>&1 &
  pids[$((i - 1))]=$!
}
now_ms() { date +%s%3N; }
term_now() { # s1's Raft term, asked until it answers (it may be slow under load)
  local t
  for _ in $(seq 1 30); do
    t=$(field "$(status_at "$(api_of s1)")" term)
    [ -n "$t" ] && { echo "$t"; return; }
  done
  echo "error: s1 did not say its term" >&2
  exit 1
}

times=()
for run in $(seq 1 "$runs"); do
  leader=$(agreed_leader)
  st=$(status_at "$(api_of s1)")
  victim=$(name_of "$st" "$leader")
  survivor=s1; [ "$victim" = s1 ] && survivor=s2
  victim_pid=${pids[$((${victim#s} - 1))]}
  kill -9 "$victim_pid"
  killed=$(now_ms)
  wait "$victim_pid" 2> /dev/null || true
  n=0
  until answer=$(curl -sS -m 0.3 -w ' %{http_code}' -H "Authorization: Bearer $admin" -H 'content-type: application/json' \
      -d "{\"key\":\"failover/$run\",\"value\":\"$n\"}" "$(api_of "$survivor")/v1/attrs" 2>&1) && [ "${answer##* }" = 200 ]; do
    n=$((n + 1))
    last=$answer
    [ $(( $(now_ms) - killed )) -lt 30000 ] || { echo "error: no write accepted 30 s after the leader was killed" >&2; exit 1; }
    sleep 0.01
  done
  took=$(( $(now_ms) - killed ))
  times+=("$took")
  echo "run $run: leader $victim killed -> write accepted by $survivor after $took ms ($n refused; the last: ${last:-none})"
  last=
  if [ -n "${KEEP_SLOW_MS:-}" ] && [ "$took" -gt "$KEEP_SLOW_MS" ]; then
    mkdir -p "/tmp/failover-slow-$run" && cp "$root"/s*.log "/tmp/failover-slow-$run/"
    echo "  (the agents' logs are in /tmp/failover-slow-$run)"
  fi
  restart "$victim"
done
sorted=$(printf '%s\n' "${times[@]}" | sort -n)
echo "kill -9 of the leader -> write accepted, ms: $(echo $sorted) (median $(echo "$sorted" | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'))"

agreed_leader > /dev/null
term_before=$(term_now)
for _ in $(seq 1 "$busy"); do
  (while :; do :; done) &
  pids+=($!)
done
sleep "$starved"
term_after=$(term_now)
echo "with $busy busy loops on $(nproc) cores for $starved s: $(( term_after - term_before )) elections (term $term_before -> $term_after)"
