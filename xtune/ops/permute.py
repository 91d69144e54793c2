"""The permutation family of a network's generated operators: ONNX's Transpose of any constant `perm`
(ShuffleNet's channel shuffle: a Reshape to (n, groups, c/groups, h, w), Transpose (0, 2, 1, 3, 4),
Reshape back) in, one `Permute` kernel out, in ONNX's order (NCHW).

The output is written in order. Output axes that are neighbours in the input too are merged first and
size-1 axes dropped, so a channel shuffle is three loops over contiguous planes; along the innermost
merged axis the input is read a vector at a time where it is contiguous there too, else element by
element. (The layout conversions the layout pass inserts are xtune/ops/transpose.py's, blocked.)"""

from __future__ import annotations

import math
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.opkit import Consts, GeneratedOp, Mapped, Shape, params, positive_dims, refusing, vector_map
from xtune.schedule.loopnest import Affine, Kernel, Load, NestBuilder


@dataclass(frozen=True, kw_only=True)
class Permute(GeneratedOp):
    """x of `shape` with its axes permuted: output axis i is input axis perm[i] (numpy's transpose)."""

    shape: Shape
    perm: tuple[int, ...]

    def __post_init__(self) -> None:
        positive_dims("transpose", self.shape)
        if sorted(self.perm) != list(range(len(self.shape))):
            raise InputError(f"transpose: perm {list(self.perm)} is no permutation of {len(self.shape)} axes")

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (self.shape,)

    @property
    def output_shape(self) -> Shape:
        return tuple(self.shape[p] for p in self.perm)

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.reshape(self.shape).transpose(self.perm))

    def _axes(self) -> list[tuple[int, int]]:
        """The output's axes merged where they are neighbours in the input too, size-1 axes dropped: each
        as (size, the input's element stride along it)."""
        strides = [math.prod(self.shape[a + 1 :]) for a in range(len(self.shape))]
        axes: list[tuple[int, int]] = []
        for p in self.perm:
            size, stride = self.shape[p], strides[p]
            if size == 1:
                continue
            if axes and axes[-1][1] == stride * size:  # the previous axis steps over this whole one
                axes[-1] = (axes[-1][0] * size, stride)
                continue
            axes.append((size, stride))
        return axes or [(1, 1)]

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        b, axes = NestBuilder(), self._axes()
        inner, step = axes[-1]
        with ExitStack() as stack:
            src, dst = Affine(), Affine()
            for i, (size, stride) in enumerate(axes[:-1]):
                var = stack.enter_context(b.loop(size, f"a{i}"))
                src, dst = src + var * stride, dst + var * math.prod(s for s, _ in axes[i + 1 :])

            def copy(at: Affine, width: int, count: int) -> None:
                b.store("out", dst + at, Load("x", src + at, width, count), width, count)

            if step == 1:
                vector_map(b, inner, lanes, copy)
            else:
                with b.loop(inner, "e") as e:
                    b.store("out", dst + e, Load("x", src + e * step))
        size = math.prod(self.shape)
        return b.kernel(name, params([("x", size)], size))


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    x = node.inputs[0]
    shape = graph.shape(x)
    perm = node.ints("perm", tuple(reversed(range(len(shape)))))  # ONNX: no perm reverses the axes
    with refusing(graph, node):
        kernel = Permute(shape=shape, perm=tuple(a + len(shape) if a < 0 else a for a in perm))
    return Mapped(kernel=kernel, inputs=(x,))
