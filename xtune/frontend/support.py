"""What xtune runs: an ONNX op type in, how a whole-network build runs it out — a tuned kernel (a task), a
generated operator of one kind, or a view that costs nothing — or None. The one question that task
extraction, the build and the refusals ask (`runs`), answered from the operator families
(xtune/ops/registry.py): an operator family added to xtune is a row there.

Whether a node of a known op type runs also depends on its attributes and shapes: the families' anchors
(xtune/ops/*/ `anchor`) and the build's operators (xtune/firmware/program.py) refuse what they cannot
take, each as an `UnsupportedNode`, and the refusal gathers them with the nodes this table refuses.
"""

from __future__ import annotations

from xtune.errors import UnsupportedNode
from xtune.frontend.refusal import hint
from xtune.graph import Graph, Node
from xtune.ops.registry import ANCHOR_OPS, node_family


def runs(op: str) -> str | None:
    """How xtune runs op type `op` (an ONNX op_type; another domain's as "domain.op"): "task", the kind of
    the generated operator family that builds it (NodeFamily.kind), or None if it does not."""
    if op in ANCHOR_OPS:
        return "task"
    built = node_family(op)
    return built.kind if built is not None else None


def not_run(graph: Graph, node: Node) -> UnsupportedNode:
    """The refusal of a node whose op type xtune does not run, with what would help."""
    domain, _, op = node.op.rpartition(".")
    return UnsupportedNode(
        graph.name, node.name, node.op, "not an operator xtune runs", hint(op, domain, graph.opset)
    )
