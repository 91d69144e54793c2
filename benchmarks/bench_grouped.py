"""Grouped convolution: per ShuffleNet / ResNeXt-style layer, the grouped conv2d kernel (one kernel, the
groups one after another through the direct template) against G calls of one group's convolution as an
ungrouped conv2d (a pointwise one lowers through the matmul template), and ONNX Runtime's grouped Conv.
Each xtune form is its best of the default config and --configs random ones (no tuning), so the figures
say which template a grouped pointwise layer should use, not how fast a tuned one is.

Usage: python benchmarks/bench_grouped.py [--layout nhwc|nchw] [--configs 8] [--only SUBSTRING ...]
The machine should be otherwise idle: every figure is a timing. ORT needs the `bench` extra.
"""

from __future__ import annotations

import argparse
import random

from xtune.boards.board import get_board
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.workload import Workload
from xtune.tuning.measure import Candidate, Measurer, build_image
from xtune.tuning.options import MeasureOptions
from xtune.tuning.peers import ort_available, ort_seconds

# (c = k, groups, h = w, r): ShuffleNet v1's g=3/4/8 pointwise convs, ResNeXt-50 32x4d's 3x3 groups.
LAYERS = (
    (240, 4, 28, 1),
    (120, 3, 28, 1),
    (480, 8, 14, 1),
    (384, 8, 14, 1),
    (128, 32, 56, 3),
    (512, 32, 14, 3),
)
OPTIONS = MeasureOptions(number=5, repeat=3, min_repeat_ms=20.0, warmup=1)


def best_seconds(wl: Workload, configs: int) -> float:
    """The fastest of the default config and `configs` random ones (fixed seed), seconds per call."""
    board = get_board("local")
    template = template_for(wl, board.target)
    rng = random.Random(wl.key)
    indices = [template.default_config().index, *(rng.randrange(template.space.size) for _ in range(configs))]
    measurer = Measurer(board, wl, OPTIONS)
    try:
        results = [
            measurer.run(build_image(Candidate(workload=wl, target=board.target, index=i))) for i in indices
        ]
    finally:
        measurer.close()
    return min(r.cost for r in results if r.ok)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layout", choices=("nhwc", "nchw"), default="nhwc")
    parser.add_argument("--configs", type=int, default=8)
    parser.add_argument("--only", nargs="*", default=[])
    args = parser.parse_args()
    print("| layer | grouped kernel (us) | G x one group (us) | ONNX Runtime (us) |")
    print("|---|---|---|---|")
    for c, g, hw, r in LAYERS:
        pad = r // 2
        shape = f"n=1,c={c},h={hw},w={hw},k={c},r={r},s={r},pad={pad},layout={args.layout}"
        key = f"conv2d:{shape},groups={g},prepacked=1"
        if args.only and not any(s in key for s in args.only):
            continue
        grouped = best_seconds(parse_workload(key), args.configs)
        one_shape = f"n=1,c={c // g},h={hw},w={hw},k={c // g},r={r},s={r},pad={pad},layout={args.layout}"
        one = best_seconds(parse_workload(f"conv2d:{one_shape},prepacked=1"), args.configs)
        plain = parse_workload(f"conv2d:{shape},groups={g}")
        ort = min(ort_seconds(plain)) if ort_available() else float("nan")
        print(f"| {key} | {grouped * 1e6:.1f} | {g * one * 1e6:.1f} | {ort * 1e6:.1f} |", flush=True)


if __name__ == "__main__":
    main()
