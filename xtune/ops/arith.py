"""The broadcasting arithmetic family of a network's generated operators: ONNX's Mul, Sub, Div and PRelu
(its slope per channel or of any broadcastable shape), and an Add whose operands differ in shape, of two
tensors of any broadcastable shapes — activations or constants, e.g. squeeze-and-excite's [n,c,1,1] gate
times its [n,c,h,w] activation — and a BatchNormalization with no convolution before it to fold into
(DenseNet's pre-activation) as the per-channel x * scale + shift, as one `Arith` kernel (ONNX Runtime's
float32 scale and shift, multiplied and added unfused as its kernel does: xtune/ops/affine.py).

Broadcasting is numpy's, as the ONNX operators define it (https://onnx.ai/onnx/operators/, "Broadcasting
in ONNX"): shapes aligned on their last axis, a size-1 axis repeated. The kernel walks the output in
ONNX's (or NHWC's) order, adjacent axes merged where every operand either varies along both or along
neither; along the innermost axis an operand that varies is loaded a vector at a time, one that does
not is one scalar broadcast to the lanes. A Div runs as a division (not a multiply by the reciprocal),
so it rounds as ONNX Runtime's does."""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass
from enum import Enum

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.affine import batchnorm_float32
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout, differs, physical
from xtune.ops.opkit import (
    Consts,
    GeneratedOp,
    Mapped,
    NodeFamily,
    Shape,
    constant_operand,
    params,
    positive_dims,
    refusing,
    vector_map,
)
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Broadcast,
    Const,
    Kernel,
    Load,
    MulAdd,
    NestBuilder,
    Value,
)


class ArithOp(Enum):
    ADD = "add"
    SUB = "sub"
    MUL = "mul"
    DIV = "div"
    SCALE_SHIFT = "scale_shift"  # a * b + c: a BatchNormalization's inference form
    PRELU = "prelu"  # max(a, 0) + b * min(a, 0): the slope b per channel (or any broadcastable shape)


_ONNX = {
    "Add": ArithOp.ADD,
    "Sub": ArithOp.SUB,
    "Mul": ArithOp.MUL,
    "Div": ArithOp.DIV,
    "PRelu": ArithOp.PRELU,
}
_BINARY = {
    ArithOp.ADD: BinaryOp.ADD,
    ArithOp.SUB: BinaryOp.SUB,
    ArithOp.MUL: BinaryOp.MUL,
    ArithOp.DIV: BinaryOp.DIV,
}
_NUMPY = {ArithOp.ADD: np.add, ArithOp.SUB: np.subtract, ArithOp.MUL: np.multiply, ArithOp.DIV: np.divide}


@dataclass(frozen=True, kw_only=True)
class Arith(GeneratedOp):
    """`op` of operands of `shapes` (each as long as `out`, size-1 axes broadcast) into `out`."""

    op: ArithOp
    shapes: tuple[Shape, ...]
    out: Shape

    def __post_init__(self) -> None:
        positive_dims("arith", self.out)
        for shape in self.shapes:
            if len(shape) != len(self.out) or any(
                d not in (1, o) for d, o in zip(shape, self.out, strict=True)
            ):
                raise InputError(f"arith: {shape} does not broadcast to {self.out}")

    def in_layout(self, layout: Layout, out_shape: Shape) -> Arith:
        """The same computation in `layout`: every 4-D shape's axes in that order (a broadcast operand's
        bytes are the same in both orders whenever the layout pass left it alone: xtune/ops/layout.py,
        `differs`)."""
        if len(self.out) != 4:
            return self
        return Arith(
            op=self.op, shapes=tuple(physical(s, layout) for s in self.shapes), out=physical(self.out, layout)
        )

    @property
    def label(self) -> str:
        """How a profile names its steps."""
        return self.op.value

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return self.shapes

    @property
    def output_shape(self) -> Shape:
        return self.out

    def reference(self, *xs: np.ndarray) -> np.ndarray:
        v = [x.reshape(s).astype(np.float32) for x, s in zip(xs, self.shapes, strict=True)]
        if self.op is ArithOp.PRELU:
            out = np.where(v[0] > 0, v[0], v[0] * v[1])
        else:
            out = v[0] * v[1] + v[2] if self.op is ArithOp.SCALE_SHIFT else _NUMPY[self.op](v[0], v[1])
        return np.broadcast_to(out, self.out).astype(np.float32)

    def _axes(self) -> tuple[list[int], list[list[int]]]:
        """The output's axes merged (size-1 axes dropped, neighbours merged where every operand varies
        along both or neither), and each operand's element stride along each (0: broadcast)."""
        dims: list[int] = []
        strides: list[list[int]] = [[] for _ in self.shapes]
        for axis, size in enumerate(self.out):
            if size == 1:
                continue
            varies = [s[axis] != 1 for s in self.shapes]
            steps = [math.prod(s[axis + 1 :]) if v else 0 for s, v in zip(self.shapes, varies, strict=True)]
            if dims and all((st[-1] != 0) == v for st, v in zip(strides, varies, strict=True)):
                dims[-1] *= size  # contiguous: the inner axis' stride times its size is this one's
                for st, step in zip(strides, steps, strict=True):
                    st[-1] = step
                continue
            dims.append(size)
            for st, step in zip(strides, steps, strict=True):
                st.append(step)
        return dims or [1], [st or [0] for st in strides]

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        b, (dims, strides) = NestBuilder(), self._axes()
        names = [f"x{i}" for i in range(len(self.shapes))]
        with ExitStack() as stack:
            outer = [stack.enter_context(b.loop(d, f"a{i}")) for i, d in enumerate(dims[:-1])]
            out_strides = [math.prod(dims[i + 1 :]) for i in range(len(dims))]
            base_out = sum((v * s for v, s in zip(outer, out_strides, strict=False)), Affine())
            bases = [sum((v * s for v, s in zip(outer, st, strict=False)), Affine()) for st in strides]

            def emit(i: Affine, width: int, count: int) -> None:
                operands: list[Value] = []
                for n, st, base in zip(names, strides, bases, strict=True):
                    if st[-1]:
                        operands.append(Load(n, base + i, width, count))
                    else:  # constant along the innermost axis: one element broadcast
                        operands.append(Broadcast(Load(n, base), width) if width > 1 else Load(n, base))
                value: Value
                if self.op is ArithOp.SCALE_SHIFT:  # rounded twice, as ONNX Runtime's kernel (affine.py)
                    value = Binary(BinaryOp.ADD, Binary(BinaryOp.MUL, operands[0], operands[1]), operands[2])
                elif self.op is ArithOp.PRELU:
                    a, slope = operands
                    zero = Const(0.0, width)
                    value = MulAdd(Binary(BinaryOp.MIN, a, zero), slope, Binary(BinaryOp.MAX, a, zero))
                else:
                    value = Binary(_BINARY[self.op], operands[0], operands[1])
                b.store("out", base_out + i, value, width, count)

            vector_map(b, dims[-1], lanes, emit)
        size = math.prod(self.out)
        # In place (the memory plan's in_place_of): an operand as large as the output is read at the very
        # element the output then writes; a broadcast operand is never as large, so never overwritten.
        sizes = [(n, math.prod(s)) for n, s in zip(names, self.shapes, strict=True)]
        return b.kernel(name, params(sizes, size), noalias=False)


def _aligned(shape: Shape, rank: int) -> Shape:
    return (1,) * (rank - len(shape)) + shape


def _batchnorm(graph: Graph, node: Node, consts: Consts, out: Shape) -> Mapped:
    """x * scale + shift per channel (axis 1), the inference form (xtune/ops/affine.py) computed at build
    time."""
    form = batchnorm_float32(graph, node)
    if form is None:
        raise refuse(
            graph,
            node,
            "a BatchNormalization whose scale, bias, mean and variance are not all "
            "constants (or with training outputs) is not supported",
        )
    scale, shift = form
    channels = out[1] if len(out) > 1 else 1
    if scale.size != channels:
        raise refuse(graph, node, f"{scale.size} normalization parameters for {channels} channels")
    shape = (1, channels, *((1,) * (len(out) - 2)))
    names = (f"{node.name}.scale", f"{node.name}.shift")
    for name, value in zip(names, (scale, shift), strict=True):
        consts[name] = value.astype(np.float32).reshape(shape)
    kernel = Arith(op=ArithOp.SCALE_SHIFT, shapes=(out, shape, shape), out=out)
    return Mapped(kernel=kernel, inputs=(node.inputs[0], *names), in_place=True)


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    out = graph.shape(node.outputs[0])
    if node.op == "BatchNormalization":
        return _batchnorm(graph, node, consts, out)
    inputs = tuple(node.inputs[:2])
    for t in inputs:
        constant_operand(graph, node, t, consts)
    shapes = tuple(_aligned(graph.shape(t), len(out)) for t in inputs)
    with refusing(graph, node):
        kernel = Arith(op=_ONNX[node.op], shapes=shapes, out=out)
    # An operand of fewer than 4 axes that broadcasts as a 4-D one whose NHWC bytes would differ: the
    # layout pass converts only 4-D tensors, so the node runs in NCHW.
    short = [len(graph.shape(t)) < 4 and differs(s) for t, s in zip(inputs, shapes, strict=True)]
    layouts = frozenset((Layout.NCHW,)) if len(out) == 4 and any(short) else None
    return Mapped(kernel=kernel, inputs=inputs, in_place=True, layouts=layouts)


FAMILY = NodeFamily(
    kind="elementwise",
    onnx_ops=("Mul", "Sub", "Div", "PRelu", "BatchNormalization"),
    layouts=frozenset(Layout),
    from_node=from_node,
)
