"""Grouped convolution: per ShuffleNet / ResNeXt-style layer, the two forms a grouped pointwise conv2d can
take, each one kernel over every group: the direct template's grouped kernel and one group's matmul per
group (`Conv2dTemplate(matmul=...)`), the form `matmul_per_group` picks starred, and, on the local board,
ONNX Runtime's grouped Conv. A 3x3 grouped layer has the direct form only. Each form is given as its
default config's cost and the best of that and --configs random ones (no tuning): on a qemu board,
instructions (or llvm-mca cycles on a -cycles board), deterministic; on the local board, microseconds per
call, for an otherwise idle machine only.

Usage: python benchmarks/bench_grouped.py [--board local | --qemu TARGET] [--layout nhwc|nchw] [--configs 8]
[--only S ...]. --qemu counts instructions under qemu-user for a target that has no named board
(x86-avx2: qemu 7.2 runs AVX2, not AVX-512). ORT needs the `bench` extra.
"""

from __future__ import annotations

import argparse
import random

from xtune.boards.board import Board, QemuBoard, get_board
from xtune.boards.cost import CostUnit
from xtune.ops.conv2d.direct import Conv2dTemplate, matmul_per_group
from xtune.ops.registry import parse_workload
from xtune.ops.workload import Workload
from xtune.target import get_target
from xtune.tuning.measure import Candidate, Measurer, build_image
from xtune.tuning.options import MeasureOptions
from xtune.tuning.peers import ort_available, ort_seconds

# (c, k, groups, h = w, r): ShuffleNet v1's g=3/4/8 pointwise convs, the g=4 ones of the ONNX Model Zoo's
# ShuffleNet (6 -> 28, 34, 68 and 136 channels per group), ResNeXt-50 32x4d's 3x3 groups.
LAYERS = (
    (240, 240, 4, 28, 1),
    (120, 120, 3, 28, 1),
    (480, 480, 8, 14, 1),
    (384, 384, 8, 14, 1),
    (24, 112, 4, 56, 1),
    (136, 136, 4, 28, 1),
    (272, 272, 4, 14, 1),
    (544, 544, 4, 7, 1),
    (128, 128, 32, 56, 3),
    (512, 512, 32, 14, 3),
)
OPTIONS = MeasureOptions(number=5, repeat=3, min_repeat_ms=20.0, warmup=1)


def costs(board: Board, wl: Workload, matmul: bool, configs: int) -> tuple[float, float]:
    """(the default config's cost, the least of it and `configs` random ones' (fixed seed)) of one form."""
    template = Conv2dTemplate(wl, board.target, matmul)
    rng = random.Random(wl.key)
    indices = [template.default_config().index, *(rng.randrange(template.space.size) for _ in range(configs))]
    measurer = Measurer(board, wl, OPTIONS, template=template)
    try:
        results = [
            measurer.run(build_image(Candidate(workload=wl, target=board.target, index=i), template))
            for i in indices
        ]
    finally:
        measurer.close()
    assert all(r.ok for r in results), [r.error for r in results if not r.ok]
    return results[0].cost, min(r.cost for r in results)


def shown(cost: tuple[float, float], unit: CostUnit, picked: bool) -> str:
    scale, digits = (1e6, 1) if unit is CostUnit.SECONDS else (1.0, 0)
    star = "*" if picked else ""
    return f"{cost[0] * scale:,.{digits}f}{star} / {cost[1] * scale:,.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--board", default="local")
    parser.add_argument(
        "--qemu", metavar="TARGET", help="count instructions of TARGET's code under qemu-user"
    )
    parser.add_argument("--layout", choices=("nhwc", "nchw"), default="nhwc")
    parser.add_argument("--configs", type=int, default=8)
    parser.add_argument("--only", nargs="*", default=[])
    args = parser.parse_args()
    board = QemuBoard(f"qemu-{args.qemu}", get_target(args.qemu)) if args.qemu else get_board(args.board)
    unit = board.cost_unit
    what = "us per call" if unit is CostUnit.SECONDS else unit.value
    print(
        f"{board.name} ({board.target.name}), {what}: default config / best of it and {args.configs} random"
    )
    print("| layer | grouped kernel | matmul per group | ONNX Runtime (us) |")
    print("|---|---|---|---|")
    for c, k, g, hw, r in LAYERS:
        pad = r // 2
        shape = f"n=1,c={c},h={hw},w={hw},k={k},r={r},s={r},pad={pad},groups={g},layout={args.layout}"
        wl = parse_workload(f"conv2d:{shape},prepacked=1")
        if args.only and not any(s in wl.key for s in args.only):
            continue
        rule = matmul_per_group(wl)
        direct = shown(costs(board, wl, False, args.configs), unit, not rule)
        per_group = shown(costs(board, wl, True, args.configs), unit, rule) if r == 1 else "-"
        local = ort_available() and board.name == "local"
        ort = f"{min(ort_seconds(parse_workload(f'conv2d:{shape}'))) * 1e6:.1f}" if local else "-"
        print(f"| {wl.key} | {direct} | {per_group} | {ort} |", flush=True)


if __name__ == "__main__":
    main()
