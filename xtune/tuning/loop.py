"""The tuning loop: a tuner and a measure function in, batches proposed, measured, learned from and
reported, and a `TuneSummary` (best config, best-so-far curve, counts by status, why it stopped) out."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum

from xtune.errors import InputError
from xtune.tuning.measure import MeasureResult, MeasureStatus
from xtune.tuning.tuner import Tuner


class StopReason(Enum):
    TRIALS = "trials"  # the budget measured
    EXHAUSTED = "exhausted"  # every config of the space measured
    EARLY_STOPPING = "early_stopping"  # `early_stopping` trials without improvement
    INTERRUPTED = "interrupted"  # KeyboardInterrupt (Ctrl-C) during measuring or a callback
    BOARD_FAILED = "board_failed"  # a board failed for good (docs/boards.md, "Faults"): a callback said so


class StopTuning(Exception):
    """Raised by a callback to end the loop after the batch it was handed (which is kept)."""

    def __init__(self, reason: StopReason) -> None:
        super().__init__(reason.value)
        self.reason = reason


@dataclass(frozen=True)
class TuneProgress:
    """Handed to every callback after each measured batch."""

    batch: tuple[int, ...]  # config indices measured in this batch
    results: tuple[MeasureResult, ...]  # their results, same order
    trials: int  # measured so far, this batch included
    budget: int  # new trials the run may measure (TuneOptions.trials)
    best_index: int | None  # None until a config measured OK
    best_cost: float  # +inf until a config measured OK
    since_improvement: int  # trials since best_cost last fell (all trials while nothing was OK)


@dataclass(frozen=True)
class TuneSummary:
    best_index: int | None
    best_cost: float
    trials: int
    curve: tuple[float, ...]  # best-so-far cost after each trial (+inf before the first OK)
    counts: tuple[tuple[MeasureStatus, int], ...]  # trials by status, every status listed
    stop: StopReason
    seconds: float  # wall time of the whole loop
    tuner_seconds: float  # of which proposing and learning (model fit + search)

    @property
    def interrupted(self) -> bool:
        return self.stop is StopReason.INTERRUPTED

    def count(self, status: MeasureStatus) -> int:
        return dict(self.counts)[status]


@dataclass
class _Loop:
    """The loop's mutable state; every field is consistent after each `record` returns."""

    best_index: int | None = None
    best_cost: float = math.inf
    since_improvement: int = 0
    curve: list[float] = field(default_factory=list)
    counts: dict[MeasureStatus, int] = field(default_factory=lambda: dict.fromkeys(MeasureStatus, 0))

    def record(self, batch: Sequence[int], results: Sequence[MeasureResult]) -> None:
        # Compute into locals, then assign together: a Ctrl-C lands either before or after a whole batch.
        curve, counts = list(self.curve), dict(self.counts)
        best_index, best_cost, since = self.best_index, self.best_cost, self.since_improvement
        for index, result in zip(batch, results, strict=True):
            counts[result.status] += 1
            if result.ok and result.cost < best_cost:
                best_index, best_cost, since = index, result.cost, 0
            else:
                since += 1
            curve.append(best_cost)
        self.best_index, self.best_cost, self.since_improvement = best_index, best_cost, since
        self.curve, self.counts = curve, counts


class TuneLoop:
    """A tuning loop advanced one batch at a time: `step` proposes, measures, learns and reports one batch.

    `tune` runs one to the end; a task scheduler (xtune.tuning.task_scheduler) keeps one per task and steps
    whichever task it chooses, so every task's tuner keeps learning across its batches."""

    def __init__(
        self,
        tuner: Tuner,
        measure_batch: Callable[[list[int]], list[MeasureResult]],
        callbacks: Sequence[Callable[[TuneProgress], None]] = (),
    ) -> None:
        self.tuner, self.measure_batch, self.callbacks = tuner, measure_batch, list(callbacks)
        self.state = _Loop()
        self.tuner_seconds = 0.0

    @property
    def trials(self) -> int:
        return len(self.state.curve)

    def step(self, n: int, budget: int = 0) -> TuneProgress | None:
        """Measure one batch of at most `n` configs; None when the space is exhausted. `budget` is the
        run's budget, passed on to the callbacks. A KeyboardInterrupt while measuring propagates and the
        batch is dropped (neither given to the tuner nor to callbacks); in a callback, the batch is kept,
        as it is when a callback raises StopTuning (which propagates too: `run_loop` stops on it)."""
        if not self.tuner.has_next():
            return None
        t0 = time.perf_counter()
        batch = self.tuner.next_batch(n)
        self.tuner_seconds += time.perf_counter() - t0
        if not batch:
            return None
        results = list(self.measure_batch(list(batch)))
        if len(results) != len(batch):
            raise InputError(f"measure_batch returned {len(results)} results for {len(batch)} configs")
        t0 = time.perf_counter()
        self.tuner.update(batch, results)
        self.tuner_seconds += time.perf_counter() - t0
        self.state.record(batch, results)
        state = self.state
        progress = TuneProgress(
            tuple(batch),
            tuple(results),
            self.trials,
            budget,
            state.best_index,
            state.best_cost,
            state.since_improvement,
        )
        for callback in self.callbacks:
            callback(progress)
        return progress

    def summary(self, stop: StopReason, seconds: float) -> TuneSummary:
        state = self.state
        return TuneSummary(
            state.best_index,
            state.best_cost,
            len(state.curve),
            tuple(state.curve),
            tuple(state.counts.items()),
            stop,
            seconds,
            self.tuner_seconds,
        )


def tune(
    tuner: Tuner,
    measure_batch: Callable[[list[int]], list[MeasureResult]],
    budget: int,
    batch_size: int,
    early_stopping: int | None = None,
    callbacks: Sequence[Callable[[TuneProgress], None]] = (),
) -> TuneSummary:
    """Propose, measure, learn, report, until `budget`, the space is exhausted, or early stopping.

    Ctrl-C (KeyboardInterrupt) while measuring or in a callback ends the loop and returns the summary of
    every batch measured so far with `stop=INTERRUPTED` (a batch interrupted mid-measurement is dropped:
    it was neither given to the tuner nor to callbacks). The caller decides what to do next, e.g. print the
    best so far and exit 130. A callback that raises StopTuning ends the loop with its reason, the batch
    it was handed kept."""
    return run_loop(TuneLoop(tuner, measure_batch, callbacks), budget, batch_size, early_stopping)


def run_loop(loop: TuneLoop, budget: int, batch_size: int, early_stopping: int | None = None) -> TuneSummary:
    """`tune` over a loop built by the caller (xtune.tuning.session): `budget` more trials."""
    if budget < 0 or batch_size < 1:
        raise InputError(f"need budget >= 0 and batch_size >= 1 (got {budget}, {batch_size})")
    start = time.perf_counter()
    stop = StopReason.TRIALS
    first = loop.trials
    try:
        while loop.trials - first < budget:
            progress = loop.step(min(batch_size, budget - (loop.trials - first)), budget)
            if progress is None:
                stop = StopReason.EXHAUSTED
                break
            if early_stopping is not None and progress.since_improvement >= early_stopping:
                stop = StopReason.EARLY_STOPPING
                break
    except KeyboardInterrupt:
        stop = StopReason.INTERRUPTED
    except StopTuning as request:
        stop = request.reason
    return loop.summary(stop, time.perf_counter() - start)
