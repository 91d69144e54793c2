"""The reshape family of a network's generated operators: ONNX's Flatten, Reshape, Squeeze, Unsqueeze
and Identity are views (normalization removes inference Dropout): no code, the output is the input's
bytes, which the memory planner shares (xtune/firmware/memory.py, `alias_of`). A view that changes the
shape reinterprets ONNX's byte order, so it runs in NCHW; one that keeps the shape takes its input's
layout."""

from __future__ import annotations

from xtune.graph import Graph, Node
from xtune.ops.layout import Layout
from xtune.ops.opkit import Consts, Mapped, NodeFamily

VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity")


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    return Mapped(kernel=None, inputs=(node.inputs[0],), alias=True)


FAMILY = NodeFamily(
    kind="reshape",
    onnx_ops=VIEWS,
    layouts=frozenset((Layout.NCHW,)),
    from_node=from_node,
)
