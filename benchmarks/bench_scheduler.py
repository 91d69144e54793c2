"""The task scheduler's benchmark (issue 19): gradient allocation against round-robin on one budget.

Usage: python benchmarks/bench_scheduler.py [--model mobilenet_v2] [--trials 1500] [--out curves.json]
       [--plot curves.png];  python benchmarks/bench_scheduler.py --replot curves.json --plot curves.png
Each strategy tunes every task of the model from an empty log on the local board. Prints a markdown
table and the trials the gradient scheduler needed to reach round-robin's final end-to-end estimate
(the goal: at most 50 % of the budget); --out writes both curves as JSON (trials spent, estimate).
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from xtune.boards.board import get_board
from xtune.network import zoo
from xtune.network.scheduler import ModelTuningResult, SchedulerOptions, Strategy, tune_tasks
from xtune.network.tasks import extract_tasks
from xtune.tuning.database import TuningLog
from xtune.tuning.run import TuneOptions


def trials_to(result: ModelTuningResult, goal: float) -> int | None:
    """Trials the run spent until its estimate was at or below `goal`."""
    return next((n for n, estimate in result.curve if estimate <= goal), None)


def plot(data: dict[str, object], path: Path) -> None:
    """Both strategies' estimated end-to-end latency against trials spent (needs the `plot` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    curves = data["curves"]
    assert isinstance(curves, dict)
    for name, points in curves.items():
        ax.plot([n for n, _ in points], [e * 1e3 for _, e in points], label=name)
    ax.set_xlabel("trials spent")
    ax.set_ylabel("estimated end-to-end latency (ms)")
    ax.set_title(f"{data['model']}: task scheduler, {data['trials']} trials")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="mobilenet_v2", choices=sorted(zoo.NETWORKS))
    parser.add_argument("--trials", type=int, default=1500)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--plot", type=Path, default=None, help="both curves as a PNG")
    parser.add_argument("--replot", type=Path, default=None, help="plot a saved --out file; run nothing")
    args = parser.parse_args()
    if args.replot:
        plot(json.loads(args.replot.read_text()), args.plot or args.replot.with_suffix(".png"))
        return
    board = get_board("local")
    tasks = extract_tasks(zoo.NETWORKS[args.model](), board.target).tasks
    # confirm=0: the curves compare allocation alone; confirming would re-time leaders after the budget.
    options = TuneOptions(trials=args.trials, batch_size=args.batch_size, confirm=0)
    results: dict[Strategy, ModelTuningResult] = {}
    for strategy in Strategy:
        with tempfile.TemporaryDirectory() as tmp:
            log = TuningLog(Path(tmp) / "log.jsonl")
            results[strategy] = tune_tasks(tasks, [board], options, log, model=args.model,
                                           scheduler=SchedulerOptions(strategy=strategy))  # fmt: skip
    gradient, even = results[Strategy.GRADIENT], results[Strategy.ROUND_ROBIN]
    print(f"\n{args.model}: {len(tasks)} tasks, {args.trials} trials, batches of {args.batch_size}\n")
    print("| strategy | default (ms) | final estimate (ms) | speedup | seconds |")
    print("|---|---|---|---|---|")
    for strategy, r in results.items():
        print(f"| {strategy.value} | {r.default_estimate * 1e3:.3f} | {r.estimate * 1e3:.3f} | "
              f"{r.default_estimate / r.estimate:.2f}x | {r.seconds:.0f} |")  # fmt: skip
    reached = trials_to(gradient, even.estimate)
    share = f"{100 * reached / args.trials:.0f} %" if reached is not None else "never"
    print(f"\ngradient reached round-robin's final estimate after {reached} trials ({share} of the budget)")
    curves = {s.value: [[n, e] for n, e in r.curve] for s, r in results.items()}
    data = {"model": args.model, "trials": args.trials, "curves": curves}
    if args.out:
        args.out.write_text(json.dumps(data))
    if args.plot:
        plot(data, args.plot)


if __name__ == "__main__":
    main()
