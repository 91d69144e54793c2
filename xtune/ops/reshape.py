"""The reshape family of a network's generated operators: ONNX's Flatten, Reshape, Squeeze, Unsqueeze
and Identity are views (normalization removes inference Dropout): no code, the output is the input's
bytes, which the memory planner shares (xtune/firmware/memory.py, `alias_of`). A view that changes the
shape reinterprets ONNX's byte order, so it runs in NCHW; one that keeps the shape takes its input's
layout."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.layout import Layout
from xtune.ops.opkit import Consts, Mapped, NodeFamily, Shape

VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


@dataclass(frozen=True, kw_only=True)
class Reshape:
    """Flatten / Reshape of a contiguous tensor: the same bytes, so no kernel (`alias`)."""

    input_shape: Shape
    shape: Shape
    alias = True

    def __post_init__(self) -> None:
        if math.prod(self.input_shape) != math.prod(self.shape):
            raise InputError(f"reshape: {self.input_shape} and {self.shape} differ in element count")

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (self.input_shape,)

    @property
    def output_shape(self) -> Shape:
        return self.shape

    def reference(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.shape)


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    return Mapped(kernel=None, inputs=(node.inputs[0],), alias=True)


FAMILY = NodeFamily(
    kind="reshape",
    onnx_ops=VIEWS,
    layouts=frozenset((Layout.NCHW,)),
    from_node=from_node,
)
