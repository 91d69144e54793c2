"""Tuning runs: a workload, boards, options and a log in; log records and a `TuningReport` out."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import numpy as np

from xtune.boards.board import Board, LocalBoard
from xtune.peers import numpy_seconds
from xtune.templates import ScheduleTemplate
from xtune.tuning.costmodel import CostModel
from xtune.tuning.database import Record, TuningLog, leaders
from xtune.tuning.measure import MeasureOptions
from xtune.tuning.session import TuningSession
from xtune.tuning.tuner import StopReason, TuneProgress, TuneSummary
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
    # At the end of a run the `confirm` fastest configs are timed again until each has session.CONFIRM_TIMINGS
    # timings, and the best is the config with the lowest median (database.best): on a noisy host the
    # fastest of a run's single timings is mostly the luckiest (docs/benchmarks.md, "winner's curse"),
    # and `xtune build` should ship the fastest kernel, not the best-timed one. 0 skips it.
    confirm: int = 3


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
    """Tune `workload` on `boards` (all of one target) for `options.trials`, then confirm the leaders;
    every finished batch is appended to `log`. `pretrained` and `hedge_with_estimate`: see TuningSession."""
    session = TuningSession(workload, boards, options, log, pretrained=pretrained,
                            hedge_with_estimate=hedge_with_estimate,
                            callbacks=[on_progress] if on_progress else [])  # fmt: skip
    stop = StopReason.INTERRUPTED
    try:
        summary = session.run(options.trials, options.batch_size, options.early_stopping)
        if summary.stop is not StopReason.INTERRUPTED:
            session.confirm(options.confirm)
        stop = summary.stop
    except KeyboardInterrupt:
        pass  # while confirming: every timing taken is kept, the run reports itself interrupted
    finally:
        session.close()
    return _report(
        workload,
        session.template,
        boards,
        options,
        summary,
        stop,
        session.records(),
        session.resumed,
        len(session.this_run) - summary.trials,
        numpy_gflops,
    )


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
