#!/usr/bin/env bash
# Cross-region forwarding overhead on submit: two one-node regions on
# loopback (us-1, eu-1), federated; the same submission POSTed N times to
# us-1's API, once for us-1 itself and once with `x-shoal-region: eu-1`
# (forwarded), with an injected WAN round trip of RTT_MS towards eu-1
# (SHOAL_TEST_INJECT_WAN; the kernel here has no netem). Prints the median
# and p90 acknowledgement latency of each, measured by curl.
#
# Usage: bench/federation-submit.sh [N] [RTT_MS]   (needs curl and a built shoal)
set -euo pipefail
n=${1:-50}
rtt=${2:-50}
shoal=${SHOAL_BIN:-$(dirname "$0")/../target/debug/shoal}
root=$(mktemp -d /tmp/shoal-fed-bench-XXXX)
pids=()
cleanup() { { kill -9 "${pids[@]}"; wait "${pids[@]}"; } 2>/dev/null || true; rm -rf "$root"; }
trap cleanup EXIT

start() { # name region port [env...]
  local name=$1 region=$2 port=$3
  shift 3
  env SHOAL_EXECUTOR__RUN_AS=agent SHOAL_EXECUTOR__ALLOW_ROOT=true "$@" \
    "$shoal" agent --bootstrap --name "$name" --region "$region" --data-dir "$root/$name" \
    --api-addr 127.0.0.1:"$port" --rpc-addr 127.0.0.1:"$port" --gossip-addr 127.0.0.1:0 \
    --sim-gpus 8xH100-80GB > "$root/$name.out" 2> "$root/$name.log" &
  pids+=($!)
  for _ in $(seq 1 200); do
    if [ -s "$root/$name/admin.token" ] && curl -sf http://127.0.0.1:"$port"/health > /dev/null; then
      return
    fi
    sleep 0.1
  done
  echo "agent $name did not start (see $root/$name.log)" >&2
  exit 1
}

start us1 us-1 27401 SHOAL_TEST_INJECT_WAN=eu-1="$rtt"
start eu1 eu-1 27402
us_token=$(cat "$root/us1/admin.token")
eu_token=$(cat "$root/eu1/admin.token")
SHOAL_TOKEN=$us_token SHOAL_PEER_TOKEN=$eu_token "$shoal" --api http://127.0.0.1:27401 \
  federation join http://127.0.0.1:27402 > /dev/null

# Another region acts only for a tenant both regions share (caps across
# regions, defined in us-1 and adopted by eu-1), never for an admin: the
# submissions use a token of one, here and forwarded alike.
us() { SHOAL_TOKEN=$us_token "$shoal" --api http://127.0.0.1:27401 "$@"; }
us tenant create bench --global-gpus 100000 > /dev/null
for _ in $(seq 1 200); do
  # eu-1 adopted it and read us-1's summary naming it (what it checks).
  if SHOAL_TOKEN=$eu_token "$shoal" --api http://127.0.0.1:27402 --json tenant global 2> /dev/null \
      | tr -d ' \n' | grep -q '"tenant":"bench".*"region":"us-1","share"'; then
    break
  fi
  sleep 0.1
done
bench_token=$(us token api --tenant bench --name bench-bot)

# The bearer token from a 0600 file: curl's arguments are every local process's to read.
(umask 077; printf 'Authorization: Bearer %s\n' "$bench_token" > "$root/auth.header")
body='{"name":"bench","nodes":1,"gpus_per_node":1,"time_limit_s":60,"priority":0,"preemptible":true,"command":["true"],"env":{}}'
measure() { # label [header]
  local label=$1
  shift
  for _ in $(seq 1 "$n"); do
    curl -s -o /dev/null -w '%{time_total} %{http_code}\n' -X POST http://127.0.0.1:27401/v1/jobs \
      -H @"$root/auth.header" -H 'Content-Type: application/json' "$@" -d "$body"
  done | sort -n | awk -v l="$label" '{v[NR]=$1*1000; if ($2 != 200) bad++}
    END {printf "%-32s median %7.1f ms   p90 %7.1f ms   (n=%d, non-200: %d)\n", l, v[int((NR+1)/2)], v[int(NR*0.9)], NR, bad}'
}
measure "local (us-1)"
measure "forwarded to eu-1 (+${rtt} ms)" -H 'x-shoal-region: eu-1'
