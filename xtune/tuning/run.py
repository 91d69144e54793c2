"""Tuning runs: a workload, boards, options and a log in; log records and a `TuningReport` out."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from enum import Enum

import numpy as np

from xtune.boards.board import Board, LocalBoard
from xtune.boards.cost import COUNTED_UNITS, CostUnit, gflops
from xtune.files import PathLike
from xtune.ops.template import ScheduleTemplate
from xtune.ops.workload import Workload
from xtune.tuning.costmodel import CostModel
from xtune.tuning.database import Record, TuningLog, log_target
from xtune.tuning.loop import StopReason, StopTuning, TuneProgress, TuneSummary
from xtune.tuning.options import CONFIRM_TIMINGS, TuneOptions
from xtune.tuning.peers import numpy_seconds
from xtune.tuning.ranking import leaders
from xtune.tuning.session import TuningSession, check_run


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
    best_cost: float  # per call in `cost_unit`: its median timing (an exact count for a counted unit)
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
            what = "a deterministic estimate" if self.cost_unit is CostUnit.CYCLES else "an exact count"
            return what if n == 1 else f"{what}, counted {n} times"
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


def run_tuning(
    workload: Workload,
    boards: Sequence[Board],
    options: TuneOptions,
    log: TuningLog | None = None,
    on_progress: Callable[[TuneProgress], None] | None = None,
    numpy_gflops: float | None = None,
    pretrained: CostModel | None = None,
    hedge_with_estimate: bool = False,
    reads: Sequence[tuple[PathLike | None, str]] = (),
    transfer: Callable[[], tuple[CostModel | None, bool]] | None = None,
) -> TuningReport:
    """Tune `workload` on `boards` (all of one target) for `options.trials`, then confirm the leaders;
    every finished batch is appended to `log`, each record with the name and fingerprint of the board
    that measured it. The run is checked first (session.check_run; `reads`: the files `log` must not be).
    A board that fails for good stops the run (stop BOARD_FAILED, `error` says why). `pretrained` and
    `hedge_with_estimate`: see TuningSession; or `transfer` gives both once the run is checked (so that
    a refused run trains no model)."""
    check_run(boards, options, log, reads=reads, pretrained=pretrained is not None or transfer is not None)
    if transfer is not None:
        pretrained, hedge_with_estimate = transfer()
    session = TuningSession(
        workload,
        boards,
        options,
        log,
        pretrained=pretrained,
        hedge_with_estimate=hedge_with_estimate,
        callbacks=[on_progress] if on_progress else [],
    )
    stop, start = StopReason.INTERRUPTED, time.perf_counter()
    try:
        summary = session.run(options.trials, options.batch_size, options.early_stopping)
        if summary.stop not in (StopReason.INTERRUPTED, StopReason.BOARD_FAILED):
            session.confirm(options.confirm)
        stop = summary.stop
    except StopTuning as request:  # a board failed while confirming
        stop = request.reason
    except KeyboardInterrupt:
        pass  # while confirming: every timing taken is kept, the run reports itself interrupted
    finally:
        session.close()
    report = _report(
        workload,
        session.template,
        boards,
        options,
        summary,
        stop,
        session.records(),
        session.resumed,
        session.confirm_timings,
        numpy_gflops,
    )
    # The whole run's wall time, confirming included (summary.seconds is the tuning loop's alone).
    return replace(report, seconds=time.perf_counter() - start, error=str(session.failure or ""))


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
    unit, wl, target = options.measure.unit_on(boards[0].cost_unit), workload.key, template.target.name
    top = leaders(records, wl, log_target(workload, template.target), 1, unit)
    best_cost, best_index, best_timings = math.inf, None, 0
    if top:
        best_cost, best_index, best_timings = top[0].cost, top[0].index, top[0].timings
    flops = workload.flops()
    return TuningReport(
        workload=wl,
        target=target,
        boards=tuple(b.name for b in boards),
        options=options,
        trials=summary.trials,
        resumed=resumed,
        counts=tuple((s.value, n) for s, n in summary.counts),
        best_index=best_index,
        best_knobs=template.space.config(best_index).values if best_index is not None else (),
        best_cost=best_cost,
        best_timings=best_timings,
        confirmation=_confirmation(unit, best_timings, options, stop) if top else None,
        confirm_timings=confirm_timings,
        cost_unit=unit,
        best_gflops=gflops(flops, best_cost, unit),
        numpy_gflops=numpy_gflops,
        seconds=summary.seconds,
        tuner_seconds=summary.tuner_seconds,
        curve_gflops=tuple(gflops(flops, c, unit) or 0.0 for c in summary.curve),
        stop=stop,
    )


def _confirmation(unit: CostUnit, timings: int, options: TuneOptions, stop: StopReason) -> Confirmation:
    """Why the best has `timings` timings (see `_confirm`, which gives it CONFIRM_TIMINGS unless one of
    these stopped it)."""
    if unit in COUNTED_UNITS:
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
