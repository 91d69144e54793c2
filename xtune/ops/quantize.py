"""The quantize family of a network's generated operators: ONNX's QuantizeLinear (float32 in, int8 or uint8
out) and DequantizeLinear (8-bit in, float32 out) between a quantized model's integer kernels and its float
parts (its input and output, a float head or Softmax), per tensor, as one `Quantize` kernel in any layout
(elementwise: the same whatever the order): QuantizeLinear in the network's, DequantizeLinear in its input's,
so that a conversion between layouts happens on the float32 side (xtune/firmware/relayout.py converts
float32 tensors only).

The arithmetic is ONNX Runtime's (onnxruntime/core/mlas/lib/quantize.cpp, MlasQuantizeLinear): x / scale
in float32 (a division, not a product by the reciprocal), clamped to [lo - zero, hi - zero], rounded to
nearest even (cvtps2dq, FCVTNS), plus the zero point; DequantizeLinear as its
onnxruntime/core/providers/cpu/quantization/quantize_linear.cc: (int32(q) - zero) converted to float32,
times the scale. Both are exact: each output is one correctly rounded float32 operation away from its
input, which the reference (`reference`) computes in numpy with the same operations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, cast, get_args

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout
from xtune.ops.opkit import Consts, Mapped, NodeFamily, PointwiseOp, Shape, positive_dims, vector_map
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Buffer,
    BufferKind,
    Cast,
    Clamp,
    Const,
    DType,
    Kernel,
    Load,
    NestBuilder,
    RoundEven,
    Value,
)

QType = Literal["int8", "uint8"]
# Whose integer arithmetic a quantized node of the network IR follows, as its `requant` attribute says
# (set by the import, xtune/frontend/quantized.py): ONNX Runtime's (the default), TFLite's, or the float
# form between its Dequantize and Quantize (an int8 Add or Mul ONNX Runtime does not fuse on x86; on ARM
# it fuses the Add, which a build for ARM then runs as its QLinearAdd: xtune/ops/qmlas.py, fuses_int8_qdq).
NodeArithmetic = Literal["onnx", "tflite", "float"]
QDTYPES = {"int8": DType.I8, "uint8": DType.U8}  # an 8-bit tensor's element type in loop nests
RANGES = {"int8": (-128, 127), "uint8": (0, 255)}  # by element type (qmatmul/reference.py: by `a` word)


@dataclass(frozen=True, kw_only=True)
class Quantize(PointwiseOp):
    """QuantizeLinear (`dequantize` False: float32 -> `qtype`) or DequantizeLinear (`qtype` -> float32)
    of a tensor of `shape`, with one scale and zero point."""

    dequantize: bool
    shape: Shape
    scale: float
    zero: int
    qtype: QType

    def __post_init__(self) -> None:
        positive_dims("quantize", self.shape)

    @property
    def label(self) -> str:
        return "dequantize" if self.dequantize else "quantize"

    def reference(self, x: np.ndarray) -> np.ndarray:
        params = QParams(scale=self.scale, zero=self.zero, qtype=self.qtype)
        return params.dequantize(x) if self.dequantize else params.quantize(x)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        b, q = NestBuilder(), QDTYPES[self.qtype]
        params = QParams(scale=self.scale, zero=self.zero, qtype=self.qtype)

        def emit(i: Affine, width: int, count: int) -> None:
            x = Load("x", i, width, count)
            value = dequantized(x, width, params) if self.dequantize else quantized(x, width, params)
            b.store("out", i, value, width, count)

        vector_map(b, self.size, lanes, emit)
        source, dest = (q, DType.F32) if self.dequantize else (DType.F32, q)
        buffers = (
            Buffer("x", self.size, BufferKind.INPUT, source),
            Buffer("out", self.size, BufferKind.OUTPUT, dest),
        )
        return b.kernel(name, buffers)


@dataclass(frozen=True, kw_only=True)
class QParams:
    """One 8-bit tensor's quantization: real = scale * (q - zero), q of `qtype`."""

    scale: float
    zero: int
    qtype: QType

    @property
    def dtype(self) -> DType:
        return QDTYPES[self.qtype]

    def dequantize(self, q: np.ndarray) -> np.ndarray:
        """DequantizeLinear as ONNX Runtime computes it: (int32(q) - zero) in float32, times the scale."""
        diff = (q.astype(np.int32) - np.int32(self.zero)).astype(np.float32)
        return (diff * np.float32(self.scale)).astype(np.float32)

    def quantize(self, x: np.ndarray) -> np.ndarray:
        """QuantizeLinear as MLAS computes it: x / scale, clamped, rounded half to even, plus zero."""
        lo, hi = RANGES[self.qtype]
        scaled = x.astype(np.float32) / np.float32(self.scale)
        bounded = np.clip(scaled, np.float32(lo - self.zero), np.float32(hi - self.zero))
        return (np.rint(bounded).astype(np.int32) + self.zero).astype(self.qtype)


def dequantized(x: Value, width: int, q: QParams) -> Value:
    """The nest value of DequantizeLinear of `x` (8-bit lanes): float32((int32(x) - zero)) * scale."""
    diff = Binary(BinaryOp.SUB, Cast(x, DType.I32), Const(q.zero, width, DType.I32))
    return Binary(BinaryOp.MUL, Cast(diff, DType.F32), Const(q.scale, width))


def quantized(x: Value, width: int, q: QParams) -> Value:
    """The nest value of QuantizeLinear of `x` (float32 lanes), MLAS's order: divided by the scale,
    clamped to [lo - zero, hi - zero], rounded half to even, plus the zero point, as `q.qtype`."""
    lo, hi = RANGES[q.qtype]
    scaled = Binary(BinaryOp.DIV, x, Const(q.scale, width))
    bounds = (Const(float(v - q.zero), width) for v in (lo, hi))
    rounded = Cast(RoundEven(Clamp(scaled, *bounds)), DType.I32)
    return Cast(Binary(BinaryOp.ADD, rounded, Const(q.zero, width, DType.I32)), q.dtype)


def node_qparams(graph: Graph, node: Node) -> QParams | None:
    """The quantization of a QuantizeLinear or DequantizeLinear node: one constant scale and an 8-bit
    zero point (absent: uint8 0, ONNX's default); None if it is per axis or not constant."""
    scale = graph.constant(node.inputs[1])
    zero_name = node.inputs[2] if len(node.inputs) > 2 else ""
    zero = graph.constant(zero_name) if zero_name else np.zeros((), np.uint8)
    if scale is None or scale.size != 1 or zero is None or zero.size != 1 or str(zero.dtype) not in RANGES:
        return None
    qtype: QType = "int8" if zero.dtype == np.int8 else "uint8"
    return QParams(scale=float(scale.reshape(-1)[0]), zero=int(zero.reshape(-1)[0]), qtype=qtype)


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    params = node_qparams(graph, node)
    if params is None:
        scale = graph.constant(node.inputs[1])
        if scale is None or scale.size != 1:
            raise refuse(
                graph, node, "per-axis quantization of an activation is not supported (one scale only)"
            )
        raise refuse(
            graph, node, "the zero point is not one constant int8 or uint8; xtune quantizes to those"
        )
    x = node.inputs[0]
    if graph.constant(x) is not None:
        raise refuse(graph, node, "the input is a constant (a quantized model's weights feed a kernel)")
    kernel = Quantize(
        dequantize=node.op == "DequantizeLinear",
        shape=graph.shape(x),
        scale=params.scale,
        zero=params.zero,
        qtype=params.qtype,
    )
    # A DequantizeLinear runs where its 8-bit input is (a TFLite model's int8 NHWC input, read as ONNX's
    # order; an int8 kernel's NHWC output in an NCHW network): what needs converting is its float output.
    return Mapped(kernel=kernel, inputs=(x,), follows_input=kernel.dequantize)


FAMILY = NodeFamily(
    kind="quantize",
    onnx_ops=("QuantizeLinear", "DequantizeLinear"),
    layouts=frozenset(Layout),
    from_node=from_node,
)


def node_arithmetic(node: Node) -> NodeArithmetic:
    """The arithmetic a quantized node follows (`NodeArithmetic`): its `requant` attribute, "onnx" without."""
    value = str(node.attr("requant", "onnx"))
    assert value in get_args(NodeArithmetic), f"{node.name}: requant={value!r}"
    return cast(NodeArithmetic, value)
