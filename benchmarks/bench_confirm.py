"""What the end-of-run confirmation (`xtune tune --confirm`, TuneOptions.confirm) changes, on the local board.

Usage: python benchmarks/bench_confirm.py [--trials 128] [--rounds 15]

For each workload, one `xtune tune`-like xgb run of `--trials` trials with the default confirmation (the 3
fastest configs timed until each has 3 timings). From its log:
  single  the config with the fastest single timing: what `xtune build` shipped before confirmation, and
          that timing, which is what the run reported;
  median  the config with the lowest median over its timings (ranking.best): what it ships now, and that
          median, which is what the run reports now.
Both configs are then timed `--rounds` more times in interleaved rounds; the median of those is each
config's speed. The table shows how far each reported figure was above that speed, and whether the two
rules picked different configs.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from xtune.boards.board import get_board
from xtune.ops.registry import parse_workload
from xtune.tuning.database import TuningLog
from xtune.tuning.kernel_bench import retime_gflops
from xtune.tuning.options import TuneOptions
from xtune.tuning.ranking import best
from xtune.tuning.run import run_tuning

WORKLOADS = (
    "matmul:m=384,n=384,k=384",
    "matmul:m=768,n=64,k=640",
    "matmul:m=128,n=1024,k=256",
    "matmul:m=320,n=1024,k=768",
    "matmul:m=96,n=768,k=192",
    "matmul:m=512,n=512,k=512",
)


def one(workload: str, trials: int, rounds: int) -> str:
    wl = parse_workload(workload)
    board = get_board("local")
    with tempfile.TemporaryDirectory() as tmp:
        log = TuningLog(Path(tmp) / "log.jsonl")
        report = run_tuning(wl, [board], TuneOptions(tuner="xgb", trials=trials, batch_size=16), log)
        records = log.read()
    gflops = wl.flops() / 1e9
    ok = [r for r in records if r.result.ok]
    single = min(ok, key=lambda r: r.cost)
    median = best(records, wl.key, board.target.name)[0]
    indices = list(dict.fromkeys((single.index, median.index)))
    timings = retime_gflops(wl, board, indices, rounds)
    speeds = {i: statistics.median(t) for i, t in zip(indices, timings, strict=True)}
    claimed_single, claimed_median = gflops / single.cost, gflops / median.cost
    true_single, true_median = speeds[single.index], speeds[median.index]
    return (
        f"| {workload.removeprefix('matmul:')} | {report.confirm_timings} | "
        f"{claimed_single:.1f} / {true_single:.1f} ({claimed_single / true_single - 1:+.0%}) | "
        f"{claimed_median:.1f} / {true_median:.1f} ({claimed_median / true_median - 1:+.0%}) | "
        f"{'same' if single.index == median.index else f'{true_median / true_single - 1:+.1%}'} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    print(f"\n{args.trials} trials per run; reported / re-timed GFLOP/s (median of {args.rounds} timings)\n")
    print(
        "| workload | confirm timings | fastest single timing: reported / re-timed | lowest median: "
        "reported / re-timed | picks (median pick vs single pick, re-timed) |"
    )
    print("|---|---|---|---|---|")
    for workload in WORKLOADS:
        print(one(workload, args.trials, args.rounds), flush=True)


if __name__ == "__main__":
    main()
