"""A template default against its neighbours: for each workload (default: ResNet-50's 1x1 convolutions, NHWC
with their network epilogues), the default config and the configs that differ from it in `tile` and `kc`
only, timed on the local board in interleaved rounds (medians), fastest first, each as a ratio to the
default. The evidence for a default's rule (the register tile, the k block) on the host it runs on.

Usage: python benchmarks/sweep_defaults.py [WORKLOAD ...] [--tiles 6x4 7x3 8x3 12x2] [--kc 64 128 256 512]
       [--rounds 5] [--top 6]
The machine should be otherwise idle: every figure is a timing.
"""

from __future__ import annotations

import argparse
import itertools
import statistics

from xtune.boards.board import get_board
from xtune.errors import InputError
from xtune.ops.registry import parse_workload, template_for
from xtune.tuning.measure import Measurer
from xtune.tuning.options import MeasureOptions

RESNET50_POINTWISE = (
    "conv2d:n=1,c=256,h=14,w=14,k=1024,r=1,s=1,layout=nhwc,bias=1,residual=1,relu=1,prepacked=1",
    "conv2d:n=1,c=1024,h=14,w=14,k=256,r=1,s=1,layout=nhwc,bias=1,relu=1,prepacked=1",
    "conv2d:n=1,c=64,h=56,w=56,k=256,r=1,s=1,layout=nhwc,bias=1,residual=1,relu=1,prepacked=1",
    "conv2d:n=1,c=512,h=28,w=28,k=128,r=1,s=1,layout=nhwc,bias=1,relu=1,prepacked=1",
    "conv2d:n=1,c=512,h=7,w=7,k=2048,r=1,s=1,layout=nhwc,bias=1,residual=1,relu=1,prepacked=1",
    "conv2d:n=1,c=2048,h=7,w=7,k=512,r=1,s=1,layout=nhwc,bias=1,relu=1,prepacked=1",
)


def sweep(key: str, tiles: list[str], kcs: list[int], rounds: int, top: int) -> None:
    board = get_board("local")
    workload = parse_workload(key)
    template = template_for(workload, board.target)
    default = template.default_config()
    values = dict(default.values)
    names = {default.index: "default " + " ".join(f"{k}={v}" for k, v in values.items())}
    for tile, kc in itertools.product(tiles, kcs):
        try:
            index = template.space.index_of({**values, "tile": tile, "kc": kc})
        except InputError:
            continue  # not an option of this workload's space
        names.setdefault(index, f"tile={tile} kc={kc}")
    measurer = Measurer(board, workload, MeasureOptions())
    costs: dict[int, list[float]] = {i: [] for i in names}
    order = list(names)
    for r in range(rounds):
        ran = order if r % 2 == 0 else order[::-1]
        for index, result in zip(ran, measurer.measure(ran), strict=True):
            if result.ok:
                costs[index].append(result.cost)
    base = statistics.median(costs[default.index])
    print(f"{key}: default {workload.flops() / base / 1e9:.1f} GFLOP/s")
    rows = sorted((statistics.median(c), i) for i, c in costs.items() if c)
    for seconds, index in rows[:top]:
        print(f"  {base / seconds:5.2f}x {workload.flops() / seconds / 1e9:7.1f} GFLOP/s  {names[index]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("workloads", nargs="*", default=list(RESNET50_POINTWISE))
    parser.add_argument("--tiles", nargs="+", default=["6x4", "7x3", "8x3", "12x2", "14x2", "4x6"])
    parser.add_argument("--kc", nargs="+", type=int, default=[64, 128, 256, 512])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top", type=int, default=6)
    args = parser.parse_args()
    for key in args.workloads:
        sweep(key, args.tiles, args.kc, args.rounds, args.top)


if __name__ == "__main__":
    main()
