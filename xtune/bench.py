"""Benchmarks: a workload, board and config in, a `BenchReport` out: xtune vs numpy and (with the `bench`
extra) ONNX Runtime, each on one thread, measured in the same run."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from xtune.boards.board import Board
from xtune.errors import BoardError
from xtune.peers import numpy_seconds, ort_gflops
from xtune.schedule.space import KnobValue
from xtune.templates import template_for
from xtune.tuning.measure import CompilePool, MeasureOptions, Measurer, MeasureStatus
from xtune.workload import Workload


@dataclass(frozen=True)
class BenchReport:
    workload: str
    target: str
    board: str
    config_index: int
    config: tuple[tuple[str, KnobValue], ...]
    config_source: str  # "default", "given" or "log"
    status: MeasureStatus
    error: str
    seconds: float  # median per call; inf unless OK
    gflops: float
    numpy_gflops: float
    peak_gflops: float  # the target descriptor's nominal single-core peak
    ort_gflops: float | None = None  # ONNX Runtime, one thread, same run; None without the `bench` extra

    @property
    def ratio(self) -> float:
        return self.gflops / self.numpy_gflops if self.numpy_gflops else 0.0

    @property
    def ratio_vs_ort(self) -> float | None:
        return self.gflops / self.ort_gflops if self.ort_gflops else None

    def as_dict(self) -> dict[str, object]:
        return {
            "workload": self.workload, "target": self.target, "board": self.board,
            "config_index": self.config_index, "config": dict(self.config),
            "config_source": self.config_source,
            "status": self.status.value, "correct": self.status is MeasureStatus.OK, "error": self.error,
            "seconds": self.seconds if self.status is MeasureStatus.OK else None,
            "gflops": round(self.gflops, 3), "numpy_gflops": round(self.numpy_gflops, 3),
            "ratio_vs_numpy": round(self.ratio, 4),
            "ort_gflops": round(self.ort_gflops, 3) if self.ort_gflops else None,
            "ratio_vs_ort": round(self.ratio_vs_ort, 4) if self.ratio_vs_ort is not None else None,
            "percent_of_peak": round(100 * self.gflops / self.peak_gflops, 2),
        }  # fmt: skip


def bench(
    workload: Workload,
    board: Board,
    config_index: int | None = None,
    config_source: str = "given",
    options: MeasureOptions | None = None,
    pool: CompilePool | None = None,
) -> BenchReport:
    """Measure one config (the template's default when `config_index` is None) and numpy, in one run."""
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
    ort = ort_gflops(workload)
    if result.ok and result.cost_unit != "s":  # emulated board: a correctness check, not a speed
        return BenchReport(
            workload.key, board.target.name, board.name, config_index, config.values, config_source,
            result.status, f"{result.cost:.0f} instructions per call (emulated; no wall-time figure)",
            result.cost, 0.0, flops / np_seconds / 1e9, board.target.peak_gflops, ort_gflops=ort,
        )  # fmt: skip
    return BenchReport(
        workload.key, board.target.name, board.name, config_index, config.values, config_source,
        result.status, result.error, result.cost, flops / result.cost / 1e9 if result.ok else 0.0,
        flops / np_seconds / 1e9, board.target.peak_gflops, ort_gflops=ort,
    )  # fmt: skip


def retime_gflops(workload: Workload, board: Board, indices: Sequence[int], rounds: int) -> list[list[float]]:
    """GFLOP/s of each config (built once; checked and timed in each round, 0 if it fails) in each of
    `rounds` interleaved rounds, one list per config: a slow spell of the host falls on all of them alike.
    For benchmarks that ask how fast a config really is, apart from the one timing a tuning run gave it."""
    pool = CompilePool()
    measurer = Measurer(board, workload, MeasureOptions(), pool)
    try:
        built = list(pool.build_all(workload, board.target, list(indices)))
        rows = [[workload.flops() / measurer.run(b).cost / 1e9 for b in built] for _ in range(rounds)]
    finally:
        measurer.close()
        pool.close()
    return [list(column) for column in zip(*rows, strict=True)]
