#!/usr/bin/env bash
# Runs every test binary of the workspace N times in a row and reports, per
# binary, how many runs passed and which tests failed how often. A flaky
# test blocks landings by chance: run this (N >= 20) before calling a change
# to the tests or to timing-sensitive code done.
#
#   scripts/soak-tests.sh [-n N] [-t SECONDS] [-l] [-o DIR] [-f FILTER] [PATTERN...]
#
#   -n N      runs per binary (default 20)
#   -t S      a run still going after S seconds is killed and counted as
#             failed (default 1200)
#   -l        load the machine while soaking: one busy loop per core, as a
#             second build would
#   -o DIR    keep every run's output under DIR (default: a temp dir)
#   -f FILTER only the tests whose name contains FILTER (as `cargo test
#             FILTER`), e.g. -f pytorch_ddp processes: the DDP jobs killed
#             mid-run, 20 times each
#   PATTERN   only binaries whose name matches one of these shell patterns
#             (e.g. shoal_node, inprocess, processes, 'shoal_*')
#
# Binaries run exactly as `cargo test` runs them: from their package's
# directory, tests of one binary in parallel threads. Exit status is 0 only
# when every run of every selected binary passed.
set -uo pipefail
cd "$(dirname "$0")/.."

runs=20
limit=1200
load=0
out=""
filter=()
while getopts "n:t:lo:f:h" opt; do
    case $opt in
        n) runs=$OPTARG ;;
        t) limit=$OPTARG ;;
        l) load=1 ;;
        o) out=$OPTARG ;;
        f) filter=("$OPTARG") ;;
        *) sed -n '2,23p' "$0"; exit 2 ;;
    esac
done
shift $((OPTIND - 1))
case $runs in '' | *[!0-9]*) echo "error: -n needs a whole number, got '$runs'" >&2; exit 2 ;; esac
case $limit in '' | *[!0-9]*) echo "error: -t needs a whole number of seconds, got '$limit'" >&2; exit 2 ;; esac
out=${out:-$(mktemp -d -t shoal-soak-XXXXXX)}
mkdir -p "$out"

echo "building the test binaries..."
list="$out/binaries.tsv"
if ! cargo test --workspace --locked --no-run --message-format=json 2>"$out/build.log" \
    | python3 -c '
import json, os, sys
for line in sys.stdin:
    try:
        m = json.loads(line)
    except ValueError:
        continue
    if m.get("reason") == "compiler-artifact" and m.get("profile", {}).get("test") and m.get("executable"):
        name = m["target"]["name"].replace("-", "_")
        print(name, os.path.dirname(m["manifest_path"]), m["executable"], sep="\t")
' >"$list"; then
    echo "error: the test binaries did not build (see $out/build.log)" >&2
    exit 1
fi

if [ "$load" = 1 ]; then
    for _ in $(seq "$(nproc)"); do (while :; do :; done) & done
    trap 'kill $(jobs -p) 2>/dev/null' EXIT
    echo "loading the machine with $(nproc) busy loops"
fi

failed_any=0
summary="$out/summary.txt"
: >"$summary"
while IFS=$'\t' read -r name dir exe; do
    if [ $# -gt 0 ]; then
        keep=0
        for p in "$@"; do
            # shellcheck disable=SC2254 # the pattern is meant to glob
            case $name in $p) keep=1 ;; esac
        done
        [ $keep = 1 ] || continue
    fi
    passed=0
    slowest=0
    rm -f "$out/$name.failures"
    for i in $(seq "$runs"); do
        log="$out/$name.$i.log"
        start=$(date +%s)
        if (cd "$dir" && timeout -k 10 "$limit" "$exe" "${filter[@]}") >"$log" 2>&1; then
            passed=$((passed + 1))
        else
            failed_any=1
            grep -E '^test .* \.\.\. FAILED$' "$log" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/' \
                >>"$out/$name.failures" || true
            grep -qE '^test .* \.\.\. FAILED$' "$log" \
                || echo "(no failing test named: crashed or hit the $limit s limit; see $log)" >>"$out/$name.failures"
        fi
        took=$(($(date +%s) - start))
        [ "$took" -gt "$slowest" ] && slowest=$took
        printf '\r%-24s run %d/%d: %d passed (slowest %d s)' "$name" "$i" "$runs" "$passed" "$slowest"
    done
    printf '\n'
    line=$(printf '%-24s %d/%d passed, slowest run %d s' "$name" "$passed" "$runs" "$slowest")
    echo "$line" >>"$summary"
    if [ -f "$out/$name.failures" ]; then
        sort "$out/$name.failures" | uniq -c | sort -rn | sed 's/^/    failed /' | tee -a "$summary"
    fi
done <"$list"

echo
echo "soak summary ($runs runs per binary, logs in $out):"
cat "$summary"
exit $failed_any
