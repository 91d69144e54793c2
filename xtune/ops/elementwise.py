"""The elementwise family of a network's generated operators: ONNX's Add (same shapes; followed by its
only reader Relu, one Add+ReLU), Relu and Clip (constant scalar bounds) as one `Elementwise` kernel, run
in place and in the layout its first input has. An Add whose operands differ in shape broadcasts: the
arithmetic family's kernel (xtune/ops/arith.py) runs it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops import arith
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout
from xtune.ops.opkit import Consts, Mapped, NodeFamily, PointwiseOp, Shape, constant_operand, positive_dims
from xtune.schedule.loopnest import Binary, BinaryOp, Const, Kernel, Value


class ElementwiseOp(Enum):
    ADD = "add"
    ADD_RELU = "add_relu"
    CLIP = "clip"  # Relu is Clip(0, +inf)


@dataclass(frozen=True, kw_only=True)
class Elementwise(PointwiseOp):
    """Add (two inputs of `shape`), Add followed by ReLU, or Clip(lo, hi) (one input)."""

    op: ElementwiseOp
    shape: Shape
    lo: float = -math.inf
    hi: float = math.inf

    def __post_init__(self) -> None:
        positive_dims("elementwise", self.shape)
        if not self.lo <= self.hi:
            raise InputError(f"clip: min {self.lo} is above max {self.hi}")

    @property
    def label(self) -> str:
        """How a profile names its steps."""
        return self.op.value

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (self.shape,) * (1 if self.op is ElementwiseOp.CLIP else 2)

    def reference(self, *xs: np.ndarray) -> np.ndarray:
        if self.op is ElementwiseOp.CLIP:
            return np.clip(xs[0], np.float32(self.lo), np.float32(self.hi))
        out = xs[0] + xs[1]
        return np.maximum(out, np.float32(0)) if self.op is ElementwiseOp.ADD_RELU else out

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        def value(xs: list[Value], width: int) -> Value:
            if self.op is ElementwiseOp.CLIP:
                out = xs[0]
                if self.lo > -math.inf:
                    out = Binary(BinaryOp.MAX, out, Const(self.lo, width))
                if self.hi < math.inf:
                    out = Binary(BinaryOp.MIN, out, Const(self.hi, width))
                return out
            out = Binary(BinaryOp.ADD, xs[0], xs[1])
            return Binary(BinaryOp.MAX, out, Const(0.0, width)) if self.op is ElementwiseOp.ADD_RELU else out

        return self.map_nest(name, lanes, "a" if self.op is ElementwiseOp.CLIP else "ab", value)


def relu(shape: Shape) -> Elementwise:
    return Elementwise(op=ElementwiseOp.CLIP, shape=shape, lo=0.0)


def _bound(graph: Graph, node: Node, tensor: str) -> float | None:
    if not tensor:
        return None
    value = graph.constant(tensor)
    if value is None or value.size != 1:
        raise refuse(graph, node, f"bound '{tensor}' is not a constant scalar")
    return float(value.reshape(-1)[0])


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    out = node.outputs[0]
    if node.op == "Add":
        inputs = tuple(node.inputs[:2])
        if any(graph.shape(t) != graph.shape(out) for t in inputs):
            return arith.from_node(graph, node, consts, nxt)  # a broadcasting Add
        for t in inputs:
            constant_operand(graph, node, t, consts)
        fused = nxt if nxt is not None and nxt.op == "Relu" and out not in graph.outputs else None
        op = ElementwiseOp.ADD_RELU if fused is not None else ElementwiseOp.ADD
        return Mapped(
            kernel=Elementwise(op=op, shape=graph.shape(out)), inputs=inputs, in_place=True, fused=fused
        )
    if node.op == "Relu":
        return Mapped(kernel=relu(graph.shape(out)), inputs=(node.inputs[0],), in_place=True)
    lo, hi = (_bound(graph, node, t) for t in (*node.inputs[1:3], "", "")[:2])
    lo, hi = -math.inf if lo is None else lo, math.inf if hi is None else hi
    kernel = Elementwise(op=ElementwiseOp.CLIP, shape=graph.shape(out), lo=lo, hi=hi)
    return Mapped(kernel=kernel, inputs=(node.inputs[0],), in_place=True)


FAMILY = NodeFamily(
    kind="elementwise",
    onnx_ops=("Add", "Relu", "Clip"),
    layouts=frozenset(Layout),
    from_node=from_node,
    follows_input=True,
)
