"""Progress bars on stderr and the result printers of `xtune tune`."""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from xtune.cli.common import one_line

if TYPE_CHECKING:
    from tqdm import tqdm

    from xtune.boards.cost import CostUnit
    from xtune.frontend.tasks import Task
    from xtune.tuning.loop import TuneProgress
    from xtune.tuning.results import ModelProgress, ModelTuningResult
    from xtune.tuning.run import TuningReport


class _Bar:
    """tqdm on stderr over `total` trials, drawn from the first finished batch on: a run the library
    refuses (its checks come first) prints its one error line and no bar."""

    def __init__(self, total: int) -> None:
        self.total = total
        self._bar: tqdm | None = None

    @property
    def bar(self) -> tqdm:
        if self._bar is None:
            from tqdm import tqdm

            self._bar = tqdm(total=self.total, unit="trial", file=sys.stderr, dynamic_ncols=True, leave=True)
        return self._bar

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class _ProgressBar(_Bar):
    """Trials done, best GFLOP/s (or instructions), % of numpy, failures, ETA."""

    def __init__(self, total: int, flops: int, numpy_gflops: float | None, unit: CostUnit):
        super().__init__(total)
        self.flops, self.numpy_gflops, self.failed, self.unit = flops, numpy_gflops, 0, unit

    def update(self, progress: TuneProgress) -> None:
        from xtune.boards.cost import gflops

        self.failed += sum(1 for r in progress.results if not r.ok)
        post: dict[str, object] = {"failed": self.failed}
        speed = gflops(self.flops, progress.best_cost, self.unit)  # the boards' unit, never a result's
        if speed is not None:
            post["best"] = f"{speed:.1f} GFLOP/s"
            if self.numpy_gflops:
                post["numpy"] = f"{100 * speed / self.numpy_gflops:.0f}%"
        elif progress.best_cost < float("inf"):
            post["best"] = f"{progress.best_cost:.0f} {self.unit.value}"
        self.bar.set_postfix(post, refresh=False)
        self.bar.update(len(progress.batch))


def _print_tuning(report: TuningReport, log: str) -> None:
    counts = ", ".join(f"{k} {v}" for k, v in report.counts if v)
    print(
        f"{report.workload} on {'+'.join(report.boards)} ({report.target}): {report.trials} trials"
        f" ({counts}), {report.resumed} resumed from {log}, stopped: {report.stop.value}"
    )
    if report.best_index is None:
        print("  no correct config yet")
        return
    knobs = ", ".join(f"{k}={v}" for k, v in report.best_knobs)
    print(f"  best config #{report.best_index}: {knobs}")
    timed = report.timings_text()
    if report.best_gflops is not None:
        line = f"  best {report.best_gflops:.1f} GFLOP/s ({report.best_cost * 1e3:.3f} ms, {timed})"
        if report.numpy_gflops:
            line += (
                f"; numpy {report.numpy_gflops:.1f} GFLOP/s; {report.best_gflops / report.numpy_gflops:.2f}x"
            )
        print(line)
    else:
        print(
            f"  best {report.best_cost:.0f} {report.cost_unit.noun} per call ({timed}; emulated board: "
            "not a wall time)"
        )
    print(f"  {report.seconds:.1f} s wall, of which {report.tuner_seconds:.1f} s in the tuner")


def _cost_text(cost: float, unit: CostUnit) -> str:
    from xtune.boards.cost import WALL_UNITS

    if not math.isfinite(cost):
        return "-"
    if unit not in WALL_UNITS:
        return f"{cost:.0f} {unit.value}"
    return f"{cost * 1e3:.4g} ms" if cost >= 1e-4 else f"{cost * 1e6:.4g} us"


class _ModelProgressBar(_Bar):
    """Over the model's budget; a line per batch: the task, its best, the model estimate."""

    def __init__(self, total: int, tasks: Sequence[Task], unit: CostUnit):
        super().__init__(total)
        self.tasks, self.unit = tasks, unit

    def update(self, progress: ModelProgress) -> None:
        task, unit = self.tasks[progress.task], self.unit  # the boards' unit, never a result's
        model = _cost_text(progress.estimate, unit)
        self.bar.write(
            f"[{progress.trials:>5}/{progress.budget}] task {progress.task + 1}/{len(self.tasks)} "
            f"{task.workload.key} (x{task.count}): best "
            f"{_cost_text(progress.latencies[progress.task], unit)}; model {model}",
            file=sys.stderr,
        )
        self.bar.set_postfix({"model": model}, refresh=False)
        self.bar.update(len(progress.batch.batch))


def _print_model_tuning(result: ModelTuningResult, log: str) -> None:
    unit, model = result.cost_unit, one_line(result.model)
    print(
        f"{model} on {'+'.join(result.boards)} ({result.target}), {result.strategy.value}: "
        f"{result.trials} of {result.budget} trials, stopped: {result.stop.value}; log {log}"
    )
    width = max(len("workload"), *(len(t.workload) for t in result.tasks))
    print(
        f"{'workload':<{width}} {'nodes':>5} {'trials':>6} {'resumed':>7} {'default':>11} {'best':>11} "
        f"{'speedup':>7}  stop"
    )
    for t in result.tasks:
        gain = t.default_cost / t.best_cost if 0 < t.best_cost < float("inf") > t.default_cost else None
        print(
            f"{t.workload:<{width}} {t.count:>5} {t.trials:>6} {t.resumed:>7} "
            f"{_cost_text(t.default_cost, unit):>11} {_cost_text(t.best_cost, unit):>11} "
            f"{f'{gain:.2f}x' if gain else '-':>7}  {t.stop.value}"
        )
    line = f"estimated end-to-end latency: {_cost_text(result.estimate, unit)}"
    if 0 < result.estimate < float("inf") > result.default_estimate:
        line += (
            f" (default configs: {_cost_text(result.default_estimate, unit)}, "
            f"{result.default_estimate / result.estimate:.2f}x)"
        )
    print(line + " = sum of node count x best latency over the tasks")
