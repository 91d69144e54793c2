"""Agent builds: an architecture name in, the path of a cached static `xtune-agent` binary out."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path

from xtune.errors import BoardError, BoardFault

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


def _host_arch() -> str:
    machine = platform.machine()
    return {"AMD64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def compiler_command(arch: str) -> list[str]:
    """The compiler invocation (without flags and files) that builds a static agent for `arch`."""
    if arch not in ARCHES:
        raise BoardError(
            f"no agent build for architecture '{arch}' (known: {', '.join(ARCHES)})", BoardFault.AGENT_GONE
        )
    if arch == _host_arch():
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


def _cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "xtune" / "agents"


def build_agent(arch: str) -> Path:
    """Builds (or reuses) the static agent for `arch`; the cache key covers source and compiler command."""
    source = agent_source()
    cc = compiler_command(arch)
    key = hashlib.sha256(source + b"\0" + " ".join([*cc, *CFLAGS]).encode()).hexdigest()[:12]
    out = _cache_root() / f"{arch}-{key}" / "xtune-agent"
    if out.is_file():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="xtune-agent-") as tmp:
        src = Path(tmp) / "agent.c"
        src.write_bytes(source)
        # Compile to a private name beside the target, then rename: two builders never see a half file.
        fd, partial = tempfile.mkstemp(prefix=".xtune-agent.", dir=out.parent)
        os.close(fd)
        try:
            _compile([*cc, *CFLAGS, "-o", partial, str(src)], arch)
            os.chmod(partial, 0o755)
            os.replace(partial, out)
        finally:
            if os.path.exists(partial):
                os.unlink(partial)
    return out


def _compile(cmd: list[str], arch: str) -> None:
    env = dict(os.environ)
    if "ziglang" in cmd:
        env.setdefault("ZIG_GLOBAL_CACHE_DIR", str(_cache_root() / "zig-cache"))
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        raise BoardError(f"building the {arch} agent failed: {err}", BoardFault.AGENT_GONE) from None
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip()[-2000:]
        raise BoardError(
            f"building the {arch} agent failed ({' '.join(cmd)}):\n{tail}", BoardFault.AGENT_GONE
        )
