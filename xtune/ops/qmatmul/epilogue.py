"""The requantizing epilogue of int8 kernels: a qmatmul workload in, the loop-nest values that turn an
int32 accumulator vector into the stored output out (the nest form of xtune/ops/qmatmul/reference.py).

The output clamp [lo, hi] and the zero points are read from the `qparams` input ([za, zy, lo, hi]); a
fused ReLU or ReLU6 is only a narrower clamp, so one kernel serves all three. With dequant=1 the 8-bit
result is not stored but dequantized ((q - zy) in float32, times the `out_scale` input), the value a
DequantizeLinear after the kernel would compute from it: the rounding to 8 bits happens all the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from xtune.ops.qmatmul.reference import Requant
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Broadcast,
    Cast,
    Clamp,
    Const,
    DType,
    HighMul,
    Load,
    RoundEven,
    RoundShift,
    Shuffle,
    Value,
)


@dataclass(frozen=True, kw_only=True)
class Requantizer:
    """How a workload's int32 sums become its output (its `requant`, scales per tensor or per channel)."""

    kind: Requant
    lanes: int
    per_channel: bool
    out: DType
    dequant: bool = False
    fcvtns: bool = False  # round to int32 by AArch64's FCVTNS (`RoundEven`)

    @staticmethod
    def of(workload: Workload, lanes: int, arch: str) -> Requantizer:
        """`arch`: the target's (Target.arch), which picks the rounding conversion."""
        out = {"u8": DType.U8, "s8": DType.I8}[str(workload.value("a"))]
        kind = cast(Requant, workload.value("requant"))
        return Requantizer(
            kind=kind,
            lanes=lanes,
            per_channel=bool(workload["perchannel"]),
            out=out,
            dequant=bool(workload["dequant"]),
            fcvtns=arch == "aarch64",
        )

    def channel(self, buffer: str, col: Affine, count: int) -> Value:
        """A scale-like input's vector for columns col.., or its single value in every lane."""
        if self.per_channel:
            return Load(buffer, col, self.lanes, count)
        return Broadcast(Load(buffer, Affine()), self.lanes)

    def param(self, index: int) -> Value:
        return Load("qparams", Affine.of(index))

    def apply(self, total: Value, col: Affine, count: int) -> Value:
        """The value stored for accumulators `total` (bias included) of columns col..col+lanes."""
        if self.kind == "none":
            return total
        lanes, i32 = self.lanes, DType.I32
        zy = Broadcast(self.param(1), lanes)
        if self.kind == "onnx":
            # MLAS's order: the float clamped to [lo - zy, hi - zy], rounded half to even, plus zy.
            f = self._scaled(total, col, count)
            lo, hi = self._bounds_from_zero(DType.F32, lanes)
            if self.dequant:  # (int32(rounded) + zy - zy) in float32 is `rounded` itself, an integer
                return Binary(BinaryOp.MUL, RoundEven(Clamp(f, lo, hi)), self._out_scale())
            y: Value = Cast(RoundEven(Clamp(f, lo, hi)), i32) if not self.fcvtns else self._fcvtns(f, hi)
            return Cast(Binary(BinaryOp.ADD, y, zy), self.out)
        shift = self.channel("shift", col, count)
        zero = Const(0, lanes, i32)
        left = Binary(BinaryOp.MAX, shift, zero)
        right = Binary(BinaryOp.MAX, Binary(BinaryOp.SUB, zero, shift), zero)
        x = HighMul(Binary(BinaryOp.SHL, total, left), self.channel("multiplier", col, count))
        y = Binary(BinaryOp.ADD, RoundShift(x, right), zy)
        lo, hi = (Broadcast(self.param(i), lanes) for i in (2, 3))
        y = Binary(BinaryOp.MIN, Binary(BinaryOp.MAX, y, lo), hi)
        if self.dequant:
            return Binary(BinaryOp.MUL, Cast(Binary(BinaryOp.SUB, y, zy), DType.F32), self._out_scale())
        return Cast(y, self.out)

    @property
    def narrows_rows(self) -> bool:
        """Whether a tile row's vectors are requantized together (`apply_row`): AArch64's `onnx` bytes."""
        return self.fcvtns and self.kind == "onnx" and not self.dequant

    def apply_row(self, totals: list[tuple[Value, Affine]]) -> Value:
        """The bytes of a row of whole vectors (accumulators with their bias, and each one's first column)
        as one vector of `joined_lanes` lanes, for one store. Each vector is scaled and rounded by FCVTNS
        (which saturates), then the row is narrowed to i16 saturating (SQXTN, SQXTN2: 2 per 8 lanes),
        clamped to [lo - zy, hi - zy] in i16 lanes (SMAX, SMIN: one each per 8), truncated to bytes (UZP1,
        one per 16) and zy added to the bytes (one ADD per 16, wrapping: the result lies in [lo, hi], one
        byte). The same bits as `apply`: rounding is monotonic and both bounds are integers within i16, so
        clamping the rounded, saturated value equals rounding the clamped one; `apply` narrows and adds
        per 4 lanes instead (about 12 instructions per 4 outputs against 6 here, Arm ARM SQXTN, UZP1)."""
        words: list[Value] = [
            Cast(RoundEven(self._scaled(t, col, 0), fcvtns=True), DType.I32) for t, col in totals
        ]
        row = _join(words, self.lanes)
        n, i16 = joined_lanes(len(words), self.lanes), DType.I16
        saturated = Binary(
            BinaryOp.MIN,
            Binary(BinaryOp.MAX, row, Const(-(1 << 15), n, DType.I32)),
            Const((1 << 15) - 1, n, DType.I32),
        )
        lo, hi = self._bounds_from_zero(i16, n)
        clamped = Binary(BinaryOp.MIN, Binary(BinaryOp.MAX, Cast(saturated, i16), lo), hi)
        return Binary(BinaryOp.ADD, Cast(clamped, self.out), Broadcast(Cast(self.param(1), self.out), n))

    def _bounds_from_zero(self, dtype: DType, lanes: int) -> tuple[Value, Value]:
        """The output type's bounds less the zero point, [lo - zy, hi - zy], in `dtype` lanes: where both
        requantizations clamp, before zy is added."""
        lo, hi = (Cast(Binary(BinaryOp.SUB, self.param(i), self.param(1)), dtype) for i in (2, 3))
        return Broadcast(lo, lanes), Broadcast(hi, lanes)

    def _scaled(self, total: Value, col: Affine, count: int) -> Value:
        """float32(total) times its column's scale (MLAS's first step)."""
        return Binary(BinaryOp.MUL, Cast(total, DType.F32), self.channel("scale", col, count))

    def _fcvtns(self, f: Value, hi: Value) -> Value:
        """AArch64: only the upper bound clamped in float, FCVTNS, then the lower bound as an integer
        max (SMAX runs on the A76's integer pipes while fmaxnm, fminnm, scvtf, fmul and fcvtns share
        its two FP ones: Arm Cortex-A76 Software Optimization Guide, 3.14). The same bits: rounding is
        monotonic and lo - zy an integer, so max(round(f), lo - zy) = round(max(f, lo - zy)), and a
        large negative f saturates to INT32_MIN (Arm ARM, FCVTNS), still below lo - zy."""
        lanes = self.lanes
        below = Const(float("-inf"), lanes)  # no lower float bound: maxnum(x, -inf) folds away
        rounded = Cast(RoundEven(Clamp(f, below, hi), fcvtns=True), DType.I32)
        low = Broadcast(Binary(BinaryOp.SUB, self.param(2), self.param(1)), lanes)
        return Binary(BinaryOp.MAX, rounded, low)

    def _out_scale(self) -> Value:
        return Broadcast(Load("out_scale", Affine()), self.lanes)


def joined_lanes(parts: int, width: int) -> int:
    """Lanes of `parts` vectors of `width` lanes joined by `_join`: their count rounded up to a power of 2."""
    return width << (parts - 1).bit_length()


def _join(parts: list[Value], width: int) -> Value:
    """The parts (each `width` lanes) side by side, in `joined_lanes` lanes: pairs joined by `Shuffle`
    (an odd count padded with its last part, lanes no store keeps) until one is left."""
    while len(parts) > 1:
        if len(parts) % 2:
            parts = [*parts, parts[-1]]
        parts = [Shuffle(a, b, tuple(range(2 * width))) for a, b in zip(parts[::2], parts[1::2], strict=True)]
        width *= 2
    return parts[0]
