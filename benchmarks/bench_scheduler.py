"""The task scheduler's benchmark: gradient allocation against round-robin on one budget.

Usage: python benchmarks/bench_scheduler.py [--model mobilenet_v2] [--trials 1500] [--seed 0]
       [--out curves.json] [--plot curves.png];  python benchmarks/bench_scheduler.py --replot curves.json
Each strategy tunes every task of the model from an empty log on the local board, with the search's
seed --seed; both share the first round (every task's default and the analytic estimate's top pick),
then take one batch each in turn, so that a host's changing load weighs on both alike.
Prints a markdown table and the trials the gradient scheduler needed to reach round-robin's final
end-to-end estimate (the goal: at most 50 % of the budget); --out writes both curves as JSON (trials
spent, estimate) with those figures.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

from xtune.boards.board import get_board

# tests/networks.py builds the test networks; the repository root holds the `tests` package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import networks
from xtune.frontend.tasks import extract_tasks
from xtune.tuning.allocation import SchedulerOptions, Strategy
from xtune.tuning.database import TuningLog
from xtune.tuning.options import TuneOptions
from xtune.tuning.results import ModelTuningResult
from xtune.tuning.task_scheduler import TaskScheduler


def trials_to(result: ModelTuningResult, goal: float) -> int | None:
    """Trials the run spent until its estimate was at or below `goal`."""
    return next((n for n, estimate in result.curve if estimate <= goal), None)


def estimate_at(result: ModelTuningResult, trials: int) -> float:
    """The run's estimate once it had spent `trials` (its last point at or before; NaN while the first
    round was still running then)."""
    return next((e for n, e in reversed(result.curve) if n <= trials), float("nan"))


def scale(unit: object) -> tuple[float, str]:
    """How the estimate is shown: wall time in ms, instruction counts and cycle estimates (qemu boards) in
    millions."""
    counted = {"insn": "M instructions", "cycles": "M cycles"}
    return (1e-6, counted[str(unit)]) if unit in counted else (1e3, "ms")


def plot(data: dict[str, object], path: Path) -> None:
    """Both strategies' estimated end-to-end latency against trials spent (needs the `plot` extra), with
    round-robin's final estimate and half the budget marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    k, unit = scale(data.get("unit"))
    curves = data["curves"]
    assert isinstance(curves, dict)
    colours = {Strategy.GRADIENT.value: "tab:blue", Strategy.ROUND_ROBIN.value: "tab:orange"}
    for name in sorted(curves, key=list(colours).index):  # one colour per strategy, whichever ran first
        points = curves[name]
        ax.plot(
            [n for n, _ in points],
            [e * k for _, e in points],
            label=name,
            color=colours[name],
            drawstyle="steps-post",
        )
    even = curves.get(Strategy.ROUND_ROBIN.value)
    if even:
        ax.axhline(even[-1][1] * k, color="grey", linestyle=":", label="round-robin's final")
    trials = data["trials"]
    assert isinstance(trials, int)
    ax.axvline(trials / 2, color="grey", linestyle="--", linewidth=0.8, label="half the budget")
    ends = [e * k for points in curves.values() for e in (points[0][1], points[-1][1]) if points]
    if ends:  # from the end of the first round down: the part the allocation decides
        ax.set_ylim(min(ends) * 0.98, max(ends) * 1.02)
    ax.set_xlabel("trials spent")
    ax.set_ylabel(f"estimated end-to-end latency ({unit})")
    seed = f", seed {data['seed']}" if "seed" in data else ""
    ax.set_title(f"{data['model']}: task scheduler, {trials} trials{seed}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def interleaved(
    runs: dict[Strategy, TaskScheduler], budget: int, model: str
) -> dict[Strategy, ModelTuningResult]:
    """Both strategies' runs, one batch of each in turn: a host whose load changes over the minutes a
    run takes weighs on both alike (run one after the other, the one that ran in the quieter minutes
    found "improvements" that were the load going away). Each one's seconds are its own batches'."""
    batches = {s: run.batches(budget) for s, run in runs.items()}
    seconds = dict.fromkeys(runs, 0.0)
    while batches:
        for strategy, gen in list(batches.items()):
            t0 = time.perf_counter()
            if next(gen, None) is None:
                del batches[strategy]
            seconds[strategy] += time.perf_counter() - t0
    return {
        s: run.result(run.ended(budget), model=model, budget=budget, seconds=seconds[s])
        for s, run in runs.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mobilenet_v2", choices=sorted(networks.NETWORKS))
    parser.add_argument("--trials", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0, help="the search's seed (TuneOptions.seed)")
    parser.add_argument(
        "--board",
        default="local",
        help="e.g. qemu-aarch64: exact instruction counts, no "
        "timing noise (the estimate is then in instructions)",
    )
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="both curves as a PNG")
    parser.add_argument("--replot", type=Path, default=None, help="plot a saved --out file; run nothing")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.plot or args.replot.with_suffix(".png"))
        return
    board = get_board(args.board)
    tasks = extract_tasks(networks.NETWORKS[args.model](), board.target).tasks
    # confirm=0: the curves compare allocation alone; confirming would re-time leaders after the budget.
    options = TuneOptions(trials=args.trials, batch_size=args.batch_size, confirm=0, seed=args.seed)
    results: dict[Strategy, ModelTuningResult] = {}
    with tempfile.TemporaryDirectory() as tmp:
        # The first round is measured once and both strategies resume from a copy of its log: they start
        # from the very same timings, and what differs is how the rest of the budget is allocated.
        shared = Path(tmp) / "first.jsonl"
        warmup = TaskScheduler(tasks, [board], options, TuningLog(shared))
        try:
            spent = warmup.first_round_trials()
            warmup.run(spent)
            start = warmup.curve[-1]
        finally:
            warmup.close()
        rest = replace(options, trials=args.trials - spent)
        # Which strategy measures first in each pair of batches alternates from seed to seed.
        order = list(Strategy) if args.seed % 2 == 0 else list(reversed(Strategy))
        runs: dict[Strategy, TaskScheduler] = {}
        try:
            for strategy in order:
                log = Path(tmp) / f"{strategy.value}.jsonl"
                shutil.copy(shared, log)
                runs[strategy] = TaskScheduler(
                    tasks, [board], rest, TuningLog(log), scheduler=SchedulerOptions(strategy=strategy)
                )
            for strategy, result in interleaved(runs, rest.trials, args.model).items():
                curve = (start, *((spent + n, e) for n, e in result.curve[1:]))  # trials of the whole budget
                results[strategy] = replace(
                    result, curve=curve, trials=spent + result.trials, budget=args.trials
                )
        finally:
            for run in runs.values():
                run.close()
    gradient, even = results[Strategy.GRADIENT], results[Strategy.ROUND_ROBIN]
    print(
        f"\n{args.model}: {len(tasks)} tasks, {args.trials} trials, batches of {args.batch_size}, "
        f"seed {args.seed}\n"
    )
    k, unit = scale(board.cost_unit.value)
    print(
        f"| strategy | default ({unit}) | first round (trials: {unit}) | final estimate ({unit}) | speedup "
        "| seconds |\n|---|---|---|---|---|---|"
    )
    for strategy, r in results.items():
        first = r.curve[0] if r.curve else (0, float("nan"))
        speedup = r.default_estimate / r.estimate
        print(
            f"| {strategy.value} | {r.default_estimate * k:.3f} | {first[0]}: {first[1] * k:.3f} | "
            f"{r.estimate * k:.3f} | {speedup:.2f}x | {r.seconds:.0f} |"
        )
    reached = trials_to(gradient, even.estimate)
    if reached is None:
        above = 100 * (gradient.estimate / even.estimate - 1)
        print(f"\ngradient never reached round-robin's final estimate (it ends {above:.2f} % above it)")
    else:
        print(
            f"\ngradient reached round-robin's final estimate after {reached} trials "
            f"({100 * reached / args.trials:.0f} % of the budget)"
        )
    # Noise-tolerant figures: within 2 % of round-robin's final, and both estimates at half the budget.
    near = trials_to(gradient, 1.02 * even.estimate)
    half = {s.value: estimate_at(r, args.trials // 2) for s, r in results.items()}
    print(
        f"within 2 % of it after {near} trials; at half the budget: "
        + ", ".join(f"{name} {e * k:.3f} {unit}" for name, e in half.items())
    )
    curves = {s.value: [[n, e] for n, e in r.curve] for s, r in results.items()}
    data = {
        "model": args.model,
        "board": args.board,
        "unit": board.cost_unit.value,
        "trials": args.trials,
        "batch_size": args.batch_size,
        "seed": args.seed,
        "tasks": len(tasks),
        "reached": reached,
        "within_2_percent": near,
        "at_half": half,
        "curves": curves,
        "results": {
            s.value: {
                "default_estimate": r.default_estimate,
                "estimate": r.estimate,
                "seconds": round(r.seconds, 1),
                "trials_per_task": [t.resumed + t.trials for t in r.tasks],
                "best_per_task": [t.as_dict()["best_cost"] for t in r.tasks],
                "counts": [t.count for t in r.tasks],
            }
            for s, r in results.items()
        },
    }
    if args.out:
        args.out.write_text(json.dumps(data))
    if args.plot:
        plot(data, args.plot)


if __name__ == "__main__":
    main()
