"""What xtune runs: an ONNX op type in, how a whole-network build runs it out — a tuned kernel (a task), a
generated operator of one kind, or a view that costs nothing — or None. The table is the operator
registry's (xtune/ops/registry.py): a tunable family's op types are tasks, a generated family's are of
its `kind`, the reshape family's are views. Task extraction, the build and the refusals ask `runs`.

Whether a node of a known op type runs also depends on its attributes and shapes: the families' anchors
and ONNX mappings refuse what they cannot take, each as an `UnsupportedNode`, and the refusal gathers
them with the nodes this table refuses.
"""

from __future__ import annotations

from xtune.errors import UnsupportedNode
from xtune.frontend.refusal import hint
from xtune.graph import Graph, Node
from xtune.ops import reshape
from xtune.ops.registry import ANCHOR_OPS, NODE_FAMILIES, node_family

# The reshapes are views: no call, the output is the input's bytes (xtune/firmware/memory.py, alias_of).
VIEWS = frozenset(reshape.FAMILY.onnx_ops)


def runs(op: str) -> str | None:
    """How xtune runs op type `op` (an ONNX op_type; another domain's as "domain.op"): "task", a generated
    family's kind, or None if it does not."""
    if op in ANCHOR_OPS:
        return "task"
    fam = node_family(op)
    return fam.kind if fam is not None else None


def ops_run() -> tuple[str, ...]:
    """Every op type xtune runs: the tunable families', then the generated families' in registry order."""
    return (*sorted(ANCHOR_OPS), *(op for f in NODE_FAMILIES for op in f.onnx_ops))


def not_run(graph: Graph, node: Node) -> UnsupportedNode:
    """The refusal of a node whose op type xtune does not run, with what would help."""
    domain, _, op = node.op.rpartition(".")
    return UnsupportedNode(
        graph.name, node.name, node.op, "not an operator xtune runs", hint(op, domain, graph.opset)
    )
