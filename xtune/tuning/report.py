"""Log reports: tuning-log records in, per-workload summary rows, text tables and a convergence plot out."""

from __future__ import annotations

import io
import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from xtune.boards.cost import WALL_UNITS, CostUnit, gflops
from xtune.errors import InputError
from xtune.files import write_atomic
from xtune.ops.registry import parse_workload
from xtune.tuning.database import Record
from xtune.tuning.ranking import build_choice, ranking_unit


@dataclass(frozen=True, kw_only=True)
class SummaryRow:
    """One (workload, target) of a log: how much was measured, and the best correct config."""

    workload: str
    target: str
    trials: int  # distinct configs measured
    failed: int  # of which never measured OK
    counts: tuple[tuple[str, int], ...]  # records by status (a config timed again has several)
    best: Record | None
    cost_unit: CostUnit | None  # what `best` was ranked by (ranking.ranking_unit); None if nothing ranks

    @property
    def best_gflops(self) -> float | None:
        if self.best is None or self.cost_unit is None:
            return None
        return gflops(parse_workload(self.workload).flops(), self.best.cost, self.cost_unit)

    @property
    def checked_only(self) -> bool:
        """Correct configs, but measured only on correctness-only boards: nothing to rank them by."""
        return self.best is None and self.trials > self.failed

    def as_dict(self) -> dict[str, object]:
        b = self.best
        return {
            "workload": self.workload,
            "target": self.target,
            "trials": self.trials,
            "failed": self.failed,
            "counts": dict(self.counts),
            "best": None
            if b is None or self.cost_unit is None
            else {
                "index": b.index,
                "knobs": dict(b.knobs),
                "cost": b.cost,
                "cost_unit": self.cost_unit.value,
                "gflops": self.best_gflops,
                "board": b.board,
                "time": b.time,
            },
        }


def _groups(records: Iterable[Record]) -> dict[tuple[str, str], list[Record]]:
    groups: dict[tuple[str, str], list[Record]] = {}
    for r in records:
        groups.setdefault((r.workload, r.target), []).append(r)
    return groups


def summarize(
    records: Sequence[Record], workload: str | None = None, target: str | None = None
) -> list[SummaryRow]:
    """One row per (workload, target), optionally filtered; `workload` may be given in any key order."""
    key = parse_workload(workload).key if workload is not None else None
    rows = []
    for (wl, tg), group in sorted(_groups(records).items()):
        if (key and wl != key) or (target and tg != target):
            continue
        top = build_choice(group, wl, tg)  # what `xtune build` takes, in the group's ranking unit
        unit = top.result.cost_unit if top else None
        counts = Counter(r.result.status.value for r in group)
        configs = {(r.index, r.knobs) for r in group}
        failed = len(configs - {(r.index, r.knobs) for r in group if r.result.ok})
        counts_sorted = tuple(sorted(counts.items()))
        row = SummaryRow(
            workload=wl,
            target=tg,
            trials=len(configs),
            failed=failed,
            counts=counts_sorted,
            best=top,
            cost_unit=unit,
        )
        rows.append(row)
    return rows


def format_table(rows: Sequence[SummaryRow]) -> str:
    lines = [f"{'workload':<44} {'target':<13} {'trials':>6} {'failed':>6} {'best':>14}  config"]
    for row in rows:
        if row.best is None:
            figure, config = ("checked only" if row.checked_only else "no correct run"), "-"
        else:
            gf = row.best_gflops
            unit = row.best.result.cost_unit.value
            figure = f"{gf:.1f} GFLOP/s" if gf is not None else f"{row.best.cost:.0f} {unit}"
            config = f"#{row.best.index} " + ",".join(f"{k}={v}" for k, v in row.best.knobs)
        lines.append(
            f"{row.workload:<44} {row.target:<13} {row.trials:>6} {row.failed:>6} {figure:>14}  {config}"
        )
    return "\n".join(lines)


def convergence(group: Sequence[Record]) -> tuple[list[float], list[float]]:
    """Each trial's figure of merit (GFLOP/s, or 1/count, by the group's `ranking_unit`; 0 for a trial
    without a figure in that unit) and the best so far, in log order."""
    flops = parse_workload(group[0].workload).flops()
    unit = ranking_unit(group)
    per_trial, running, top = [], [], 0.0
    for r in sorted(group, key=lambda rec: rec.time):
        ok = r.result.ok and r.result.cost_unit is unit and math.isfinite(r.cost) and r.cost > 0
        value = (gflops(flops, r.cost, r.result.cost_unit) or 1.0 / r.cost) if ok else 0.0
        top = max(top, value)
        per_trial.append(value)
        running.append(top)
    return per_trial, running


def plot_convergence(records: Sequence[Record], path: str | Path) -> None:
    """A PNG with one panel per (workload, target): each trial's GFLOP/s and the best so far."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise InputError("plotting needs matplotlib: pip install 'xtune[plot]'") from None
    groups = _groups(records)
    if not groups:
        raise InputError("the log has no records to plot")
    fig, axes = plt.subplots(len(groups), 1, figsize=(8, 3.2 * len(groups)), squeeze=False)
    for ax, ((wl, tg), group) in zip(axes[:, 0], sorted(groups.items()), strict=True):
        per_trial, running = convergence(group)
        trials = range(1, len(per_trial) + 1)
        unit = ranking_unit(group)
        ax.plot(trials, per_trial, ".", color="0.6", label="trial")
        ax.plot(trials, running, "-", color="C0", label="best so far")
        ax.set_title(f"{wl} on {tg}", fontsize=9)
        ax.set_xlabel("trial")
        ax.set_ylabel("GFLOP/s" if unit is None or unit in WALL_UNITS else f"1 / {unit.noun}")
        ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    png = io.BytesIO()
    # format="png": a name without ".png" is still the file written (savefig would append the suffix),
    # and the file appears whole or not at all.
    fig.savefig(png, dpi=110, format="png")
    plt.close(fig)
    write_atomic(path, png.getvalue(), "plot")
