#!/usr/bin/env bash
# Submit -> running and jobs/s, Shoal beside Slurm, measured by the same
# script through each system's own command-line tools: four nodes with four
# GPUs each on loopback (four `shoal agent` processes with simulated GPUs;
# one slurmctld and four slurmd of one host, each its own NodeName, with
# stand-in GPU device files), then
#   1. --gangs gangs of 2 nodes x 4 GPUs, one at a time: the submit command
#      returns (acknowledged), the job shows as running (placed: `shoal
#      show`, `squeue`), both ranks have written their start time (ranks
#      started); then it is cancelled, and the next one goes in once it is
#      gone;
#   2. --jobs one-GPU `true` jobs submitted by 16 concurrent clients (one
#      `shoal submit` / `sbatch` process each), from the first submission
#      until the queue (`shoal queue`, `squeue`) is empty.
# `shoal bench submit` measures the same in one process, without the CLI.
#
# SYSTEMS: any of shoal, slurm (defaults), slurm-tuned (batch_sched_delay=0,
# sched_min_interval=0, MessageTimeout=2, SlurmdTimeout=5); all three by
# default, in that order. Needs root, a release build of shoal (or
# SHOAL_BIN) and Debian's slurm-wlm for Slurm.
#
# Usage: bench/submit-vs-slurm.sh [--gangs N] [--jobs N] [SYSTEM...]
set -euo pipefail
gangs=30 jobs=500 systems=()
while [ $# -gt 0 ]; do
  case $1 in
    --gangs) gangs=$2; shift ;;
    --jobs) jobs=$2; shift ;;
    shoal | slurm | slurm-tuned) systems+=("$1") ;;
    *) echo "error: unknown argument $1 (usage: $0 [--gangs N] [--jobs N] [shoal|slurm|slurm-tuned]...)" >&2; exit 2 ;;
  esac
  shift
done
[ ${#systems[@]} -gt 0 ] || systems=(shoal slurm slurm-tuned)
[ "$(id -u)" = 0 ] || { echo "error: needs root (both systems start jobs as other users)" >&2; exit 1; }
shoal=${SHOAL_BIN:-$(dirname "$0")/../target/release/shoal}
. "$(dirname "$0")/shoal-cluster.sh"

root=
pids=()
stop_all() {
  if [ -n "${SLURM_CONF:-}" ]; then scancel --quiet --user=root 2>/dev/null || true; fi
  { kill "${pids[@]}"; wait "${pids[@]}"; } 2>/dev/null || true
  pids=()
  unset SLURM_CONF
}
cleanup() { stop_all; [ -z "$root" ] || [ -n "${KEEP:-}" ] || rm -rf "$root"; }
trap cleanup EXIT

now_ns() { date +%s%N; }
ms_between() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f\n", (b - a) / 1e6}'; } # two now_ns readings
ms_since() { ms_between "$1" "$(now_ns)"; }
# The polls are each a process of the system's CLI and share the two cores
# with what they measure, hence no tighter than this.
wait_for() { # description, command...: polls every 5 ms for up to 60 s
  local what=$1; shift
  local deadline=$(( $(date +%s) + 60 ))
  until "$@"; do
    [ "$(date +%s)" -lt "$deadline" ] || { echo "error: timed out waiting for $what" >&2; tail -n 20 "$root"/*.log >&2; exit 1; }
    sleep 0.005
  done
}
# p50 / p90 / max of the numbers on stdin (nearest rank, as `shoal bench`).
stats() { sort -n | awk '{v[NR]=$1} END {
  p50=v[int((NR-1)*0.5+0.5)+1]; p90=v[int((NR-1)*0.9+0.5)+1];
  printf "%8.1f %8.1f %8.1f", p50, p90, v[NR] }'; }

# --- Shoal: four agents, the CLI against the leader ---------------------
start_shoal() {
  [ -x "$shoal" ] || { echo "error: no shoal binary at $shoal (cargo build --release, or SHOAL_BIN)" >&2; exit 1; }
  start_shoal_cluster 4 --sim-gpus 4xH100-80GB
  export SHOAL_API=http://127.0.0.1:$port SHOAL_TOKEN=$admin
  version="shoal $("$shoal" --version | awk '{print $2}')"
}
shoal_field() { "$shoal" show "$1" --json | tr -d ' \n' | sed -n "s/.*\"$2\":\"\([a-z]*\)\".*/\1/p"; }
shoal_gang() { "$shoal" submit -N 2 --gpus-per-node 4 -- sh -c "$1"; }
shoal_running() { [ "$(shoal_field "$1" state)" = running ]; }
shoal_cancel() { "$shoal" cancel "$1" > /dev/null; }
shoal_gone() { case $(shoal_field "$1" state) in completed | failed | cancelled) true ;; *) false ;; esac; }
shoal_one() { "$shoal" submit --gpus-per-node 1 -- true > /dev/null; }
shoal_drained() { [ "$("$shoal" queue --json | tr -d ' \n')" = "[]" ]; }

# --- Slurm: one slurmctld, four slurmd ----------------------------------
start_slurm() { # tuned: 0 or 1
  for tool in slurmctld slurmd sbatch squeue scancel sinfo munged; do
    command -v "$tool" >/dev/null || { echo "error: $tool not found (apt-get install slurm-wlm)" >&2; exit 1; }
  done
  pgrep -x munged >/dev/null || { mkdir -p /run/munge && chown munge: /run/munge && su -s /bin/sh munge -c munged; }
  local ctld_port=$((16817 + RANDOM % 1000))
  local scheduler="SchedulerParameters=default_queue_depth=100" timeouts="MessageTimeout=10
SlurmdTimeout=300"
  if [ "$1" = 1 ]; then
    scheduler="SchedulerParameters=batch_sched_delay=0,sched_min_interval=0,default_queue_depth=100"
    timeouts="MessageTimeout=2
SlurmdTimeout=5"
  fi
  export SLURM_CONF=$root/slurm.conf
  cat > "$SLURM_CONF" <<EOF
ClusterName=bench
SlurmctldHost=localhost
SlurmctldPort=$ctld_port
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
StateSaveLocation=$root/state
SlurmdSpoolDir=$root/spool-%n
SlurmctldPidFile=$root/slurmctld.pid
SlurmdPidFile=$root/slurmd-%n.pid
SlurmctldLogFile=$root/slurmctld.log
SlurmdLogFile=$root/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmdParameters=config_overrides
GresTypes=gpu
SchedulerType=sched/backfill
$scheduler
$timeouts
ReturnToService=2
MpiDefault=none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
MaxJobCount=100000
NodeName=n[1-4] NodeHostname=localhost NodeAddr=127.0.0.1 Port=$((ctld_port + 1))-$((ctld_port + 4)) CPUs=4 RealMemory=4000 Gres=gpu:4 State=UNKNOWN
PartitionName=batch Nodes=n[1-4] Default=YES MaxTime=INFINITE State=UP
EOF
  # Slurm drops a GPU without a device file: four character devices stand
  # in (the kernel's null, zero, full and urandom; nothing opens them).
  mkdir -p "$root/state" "$root/dev"
  local minor=(3 5 7 9) g n
  for g in 0 1 2 3; do mknod "$root/dev/gpu$g" c 1 "${minor[$g]}"; done
  echo "NodeName=n[1-4] Name=gpu File=$root/dev/gpu[0-3]" > "$root/gres.conf"
  slurmctld -D -i -f "$SLURM_CONF" > "$root/slurmctld.out" 2>&1 &
  pids+=($!)
  for n in 1 2 3 4; do
    mkdir -p "$root/spool-n$n"
    slurmd -D -N "n$n" -f "$SLURM_CONF" > "$root/slurmd-n$n.out" 2>&1 &
    pids+=($!)
  done
  idle_nodes() { [ "$(sinfo -h -N -t idle -o %N 2>/dev/null | sort -u | wc -l)" = 4 ]; }
  wait_for "four idle Slurm nodes" idle_nodes
  version="Slurm $(slurmctld -V | awk '{print $2}')"
  if [ "$1" = 1 ]; then version="$version, tuned"; fi
}
slurm_gang() { sbatch --parsable -N2 --ntasks-per-node=1 --gres=gpu:4 -o /dev/null --wrap "srun sh -c '$1'"; }
slurm_running() { [ "$(squeue -h -j "$1" -o %T 2>/dev/null)" = RUNNING ]; }
slurm_cancel() { scancel "$1"; }
slurm_gone() { [ -z "$(squeue -h -j "$1" 2>/dev/null)" ]; }
slurm_one() { sbatch --quiet -n1 --gres=gpu:1 -o /dev/null --wrap true; }
slurm_drained() { [ -z "$(squeue -h -o %i)" ]; }

# --- the measurement, the same for both ---------------------------------
measure() { # backend prefix: shoal or slurm
  local b=$1 t0 job last c count
  local marks=$root/marks
  mkdir -p "$marks" && chmod 1777 "$marks"
  echo "== $version: 4 nodes x 4 GPUs =="
  if [ "$gangs" -gt 0 ]; then
    : > "$root/acked"; : > "$root/placed"; : > "$root/started"
    # Each system names the job and the rank in its own variables.
    local script
    if [ "$b" = shoal ]; then
      script="date +%s%N > $marks/start-\$SHOAL_JOB_ID-\$RANK; exec sleep 600"
    else
      script="date +%s%N > $marks/start-\$SLURM_JOB_ID-\$SLURM_PROCID; exec sleep 600"
    fi
    for _ in $(seq "$gangs"); do
      t0=$(now_ns)
      job=$("${b}_gang" "$script")
      ms_since "$t0" >> "$root/acked"
      wait_for "job $job running" "${b}_running" "$job"
      ms_since "$t0" >> "$root/placed"
      both() { [ -s "$marks/start-$job-0" ] && [ -s "$marks/start-$job-1" ]; }
      wait_for "both ranks of job $job" both
      last=$(cat "$marks/start-$job-0" "$marks/start-$job-1" | sort -n | tail -1)
      ms_between "$t0" "$last" >> "$root/started"
      "${b}_cancel" "$job"
      wait_for "job $job gone" "${b}_gone" "$job"
    done
    printf "%-18s %8s %8s %8s  (%d gangs of 2 x 4 GPUs, ms from the submit)\n" phase p50 p90 max "$gangs"
    printf "%-18s %s\n" acknowledged "$(stats < "$root/acked")"
    printf "%-18s %s\n" placed "$(stats < "$root/placed")"
    printf "%-18s %s\n" "ranks started" "$(stats < "$root/started")"
  fi
  if [ "$jobs" -gt 0 ]; then
    local submitters=() s
    t0=$(now_ns)
    for c in $(seq 0 15); do
      count=$(( jobs / 16 + (c < jobs % 16 ? 1 : 0) ))
      ( for _ in $(seq "$count"); do "${b}_one" || exit 1; done ) &
      submitters+=($!)
    done
    for s in "${submitters[@]}"; do wait "$s" || { echo "error: a submit failed" >&2; exit 1; }; done
    local deadline=$(( $(date +%s) + 600 ))
    until "${b}_drained"; do
      [ "$(date +%s)" -lt "$deadline" ] || { echo "error: jobs left after 600 s" >&2; exit 1; }
      sleep 0.02
    done
    awk -v n="$jobs" -v ns="$(( $(now_ns) - t0 ))" 'BEGIN {
      printf "%d one-GPU jobs (`true`) from 16 clients: all completed in %.2f s, %.1f jobs/s\n", n, ns/1e9, n/(ns/1e9) }'
  fi
}

for system in "${systems[@]}"; do
  root=$(mktemp -d /tmp/submit-bench-XXXX)
  chmod 755 "$root"
  case $system in
    shoal) start_shoal; measure shoal ;;
    slurm) start_slurm 0; measure slurm ;;
    slurm-tuned) start_slurm 1; measure slurm ;;
  esac
  stop_all
  [ -n "${KEEP:-}" ] || rm -rf "$root"
done
