"""A tuning session: one workload on boards, set up once (template, tuner resumed from the log, measurer)
and measured one batch at a time, every batch appended to the log. `run_tuning` runs one session to the
end; the task scheduler of a network (xtune.network.scheduler) keeps one per task and steps the task it
chooses."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from xtune.boards.board import Board
from xtune.errors import InputError
from xtune.templates import ScheduleTemplate, template_for
from xtune.tuning.costmodel import CostModel
from xtune.tuning.database import Record, TuningLog, leaders, make_record, measured, of_machine
from xtune.tuning.features import estimate_prior, featurize
from xtune.tuning.measure import CompilePool, MeasureOptions, Measurer, MeasureResult, MeasureStatus
from xtune.tuning.tuner import TuneLoop, TuneProgress, TuneSummary, make_tuner, run_loop
from xtune.workload import Workload

if TYPE_CHECKING:
    from xtune.tuning.run import TuneOptions

CONFIRM_TIMINGS = 3


class _BoardsMeasurer:
    """One Measurer per board; a batch is dealt round-robin and measured on the boards in parallel."""

    def __init__(
        self, boards: Sequence[Board], workload: Workload, options: MeasureOptions, pool: CompilePool
    ):
        self.measurers = [Measurer(board, workload, options, pool) for board in boards]
        self.threads = ThreadPoolExecutor(len(boards)) if len(boards) > 1 else None

    def __call__(self, batch: list[int]) -> list[MeasureResult]:
        if self.threads is None:
            return self.measurers[0].measure(batch)
        n = len(self.measurers)
        shares = [batch[i::n] for i in range(n)]
        jobs = zip(self.measurers, shares, strict=True)
        parts = list(self.threads.map(lambda job: job[0].measure(job[1]), jobs))
        results: list[MeasureResult] = [MeasureResult(MeasureStatus.BOARD_ERROR)] * len(batch)
        for i, part in enumerate(parts):
            results[i::n] = part
        return results

    def close_sessions(self) -> None:
        for measurer in self.measurers:
            measurer.close_session()

    def close(self) -> None:
        for measurer in self.measurers:
            measurer.close()
        if self.threads is not None:
            self.threads.shutdown()


def past_records(log: TuningLog | None, template: ScheduleTemplate, cpu: str | None = None) -> list[Record]:
    """Records of this workload and target already in the log, measured on `cpu` (any if None), whose
    knobs still mean the same config."""
    if log is None:
        return []
    space = template.space
    return [
        r
        for r in of_machine(log.read(), template.workload.key, template.target.name, cpu=cpu)
        if 0 <= r.index < space.size and space.config(r.index).values == r.knobs
    ]


def check_boards(boards: Sequence[Board]) -> None:
    """InputError unless `boards` can share a run: at least one, all of one target and cost unit."""
    if not boards:
        raise InputError("no board to tune on")
    if any(b.target != boards[0].target for b in boards):
        raise InputError("all --board flags of one run must be boards of the same target")
    if len({b.cost_unit for b in boards}) > 1:
        raise InputError("boards of one run must measure the same thing (wall time or instruction counts)")


class TuningSession:
    """Tunes `workload` on `boards` (all of one target), one batch per `step`; every batch goes to `log`.

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
    ) -> None:
        check_boards(boards)
        if pretrained is not None and options.tuner != "xgb":
            raise InputError(f"a pretrained model (--transfer-from) needs the xgb tuner, not {options.tuner}")
        self.workload, self.boards, self.options, self.log = workload, tuple(boards), options, log
        self.target, self.cost_unit = boards[0].target, boards[0].cost_unit
        self.template = template = template_for(workload, self.target)
        if log is not None:
            log.check_appendable()
        self.fingerprint = tuple(sorted(boards[0].fingerprint().items()))
        self.past = past_records(log, template, dict(self.fingerprint).get("cpu"))
        history = measured(self.past, workload.key, self.target.name)
        self.resumed = len(history)  # configs already in the log, learned from and not measured again
        if pretrained is None and options.tuner == "xgb" and options.analytic_prior:
            pretrained = estimate_prior(workload.op)  # no transfer model: the analytic estimate ranks first
        hedge = estimate_prior(workload.op) if hedge_with_estimate and pretrained is not None else None
        tuner = make_tuner(options.tuner, template.space, options.seed, lambda idx: featurize(template, idx),
                           pretrained=pretrained, hedge=hedge)  # fmt: skip
        if history:
            tuner.load_history(list(history), [r.result for r in history.values()])
        if options.start_from_default:
            tuner.propose_first([template.default_config().index])
        self.this_run: list[Record] = []
        self._own_pool = pool is None
        self.pool = pool or CompilePool()
        self.measure = _BoardsMeasurer(boards, workload, options.measure, self.pool)
        self.loop = TuneLoop(tuner, self.measure, [lambda p: self._keep(p.batch, p.results), *callbacks])

    def _keep(self, batch: Sequence[int], results: Sequence[MeasureResult]) -> None:
        label, space, wl = "+".join(b.name for b in self.boards), self.template.space, self.workload.key
        records = [make_record(wl, self.target.name, label, space.config(i), r, self.options.measure,
                               self.fingerprint) for i, r in zip(batch, results, strict=True)]  # fmt: skip
        self.this_run.extend(records)
        if self.log is not None:
            self.log.append(records)

    def step(self, n: int, n_trials: int = 0) -> TuneProgress | None:
        """Measure one batch of at most `n` configs (see TuneLoop.step); None when the space is exhausted."""
        return self.loop.step(n, n_trials)

    def run(self, n_trials: int, batch_size: int, early_stopping: int | None = None) -> TuneSummary:
        """Batches until `n_trials`, exhaustion, early stopping or Ctrl-C (see tuner.tune)."""
        return run_loop(self.loop, n_trials, batch_size, early_stopping)

    @property
    def trials(self) -> int:
        """Configs measured by this session (confirming timings not counted)."""
        return self.loop.trials

    def records(self) -> list[Record]:
        """The log's earlier records of this workload on this machine, then this session's."""
        return self.past + self.this_run

    def leader(self) -> tuple[Record, int] | None:
        """The best config so far (over the log's history and this session) with its count of timings:
        the one `xtune build` would ship (database.leaders)."""
        top = leaders(self.records(), self.workload.key, self.target.name, 1, self.cost_unit)
        return top[0] if top else None

    def confirm(self, count: int) -> int:
        """Time the `count` leaders again (TuneOptions.confirm); returns the timings added. Instruction
        counts (emulated boards) are exact: timing them again would add nothing."""
        if self.cost_unit != "s" or count <= 0:
            return 0
        before = len(self.this_run)
        _confirm(self.records, self.template, self.cost_unit, count, self.measure, self._keep)
        return len(self.this_run) - before

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
    unit: str,
    count: int,
    measure: Callable[[list[int]], list[MeasureResult]],
    keep: Callable[[Sequence[int], Sequence[MeasureResult]], None],
) -> None:
    """Time the `count` best configs again, one round at a time (so that a slow spell of the host falls
    on all of them), until each has CONFIRM_TIMINGS timings. A config whose median drops out of the lead
    lets the next one in, and that one is timed too, up to a budget of twice the timings the first
    leaders need; the best goes first in every round, so it is the last to miss out. Each round's
    results go to `keep` as they arrive."""
    wl, target = template.workload.key, template.target.name
    budget = 2 * count * (CONFIRM_TIMINGS - 1)
    while budget > 0:
        short = [r.index for r, n in leaders(records(), wl, target, count, unit) if n < CONFIRM_TIMINGS]
        if not short:
            return
        short = short[:budget]
        keep(short, measure(short))
        budget -= len(short)
