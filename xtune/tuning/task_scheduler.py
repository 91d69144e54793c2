"""The task scheduler: a network's tasks, boards and one trial budget in; every task tuned (one
`TuningSession` each, every batch appended to the log) and the model's estimated end-to-end latency out.

A first round measures every task's seed configs only (Tuner.first_picks: its default config and the analytic
estimate's top pick, a trial or two), so that nearly all of the budget is the strategy's to allocate.
Then each batch goes where the policy of xtune/tuning/allocation.py says (Ansor's gradient, or
round-robin: after the same first round, the rest split evenly, Ansor's baseline). A task stops when its
space is exhausted, when it went `early_stopping` trials without improvement, or when neither its
seeds nor one batch after them found a correct config. A board that fails for good stops the whole
run, as it stops `xtune tune --workload` (docs/boards.md, "Faults"). The design is in docs/design.md,
"The task scheduler".
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from xtune.boards.board import Board
from xtune.errors import InputError
from xtune.files import PathLike
from xtune.ops.registry import template_for
from xtune.tuning.allocation import (
    RoundRobin,
    SchedulerOptions,
    Strategy,
    TaskLike,
    batch_size,
    choose_gradient,
    end_to_end,
    leaves_group,
)
from xtune.tuning.costmodel import CostModel
from xtune.tuning.database import Record, TuningLog
from xtune.tuning.features import features_op
from xtune.tuning.loop import StopTuning
from xtune.tuning.measure import CompilePool, MeasureStatus
from xtune.tuning.options import TuneOptions
from xtune.tuning.ranking import leaders
from xtune.tuning.results import ModelProgress, ModelStop, ModelTuningResult, TaskResult, TaskStop
from xtune.tuning.session import TuningSession, check_run

DEFAULT_SCHEDULER = SchedulerOptions()  # Ansor's gradient with its constants


@dataclass(eq=False)
class _Task:
    """The scheduler's state of one task."""

    task: TaskLike
    session: TuningSession
    history: list[float] = field(default_factory=list)  # best latency after each batch, resumed ones first
    batches: int = 0
    since_improvement: int = 0
    stop: TaskStop = TaskStop.RUNNING
    grouped: bool = True  # still in its similarity group (allocation.leaves_group)

    @property
    def running(self) -> bool:
        return self.stop is TaskStop.RUNNING

    @property
    def latency(self) -> float:
        top = self.session.leader()
        return top.cost if top else math.inf


def _resumed_history(session: TuningSession, batch: int) -> list[float]:
    """A resumed task's best latency after each `batch` of its logged records, as if tuned here."""
    wl, target, unit = session.workload.key, session.log_target, session.cost_unit
    done = [r for r in session.past if r.result.status is not MeasureStatus.BOARD_ERROR]
    history: list[float] = []
    for end in range(batch, len(done) + batch, batch):
        top = leaders(done[:end], wl, target, 1, unit)
        history.append(top[0].cost if top else math.inf)
    return [g for g in history if math.isfinite(g)] or history[-1:]


class TaskScheduler:
    """Tunes `tasks` on `boards` under one budget; see the module docstring. `pretrained` maps an operator
    to its transfer model and whether the analytic estimate hedges it (TuningSession); or `transfer` gives
    that map once the run is checked (so that a refused run trains no model). The run is checked once,
    first (session.check_run; `reads`: the files `log` must not be)."""

    def __init__(
        self,
        tasks: Sequence[TaskLike],
        boards: Sequence[Board],
        options: TuneOptions,
        log: TuningLog | None = None,
        *,
        scheduler: SchedulerOptions = DEFAULT_SCHEDULER,
        pretrained: Mapping[str, tuple[CostModel, bool]] | None = None,
        on_progress: Callable[[ModelProgress], None] | None = None,
        reads: Sequence[tuple[PathLike | None, str]] = (),
        transfer: Callable[[], Mapping[str, tuple[CostModel, bool]]] | None = None,
    ) -> None:
        if not tasks:
            raise InputError("the model has no tuning task (no Conv, Gemm or MatMul node)")
        check_run(boards, options, log, reads=reads, pretrained=bool(pretrained) or transfer is not None)
        if transfer is not None:
            pretrained = transfer()
        self.boards, self.options, self.scheduler, self.on_progress = boards, options, scheduler, on_progress
        self.pool = CompilePool()
        self.tasks: list[_Task] = []
        logged = log.read() if log is not None else []  # once: every task's session resumes from it
        try:
            for task in tasks:
                op = features_op(template_for(task.workload, boards[0].target))  # matmul for a pointwise conv
                model, hedge = (pretrained or {}).get(op, (None, False))
                session = TuningSession(
                    task.workload,
                    boards,
                    options,
                    log,
                    pretrained=model,
                    hedge_with_estimate=hedge,
                    pool=self.pool,
                    logged=logged,
                )
                self.tasks.append(_Task(task, session))
        except BaseException:
            self.close()
            raise
        self.trials = 0
        self.curve: list[tuple[int, float]] = []
        self._round_robin = RoundRobin()
        self._rng = random.Random(options.seed)  # the ε-greedy draws: a run is a function of its seed
        self._last = 0  # the task whose agents are open

    def close(self) -> None:
        for state in self.tasks:
            state.session.close()
        self.pool.close()

    @property
    def confirm_timings(self) -> int:
        return sum(s.session.confirm_timings for s in self.tasks)

    @property
    def error(self) -> str:
        """Why a board failed for good, if one did (the run then stopped BOARD_FAILED)."""
        return next((str(s.session.failure) for s in self.tasks if s.session.failure is not None), "")

    def estimate(self) -> float:
        return end_to_end([s.task.count for s in self.tasks], [s.latency for s in self.tasks])

    def run(self, budget: int) -> ModelStop:
        """Spend at most `budget` trials; the leaders of every task are confirmed at the end."""
        try:
            for _ in self.batches(budget):
                pass
        except KeyboardInterrupt:
            return ModelStop.INTERRUPTED
        except StopTuning:  # a board failed for good: no task can be measured on it, nor confirmed
            return ModelStop.BOARD_FAILED
        return self._confirm(self.ended(budget))

    def ended(self, budget: int) -> ModelStop:
        """Why `batches(budget)` ended: the budget was spent, or every task stopped before."""
        return ModelStop.TRIALS if self.trials >= budget else ModelStop.TASKS_DONE

    def batches(self, budget: int) -> Iterator[int]:
        """`run` one batch at a time, unconfirmed: yields the trials spent after each batch, and ends
        when the budget is spent or every task has stopped. A benchmark drives two of these in turn, so
        that a host's load weighs on both strategies alike (benchmarks/bench_scheduler.py)."""
        fresh = [s for s in self.tasks if not math.isfinite(s.latency)]
        if budget < len(fresh):
            raise InputError(
                f"--trials {budget} is fewer than the {len(fresh)} tasks not measured yet: each "
                "needs at least one trial (its default config)"
            )
        size = batch_size(self.options.batch_size, budget, len(self.tasks))
        first = self._first_round(budget)
        for state in self.tasks:
            if math.isfinite(state.latency):  # resumed: it skips the first round
                state.history = _resumed_history(state.session, size)
        self._point()
        # The first round: every task's seed configs only (its default config and the analytic estimate's top
        # pick), a few trials each; the budget is left to the strategy (docs/networks.md).
        for state, n in zip(fresh, first, strict=True):
            self._step(state, n, budget)
            yield self.trials
        for state in fresh:  # a task whose seed configs all failed gets one whole batch before it is dropped
            failed = not math.isfinite(state.latency) and state.stop is TaskStop.RUNNING
            if failed and self.trials < budget:
                self._step(state, min(size, budget - self.trials), budget)
                yield self.trials
            if not math.isfinite(state.latency):
                state.stop = TaskStop.NO_CORRECT_CONFIG
        while self.trials < budget:
            chosen = self._choose()
            if chosen is None:
                return
            self._step(chosen, min(size, budget - self.trials), budget)
            self._regroup(chosen)
            yield self.trials

    def _first_round(self, budget: float) -> list[int]:
        """Each fresh task's trials in the first round: its seed configs (Tuner.first_picks; at least one, the
        default), or just one each when the budget cannot hold them all."""
        picks = [max(1, s.session.first_picks()) for s in self.tasks if not math.isfinite(s.latency)]
        return picks if sum(picks) <= budget else [1] * len(picks)

    def first_round_trials(self) -> int:
        """The trials `run` spends on its first round when the budget holds it (0 when all is resumed)."""
        return sum(self._first_round(math.inf))

    def _confirm(self, stop: ModelStop) -> ModelStop:
        try:
            for state in self.tasks:
                state.session.confirm(self.options.confirm)
                state.session.suspend()
        except KeyboardInterrupt:
            return ModelStop.INTERRUPTED
        except StopTuning:  # every timing taken before is kept
            return ModelStop.BOARD_FAILED
        return stop

    def _choose(self) -> _Task | None:
        if self.scheduler.strategy is Strategy.ROUND_ROBIN:
            chosen = self._round_robin.choose(self.tasks)
        else:
            chosen = choose_gradient(self.tasks, self.scheduler, self._rng)
        return None if chosen is None else self.tasks[chosen]

    def _regroup(self, state: _Task) -> None:
        if leaves_group(state, self.tasks, self.scheduler.beta):
            state.grouped = False

    def _step(self, state: _Task, n: int, budget: int) -> None:
        if self.tasks[self._last].session is not state.session:
            self.tasks[self._last].session.suspend()  # one task's agents open at a time
        self._last = self.tasks.index(state)
        before, trials = state.latency, state.session.trials
        try:
            progress = state.session.step(n, budget)
        except StopTuning:  # a board failed for good; the batch is kept (logged) all the same
            self.trials += state.session.trials - trials
            raise
        if progress is None:
            state.stop = TaskStop.EXHAUSTED
            return
        self.trials += len(progress.batch)
        state.batches += 1
        latency = state.latency
        state.history.append(latency)
        state.since_improvement = 0 if latency < before else state.since_improvement + len(progress.batch)
        stopping = self.options.early_stopping
        if stopping is not None and state.since_improvement >= stopping:
            state.stop = TaskStop.EARLY_STOPPING
        elif state.session.exhausted:
            state.stop = TaskStop.EXHAUSTED
        self._point()
        if self.on_progress is not None:
            latencies = tuple(s.latency for s in self.tasks)
            self.on_progress(
                ModelProgress(
                    task=self.tasks.index(state),
                    batch=progress,
                    trials=self.trials,
                    budget=budget,
                    latencies=latencies,
                    estimate=end_to_end([s.task.count for s in self.tasks], latencies),
                )
            )

    def _point(self) -> None:
        value = self.estimate()
        if math.isfinite(value):
            self.curve.append((self.trials, value))

    def results(self) -> tuple[TaskResult, ...]:
        return tuple(_task_result(s) for s in self.tasks)

    def result(self, stop: ModelStop, *, model: str, budget: int, seconds: float) -> ModelTuningResult:
        """What the run did, once it ended with `stop`."""
        results = self.results()
        counts = [t.count for t in results]
        board = self.boards[0]
        return ModelTuningResult(
            model=model,
            target=board.target.name,
            boards=tuple(b.name for b in self.boards),
            strategy=self.scheduler.strategy,
            budget=budget,
            trials=sum(t.trials for t in results),
            confirm_timings=self.confirm_timings,
            cost_unit=self.options.measure.unit_on(board.cost_unit),
            estimate=end_to_end(counts, [t.best_cost for t in results]),
            default_estimate=end_to_end(counts, [t.default_cost for t in results]),
            tasks=results,
            curve=tuple(self.curve),
            stop=stop,
            seconds=seconds,
            error=self.error,
        )


def _task_result(state: _Task) -> TaskResult:
    session, top = state.session, state.session.leader()
    best_index = top.index if top else None
    default = session.template.default_config().index
    return TaskResult(
        workload=session.workload.key,
        nodes=state.task.nodes,
        flops=state.task.flops,
        trials=session.trials,
        resumed=session.resumed,
        batches=state.batches,
        best_index=best_index,
        best_knobs=top.record.knobs if top else (),
        best_cost=top.cost if top else math.inf,
        best_timings=top.timings if top else 0,
        default_cost=_config_cost(session, default),
        stop=state.stop,
    )


def _config_cost(session: TuningSession, index: int) -> float:
    """One config's cost by the rule of the best (ranking.leaders: median, never a disqualified one)."""
    records: list[Record] = [r for r in session.records() if r.index == index]
    top = leaders(records, session.workload.key, session.log_target, 1, session.cost_unit)
    return top[0].cost if top else math.inf


def tune_tasks(
    tasks: Sequence[TaskLike],
    boards: Sequence[Board],
    options: TuneOptions,
    log: TuningLog | None = None,
    *,
    model: str = "",
    scheduler: SchedulerOptions = DEFAULT_SCHEDULER,
    pretrained: Mapping[str, tuple[CostModel, bool]] | None = None,
    on_progress: Callable[[ModelProgress], None] | None = None,
    reads: Sequence[tuple[PathLike | None, str]] = (),
    transfer: Callable[[], Mapping[str, tuple[CostModel, bool]]] | None = None,
) -> ModelTuningResult:
    """Tune every task under one budget of `options.trials` trials (see TaskScheduler)."""
    start = time.perf_counter()
    run = TaskScheduler(
        tasks,
        boards,
        options,
        log,
        scheduler=scheduler,
        pretrained=pretrained,
        on_progress=on_progress,
        reads=reads,
        transfer=transfer,
    )
    try:
        stop = run.run(options.trials)
    finally:
        run.close()
    return run.result(stop, model=model, budget=options.trials, seconds=time.perf_counter() - start)
