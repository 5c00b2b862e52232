#!/usr/bin/env python3
"""PyTorch DDP training on CPU (gloo) with Shoal's checkpoints.

One process per task: submit it with several tasks per node, and every task
gets torchrun's environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) from Shoal, so no launcher is needed:

    shoal submit -N 2 --ntasks-per-node 2 --ckpt-interval 5m \\
        --env PYTHONPATH=$PWD/sdk/python/src -- python3 examples/ddp_train.py --steps 40

The model, the data of every step and the reduction are deterministic, so a
run that is killed and resumed from its latest checkpoint ends with the same
parameters, bit for bit, as one that never stopped; rank 0 prints their
digest at the end ("final-digest HEX").

Checkpoints follow Shoal's protocol (INTERFACE.md, "Checkpoints"): the tasks
of a node share its $SHOAL_CKPT_DIR, so after a barrier the task with
LOCAL_RANK 0 of each node writes the node's part of step N and its .done
(global rank 0 saves the state, the others only the marker).
"""

import argparse
import hashlib
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import shoal
from shoal import checkpoint


def batch(step: int, rank: int) -> "tuple[torch.Tensor, torch.Tensor]":
    """The same inputs for (step, rank) in every run."""
    g = torch.Generator().manual_seed(step * 1000 + rank)
    x = torch.randn(16, 8, generator=g)
    y = x.sum(dim=1, keepdim=True) * 0.5 + 1.0
    return x, y


def digest(model: torch.nn.Module) -> str:
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--ckpt-every", type=int, default=10)
    ap.add_argument("--step-seconds", type=float, default=0.0)
    args = ap.parse_args()

    env = shoal.env()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method="tcp://%s:%d" % (env.master_addr, env.master_port),
        rank=env.rank,
        world_size=env.world_size,
    )
    model = torch.nn.Linear(8, 1)
    step = 0
    resumed = checkpoint.latest()
    if resumed is not None:
        # After a restore every node finds rank 0's part in its directory.
        state = checkpoint.load(resumed)
        model.load_state_dict(state["model"])
        step = state["step"]
        print("resumed from step %d" % step, flush=True)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    checkpoint.on_signal()
    while step < args.steps:
        x, y = batch(step, env.rank)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        opt.step()
        step += 1
        if args.step_seconds:
            time.sleep(args.step_seconds)
        # Signals reach the tasks at slightly different steps: they agree
        # on what to do, so that all of them enter the same barriers.
        asked = torch.tensor([int(checkpoint.requested()), int(checkpoint.stopping())])
        dist.all_reduce(asked, op=dist.ReduceOp.MAX)
        if step % args.ckpt_every == 0 or asked[0] or asked[1]:
            # Every task has finished the step before a node's part is marked.
            dist.barrier()
            if env.local_rank == 0:
                state = {"model": model.state_dict(), "step": step}
                checkpoint.save(state, step, rank_saves=env.rank == 0)
            dist.barrier()
            if env.rank == 0:
                print("checkpoint %d loss %.6f" % (step, loss.item()), flush=True)
        if asked[1]:
            break
    if env.rank == 0 and step >= args.steps:
        print("final-digest %s" % digest(model), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
