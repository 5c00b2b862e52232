"""The environment Shoal gives every gang member (INTERFACE.md,
"Environment of every gang member")."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from types import MappingProxyType
from pathlib import Path
from typing import Mapping, Optional, Tuple

from ._errors import ShoalError

#: Variables :func:`env` reads into named fields.
KNOWN = (
    "SHOAL_JOB_ID",
    "SHOAL_EPOCH",
    "RANK",
    "NODE_RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "CUDA_VISIBLE_DEVICES",
    "SHOAL_CKPT_DIR",
    "SHOAL_RESTORE_STEP",
    "SHOAL_API",
    "SHOAL_NODE",
    "SHOAL_NODES",
    "SHOAL_CA_FILE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
)

#: Prefixes and names of further variables kept in :attr:`Env.extra` when
#: present (torchrun's, Slurm's, Shoal's own newer ones).
_EXTRA_PREFIXES = ("SHOAL_", "SLURM_", "TORCHELASTIC_")
_EXTRA_NAMES = ("ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME", "LOCAL_ADDR", "OMP_NUM_THREADS")

#: torch.distributed's default rendezvous port, used when MASTER_PORT is unset.
DEFAULT_MASTER_PORT = 29500


@dataclass(frozen=True)
class Env:
    """A rank's view of its gang, from the environment Shoal set.

    ``rank`` is the node rank (Shoal runs one rank per node unless tasks
    are asked for); ``restore_step`` is the checkpoint step Shoal restored
    into ``ckpt_dir`` when this run resumes an earlier one, else None.
    """

    job_id: int
    epoch: int
    rank: int
    node_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    #: The GPUs this rank may use, as CUDA numbers them (indices, or
    #: UUIDs where a site sets those), in order; empty without GPUs.
    cuda_visible_devices: Tuple[str, ...]
    ckpt_dir: Path
    restore_step: Optional[int]
    #: The API of the node running the rank (``SHOAL_API``).
    api: Optional[str]
    #: The name of the node running the rank (``SHOAL_NODE``).
    node: Optional[str] = None
    #: The gang's node names in rank order, when given (``SHOAL_NODES``,
    #: as ``shoal alloc`` sets it).
    nodes: Tuple[str, ...] = ()
    #: The cluster CA file for https (``SHOAL_CA_FILE``).
    ca_file: Optional[Path] = None
    #: torchrun's node rank and node count, when set (``GROUP_RANK``,
    #: ``GROUP_WORLD_SIZE``).
    group_rank: Optional[int] = None
    group_world_size: Optional[int] = None
    #: Other variables of Shoal, Slurm and torchrun that were set
    #: (``SHOAL_*``, ``SLURM_*``, ``TORCHELASTIC_*``, ``ROLE_*``...), as is.
    extra: Mapping[str, str] = field(
        default_factory=lambda: MappingProxyType({}), hash=False, compare=False
    )

    @property
    def is_resumed(self) -> bool:
        """Whether Shoal restored a checkpoint for this run."""
        return self.restore_step is not None

    @property
    def is_main(self) -> bool:
        """Whether this is rank 0 (the one that logs, saves a DDP model...)."""
        return self.rank == 0


def _opt_int(environ: Mapping[str, str], key: str) -> Optional[int]:
    raw = environ.get(key, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ShoalError("%s=%r is not an integer" % (key, raw)) from None
    if value < 0:
        raise ShoalError("%s=%r must not be negative" % (key, raw))
    return value


def _int(environ: Mapping[str, str], key: str, default: int) -> int:
    value = _opt_int(environ, key)
    return default if value is None else value


def _list(raw: Optional[str]) -> Tuple[str, ...]:
    if not raw:
        return ()
    return tuple(p.strip() for p in raw.split(",") if p.strip())


def env(environ: Optional[Mapping[str, str]] = None) -> Env:
    """The rank's environment (``os.environ`` unless ``environ`` is given).

    Only ``SHOAL_JOB_ID`` is required: raises :class:`ShoalError` outside a
    Shoal job, or when a variable that should be a number is not. What a
    job started by ``shoal alloc`` lacks takes torchrun's defaults: rank 0,
    one rank of one, ``MASTER_PORT`` 29500, and ``./ckpt`` for the
    checkpoint directory.
    """
    environ = os.environ if environ is None else environ
    job_id = _opt_int(environ, "SHOAL_JOB_ID")
    if job_id is None:
        raise ShoalError("not in a Shoal job: SHOAL_JOB_ID is not set")
    group_rank = _opt_int(environ, "GROUP_RANK")
    node_rank_set = _opt_int(environ, "NODE_RANK")
    rank = _int(environ, "RANK", node_rank_set if node_rank_set is not None else 0)
    node_rank = node_rank_set if node_rank_set is not None else (
        group_rank if group_rank is not None else rank
    )
    nodes = _list(environ.get("SHOAL_NODES"))
    world_size = _int(environ, "WORLD_SIZE", len(nodes) or 1)
    if rank >= world_size:
        raise ShoalError("RANK=%d is not below WORLD_SIZE=%d" % (rank, world_size))
    ca_file = environ.get("SHOAL_CA_FILE") or None
    extra = {
        k: v
        for k, v in environ.items()
        if k not in KNOWN and (k.startswith(_EXTRA_PREFIXES) or k in _EXTRA_NAMES)
    }
    return Env(
        job_id=job_id,
        epoch=_int(environ, "SHOAL_EPOCH", 0),
        rank=rank,
        node_rank=node_rank,
        world_size=world_size,
        local_rank=_int(environ, "LOCAL_RANK", 0),
        local_world_size=_int(environ, "LOCAL_WORLD_SIZE", 1),
        master_addr=environ.get("MASTER_ADDR") or "127.0.0.1",
        master_port=_int(environ, "MASTER_PORT", DEFAULT_MASTER_PORT),
        cuda_visible_devices=_list(environ.get("CUDA_VISIBLE_DEVICES")),
        ckpt_dir=Path(environ.get("SHOAL_CKPT_DIR") or "ckpt"),
        restore_step=_opt_int(environ, "SHOAL_RESTORE_STEP"),
        api=environ.get("SHOAL_API") or None,
        node=environ.get("SHOAL_NODE") or None,
        nodes=nodes,
        ca_file=Path(ca_file) if ca_file else None,
        group_rank=group_rank,
        group_world_size=_opt_int(environ, "GROUP_WORLD_SIZE"),
        extra=MappingProxyType(dict(extra)),
    )
