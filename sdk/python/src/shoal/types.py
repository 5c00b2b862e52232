"""The JSON shapes of the HTTP API (``sdk/src/types.rs``), as ``TypedDict``s
for type checkers. At run time they are plain dicts, exactly as the server
sent them: fields a newer server adds are there too."""

from __future__ import annotations

from typing import Dict, List, Optional, TypedDict


class JobInfo(TypedDict, total=False):
    """``shoal show JOB --json``, and each element of ``shoal queue --json``."""

    id: int
    name: str
    tenant: str
    #: pending, running, checkpointing, requeued, preempted, or how it
    #: ended: completed, failed, cancelled, timeout, node_fail, out_of_memory.
    state: str
    #: Why a pending job waits, or how a finished one ended.
    reason: str
    #: Node names in rank order (the current or last allocation).
    nodes: List[str]
    #: GPU indices per node name.
    gpus: Dict[str, List[int]]
    epoch: Optional[int]
    restarts: int
    #: Restarts the job may have; ``requeue``: a rank's own failure uses them.
    max_restarts: int
    requeue: bool
    preemptions: int
    priority: int
    nodes_requested: int
    gpus_per_node: int
    time_limit_s: int
    preemptible: bool
    command: List[str]
    #: RFC 3339, UTC.
    submitted_at: str
    started_at: Optional[str]
    ended_at: Optional[str]
    exit_code: Optional[int]
    last_ckpt_step: Optional[int]
    mem_bytes: Optional[int]
    cpus_per_task: Optional[int]
    #: Processes on each node (``--ntasks-per-node``).
    tasks_per_node: int


class CheckpointPartInfo(TypedDict, total=False):
    """One rank's part of a checkpoint step."""

    rank: int
    bytes: int
    holders: List[int]
    manifest_hex: str


class CheckpointInfo(TypedDict, total=False):
    """One checkpoint step of a job (``GET /v1/jobs/{id}/checkpoints``)."""

    step: int
    bytes: int
    #: Nodes holding every part of the step.
    replicas: List[int]
    #: RFC 3339; None while some rank's part is missing.
    committed_at: Optional[str]
    epoch: int
    parts: List[CheckpointPartInfo]


class ObjectInfo(TypedDict, total=False):
    """One object of the ``mesh:/`` namespace (``shoal ls --json``)."""

    path: str
    is_dir: bool
    bytes: int
    files: int
    replicas: List[int]
    replica: int
    healthy: bool
    tenant: str
    mtime: str
    manifest_hex: str


class WriteResponse(TypedDict):
    """The answer to a write: the log index it was committed at."""

    index: int
