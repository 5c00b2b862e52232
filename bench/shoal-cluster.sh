# Sourced by the ledger benchmarks: starts three `shoal agent` processes on
# loopback (s1 bootstraps, s2 and s3 join), waits until all three are
# voters, and sets `admin` (the admin token), `leader` (its node id),
# `port` (the leader's API port) and `leader_pid`. Expects `shoal`, `root`
# and the array `pids` (every agent started is appended to it).
start_shoal_cluster() {
  "$shoal" agent --bootstrap --name s1 --data-dir "$root/s1" --api-addr 127.0.0.1:27070 --rpc-addr 127.0.0.1:27071 --gossip-addr 127.0.0.1:0 > "$root/s1.out" 2> "$root/s1.log" &
  pids+=($!)
  for _ in $(seq 1 100); do grep -q -- --join-token "$root/s1.out" 2>/dev/null && break; sleep 0.1; done
  # The printed token is single use: one token for both joiners.
  local token v=
  token=$("$shoal" --api http://127.0.0.1:27070 --data-dir "$root/s1" token create --uses 2)
  for i in 2 3; do
    "$shoal" agent --join 127.0.0.1:27071 --join-token "$token" --name s$i --data-dir "$root/s$i" \
      --api-addr 127.0.0.1:2${i}070 --rpc-addr 127.0.0.1:2${i}071 --gossip-addr 127.0.0.1:0 > /dev/null 2> "$root/s$i.log" &
    pids+=($!)
  done
  admin=$(cat "$root/s1/admin.token")
  for _ in $(seq 1 200); do
    v=$("$shoal" --api http://127.0.0.1:27070 --token "$admin" status --json 2>/dev/null | tr -d ' \n' | sed -n 's/.*"voters":\[\([0-9,]*\)\].*/\1/p')
    [ "$v" = "1,2,3" ] && break
    sleep 0.1
  done
  [ "$v" = "1,2,3" ] || { echo "error: the three agents did not form a cluster" >&2; exit 1; }
  leader=$("$shoal" --api http://127.0.0.1:27070 --token "$admin" status --json | tr -d ' \n' | sed -n 's/.*"leader":\([0-9]*\).*/\1/p')
  port=$([ "$leader" = 1 ] && echo 27070 || echo "2${leader}070")
  leader_pid=${pids[$((leader - 1))]}
}
