"""The softmax family of a network's generated operators: ONNX's Softmax over the last axis (opset 13;
before, over the input coerced to 2-D at `axis`), exp(x - max) / sum per row. It runs in NCHW: it
normalizes the last axis of ONNX's order."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout
from xtune.ops.opkit import (
    Consts,
    GeneratedOp,
    Mapped,
    NodeFamily,
    Shape,
    hsum_or_max,
    params,
    positive,
    vector_map,
)
from xtune.schedule.loopnest import (
    Binary,
    BinaryOp,
    Broadcast,
    Buffer,
    BufferKind,
    Const,
    Exp,
    Kernel,
    Load,
    NestBuilder,
)


@dataclass(frozen=True, kw_only=True)
class Softmax(GeneratedOp):
    """Softmax over the last axis of (rows, length): exp(x - max) / sum, per row."""

    rows: int
    length: int

    def __post_init__(self) -> None:
        positive("softmax", rows=self.rows, length=self.length)

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return ((self.rows, self.length),)

    @property
    def output_shape(self) -> Shape:
        return (self.rows, self.length)

    def reference(self, x: np.ndarray) -> np.ndarray:
        e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        b, n = NestBuilder(), self.length
        full = n // lanes  # then n % lanes scalars
        mv, m, sv, s, e = (
            b.register(r, w) for r, w in (("mv", lanes), ("m", 1), ("sv", lanes), ("s", 1), ("e", lanes))
        )
        es = b.register("es", 1)
        with b.loop(self.rows, "r") as r:
            row = r * n
            # 1. the row's maximum (subtracted so that exp cannot overflow)
            b.assign(mv, Const(-math.inf, lanes))
            with b.loop(full, "v") as v:
                b.assign(mv, Binary(BinaryOp.MAX, mv, Load("x", row + v * lanes, lanes)))
            b.assign(m, hsum_or_max(b, mv, lanes, BinaryOp.MAX) if full else Const(-math.inf))
            for j in range(full * lanes, n):
                b.assign(m, Binary(BinaryOp.MAX, m, Load("x", row + j)))
            # 2. exp(x - max) into the output, and its sum
            b.assign(sv, Const(0.0, lanes))
            with b.loop(full, "v") as v:
                b.assign(e, Exp(Binary(BinaryOp.SUB, Load("x", row + v * lanes, lanes), Broadcast(m, lanes))))
                b.store("out", row + v * lanes, e, lanes)
                b.assign(sv, Binary(BinaryOp.ADD, sv, e))
            b.assign(s, hsum_or_max(b, sv, lanes, BinaryOp.ADD) if full else Const(0.0))
            for j in range(full * lanes, n):
                b.assign(es, Exp(Binary(BinaryOp.SUB, Load("x", row + j), m)))
                b.store("out", row + j, es)
                b.assign(s, Binary(BinaryOp.ADD, s, es))
            # 3. times 1/sum
            b.assign(s, Binary(BinaryOp.DIV, Const(1.0), s))
            vector_map(
                b,
                n,
                lanes,
                lambda i, w, c: b.store(
                    "out", row + i, Binary(BinaryOp.MUL, Load("out", row + i, w, c), Broadcast(s, w)), w, c
                ),
            )
        red = (Buffer("red", lanes, BufferKind.LOCAL),) if lanes > 1 else ()
        return b.kernel(name, (*params([("x", self.rows * n)], self.rows * n), *red))


def _softmax(graph: Graph, node: Node, shape: tuple[int, ...]) -> Softmax:
    rank = len(shape)
    # Opset 13 normalizes along `axis` alone (default -1); before, the input was coerced to 2-D at
    # `axis` (default 1) and normalized along the second dimension (ONNX operator spec, Softmax).
    axis = int(node.attr("axis", -1 if graph.opset >= 13 else 1))  # type: ignore[arg-type]
    axis = axis + rank if axis < 0 else axis
    if graph.opset >= 13 and axis != rank - 1:
        raise refuse(graph, node, f"softmax over axis {axis} of {rank}: xtune normalizes the last axis")
    return Softmax(rows=math.prod(shape[:axis]), length=math.prod(shape[axis:]))


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    x = node.inputs[0]
    return Mapped(kernel=_softmax(graph, node, graph.shape(x)), inputs=(x,))


FAMILY = NodeFamily(
    kind="softmax",
    onnx_ops=("Softmax",),
    layouts=frozenset((Layout.NCHW,)),
    from_node=from_node,
)
