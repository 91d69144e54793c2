"""Agent builds: an architecture name in, the path of a cached static `xtune-agent` binary out; and the
one cache of every C helper xtune compiles (`compile_cached`: the agents, the QEMU insn-count plugin)."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

from xtune.errors import BoardError, BoardFault
from xtune.files import replace_atomic
from xtune.target import host_cpu

ARCHES = ("x86_64", "aarch64", "riscv64")
CFLAGS = ("-std=c11", "-O2", "-static", "-s")
# Debian packages that provide each cross gcc together with the static libc it links against.
_APT_PACKAGES = {
    "x86_64": "gcc-x86-64-linux-gnu libc6-dev-amd64-cross",
    "aarch64": "gcc-aarch64-linux-gnu libc6-dev-arm64-cross",
    "riscv64": "gcc-riscv64-linux-gnu libc6-dev-riscv64-cross",
}


def agent_source() -> bytes:
    """The agent's C source as shipped inside the package (xtune/agent_src -> board_agent)."""
    return (resources.files("xtune") / "agent_src" / "agent.c").read_bytes()


def agent_version() -> str:
    """Short hash of the agent source, recorded in board fingerprints."""
    return hashlib.sha256(agent_source()).hexdigest()[:12]


def compiler_command(arch: str) -> list[str]:
    """The compiler invocation (without flags and files) that builds a static agent for `arch`."""
    if arch not in ARCHES:
        raise BoardError(
            f"no agent build for architecture '{arch}' (known: {', '.join(ARCHES)})", BoardFault.AGENT_GONE
        )
    if arch == host_cpu().arch:
        for cc in ("gcc", "cc"):
            if path := shutil.which(cc):
                return [path]
    if path := shutil.which(f"{arch}-linux-gnu-gcc"):
        return [path]
    if importlib.util.find_spec("ziglang") is not None:
        # zig bundles musl and compiler-rt for every target; the first build per target takes ~35 s.
        return [sys.executable, "-m", "ziglang", "cc", "-target", f"{arch}-linux-musl"]
    raise BoardError(
        f"no C compiler for {arch} agents: install it with "
        f"'apt-get install {_APT_PACKAGES[arch]}' or 'pip install ziglang'",
        BoardFault.AGENT_GONE,
    )


def cache_root() -> Path:
    """xtune's cache: $XDG_CACHE_HOME/xtune, else ~/.cache/xtune (XDG Base Directory Specification)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "xtune"


def build_key(source: bytes, command: Sequence[str]) -> str:
    """What a cached build is keyed by: a hash of the source and the compiler command (with its flags)."""
    return hashlib.sha256(source + b"\0" + " ".join(command).encode()).hexdigest()[:12]


def compile_cached(source: bytes, command: Sequence[str], *, name: str, output: str, what: str) -> Path:
    """The C `source` compiled by `command` (compiler and flags, without files), built once per key:
    cache_root()/agents/NAME-KEY/OUTPUT, KEY = build_key(source, command), reused while it exists.

    The compiler writes a private file beside the cached path, which is then renamed over it (rename is
    atomic within a directory, POSIX rename(2)): concurrent builders, and a build killed halfway, never
    leave a half-written helper for anyone to run. `what` names the helper in errors."""
    out = cache_root() / "agents" / f"{name}-{build_key(source, command)}" / output
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xtune-build-") as tmp:
        src = Path(tmp) / f"{name}.c"
        src.write_bytes(source)
        fd, partial = tempfile.mkstemp(prefix=f".{output}.", dir=out.parent)
        os.close(fd)
        try:
            _compile([*command, "-o", partial, str(src)], what)
            os.chmod(partial, 0o755)
            replace_atomic(partial, out, what)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return out


def build_agent(arch: str) -> Path:
    """Builds (or reuses) the static agent for `arch`; the cache key covers source and compiler command."""
    command = [*compiler_command(arch), *CFLAGS]
    return compile_cached(agent_source(), command, name=arch, output="xtune-agent", what=f"the {arch} agent")


def _compile(cmd: list[str], what: str) -> None:
    env = dict(os.environ)
    if "ziglang" in cmd:
        env.setdefault("ZIG_GLOBAL_CACHE_DIR", str(cache_root() / "agents" / "zig-cache"))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BoardError(f"building {what} failed: {err}", BoardFault.AGENT_GONE) from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise BoardError(f"building {what} failed ({' '.join(cmd)}):\n{tail}", BoardFault.AGENT_GONE)
