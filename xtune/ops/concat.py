"""The concat family of a network's generated operators: ONNX's Concat of activations along any axis,
as an outer x channels x inner copy. It runs in NHWC when it joins the channels of 4-D tensors (every
pixel is one outer row there), else in NCHW."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout
from xtune.ops.opkit import Consts, GeneratedOp, Mapped, NodeFamily, Shape, params, positive, vector_map
from xtune.schedule.loopnest import (
    Affine,
    Kernel,
    Load,
    NestBuilder,
)


@dataclass(frozen=True, kw_only=True)
class Concat(GeneratedOp):
    """Concat along channels of NCHW inputs (n, c_i, h, w)."""

    n: int
    channels: tuple[int, ...]
    h: int
    w: int

    def __post_init__(self) -> None:
        positive("concat", n=self.n, h=self.h, w=self.w, inputs=len(self.channels))
        positive("concat", **{f"channels{k}": c for k, c in enumerate(self.channels)})

    def in_layout(self, layout: Layout, out_shape: Shape) -> Concat:
        """The same computation in `layout`: channels innermost, every pixel of NHWC is one outer row."""
        if layout is Layout.NCHW:
            return self
        n, _, h, w = out_shape  # the output in ONNX's order
        return Concat(n=n * h * w, channels=self.channels, h=1, w=1)

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return tuple((self.n, c, self.h, self.w) for c in self.channels)

    @property
    def output_shape(self) -> Shape:
        return (self.n, sum(self.channels), self.h, self.w)

    def reference(self, *xs: np.ndarray) -> np.ndarray:
        return np.concatenate(xs, axis=1)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        b, plane, total = NestBuilder(), self.h * self.w, sum(self.channels)
        with b.loop(self.n, "n") as img:
            first = 0
            for k, c in enumerate(self.channels):
                dst = img * (total * plane) + first * plane
                self._copy(b, f"x{k}", img * (c * plane), dst, c * plane, lanes)
                first += c
        inputs = [(f"x{k}", self.n * c * plane) for k, c in enumerate(self.channels)]
        return b.kernel(name, params(inputs, self.n * total * plane))

    @staticmethod
    def _copy(b: NestBuilder, src: str, at: Affine, to: Affine, size: int, lanes: int) -> None:
        vector_map(b, size, lanes, lambda i, w, n: b.store("out", to + i, Load(src, at + i, w, n), w, n))


def _concat(graph: Graph, node: Node) -> Concat:
    shapes = [graph.shape(t) for t in node.inputs]
    rank = len(shapes[0])
    axis = int(node.attr("axis", 1))  # type: ignore[arg-type]
    axis = axis + rank if axis < 0 else axis
    for t in node.inputs:
        if graph.constant(t) is not None:
            raise refuse(graph, node, f"input '{t}' is a constant; xtune concatenates activations")
    # Along `axis`, row-major: outer = the axes before it, inner = the axes after it (one plane).
    return Concat(
        n=math.prod(shapes[0][:axis]),
        channels=tuple(s[axis] for s in shapes),
        h=math.prod(shapes[0][axis + 1 :]),
        w=1,
    )


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    """A Concat that joins the channels of 4-D tensors may run in NHWC; any other axis runs in NCHW."""
    shape = graph.shape(node.outputs[0])
    channels = len(shape) == 4 and int(node.attr("axis", 1)) % 4 == 1  # type: ignore[arg-type]
    layouts = None if channels else frozenset((Layout.NCHW,))
    return Mapped(kernel=_concat(graph, node), inputs=tuple(node.inputs), layouts=layouts)


FAMILY = NodeFamily(kind="concat", onnx_ops=("Concat",), layouts=frozenset(Layout), from_node=from_node)
