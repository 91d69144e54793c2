"""Per-step time inside a whole network (`profile_model`, `xtune bench --model --profile`): the network
built with its profile entry (xtune/firmware/build.py, `build_model(profile=True)`), run on a wall-time
board through the agent, the counter readings between steps turned into seconds, and each tuned step set
beside its standalone latency in the tuning logs (what the task scheduler adds up as the network's estimate).

The counter's rate is not assumed: each run's span (last reading minus first) is divided by the wall time
the agent measured for that call, and the median of those rates converts ticks to seconds. A step's time
is the median over the runs of its ticks, so one preempted run does not move it.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xtune.boards.agent import RunRequest
from xtune.boards.board import Board
from xtune.boards.cost import WALL_UNITS, CostUnit
from xtune.errors import BoardError, InputError
from xtune.firmware.build import build_model
from xtune.firmware.entry import NetArtifact, check_profile, kernel_key, step_label
from xtune.firmware.network_bench import TIMEOUT_MS, check_finished, load_network, network_input
from xtune.frontend.load import Source
from xtune.ops.layout import DEFAULT, Layout, parse_layout
from xtune.ops.workload import Workload
from xtune.tuning.database import log_target, read_logs
from xtune.tuning.ranking import build_choice

PathLike = str | os.PathLike[str]
RUNS = 31  # profiled calls; a step's time is its median over them
# Calls run back to back before each profiled one, in the same request: between two requests the core idles
# for the host's round trip, and a call right after that ran up to 6x slower in its first steps (Zen 5,
# measured) than calls in a loop, which is how `xtune bench` times the network.
WARMUP = 3


@dataclass(frozen=True, kw_only=True)
class StepTime:
    """One step of the network's entry, as it ran in the network, and alone (the log's best), if tuned."""

    index: int
    label: str  # kind and ONNX node, e.g. "conv2d Conv_12" or "transpose->nhwc Conv_0"
    what: str  # the workload key, or the operator (the network build's table, firmware/build.py)
    seconds: float  # median over the runs, in the network
    standalone: float | None  # the tuning log's best latency of its workload on this target, if any

    @property
    def ratio(self) -> float | None:
        """In-network over standalone time: above 1, the step is slower in the network than tuned alone."""
        return self.seconds / self.standalone if self.standalone else None

    def as_dict(self) -> dict[str, object]:
        return {
            "index": self.index,
            "step": self.label,
            "what": self.what,
            "seconds": self.seconds,
            "standalone_seconds": self.standalone,
            "ratio": self.ratio,
        }


@dataclass(frozen=True, kw_only=True)
class NetProfile:
    model: str
    target: str
    board: str
    steps: tuple[StepTime, ...]
    seconds: float  # median span of a profiled call (first reading to last)
    ticks_per_second: float
    runs: int

    @property
    def estimate(self) -> float:
        """The sum of the tuned steps' standalone latencies (the scheduler's estimate of those steps)."""
        return sum(s.standalone for s in self.steps if s.standalone is not None)

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "target": self.target,
            "board": self.board,
            "runs": self.runs,
            "seconds": self.seconds,
            "ticks_per_second": self.ticks_per_second,
            "standalone_sum": self.estimate,
            "steps": [s.as_dict() for s in self.steps],
        }


def check_board(board: Board) -> None:
    """InputError in one line unless `board` can time a profile build: wall time on a target with a
    counter xtune reads (xtune/firmware/build.py, PROFILE_COUNTERS)."""
    if board.cost_unit is not CostUnit.SECONDS:
        raise InputError(
            f"{board.name}: --profile times steps in wall time, and this board measures "
            f"{board.cost_unit.value} (use a wall-time board, e.g. local)"
        )
    check_profile(board.target)


def profile_model(
    model: Source,
    board: Board,
    logs: Sequence[PathLike] = (),
    runs: int = RUNS,
    layout: str | Layout = DEFAULT,
) -> NetProfile:
    """Per-step times of `model` built for the board's target in `layout` with the best configs of `logs`,
    over `runs` calls on `board` (after one warm-up call)."""
    check_board(board)
    if runs < 1:
        raise InputError(f"--profile needs at least one run, got {runs}")
    artifact = build_model(model, board.target, logs, layout=parse_layout(layout), profile=True)
    ticks, seconds = _stamps(board, artifact, runs)
    spans = ticks.sum(axis=1)
    rate = statistics.median(float(t) / s for t, s in zip(spans, seconds, strict=True) if s > 0)
    best = _standalone(artifact, logs)
    keys = [kernel_key(call.kernel) for call in artifact.program.calls]
    steps = tuple(
        StepTime(
            index=i,
            label=step_label(call),
            what=key,
            seconds=float(np.median(ticks[:, i])) / rate,
            standalone=best.get(key),
        )
        for i, (call, key) in enumerate(zip(artifact.program.calls, keys, strict=True))
    )
    return NetProfile(
        model=artifact.model,
        target=board.target.name,
        board=board.name,
        steps=steps,
        seconds=float(np.median(spans)) / rate,
        ticks_per_second=rate,
        runs=runs,
    )


def _stamps(board: Board, artifact: NetArtifact, runs: int) -> tuple[np.ndarray, list[float]]:
    """Per run, the ticks of every step (runs x calls), and the wall seconds the agent timed for it."""
    count = len(artifact.program.calls) + 1
    rows: list[np.ndarray] = []
    seconds: list[float] = []
    with board.open() as session:
        image = load_network(session, artifact, network_input(artifact))
        entry = image.entry(artifact.profile_entry)
        session.set_buffer(3, bytes(8 * count))
        for i in range(runs + 1):  # the first run warms up: first touch of the workspace, caches
            reply = session.run(
                RunRequest(entry, (0, 1, 2, 3), number=1, repeat=1, warmup=WARMUP, timeout_ms=TIMEOUT_MS)
            )
            check_finished(reply, board, "the profiled network")
            if not reply.seconds:
                raise BoardError(f"{board.name}: the profiled network returned no timing", transient=False)
            stamps = np.frombuffer(session.read_buffer(3), np.uint64).astype(np.int64)
            if i:
                rows.append(np.diff(stamps))
                seconds.append(reply.seconds[0])
    ticks = np.array(rows)
    if np.any(ticks < 0):
        raise BoardError(
            f"{board.name}: the counter went backwards between steps (it migrated between cores "
            "whose counters differ?); pin the agent to one core",
            transient=False,
        )
    return ticks, seconds


def _standalone(artifact: NetArtifact, logs: Sequence[PathLike]) -> dict[str, float]:
    """Workload key -> the logs' best latency on the artifact's target, where one was timed in seconds."""
    if not logs:
        return {}
    records = read_logs(logs)
    kernels = {
        call.kernel.key: call.kernel for call in artifact.program.calls if isinstance(call.kernel, Workload)
    }
    best: dict[str, float] = {}
    for key, wl in kernels.items():  # a network calls many kernels more than once: each looked up once
        record = build_choice(records, key, log_target(wl, artifact.target))
        if record is not None and record.result.cost_unit in WALL_UNITS:
            best[key] = record.cost
    return best
