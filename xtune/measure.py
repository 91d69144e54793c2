"""Measurement: candidates (workload, target, config) in, checked and timed `MeasureResult`s out."""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from enum import Enum


class MeasureStatus(Enum):
    OK = "ok"
    COMPILE_ERROR = "compile_error"
    LINK_ERROR = "link_error"
    RUNTIME_ERROR = "runtime_error"  # the kernel died by a signal
    TIMEOUT = "timeout"
    WRONG_ANSWER = "wrong_answer"
    BOARD_ERROR = "board_error"  # the board or its connection failed; the candidate itself may be fine


@dataclass(frozen=True)
class MeasureOptions:
    """How a board times a candidate; written into the log with every result."""

    number: int = 1  # calls per repeat (raised by the agent until a repeat lasts min_repeat_ms)
    repeat: int = 3
    min_repeat_ms: float = 10.0
    warmup: int = 1
    timeout_ms: int = 10_000
    flush_cache: bool = False
    rtol: float = 1e-4  # relative to the reference's max magnitude times sqrt(reduction length)


@dataclass(frozen=True)
class MeasureResult:
    status: MeasureStatus
    costs: tuple[float, ...] = ()  # seconds per call, one per repeat
    error: str = ""
    compile_seconds: float = 0.0
    cost_unit: str = "s"  # "s" for wall time, "insn" for QEMU instruction counts
    extra: tuple[tuple[str, float], ...] = field(default=())

    @property
    def ok(self) -> bool:
        return self.status is MeasureStatus.OK

    @property
    def cost(self) -> float:
        """The figure of merit: median repeat cost; +inf for anything that is not OK."""
        return statistics.median(self.costs) if self.ok and self.costs else float("inf")
