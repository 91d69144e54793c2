"""The 8-bit windows of the pooling family (xtune/ops/pool2d.py): a QLinearAveragePool node (ONNX Runtime's
com.microsoft operator, or the one the quantized rewrite makes of a QDQ AveragePool: xtune/frontend/
quantized.py), or a MaxPool over an 8-bit tensor, in; how a window's 8-bit pixels become one 8-bit mean
or maximum out, as the model's reference computes it — a numpy `reference` over the window's pixels and
the loop-nest `value` of its loads:

- `ClampedMax`, the maximum: ONNX's MaxPool over int8/uint8 (what ONNX Runtime runs of a QDQ MaxPool: its
  QDQ transformer drops a DequantizeLinear/QuantizeLinear pair of one scale and zero point around it),
  TFLite's reference_integer_ops::MaxPool (the largest stored value of the pixels inside the input, then
  clamped to the fused activation's range). Only pixels inside the input are candidates: ONNX pads a
  MaxPool with -inf, which on 8-bit values is never larger than a pixel (the type's minimum, not the zero
  point). The stored integers' order is the real values' (a positive scale), so no dequantization.

- `RoundedMean`, TFLite's (a node of `requant="tflite"`): reference_integer_ops::AveragePool
  (tensorflow/lite/kernels/internal/reference/integer_ops/pooling.h; reference_ops' uint8 one alike)
  sums the stored integers of the pixels inside the input in int32 and divides by their count rounding
  half away from zero, `acc > 0 ? (acc + n/2) / n : (acc - n/2) / n` with C's truncating division, then
  clamps to the fused activation's range. Input and output share one scale and zero point (TFLite's
  pooling Prepare checks it), so no rescaling and no float.
- `QLinearMean`, ONNX Runtime's (onnxruntime/contrib_ops/cpu/quantization/qlinear_pool.cc): each pixel
  dequantized in float32, x_scale * (q - x_zero); their float32 sum in window order divided by the count
  (or by the whole window, count_include_pad=1); nearbyintf(mean / y_scale + y_zero), the zero point added
  before rounding half to even (QuantizeLinear adds it after), clamped to the type.

Both differ from a float average rounded by QuantizeLinear at ties, which these kernels do not.

And the mean of a whole plane, a global average pool (xtune/ops/pool2d.py's GlobalAveragePool) as TFLite's
int8/uint8 MEAN over H and W computes it (`ScaledMean`): reference_ops::QuantizedMeanOrSum
(tensorflow/lite/kernels/internal/reference/reduce.h, the path LiteRT's reference kernels take for every
int8 and uint8 MEAN, any scales): the int32 sum of the stored values minus n times the input's zero point,
times the multiplier QuantizeMultiplier makes of input scale / output scale (as doubles) folded with 1/n
(the multiplier shifted up by floor(log2 n), at most 32 and at most 31 + its shift, then divided by n in
int64), by MultiplyByQuantizedMultiplier (gemmlowp's two roundings); plus the output's zero point, clamped
to the type. Equal scales and zero points take the same arithmetic (a multiplier of 2^30, shift 1)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.qlinear import float_scale, zero_point
from xtune.ops.qmatmul.reference import multiply_by_quantized_multiplier, quantize_multiplier, wrap32
from xtune.ops.quantize import QDTYPES, RANGES, QType, node_arithmetic
from xtune.schedule.loopnest import (
    Binary,
    BinaryOp,
    Cast,
    Clamp,
    Const,
    DType,
    HighMul,
    NestBuilder,
    RoundEven,
    RoundShift,
    Value,
)


@dataclass(frozen=True, kw_only=True)
class RoundedMean:
    """TFLite's integer average of `qtype` values, clamped to [lo, hi] (the fused activation's range, as
    CalculateActivationRangeQuantized gives it)."""

    qtype: QType
    lo: int
    hi: int

    def reference(self, taps: Sequence[np.ndarray], count: int) -> np.ndarray:
        """The rounded mean of the window's pixels `taps`, as C computes it."""
        total = np.sum([t.astype(np.int64) for t in taps], axis=0)
        half = count // 2
        away = np.where(total > 0, (total + half) // count, -((half - total) // count))
        return np.clip(away, self.lo, self.hi).astype(self.qtype)

    def value(self, b: NestBuilder, taps: Sequence[Value], width: int, count: int) -> Value:
        """The mean of the taps (8-bit loads), in their type. The sum is a register: it is read twice, by
        its sign and by the division."""
        total = b.register(f"sum{width}", width, DType.I32)
        acc: Value = Cast(taps[0], DType.I32)
        for tap in taps[1:]:
            acc = Binary(BinaryOp.ADD, acc, Cast(tap, DType.I32))
        b.assign(total, acc)

        def i32(v: int) -> Const:
            return Const(v, width, DType.I32)

        sign = Binary(BinaryOp.SHR, total, i32(31))  # -1 where the sum is negative, else 0
        half = Binary(BinaryOp.SUB, Binary(BinaryOp.XOR, i32(count // 2), sign), sign)  # n/2 or -n/2
        mean = Binary(BinaryOp.DIV, Binary(BinaryOp.ADD, total, half), i32(count))
        clamped = Binary(BinaryOp.MIN, Binary(BinaryOp.MAX, mean, i32(self.lo)), i32(self.hi))
        return Cast(clamped, QDTYPES[self.qtype])


@dataclass(frozen=True, kw_only=True)
class QLinearMean:
    """ONNX Runtime's QLinearAveragePool mean of `qtype` values, in float32."""

    qtype: QType
    x_scale: float
    x_zero: int
    y_scale: float
    y_zero: int

    def reference(self, taps: Sequence[np.ndarray], count: int) -> np.ndarray:
        """The mean of the window's pixels `taps`, with ONNX Runtime's float32 operations in its order."""
        acc = np.zeros(taps[0].shape, np.float32)
        for t in taps:
            acc = acc + (t.astype(np.int32) - np.int32(self.x_zero)).astype(np.float32) * np.float32(
                self.x_scale
            )
        y = acc / np.float32(count) / np.float32(self.y_scale) + np.float32(self.y_zero)
        lo, hi = RANGES[self.qtype]
        return np.clip(np.rint(y), lo, hi).astype(self.qtype)

    def value(self, b: NestBuilder, taps: Sequence[Value], width: int, count: int) -> Value:
        """The mean of the taps (8-bit loads), in their type."""
        acc: Value | None = None
        for tap in taps:
            centred = Binary(BinaryOp.SUB, Cast(tap, DType.I32), Const(self.x_zero, width, DType.I32))
            real = Binary(BinaryOp.MUL, Cast(centred, DType.F32), Const(self.x_scale, width))
            acc = real if acc is None else Binary(BinaryOp.ADD, acc, real)
        assert acc is not None
        mean = Binary(BinaryOp.DIV, acc, Const(float(count), width))
        y = Binary(
            BinaryOp.ADD, Binary(BinaryOp.DIV, mean, Const(self.y_scale, width)), Const(self.y_zero, width)
        )
        lo, hi = RANGES[self.qtype]
        # Clamped before rounding: the same as after, the bounds being integers, and the conversion fits.
        rounded = RoundEven(Clamp(y, Const(float(lo), width), Const(float(hi), width)))
        return Cast(Cast(rounded, DType.I32), QDTYPES[self.qtype])


@dataclass(frozen=True, kw_only=True)
class ClampedMax:
    """The largest of a window's `qtype` values, clamped to [lo, hi] (a fused activation's range)."""

    qtype: QType
    lo: int
    hi: int

    def reference(self, taps: Sequence[np.ndarray], count: int) -> np.ndarray:
        """The maximum of the window's pixels `taps` (`count`, the divisor of a mean, is not read)."""
        return np.clip(np.max(taps, axis=0), self.lo, self.hi).astype(self.qtype)

    def value(self, b: NestBuilder, taps: Sequence[Value], width: int, count: int) -> Value:
        """The maximum of the taps (8-bit loads), compared in their own type (signed or not)."""
        acc: Value = taps[0]
        for tap in taps[1:]:
            acc = Binary(BinaryOp.MAX, acc, tap)
        dtype, (lo, hi) = QDTYPES[self.qtype], RANGES[self.qtype]
        if self.lo > lo:
            acc = Binary(BinaryOp.MAX, acc, Const(self.lo, width, dtype))
        if self.hi < hi:
            acc = Binary(BinaryOp.MIN, acc, Const(self.hi, width, dtype))
        return acc


QuantizedMean = RoundedMean | QLinearMean
QuantizedWindow = QuantizedMean | ClampedMax  # what an 8-bit pool makes of each window


def clamped_max(graph: Graph, node: Node) -> ClampedMax:
    """The maximum of a MaxPool node over an 8-bit tensor, clamped to its `out_lo`/`out_hi` (xtune's
    attributes for a fused activation, absent: the type's range)."""
    qtype = graph.dtype(node.inputs[0])
    if graph.dtype(node.outputs[0]) != qtype or any(node.outputs[1:]):
        raise refuse(graph, node, "an 8-bit MaxPool has one output of its input's type (no Indices)")
    lo, hi = RANGES[qtype]
    lo, hi = max(lo, node.int_attr("out_lo", lo)), min(hi, node.int_attr("out_hi", hi))
    return ClampedMax(qtype=cast(QType, qtype), lo=lo, hi=hi)


def quantized_mean(graph: Graph, node: Node) -> QuantizedMean:
    """The mean of a QLinearAveragePool node (inputs x, x_scale, x_zero_point, y_scale, y_zero_point):
    TFLite's where the node says `requant="tflite"` (with its clamp `out_lo`/`out_hi`), else ONNX
    Runtime's."""
    x, y = node.inputs[0], node.outputs[0]
    qtype = graph.dtype(x)
    if qtype not in RANGES or graph.dtype(y) != qtype:
        raise refuse(graph, node, f"pools {qtype} into {graph.dtype(y)}; xtune pools int8 or uint8 alike")
    if node.int_attr("channels_last", 0):
        raise refuse(graph, node, "channels_last=1 is not supported")
    lo, hi = RANGES[qtype]
    if node_arithmetic(node) == "tflite":
        lo, hi = max(lo, node.int_attr("out_lo", lo)), min(hi, node.int_attr("out_hi", hi))
        return RoundedMean(qtype=cast(QType, qtype), lo=lo, hi=hi)
    x_scale, x_zero, y_scale, y_zero = _per_tensor(graph, node)
    return QLinearMean(
        qtype=cast(QType, qtype), x_scale=x_scale, x_zero=x_zero, y_scale=y_scale, y_zero=y_zero
    )


def _per_tensor(graph: Graph, node: Node) -> tuple[float, int, float, int]:
    """(x_scale, x_zero, y_scale, y_zero) of a QLinear node whose inputs are x, x_scale, x_zero_point,
    y_scale, y_zero_point, each one constant."""
    names = (*node.inputs[1:5], "", "", "", "")[:4]
    sx, sy = (float_scale(graph, node, names[i]) for i in (0, 2))
    zx, zy = (zero_point(graph, node, names[i]) for i in (1, 3))
    if sx.size != 1 or sy.size != 1 or zx.size != 1 or zy.size != 1:
        raise refuse(graph, node, "scales and zero points must be per tensor")
    return float(sx.reshape(-1)[0]), int(zx.reshape(-1)[0]), float(sy.reshape(-1)[0]), int(zy.reshape(-1)[0])


@dataclass(frozen=True, kw_only=True)
class ScaledMean:
    """TFLite's integer MEAN of `count` `qtype` values, the multiplier and shift folded with 1/count."""

    qtype: QType
    count: int
    x_zero: int
    y_zero: int
    multiplier: int
    shift: int

    @staticmethod
    def of(qtype: QType, count: int, x_scale: float, x_zero: int, y_scale: float, y_zero: int) -> ScaledMean:
        """As QuantizedMeanOrSum readapts the multiplier of PrepareMeanOrSum (tensorflow/lite/kernels/
        reduce.cc) to the count."""
        multiplier, shift = quantize_multiplier(float(np.float32(x_scale)) / float(np.float32(y_scale)))
        up = min(count.bit_length() - 1, 32, 31 + shift)
        return ScaledMean(
            qtype=qtype,
            count=count,
            x_zero=x_zero,
            y_zero=y_zero,
            multiplier=(multiplier << up) // count,
            shift=shift - up,
        )

    def reference(self, total: np.ndarray) -> np.ndarray:
        """The means of the int32 sums `total` of `count` stored values each, as C computes them."""
        centred = wrap32(np.asarray(total, np.int64) - self.x_zero * self.count)
        scaled = multiply_by_quantized_multiplier(
            centred, np.asarray(self.multiplier, np.int64), np.asarray(self.shift, np.int64)
        )
        lo, hi = RANGES[self.qtype]
        return np.clip(scaled.astype(np.int64) + self.y_zero, lo, hi).astype(self.qtype)

    def value(self, total: Value, width: int) -> Value:
        """The mean of the int32 sums `total` (a register of `width` lanes), in the 8-bit type."""

        def i32(v: int) -> Const:
            return Const(v, width, DType.I32)

        centred = Binary(BinaryOp.SUB, total, i32(int(wrap32(np.asarray(self.x_zero * self.count)))))
        if self.shift > 0:
            centred = Binary(BinaryOp.SHL, centred, i32(self.shift))
        scaled = RoundShift(HighMul(centred, i32(self.multiplier)), i32(max(-self.shift, 0)))
        lo, hi = RANGES[self.qtype]
        y = Binary(BinaryOp.ADD, scaled, i32(self.y_zero))
        return Cast(Binary(BinaryOp.MIN, Binary(BinaryOp.MAX, y, i32(lo)), i32(hi)), QDTYPES[self.qtype])


def scaled_mean(graph: Graph, node: Node, count: int) -> ScaledMean:
    """TFLite's MEAN of a QLinearGlobalAveragePool node (inputs x, x_scale, x_zero_point, y_scale,
    y_zero_point) over planes of `count` pixels."""
    qtype = graph.dtype(node.inputs[0])
    if qtype not in RANGES or graph.dtype(node.outputs[0]) != qtype:
        raise refuse(
            graph, node, f"averages {qtype} into {graph.dtype(node.outputs[0])}; xtune: int8 or uint8"
        )
    x_scale, x_zero, y_scale, y_zero = _per_tensor(graph, node)
    return ScaledMean.of(cast(QType, qtype), count, x_scale, x_zero, y_scale, y_zero)
