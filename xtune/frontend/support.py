"""What xtune runs: an ONNX op type in, how a whole-network build runs it out — a tuned kernel (a task), a
generated operator of one kind, or a view that costs nothing — or None. The one table that task
extraction, the build and the refusals ask (`runs`); an operator family added to xtune is a row here.

Whether a node of a known op type runs also depends on its attributes and shapes: the anchors
(xtune/frontend/anchors.py) and the build's operators (xtune/firmware/program.py) refuse what they cannot
take, each as an `UnsupportedNode`, and the refusal gathers them with the nodes this table refuses.
"""

from __future__ import annotations

from typing import Literal

from xtune.frontend.refusal import UnsupportedNode, hint
from xtune.graph import Graph, Node

OtherKind = Literal["pooling", "elementwise", "reshape", "softmax", "concat"]
Runs = Literal["task", OtherKind]

_TABLE: dict[Runs, str] = {
    "task": "Conv Gemm MatMul",
    "pooling": "MaxPool AveragePool GlobalAveragePool",
    "elementwise": "Add Relu Clip",
    "reshape": "Reshape Flatten Squeeze Unsqueeze Identity",
    "softmax": "Softmax",
    "concat": "Concat",
}
_RUNS: dict[str, Runs] = {op: kind for kind, ops in _TABLE.items() for op in ops.split()}
# The reshapes are views: no call, the output is the input's bytes (xtune/firmware/memory.py, alias_of).
VIEWS = frozenset(op for op, kind in _RUNS.items() if kind == "reshape")


def runs(op: str) -> Runs | None:
    """How xtune runs op type `op` (an ONNX op_type; another domain's as "domain.op"), None if it does not."""
    return _RUNS.get(op)


def ops_run() -> tuple[str, ...]:
    """Every op type xtune runs, in the table's order."""
    return tuple(_RUNS)


def not_run(graph: Graph, node: Node) -> UnsupportedNode:
    """The refusal of a node whose op type xtune does not run, with what would help."""
    domain, _, op = node.op.rpartition(".")
    return UnsupportedNode(
        graph.name, node.name, node.op, "not an operator xtune runs", hint(op, domain, graph.opset)
    )
