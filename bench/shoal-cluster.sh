# Sourced by the benchmarks: `start_shoal_cluster [NODES [AGENT ARGS...]]`
# starts NODES (default 3) `shoal agent` processes on loopback
# (s1 bootstraps, the others join), each with AGENT ARGS, waits until s1-s3
# are voters and every node is alive, and sets `admin` (the admin token),
# `leader` (its node id), `port` (the leader's API port) and `leader_pid`.
# Expects `shoal`, `root` and the array `pids` (every agent started is
# appended to it).

# `cpu_ticks PID`: the process's CPU so far (utime + stime), in clock ticks
# (`getconf CLK_TCK` a second).
# `cluster_workdir NAME`: sets `root` to a fresh directory, removed with
# every agent started (`pids`) when the script exits, and `ticks` (clock
# ticks a second, for `cpu_ticks`).
cluster_workdir() {
  root=$(mktemp -d "/tmp/shoal-$1-XXXX")
  pids=()
  trap '{ kill -9 "${pids[@]}"; wait "${pids[@]}"; } 2>/dev/null || true; rm -rf "$root"' EXIT
  ticks=$(getconf CLK_TCK)
}

# `api_port N`: node sN's API port (its RPC port is the next one up).
api_port() {
  if [ "$1" = 1 ]; then echo 27070; else echo $((28000 + 100 * $1 + 70)); fi
}

cpu_ticks() {
  awk '{print $14 + $15}' "/proc/$1/stat"
}

start_shoal_cluster() {
  local nodes=${1:-3}
  [ $# -gt 0 ] && shift
  "$shoal" agent --bootstrap --name s1 --data-dir "$root/s1" --api-addr 127.0.0.1:27070 --rpc-addr 127.0.0.1:27071 --gossip-addr 127.0.0.1:0 "$@" > "$root/s1.out" 2> "$root/s1.log" &
  pids+=($!)
  for _ in $(seq 1 100); do grep -q -- 'join token: ' "$root/s1.out" 2>/dev/null && break; sleep 0.1; done
  # The printed token is single use: one token for all joiners.
  local token v= alive=
  # The API may answer a moment after the token is printed.
  for _ in $(seq 1 50); do
    (umask 077; "$shoal" --api http://127.0.0.1:27070 --data-dir "$root/s1" token create --voter --uses $((nodes - 1)) > "$root/join.token" 2> /dev/null) && break
    sleep 0.2
  done
  [ -s "$root/join.token" ] || { echo "error: s1 did not start (see $root/s1.log)" >&2; exit 1; }
  for i in $(seq 2 "$nodes"); do
    "$shoal" agent --join 127.0.0.1:27071 --join-token-file "$root/join.token" --name s$i --data-dir "$root/s$i" \
      --api-addr 127.0.0.1:$(api_port "$i") --rpc-addr 127.0.0.1:$(( $(api_port "$i") + 1 )) --gossip-addr 127.0.0.1:0 "$@" > /dev/null 2> "$root/s$i.log" &
    pids+=($!)
  done
  admin=$(cat "$root/s1/admin.token")
  for _ in $(seq 1 200); do
    v=$(SHOAL_TOKEN="$admin" "$shoal" --api http://127.0.0.1:27070 status --json 2>/dev/null | tr -d ' \n' | sed -n 's/.*"voters":\[\([0-9,]*\)\].*/\1/p')
    alive=$(SHOAL_TOKEN="$admin" "$shoal" --api http://127.0.0.1:27070 nodes --json 2>/dev/null | tr -d ' \n' | grep -o '"state":"alive"' | wc -l)
    [ "${v:0:5}" = "1,2,3" ] && [ "$alive" = "$nodes" ] && break
    sleep 0.1
  done
  [ "${v:0:5}" = "1,2,3" ] && [ "$alive" = "$nodes" ] || { echo "error: the $nodes agents did not form a cluster (voters $v, $alive alive)" >&2; exit 1; }
  leader=$(SHOAL_TOKEN="$admin" "$shoal" --api http://127.0.0.1:27070 status --json | tr -d ' \n' | sed -n 's/.*"leader":\([0-9]*\).*/\1/p')
  port=$(api_port "$leader")
  leader_pid=${pids[$((leader - 1))]}
}
