"""Convolution benchmarks on the local board: tuned conv2d/depthwise vs numpy's im2col + GEMM and vs ONNX
Runtime (one thread each, same run; ORT needs the `bench` extra).

Usage: python benchmarks/bench_conv.py [--trials 256] [--workload W ...]; prints a markdown table.
Depthwise is reported as GFLOP/s and share of the target's nominal fp32 peak (little reuse, no GEMM).
"""

from __future__ import annotations

import argparse

from xtune.boards.board import get_board
from xtune.ops.registry import parse_workload
from xtune.tuning.options import TuneOptions
from xtune.tuning.peers import ort_gflops
from xtune.tuning.run import local_numpy_gflops, run_tuning

WORKLOADS = (
    "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=3,h=224,w=224,k=64,r=7,s=7,stride=2,pad=3",
    "depthwise:n=1,c=32,h=112,w=112,r=3,s=3,stride=1,pad=1",
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--trials", type=int, default=256)
    parser.add_argument("--workload", action="append")
    args = parser.parse_args()
    board = get_board("local")
    peak = board.target.peak_gflops
    print(
        f"| workload | numpy GFLOP/s | ORT GFLOP/s | default | after 64 | after {args.trials} | × numpy "
        "| × ORT | % of peak |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for text in args.workload or WORKLOADS:
        wl = parse_workload(text)
        numpy_gflops = local_numpy_gflops(wl, [board]) or 0.0
        ort = ort_gflops(wl)
        report = run_tuning(
            wl, [board], TuneOptions(tuner="xgb", trials=args.trials, batch_size=16), None, None, numpy_gflops
        )
        curve = report.curve_gflops
        at64 = curve[min(63, len(curve) - 1)]
        best = report.best_gflops or 0.0
        ort_text, versus_ort = (f"{ort:.1f}", f"{best / ort:.2f}") if ort else ("–", "–")
        print(
            f"| {text} | {numpy_gflops:.1f} | {ort_text} | {curve[0]:.1f} | {at64:.1f} | {best:.1f} "
            f"| {best / numpy_gflops:.2f} | {versus_ort} | {100 * best / peak:.0f}% |",
            flush=True,
        )


if __name__ == "__main__":
    main()
