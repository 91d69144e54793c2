"""A tuning session: one workload on boards, set up once (template, tuner resumed from the log, measurer)
and measured one batch at a time, every batch appended to the log. `run_tuning` runs one session to the
end; the task scheduler of a network (xtune.tuning.task_scheduler) keeps one per task and steps the task it
chooses."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

from xtune.boards.board import Board
from xtune.boards.cost import WALL_UNITS, CostUnit
from xtune.errors import BoardError, InputError
from xtune.files import PathLike
from xtune.ops.registry import template_for
from xtune.ops.template import ScheduleTemplate, seed_configs
from xtune.ops.workload import Workload
from xtune.tuning.costmodel import CostModel
from xtune.tuning.database import Record, TuningLog, config_of, log_target, make_record, with_sum_copies
from xtune.tuning.features import estimate_prior, features_op, featurize
from xtune.tuning.loop import StopReason, StopTuning, TuneLoop, TuneProgress, TuneSummary, run_loop
from xtune.tuning.measure import CompilePool, Measurer, MeasureResult
from xtune.tuning.options import CONFIRM_TIMINGS, MeasureOptions, TuneOptions
from xtune.tuning.ranking import Leader, cpu_of, leaders, measured, of_machine, unmeasured
from xtune.tuning.tuner import make_tuner


class _BoardsMeasurer:
    """One Measurer per board; a batch is dealt round-robin and measured on the boards in parallel."""

    def __init__(
        self, boards: Sequence[Board], workload: Workload, options: MeasureOptions, pool: CompilePool
    ):
        self.boards = tuple(boards)
        self.measurers = [Measurer(board, workload, options, pool) for board in boards]
        self.threads = ThreadPoolExecutor(len(boards)) if len(boards) > 1 else None

    @property
    def failure(self) -> BoardError | None:
        """The first board that failed for good: the run stops, even if other boards could go on."""
        return next((m.failure for m in self.measurers if m.failure is not None), None)

    def dealt(self, count: int) -> list[int]:
        """Which board (its position in `boards`) measures each of `count` candidates of a batch."""
        return [i % len(self.boards) for i in range(count)]

    def __call__(self, batch: list[int]) -> list[MeasureResult]:
        if self.threads is None:
            return self.measurers[0].measure(batch)
        dealt = self.dealt(len(batch))
        shares = [
            [index for index, b in zip(batch, dealt, strict=True) if b == n] for n in range(len(self.boards))
        ]
        jobs = zip(self.measurers, shares, strict=True)
        parts = [iter(part) for part in self.threads.map(lambda job: job[0].measure(job[1]), jobs)]
        return [next(parts[b]) for b in dealt]

    def close_sessions(self) -> None:
        for measurer in self.measurers:
            measurer.close_session()

    def close(self) -> None:
        for measurer in self.measurers:
            measurer.close()
        if self.threads is not None:
            self.threads.shutdown()


def past_records(
    logged: Iterable[Record], template: ScheduleTemplate, cpus: Collection[str] | None = None
) -> list[Record]:
    """The `logged` records of this workload and target, measured on one of `cpus` (any if None; records
    without a fingerprint count as any cpu's), whose knobs still mean the same config."""
    return [
        r
        for r in of_machine(
            with_sum_copies(list(logged)),
            template.workload.key,
            log_target(template.workload, template.target),
        )
        if (cpus is None or cpu_of(r) in (None, *cpus)) and config_of(template, r) is not None
    ]


def check_boards(boards: Sequence[Board]) -> None:
    """InputError unless `boards` can share a tuning run: some, all of one target, all measuring one unit
    that ranks configs (a correctness-only board cannot: `xtune bench` is the command for it)."""
    if not boards:
        raise InputError("no board to tune on")
    target = boards[0].target
    if any(b.target != target for b in boards):
        raise InputError("all --board flags of one run must be boards of the same target")
    for b in boards:
        if b.cost_unit is CostUnit.NONE:
            raise InputError(
                f"board '{b.name}' checks correctness only (emulated wall time ranks nothing, "
                f"docs/boards.md): tune on a timing or instruction-counting board; "
                f"`xtune bench --board {b.name}` checks a config on it"
            )
    if len({b.cost_unit for b in boards}) > 1:
        raise InputError("boards of one run must measure one unit (wall time, instructions or cycles)")


def check_run(
    boards: Sequence[Board],
    options: TuneOptions,
    log: TuningLog | None,
    *,
    reads: Sequence[tuple[PathLike | None, str]] = (),
    pretrained: bool = False,
) -> None:
    """InputError unless a tuning run can start: the boards can share it (`check_boards`), a pretrained
    model has the xgb tuner to steer, and `log` can take records and is none of the files the run reads
    (`reads`: the model, the logs a transfer model was trained on). The run's entry point calls it once,
    before the log is read (a FIFO would block): `run_tuning` and `TaskScheduler`; a `TuningSession`
    takes what they checked."""
    check_boards(boards)
    if pretrained and options.tuner != "xgb":
        raise InputError(
            f"a pretrained model (--transfer-from) needs the xgb tuner (--tuner {options.tuner} has no "
            "cost model)"
        )
    if log is not None:
        log.check_appendable(reads)


class TuningSession:
    """Tunes `workload` on `boards` (a run `check_run` accepted), one batch per `step`; every
    batch goes to `log`, each record with the name and fingerprint of the board that measured it. A board
    that fails for good ends the step (and `run`, `confirm`) that saw it with StopTuning(BOARD_FAILED),
    after its batch is logged; `failure` says why.

    `pretrained` (transfer learning, xgb tuner only) scores the configs of this workload's operator: it
    ranks the first batches and is the fading base of the local model (see XGBoostCostModel). With
    `hedge_with_estimate` (for a model that saw no logs of this target) the analytic estimate shares those
    first batches with it, and then whichever of the two picked the fastest config is the base. Sessions
    of one process may share a compile `pool`; a session closes only a pool it made."""

    def __init__(
        self,
        workload: Workload,
        boards: Sequence[Board],
        options: TuneOptions,
        log: TuningLog | None = None,
        *,
        pretrained: CostModel | None = None,
        hedge_with_estimate: bool = False,
        callbacks: Sequence[Callable[[TuneProgress], None]] = (),
        pool: CompilePool | None = None,
        logged: Sequence[Record] | None = None,
    ) -> None:
        self.workload, self.boards, self.options, self.log = workload, tuple(boards), options, log
        self.target, self.cost_unit = boards[0].target, options.measure.unit_on(boards[0].cost_unit)
        self.template = template = template_for(workload, self.target)
        self.log_target = log_target(workload, self.target)  # the target name its records carry
        self.fingerprints = [tuple(sorted(b.fingerprint().items())) for b in boards]
        cpus = {cpu for fp in self.fingerprints if (cpu := dict(fp).get("cpu"))}
        # `logged`: the log's records, read once by a caller that opens many sessions on it (the scheduler).
        if logged is None:
            logged = log.read() if log is not None else []
        self.past = past_records(logged, template, cpus)
        history = measured(self.past, workload.key, self.log_target)
        self.resumed = len(history)  # configs already in the log, learned from and not measured again
        # The operator whose features and models apply (a pointwise conv2d is tuned as its matmul).
        estimate = estimate_prior(features_op(template))
        if pretrained is None and options.tuner == "xgb" and options.analytic_prior:
            pretrained = estimate  # no transfer model: the analytic estimate ranks first
        hedge = estimate if hedge_with_estimate and pretrained is not None else None
        # The default (and the estimate's pick) join the model tuner's first batch whatever the prior, even
        # when the run does not measure the default first: a warm start never starts below them.
        tuner = make_tuner(
            options.tuner,
            template.space,
            options.seed,
            lambda idx: featurize(template, idx),
            pretrained=pretrained,
            hedge=hedge,
            seeds=seed_configs(template),
            estimate=estimate if options.analytic_prior else None,
        )
        if history:
            tuner.load_history(list(history), [r.result for r in history.values()])
        if options.start_from_default:
            tuner.propose_first([template.default_config().index])
        # Configs an earlier run chose but lost to a board error: measured first (docs/boards.md, "Faults").
        tuner.propose_first(unmeasured(self.past, workload.key, self.log_target))
        self.this_run: list[Record] = []
        self._own_pool = pool is None
        self.pool = pool or CompilePool()
        self.measure = _BoardsMeasurer(boards, workload, options.measure, self.pool)
        self.loop = TuneLoop(
            tuner,
            self.measure,
            [lambda p: self._keep(p.batch, p.results), *callbacks, lambda p: self._stop_if_failed()],
        )

    def _keep(self, batch: Sequence[int], results: Sequence[MeasureResult]) -> None:
        boards, space, wl = self.boards, self.template.space, self.workload.key
        dealt = self.measure.dealt(len(batch))
        records = [
            make_record(
                wl,
                self.log_target,
                boards[b].name,
                space.config(i),
                r,
                self.options.measure,
                self.fingerprints[b],
            )
            for i, r, b in zip(batch, results, dealt, strict=True)
        ]
        self.this_run.extend(records)
        if self.log is not None:
            self.log.append(records)

    def _stop_if_failed(self) -> None:
        if self.measure.failure is not None:  # called after _keep: the batch, its board errors too, is logged
            raise StopTuning(StopReason.BOARD_FAILED)

    def _keep_or_stop(self, batch: Sequence[int], results: Sequence[MeasureResult]) -> None:
        self._keep(batch, results)
        self._stop_if_failed()

    @property
    def failure(self) -> BoardError | None:
        """Why a board of this session cannot measure any more (it failed for good), else None."""
        return self.measure.failure

    def step(self, n: int, budget: int = 0) -> TuneProgress | None:
        """Measure one batch of at most `n` configs (see TuneLoop.step); None when the space is exhausted.
        Raises StopTuning(BOARD_FAILED), after keeping the batch, when a board failed for good."""
        return self.loop.step(n, budget)

    def first_picks(self) -> int:
        """How many configs lead the next batch before the tuner's own choice (Tuner.first_picks): on a
        fresh session the template's default and the analytic estimate's top pick."""
        return self.loop.tuner.first_picks()

    def run(self, budget: int, batch_size: int, early_stopping: int | None = None) -> TuneSummary:
        """Batches until `budget`, exhaustion, early stopping, a board's failure or Ctrl-C (loop.tune)."""
        return run_loop(self.loop, budget, batch_size, early_stopping)

    @property
    def exhausted(self) -> bool:
        """Whether the tuner has no config left to propose."""
        return not self.loop.tuner.has_next()

    @property
    def trials(self) -> int:
        """Configs measured by this session (confirming timings not counted)."""
        return self.loop.trials

    @property
    def confirm_timings(self) -> int:
        """Timings this session added to confirm its leaders (see `confirm`)."""
        return len(self.this_run) - self.trials

    def records(self) -> list[Record]:
        """The log's earlier records of this workload on this machine, then this session's."""
        return self.past + self.this_run

    def leader(self) -> Leader | None:
        """The best config so far (over the log's history and this session) with its count of timings:
        the one `xtune build` would ship (ranking.leaders)."""
        top = leaders(self.records(), self.workload.key, self.log_target, 1, self.cost_unit)
        return top[0] if top else None

    def confirm(self, count: int) -> None:
        """Time the `count` leaders again (TuneOptions.confirm; `confirm_timings` counts them). Counts
        and cycle estimates (emulated boards) are exact: measuring them again would add nothing. Raises
        StopTuning (BOARD_FAILED) when a board fails for good; every timing taken is kept."""
        if self.cost_unit in WALL_UNITS and count > 0:
            _confirm(self.records, self.template, self.cost_unit, count, self.measure, self._keep_or_stop)

    def suspend(self) -> None:
        """Close the boards' agent sessions (reopened by the next step): a scheduler of many tasks keeps
        one task's agents open at a time."""
        self.measure.close_sessions()

    def close(self) -> None:
        self.measure.close()
        if self._own_pool:
            self.pool.close()


def _confirm(
    records: Callable[[], list[Record]],
    template: ScheduleTemplate,
    unit: CostUnit,
    count: int,
    measure: Callable[[list[int]], list[MeasureResult]],
    keep: Callable[[Sequence[int], Sequence[MeasureResult]], None],
) -> None:
    """Time the `count` best configs (by wall time) again, one round at a time (so that a slow spell of
    the host falls on all of them), until each has CONFIRM_TIMINGS timings. A config whose median drops
    out of the lead lets the next one in, and that one is timed too, up to a budget of twice the timings
    the first leaders need; the best goes first in every round. Past the budget only the best is still
    timed, until it has its CONFIRM_TIMINGS: a config that took the lead on one lucky timing as the
    others' medians rose would otherwise be the run's best, timed once, which is what `confirm` promises
    against. No config is tried more than twice the timings it needs, so one whose timings keep failing
    (timeouts, board errors) cannot hold the run. Each round's results go to `keep` as they arrive."""
    wl, target = template.workload.key, log_target(template.workload, template.target)
    budget = 2 * count * (CONFIRM_TIMINGS - 1)
    tries: Counter[int] = Counter()
    while True:
        top = leaders(records(), wl, target, count, unit)
        short = [
            lead.index
            for lead in top
            if lead.timings < CONFIRM_TIMINGS and tries[lead.index] < 2 * (CONFIRM_TIMINGS - 1)
        ]
        short = short[:budget] if budget > 0 else [i for i in short[:1] if i == top[0].index]
        if not short:
            return
        keep(short, measure(short))
        budget -= len(short)
        tries.update(short)
