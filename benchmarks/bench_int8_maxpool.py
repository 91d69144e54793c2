"""ResNet-18's stem pool (3x3, stride 2, pads 1, 64 channels of 112x112, NHWC, uint8 out) as xtune ran it in a
quantized network before its 8-bit MaxPool — the float MaxPool reading the conv's float32 output, its
QuantizeLinear as the kernel's last step (`Quantized(Pool2d)`) — and as it runs now, the maximum of the uint8
values (`Pool2d` with a `ClampedMax`): the instructions one call executes under qemu (the insncount plugin:
deterministic, any machine), and the bytes each reads.

Usage: python benchmarks/bench_int8_maxpool.py [--board qemu-aarch64] [--size 112]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from xtune.boards.agent import RunRequest, RunStatus
from xtune.boards.board import Board, InsnCountingSession, get_board
from xtune.ops.layout import Layout
from xtune.ops.opkit import GeneratedOp
from xtune.ops.pool2d import Pool2d, PoolKind
from xtune.ops.qpointwise import Quantized
from xtune.ops.qpool import ClampedMax, QuantizedWindow
from xtune.ops.quantize import QParams

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/board_run.py: a kernel's image

from tests.board_run import image


def instructions(board: Board, op: GeneratedOp, x: np.ndarray) -> int:
    """The instructions one call of `op`'s kernel executes on `board` (a qemu board) on input `x`."""
    kernel = op.kernel_nest("pool", board.target.fp32_lanes)
    flat = image(kernel, board.target)
    out = np.zeros(op.output_shape, np.uint8)
    with board.open() as session:
        if not isinstance(session, InsnCountingSession):
            raise SystemExit(f"{board.name} counts no instructions: give a qemu board")
        session.load_image(flat.code)
        session.set_buffer(0, x.tobytes())
        session.set_buffer(1, out.tobytes())
        reply = session.run(RunRequest.check(flat.entry("pool"), (0, 1)))
        if reply.status is not RunStatus.OK or session.last_cost is None:
            raise SystemExit(f"{board.name}: the run failed: {reply}")
        return int(session.last_cost)


def stem_pool(size: int, quantized: QuantizedWindow | None = None) -> Pool2d:
    """ResNet-18's stem max pool over 64 channels of size x size, NHWC."""
    return Pool2d(
        kind=PoolKind.MAX,
        n=1,
        c=64,
        h=size,
        w=size,
        kernel=(3, 3),
        stride=(2, 2),
        pads=(1, 1, 1, 1),
        layout=Layout.NHWC,
        quantized=quantized,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--board", default="qemu-aarch64")
    parser.add_argument("--size", type=int, default=112, help="the input's height and width")
    args = parser.parse_args()
    board = get_board(args.board)
    float_pool = stem_pool(args.size)
    before = Quantized(inner=float_pool, reads=(None,), writes=QParams(scale=0.0185, zero=0, qtype="uint8"))
    after = stem_pool(args.size, ClampedMax(qtype="uint8", lo=0, hi=255))
    x = np.random.default_rng(0).uniform(0, 4, float_pool.input_shapes[0]).astype(np.float32)
    print(f"stem max pool 3x3 s2, 64x{args.size}x{args.size} NHWC, {board.name} ({board.target.name})")
    print(f"{'kernel':<34} {'instructions':>12} {'input bytes':>11}")
    for name, op, data in (
        ("float32 in, quantized out (before)", before, x),
        ("uint8 in and out (after)", after, np.round(x / 0.0185).clip(0, 255).astype(np.uint8)),
    ):
        print(f"{name:<34} {instructions(board, op, data):>12} {data.nbytes:>11}")


if __name__ == "__main__":
    main()
