#!/usr/bin/env bash
# Replays the real traces through `shoal sim` with a fixed set of flags and
# writes each run's stdout, stderr and exit status to OUT_DIR, so that two
# binaries can be compared file by file: a change that must not change any
# scheduling decision leaves every file byte-identical.
#
#   scripts/sim-replays.sh SHOAL_BINARY OUT_DIR   # about 2 min (release build)
#   diff -r BASE_DIR NEW_DIR && echo identical
#
# Traces come from ../shared/traces beside the repo (TRACES=DIR to override).
#
# Covers every policy (fifo, hdrf, hdrf-preempt), both drivers (direct,
# ledger), node failures with and without checkpoints, both real trace
# formats (Philly per-VC CSVs, a single file and the whole directory as one
# tenant per VC; the Alibaba 2023 pod list), --until windows, explicit
# --format/--racks/--zones/--gpus-per-node, single-policy JSON (an object),
# the table output, the --plot SVG, and the error paths for bad names.
set -uo pipefail
bin=${1:?usage: scripts/sim-replays.sh SHOAL_BINARY OUT_DIR}
out=${2:?usage: scripts/sim-replays.sh SHOAL_BINARY OUT_DIR}
T=${TRACES:-$(cd "$(dirname "$0")/../../shared/traces" && pwd)}
P=$T/philly-pcs-vc
A=$T/alibaba-gpu-2023/openb_pod_list_default.csv
mkdir -p "$out"

run() {
    local name=$1
    shift
    local start=$SECONDS
    (cd "$out" && "$bin" "$@" >"$name.out" 2>"$name.err")
    echo $? >"$out/$name.rc"
    printf '%-28s rc=%s %4ss  %s\n' "$name" "$(cat "$out/$name.rc")" $((SECONDS - start)) "$*"
}

all=fifo,hdrf,hdrf-preempt

run 01-philly-51b7ef        sim --json --trace "$P/trace_51b7ef.csv" --policy $all --nodes 4
run 02-philly-0e4a51        sim --json --trace "$P/trace_0e4a51.csv" --policy $all --nodes 8
run 03-philly-2869ce-ledger sim --json --trace "$P/trace_2869ce.csv" --policy $all --nodes 16 --driver ledger
run 04-alibaba-4x8          sim --json --trace "$A" --nodes 4 --gpus-per-node 8 --policy $all
run 05-alibaba-6-ledger     sim --json --trace "$A" --nodes 6 --policy $all --driver ledger
run 06-philly-dir-2d        sim --json --trace "$P" --until 2d --policy $all --nodes 96
run 07-philly-dir-2d-ledger sim --json --trace "$P" --until 2d --policy $all --nodes 96 --driver ledger
run 08-philly-dir-30d       sim --json --trace "$P" --until 30d --policy $all --nodes 96
run 09-philly-dir-30d-ledger sim --json --trace "$P" --until 30d --policy $all --nodes 96 --driver ledger
run 10-philly-dir-15d-64    sim --json --trace "$P" --until 15d --policy $all --nodes 64 --driver direct
run 11-philly-ee9e8c-fail   sim --json --trace "$P/trace_ee9e8c.csv" --policy $all --nodes 32 --fail-mtbf 480h --ckpt-interval 1h --seed 5
run 12-philly-e13805-fail-ledger sim --json --trace "$P/trace_e13805.csv" --policy hdrf-preempt,fifo --nodes 16 --fail-mtbf 200h --driver ledger --seed 3
run 13-alibaba-fail-ledger  sim --json --trace "$A" --nodes 8 --policy hdrf-preempt,hdrf --driver ledger --fail-mtbf 500h --ckpt-interval 30m
run 14-philly-dir-10d-fail-ledger sim --json --trace "$P" --until 10d --policy hdrf-preempt --nodes 48 --fail-mtbf 240h --ckpt-interval 2h --driver ledger --seed 11
run 15-philly-11cb48-fail   sim --json --trace "$P/trace_11cb48.csv" --policy hdrf,hdrf-preempt --nodes 32 --fail-mtbf 720h --ckpt-interval 30m --seed 2
run 16-philly-7f04ca-shape  sim --json --trace "$P/trace_7f04ca.csv" --format philly --policy $all --nodes 24 --gpus-per-node 4 --racks 3 --zones 2 --fail-mtbf 300h --seed 9
run 17-alibaba-format-fifo  sim --json --trace "$A" --format alibaba --policy fifo --nodes 8 --until 120d --seed 4
run 18-philly-dir-table     sim --trace "$P" --until 5d --policy $all --nodes 64 --plot plot-18.svg
run 19-alibaba-table-ledger sim --trace "$A" --until 125d --policy hdrf,fifo --nodes 8 --driver ledger --fail-mtbf 300h --seed 6
run 20-philly-b436b2-hdrf   sim --json --trace "$P/trace_b436b2.csv" --policy hdrf --nodes 12 --until 20d
run 30-err-policy           sim --json --trace "$P/trace_51b7ef.csv" --policy fifo,lifo
run 31-err-driver           sim --json --trace "$P/trace_51b7ef.csv" --driver raft
run 32-err-format           sim --json --trace "$P/trace_51b7ef.csv" --format csv
run 33-err-trace            sim --json --trace /nonexistent/trace.csv
exit 0
