"""The grouped-taps route of the int8 depthwise template (`route=dot`): a qdepthwise shape, target and
padded image in; the nest that groups each filter row's taps per channel and takes them with the 4-way
dot, and its prepacked weights, out.

The dot needs 4 bytes of one channel per i32 lane; a filter row of s <= 4 taps gives them, as XNNPACK's
and MLAS's depthwise kernels group taps channel-major. Per block of output rows, a pass writes `groups`:
for each padded image row the block reads and each output column p, 4 bytes per channel, the row's s tap
columns p*stride + t*dilation side by side (0 past s). Each filter row of a vector of channels is then
one dot of one loaded vector against one weight vector (prepacked (r, c, 4), `group_weights`), and the
requantizing epilogue. The interleave is paid once per padded row and output column of a block (its
window rows past the first output row's are built again by the next block), not once per output row and
filter row; stride 2 builds only the columns it reads. A block's rows stay in cache for its dots
(`block_rows`), and the stack holds one block's groups, not the image's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xtune.ops.conv import ConvShape
from xtune.ops.qconv import PaddedImage
from xtune.ops.qmatmul.epilogue import Requantizer
from xtune.ops.qmatmul.micro import DotPlan
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Bitcast,
    Buffer,
    BufferKind,
    Cast,
    Const,
    Dot,
    DType,
    Load,
    NestBuilder,
    PairSum,
    Shuffle,
    Value,
)
from xtune.target import Target

COLUMN = 16  # bytes of each tap column per build step: 64 bytes of groups (AArch64: one st4)


def group_weights(weights: np.ndarray, sh: ConvShape) -> np.ndarray:
    """The (r, s, c) int8 weights as the route reads them: (r, c, 4), each filter row's taps side by side
    per channel, 0 past s; a flat int8 array."""
    grouped = np.zeros((sh.r, 4, sh.c), np.int8)
    grouped[:, : sh.s] = np.asarray(weights, np.int8).reshape(sh.r, sh.s, sh.c)
    return np.ascontiguousarray(grouped.transpose(0, 2, 1)).ravel()


def block_rows(sh: ConvShape, target: Target) -> int:
    """Output rows per block: the most whose groups take at most half of L2 (the build writes them and the
    dots read them back while they are there), at least one."""
    row = sh.ow * sh.c * 4
    span = (sh.r - 1) * sh.dilation + 1
    fit = (target.l2_bytes // 2 // row - span) // sh.stride + 1
    return max(1, min(sh.oh, fit))


@dataclass(frozen=True, kw_only=True)
class GroupedTaps:
    """The route's nest for one workload on one target, its image already emitted."""

    workload: Workload
    sh: ConvShape
    target: Target
    plan: DotPlan
    lanes: int  # i32 lanes of a dot's accumulator vector

    @property
    def rows(self) -> int:
        return block_rows(self.sh, self.target)

    def built(self, out_rows: int) -> int:
        """Padded image rows `out_rows` output rows read."""
        sh = self.sh
        return (out_rows - 1) * sh.stride + (sh.r - 1) * sh.dilation + 1

    def buffer(self) -> Buffer:
        """`groups`: one block's rows of output columns' groups."""
        return Buffer(
            "groups", self.built(self.rows) * self.sh.ow * self.sh.c * 4, BufferKind.LOCAL, self.plan.act
        )

    def group_at(self, row: Affine, col: Affine) -> Affine:
        """The first byte of output column `col`'s groups on the block's row `row`."""
        return (row * self.sh.ow + col) * (self.sh.c * 4)

    def block(self, b: NestBuilder, image: PaddedImage, n: Affine, y0: Affine, count: int) -> None:
        """The groups of output rows y0..y0+count of image n, from their first window row on."""
        sh, v = self.sh, COLUMN
        first = y0 * sh.stride
        with b.loop(self.built(count), "gy") as row, b.loop(sh.ow, "gx") as col:

            def chunk(ch: Affine, size: int) -> None:
                taps = [
                    Load(
                        image.name,
                        image.at(n, first + row, col * sh.stride + t * sh.dilation) + ch,
                        v,
                        size % v,
                    )
                    for t in range(sh.s)
                ]
                b.store(
                    "groups", self.group_at(row, col) + ch * 4, self.tap_group(taps), 4 * v, 4 * (size % v)
                )

            b.split(sh.c, v, chunk, "gc")

    def tap_group(self, taps: list[Load]) -> Value:
        """The 4 * 16 bytes of 16 channels' tap groups from the s <= 4 tap columns' 16 bytes each. x86: each
        column zero-extended to i32 lanes and shifted to its byte (vpmovzxbd, vpslld; the xors one
        vpternlogd), 6 instructions where LLVM's byte interleave took 11 shuffles; elsewhere the columns
        concatenated and interleaved byte by byte, the canonical form of a 4-way interleaved store, which
        LLVM's InterleavedAccess pass makes one st4 on AArch64."""
        act, v = self.plan.act, COLUMN
        if self.target.arch == "x86_64":
            words: Value = Cast(Bitcast(taps[0], DType.U8), DType.I32)
            for t, tap in enumerate(taps[1:], 1):
                byte = Cast(Bitcast(tap, DType.U8), DType.I32)
                words = Binary(BinaryOp.XOR, words, Binary(BinaryOp.SHL, byte, Const(8 * t, v, DType.I32)))
            return Bitcast(words, act)
        columns: list[Value] = [*taps, *[Const(0, v, act)] * (4 - len(taps))]
        low = Shuffle(columns[0], columns[1], tuple(range(2 * v)))
        high = Shuffle(columns[2], columns[3], tuple(range(2 * v)))
        every = Shuffle(low, high, tuple(range(4 * v)))
        return Shuffle(every, every, tuple(v * (i % 4) + i // 4 for i in range(4 * v)))  # a0 b0 c0 d0 a1 ...

    def micro(
        self, b: NestBuilder, pixels: tuple[Affine, Affine, Affine, int], channels: tuple[Affine, int]
    ) -> None:
        """Pixels x0.. of output row (n, y), whose first window row is the block's row `local`, channels
        ch0..ch0+count: a dot per filter row, pixel and vector of `lanes` channels, of its tap groups against
        the row's prepacked weights; then the epilogue."""
        sh, lanes, plan = self.sh, self.lanes, self.plan
        out_row, local, x0, pixels_n = pixels
        ch0, count = channels
        nvec = -(-count // lanes)
        valid = [min(count - c * lanes, lanes) % lanes for c in range(nvec)]
        width = lanes * plan.acc_width
        acc = [[b.register(f"dot_{r}_{c}", width, DType.I32) for c in range(nvec)] for r in range(pixels_n)]
        for line in acc:
            for reg in line:
                b.assign(reg, Const(0, width, DType.I32))
        with b.loop(sh.r, "ti") as i:
            for c in range(nvec):
                first = ch0 + c * lanes
                w = Load("weights", (i * sh.c + first) * 4, 4 * lanes, 4 * valid[c])
                for r in range(pixels_n):
                    at = self.group_at(local + i * sh.dilation, x0 + r) + first * 4
                    b.assign(
                        acc[r][c], Dot(acc[r][c], Load("groups", at, 4 * lanes, 4 * valid[c]), w, plan.insn)
                    )
        requant = Requantizer.of(self.workload, lanes)
        for r in range(pixels_n):
            for c in range(nvec):
                first = ch0 + c * lanes
                total: Value = PairSum(acc[r][c]) if plan.acc_width == 2 else acc[r][c]
                total = Binary(BinaryOp.ADD, total, Load("bias", first, lanes, valid[c]))
                out = (out_row * sh.ow + x0 + r) * sh.c + first
                b.store("output", out, requant.apply(total, first, valid[c]), lanes, valid[c])
