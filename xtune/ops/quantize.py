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
from typing import Literal

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
        scale = np.float32(self.scale)
        if self.dequantize:
            return ((x.astype(np.int32) - np.int32(self.zero)).astype(np.float32) * scale).astype(np.float32)
        lo, hi = RANGES[self.qtype]
        bounded = np.clip(
            x.astype(np.float32) / scale, np.float32(lo - self.zero), np.float32(hi - self.zero)
        )
        return (np.rint(bounded).astype(np.int32) + self.zero).astype(self.qtype)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        b, q = NestBuilder(), QDTYPES[self.qtype]
        lo, hi = RANGES[self.qtype]

        def emit(i: Affine, width: int, count: int) -> None:
            x = Load("x", i, width, count)
            value: Value
            if self.dequantize:
                zero = Const(self.zero, width, DType.I32)
                diff = Binary(BinaryOp.SUB, Cast(x, DType.I32), zero)
                value = Binary(BinaryOp.MUL, Cast(diff, DType.F32), Const(self.scale, width))
            else:
                scaled = Binary(BinaryOp.DIV, x, Const(self.scale, width))
                bounds = (Const(float(v - self.zero), width) for v in (lo, hi))
                rounded = Cast(RoundEven(Clamp(scaled, *bounds)), DType.I32)
                value = Cast(Binary(BinaryOp.ADD, rounded, Const(self.zero, width, DType.I32)), q)
            b.store("out", i, value, width, count)

        vector_map(b, self.size, lanes, emit)
        source, dest = (q, DType.F32) if self.dequantize else (DType.F32, q)
        buffers = (
            Buffer("x", self.size, BufferKind.INPUT, source),
            Buffer("out", self.size, BufferKind.OUTPUT, dest),
        )
        return b.kernel(name, buffers)


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    scale = graph.constant(node.inputs[1])
    zero_name = node.inputs[2] if len(node.inputs) > 2 else ""
    zero = graph.constant(zero_name) if zero_name else np.zeros((), np.uint8)
    if scale is None or scale.size != 1 or zero is None or zero.size != 1:
        raise refuse(graph, node, "per-axis quantization of an activation is not supported (one scale only)")
    if str(zero.dtype) not in RANGES:
        raise refuse(graph, node, f"zero point of type {zero.dtype}; xtune quantizes to int8 and uint8")
    x = node.inputs[0]
    if graph.constant(x) is not None:
        raise refuse(graph, node, "the input is a constant (a quantized model's weights feed a kernel)")
    kernel = Quantize(
        dequantize=node.op == "DequantizeLinear",
        shape=graph.shape(x),
        scale=float(scale.reshape(-1)[0]),
        zero=int(zero.reshape(-1)[0]),
        qtype="int8" if zero.dtype == np.int8 else "uint8",
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
