#!/usr/bin/env bash
# Long chaos runs as docs/reliability.md describes them: one seed per
# `shoal bench chaos` process, P processes at a time, each seed's JSON
# report and node log kept in OUT; a failing seed's log is what finds its
# cause. Prints the totals and every seed that failed or could not run.
#
#   scripts/chaos-streams.sh [-b BIN] [-p PARALLEL] [-d DURATION] [-o OUT] FIRST COUNT
#
# Defaults: the debug binary, 4 at a time, 60 s seeds, every fault kind.
set -euo pipefail
cd "$(dirname "$0")/.."

bin=target/debug/shoal
parallel=4
duration=60s
out=
kinds=partition,bridge,one-way,drop,delay,crash,crash-wipe,pause,clock-jump,remove-voter,disk-full
while getopts "b:p:d:o:k:" opt; do
    case $opt in
        b) bin=$OPTARG ;;
        p) parallel=$OPTARG ;;
        d) duration=$OPTARG ;;
        o) out=$OPTARG ;;
        k) kinds=$OPTARG ;;
        *) echo "usage: $0 [-b BIN] [-p PARALLEL] [-d DURATION] [-o OUT] [-k KINDS] FIRST COUNT" >&2; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
if [ $# -ne 2 ]; then
    echo "usage: $0 [-b BIN] [-p PARALLEL] [-d DURATION] [-o OUT] [-k KINDS] FIRST COUNT" >&2
    exit 2
fi
first=$1
count=$2
[ -x "$bin" ] || { echo "error: no binary at $bin (cargo build first)" >&2; exit 2; }
out=${out:-$(mktemp -d -t shoal-chaos-XXXXXX)}
mkdir -p "$out"
echo "seeds $first..$((first + count - 1)), $parallel at a time, $duration each; reports in $out"

seq "$first" $((first + count - 1)) | xargs -P "$parallel" -I{} sh -c '
    RUST_LOG=warn,shoal_node=info "$0" bench chaos --seeds 1 --first-seed {} \
        --duration "$1" --kinds "$2" --json >"$3/{}.json" 2>"$3/{}.log" || true
' "$bin" "$duration" "$kinds" "$out"

python3 - "$out" <<'EOF'
import json, os, sys
out = sys.argv[1]
totals = {"register_ops": 0, "jobs_submitted": 0, "entries_applied": 0,
          "checkpoint_steps_restored": 0, "wall_s": 0.0}
faults, passed, failed, errors, unreadable = {}, 0, [], [], []
for name in sorted(os.listdir(out), key=lambda n: (len(n), n)):
    if not name.endswith(".json"):
        continue
    seed = name[:-5]
    try:
        with open(os.path.join(out, name)) as f:
            s = json.load(f)
    except (OSError, ValueError):
        unreadable.append(seed)
        continue
    passed += s["passed"]
    failed += s["failed_seeds"]
    errors += s["harness_errors"]
    for k in totals:
        totals[k] += s[k]
    for kind, n in s["faults"].items():
        faults[kind] = faults.get(kind, 0) + n
print(f"passed {passed}; failed {sorted(failed)}; harness errors {sorted(errors)}; "
      f"no report {unreadable}")
print("faults", sum(faults.values()), dict(sorted(faults.items())))
print(", ".join(f"{k} {round(v)}" for k, v in totals.items()))
sys.exit(1 if failed or unreadable else 0)
EOF
