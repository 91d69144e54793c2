"""The search alone, over seeds: how close a 64-trial xgb run's best comes to its own 512-trial best.

Usage: python benchmarks/bench_search_gap.py WORKLOAD [WORKLOAD ...] [--trials 64] [--long 512]
       [--seeds 1 2 3 4 5 6]

For each workload (a key as `bench_layers.py` prints it under its table: the layer as the network runs it)
and seed, one `--long`-trial run on the local board with no end-of-run confirmation; from its log, the
best tuning timing (each the median of MeasureOptions.repeat repeats) among the first `--trials` trials
and among all, and the trial that first reached each. No timing is repeated, so this separates the
search (did the short run find the configs the long one found?) from the re-timing noise that
bench_layers.py's 64/512 column also carries.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from xtune.boards.board import get_board
from xtune.ops.registry import parse_workload
from xtune.tuning.database import TuningLog
from xtune.tuning.options import TuneOptions
from xtune.tuning.run import run_tuning


def best_by(speeds: list[float], trials: int) -> tuple[float, int]:
    """The best of the first `trials` speeds and the (1-based) trial that reached it."""
    best = max(speeds[:trials])
    return best, speeds.index(best) + 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workloads", nargs="+")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--long", type=int, default=512)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6])
    args = parser.parse_args()
    board = get_board("local")
    for text in args.workloads:
        wl = parse_workload(text)
        print(f"\n{wl.key}, GFLOP/s by the tuning timings\n")
        print(
            f"| seed | best of {args.trials} (trial) | best of {args.long} (trial) | "
            f"{args.trials}/{args.long} |\n|---|---|---|---|"
        )
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as tmp:
                log = TuningLog(Path(tmp) / "log.jsonl")
                options = TuneOptions(tuner="xgb", trials=args.long, batch_size=16, seed=seed, confirm=0)
                run_tuning(wl, [board], options, log)
                records = log.read()
            # GFLOP/s of each trial in order; a failed trial counts as 0.
            speeds = [wl.flops() / r.cost / 1e9 if r.result.ok else 0.0 for r in records]
            short, at_short = best_by(speeds, args.trials)
            long, at_long = best_by(speeds, len(speeds))
            print(
                f"| {seed} | {short:.1f} ({at_short}) | {long:.1f} ({at_long}) | {short / long:.3f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
