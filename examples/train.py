#!/usr/bin/env python3
"""A training-like job for Shoal, standard library only.

Each rank advances a deterministic state (a running BLAKE2 hash chain seeded by
its rank), checkpoints it every --ckpt-every steps into
$SHOAL_CKPT_DIR/<step>/rank-<RANK>.state (then marks the step complete with
.done), checkpoints on SIGUSR1 (Shoal's periodic request) and on SIGTERM
(preemption, drain, time limit), and resumes from $SHOAL_RESTORE_STEP. At the
end every rank prints a checksum of its final state, which is the same whether
or not the job was interrupted and resumed.

    shoal submit -N 2 --gpus-per-node 1 -- python3 examples/train.py --steps 200

Every rank also appends "start <rank> <epoch> <pid>" and "stop ..." lines to
$SHOAL_CKPT_DIR/../ranks.log on its node, so tests can check that two copies
of a rank never ran at the same time.
"""

import argparse
import hashlib
import os
import signal
import sys
import time

RANK = int(os.environ.get("RANK", "0"))
WORLD = int(os.environ.get("WORLD_SIZE", "1"))
CKPT_DIR = os.environ.get("SHOAL_CKPT_DIR", "./ckpt")
EPOCH = os.environ.get("SHOAL_EPOCH", "0")

requested = {"checkpoint": False, "stop": False}


def on_usr1(_sig, _frame):
    requested["checkpoint"] = True


def on_term(_sig, _frame):
    requested["stop"] = True


def advance(state: bytes, step: int) -> bytes:
    return hashlib.blake2b(state + step.to_bytes(8, "little"), digest_size=32).digest()


def initial_state(rank: int) -> bytes:
    return hashlib.blake2b(b"shoal-example-rank-%d" % rank, digest_size=32).digest()


def save(step: int, state: bytes) -> None:
    step_dir = os.path.join(CKPT_DIR, str(step))
    os.makedirs(step_dir, exist_ok=True)
    path = os.path.join(step_dir, "rank-%d.state" % RANK)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(state)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    # Each rank marks its own part; Shoal commits the step when every rank has.
    with open(os.path.join(step_dir, ".done"), "w") as f:
        f.write("rank %d\n" % RANK)


def load(step: int, rank: int) -> bytes:
    with open(os.path.join(CKPT_DIR, str(step), "rank-%d.state" % rank), "rb") as f:
        return f.read()


def log_rank(event: str) -> None:
    path = os.path.join(CKPT_DIR, "..", "ranks.log")
    with open(path, "a") as f:
        f.write("%s %d %s %d %.3f\n" % (event, RANK, EPOCH, os.getpid(), time.time()))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--step-seconds", type=float, default=0.05)
    parser.add_argument("--ckpt-every", type=int, default=20)
    parser.add_argument(
        "--log-steps", action="store_true", help="append every step to ranks.log (for fencing tests)"
    )
    args = parser.parse_args()

    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGTERM, on_term)
    os.makedirs(CKPT_DIR, exist_ok=True)
    log_rank("start")

    step, state = 0, initial_state(RANK)
    restore = os.environ.get("SHOAL_RESTORE_STEP")
    if restore:
        step = int(restore)
        state = load(step, RANK)
        print("rank %d resumed from step %d" % (RANK, step), flush=True)

    while step < args.steps:
        step += 1
        state = advance(state, step)
        time.sleep(args.step_seconds)
        if args.log_steps:
            log_rank("step")
        if step % args.ckpt_every == 0 or requested["checkpoint"]:
            save(step, state)
            requested["checkpoint"] = False
            print("rank %d checkpointed step %d" % (RANK, step), flush=True)
        if requested["stop"]:
            save(step, state)
            print("rank %d stopping at step %d after SIGTERM" % (RANK, step), flush=True)
            log_rank("stop")
            return 0

    if step % args.ckpt_every != 0:
        save(step, state)  # a step directory is never rewritten after its .done
    log_rank("stop")
    # The same for an interrupted-and-resumed run as for an uninterrupted one.
    print("rank %d checksum %s" % (RANK, hashlib.blake2b(state, digest_size=16).hexdigest()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
