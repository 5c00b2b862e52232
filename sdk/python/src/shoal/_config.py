"""Where the CLI connects and whom it trusts, read the way the CLI reads it.

``shoal login URL`` records a cluster's API URL, a token and the cluster CA
in the user's settings file: ``$SHOAL_CLI_CONFIG``, else
``$XDG_CONFIG_HOME/shoal/cli.toml``, else ``~/.config/shoal/cli.toml``. An
operator on a node needs no login: the node's data dir (``$SHOAL_DATA_DIR``,
else ``/var/lib/shoal`` for root, else ``$XDG_DATA_HOME/shoal``, else
``~/.local/share/shoal``) names the agent's API (``agent.json``), the
bootstrap admin token (``admin.token``) and the cluster CA
(``identity.json``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional

from ._errors import ShoalError

DEFAULT_API = "http://127.0.0.1:7070"


@dataclass(frozen=True)
class Settings:
    """The CLI's settings file (``cli.toml``); every field may be absent."""

    api: Optional[str] = None
    token: Optional[str] = None
    ca_pem: Optional[str] = None
    #: BLAKE3 of the CA certificate's DER, for people comparing with
    #: ``shoal status``; the CA itself (``ca_pem``) is what is trusted.
    ca_fingerprint: Optional[str] = None
    cluster_id: Optional[str] = None
    path: Optional[Path] = None


@dataclass(frozen=True)
class Credentials:
    """What a client uses: the API URL, the token and the CA (PEM)."""

    url: str
    token: Optional[str]
    ca_pem: Optional[str]
    #: Where the CA came from (a file path, the settings file), for messages.
    ca_source: Optional[str] = None
    #: The file named by ``SHOAL_CA_FILE`` or ``ca_file=``, when that is
    #: where the CA came from (handed as is to ``shoal`` subprocesses).
    ca_file: Optional[Path] = None


def _env(environ: Mapping[str, str], key: str) -> Optional[str]:
    value = environ.get(key)
    return value if value else None


def settings_path(environ: Optional[Mapping[str, str]] = None) -> Optional[Path]:
    """The settings file's path, as the CLI finds it; None without a home."""
    environ = os.environ if environ is None else environ
    explicit = _env(environ, "SHOAL_CLI_CONFIG")
    if explicit:
        return Path(explicit)
    base = _env(environ, "XDG_CONFIG_HOME")
    if base:
        return Path(base) / "shoal" / "cli.toml"
    home = _env(environ, "HOME")
    if home:
        return Path(home) / ".config" / "shoal" / "cli.toml"
    return None


def default_data_dir(environ: Optional[Mapping[str, str]] = None) -> Path:
    """The node data dir the CLI uses without ``--data-dir``."""
    environ = os.environ if environ is None else environ
    explicit = _env(environ, "SHOAL_DATA_DIR")
    if explicit:
        return Path(explicit)
    if environ.get("USER") == "root" or environ.get("HOME") == "/root":
        return Path("/var/lib/shoal")
    xdg = _env(environ, "XDG_DATA_HOME")
    if xdg:
        return Path(xdg) / "shoal"
    home = environ.get("HOME")
    if home is not None:
        return Path(home) / ".local" / "share" / "shoal"
    return Path("./shoal-data")


def load_settings(environ: Optional[Mapping[str, str]] = None) -> Settings:
    """The settings, or empty ones when there is no file. A file that is
    there but unreadable or invalid is an error, as it is for the CLI."""
    path = settings_path(environ)
    if path is None:
        return Settings()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return Settings()
    except OSError as e:
        raise ShoalError("cannot read %s: %s" % (path, e)) from e
    try:
        values = parse_toml(text)
    except ValueError as e:
        raise ShoalError("%s: %s" % (path, e)) from e

    def text_of(key: str) -> Optional[str]:
        value = values.get(key)
        if value is None:
            return None
        if not isinstance(value, str):
            raise ShoalError("%s: %s must be a string" % (path, key))
        return value

    return Settings(
        api=text_of("api"),
        token=text_of("token"),
        ca_pem=text_of("ca_pem"),
        ca_fingerprint=text_of("ca_fingerprint"),
        cluster_id=text_of("cluster_id"),
        path=path,
    )


def same_api(url: str) -> str:
    """The form two API URLs are compared in (the stored token goes only to
    the stored API)."""
    return url.rstrip("/").lower()


def resolve(
    url: Optional[str] = None,
    token: Optional[str] = None,
    ca_file: Optional[str] = None,
    data_dir: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> Credentials:
    """The CLI's choice of API, token and CA (``node/src/cli/login.rs``,
    ``connect``), given what the caller passed explicitly.

    API: ``url``, ``$SHOAL_API``, the settings' API, the API of the agent
    running on the data dir, then ``http://127.0.0.1:7070``. Token:
    ``token``, ``$SHOAL_TOKEN``, the settings' token when talking to the
    settings' API, then the data dir's ``admin.token``. CA: ``ca_file``,
    ``$SHOAL_CA_FILE``, the settings' CA, then the data dir's identity.
    """
    environ = os.environ if environ is None else environ
    settings = load_settings(environ)
    ddir = Path(data_dir) if data_dir else default_data_dir(environ)
    api = url or _env(environ, "SHOAL_API") or settings.api or _local_agent_api(ddir) or DEFAULT_API
    api = api.rstrip("/")
    logged_in_here = settings.api is not None and same_api(settings.api) == same_api(api)
    tok = token or _env(environ, "SHOAL_TOKEN")
    if tok is None and logged_in_here:
        tok = settings.token
    if tok is None:
        tok = _read_stripped(ddir / "admin.token")
    ca_path = ca_file or _env(environ, "SHOAL_CA_FILE")
    if ca_path:
        try:
            pem: Optional[str] = Path(ca_path).read_text(encoding="ascii")
        except (OSError, UnicodeDecodeError) as e:
            what = "ca_file" if ca_file else "SHOAL_CA_FILE"
            raise ShoalError("%s %s: %s" % (what, ca_path, e)) from e
        return Credentials(api, tok, pem, str(ca_path), Path(ca_path))
    if settings.ca_pem:
        return Credentials(api, tok, settings.ca_pem, str(settings.path))
    pem = _identity_ca(ddir)
    return Credentials(api, tok, pem, str(ddir / "identity.json") if pem else None)


def _read_stripped(path: Path) -> Optional[str]:
    try:
        text = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text or None


def _local_agent_api(data_dir: Path) -> Optional[str]:
    try:
        info = json.loads((data_dir / "agent.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    api = info.get("api_url") if isinstance(info, dict) else None
    return api if isinstance(api, str) and api else None


def _identity_ca(data_dir: Path) -> Optional[str]:
    try:
        identity = json.loads((data_dir / "identity.json").read_text(encoding="utf-8"))
        pem = identity["credentials"]["ca_pem"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pem if isinstance(pem, str) and pem else None


# --- a TOML reader for the settings file --------------------------------
#
# Python 3.11 has tomllib; 3.9 and 3.10 do not, and the package depends on
# nothing. The settings file is flat `key = "string"` pairs (the CA in a
# multi-line string), so a reader of TOML's four string forms, comments
# and blank lines is enough; anything else is refused with the line.


def parse_toml(text: str) -> Dict[str, object]:
    """Top-level ``key = value`` pairs of a TOML document."""
    try:
        import tomllib  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return _parse_flat_toml(text)
    try:
        return dict(tomllib.loads(text))
    except tomllib.TOMLDecodeError as e:
        raise ValueError(str(e)) from e


_ESCAPES = {"b": "\b", "t": "\t", "n": "\n", "f": "\f", "r": "\r", '"': '"', "\\": "\\", "e": "\x1b"}


def _parse_flat_toml(text: str) -> Dict[str, object]:
    out: Dict[str, object] = {}
    i, n = 0, len(text)

    def line_no(pos: int) -> int:
        return text.count("\n", 0, pos) + 1

    def fail(pos: int, what: str) -> ValueError:
        return ValueError("line %d: %s" % (line_no(pos), what))

    def skip_blank(pos: int, newlines: bool) -> int:
        while pos < n:
            c = text[pos]
            if c in " \t" or (newlines and c in "\r\n"):
                pos += 1
            elif c == "#":
                while pos < n and text[pos] != "\n":
                    pos += 1
            else:
                break
        return pos

    def basic(pos: int, multi: bool) -> "tuple[str, int]":
        chars = []
        close = '"""' if multi else '"'
        if multi and text.startswith("\n", pos):
            pos += 1
        elif multi and text.startswith("\r\n", pos):
            pos += 2
        while True:
            if pos >= n:
                raise fail(pos, "unterminated string")
            if text.startswith(close, pos):
                if multi:
                    # Up to two quotes may end the content: `""""` is `"` + close.
                    extra = 0
                    while extra < 2 and text.startswith('"', pos + 3 + extra):
                        extra += 1
                    chars.append('"' * extra)
                    return "".join(chars), pos + 3 + extra
                return "".join(chars), pos + 1
            c = text[pos]
            if c == "\n" and not multi:
                raise fail(pos, "newline in a one-line string")
            if c != "\\":
                chars.append(c)
                pos += 1
                continue
            esc = text[pos + 1 : pos + 2]
            if esc in _ESCAPES:
                chars.append(_ESCAPES[esc])
                pos += 2
            elif esc in ("u", "U"):
                width = 4 if esc == "u" else 8
                digits = text[pos + 2 : pos + 2 + width]
                try:
                    chars.append(chr(int(digits, 16)))
                except ValueError:
                    raise fail(pos, "bad unicode escape") from None
                pos += 2 + width
            elif multi and esc in (" ", "\t", "\r", "\n"):
                # A line-ending backslash trims the newline and what follows.
                j = pos + 1
                while j < n and text[j] in " \t":
                    j += 1
                if j >= n or text[j] not in "\r\n":
                    raise fail(pos, "bad escape")
                while j < n and text[j] in " \t\r\n":
                    j += 1
                pos = j
            else:
                raise fail(pos, "bad escape \\%s" % esc)

    def literal(pos: int, multi: bool) -> "tuple[str, int]":
        close = "'''" if multi else "'"
        if multi and text.startswith("\n", pos):
            pos += 1
        elif multi and text.startswith("\r\n", pos):
            pos += 2
        end = text.find(close, pos)
        if end < 0:
            raise fail(pos, "unterminated string")
        value = text[pos:end]
        if not multi and "\n" in value:
            raise fail(pos, "newline in a one-line string")
        end += len(close)
        if multi:
            extra = 0
            while extra < 2 and text.startswith("'", end + extra):
                extra += 1
            value += "'" * extra
            end += extra
        return value, end

    while True:
        i = skip_blank(i, newlines=True)
        if i >= n:
            return out
        start = i
        if text[i] in "\"'":
            raise fail(i, "quoted keys are not supported here")
        while i < n and (text[i].isalnum() or text[i] in "_-"):
            i += 1
        key = text[start:i]
        if not key:
            raise fail(i, "expected a key = \"value\" line")
        i = skip_blank(i, newlines=False)
        if not text.startswith("=", i):
            raise fail(i, "expected '=' after %s" % key)
        i = skip_blank(i + 1, newlines=False)
        if text.startswith('"""', i):
            value, i = basic(i + 3, True)
        elif text.startswith('"', i):
            value, i = basic(i + 1, False)
        elif text.startswith("'''", i):
            value, i = literal(i + 3, True)
        elif text.startswith("'", i):
            value, i = literal(i + 1, False)
        else:
            raise fail(i, "%s: only string values are understood here" % key)
        if key in out:
            raise fail(start, "duplicate key %s" % key)
        out[key] = value
        i = skip_blank(i, newlines=False)
        if i < n and text[i] not in "\r\n":
            raise fail(i, "unexpected text after the value of %s" % key)
