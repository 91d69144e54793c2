"""The reduction family of a network's generated operators: ONNX's ReduceMean and ReduceMax over the two
spatial axes of a 4-D tensor (global pooling as exporters write it: the axes an attribute, or from
opset 18 a constant input; keepdims either way, since (n, c) and (n, c, 1, 1) are the same bytes) in,
the pooling family's kernels (xtune/ops/pool2d.py) out: GlobalAveragePool, and a max pool whose window
is the whole image. Any other axes are refused."""

from __future__ import annotations

from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout
from xtune.ops.opkit import Consts, Mapped, NodeFamily, constant_ints
from xtune.ops.pool2d import GlobalAveragePool, Pool2d, PoolKind


def _axes(graph: Graph, node: Node, rank: int) -> tuple[int, ...]:
    """The reduced axes, non-negative and sorted: opset 18's input, else the attribute; none given is every
    axis (ONNX operator spec, ReduceMean: noop_with_empty_axes=0)."""
    given = constant_ints(graph, node, 1, "axes")
    axes = given if given is not None else node.ints("axes", ())
    if not axes and int(node.attr("noop_with_empty_axes", 0)):  # type: ignore[arg-type]
        raise refuse(graph, node, "noop_with_empty_axes=1 with no axes (an identity) is not supported")
    return tuple(sorted(a + rank if a < 0 else a for a in axes)) if axes else tuple(range(rank))


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    x = node.inputs[0]
    shape = graph.shape(x)
    axes = _axes(graph, node, len(shape))
    if len(shape) != 4 or axes != (2, 3):
        raise refuse(
            graph,
            node,
            f"a reduction over axes {list(axes)} of a {len(shape)}-D tensor (xtune "
            "reduces the two spatial axes of a 4-D one)",
        )
    n, c, h, w = shape
    if node.op == "ReduceMean":
        return Mapped(kernel=GlobalAveragePool(n=n, c=c, h=h, w=w), inputs=(x,))
    return Mapped(kernel=Pool2d(kind=PoolKind.MAX, n=n, c=c, h=h, w=w, kernel=(h, w)), inputs=(x,))


FAMILY = NodeFamily(
    kind="pooling",
    onnx_ops=("ReduceMean", "ReduceMax"),
    layouts=frozenset(Layout),
    from_node=from_node,
)
