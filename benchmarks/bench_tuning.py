"""Tuning benchmarks on the local board: tuned matmul vs numpy, xgb vs random search, tuning throughput.

Usage: python benchmarks/bench_tuning.py [--section all|vs-numpy|search|throughput] [--seeds 3] [--trials 96]
Ratios are against numpy/OpenBLAS and ONNX Runtime (the `bench` extra), each on one thread, measured in the
same run. Prints markdown.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time

from xtune.boards.board import get_board
from xtune.ops.registry import parse_workload
from xtune.tuning.options import TuneOptions, TunerName
from xtune.tuning.peers import ort_gflops
from xtune.tuning.run import local_numpy_gflops, run_tuning


def vs_numpy() -> None:
    board = get_board("local")
    wl = parse_workload("matmul:m=512,n=512,k=512")
    numpy_gflops = local_numpy_gflops(wl, [board]) or math.nan
    ort = ort_gflops(wl) or math.nan  # nan without the `bench` extra: its ratios print as nan
    report = run_tuning(
        wl, [board], TuneOptions(tuner="xgb", trials=256, batch_size=16), None, None, numpy_gflops
    )
    curve = report.curve_gflops
    print(
        f"\nmatmul 512³, `--tuner xgb`, one run of 256 trials; numpy {numpy_gflops:.1f} GFLOP/s, "
        f"ONNX Runtime {ort:.1f} GFLOP/s\n"
    )
    print("| after trials | best GFLOP/s | × numpy | × ORT |")
    print("|---|---|---|---|")
    for n in (1, 16, 64, 128, 256):
        if n <= len(curve):
            print(
                f"| {n} | {curve[n - 1]:.1f} | {curve[n - 1] / numpy_gflops:.3f} | {curve[n - 1] / ort:.3f} |"
            )
    best = report.best_gflops or math.nan
    print(f"\nbest config #{report.best_index}: {dict(report.best_knobs)}; {report.seconds:.0f} s wall")
    print(
        f"its median of {report.best_timings} timings (what `xtune tune` reports and `xtune build` ships): "
        f"{best:.1f} GFLOP/s, {best / numpy_gflops:.3f} × numpy, "
        f"{best / ort:.3f} × ONNX Runtime"
    )


def trials_to(curve: tuple[float, ...], goal: float) -> int | None:
    return next((i + 1 for i, g in enumerate(curve) if g >= goal), None)


def search(seeds: int, trials: int) -> None:
    board = get_board("local")
    print(f"\nxgb vs random, {trials} trials per run, {seeds} seeds, no default config seeded")
    print("(trials to reach 90% of the best GFLOP/s any run found; '>N' if never)\n")
    header = "| workload | best known GFLOP/s | xgb trials (per seed) | random trials (per seed) "
    print(header + "| xgb median | random median |")
    print("|---|---|---|---|---|---|")
    for text in ("matmul:m=512,n=512,k=512", "matmul:m=256,n=1024,k=64"):
        wl = parse_workload(text)
        curves: dict[TunerName, list[tuple[float, ...]]] = {"xgb": [], "random": []}
        for seed in range(seeds):
            for tuner in curves:
                options = TuneOptions(
                    tuner=tuner, trials=trials, batch_size=16, seed=seed, start_from_default=False, confirm=0
                )
                curves[tuner].append(run_tuning(wl, [board], options).curve_gflops)
        best_known = max(max(c) for runs in curves.values() for c in runs)
        need = {t: [trials_to(c, 0.9 * best_known) for c in runs] for t, runs in curves.items()}

        def show(xs: list[int | None]) -> str:
            return ", ".join(str(x) if x else f">{trials}" for x in xs)

        def med(xs: list[int | None]) -> str:
            return str(statistics.median(x or trials + 1 for x in xs))

        print(
            f"| {text} | {best_known:.1f} | {show(need['xgb'])} | {show(need['random'])} "
            f"| {med(need['xgb'])} | {med(need['random'])} |"
        )


def throughput() -> None:
    board = get_board("local")
    wl = parse_workload("matmul:m=256,n=256,k=256")
    start = time.perf_counter()
    report = run_tuning(
        wl, [board], TuneOptions(tuner="xgb", trials=64, batch_size=16, confirm=0)
    )  # the loop's rate
    wall = time.perf_counter() - start
    print(
        f"\nmatmul 256³, xgb, 64 trials: {report.trials / wall:.2f} measured trials/s "
        f"({wall:.1f} s wall incl. start-up; tuner itself {report.tuner_seconds:.1f} s)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--section", default="all", choices=("all", "vs-numpy", "search", "throughput"))
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=96)
    args = parser.parse_args()
    if args.section in ("all", "throughput"):
        throughput()
    if args.section in ("all", "vs-numpy"):
        vs_numpy()
    if args.section in ("all", "search"):
        search(args.seeds, args.trials)


if __name__ == "__main__":
    main()
