"""Whole networks on a board: an ONNX model, a board and tuning logs in; the network object built for the
board's target, run through the agent on a seeded random input, checked against ONNX Runtime's output on
the same input, and timed (`bench_model`, `xtune bench --model`): wall time on the local board, beside ONNX
Runtime's on one thread in the same run; the instruction count of one inference on QEMU boards.

Correctness uses the rule every kernel check uses (xtune.workload.check_output): max |got - ref| <=
RTOL * max(1, max |ref|), RTOL = 1e-4. Over a whole network the error of float32 accumulation in another
order grows with depth, but stays far below that: 2e-7 to 1.2e-6 of the output's largest magnitude on the
small and full ResNet-18 and MobileNetV2 (measured on x86-avx512), while a wrong weight, layout or
workspace offset gives errors of the output's own size.
"""

from __future__ import annotations

import os
import statistics
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xtune.boards.agent import AgentSession, RunReply, RunRequest, RunStatus
from xtune.boards.board import Board, InsnCountingSession
from xtune.boards.cost import CostUnit
from xtune.codegen.compile import ObjectCode
from xtune.codegen.link import FlatImage, link_flat
from xtune.errors import BoardError, InputError
from xtune.netbuild import NetArtifact, build_model
from xtune.network.graph import Source, load_model
from xtune.network.layout import DEFAULT, Layout, parse_layout
from xtune.peers import ort_available, ort_network
from xtune.workload import RTOL, check_output

PathLike = str | os.PathLike[str]
SEED = 0  # of the random input, so that a run can be repeated
TIMEOUT_MS = 600_000  # one inference under qemu-user can take minutes on a loaded machine


@dataclass(frozen=True, kw_only=True)
class NetBenchReport:
    model: str
    target: str
    board: str
    layout: str  # the layout the network ran in (xtune/network/layout.py)
    correct: bool
    error: str  # why not correct; "" when it is
    max_abs_error: float  # against ONNX Runtime
    cost_unit: CostUnit
    seconds: float | None  # median per inference on the board (wall-time boards)
    instructions: float | None  # per inference (QEMU boards with the instruction counter)
    cycles: float | None  # estimated per inference (QEMU cycles boards, llvm-mca's model)
    ort_seconds: float | None  # ONNX Runtime on this host, one thread, same run (wall-time boards only)
    workspace_bytes: int
    kernels: int
    defaults: int  # tasks built from their template's default config

    @property
    def ratio_vs_ort(self) -> float | None:
        """ONNX Runtime's time over ours: above 1, xtune is faster."""
        return self.ort_seconds / self.seconds if self.seconds and self.ort_seconds else None

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.model, "target": self.target, "board": self.board, "layout": self.layout,
            "correct": self.correct,
            "error": self.error, "max_abs_error": self.max_abs_error, "cost_unit": self.cost_unit.value,
            "seconds": self.seconds, "instructions": self.instructions, "cycles": self.cycles,
            "ort_seconds": self.ort_seconds,
            "speedup_vs_ort": self.ratio_vs_ort, "workspace_bytes": self.workspace_bytes,
            "kernels": self.kernels, "default_configs": self.defaults,
        }  # fmt: skip


REFERENCE_MAGIC = b"XTNETREF"


def reference_file(artifact: NetArtifact, model: Source) -> bytes:
    """What `xtune build --model --reference` writes for a firmware's self-test (examples/network): the
    seeded random input and ONNX Runtime's output for it. Little-endian: 8 bytes "XTNETREF", u32 version 1,
    u32 the build id (the header's), u64 input floats, u64 output floats, then both arrays as float32."""
    x = random_input(artifact.program.input_shape)
    ref, _ = ort_network(load_model(model).SerializeToString(), x)
    head = REFERENCE_MAGIC + struct.pack("<IIQQ", 1, artifact.build_id, x.size, ref.size)
    return head + x.astype("<f4").tobytes() + ref.astype("<f4").tobytes()


def random_input(shape: tuple[int, ...], seed: int = SEED) -> np.ndarray:
    """The input every network check feeds: uniform in [-1, 1), float32."""
    return np.random.default_rng(seed).uniform(-1, 1, shape).astype(np.float32)


def load_network(session: AgentSession, artifact: NetArtifact, x: np.ndarray) -> FlatImage:
    """Link the network's object, load it into `session` and set its entries' buffers: 0 the input `x`,
    1 the output (NaN: an element never written shows), 2 the workspace. Returns the image (its entries)."""
    image = link_flat(ObjectCode(artifact.target.name, artifact.target.arch, artifact.object,
                                 artifact.entry_points))  # fmt: skip
    session.load_image(image.code)
    session.set_buffer(0, np.ascontiguousarray(x, dtype=np.float32).tobytes())
    session.set_buffer(1, np.full(artifact.program.output_shape, np.nan, np.float32).tobytes())
    session.set_buffer(2, bytes(max(64, artifact.workspace_bytes)))
    return image


def run_network(
    board: Board, artifact: NetArtifact, x: np.ndarray, repeat: int = 0
) -> tuple[np.ndarray, float]:
    """The network's output on `board` for input `x` (one checked call), and with `repeat` its cost per
    inference in the board's unit (median seconds, or the instruction or cycle count of one call; nan for
    none)."""
    with board.open() as session:
        entry = load_network(session, artifact, x).entry(artifact.entry)
        reply = session.run(RunRequest.check(entry, (0, 1, 2), timeout_ms=TIMEOUT_MS))
        check_finished(reply, board)
        got = np.frombuffer(session.read_buffer(1), np.float32).reshape(artifact.program.output_shape).copy()
        cost = float("nan")
        if isinstance(session, InsnCountingSession) and session.last_cost is not None:
            cost = session.last_cost  # the check-only call is one inference (deterministic)
        if repeat and board.cost_unit is CostUnit.SECONDS:
            timed = session.run(RunRequest(entry, (0, 1, 2), number=1, repeat=repeat, warmup=1,
                                           timeout_ms=TIMEOUT_MS))  # fmt: skip
            check_finished(timed, board)
            cost = statistics.median(timed.seconds)
    return got, cost


def check_finished(reply: RunReply, board: Board, what: str = "the network") -> None:
    """BoardError (not transient: the same call would fail again) unless the network's call returned."""
    if reply.status is not RunStatus.OK:
        why = f"signal {reply.signal}" if reply.status is RunStatus.SIGNAL else reply.status.value
        raise BoardError(f"{board.name}: {what} did not finish ({why})", transient=False)


def bench_model(
    model: Source,
    board: Board,
    logs: Sequence[PathLike] = (),
    repeat: int = 5,
    layout: str | Layout = DEFAULT,
) -> NetBenchReport:
    """Build `model` for the board's target in `layout`, run it on `board`, check it against ONNX Runtime,
    time both."""
    where = parse_layout(layout)
    if not ort_available():
        raise InputError("checking a network needs ONNX Runtime: pip install 'xtune[bench]'")
    artifact = build_model(model, board.target, logs, layout=where)
    x = random_input(artifact.program.input_shape)
    got, cost = run_network(board, artifact, x, repeat)
    serialized = load_model(model).SerializeToString()
    wall = board.cost_unit is CostUnit.SECONDS
    ref, ort_times = ort_network(serialized, x, repeat if wall else 0)
    mismatch = check_output(got, ref, RTOL)
    error = float(np.max(np.abs(got - ref))) if np.all(np.isfinite(got)) else float("inf")
    return NetBenchReport(
        model=artifact.model, target=board.target.name, board=board.name, layout=where.value,
        correct=not mismatch,
        error=mismatch, max_abs_error=error, cost_unit=board.cost_unit,
        seconds=cost if wall and not mismatch else None,
        instructions=cost if board.cost_unit is CostUnit.INSTRUCTIONS and not mismatch else None,
        cycles=cost if board.cost_unit is CostUnit.CYCLES and not mismatch else None,
        ort_seconds=statistics.median(ort_times) if ort_times else None,
        workspace_bytes=artifact.workspace_bytes, kernels=len(artifact.kernels),
        defaults=sum(k.source == "default" for k in artifact.kernels),
    )  # fmt: skip
