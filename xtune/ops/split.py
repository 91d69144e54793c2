"""The split family of a network's generated operators: ONNX's Split of an activation along any axis into
the sizes of its `split` attribute (before opset 13) or constant input (from opset 13), else into
`num_outputs` (opset 18) or as many outputs as it has, equal chunks of ceil(dim / count) with a smaller
last one, in; one `Slice` kernel (xtune/ops/slice.py) per output out, each its own call, in NCHW or NHWC."""

from __future__ import annotations

from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout
from xtune.ops.opkit import Consts, Mapped, NodeFamily, constant_ints
from xtune.ops.slice import along


def _sizes(graph: Graph, node: Node, dim: int) -> tuple[int, ...]:
    """Each output's extent along the axis (ONNX operator spec, Split)."""
    if (given := constant_ints(graph, node, 1, "split sizes")) is not None:
        return given
    if "split" in node.attrs:
        return node.ints("split", ())
    count = int(node.attr("num_outputs", len(node.outputs)))  # type: ignore[arg-type]
    chunk = -(-dim // count)
    return tuple(min(chunk, dim - k * chunk) for k in range(count))


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    x = node.inputs[0]
    if graph.constant(x) is not None:
        raise refuse(graph, node, f"input '{x}' is a constant; xtune splits activations")
    shape = graph.shape(x)
    axis = int(node.attr("axis", 0))  # type: ignore[arg-type]
    axis = axis + len(shape) if axis < 0 else axis
    if not 0 <= axis < len(shape):
        raise refuse(graph, node, f"axis {axis} of a {len(shape)}-D input")
    sizes = _sizes(graph, node, shape[axis])
    if len(sizes) != len(node.outputs) or sum(sizes) != shape[axis] or min(sizes) < 1:
        raise refuse(
            graph, node, f"sizes {list(sizes)} do not split {shape[axis]} into {len(node.outputs)} outputs"
        )
    if not all(node.outputs):
        raise refuse(graph, node, "an output is omitted")
    starts = [sum(sizes[:k]) for k in range(len(sizes))]
    calls = [
        Mapped(kernel=along(shape, axis, start, size), inputs=(x,), output=out)
        for start, size, out in zip(starts, sizes, node.outputs, strict=True)
    ]
    return Mapped(kernel=calls[0].kernel, inputs=(x,), output=calls[0].output, more=tuple(calls[1:]))


FAMILY = NodeFamily(kind="split", onnx_ops=("Split",), layouts=frozenset(Layout), from_node=from_node)
