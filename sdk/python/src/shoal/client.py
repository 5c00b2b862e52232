"""A client of a Shoal cluster's HTTP API, standard library only.

It mirrors the Rust SDK (``sdk/src/client.rs``) and the CLI's choice of
credentials (``node/src/cli/login.rs``):

* the token goes over https anywhere, over plain http only to this
  machine's loopback (``localhost``, ``127.0.0.0/8``, ``::1``); anything
  else is refused before a connection is made;
* https is checked against the cluster CA only (from ``ca_file``,
  ``$SHOAL_CA_FILE``, the ``shoal login`` settings or the node's data dir),
  never against the system's CAs. Like the CLI, a node is identified by the
  CA's signature and the name every node certificate carries (``shoal``),
  not by the host or address it was reached at;
* redirects are never followed (the API sends none, and one could carry
  the token elsewhere), and no proxy from the environment is used.

Copying into and out of ``mesh:/`` (:meth:`Client.cp`) and restoring a
checkpoint (:meth:`Client.ckpt_restore`) run the ``shoal`` binary: both move
content-addressed chunks (BLAKE3 ids, zstd frames, a binary manifest)
that the standard library cannot produce or check.
"""

from __future__ import annotations

import codecs
import http.client
import ipaddress
import json
import os
import shutil
import ssl
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any, Dict, Iterator, List, Mapping, Optional, Sequence, Tuple, Union

from . import _config
from ._errors import ShoalError
from ._units import parse_duration, parse_gres, parse_mem
from .types import CheckpointInfo, JobInfo, ObjectInfo, WriteResponse

#: Response header of ``GET /v1/jobs/{id}/logs``: the offset of the first
#: byte returned (0 after a rotation, whatever was asked).
LOG_START_HEADER = "x-shoal-log-start"
#: Response header of ``GET /v1/jobs/{id}/logs``: how often the log was
#: rotated so far.
LOG_ROTATIONS_HEADER = "x-shoal-log-rotations"
#: The DNS name in every node certificate; nodes are checked against it,
#: not against the address they were reached at.
CLUSTER_SERVER_NAME = "shoal"
#: Job states after which nothing more happens.
FINISHED_STATES = (
    "completed",
    "failed",
    "cancelled",
    "timeout",
    "node_fail",
    "out_of_memory",
)

_ROTATED = b"--- shoal: the log was rotated; from the start of the new file ---\n"

PathLike = Union[str, "os.PathLike[str]"]


def may_carry_token(url: str) -> bool:
    """Whether a token may go to ``url``: over https anywhere, over plain
    http only to this machine's loopback."""
    try:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
    except ValueError:
        return False
    if parts.scheme == "https":
        return bool(host)
    if parts.scheme != "http" or not host:
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _ClusterHTTPSConnection(http.client.HTTPSConnection):
    """HTTPS that checks the node's certificate against the cluster CA and
    the cluster's server name, whatever host the URL names."""

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self._context.wrap_socket(  # type: ignore[attr-defined]
            self.sock, server_hostname=CLUSTER_SERVER_NAME
        )


class _ClusterHTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: Optional[ssl.SSLContext], refusal: Optional[str]) -> None:
        super().__init__(context=context)
        self._shoal_context = context
        self._refusal = refusal

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        if self._shoal_context is None:
            raise urllib.error.URLError(self._refusal or "no cluster CA is trusted")
        return self.do_open(_ClusterHTTPSConnection, req, context=self._shoal_context)


def _tls_context(ca_pem: str, source: Optional[str]) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = True
    ctx.verify_mode = ssl.CERT_REQUIRED
    try:
        ctx.load_verify_locations(cadata=ca_pem)
    except (ssl.SSLError, ValueError) as e:
        raise ShoalError("the trusted cluster CA (%s) is not a PEM certificate: %s" % (source, e)) from e
    try:
        ctx.set_alpn_protocols(["http/1.1"])
    except NotImplementedError:  # pragma: no cover - OpenSSL without ALPN
        pass
    return ctx


def _opener(context: Optional[ssl.SSLContext], refusal: Optional[str]) -> urllib.request.OpenerDirector:
    # Built by hand rather than with build_opener: no ProxyHandler (no
    # proxy from the environment sees the token) and no redirect handler
    # (a 3xx is an error, never followed).
    opener = urllib.request.OpenerDirector()
    for handler in (
        urllib.request.HTTPHandler(),
        _ClusterHTTPSHandler(context, refusal),
        urllib.request.HTTPDefaultErrorHandler(),
        urllib.request.HTTPErrorProcessor(),
        urllib.request.UnknownHandler(),
    ):
        opener.add_handler(handler)
    return opener


def _reason(e: BaseException) -> str:
    """An error and its causes on one line."""
    out = str(getattr(e, "reason", None) or e) or type(e).__name__
    cause = e.__cause__ or e.__context__
    while cause is not None:
        text = str(cause)
        if text and text not in out:
            out += ": " + text
        cause = cause.__cause__ or cause.__context__
    return out


def _job_path(job_id: Union[int, str]) -> str:
    text = str(job_id)
    if not text.isdigit():
        raise ShoalError("a job id is a number, not %r" % (job_id,))
    return text


def _mesh_path(path: str) -> str:
    """``/a/b`` from ``mesh:/a/b``, ``mesh:a/b`` or ``/a/b``; refuses ``.``/``..``."""
    p = path[len("mesh:") :] if path.startswith("mesh:") else path
    parts = [c for c in p.split("/") if c]
    if any(c in (".", "..") for c in parts):
        raise ShoalError("mesh path '%s' may not contain '.' or '..'" % p)
    if not parts:
        raise ShoalError("a mesh path needs at least one component (mesh:/name)")
    return "/" + "/".join(parts)


class Client:
    """Talks to one node's HTTP API with a bearer token.

    Arguments left out are found the way the ``shoal`` CLI finds them:

    * ``url``: ``$SHOAL_API``, else the URL ``shoal login`` recorded (in
      ``$SHOAL_CLI_CONFIG`` or ``~/.config/shoal/cli.toml``), else the local
      agent's (``agent.json`` in the data dir), else ``http://127.0.0.1:7070``;
    * ``token``: ``$SHOAL_TOKEN``, else the recorded token when ``url`` is
      the recorded URL, else the data dir's ``admin.token``;
    * ``ca_file`` (a PEM file of the cluster CA, for https):
      ``$SHOAL_CA_FILE``, else the CA ``shoal login`` recorded, else the
      node identity's in the data dir.

    ``data_dir`` is the node data dir those fallbacks read
    (``$SHOAL_DATA_DIR``, else the CLI's default). ``binary`` is the
    ``shoal`` executable that :meth:`cp` and :meth:`ckpt_restore` run
    (default: ``shoal`` on ``PATH``). Every call raises :class:`ShoalError`
    on failure, with the server's message and the HTTP status.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        ca_file: Optional[PathLike] = None,
        *,
        timeout: float = 30.0,
        binary: Optional[PathLike] = None,
        data_dir: Optional[PathLike] = None,
    ) -> None:
        creds = _config.resolve(
            url=url,
            token=token,
            ca_file=os.fspath(ca_file) if ca_file is not None else None,
            data_dir=os.fspath(data_dir) if data_dir is not None else None,
        )
        self._init(creds, timeout, binary)

    def _init(self, creds: _config.Credentials, timeout: float, binary: Optional[PathLike]) -> None:
        scheme = urllib.parse.urlsplit(creds.url).scheme
        if scheme not in ("http", "https"):
            raise ShoalError(
                "%s is not an API URL: give e.g. https://10.0.0.5:7070 "
                "(or http:// on loopback)" % creds.url
            )
        self._creds = creds
        self.base_url = creds.url.rstrip("/")
        self.token = creds.token
        self.timeout = timeout
        self.binary = os.fspath(binary) if binary is not None else None
        if creds.ca_pem:
            self._context: Optional[ssl.SSLContext] = _tls_context(creds.ca_pem, creds.ca_source)
            refusal = None
        else:
            self._context = None
            refusal = (
                "no cluster CA is trusted yet (`shoal login URL` records one; "
                "SHOAL_CA_FILE names one)"
            )
        self._opener = _opener(self._context, refusal)

    def __repr__(self) -> str:
        return "Client(%r)" % self.base_url

    @property
    def ca_pem(self) -> Optional[str]:
        """The cluster CA (PEM) https nodes must chain to, when known."""
        return self._creds.ca_pem

    def at(self, url: str) -> "Client":
        """The same credentials and TLS trust, talking to another node. The
        token goes along over https, or to plain-http loopback only when
        this client talks plain-http loopback itself (a one-machine
        cluster): a loopback URL a remote member published is the
        *caller's* loopback, where anyone on this machine may listen."""
        local_cluster = self.base_url.startswith("http://") and may_carry_token(self.base_url)
        token = self.token if (url.startswith("https://") or local_cluster) else None
        other = Client.__new__(Client)
        other._init(
            _config.Credentials(url, token, self._creds.ca_pem, self._creds.ca_source, self._creds.ca_file),
            self.timeout,
            self.binary,
        )
        return other

    # --- transport -----------------------------------------------------

    def _send(
        self,
        method: str,
        path: str,
        *,
        query: Optional[Sequence[Tuple[str, Any]]] = None,
        body: Any = None,
    ) -> Tuple[int, Mapping[str, str], bytes]:
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode([(k, str(v)) for k, v in query])
        headers = {"Accept": "application/json"}
        if self.token is not None:
            if not may_carry_token(url):
                raise ShoalError(
                    "refusing to send a token in clear text to %s: a node off this "
                    "machine is reached over https" % url,
                    url=url,
                )
            headers["Authorization"] = "Bearer " + self.token
        data = None
        if body is not None:
            data = json.dumps(body).encode("utf-8")
            headers["Content-Type"] = "application/json"
        try:
            req = urllib.request.Request(url, data=data, headers=headers, method=method)
            with self._opener.open(req, timeout=self.timeout) as resp:
                return resp.status, _headers(resp), resp.read()
        except urllib.error.HTTPError as e:
            try:
                raw = e.read()
            except (OSError, http.client.HTTPException):
                raw = b""
            raise _api_error(url, e.code, raw) from None
        except urllib.error.URLError as e:
            raise ShoalError("cannot reach the Shoal API at %s: %s" % (url, _reason(e)), url=url) from None
        except (OSError, http.client.HTTPException) as e:
            raise ShoalError("cannot reach the Shoal API at %s: %s" % (url, _reason(e)), url=url) from None
        except ValueError as e:  # a token or URL http.client refuses to send
            raise ShoalError("cannot send a request to %s: %s" % (url, e), url=url) from None

    def _json(self, method: str, path: str, **kw: Any) -> Any:
        _, _, raw = self._send(method, path, **kw)
        try:
            return json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ShoalError("unexpected answer from %s%s: %s" % (self.base_url, path, e)) from None

    def api_get(self, path: str, query: Optional[Sequence[Tuple[str, Any]]] = None) -> Any:
        """``GET path`` of the API (e.g. ``/v1/status``): the decoded JSON
        answer. For the routes this class has no method for."""
        return self._json("GET", path, query=query)

    def api_post(self, path: str, body: Any = None) -> Any:
        """``POST path`` with a JSON body (``{}`` when None): the decoded answer."""
        return self._json("POST", path, body={} if body is None else body)

    # --- cluster ---------------------------------------------------------

    def health(self) -> str:
        """``GET /health`` (needs no token)."""
        _, _, raw = self._send("GET", "/health")
        return raw.decode("utf-8", "replace")

    def status(self) -> Dict[str, Any]:
        """``shoal status --json``."""
        return self.api_get("/v1/status")  # type: ignore[no-any-return]

    def nodes(self) -> List[Dict[str, Any]]:
        """``shoal nodes --json``."""
        return self.api_get("/v1/nodes")  # type: ignore[no-any-return]

    # --- jobs ------------------------------------------------------------

    def submit(
        self,
        command: Union[str, Sequence[str]],
        *,
        nodes: int = 1,
        gpus_per_node: Optional[int] = None,
        gres: Optional[str] = None,
        time: Union[str, int] = "1h",
        tenant: Optional[str] = None,
        name: Optional[str] = None,
        priority: int = 0,
        preemptible: bool = True,
        ckpt_interval: Union[str, int, None] = None,
        max_restarts: Optional[int] = None,
        requeue: bool = False,
        same: Optional[str] = None,
        max_rtt_ms: Optional[int] = None,
        constraints: Optional[Mapping[str, str]] = None,
        env: Optional[Mapping[str, str]] = None,
        workdir: Optional[PathLike] = None,
        mem: Union[str, int, None] = None,
        cpus_per_task: Optional[int] = None,
        tasks_per_node: Optional[int] = None,
    ) -> int:
        """Submits a job, as ``shoal submit [flags] -- CMD...`` does; returns
        its id.

        ``command`` is the argv (a string is run as ``/bin/sh -c STRING``).
        The keywords are the CLI's flags with the CLI's defaults: one node,
        one GPU per node (``gpus_per_node``, or ``gres`` as
        ``gpu[:TYPE]:COUNT``), a time limit of 1 h (``time``: seconds, or a
        Slurm duration such as ``"30:00"`` or ``"2h"``), up to three restarts
        after node loss and none after a rank's own failure (``max_restarts=N``
        allows N restarts, also after a rank's failure when N > 0;
        ``requeue=True`` restarts after a rank's failure too), preemptible, the current directory as the ranks' working directory.
        ``ckpt_interval`` makes Shoal send SIGUSR1 that often. ``mem`` is
        bytes (an int) or a Slurm size (``"16G"``; a bare number is MiB).
        ``constraints`` are labels every node must carry, ``env`` extra
        environment for the ranks. ``tasks_per_node`` starts that many
        processes per node, each with its own ``RANK``/``LOCAL_RANK`` and an
        equal share of the node's GPUs (one GPU per task unless
        ``gpus_per_node``/``gres`` say otherwise).
        """
        if isinstance(command, str):
            argv = ["/bin/sh", "-c", command]
        else:
            argv = [os.fspath(a) for a in command]
        if not argv:
            raise ShoalError("a command is required")
        if gres is not None and gpus_per_node is not None:
            raise ShoalError("give gpus_per_node or gres, not both")
        model: Optional[str] = None
        if gres is not None:
            model, gpus = parse_gres(gres)
        else:
            gpus = (tasks_per_node or 1) if gpus_per_node is None else gpus_per_node
        if tasks_per_node is not None and tasks_per_node <= 0:
            raise ShoalError("--ntasks-per-node must be positive")
        if cpus_per_task is not None and cpus_per_task <= 0:
            raise ShoalError("--cpus-per-task must be positive")
        if workdir is None:
            try:
                workdir = os.getcwd()
            except OSError:
                workdir = None
        body: Dict[str, Any] = {
            "name": name or "",
            "tenant": tenant,
            "nodes": nodes,
            "gpus_per_node": gpus,
            "gpu_model": model,
            "time_limit_s": parse_duration(time),
            "priority": priority,
            "preemptible": preemptible,
            "command": argv,
            "env": dict(env or {}),
            "workdir": os.fspath(workdir) if workdir is not None else None,
            "ckpt_interval_s": (
                max(1, parse_duration(ckpt_interval)) if ckpt_interval is not None else None
            ),
            "max_restarts": max_restarts,
            "requeue": requeue,
            "same": same,
            "max_rtt_ms": max_rtt_ms,
            "labels": dict(constraints or {}),
            "mem_bytes": parse_mem(mem) if mem is not None else None,
            "cpus_per_task": cpus_per_task,
            "tasks_per_node": tasks_per_node,
        }
        return int(self.api_post("/v1/jobs", body)["id"])

    def queue(
        self,
        state: Optional[str] = None,
        tenant: Optional[str] = None,
        *,
        include_finished: bool = False,
    ) -> List[JobInfo]:
        """``shoal queue --json``: jobs, filtered by state and tenant when
        given. Like the CLI, finished jobs (``FINISHED_STATES``)
        are left out unless a ``state`` is asked for or ``include_finished``
        (the CLI's ``--all``)."""
        query = []
        if tenant is not None:
            query.append(("tenant", tenant))
        if state is not None:
            query.append(("state", state))
        jobs: List[JobInfo] = self.api_get("/v1/jobs", query)
        if state is None and not include_finished:
            jobs = [j for j in jobs if j.get("state") not in FINISHED_STATES]
        return jobs

    def show(self, job_id: Union[int, str]) -> JobInfo:
        """``shoal show JOB --json``."""
        return self.api_get("/v1/jobs/" + _job_path(job_id))  # type: ignore[no-any-return]

    def cancel(self, job_id: Union[int, str]) -> WriteResponse:
        """``shoal cancel JOB``."""
        return self.api_post("/v1/jobs/%s/cancel" % _job_path(job_id))  # type: ignore[no-any-return]

    def wait(
        self,
        job_id: Union[int, str],
        states: Sequence[str] = FINISHED_STATES,
        timeout: Optional[float] = None,
        poll_interval: float = 0.5,
    ) -> JobInfo:
        """Polls the job until its state is one of ``states`` (by default:
        it has finished); raises :class:`ShoalError` after ``timeout``
        seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.show(job_id)
            if job.get("state") in states:
                return job
            if deadline is not None and time.monotonic() >= deadline:
                raise ShoalError(
                    "job %s is still %s after %.0f s" % (job_id, job.get("state"), timeout or 0)
                )
            time.sleep(poll_interval)

    def log_chunk(
        self, job_id: Union[int, str], rank: int = 0, offset: int = 0
    ) -> Tuple[bytes, int, int]:
        """Up to 4 MiB of a rank's log *on the node this client talks to*
        from ``offset``: ``(bytes, start, rotations)``, where ``start`` is
        the offset they begin at (0 instead of ``offset`` when the file is
        shorter: it was rotated) and ``rotations`` how often the log was
        rotated so far. :meth:`logs` finds the node that ran the rank."""
        _, headers, raw = self._send(
            "GET",
            "/v1/jobs/%s/logs" % _job_path(job_id),
            query=[("rank", int(rank)), ("offset", int(offset))],
        )

        def header(name: str, default: int) -> int:
            try:
                return int(headers.get(name, ""))
            except ValueError:
                return default

        return raw, header(LOG_START_HEADER, offset), header(LOG_ROTATIONS_HEADER, 0)

    def logs(
        self,
        job_id: Union[int, str],
        rank: int = 0,
        follow: bool = False,
        *,
        text: bool = False,
        poll_interval: float = 0.5,
    ) -> Iterator[Union[bytes, str]]:
        """A rank's log, as ``shoal logs JOB [--rank R] [-f]`` prints it: a
        generator of chunks (bytes, or str with ``text=True``, decoded as
        UTF-8 with replacement) read from the node that ran the rank.

        Without ``follow`` it yields what the log holds now and ends; with
        it, it goes on polling every ``poll_interval`` seconds until the job
        has finished and its last output is read. When the node rotated
        the log between two reads, a line saying so comes first and the
        new file is read from its start, as the CLI does. While following,
        a rank placed but not started yet (its node has no log of it)
        reads as nothing yet.
        """
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace") if text else None

        def out(chunks: Iterator[bytes]) -> Iterator[Union[bytes, str]]:
            for chunk in chunks:
                piece = decoder.decode(chunk) if decoder is not None else chunk
                if piece:
                    yield piece

        cursor = _LogCursor()
        source: Optional[Client] = None
        started = time.monotonic()
        while True:
            job = self.show(job_id)
            state = job.get("state", "")
            if source is None:
                names = job.get("nodes") or []
                if rank < len(names):
                    for info in self.nodes():
                        if info.get("name") == names[rank]:
                            source = self.at(info.get("api_url") or self.base_url)
                            break
                elif not follow:
                    raise ShoalError("job %s has not run a rank %d yet (%s)" % (job_id, rank, state))
            if source is not None:
                try:
                    yield from out(cursor.read(source, job_id, rank))
                except ShoalError as e:
                    # Placed, but the rank's log is not there yet: when
                    # following, that is "nothing yet".
                    if not (follow and e.status == 404 and state not in FINISHED_STATES):
                        raise
            ended = state in FINISHED_STATES
            if not follow or (ended and time.monotonic() - started > 0.5):
                if ended and follow and source is not None:
                    # One last read for what was written before the exit.
                    yield from out(cursor.read(source, job_id, rank))
                if decoder is not None:
                    tail = decoder.decode(b"", final=True)
                    if tail:
                        yield tail
                return
            time.sleep(poll_interval)

    # --- checkpoints -----------------------------------------------------

    def checkpoints(self, job_id: Union[int, str]) -> List[CheckpointInfo]:
        """The job's checkpoint steps as the API lists them (with each
        rank's part)."""
        return self.api_get("/v1/jobs/%s/checkpoints" % _job_path(job_id))  # type: ignore[no-any-return]

    def ckpt_ls(self, job_id: Union[int, str]) -> List[Dict[str, Any]]:
        """``shoal ckpt ls JOB --json``: ``[{"step", "bytes", "replicas",
        "committed_at"}]`` (``committed_at`` is None while a rank's part is
        missing)."""
        return [
            {
                "step": c.get("step"),
                "bytes": c.get("bytes"),
                "replicas": c.get("replicas"),
                "committed_at": c.get("committed_at"),
            }
            for c in self.checkpoints(job_id)
        ]

    def ckpt_restore(
        self, job_id: Union[int, str], dest: PathLike, step: Optional[int] = None
    ) -> Dict[str, Any]:
        """``shoal ckpt restore JOB [--step N] --to DEST``: copies a
        committed checkpoint (every rank's part; the latest committed step
        by default) into the new directory ``dest``; returns ``{"step",
        "bytes", "to"}``.

        This runs the ``shoal`` binary (``binary=``, else ``shoal`` on
        PATH) with this client's URL, token and CA: a restore fetches
        content-addressed chunks (BLAKE3 ids, zstd frames, a binary
        manifest) and checks each against its hash, which the standard
        library cannot do.
        """
        args = ["ckpt", "restore", _job_path(job_id)]
        if step is not None:
            args += ["--step", str(int(step))]
        args += ["--to", os.fspath(dest)]
        return self._run_cli(args)  # type: ignore[no-any-return]

    # --- mesh:/ objects --------------------------------------------------

    def ls(self, path: str = "mesh:/") -> List[ObjectInfo]:
        """``shoal ls mesh:/path --json``: objects at or below ``path``."""
        p = path[len("mesh:") :] if path.startswith("mesh:") else path
        p = "" if not p.strip("/") else _mesh_path(p)
        return self.api_get("/v1/objects", [("path", p)])  # type: ignore[no-any-return]

    def stat(self, path: str) -> ObjectInfo:
        """The object at ``mesh:/path`` (``shoal stat``)."""
        p = _mesh_path(path)
        for obj in self.api_get("/v1/objects", [("path", p)]):
            if obj.get("path") == p:
                return obj  # type: ignore[no-any-return]
        raise ShoalError("mesh:%s does not exist" % p, status=404, code="not_found")

    def rm(self, path: str) -> WriteResponse:
        """``shoal rm mesh:/path``."""
        return self.api_post("/v1/objects/rm", {"path": _mesh_path(path)})  # type: ignore[no-any-return]

    def cp(
        self,
        *paths: PathLike,
        replica: int = 3,
        recursive: bool = False,
        force: bool = False,
        allow_degraded: bool = False,
    ) -> Dict[str, Any]:
        """``shoal cp [--replica N] [-r] SRC... DST``: local paths and
        ``mesh:/path``; returns the CLI's JSON summary (``bytes``, ``files``,
        ``chunks``, ``chunks_sent``, ``bytes_sent``, ``deduplicated``,
        ``seconds``).

        This runs the ``shoal`` binary (``binary=``, else ``shoal`` on
        PATH) with this client's URL, token and CA: an upload is chunked,
        hashed with BLAKE3 and compressed with zstd on the client, and the
        chunks are sent to several nodes before the object is recorded;
        none of that is in the standard library.
        """
        if len(paths) < 2:
            raise ShoalError("cp needs a source and a destination")
        args = ["cp", "--replica", str(int(replica))]
        if recursive:
            args.append("-r")
        if force:
            args.append("--force")
        if allow_degraded:
            args.append("--allow-degraded")
        args.append("--")
        args += [os.fspath(p) for p in paths]
        return self._run_cli(args)  # type: ignore[no-any-return]

    def put(self, local: PathLike, mesh_path: str, **kw: Any) -> Dict[str, Any]:
        """Copies a local file (or, with ``recursive=True``, a directory) to
        ``mesh:/path``; see :meth:`cp`."""
        return self.cp(local, "mesh:" + _mesh_path(mesh_path), **kw)

    def get(self, mesh_path: str, local: PathLike, **kw: Any) -> Dict[str, Any]:
        """Copies ``mesh:/path`` to a local path; see :meth:`cp`."""
        return self.cp("mesh:" + _mesh_path(mesh_path), local, **kw)

    # --- the shoal binary ------------------------------------------------

    def _find_binary(self) -> str:
        if self.binary:
            return self.binary
        found = shutil.which("shoal")
        if found is None:
            raise ShoalError(
                "this needs the shoal binary, and there is none on PATH "
                "(pass Client(binary=...))"
            )
        return found

    def _run_cli(self, args: List[str]) -> Any:
        """Runs ``shoal --json ARGS`` against this client's node: the URL,
        token and CA go in the environment (never on the command line,
        where other users could read the token)."""
        binary = self._find_binary()
        env = dict(os.environ)
        env["SHOAL_API"] = self.base_url
        if self.token is not None:
            env["SHOAL_TOKEN"] = self.token
        else:
            env.pop("SHOAL_TOKEN", None)
        with tempfile.TemporaryDirectory(prefix="shoal-py-") as scratch:
            if self._creds.ca_file is not None:
                env["SHOAL_CA_FILE"] = os.fspath(self._creds.ca_file)
            elif self._creds.ca_pem:
                ca = Path(scratch) / "ca.pem"
                ca.write_text(self._creds.ca_pem, encoding="ascii")
                env["SHOAL_CA_FILE"] = str(ca)
            else:
                env.pop("SHOAL_CA_FILE", None)
            try:
                done = subprocess.run(
                    [binary, "--json"] + args,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    check=False,
                )
            except OSError as e:
                raise ShoalError("cannot run %s: %s" % (binary, e)) from None
        stderr = done.stderr.decode("utf-8", "replace").strip()
        if done.returncode != 0:
            lines = [l for l in stderr.splitlines() if l.startswith("error:")]
            message = lines[-1][len("error:") :].strip() if lines else stderr
            raise ShoalError(
                message or "shoal %s exited with status %d" % (args[0], done.returncode)
            )
        try:
            return json.loads(done.stdout.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise ShoalError("unexpected output from shoal %s: %s" % (args[0], e)) from None


class _LogCursor:
    """Where a reader of a rank's log is: its offset in the current file,
    and the rotations it has seen (none before its first read)."""

    def __init__(self) -> None:
        self.offset = 0
        self.rotations: Optional[int] = None

    def read(self, node: Client, job_id: Union[int, str], rank: int) -> Iterator[bytes]:
        """The log from the cursor to its current end, 4 MiB at a time."""
        while True:
            data, start, rotations = node.log_chunk(job_id, rank, self.offset)
            if self.rotations is not None and self.rotations != rotations:
                # Rotated since the last read: the new file, from its start.
                yield _ROTATED
                if start != 0:
                    data, start, rotations = node.log_chunk(job_id, rank, 0)
            if data:
                yield data
            self.offset = start + len(data)
            self.rotations = rotations
            if not data:
                return


def _headers(resp: Any) -> Dict[str, str]:
    return {k.lower(): v for k, v in resp.headers.items()}


def _api_error(url: str, status: int, raw: bytes) -> ShoalError:
    try:
        body = json.loads(raw.decode("utf-8"))
        message, code = body["message"], body.get("code")
        if not isinstance(message, str):
            raise TypeError
    except (UnicodeDecodeError, ValueError, KeyError, TypeError):
        message, code = "%s returned HTTP %d" % (url, status), "http"
        if 300 <= status < 400:
            message += " (a redirect; not followed)"
    return ShoalError(message, status=status, code=code, url=url)

