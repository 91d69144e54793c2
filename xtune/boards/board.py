"""Boards: a board name in, a `Board` that opens agent sessions and describes its hardware out."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import tempfile
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Protocol

from xtune.boards import agent_build
from xtune.boards.agent import AgentSession, RunReply, RunRequest, SubprocessTransport, Transport
from xtune.boards.agent_build import agent_version, build_agent
from xtune.boards.config import load_boards
from xtune.boards.cost import CostUnit
from xtune.boards.cycles import BlockCycles, BlockRun, CycleModel, cycle_model, parse_block_line, total_cycles
from xtune.errors import BoardError, BoardFault, InputError
from xtune.target import Target, get_target, host_cannot_run, host_cpu_identity, host_target

LOCAL_HELLO_TIMEOUT = 10.0  # seconds; also the margin added to every request's own timeout
QEMU_HELLO_TIMEOUT = 30.0  # qemu-user start-up is ~10 ms, but a loaded CI machine can be slow
# A QEMU board stretches every call's deadline by this. The deadline (--timeout-ms) is set for a native
# call and only guards against hangs; under TCG a NEON or RVV kernel runs many times slower, and the
# counting plugin's callback on every executed block slower still (a ResNet-18 3x3 conv2d takes about
# 1.5 s of CPU per call on qemu-aarch64-cycles, and its candidates were killed at the native 10 s once
# the host's load average reached 20). What these boards record does not depend on how long a call took,
# so a deadline that the host's load decides would drop configs for no reason of their own.
EMULATED_DEADLINE_FACTOR = 30


class Board(Protocol):
    """Where kernels run: something that starts agents and can describe itself for the log."""

    name: str
    target: Target
    # What it measures, the one decision (xtune/boards/cost.py): SECONDS, the Measurer times the kernel;
    # INSTRUCTIONS or CYCLES, open() gives an InsnCountingSession whose `last_cost` is the figure; NONE,
    # the board checks correctness only.
    cost_unit: CostUnit

    def open(self) -> AgentSession: ...

    def fingerprint(self) -> dict[str, str]: ...


def _uname() -> str:
    u = platform.uname()
    return f"{u.system} {u.release} {u.machine}"


def _host_target_name() -> str:
    try:
        return host_target().name
    except InputError:
        return "unknown"


class LocalBoard:
    """The host itself: the agent runs as a plain subprocess and timings are real."""

    cost_unit = CostUnit.SECONDS

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
            "target": self.target.name,  # may be narrower than the host's own (e.g. x86-sse42 on AVX2)
            "host_target": _host_target_name(),
            "uname": _uname(),
            "cpu": host_cpu_identity(),
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


# Guest code below this address is the static agent (gcc links it at 0x400000, zig at 0x1000000);
# qemu-user 7.2 maps guest mmaps, hence the kernel image, from 0x5500000000 up (docs/emulated-costs.md).
INSN_MIN_VADDR = 0x1000000000


def insn_plugin_command() -> list[str]:
    """The host compiler and flags the instruction-count plugin is built with (a shared object for qemu)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        raise BoardError(
            "the QEMU instruction-count plugin needs a host C compiler: apt-get install gcc",
            BoardFault.AGENT_GONE,
        )
    return [cc, "-shared", "-fPIC", "-O2"]


def build_insn_plugin() -> Path:
    """The TCG plugin counting kernel instructions (board_agent/insncount.c), built once with host gcc."""
    source = (resources.files("xtune") / "agent_src" / "insncount.c").read_bytes()
    return agent_build.compile_cached(
        source,
        insn_plugin_command(),
        name="insncount",
        output="libxtune-insncount.so",
        what="the QEMU instruction-count plugin",
    )


class InsnCountingSession(AgentSession):
    """An agent under qemu with the insncount plugin: after each run, the run child's instruction count.

    The plugin appends "pid count" when a guest process exits, which for a run child happens before
    the agent's waitpid() returns, so the line is in the file when the RUN reply arrives. `last_cost` is
    the board's figure for that run (here the count; `CycleCountingSession` makes it cycles)."""

    def __init__(self, transport: Transport, timeout: float, counts: Path) -> None:
        self._counts = counts
        self._offset = 0
        self.last_insn_count: int | None = None  # of the last OK run: every call of it, warm-ups included
        self.last_blocks: tuple[BlockRun, ...] = ()  # its translation blocks, when the plugin records them
        super().__init__(transport, timeout, EMULATED_DEADLINE_FACTOR)

    @property
    def last_cost(self) -> float | None:
        return None if self.last_insn_count is None else float(self.last_insn_count)

    def run(self, req: RunRequest) -> RunReply:
        self.last_insn_count, self.last_blocks = None, ()
        reply = super().run(req)
        with open(self._counts, "rb") as f:
            f.seek(self._offset)
            lines = [line.split() for line in f.read().splitlines()]
            self._offset = f.tell()
        mine = str(self.hello.pid).encode()
        ends = [i for i, words in enumerate(lines) if len(words) == 2 and words[0] != mine]
        if not ends:
            return reply
        end = ends[-1]
        child = lines[end][0]
        if lines[end][1] == b"lost":
            raise BoardError("the QEMU plugin ran out of memory recording the blocks", BoardFault.AGENT)
        # A process's record is one write: its block lines directly precede its count line.
        start = end
        while start > 0 and lines[start - 1][:2] == [child, b"b"]:
            start -= 1
        self.last_blocks = tuple(parse_block_line(words) for words in lines[start:end])
        self.last_insn_count = int(lines[end][1])
        return reply

    def close(self) -> None:
        try:
            super().close()
        finally:
            self._counts.unlink(missing_ok=True)


class CycleCountingSession(InsnCountingSession):
    """The counting session of a cycles board: the plugin records blocks, and after each run llvm-mca
    costs them against the image loaded last (docs/emulated-costs.md, "The cycle model")."""

    def __init__(self, transport: Transport, timeout: float, counts: Path, model: CycleModel) -> None:
        self.model = model
        self._image, self._base = b"", 0
        self.last_cycles: float | None = None
        self.last_block_cycles: tuple[BlockCycles, ...] = ()
        super().__init__(transport, timeout, counts)

    @property
    def last_cost(self) -> float | None:
        return self.last_cycles

    def load_image(self, image: bytes) -> int:
        self._base = super().load_image(image)
        self._image = image
        return self._base

    @property
    def image_base(self) -> int:
        """Where the agent loaded the image loaded last: a block's offset in it is its vaddr less this."""
        return self._base

    def block_bytes(self, block: BlockRun) -> bytes:
        """The machine code of one of `last_blocks` (from the image loaded last)."""
        start = block.vaddr - self._base
        return self._image[start : start + block.size]

    def run(self, req: RunRequest) -> RunReply:
        self.last_cycles, self.last_block_cycles = None, ()
        reply = super().run(req)
        if self.last_insn_count is not None:
            self.last_block_cycles = tuple(self.model.costs(self._image, self._base, self.last_blocks))
            self.last_cycles = total_cycles(self.last_blocks, self.last_block_cycles)
        return reply


class QemuBoard:
    """The agent under qemu-user: results are correct, but wall time is no performance signal.

    `cost` is what it records (docs/emulated-costs.md): INSTRUCTIONS (the default), the number of
    instructions one kernel call executes, counted by a TCG plugin; CYCLES, llvm-mca's estimate for the
    blocks the plugin saw run (the target's `mca_cpu` model); NONE, correctness only (emulated wall time
    ranks nothing). Counts and estimates are deterministic, unlike emulated wall time."""

    def __init__(self, name: str, target: Target, cost: CostUnit = CostUnit.INSTRUCTIONS) -> None:
        if cost is CostUnit.SECONDS:
            raise ValueError("a QEMU board's wall time is no cost (docs/emulated-costs.md)")
        self.name = name
        self.target = target
        self.cost_unit: CostUnit = cost

    def problem(self) -> str | None:
        """Why this board cannot measure (its cycle model cannot be had), or None."""
        if self.cost_unit is not CostUnit.CYCLES:
            return None
        try:
            cycle_model(self.target)
        except InputError as err:
            return f"board {self.name}: {err}"
        return None

    def _qemu(self) -> str:
        path = shutil.which(self.target.qemu_binary)
        if path is None:
            raise BoardError(
                f"board {self.name} needs {self.target.qemu_binary}: 'apt-get install qemu-user' provides it",
                BoardFault.AGENT_GONE,
            )
        return path

    def argv(self, counts: Path | None = None) -> list[str]:
        agent = build_agent(self.target.arch)
        plugin = []
        if counts is not None:
            # -plugin splits its argument at commas: the counts path must not contain one (mkstemp's won't).
            blocks = ",blocks=1" if self.cost_unit is CostUnit.CYCLES else ""
            plugin = ["-plugin", f"{build_insn_plugin()},min={INSN_MIN_VADDR:#x},out={counts}{blocks}"]
        return [self._qemu(), "-cpu", self.target.qemu_cpu, *plugin, str(agent)]

    def open(self) -> AgentSession:
        if self.cost_unit is CostUnit.NONE:
            return AgentSession(
                SubprocessTransport(self.argv()), QEMU_HELLO_TIMEOUT, EMULATED_DEADLINE_FACTOR
            )
        model = cycle_model(self.target) if self.cost_unit is CostUnit.CYCLES else None
        fd, name = tempfile.mkstemp(prefix="xtune-insn-", suffix=".txt")
        os.close(fd)
        counts = Path(name)
        try:
            transport = SubprocessTransport(self.argv(counts))
            if model is not None:
                return CycleCountingSession(transport, QEMU_HELLO_TIMEOUT, counts, model)
            return InsnCountingSession(transport, QEMU_HELLO_TIMEOUT, counts)
        except BaseException:
            counts.unlink(missing_ok=True)
            raise

    def fingerprint(self) -> dict[str, str]:
        return {
            "board": self.name,
            "target": self.target.name,
            "uname": f"{_uname()} (emulated {self.target.arch})",
            "cpu": f"{_qemu_version(self._qemu())} -cpu {self.target.qemu_cpu}",
            "cores": "1",
            "agent": agent_version(),
            # database.logged_unit reads failures of older logs (all logged as "s") back by this key.
            "cost": self._cost_text(),
        }

    def _cost_text(self) -> str:
        if self.cost_unit is CostUnit.CYCLES:
            return f"cycles per call ({cycle_model(self.target).describe()} over the plugin's blocks)"
        if self.cost_unit is CostUnit.INSTRUCTIONS:
            return "instructions per call (insncount plugin)"
        return "correctness only"


# Built-in emulated boards: name -> (target, what it records). A "-cycles" board is the same emulator
# costing the same run in cycles: a name of its own, because the unit is the board's (every record and
# `xtune boards` show it) and a log never compares figures of two units.
_QEMU_BOARDS = {
    "qemu-aarch64": ("arm-a72-neon", CostUnit.INSTRUCTIONS),
    "qemu-aarch64-dotprod": ("arm-a76-dotprod", CostUnit.INSTRUCTIONS),
    "qemu-riscv64": ("riscv64-gc", CostUnit.INSTRUCTIONS),
    "qemu-riscv64-v": ("riscv64-gcv", CostUnit.INSTRUCTIONS),
    "qemu-aarch64-cycles": ("arm-a72-neon", CostUnit.CYCLES),
    "qemu-aarch64-dotprod-cycles": ("arm-a76-dotprod", CostUnit.CYCLES),
    "qemu-riscv64-cycles": ("riscv64-gc", CostUnit.CYCLES),
    "qemu-riscv64-v-cycles": ("riscv64-gcv", CostUnit.CYCLES),
}


def board_names(boards_file: Path | None = None) -> list[str]:
    """Built-in board names, then the SSH boards of boards.toml (see config.find_boards_file)."""
    return ["local", *_QEMU_BOARDS, *load_boards(boards_file)]


def get_board(
    name: str, boards_file: Path | None = None, target: str | None = None, check: bool = True
) -> Board:
    """A board by name: "local", one of the qemu-user boards, or an SSH board from boards.toml.

    `target` picks the code the local board runs (any target this host can execute, e.g. x86-sse42 on an
    AVX2 host); for any other board it must be the board's own target. With `check`, a board that cannot
    measure (a cycles board without its llvm-mca model) is an InputError here, before any work starts."""
    if name == "local":
        return LocalBoard(local_target(target))
    if name in _QEMU_BOARDS:
        target_name, unit = _QEMU_BOARDS[name]
        qemu = QemuBoard(name, get_target(target_name), unit)
        why = qemu.problem() if check else None
        if why is not None:
            raise InputError(why)
        board: Board = qemu
    else:
        configs = load_boards(boards_file)
        if name not in configs:
            raise InputError(f"unknown board '{name}' (known: {', '.join(board_names(boards_file))})")
        # paramiko (a fifth of a second of imports) only for an SSH board: local and qemu runs, and the
        # commands that merely read logs through this module (`xtune tasks`), never load it.
        from xtune.boards.ssh import SshBoard

        board = SshBoard(configs[name], get_target(configs[name].target))
    if target is not None and get_target(target) != board.target:
        raise InputError(
            f"board '{name}' runs {board.target.name} code; --target {target} is only for the local board"
        )
    return board


def local_target(name: str | None = None) -> Target:
    """The target the local board runs: the host's own by default, or `name` if this host can execute it."""
    if name is None:
        return host_target()
    target = get_target(name)
    why = host_cannot_run(target)
    if why is not None:
        raise InputError(f"the local board cannot run {target.name}: {why}")
    return target
