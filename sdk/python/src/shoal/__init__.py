"""Shoal from Python: a client of a cluster's HTTP API, and the helpers a
training job uses inside Shoal (its environment, checkpoints, signals).

    import shoal

    client = shoal.Client()          # the CLI's credentials (shoal login)
    job = client.submit(["python3", "train.py"], nodes=2, gpus_per_node=8)
    for chunk in client.logs(job, follow=True, text=True):
        print(chunk, end="")

Inside a job::

    from shoal import checkpoint
    env = shoal.env()                # rank, world size, ckpt dir...
    checkpoint.on_signal()
    checkpoint.save(state, step, rank_saves=env.rank == 0)

Standard library only; torch is used when importable (checkpoints).
"""

from . import checkpoint
from ._env import Env, env
from ._errors import ShoalError
from .client import Client, may_carry_token

__all__ = ["Client", "Env", "ShoalError", "checkpoint", "env", "may_carry_token"]
__version__ = "0.1.0"
