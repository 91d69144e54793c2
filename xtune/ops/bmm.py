"""The batched matmul family of a network's generated operators: ONNX's MatMul whose B has batch axes
(A[..., m, k] @ B[..., k, n], the batch axes broadcast as numpy's matmul: attention's Q @ K^T and
scores @ V, both operands activations, or a constant stack of matrices) in, one `BatchedMatmul` kernel
out, in ONNX's order.

A MatMul whose B is one (k, n) matrix is not this family's: the leading axes of A are then rows of one
matrix product, the matmul family's tuning task (xtune/ops/matmul). Here the matrices differ per batch,
so there are no weights to pack once and nothing that a tuned schedule would amortize: the kernel is one
plain vectorized loop (for each batch and row, `_TILE` vectors of B's row times a broadcast element of A
accumulated over k, a partial vector at the end of a row), not tuned."""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout
from xtune.ops.opkit import (
    Consts,
    GeneratedOp,
    Mapped,
    NodeFamily,
    Shape,
    constant_operand,
    params,
    positive,
    refusing,
)
from xtune.schedule.loopnest import Affine, Broadcast, Const, Kernel, Load, MulAdd, NestBuilder

_TILE = 4  # accumulator vectors per row tile: independent FMA chains to hide their latency


def _strides(shape: Shape) -> tuple[int, ...]:
    return tuple(math.prod(shape[i + 1 :]) for i in range(len(shape)))


@dataclass(frozen=True, kw_only=True)
class BatchedMatmul(GeneratedOp):
    """a (..., m, k) @ b (..., k, n), batch axes broadcast, float32, in ONNX's order."""

    a: Shape
    b: Shape

    def __post_init__(self) -> None:
        positive("batched matmul", **{f"a{i}": d for i, d in enumerate(self.a)})
        positive("batched matmul", **{f"b{i}": d for i, d in enumerate(self.b)})
        if len(self.a) < 2 or len(self.b) < 2 or self.a[-1] != self.b[-2]:
            raise InputError(f"batched matmul: shapes {self.a} @ {self.b} do not multiply")
        try:
            np.broadcast_shapes(self.a[:-2], self.b[:-2])
        except ValueError:
            raise InputError(
                f"batched matmul: batch axes {self.a[:-2]} and {self.b[:-2]} do not broadcast"
            ) from None

    @property
    def label(self) -> str:
        """How a profile names its steps."""
        return "batched_matmul"

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (self.a, self.b)

    @property
    def batch(self) -> Shape:
        return tuple(np.broadcast_shapes(self.a[:-2], self.b[:-2]))

    @property
    def output_shape(self) -> Shape:
        return (*self.batch, self.a[-2], self.b[-1])

    def reference(self, *xs: np.ndarray) -> np.ndarray:
        a, b = xs
        return np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(np.float32)

    def _batch_strides(self, shape: Shape) -> tuple[int, ...]:
        """Per output batch axis, the operand's stride along it (0 where the operand broadcasts)."""
        rank = len(self.batch)
        padded = (1,) * (rank - len(shape) + 2) + shape[:-2]
        matrix = shape[-2] * shape[-1]
        return tuple(0 if d == 1 else s * matrix for d, s in zip(padded, _strides(padded), strict=True))

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        (m, k), n = self.a[-2:], self.b[-1]
        b = NestBuilder()
        accs = [b.register(f"acc{u}", lanes) for u in range(_TILE)]
        with ExitStack() as stack:
            a_at, b_at, c_at = Affine(), Affine(), Affine()
            for axis, extent in enumerate(self.batch):
                i = stack.enter_context(b.loop(extent, "batch"))
                a_at += i * self._batch_strides(self.a)[axis]
                b_at += i * self._batch_strides(self.b)[axis]
                c_at += i * (_strides(self.batch)[axis] * m * n)
            with b.loop(m, "m") as row:

                def tile(col: Affine, width: int, row: Affine = row) -> None:
                    vectors = [(u * lanes, min(lanes, width - u * lanes)) for u in range(-(-width // lanes))]
                    for acc in accs[: len(vectors)]:
                        b.assign(acc, Const(0.0, lanes))
                    with b.loop(k, "k") as p:
                        elem = Load("a", a_at + row * k + p)
                        x = Broadcast(elem, lanes) if lanes > 1 else elem
                        for (off, count), acc in zip(vectors, accs, strict=False):
                            w = Load("b", b_at + p * n + col + off, lanes, count)
                            b.assign(acc, MulAdd(x, w, acc))
                    for (off, count), acc in zip(vectors, accs, strict=False):
                        b.store("out", c_at + row * n + col + off, acc, lanes, count)

                b.split(n, _TILE * lanes, tile, "n")
        sizes = [("a", math.prod(self.a)), ("b", math.prod(self.b))]
        return b.kernel(name, params(sizes, math.prod(self.output_shape)))


def batched(a: Shape, b: Shape) -> bool:
    """Whether A @ B of these shapes is this family's: B has batch axes (a (k, n) B is the matmul
    family's task, A's leading axes its rows)."""
    return len(b) > 2 and len(a) >= 2


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    a, b = node.inputs[0], node.inputs[1]
    shape_a, shape_b = graph.shape(a), graph.shape(b)
    if not batched(shape_a, shape_b):
        raise refuse(graph, node, f"MatMul of shapes {shape_a} @ {shape_b} is not supported (1-D operands)")
    for t in (a, b):
        constant_operand(graph, node, t, consts)
    with refusing(graph, node):
        return Mapped(kernel=BatchedMatmul(a=shape_a, b=shape_b), inputs=(a, b))


FAMILY = NodeFamily(
    kind="matmul", onnx_ops=("MatMul",), layouts=frozenset((Layout.NCHW,)), from_node=from_node
)
