"""Tuning runs: a workload, boards, options and a log in; log records and a `TuningReport` out."""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Callable, Collection, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from enum import Enum

import numpy as np

from xtune.boards.board import Board, LocalBoard
from xtune.boards.cost import CostUnit, gflops
from xtune.errors import BoardError, InputError
from xtune.peers import numpy_seconds
from xtune.templates import ScheduleTemplate, template_for
from xtune.tuning.costmodel import CostModel
from xtune.tuning.database import (
    Record,
    TuningLog,
    config_of,
    cpu_of,
    leaders,
    make_record,
    measured,
    of_machine,
    unmeasured,
)
from xtune.tuning.features import estimate_prior, features_op, featurize
from xtune.tuning.measure import CompilePool, MeasureOptions, Measurer, MeasureResult
from xtune.tuning.tuner import StopReason, StopTuning, TuneProgress, TunerName, TuneSummary, make_tuner, tune
from xtune.workload import Workload


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """Everything a tuning run was asked to do; written into the report and (measure part) the log."""

    tuner: TunerName = "xgb"
    trials: int = 64
    batch_size: int = 16
    early_stopping: int | None = None
    seed: int = 0
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    # Measure the template's heuristic default first, so a tuned result is never worse than it.
    # Benchmarks of search efficiency turn it off to compare tuners on their own picks.
    start_from_default: bool = True
    # With no pretrained model, the xgb tuner ranks its first batch by the analytic estimate (features.py)
    # and keeps it as a fading base; False makes it start blind (random first batch), as AutoTVM did.
    analytic_prior: bool = True
    # At the end of a run the `confirm` fastest configs are timed again until each has CONFIRM_TIMINGS
    # timings, and the best is the config with the lowest median (database.best): on a noisy host the
    # fastest of a run's single timings is mostly the luckiest (docs/benchmarks.md, "winner's curse"),
    # and `xtune build` should ship the fastest kernel, not the best-timed one. 0 skips it.
    confirm: int = 3


CONFIRM_TIMINGS = 3


class Confirmation(Enum):
    """How the best's figure stands to the promise of `TuneOptions.confirm` (a median of CONFIRM_TIMINGS
    timings), and why, when it has fewer."""

    CONFIRMED = "confirmed"  # a median of CONFIRM_TIMINGS timings or more
    EXACT = "exact"  # an instruction count: exactly reproducible, one count is the figure
    OFF = "off"  # the run was asked not to confirm (confirm=0)
    INTERRUPTED = "interrupted"  # the run stopped before its leaders were timed again
    FAILED = "failed"  # timing it again failed (timeouts or board errors) as often as it was tried


_SHORT_BECAUSE = {
    Confirmation.OFF: "confirmation is off (--confirm 0)",
    Confirmation.INTERRUPTED: "interrupted before the leaders were timed again",
    Confirmation.FAILED: "timing it again failed",
}


@dataclass(frozen=True, kw_only=True)
class TuningReport:
    workload: str
    target: str
    boards: tuple[str, ...]
    options: TuneOptions
    trials: int  # measured in this run
    resumed: int  # configs already in the log, learned from and not measured again
    counts: tuple[tuple[str, int], ...]  # this run's trials by status
    best_index: int | None  # over the log's whole history and this run
    best_knobs: tuple[tuple[str, object], ...]
    best_cost: float  # per call in `cost_unit`: its median timing (an exact count for INSTRUCTIONS)
    best_timings: int  # how many timings of the best config that median is over
    confirmation: Confirmation | None  # whether best_timings keeps the promise of `confirm`; None: no best
    confirm_timings: int  # timings this run added to confirm its leaders (not counted in trials)
    cost_unit: CostUnit  # what the boards measure
    best_gflops: float | None
    numpy_gflops: float | None  # single thread, measured in this run (local board only)
    seconds: float
    tuner_seconds: float
    curve_gflops: tuple[float, ...]  # best-so-far GFLOP/s after each trial of this run (0 before any OK)
    stop: StopReason
    error: str = ""  # why the run stopped, when a board failed for good (stop BOARD_FAILED)

    def timings_text(self) -> str:
        """How many timings the best's figure is over, and why not CONFIRM_TIMINGS when fewer."""
        n = self.best_timings
        if self.confirmation is Confirmation.EXACT:
            return "an exact count" if n == 1 else f"an exact count, counted {n} times"
        timed = "timed once" if n == 1 else f"median of {n} timings"
        if self.confirmation is None or self.confirmation is Confirmation.CONFIRMED:
            return timed
        return f"{timed}: {_SHORT_BECAUSE[self.confirmation]}"

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["options"] = {**asdict(self.options), "measure": asdict(self.options.measure)}
        d["counts"] = dict(self.counts)
        d["best_config"] = {"index": self.best_index, "knobs": dict(self.best_knobs)}
        del d["best_knobs"], d["best_index"]
        d["best_cost"] = self.best_cost if math.isfinite(self.best_cost) else None
        d["cost_unit"], d["stop"] = self.cost_unit.value, self.stop.value
        d["confirmation"] = self.confirmation.value if self.confirmation else None
        ratio = self.best_gflops / self.numpy_gflops if self.best_gflops and self.numpy_gflops else None
        d["ratio_vs_numpy"] = round(ratio, 4) if ratio else None
        return d


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
            raise InputError(f"board '{b.name}' checks correctness only (emulated wall time ranks nothing, "
                             f"docs/boards.md): tune on a timing or instruction-counting board; "
                             f"`xtune bench --board {b.name}` checks a config on it")  # fmt: skip
    if len({b.cost_unit for b in boards}) > 1:
        raise InputError("boards of one run must measure the same thing (wall time or instruction counts)")


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

    def close(self) -> None:
        for measurer in self.measurers:
            measurer.close()
        if self.threads is not None:
            self.threads.shutdown()


def past_records(
    log: TuningLog | None, template: ScheduleTemplate, cpus: Collection[str] | None = None
) -> list[Record]:
    """Records of this workload and target already in the log, measured on one of `cpus` (any if None;
    records without a fingerprint count as any cpu's), whose knobs still mean the same config."""
    if log is None:
        return []
    return [
        r
        for r in of_machine(log.read(), template.workload.key, template.target.name)
        if (cpus is None or cpu_of(r) in (None, *cpus)) and config_of(template, r) is not None
    ]


def run_tuning(
    workload: Workload,
    boards: Sequence[Board],
    options: TuneOptions,
    log: TuningLog | None = None,
    on_progress: Callable[[TuneProgress], None] | None = None,
    numpy_gflops: float | None = None,
    pretrained: CostModel | None = None,
    hedge_with_estimate: bool = False,
) -> TuningReport:
    """Tune `workload` on `boards` (all of one target, see `check_boards`); every finished batch is
    appended to `log`, each record with the name and fingerprint of the board that measured it.

    `pretrained` (transfer learning, xgb tuner only) scores the configs of this workload's operator: it
    ranks the first batches and is the fading base of the local model (see XGBoostCostModel). With
    `hedge_with_estimate` (for a model that saw no logs of this target) the analytic estimate shares those
    first batches with it, and then whichever of the two picked the fastest config is the base."""
    check_boards(boards)
    if pretrained is not None and options.tuner != "xgb":
        raise InputError(f"a pretrained model (--transfer-from) needs the xgb tuner, not {options.tuner}")
    target, unit = boards[0].target, boards[0].cost_unit
    template = template_for(workload, target)
    if log is not None:
        log.check_appendable()
    fingerprints = [tuple(sorted(b.fingerprint().items())) for b in boards]
    past = past_records(log, template, {cpu for fp in fingerprints if (cpu := dict(fp).get("cpu"))})
    history = measured(past, workload.key, target.name)
    op = features_op(template)
    estimate = estimate_prior(op)
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
        anchors=[template.default_config().index],
        estimate=estimate if options.analytic_prior else None,
    )
    if history:
        tuner.load_history(list(history), [r.result for r in history.values()])
    if options.start_from_default:
        tuner.propose_first([template.default_config().index])
    # Configs an earlier run chose but lost to a board error: measured first (docs/boards.md, "Faults").
    tuner.propose_first(unmeasured(past, workload.key, target.name))
    space, wl = template.space, workload.key
    this_run: list[Record] = []
    pool = CompilePool()
    measure = _BoardsMeasurer(boards, workload, options.measure, pool)

    def keep(batch: Sequence[int], results: Sequence[MeasureResult]) -> None:
        dealt = measure.dealt(len(batch))
        records = [make_record(wl, target.name, boards[b].name, space.config(i), r, options.measure,
                               fingerprints[b])
                   for i, r, b in zip(batch, results, dealt, strict=True)]  # fmt: skip
        this_run.extend(records)
        if log is not None:
            log.append(records)

    def stop_if_failed() -> None:
        if measure.failure is not None:  # called after keep: the batch, its board errors too, is logged
            raise StopTuning(StopReason.BOARD_FAILED)

    def keep_or_stop(batch: Sequence[int], results: Sequence[MeasureResult]) -> None:
        keep(batch, results)
        stop_if_failed()

    callbacks = [lambda progress: keep(progress.batch, progress.results)]
    callbacks += [on_progress] if on_progress else []
    callbacks += [lambda progress: stop_if_failed()]
    stop, start = StopReason.INTERRUPTED, time.perf_counter()
    try:
        summary = tune(template.space, tuner, measure, options.trials, options.batch_size,
                       options.early_stopping, callbacks)  # fmt: skip
        # Instruction counts (emulated boards) are exact: timing them again would add nothing.
        done = summary.stop not in (StopReason.INTERRUPTED, StopReason.BOARD_FAILED)
        if done and unit is CostUnit.SECONDS:
            _confirm(lambda: past + this_run, template, options.confirm, measure, keep_or_stop)
        stop = summary.stop
    except StopTuning as request:  # a board failed while confirming
        stop = request.reason
    except KeyboardInterrupt:
        pass  # while confirming: every timing taken is kept, the run reports itself interrupted
    finally:
        measure.close()
        pool.close()
    report = _report(
        workload,
        template,
        boards,
        options,
        summary,
        stop,
        past + this_run,
        len(history),
        len(this_run) - summary.trials,
        numpy_gflops,
    )
    # The whole run's wall time, confirming included (summary.seconds is the tuning loop's alone).
    return replace(report, seconds=time.perf_counter() - start, error=str(measure.failure or ""))


def _confirm(
    records: Callable[[], list[Record]],
    template: ScheduleTemplate,
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
    wl, target = template.workload.key, template.target.name
    budget = 2 * count * (CONFIRM_TIMINGS - 1)
    tries: Counter[int] = Counter()
    while True:
        top = [(r.index, n) for r, n in leaders(records(), wl, target, count, CostUnit.SECONDS)]
        short = [i for i, n in top if n < CONFIRM_TIMINGS and tries[i] < 2 * (CONFIRM_TIMINGS - 1)]
        short = short[:budget] if budget > 0 else [i for i in short[:1] if i == top[0][0]]
        if not short:
            return
        keep(short, measure(short))
        budget -= len(short)
        tries.update(short)


def _report(
    workload: Workload,
    template: ScheduleTemplate,
    boards: Sequence[Board],
    options: TuneOptions,
    summary: TuneSummary,
    stop: StopReason,
    records: list[Record],
    resumed: int,
    confirm_timings: int,
    numpy_gflops: float | None,
) -> TuningReport:
    """The run's report; its best is over the log's whole history and this run (`records`)."""
    unit, wl, target = boards[0].cost_unit, workload.key, template.target.name
    top = leaders(records, wl, target, 1, unit)
    best_cost, best_index, best_timings = math.inf, None, 0
    if top:
        best_cost, best_index, best_timings = top[0][0].cost, top[0][0].index, top[0][1]
    flops = workload.flops()
    return TuningReport(
        workload=wl, target=target, boards=tuple(b.name for b in boards), options=options,
        trials=summary.trials, resumed=resumed, counts=tuple((s.value, n) for s, n in summary.counts),
        best_index=best_index,
        best_knobs=template.space.config(best_index).values if best_index is not None else (),
        best_cost=best_cost, best_timings=best_timings,
        confirmation=_confirmation(unit, best_timings, options, stop) if top else None,
        confirm_timings=confirm_timings, cost_unit=unit, best_gflops=gflops(flops, best_cost, unit),
        numpy_gflops=numpy_gflops, seconds=summary.seconds, tuner_seconds=summary.tuner_seconds,
        curve_gflops=tuple(gflops(flops, c, unit) or 0.0 for c in summary.curve), stop=stop,
    )  # fmt: skip


def _confirmation(unit: CostUnit, timings: int, options: TuneOptions, stop: StopReason) -> Confirmation:
    """Why the best has `timings` timings (see `_confirm`, which gives it CONFIRM_TIMINGS unless one of
    these stopped it)."""
    if unit is CostUnit.INSTRUCTIONS:
        return Confirmation.EXACT
    if timings >= CONFIRM_TIMINGS:
        return Confirmation.CONFIRMED
    if options.confirm == 0:
        return Confirmation.OFF
    if stop is StopReason.INTERRUPTED:
        return Confirmation.INTERRUPTED
    return Confirmation.FAILED


def local_numpy_gflops(workload: Workload, boards: Sequence[Board]) -> float | None:
    """numpy's single-thread GFLOP/s on this host, when the boards are this host (else not comparable)."""
    if not all(isinstance(b, LocalBoard) for b in boards):
        return None
    return workload.flops() / float(np.median(numpy_seconds(workload))) / 1e9
