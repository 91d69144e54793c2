"""Where a network's cycles go: a model and its tuning log(s) in (or none: each task's default config,
measured here on the cycle board); per task, the best logged cost per call, its calls, its share of the
tasks' sum, multiply-adds per cycle, and how close it runs to the FMA bound of the cycle model out (a
markdown table, then the sums per kind of layer).

Usage: python3 benchmarks/arm_layers.py MODEL [--log LOG ...] [--target arm-a72-neon]
                                        [--board qemu-aarch64-cycles] [--macs-per-cycle 4]
Without --log every task's default config (what an untuned `xtune build` runs) is measured on --board,
one task at a time (minutes under qemu: each candidate runs under the counting plugin, then llvm-mca).

The bound is MACs / macs-per-cycle: llvm-mca 22's Cortex-A72 model (the A57's) issues one `fmla v.4s` per
cycle (12 independent FMLAs, by element or by vector, take 12 cycles an iteration), so 4 fp32
multiply-adds per cycle. Where the best config is Winograd (xtune/ops/conv2d/winograd.py), the bound
counts its multiplies instead of the direct ones: F(2x2, 3x3)'s 16 per 2x2 output tile (direct: 36),
F(4x4, 3x3)'s 36 per 4x4 tile (direct: 144), partial tiles not counted.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from xtune.boards.board import get_board
from xtune.frontend.load import load_graph
from xtune.frontend.tasks import Task, extract_tasks, logged_best
from xtune.ops.registry import template_for
from xtune.schedule.space import KnobValue
from xtune.target import Target
from xtune.tuning.database import read_logs
from xtune.tuning.measure import Candidate, Measurer, MeasureStatus, build_image
from xtune.tuning.options import MeasureOptions

# Winograd's multiplies per direct multiply, by tile side m (a config's `m` knob; logged before it: 2):
# an (m + 2)^2 elementwise product per m x m outputs, against m^2 x 9.
WINOGRAD_MULTIPLIES = {2: 16 / 36, 4: 36 / 144}


@dataclass(frozen=True, kw_only=True)
class Layer:
    kind: str  # "pointwise", "conv3x3/s2 winograd", "depthwise", ...
    workload: str
    calls: int
    cycles: float  # per call, the best logged
    macs: float  # per call, as the direct algorithm counts them
    bound: float  # cycles per call at the FMA bound of the config's algorithm


def kind_of(task: Task, algo: str) -> str:
    wl = task.workload
    if wl.op != "conv2d":
        return wl.op
    r, s, c = wl.value("r"), wl.value("s"), wl.value("c")
    name = "pointwise" if (r, s) == (1, 1) else f"conv{r}x{s}"
    name += "/s2" if wl.value("stride") != 1 else ""
    return ("stem " if c == 3 else "") + f"{name} {algo}"


Measured = tuple[dict[str, KnobValue], float]  # a task's config (its knobs) and cost per call


def logged(tasks: list[Task], target: Target, logs: list[Path]) -> list[Measured | None]:
    """Each task's best logged config and cost, None for a task the logs do not have."""
    bests = logged_best(tasks, target, read_logs(logs))
    return [None if r is None else (dict(r.knobs), r.cost) for r in bests]


def defaults(tasks: list[Task], board_name: str) -> list[Measured | None]:
    """Each task's default config measured on the board (None where the measurement failed: said why)."""
    board = get_board(board_name)
    options = MeasureOptions(timeout_ms=600_000)  # a large layer runs minutes under the counting plugin
    found: list[Measured | None] = []
    for task in tasks:
        config = template_for(task.workload, board.target).default_config()
        measurer = Measurer(board, task.workload, options)
        try:
            candidate = Candidate(workload=task.workload, target=board.target, index=config.index)
            result = measurer.run(build_image(candidate))
        finally:
            measurer.close()
        ok = result.status is MeasureStatus.OK
        if not ok:
            print(f"{task.workload.key}: {result.status.value} {result.error}", file=sys.stderr)
        found.append((dict(config.values), result.cost) if ok else None)
        print(f"measured {len(found)}/{len(tasks)}", file=sys.stderr, flush=True)
    return found


def layers(model: Path, logs: list[Path], target: str, board: str, macs_per_cycle: float) -> list[Layer]:
    taskset = extract_tasks(load_graph(model), target, partial=True)
    tasks = list(taskset.tasks)
    costs = logged(tasks, taskset.target, logs) if logs else defaults(tasks, board)
    found = []
    for task, measured in zip(tasks, costs, strict=True):
        if measured is None:
            continue
        knobs, cost = measured
        algo = str(knobs.get("algo", "direct"))
        macs = task.flops / 2
        m = int(knobs.get("m", 2))
        multiplies = macs * (WINOGRAD_MULTIPLIES[m] if algo == "winograd" else 1.0)
        found.append(
            Layer(
                kind=kind_of(task, f"{algo} F(4x4)" if algo == "winograd" and m == 4 else algo),
                workload=task.workload.key,
                calls=task.count,
                cycles=cost,
                macs=macs,
                bound=multiplies / macs_per_cycle,
            )
        )
    return found


def report(found: list[Layer]) -> str:
    total = sum(x.cycles * x.calls for x in found)
    lines = [
        "| M cycles | share | calls | M cycles/call | MAC/cycle | of the bound | kind | workload |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for x in sorted(found, key=lambda x: -x.cycles * x.calls):
        lines.append(
            f"| {x.cycles * x.calls / 1e6:.2f} | {100 * x.cycles * x.calls / total:.1f} % | {x.calls} | "
            f"{x.cycles / 1e6:.2f} | {x.macs / x.cycles:.2f} | {100 * x.bound / x.cycles:.0f} % | {x.kind} | "
            f"`{x.workload}` |"
        )
    lines += ["", f"sum of the tasks: {total / 1e6:.2f} M cycles", ""]
    kinds = sorted(
        {x.kind for x in found}, key=lambda k: -sum(x.cycles * x.calls for x in found if x.kind == k)
    )
    for k in kinds:
        mine = [x for x in found if x.kind == k]
        spent = sum(x.cycles * x.calls for x in mine)
        bound = sum(x.bound * x.calls for x in mine)
        calls = sum(x.calls for x in mine)
        lines.append(
            f"- {k}: {calls} calls, {spent / 1e6:.2f} M cycles ({100 * spent / total:.1f} %), "
            f"{100 * bound / spent:.0f} % of the bound"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--log", type=Path, action="append", default=[], help="tuning log(s)")
    parser.add_argument("--target", default="arm-a72-neon")
    parser.add_argument("--board", default="qemu-aarch64-cycles", help="measures the defaults (no --log)")
    parser.add_argument("--macs-per-cycle", type=float, default=4.0, help="the cycle model's FMA bound")
    args = parser.parse_args()
    print(report(layers(args.model, args.log, args.target, args.board, args.macs_per_cycle)))


if __name__ == "__main__":
    main()
