"""Tuning runs: a workload, boards, options and a log in; log records and a `TuningReport` out."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

import numpy as np

from xtune.boards.board import Board, LocalBoard
from xtune.errors import InputError
from xtune.peers import numpy_seconds
from xtune.templates import ScheduleTemplate, template_for
from xtune.tuning.costmodel import CostModel
from xtune.tuning.database import Record, TuningLog, leaders, make_record, measured, of_machine
from xtune.tuning.features import estimate_prior, features_op, featurize
from xtune.tuning.measure import CompilePool, MeasureOptions, Measurer, MeasureResult, MeasureStatus
from xtune.tuning.tuner import StopReason, TuneProgress, TuneSummary, make_tuner, tune
from xtune.workload import Workload


@dataclass(frozen=True)
class TuneOptions:
    """Everything a tuning run was asked to do; written into the report and (measure part) the log."""

    tuner: str = "xgb"
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


@dataclass(frozen=True)
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
    best_cost: float  # seconds per call (or instructions, when cost_unit is "insn"): its median timing
    best_timings: int  # how many timings of the best config that median is over
    confirm_timings: int  # timings this run added to confirm its leaders (not counted in trials)
    cost_unit: str
    best_gflops: float | None
    numpy_gflops: float | None  # single thread, measured in this run (local board only)
    seconds: float
    tuner_seconds: float
    curve_gflops: tuple[float, ...]  # best-so-far GFLOP/s after each trial of this run (0 before any OK)
    stop: str

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["options"] = {**asdict(self.options), "measure": asdict(self.options.measure)}
        d["counts"] = dict(self.counts)
        d["best_config"] = {"index": self.best_index, "knobs": dict(self.best_knobs)}
        del d["best_knobs"], d["best_index"]
        d["best_cost"] = self.best_cost if math.isfinite(self.best_cost) else None
        ratio = self.best_gflops / self.numpy_gflops if self.best_gflops and self.numpy_gflops else None
        d["ratio_vs_numpy"] = round(ratio, 4) if ratio else None
        return d


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
    """Tune `workload` on `boards` (all of one target); every finished batch is appended to `log`.

    `pretrained` (transfer learning, xgb tuner only) scores the configs of this workload's operator: it
    ranks the first batches and is the fading base of the local model (see XGBoostCostModel). With
    `hedge_with_estimate` (for a model that saw no logs of this target) the analytic estimate shares those
    first batches with it, and then whichever of the two picked the fastest config is the base."""
    if not boards:
        raise InputError("no board to tune on")
    if pretrained is not None and options.tuner != "xgb":
        raise InputError(f"a pretrained model (--transfer-from) needs the xgb tuner, not {options.tuner}")
    target = boards[0].target
    if any(b.target != target for b in boards):
        raise InputError("all --board flags of one run must be boards of the same target")
    if len({b.cost_unit for b in boards}) > 1:
        raise InputError("boards of one run must measure the same thing (wall time or instruction counts)")
    template = template_for(workload, target)
    if log is not None:
        log.check_appendable()
    fingerprint = tuple(sorted(boards[0].fingerprint().items()))
    past = past_records(log, template, dict(fingerprint).get("cpu"))
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
    label, space, wl = "+".join(b.name for b in boards), template.space, workload.key
    this_run: list[Record] = []

    def keep(batch: Sequence[int], results: Sequence[MeasureResult]) -> None:
        records = [make_record(wl, target.name, label, space.config(i), r, options.measure, fingerprint)
                   for i, r in zip(batch, results, strict=True)]  # fmt: skip
        this_run.extend(records)
        if log is not None:
            log.append(records)

    callbacks = [lambda progress: keep(progress.batch, progress.results)]
    callbacks += [on_progress] if on_progress else []
    pool = CompilePool()
    measure = _BoardsMeasurer(boards, workload, options.measure, pool)
    stop = StopReason.INTERRUPTED
    try:
        summary = tune(template.space, tuner, measure, options.trials, options.batch_size,
                       options.early_stopping, callbacks)  # fmt: skip
        # Instruction counts (emulated boards) are exact: timing them again would add nothing.
        if summary.stop is not StopReason.INTERRUPTED and boards[0].cost_unit == "s":
            _confirm(lambda: past + this_run, template, boards[0].cost_unit, options.confirm, measure, keep)
        stop = summary.stop
    except KeyboardInterrupt:
        pass  # while confirming: every timing taken is kept, the run reports itself interrupted
    finally:
        measure.close()
        pool.close()
    return _report(
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
    gflops = flops / best_cost / 1e9 if unit == "s" and math.isfinite(best_cost) else None
    curve = tuple(flops / c / 1e9 if unit == "s" and math.isfinite(c) else 0.0 for c in summary.curve)
    return TuningReport(
        wl, target, tuple(b.name for b in boards), options,
        summary.trials, resumed,
        tuple((s.value, n) for s, n in summary.counts), best_index,
        template.space.config(best_index).values if best_index is not None else (),
        best_cost, best_timings, confirm_timings, unit, gflops,
        numpy_gflops, summary.seconds, summary.tuner_seconds, curve, stop.value,
    )  # fmt: skip


def local_numpy_gflops(workload: Workload, boards: Sequence[Board]) -> float | None:
    """numpy's single-thread GFLOP/s on this host, when the boards are this host (else not comparable)."""
    if not all(isinstance(b, LocalBoard) for b in boards):
        return None
    return workload.flops() / float(np.median(numpy_seconds(workload))) / 1e9
