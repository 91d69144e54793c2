"""Boards: a board name in, a `Board` that opens agent sessions and describes its hardware out."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from functools import cache
from typing import Protocol

from xtune.agent import AgentSession, SubprocessTransport
from xtune.agent_build import agent_version, build_agent
from xtune.errors import BoardError, InputError
from xtune.target import Target, get_target, host_target

LOCAL_HELLO_TIMEOUT = 10.0  # seconds; also the margin added to every request's own timeout
QEMU_HELLO_TIMEOUT = 30.0  # qemu-user start-up is ~10 ms, but a loaded CI machine can be slow


class Board(Protocol):
    """Where kernels run: something that starts agents and can describe itself for the log."""

    name: str
    target: Target
    wall_time_is_meaningful: bool  # False under emulation: qemu wall time inverts rankings (MEASURED.md §3)

    def open(self) -> AgentSession: ...

    def fingerprint(self) -> dict[str, str]: ...


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key = line.split(":", 1)[0].strip()
                if key in ("model name", "uarch", "Model", "cpu model"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _uname() -> str:
    u = platform.uname()
    return f"{u.system} {u.release} {u.machine}"


class LocalBoard:
    """The host itself: the agent runs as a plain subprocess and timings are real."""

    wall_time_is_meaningful = True

    def __init__(self, target: Target, name: str = "local") -> None:
        self.name = name
        self.target = target

    def argv(self) -> list[str]:
        return [str(build_agent(self.target.arch))]

    def open(self) -> AgentSession:
        return AgentSession(SubprocessTransport(self.argv()), timeout=LOCAL_HELLO_TIMEOUT)

    def fingerprint(self) -> dict[str, str]:
        return {
            "board": self.name,
            "target": self.target.name,
            "uname": _uname(),
            "cpu": _cpu_model(),
            "cores": str(os.cpu_count() or 0),
            "agent": agent_version(),
        }


@cache
def _qemu_version(binary: str) -> str:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.splitlines()[0].strip() if out.stdout else "unknown"


class QemuBoard:
    """The agent under qemu-user: results are correct, but wall time is no performance signal."""

    wall_time_is_meaningful = False

    def __init__(self, name: str, target: Target) -> None:
        self.name = name
        self.target = target

    def _qemu(self) -> str:
        path = shutil.which(self.target.qemu_binary)
        if path is None:
            raise BoardError(
                f"board {self.name} needs {self.target.qemu_binary}: 'apt-get install qemu-user' provides it"
            )
        return path

    def argv(self) -> list[str]:
        agent = build_agent(self.target.arch)
        return [self._qemu(), "-cpu", self.target.qemu_cpu, str(agent)]

    def open(self) -> AgentSession:
        return AgentSession(SubprocessTransport(self.argv()), timeout=QEMU_HELLO_TIMEOUT)

    def fingerprint(self) -> dict[str, str]:
        return {
            "board": self.name,
            "target": self.target.name,
            "uname": f"{_uname()} (emulated {self.target.arch})",
            "cpu": f"{_qemu_version(self._qemu())} -cpu {self.target.qemu_cpu}",
            "cores": "1",
            "agent": agent_version(),
        }


_QEMU_BOARDS = {"qemu-aarch64": "arm-a72-neon", "qemu-riscv64": "riscv64-gc", "qemu-riscv64-v": "riscv64-gcv"}


def board_names() -> list[str]:
    """Built-in board names, for `xtune boards` and error messages."""
    return ["local", *_QEMU_BOARDS]


def get_board(name: str) -> Board:
    """A built-in board by name: "local" or one of the qemu-user boards."""
    if name == "local":
        return LocalBoard(host_target())
    if name in _QEMU_BOARDS:
        return QemuBoard(name, get_target(_QEMU_BOARDS[name]))
    raise InputError(f"unknown board '{name}' (known: {', '.join(board_names())})")
