"""boards.toml: a file in, validated `SshBoardConfig`s out; every mistake is one InputError line naming
the board and the key (docs/boards.md, "boards.toml")."""

from __future__ import annotations

import math
import os
import posixpath
import re
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path

from xtune.errors import InputError
from xtune.target import load_targets

AGENT_NAME = "xtune-agent"
CONNECT_TIMEOUT = 5.0  # seconds for the TCP connect, the SSH banner and authentication, each
MAX_CONNECT_TIMEOUT = 300.0


@dataclass(frozen=True, kw_only=True)
class SshBoardConfig:
    """One `[boards.NAME]` table of boards.toml; unset fields come from ~/.ssh/config, then defaults."""

    name: str
    host: str
    target: str
    port: int | None = None
    user: str | None = None
    key: str | None = None  # private key file; none: IdentityFile from ~/.ssh/config
    workdir: str = ".xtune"  # relative paths start in the login directory (SFTP and exec alike)
    wrapper: str = ""  # e.g. "qemu-aarch64 -cpu cortex-a72": an emulated board behind SSH
    known_hosts: str = "~/.ssh/known_hosts"
    ssh_config: str = "~/.ssh/config"
    use_agent: bool = False  # also try ssh-agent and ~/.ssh/id_* keys (paramiko allow_agent/look_for_keys)
    connect_timeout: float = CONNECT_TIMEOUT

    @property
    def agent_path(self) -> str:
        return posixpath.join(self.workdir, AGENT_NAME)


def is_builtin_name(name: str) -> bool:
    """Names of built-in boards (board.py), now and to come: an SSH board may not shadow them."""
    return name == "local" or name.startswith("qemu-")


# A board name becomes a file name (the fingerprint cache) and a log field: no paths, no spaces.
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")
_REQUIRED = ("host", "target")


def _text(value: object) -> bool:
    return isinstance(value, str) and value != "" and not any(c in value for c in "\x00\n\r")


def _word(value: object) -> bool:
    return _text(value) and not any(c.isspace() for c in str(value))


def _host(value: object) -> bool:
    # RFC 1035 §2.3.4: names up to 253 octets, labels up to 63 (IPv6 literals have no labels).
    if not _word(value):
        return False
    host = str(value)
    return len(host) <= 253 and (":" in host or all(0 < len(label) <= 63 for label in host.split(".")))


def _port(value: object) -> bool:
    return type(value) is int and 1 <= value <= 65535


def _seconds(value: object) -> bool:
    return (
        type(value) in (int, float)
        and math.isfinite(float(value))  # type: ignore[arg-type]
        and 0.1 <= float(value) <= MAX_CONNECT_TIMEOUT  # type: ignore[arg-type]
    )


def _target(value: object) -> bool:
    return isinstance(value, str) and value in load_targets()


# key -> (what it must be, the check); exactly the fields of SshBoardConfig but `name`.
_SCHEMA: dict[str, tuple[str, Callable[[object], bool]]] = {
    "host": ("a host name, address or ~/.ssh/config alias", _host),
    "target": ("a target name (see `xtune targets`)", _target),
    "port": ("an integer from 1 to 65535", _port),
    "user": ("a user name (a string without spaces)", _word),
    "key": ("a file name (a non-empty string)", _text),
    "workdir": ("a directory (a non-empty string)", _text),
    "wrapper": (
        'a command line as one string, e.g. "qemu-aarch64 -cpu cortex-a72"',
        lambda v: v == "" or _text(v),
    ),
    "known_hosts": ("a file name (a non-empty string)", _text),
    "ssh_config": ("a file name (a non-empty string)", _text),
    "use_agent": ("true or false", lambda v: isinstance(v, bool)),
    "connect_timeout": (f"a number of seconds from 0.1 to {MAX_CONNECT_TIMEOUT:g}", _seconds),
}
assert set(_SCHEMA) == {f.name for f in fields(SshBoardConfig)} - {"name"}


def _describe(value: object) -> str:
    """A short, one-line description of a TOML value for an error message."""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, int):
        text = str(value)
        return text if len(text) <= 20 else f"an integer of {len(text)} digits"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        shown = repr(value)
        return f"the string {shown if len(shown) <= 60 else shown[:57] + '...'}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"  # datetime, date, time


def find_boards_file(explicit: str | os.PathLike[str] | None = None) -> Path | None:
    """`--boards FILE` if given, else ./boards.toml, else ~/.config/xtune/boards.toml, else None."""
    if explicit is not None:
        path = Path(explicit)
        if not path.is_file():
            raise InputError(f"boards file {path} does not exist")
        return path
    for candidate in (Path("boards.toml"), Path.home() / ".config" / "xtune" / "boards.toml"):
        if candidate.is_file():
            return candidate
    return None


def load_boards(explicit: str | os.PathLike[str] | None = None) -> dict[str, SshBoardConfig]:
    """The SSH boards declared in the boards file (empty without one), validated against the schema."""
    path = find_boards_file(explicit)
    if path is None:
        return {}
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as err:
        raise InputError(f"{path}: cannot read boards: {err}") from None
    for key, value in raw.items():
        if key != "boards":
            what = f"table [{key}]" if isinstance(value, dict) else f"key {key!r}"
            raise InputError(f"{path}: stray top-level {what}: boards.toml holds only [boards.NAME] tables")
    tables = raw.get("boards", {})
    if not isinstance(tables, dict):
        raise InputError(f"{path}: 'boards' must be tables [boards.NAME], not {_describe(tables)}")
    return {name: _board(path, name, table) for name, table in tables.items()}


def _board(path: Path, name: str, table: object) -> SshBoardConfig:
    if not _NAME.match(name):
        raise InputError(
            f"{path}: board name {name!r} must be letters, digits, '.', '_' or '-' "
            "(at most 64, not starting with a punctuation mark)"
        )
    if is_builtin_name(name):
        raise InputError(f"{path}: board '{name}' clashes with a built-in board (local, qemu-*); rename it")
    if not isinstance(table, dict):
        raise InputError(f"{path}: board '{name}' must be a table [boards.{name}], not {_describe(table)}")
    unknown = sorted(set(table) - set(_SCHEMA))
    if unknown:  # the values are not shown: a stray `password = ...` must not end up in a terminal log
        raise InputError(f"{path}: board '{name}': unknown keys {', '.join(map(str, unknown))}")
    for key in _REQUIRED:
        if key not in table:
            raise InputError(f"{path}: board '{name}': missing required key '{key}'")
    for key, value in table.items():
        what, ok = _SCHEMA[key]
        if not ok(value):
            raise InputError(f"{path}: board '{name}': {key} must be {what}, not {_describe(value)}")
    values = dict(table)
    if "connect_timeout" in values:
        values["connect_timeout"] = float(values["connect_timeout"])
    workdir = str(values.get("workdir", ".xtune"))
    values["workdir"] = (workdir[2:] if workdir.startswith("~/") else workdir) or "."  # SFTP has no ~
    return SshBoardConfig(name=name, **values)
