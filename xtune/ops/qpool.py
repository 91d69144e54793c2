"""The 8-bit averages of the pooling family (xtune/ops/pool2d.py): a QLinearAveragePool node (ONNX Runtime's
com.microsoft operator, or the one the quantized rewrite makes of a QDQ AveragePool: xtune/frontend/
quantized.py) in, how a window's 8-bit pixels become one 8-bit mean out, as the model's reference computes
it — a numpy `reference` over the window's pixels and the loop-nest `value` of its loads:

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

Both differ from a float average rounded by QuantizeLinear at ties, which these kernels do not."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.qlinear import float_scale, zero_point
from xtune.ops.quantize import QDTYPES, RANGES, QType
from xtune.schedule.loopnest import (
    Binary,
    BinaryOp,
    Cast,
    Clamp,
    Const,
    DType,
    NestBuilder,
    RoundEven,
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


QuantizedMean = RoundedMean | QLinearMean


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
    if node.attr("requant", "onnx") == "tflite":
        lo, hi = max(lo, node.int_attr("out_lo", lo)), min(hi, node.int_attr("out_hi", hi))
        return RoundedMean(qtype=cast(QType, qtype), lo=lo, hi=hi)
    names = (*node.inputs[1:5], "", "", "", "")[:4]
    sx, sy = (float_scale(graph, node, names[i]) for i in (0, 2))
    zx, zy = (zero_point(graph, node, names[i]) for i in (1, 3))
    if sx.size != 1 or sy.size != 1 or zx.size != 1 or zy.size != 1:
        raise refuse(graph, node, "scales and zero points must be per tensor")
    return QLinearMean(
        qtype=cast(QType, qtype),
        x_scale=float(sx.reshape(-1)[0]),
        x_zero=int(zx.reshape(-1)[0]),
        y_scale=float(sy.reshape(-1)[0]),
        y_zero=int(zy.reshape(-1)[0]),
    )
