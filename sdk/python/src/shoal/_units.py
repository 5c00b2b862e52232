"""Durations, memory sizes and GPU requests as ``shoal submit`` reads them
(``sdk/src/units.rs``; both are checked against ``sdk/testdata/units.json``)."""

from __future__ import annotations

import re
from typing import Optional, Tuple, Union

from ._errors import ShoalError

_DIGITS = re.compile(r"^[0-9]+$")


def _uint(s: str) -> int:
    if not _DIGITS.match(s):
        raise ValueError(s)
    return int(s)


def parse_duration(value: Union[str, int, float]) -> int:
    """Seconds from a Slurm duration (``MM``, ``MM:SS``, ``HH:MM:SS``,
    ``D-HH``, ``D-HH:MM``, ``D-HH:MM:SS``) or ``90s``/``30m``/``2h``/``1d``;
    an int or float is taken as seconds already."""
    if isinstance(value, bool):
        raise ShoalError("invalid duration %r" % (value,))
    if isinstance(value, (int, float)):
        if value < 0:
            raise ShoalError("invalid duration %r: it must not be negative" % (value,))
        return int(value)
    s = value.strip()
    bad = ShoalError(
        "invalid duration '%s': use MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]] or 90s/30m/2h/1d" % s
    )
    if not s:
        raise bad
    try:
        if s[-1].isascii() and s[-1].isalpha():
            n = _uint(s[:-1])
            unit = {"s": 1, "m": 60, "h": 3600, "d": 86400}.get(s[-1])
            if unit is None:
                raise bad
            return n * unit
        days, rest = 0, s
        if "-" in s:
            d, rest = s.split("-", 1)
            days = _uint(d)
        parts = [_uint(p) for p in rest.split(":")]
    except ValueError:
        raise bad from None
    dashed = "-" in s
    if not dashed and len(parts) == 1:
        secs = parts[0] * 60
    elif not dashed and len(parts) == 2:
        secs = parts[0] * 60 + parts[1]
    elif len(parts) == 3:
        secs = parts[0] * 3600 + parts[1] * 60 + parts[2]
    elif dashed and len(parts) == 1:
        secs = parts[0] * 3600
    elif dashed and len(parts) == 2:
        secs = parts[0] * 3600 + parts[1] * 60
    else:
        raise bad
    return days * 86400 + secs


def parse_mem(value: Union[str, int]) -> int:
    """Bytes from a Slurm memory size: a bare number is MiB; K, M, G, T
    (optionally followed by ``B`` or ``iB``, any case) are powers of 1024;
    ``B`` alone is bytes. An int is taken as bytes already."""
    if isinstance(value, bool):
        raise ShoalError("invalid mem %r" % (value,))
    if isinstance(value, int):
        if value <= 0:
            raise ShoalError("invalid mem %d: the memory of a rank must be positive" % value)
        return value
    t = value.strip()
    bad = ShoalError(
        "invalid --mem '%s': use a size such as 512M, 16G or 1048576B (a bare number is MiB)" % value
    )
    m = re.match(r"^([0-9]+)(.*)$", t)
    if not m:
        raise bad
    n, unit = int(m.group(1)), m.group(2).upper()
    if unit.endswith("IB") and len(unit) > 2:
        unit = unit[:-2]
    elif unit.endswith("B") and len(unit) > 1:
        unit = unit[:-1]
    shift = {"": 20, "B": 0, "K": 10, "M": 20, "G": 30, "T": 40}.get(unit)
    if shift is None:
        raise bad
    size = n << shift
    if size >= 1 << 64:
        raise bad
    if size == 0:
        raise ShoalError("invalid --mem '%s': the memory of a rank must be positive" % value)
    return size


def parse_gres(value: str) -> Tuple[Optional[str], int]:
    """``(model, count)`` from ``gpu:8``, ``gpu:H100:8``, ``accelerator:8``."""
    bad = ShoalError("invalid --gres '%s': use gpu[:TYPE]:COUNT" % value)
    s = value[len("gres/") :] if value.startswith("gres/") else value
    parts = s.split(":")
    if parts[0] not in ("gpu", "accelerator"):
        raise bad
    try:
        if len(parts) == 1:
            return None, 1
        if len(parts) == 2:
            return None, _uint(parts[1])
        if len(parts) == 3:
            return parts[1], _uint(parts[2])
    except ValueError:
        raise bad from None
    raise bad
