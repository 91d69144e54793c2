"""Benchmark: wall time of `xtune build` (CLI start-up included) of 10 matmul kernels of assorted shapes.

Usage: python benchmarks/bench_build.py [--target x86-avx2] [--repeat 3]; prints the best and median seconds.
The target is under 3 s on the development machine (recorded in docs/benchmarks.md)."""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# Square, tall, wide, GEMV-like and odd shapes with tails on every axis.
SHAPES = (
    (512, 512, 512),
    (64, 64, 64),
    (8, 16, 4),
    (13, 19, 7),
    (100, 30, 200),
    (256, 128, 64),
    (33, 40, 70),
    (1, 1000, 64),
    (128, 10, 128),
    (49, 64, 576),
)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="x86-avx2")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    workloads = [f"matmul:m={m},n={n},k={k}" for m, n, k in SHAPES]
    times = []
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [
            sys.executable,
            "-m",
            "xtune.cli",
            "build",
            "--target",
            args.target,
            *[a for w in workloads for a in ("--workload", w)],
            "-o",
            str(Path(tmp) / "kernels.o"),
            "--header",
            str(Path(tmp) / "kernels.h"),
        ]
        for _ in range(args.repeat):
            start = time.perf_counter()
            subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            times.append(time.perf_counter() - start)
        size = (Path(tmp) / "kernels.o").stat().st_size
    print(
        f"xtune build, {len(workloads)} matmul kernels, target {args.target}: "
        f"best {min(times):.2f} s, median {statistics.median(times):.2f} s over {args.repeat} runs "
        f"(object {size} bytes)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
