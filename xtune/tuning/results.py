"""What a model's tuning run reports: how each task and the run stopped, each task's result, the run's
result (its curve of the end-to-end estimate included), and the progress handed out after each batch
(xtune/tuning/task_scheduler.py makes them; the CLI prints them)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import Enum

from xtune.boards.cost import CostUnit
from xtune.tuning.allocation import Strategy
from xtune.tuning.loop import TuneProgress


class TaskStop(Enum):
    RUNNING = "running"  # still had budget to claim when the run ended
    EXHAUSTED = "exhausted"  # every config of its space measured
    EARLY_STOPPING = "early_stopping"  # TuneOptions.early_stopping trials without improvement
    NO_CORRECT_CONFIG = "no_correct_config"  # its first round found none (it keeps its +inf latency)


class ModelStop(Enum):
    TRIALS = "trials"  # the budget is spent
    TASKS_DONE = "tasks_done"  # every task stopped on its own before the budget was spent
    INTERRUPTED = "interrupted"  # Ctrl-C: every finished batch is in the log
    BOARD_FAILED = "board_failed"  # a board failed for good (docs/boards.md, "Faults"); the result's error


@dataclass(frozen=True, kw_only=True)
class TaskResult:
    workload: str
    nodes: tuple[str, ...]
    flops: float  # per call
    trials: int  # measured in this run
    resumed: int  # configs already in the log, not measured again
    batches: int  # given to it in this run
    best_index: int | None  # over the log's history and this run
    best_knobs: tuple[tuple[str, object], ...]
    best_cost: float  # its median timing (or instructions), +inf if none is correct
    best_timings: int
    default_cost: float  # of the template's default config, +inf if not measured
    stop: TaskStop

    @property
    def count(self) -> int:
        return len(self.nodes)

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d.update(count=self.count, stop=self.stop.value, best_knobs=dict(self.best_knobs))
        d.update(best_cost=_finite(self.best_cost), default_cost=_finite(self.default_cost))
        return d


@dataclass(frozen=True, kw_only=True)
class ModelTuningResult:
    model: str
    target: str
    boards: tuple[str, ...]
    strategy: Strategy
    budget: int
    trials: int  # measured in this run (confirming timings not counted)
    confirm_timings: int
    cost_unit: CostUnit  # what the boards measure
    estimate: float  # Σ count × best_cost: the estimated end-to-end latency
    default_estimate: float  # Σ count × default_cost
    tasks: tuple[TaskResult, ...]
    curve: tuple[tuple[int, float], ...]  # (trials spent in this run, estimate), once the estimate is finite
    stop: ModelStop
    seconds: float
    error: str = ""  # why the run stopped, when a board failed for good (stop BOARD_FAILED)

    def as_dict(self) -> dict[str, object]:
        return {
            "model": self.model,
            "target": self.target,
            "boards": list(self.boards),
            "strategy": self.strategy.value,
            "budget": self.budget,
            "trials": self.trials,
            "confirm_timings": self.confirm_timings,
            "cost_unit": self.cost_unit.value,
            "estimate": _finite(self.estimate),
            "default_estimate": _finite(self.default_estimate),
            "tasks": [t.as_dict() for t in self.tasks],
            "curve": [[n, _finite(e)] for n, e in self.curve],
            "stop": self.stop.value,
            "seconds": round(self.seconds, 3),
            "error": self.error,
        }


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


@dataclass(frozen=True, kw_only=True)
class ModelProgress:
    """Handed to the progress callback after each batch."""

    task: int  # index of the task the batch was for
    batch: TuneProgress
    trials: int  # measured in this run, every task
    budget: int
    latencies: tuple[float, ...]  # every task's best latency (+inf while it has none)
    estimate: float
