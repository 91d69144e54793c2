"""The task scheduler: a network's tasks, boards and one trial budget in; every task tuned (one
`TuningSession` each, every batch appended to the log) and the model's estimated end-to-end latency out.

The idea is Ansor's (L. Zheng et al., "Ansor: Generating High-Performance Tensor Programs for Deep
Learning", OSDI 2020, §6): the objective is the end-to-end latency f = Σ_i w_i g_i, where g_i is task i's
best latency and w_i the number of nodes that run it. A first round measures every task's anchors only
(Tuner.first_picks: its default config and the analytic estimate's top pick, a trial or two), so that
nearly all of the budget is the strategy's to allocate. Then each batch goes to the task whose next
batch is expected to lower f the most: w_i times the expected drop of g_i, blended from how much g_i
fell over its last `window` batches (the backward term) and an optimistic forward guess — g_i falls like
1/t in the number of batches t, or, when a similar task (same operator, flops within one step of Ansor's
1.618-base log scale) already runs faster per flop, g_i could drop to `beta` times the latency at that
task's throughput (a task that stays far slower than its group after 5 batches more leaves it). A task
stops when its space is exhausted, when it went `early_stopping` trials without improvement, or when
neither its anchors nor one batch after them found a correct config. A board that fails for good stops
the whole run, as it stops `xtune tune --workload` (docs/boards.md, "Faults"). The round-robin strategy
(after the same first round, the rest split evenly: Ansor's baseline) is there to compare with; the
design is in docs/design.md, "The task scheduler".
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from xtune.boards.board import Board
from xtune.boards.cost import CostUnit
from xtune.errors import InputError
from xtune.templates import template_for
from xtune.tuning.costmodel import CostModel
from xtune.tuning.database import Record, TuningLog, leaders
from xtune.tuning.features import features_op
from xtune.tuning.loop import StopTuning, TuneProgress
from xtune.tuning.measure import CompilePool, MeasureStatus
from xtune.tuning.session import TuningSession, check_boards
from xtune.workload import Workload

if TYPE_CHECKING:
    from xtune.network.graph import Source
    from xtune.tuning.run import TuneOptions


class TaskLike(Protocol):
    """What the scheduler reads of a task (xtune.network.tasks.Task)."""

    @property
    def workload(self) -> Workload: ...
    @property
    def nodes(self) -> tuple[str, ...]: ...
    @property
    def flops(self) -> float: ...
    @property
    def count(self) -> int: ...


class Strategy(Enum):
    GRADIENT = "gradient"  # Ansor's gradient allocation (module docstring)
    ROUND_ROBIN = "round-robin"  # one batch per task in turn: the budget split evenly


@dataclass(frozen=True, kw_only=True)
class SchedulerOptions:
    """How batches are allocated; the gradient constants are Ansor's defaults (§6.2, and TVM's
    auto_scheduler.TaskScheduler)."""

    strategy: Strategy = Strategy.GRADIENT
    alpha: float = 0.2  # weight of the backward (observed) term against the forward guess
    beta: float = 2.0  # slack on the throughput of similar tasks
    window: int = 3  # batches the backward term looks back over


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


def expected_gain(
    *, count: int, history: Sequence[float], flops: float, peer_throughput: float, options: SchedulerOptions
) -> float:
    """The end-to-end latency a task's next batch is expected to save: count × expected drop of its best
    latency (Ansor §6.2, the negated gradient ∂f/∂t_i). `history` is its best latency after each of its
    batches so far (at least one, finite); `peer_throughput` the best flops per second among its similar
    tasks, itself included."""
    rounds, latency = len(history), history[-1]
    backward = 0.0
    if rounds > options.window:
        backward = (history[-1 - options.window] - latency) / options.window
    forward = latency / rounds  # g(t) ~ 1/t: the next batch would take g down to g (1 - 1/t)
    if peer_throughput > 0:
        forward = max(forward, latency - options.beta * flops / peer_throughput)
    return count * (options.alpha * backward + (1 - options.alpha) * forward)


def similarity_key(task: TaskLike) -> tuple[str, int]:
    """Tasks of one operator whose flops are within one step of a 1.618-base log scale are similar: one
    can expect to run about as fast per flop as another (Ansor's similarity tag)."""
    return task.workload.op, int(math.log(task.flops + 1, 1.618))


def end_to_end(counts: Sequence[int], latencies: Sequence[float]) -> float:
    """The model's estimated end-to-end latency: Σ node count × best latency (+inf while a task has none)."""
    return sum(c * g for c, g in zip(counts, latencies, strict=True))


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
            "model": self.model, "target": self.target, "boards": list(self.boards),
            "strategy": self.strategy.value, "budget": self.budget, "trials": self.trials,
            "confirm_timings": self.confirm_timings, "cost_unit": self.cost_unit.value,
            "estimate": _finite(self.estimate), "default_estimate": _finite(self.default_estimate),
            "tasks": [t.as_dict() for t in self.tasks],
            "curve": [[n, _finite(e)] for n, e in self.curve], "stop": self.stop.value,
            "seconds": round(self.seconds, 3), "error": self.error,
        }  # fmt: skip


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


@dataclass(eq=False)
class _Task:
    """The scheduler's state of one task."""

    task: TaskLike
    session: TuningSession
    history: list[float] = field(default_factory=list)  # best latency after each batch, resumed ones first
    batches: int = 0
    since_improvement: int = 0
    stop: TaskStop = TaskStop.RUNNING
    grouped: bool = True  # still in its similarity group (TaskScheduler._regroup)

    @property
    def latency(self) -> float:
        top = self.session.leader()
        return top[0].cost if top else math.inf


def _resumed_history(session: TuningSession, batch: int) -> list[float]:
    """A resumed task's best latency after each `batch` of its logged records, as if tuned here."""
    wl, target, unit = session.workload.key, session.target.name, session.cost_unit
    done = [r for r in session.past if r.result.status is not MeasureStatus.BOARD_ERROR]
    history: list[float] = []
    for end in range(batch, len(done) + batch, batch):
        top = leaders(done[:end], wl, target, 1, unit)
        history.append(top[0][0].cost if top else math.inf)
    return [g for g in history if math.isfinite(g)] or history[-1:]


class TaskScheduler:
    """Tunes `tasks` on `boards` under one budget; see the module docstring. `pretrained` maps an operator
    to its transfer model and whether the analytic estimate hedges it (TuningSession)."""

    def __init__(
        self,
        tasks: Sequence[TaskLike],
        boards: Sequence[Board],
        options: TuneOptions,
        log: TuningLog | None = None,
        *,
        scheduler: SchedulerOptions = SchedulerOptions(),
        pretrained: Mapping[str, tuple[CostModel, bool]] | None = None,
        on_progress: Callable[[ModelProgress], None] | None = None,
    ) -> None:
        if not tasks:
            raise InputError("the model has no tuning task (no Conv, Gemm or MatMul node)")
        check_boards(boards)
        self.boards, self.options, self.scheduler, self.on_progress = boards, options, scheduler, on_progress
        self.pool = CompilePool()
        self.tasks: list[_Task] = []
        logged = log.read() if log is not None else []  # once: every task's session resumes from it
        try:
            for task in tasks:
                op = features_op(template_for(task.workload, boards[0].target))  # matmul for a pointwise conv
                model, hedge = (pretrained or {}).get(op, (None, False))
                session = TuningSession(task.workload, boards, options, log, pretrained=model,
                                        hedge_with_estimate=hedge, pool=self.pool, logged=logged)  # fmt: skip
                self.tasks.append(_Task(task, session))
        except BaseException:
            self.close()
            raise
        self.trials = 0
        self.curve: list[tuple[int, float]] = []
        self._turn = 0  # round-robin's next task
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
        fresh = [s for s in self.tasks if not math.isfinite(s.latency)]
        if budget < len(fresh):
            raise InputError(f"--trials {budget} is fewer than the {len(fresh)} tasks not measured yet: each "
                             "needs at least one trial (its default config)")  # fmt: skip
        # After the first round every batch has one size, as Ansor's rounds do (TVM: min(64, trials //
        # tasks)): a small budget still leaves batches to allocate among the tasks.
        size = max(1, min(self.options.batch_size, budget // len(self.tasks)))
        first = self._first_round(budget)
        for state in self.tasks:
            if math.isfinite(state.latency):  # resumed: it skips the first round
                state.history = _resumed_history(state.session, size)
        self._point()
        try:
            # The first round: every task's anchors only (its default config and the analytic estimate's
            # top pick), a few trials each; the budget is left to the strategy (docs/networks.md).
            for state, n in zip(fresh, first, strict=True):
                self._step(state, n, budget)
            for state in fresh:  # a task whose anchors all failed gets one whole batch before it is dropped
                failed = not math.isfinite(state.latency) and state.stop is TaskStop.RUNNING
                if failed and self.trials < budget:
                    self._step(state, min(size, budget - self.trials), budget)
                if not math.isfinite(state.latency):
                    state.stop = TaskStop.NO_CORRECT_CONFIG
            while self.trials < budget:
                chosen = self._choose()
                if chosen is None:
                    return self._confirm(ModelStop.TASKS_DONE)
                self._step(chosen, min(size, budget - self.trials), budget)
                self._regroup(chosen)
        except KeyboardInterrupt:
            return ModelStop.INTERRUPTED
        except StopTuning:  # a board failed for good: no task can be measured on it, nor confirmed
            return ModelStop.BOARD_FAILED
        return self._confirm(ModelStop.TRIALS)

    def _first_round(self, budget: float) -> list[int]:
        """Each fresh task's trials in the first round: its anchors (Tuner.first_picks; at least one, the
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
        alive = [s for s in self.tasks if s.stop is TaskStop.RUNNING]
        if not alive:
            return None
        if self.scheduler.strategy is Strategy.ROUND_ROBIN:
            order = self.tasks[self._turn :] + self.tasks[: self._turn]
            chosen = next(s for s in order if s.stop is TaskStop.RUNNING)
            self._turn = (self.tasks.index(chosen) + 1) % len(self.tasks)
            return chosen
        peers: dict[tuple[str, int], float] = {}  # a similarity group's best throughput
        for s in self.tasks:
            if s.grouped and math.isfinite(s.latency):
                key = similarity_key(s.task)
                peers[key] = max(peers.get(key, 0.0), s.task.flops / s.latency)
        gains = {id(s): expected_gain(count=s.task.count, history=s.history, flops=s.task.flops,
                                      peer_throughput=peers.get(similarity_key(s.task), 0.0) if s.grouped
                                      else 0.0, options=self.scheduler) for s in alive}  # fmt: skip
        # Ties (e.g. every gain 0) go to the task with the fewest batches, then the first: Ansor draws one
        # at random, which spreads batches evenly too but makes a run depend on more than its seed.
        return max(alive, key=lambda s: (gains[id(s)], -s.batches, -self.tasks.index(s)))

    def _regroup(self, state: _Task) -> None:
        """Ansor's check after each batch: a task given more than 5 batches beyond every other task of its
        similarity group that still runs at less than 1/beta of the group's best throughput is not like
        them after all; it leaves the group, whose throughput no longer raises its forward guess (else that
        guess would claim batch after batch for it)."""
        if not state.grouped or not math.isfinite(state.latency):
            return
        key = similarity_key(state.task)
        group = [s for s in self.tasks if s.grouped and similarity_key(s.task) == key]
        others = [s for s in group if s is not state]
        if not others:
            return
        best = max(s.task.flops / s.latency for s in group)
        mine = state.task.flops / state.latency
        if mine < best / self.scheduler.beta and state.batches > 5 + max(s.batches for s in others):
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
        elif not state.session.loop.tuner.has_next():
            state.stop = TaskStop.EXHAUSTED
        self._point()
        if self.on_progress is not None:
            latencies = tuple(s.latency for s in self.tasks)
            self.on_progress(ModelProgress(
                task=self.tasks.index(state), batch=progress, trials=self.trials, budget=budget,
                latencies=latencies, estimate=end_to_end([s.task.count for s in self.tasks], latencies),
            ))  # fmt: skip

    def _point(self) -> None:
        value = self.estimate()
        if math.isfinite(value):
            self.curve.append((self.trials, value))

    def results(self) -> tuple[TaskResult, ...]:
        return tuple(_task_result(s) for s in self.tasks)


def _task_result(state: _Task) -> TaskResult:
    session, top = state.session, state.session.leader()
    best_index = top[0].index if top else None
    default = session.template.default_config().index
    return TaskResult(
        workload=session.workload.key, nodes=state.task.nodes, flops=state.task.flops,
        trials=session.trials, resumed=session.resumed, batches=state.batches, best_index=best_index,
        best_knobs=top[0].knobs if top else (), best_cost=top[0].cost if top else math.inf,
        best_timings=top[1] if top else 0, default_cost=_config_cost(session, default), stop=state.stop,
    )  # fmt: skip


def _config_cost(session: TuningSession, index: int) -> float:
    """One config's cost by the rule of the best (database.leaders: median, never a disqualified one)."""
    records: list[Record] = [r for r in session.records() if r.index == index]
    top = leaders(records, session.workload.key, session.target.name, 1, session.cost_unit)
    return top[0][0].cost if top else math.inf


def tune_tasks(
    tasks: Sequence[TaskLike],
    boards: Sequence[Board],
    options: TuneOptions,
    log: TuningLog | None = None,
    *,
    model: str = "",
    scheduler: SchedulerOptions = SchedulerOptions(),
    pretrained: Mapping[str, tuple[CostModel, bool]] | None = None,
    on_progress: Callable[[ModelProgress], None] | None = None,
) -> ModelTuningResult:
    """Tune every task under one budget of `options.trials` trials (see TaskScheduler)."""
    start = time.perf_counter()
    run = TaskScheduler(tasks, boards, options, log, scheduler=scheduler, pretrained=pretrained,
                        on_progress=on_progress)  # fmt: skip
    try:
        stop = run.run(options.trials)
    finally:
        run.close()
    results = run.results()
    counts = [t.count for t in results]
    return ModelTuningResult(
        model=model, target=boards[0].target.name, boards=tuple(b.name for b in boards),
        strategy=scheduler.strategy, budget=options.trials, trials=sum(t.trials for t in results),
        confirm_timings=run.confirm_timings, cost_unit=boards[0].cost_unit,
        estimate=end_to_end(counts, [t.best_cost for t in results]),
        default_estimate=end_to_end(counts, [t.default_cost for t in results]),
        tasks=results, curve=tuple(run.curve), stop=stop, seconds=time.perf_counter() - start,
        error=run.error,
    )  # fmt: skip


def tune_model(
    model: Source,
    *,
    board: str | Board | Sequence[str | Board] = "local",
    boards_file: str | os.PathLike[str] | None = None,
    target: str | None = None,
    trials: int | None = None,
    log: str | os.PathLike[str] | TuningLog | None = None,
    options: TuneOptions | None = None,
    strategy: Strategy | str = Strategy.GRADIENT,
    on_progress: Callable[[ModelProgress], None] | None = None,
    layout: str = "nhwc",
) -> ModelTuningResult:
    """Tune every task of an ONNX model (path or ModelProto) on `board` (a name, a Board, or several of
    one target) under one budget of `trials` (default: options.trials), the network run in `layout`
    (xtune/network/layout.py), appending to `log` and resuming from it: what `xtune tune --model` does."""
    from xtune.boards.board import get_board
    from xtune.network.layout import parse_layout
    from xtune.network.tasks import extract_tasks
    from xtune.tuning.run import TuneOptions

    where = parse_layout(layout)  # before any board is opened
    items = [board] if isinstance(board, str) or not isinstance(board, Sequence) else list(board)
    path = Path(boards_file) if boards_file is not None else None
    boards = [get_board(b, path, target=target) if isinstance(b, str) else b for b in items]
    check_boards(boards)
    options = options or TuneOptions()
    options = replace(options, trials=trials) if trials is not None else options
    if options.trials < 1:
        raise InputError("trials must be at least 1")
    try:
        chosen = Strategy(strategy)
    except ValueError:
        known = ", ".join(s.value for s in Strategy)
        raise InputError(f"unknown strategy '{strategy}' (known: {known})") from None
    taskset = extract_tasks(model, boards[0].target, where)
    tuning_log = log if isinstance(log, TuningLog) or log is None else TuningLog(log)
    return tune_tasks(taskset.tasks, boards, options, tuning_log, model=taskset.model,
                      scheduler=SchedulerOptions(strategy=chosen), on_progress=on_progress)  # fmt: skip
