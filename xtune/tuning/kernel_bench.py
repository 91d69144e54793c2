"""Benchmarks: a workload, board and config in, a `BenchReport` out: xtune vs numpy and (with the `bench`
extra) ONNX Runtime, each on one thread, measured in the same run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from xtune.boards.board import Board
from xtune.boards.cost import WALL_UNITS, CostUnit, gflops
from xtune.errors import BoardError
from xtune.ops.registry import template_for
from xtune.ops.workload import Workload
from xtune.schedule.space import KnobValue
from xtune.tuning.measure import CompilePool, Measurer, MeasureStatus
from xtune.tuning.options import MeasureOptions
from xtune.tuning.peers import numpy_seconds, ort_gflops

ConfigSource = Literal["default", "given", "log"]


@dataclass(frozen=True, kw_only=True)
class BenchReport:
    workload: str
    target: str
    board: str
    config_index: int
    config: tuple[tuple[str, KnobValue], ...]
    config_source: ConfigSource
    status: MeasureStatus
    error: str  # why the status is not OK; "" when it is
    cost_unit: CostUnit  # what the board measures
    cost: float  # median per call in `cost_unit`; inf unless OK on a board that gives a figure
    gflops: float | None  # None unless the cost is a wall time
    numpy_gflops: float
    peak_gflops: float  # the target descriptor's nominal single-core peak
    ort_gflops: float | None = None  # ONNX Runtime, one thread, same run; None without the `bench` extra

    @property
    def correct(self) -> bool:
        return self.status is MeasureStatus.OK

    @property
    def ratio(self) -> float | None:
        return self.gflops / self.numpy_gflops if self.gflops and self.numpy_gflops else None

    @property
    def ratio_vs_ort(self) -> float | None:
        return self.gflops / self.ort_gflops if self.gflops and self.ort_gflops else None

    def as_dict(self) -> dict[str, object]:
        figure = self.cost if self.correct and self.cost_unit is not CostUnit.NONE else None
        ratio, gf = self.ratio, self.gflops
        return {
            "workload": self.workload,
            "target": self.target,
            "board": self.board,
            "config_index": self.config_index,
            "config": dict(self.config),
            "config_source": self.config_source,
            "status": self.status.value,
            "correct": self.correct,
            "error": self.error,
            "cost_unit": self.cost_unit.value,
            "seconds": figure if self.cost_unit in WALL_UNITS else None,
            "instructions": figure if self.cost_unit is CostUnit.INSTRUCTIONS else None,
            "cycles": figure if self.cost_unit is CostUnit.CYCLES else None,
            "gflops": round(gf, 3) if gf is not None else None,
            "numpy_gflops": round(self.numpy_gflops, 3),
            "ratio_vs_numpy": round(ratio, 4) if ratio is not None else None,
            "percent_of_peak": round(100 * gf / self.peak_gflops, 2) if gf is not None else None,
            "ort_gflops": round(self.ort_gflops, 3) if self.ort_gflops else None,
            "ratio_vs_ort": round(self.ratio_vs_ort, 4) if self.ratio_vs_ort is not None else None,
        }


def bench(
    workload: Workload,
    board: Board,
    config_index: int | None = None,
    config_source: ConfigSource = "given",
    options: MeasureOptions | None = None,
    pool: CompilePool | None = None,
) -> BenchReport:
    """Measure one config (the template's default when `config_index` is None) and numpy, in one run.

    Any board will do, a correctness-only one too: its report says whether the config is correct."""
    template = template_for(workload, board.target)
    if config_index is None:
        config_index, config_source = template.default_config().index, "default"
    config = template.space.config(config_index)
    measurer = Measurer(board, workload, options or MeasureOptions(repeat=5, min_repeat_ms=50), pool)
    try:
        result = measurer.measure([config_index])[0]
    finally:
        measurer.close()
    # No measurement is an error (exit 2 from the CLI), not a result: the board failed for good, or a
    # transient fault outlasted the retry (docs/boards.md, "Faults").
    if measurer.failure is not None:
        raise measurer.failure
    if result.status is MeasureStatus.BOARD_ERROR:
        raise BoardError(result.error, transient=False)
    np_seconds = float(np.median(numpy_seconds(workload)))
    flops = workload.flops()
    # ONNX Runtime runs on this host: a peer of a wall time measured here, not of a count or a remote board.
    ort = ort_gflops(workload) if result.cost_unit in WALL_UNITS else None
    return BenchReport(
        workload=workload.key,
        target=board.target.name,
        board=board.name,
        config_index=config_index,
        config=config.values,
        config_source=config_source,
        status=result.status,
        error=result.error,
        cost_unit=result.cost_unit,
        cost=result.cost,
        gflops=gflops(flops, result.cost, result.cost_unit),
        numpy_gflops=flops / np_seconds / 1e9,
        peak_gflops=board.target.peak_gflops,
        ort_gflops=ort,
    )


def retime_gflops(workload: Workload, board: Board, indices: Sequence[int], rounds: int) -> list[list[float]]:
    """GFLOP/s of each config (built once; checked and timed in each round, 0 if it fails) in each of
    `rounds` interleaved rounds, one list per config: a slow spell of the host falls on all of them alike.
    For benchmarks that ask how fast a config really is, apart from the one timing a tuning run gave it;
    a board that gives no wall time gives 0 throughout."""
    pool = CompilePool()
    measurer = Measurer(board, workload, MeasureOptions(), pool)
    flops = workload.flops()
    try:
        built = list(pool.build_all(workload, board.target, list(indices)))
        rows = [
            [gflops(flops, r.cost, r.cost_unit) or 0.0 for r in map(measurer.run, built)]
            for _ in range(rounds)
        ]
    finally:
        measurer.close()
        pool.close()
    return [list(column) for column in zip(*rows, strict=True)]
