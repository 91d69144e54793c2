"""Winograd F(2x2, 3x3) against F(4x4, 3x3) per layer: ResNet-18's 3x3 stride-1 convolutions (NHWC, their
network epilogue, prepacked U as `xtune build` gives them) in; the default config of each tile side,
costed in llvm-mca cycles on emulated boards (deterministic: no timing), as a markdown table out.

Usage: python3 benchmarks/winograd_tiles.py [--boards qemu-aarch64-cycles qemu-x86_64-cycles]
                                            [--layers 56 28 14 7]
qemu-aarch64-cycles is the Cortex-A72 model (arm-a72-neon); qemu-x86_64-cycles runs x86-avx2 under
qemu-x86_64 and costs it with llvm-mca's Haswell model (as benchmarks/validate_cycles.py does).
"""

from __future__ import annotations

import argparse

from xtune.boards.board import Board, QemuBoard, get_board
from xtune.boards.cost import CostUnit
from xtune.ops.conv2d.winograd import WinogradTemplate
from xtune.ops.registry import parse_workload
from xtune.target import get_target
from xtune.tuning.measure import Measurer
from xtune.tuning.options import MeasureOptions

# ResNet-18's 3x3 stride-1 layers by output size: channels (in = out).
RESNET18 = {56: 64, 28: 128, 14: 256, 7: 512}
TIMEOUT_MS = 600_000  # a 56x56 layer under the plugin and llvm-mca: minutes


def layer_key(size: int) -> str:
    c = RESNET18[size]
    return (
        f"conv2d:n=1,c={c},h={size},w={size},k={c},r=3,s=3,pad=1,layout=nhwc,algo=winograd,"
        "bias=1,relu=1,prepacked=1"
    )


def board_of(name: str) -> Board:
    if name == "qemu-x86_64-cycles":
        return QemuBoard(name, get_target("x86-avx2"), CostUnit.CYCLES)
    return get_board(name)


def costs(board: Board, key: str) -> dict[int, float]:
    """The cycles per call of the default config of each tile side."""
    workload = parse_workload(key)
    measurer = Measurer(board, workload, MeasureOptions(timeout_ms=TIMEOUT_MS))
    template = measurer.template
    assert isinstance(template, WinogradTemplate)
    try:
        out = {}
        for m in (2, 4):
            (result,) = measurer.measure([template.default_config(m).index])
            if not result.ok:
                raise SystemExit(f"{key} m={m} on {board.name}: {result.status.value} {result.error}")
            out[m] = result.cost
        return out
    finally:
        measurer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--boards", nargs="+", default=["qemu-aarch64-cycles", "qemu-x86_64-cycles"])
    parser.add_argument("--layers", nargs="+", type=int, default=list(RESNET18), choices=list(RESNET18))
    args = parser.parse_args()
    print("| board | layer (C, H = W) | F(2x2) M cycles | F(4x4) M cycles | F(4x4) / F(2x2) |")
    print("|---|---|---|---|---|")
    for name in args.boards:
        board = board_of(name)
        for size in args.layers:
            c = costs(board, layer_key(size))
            print(
                f"| {name} | {RESNET18[size]}, {size} | {c[2] / 1e6:.2f} | {c[4] / 1e6:.2f} | "
                f"{c[4] / c[2]:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
