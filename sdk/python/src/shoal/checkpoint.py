"""Checkpoints the way Shoal expects them (INTERFACE.md, "Checkpoints").

Each rank writes its part of step N under its own ``$SHOAL_CKPT_DIR/N/``
and marks it complete with ``N/.done``; Shoal replicates the part, and
commits step N once every rank's part is complete and replicated. A rank
that saves nothing (ranks other than 0 under DDP, say) writes ``.done``
alone. On resume, every rank finds the union of all parts in its
``$SHOAL_CKPT_DIR/N/`` and ``SHOAL_RESTORE_STEP=N``.

:func:`save` writes a step so that Shoal never sees half of it: the part
goes into a hidden temporary directory beside ``N/``, every file and
directory is fsynced, the directory is renamed to ``N/``, and ``.done`` is
created last (and fsynced). A crash at any point leaves either nothing, a
hidden directory the next save removes, or an ``N/`` without ``.done``,
which is not a checkpoint.

A part is one file or directory per rank, so parts never collide in the
union: ``rank-R.pt`` (``torch.save``, when torch is importable),
``rank-R.pkl`` (pickle, without torch), ``rank-R.bin`` (a ``bytes``
state) or ``rank-R/`` (a dict of ``bytes``: one file per key).

Shoal asks for checkpoints with signals: SIGUSR1 every
``--ckpt-interval`` (checkpoint soon), SIGTERM before preemption, drain or
the time limit (checkpoint and exit within the grace period).
:func:`on_signal` turns both into flags a training loop tests at a step
boundary::

    from shoal import checkpoint

    checkpoint.on_signal()
    step = checkpoint.latest() or 0
    state = checkpoint.load(step) if step else init_state()
    while step < steps:
        step += 1
        train_one_step(state)
        if step % 100 == 0 or checkpoint.requested():
            checkpoint.save(state, step)
            if checkpoint.stopping():
                break
"""

from __future__ import annotations

import contextlib
import errno
import importlib
import os
import pickle
import secrets
import shutil
import operator
import signal
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Dict, Iterable, Iterator, List, Mapping, Optional, Union

from ._errors import ShoalError

DONE = ".done"
_TMP_PREFIX = ".shoal-tmp-"

PathLike = Union[str, "os.PathLike[str]"]

# Per checkpoint directory (resolved), the highest step this process saved.
_saved_here: Dict[str, int] = {}


# --- where ---------------------------------------------------------------


def directory(ckpt_dir: Optional[PathLike] = None) -> Path:
    """The checkpoint directory: ``ckpt_dir``, else ``$SHOAL_CKPT_DIR``,
    else ``./ckpt`` (outside Shoal)."""
    if ckpt_dir is not None:
        return Path(ckpt_dir)
    return Path(os.environ.get("SHOAL_CKPT_DIR") or "ckpt")


def _rank(rank: Optional[int]) -> int:
    if rank is not None:
        return int(rank)
    raw = os.environ.get("RANK", "").strip()
    try:
        return int(raw) if raw else 0
    except ValueError:
        raise ShoalError("RANK=%r is not an integer" % raw) from None


def _step(step: Any) -> int:
    try:
        if isinstance(step, bool):
            raise TypeError
        n = operator.index(step)
    except TypeError:
        raise ShoalError("a checkpoint step is a non-negative integer, not %r" % (step,)) from None
    if n < 0:
        raise ShoalError("a checkpoint step is a non-negative integer, not %d" % n)
    return n


def step_dir(step: int, *, ckpt_dir: Optional[PathLike] = None) -> Path:
    """``$SHOAL_CKPT_DIR/N``, where step N's parts are."""
    return directory(ckpt_dir) / str(_step(step))


def _key(d: Path) -> str:
    return os.path.realpath(d)


def _is_real_dir(p: Path) -> bool:
    try:
        return p.is_dir() and not p.is_symlink()
    except OSError:
        return False


def _has_done(d: Path) -> bool:
    # As the agent judges it: a step that is a link, or whose marker is
    # one, is not a checkpoint.
    marker = d / DONE
    return _is_real_dir(d) and marker.exists() and not marker.is_symlink()


def steps(*, ckpt_dir: Optional[PathLike] = None) -> List[int]:
    """Steps complete in this rank's checkpoint directory (with ``N/.done``),
    lowest first."""
    d = directory(ckpt_dir)
    try:
        names = os.listdir(d)
    except FileNotFoundError:
        return []
    except OSError as e:
        raise ShoalError("cannot read %s: %s" % (d, e)) from e
    found = []
    for name in names:
        if name.isdigit() and _has_done(d / name):
            found.append(int(name))
    return sorted(found)


def _restore_step() -> Optional[int]:
    raw = os.environ.get("SHOAL_RESTORE_STEP", "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        raise ShoalError("SHOAL_RESTORE_STEP=%r is not an integer" % raw) from None


def latest(*, ckpt_dir: Optional[PathLike] = None) -> Optional[int]:
    """The step to resume from, or None when there is none.

    When Shoal resumed this run (``SHOAL_RESTORE_STEP=N``, for the job's
    own ``$SHOAL_CKPT_DIR``): N, the step the cluster committed for every
    rank, or a later step this process has saved since. A later step left
    on disk by an earlier run was never committed for every rank, and is
    not chosen. Otherwise: the highest step with ``N/.done``.
    """
    d = directory(ckpt_dir)
    restore = _restore_step()
    env_dir = os.environ.get("SHOAL_CKPT_DIR")
    if restore is not None and env_dir and _key(Path(env_dir)) == _key(d):
        mine = _saved_here.get(_key(d))
        return mine if mine is not None and mine > restore else restore
    done = steps(ckpt_dir=d)
    return done[-1] if done else None


# --- writing -------------------------------------------------------------


def _fsync_path(p: Path, directory_: bool) -> None:
    flags = os.O_RDONLY | (getattr(os, "O_DIRECTORY", 0) if directory_ else 0)
    fd = os.open(p, flags)
    try:
        os.fsync(fd)
    except OSError as e:
        # Some filesystems cannot fsync a directory; the data is what matters.
        if not (directory_ and e.errno in (errno.EINVAL, errno.ENOTSUP, errno.EBADF)):
            raise
    finally:
        os.close(fd)


def _fsync_tree(root: Path) -> None:
    """fsyncs every file and directory under ``root``, root last."""
    for here, dirs, files in os.walk(root, topdown=False):
        for name in files:
            p = Path(here) / name
            if not p.is_symlink():
                _fsync_path(p, False)
        for name in dirs:
            p = Path(here) / name
            if not p.is_symlink():
                _fsync_path(p, True)
    _fsync_path(root, True)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _remove(p: Path) -> None:
    if p.is_symlink() or not p.is_dir():
        p.unlink()
    else:
        shutil.rmtree(p)


def _sweep(d: Path) -> None:
    """Removes temporary directories that crashed saves left behind."""
    try:
        names = os.listdir(d)
    except OSError:
        return
    for name in names:
        if not name.startswith(_TMP_PREFIX):
            continue
        try:
            pid = int(name[len(_TMP_PREFIX) :].split("-")[1])
        except (IndexError, ValueError):
            continue
        if pid != os.getpid() and _pid_alive(pid):
            continue  # another process's save in progress
        with contextlib.suppress(OSError):
            _remove(d / name)


def _mark_done(target: Path, rank: int) -> None:
    """Creates ``target/.done`` (fsynced, then the directory): the step is
    complete from here on."""
    marker = target / DONE
    fd = os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        os.write(fd, b"rank %d\n" % rank)
        os.fsync(fd)
    finally:
        os.close(fd)
    _fsync_path(target, True)


@contextlib.contextmanager
def writing(
    step: int, *, ckpt_dir: Optional[PathLike] = None, rank: Optional[int] = None
) -> Iterator[Path]:
    """A directory to write this rank's part of ``step`` into, committed
    when the ``with`` block ends without an exception: fsynced, renamed to
    ``N/``, then marked with ``N/.done``. An exception removes it, and
    ``N/`` never appears. For parts :func:`save` does not write (a
    sharded ``torch.distributed.checkpoint``, say); name the files so that
    other ranks' parts do not collide with them::

        with checkpoint.writing(step) as d:
            torch.save(model.state_dict(), d / f"rank-{env.rank}.pt")
    """
    global _usr1
    n = _step(step)
    r = _rank(rank)
    d = directory(ckpt_dir)
    target = d / str(n)
    if _has_done(target):
        raise ShoalError(
            "step %d is already checkpointed in %s (a complete step is never rewritten)" % (n, d)
        )
    try:
        d.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ShoalError("cannot create %s: %s" % (d, e)) from e
    _sweep(d)
    tmp = d / ("%s%d-%d-%s" % (_TMP_PREFIX, n, os.getpid(), secrets.token_hex(4)))
    tmp.mkdir()
    try:
        yield tmp
        _fsync_tree(tmp)
        if os.path.lexists(target):
            # Left by a save that crashed before its .done: not a checkpoint.
            _remove(target)
        os.rename(tmp, target)
        _fsync_path(d, True)
    except BaseException:
        with contextlib.suppress(OSError):
            _remove(tmp)
        raise
    _mark_done(target, r)
    key = _key(d)
    if _saved_here.get(key, -1) < n:
        _saved_here[key] = n
    _usr1 = False


_torch_module: Any = None


def _torch() -> Any:
    """torch, when importable (imported only when a state needs it)."""
    global _torch_module
    if _torch_module is None:
        try:
            _torch_module = importlib.import_module("torch")
        except ImportError:
            _torch_module = False
    return _torch_module or None


def _is_bytes(v: Any) -> bool:
    return isinstance(v, (bytes, bytearray, memoryview))


def _safe_name(key: Any) -> bool:
    return (
        isinstance(key, str)
        and key not in ("", ".", "..")
        and "/" not in key
        and "\0" not in key
        and not key.startswith(_TMP_PREFIX)
        and key != DONE
    )


def _write_file(path: Path, write: Callable[[Any], None]) -> None:
    with open(path, "xb") as f:
        write(f)
        f.flush()
        os.fsync(f.fileno())


def _writer(data: Any) -> Callable[[Any], None]:
    def write(f: Any) -> None:
        f.write(data)

    return write


def save(
    state: Any,
    step: int,
    *,
    rank_saves: bool = True,
    ckpt_dir: Optional[PathLike] = None,
    rank: Optional[int] = None,
    format: Optional[str] = None,
) -> Path:
    """Writes this rank's part of checkpoint ``step`` and marks it complete;
    returns ``$SHOAL_CKPT_DIR/N``.

    The part is ``rank-R.bin`` for a ``bytes`` state, ``rank-R/`` with one
    file per key for a dict of ``bytes`` (keys are file names), else
    ``rank-R.pt`` written by ``torch.save`` when torch is importable, else
    ``rank-R.pkl`` (pickle). ``format="torch"`` or ``"pickle"`` chooses.
    With ``rank_saves=False`` the rank saves nothing and writes ``.done``
    alone (ranks other than 0 under DDP: ``rank_saves=env.rank == 0``).

    Writing a step that is already complete raises :class:`ShoalError`.
    Saving also clears :func:`requested` for SIGUSR1.
    """
    r = _rank(rank)
    if format not in (None, "torch", "pickle"):
        raise ShoalError("format is 'torch' or 'pickle', not %r" % (format,))
    with writing(step, ckpt_dir=ckpt_dir, rank=r) as tmp:
        if not rank_saves:
            pass
        elif _is_bytes(state) and format is None:
            _write_file(tmp / ("rank-%d.bin" % r), _writer(state))
        elif (
            format is None
            and isinstance(state, Mapping)
            and state
            and all(_is_bytes(v) for v in state.values())
        ):
            bad = [k for k in state if not _safe_name(k)]
            if bad:
                raise ShoalError("checkpoint file names must be plain names, not %r" % bad[0])
            part = tmp / ("rank-%d" % r)
            part.mkdir()
            for k, v in state.items():
                _write_file(part / k, _writer(v))
        else:
            torch = _torch() if format in (None, "torch") else None
            if format == "torch" and torch is None:
                raise ShoalError("format='torch' needs torch, which is not importable")
            if torch is not None:
                _write_file(tmp / ("rank-%d.pt" % r), lambda f: torch.save(state, f))
            else:
                _write_file(
                    tmp / ("rank-%d.pkl" % r),
                    lambda f: pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL),
                )
    return directory(ckpt_dir) / str(_step(step))


# --- reading -------------------------------------------------------------


def parts(step: int, *, ckpt_dir: Optional[PathLike] = None) -> Dict[int, Path]:
    """The parts :func:`save` wrote in ``N/`` (after a restore: every
    rank's), by rank."""
    d = step_dir(step, ckpt_dir=ckpt_dir)
    found: Dict[int, Path] = {}
    try:
        names = os.listdir(d)
    except OSError:
        return found
    for name in names:
        if not name.startswith("rank-"):
            continue
        stem = name[len("rank-") :]
        for ext in (".pt", ".pkl", ".bin", ""):
            if ext and not stem.endswith(ext):
                continue
            number = stem[: len(stem) - len(ext)] if ext else stem
            if number.isdigit() and (ext or _is_real_dir(d / name)):
                found.setdefault(int(number), d / name)
                break
    return found


def load(
    step: Optional[int] = None,
    *,
    rank: Optional[int] = None,
    ckpt_dir: Optional[PathLike] = None,
    map_location: Any = None,
) -> Any:
    """A part of checkpoint ``step`` (default: :func:`latest`), as
    :func:`save` was given it.

    Which part: ``rank``'s when given; else this rank's when it saved one;
    else the lowest rank's (under DDP only rank 0 saves, and after a
    restore every rank finds rank 0's part). ``map_location`` goes to
    ``torch.load``. Raises :class:`ShoalError` when there is no such
    checkpoint or part.
    """
    d = directory(ckpt_dir)
    if step is None:
        step = latest(ckpt_dir=d)
        if step is None:
            raise ShoalError("no checkpoint in %s" % d)
    n = _step(step)
    if not _has_done(d / str(n)):
        raise ShoalError("step %d is not a complete checkpoint in %s" % (n, d))
    found = parts(n, ckpt_dir=d)
    if rank is not None:
        chosen = found.get(int(rank))
        if chosen is None:
            raise ShoalError("step %d holds no part of rank %d in %s" % (n, rank, d))
    elif not found:
        raise ShoalError("step %d holds no saved part in %s (only .done)" % (n, d))
    else:
        own = _rank(None)
        chosen = found.get(own, found[min(found)])
    name = chosen.name
    if name.endswith(".bin"):
        return chosen.read_bytes()
    if name.endswith(".pkl"):
        with open(chosen, "rb") as f:
            return pickle.load(f)
    if name.endswith(".pt"):
        torch = _torch()
        if torch is None:
            raise ShoalError("%s was written by torch.save; torch is not importable" % chosen)
        try:
            return torch.load(chosen, map_location=map_location, weights_only=False)
        except TypeError:  # torch before weights_only
            return torch.load(chosen, map_location=map_location)
    return {p.name: p.read_bytes() for p in sorted(chosen.iterdir()) if p.is_file()}


# --- signals -------------------------------------------------------------

_usr1 = False
_term = False
_installed: Dict[int, Any] = {}


def _handler(signum: int, frame: Optional[FrameType]) -> None:
    global _usr1, _term
    if signum == signal.SIGTERM:
        _term = True
    else:
        _usr1 = True
    previous = _installed.get(signum)
    if callable(previous):
        previous(signum, frame)


def on_signal(signals: Iterable[int] = (signal.SIGUSR1, signal.SIGTERM)) -> None:
    """Turns Shoal's checkpoint requests into flags instead of the default
    actions (both signals would end the process): SIGUSR1 sets
    :func:`requested` (checkpoint soon), SIGTERM sets :func:`requested` and
    :func:`stopping` (checkpoint, then exit within the grace period). A
    Python handler installed before is still called. Call it from the main
    thread, in every process the rank starts that should survive SIGUSR1
    (Shoal signals the rank's whole process group)."""
    for sig in signals:
        current = signal.getsignal(sig)
        if current is _handler:
            continue
        _installed[sig] = current
        signal.signal(sig, _handler)


def requested() -> bool:
    """Whether Shoal asked for a checkpoint: SIGUSR1 since the last
    :func:`save`, or SIGTERM. Test it at a step boundary."""
    return _usr1 or _term


def stopping() -> bool:
    """Whether SIGTERM came: save now, then exit (the grace period is
    short)."""
    return _term


def clear() -> None:
    """Forgets the signals received so far."""
    global _usr1, _term
    _usr1 = False
    _term = False


def _reset_for_tests() -> None:
    clear()
    _saved_here.clear()
    for sig, previous in list(_installed.items()):
        signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
    _installed.clear()

