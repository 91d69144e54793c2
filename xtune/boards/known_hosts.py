"""known_hosts as OpenSSH reads and writes it: a file in, paramiko host keys out, malformed lines
skipped with a warning naming the file and line (sshd(8), "SSH_KNOWN_HOSTS FILE FORMAT")."""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import warnings
from pathlib import Path

import paramiko
from paramiko.pkey import UnknownKeyType

from xtune.errors import XtuneWarning


class KnownHostsWarning(XtuneWarning):
    """A known_hosts line was skipped (malformed, or a marker paramiko cannot honour)."""


def _b64(text: str) -> bytes:
    return base64.b64decode(text.encode("ascii"), validate=True)


def _check_hostnames(names: str) -> str:
    """'' if every host pattern is usable, else why not. Hashed names are `|1|base64(salt)|base64(hmac)`
    with a SHA-1-sized salt and HMAC (OpenSSH hostfile.c); paramiko asserts on anything else."""
    for name in names.split(","):
        if not name:
            return "an empty host name"
        if name.startswith("|"):
            parts = name.split("|")
            if len(parts) != 4 or parts[1] != "1":
                return "a hashed host name that is not |1|salt|hash"
            try:
                salt, digest = _b64(parts[2]), _b64(parts[3])
            except (binascii.Error, ValueError):
                return "a hashed host name that is not base64"
            if len(salt) != hashlib.sha1().digest_size or len(digest) != hashlib.sha1().digest_size:
                return "a hashed host name whose salt or hash is not 20 bytes"
    return ""


def _parse(line: str) -> tuple[list[str], paramiko.PKey | None] | str:
    """(host names, key) of one entry line, (names, None) for a key type paramiko does not know
    (skipped silently, as OpenSSH skips them), or why the line is malformed."""
    words = line.split()
    if words[0].startswith("@"):
        return f"marker {words[0]} is not supported by paramiko"
    if len(words) < 3:
        return "fewer than three fields (hosts, key type, key)"
    why = _check_hostnames(words[0])
    if why:
        return why
    try:
        blob = _b64(words[2])
    except (binascii.Error, ValueError):
        return "the key is not base64"
    try:
        return words[0].split(","), paramiko.PKey.from_type_string(words[1], blob)
    except UnknownKeyType:
        return words[0].split(","), None
    except Exception as err:  # paramiko's key parsers raise many kinds on garbage bytes
        return f"the {words[1]} key does not parse ({type(err).__name__})"


def load(path: Path, keys: paramiko.HostKeys | None = None) -> paramiko.HostKeys:
    """The host keys of `path` (none if it does not exist) added to `keys` (a client's, or new ones);
    a malformed line is skipped with a warning."""
    keys = paramiko.HostKeys() if keys is None else keys
    try:
        text = path.read_bytes().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return keys
    except OSError as err:
        warnings.warn(f"{path}: cannot read known hosts ({err.strerror})", KnownHostsWarning, stacklevel=2)
        return keys
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parsed = _parse(line)
        if isinstance(parsed, str):
            warnings.warn(
                f"{path}:{number}: skipped a malformed known_hosts line ({parsed})",
                KnownHostsWarning,
                stacklevel=2,
            )
            continue
        names, key = parsed
        if key is not None:
            for name in names:
                keys.add(name, key.get_name(), key)
    return keys


def append(path: Path, hostname: str, key: paramiko.PKey) -> None:
    """Add one `hostname keytype base64` line as `ssh` does (StrictHostKeyChecking=accept-new): on a line
    of its own even when the file's last line has no newline, the rest of the file left alone."""
    line = paramiko.hostkeys.HostKeyEntry([hostname], key).to_line() or ""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    with open(path, "a+b") as f:
        if f.tell() > 0:
            f.seek(-1, os.SEEK_END)
            if f.read(1) != b"\n":
                line = "\n" + line
        f.write(line.encode())
