"""What xtune runs: an ONNX op type in, how a whole-network build runs it out — a tuned kernel (a task), a
generated operator of one kind, or a view that costs nothing — or None. Task extraction, the build and
the refusals ask `runs`, which asks the operator families (xtune/ops/registry.py): a family added to
xtune declares its ONNX op types itself.

Whether a node of a known op type runs also depends on its attributes and shapes: the families' ONNX
mappings (`anchor`, `from_node`) refuse what they cannot take, each as an `UnsupportedNode`, and the
refusal gathers them with the nodes no family runs.
"""

from __future__ import annotations

from xtune.errors import UnsupportedNode
from xtune.frontend.refusal import hint
from xtune.graph import Graph, Node
from xtune.ops.pool2d import pools_8bit
from xtune.ops.registry import ANCHOR_OPS, node_family

OtherKind = str  # the generated operator family that runs a node (NodeFamily.kind)


def runs(op: str, generated: bool = False) -> str | None:
    """How xtune runs op type `op` (an ONNX op_type; another domain's as "domain.op"): "task" for a
    tunable family's op (a kernel call), else (or for a node of it that no tunable family claims,
    `generated`: a MatMul whose B has batch axes) the kind of the generated operator family that builds
    it; None if no family does."""
    if op in ANCHOR_OPS and not generated:
        return "task"
    fam = node_family(op)
    return fam.kind if fam is not None else None


def not_run(graph: Graph, node: Node) -> UnsupportedNode:
    """The refusal of a node whose op type xtune does not run, with what would help."""
    domain, _, op = node.op.rpartition(".")
    return UnsupportedNode(
        graph.name, node.name, node.op, "not an operator xtune runs", hint(op, domain, graph.opset)
    )


# Generated operators that read and write integer tensors: the quantize family converts float32 to and
# from them, the quantized element-wise family (xtune/ops/qpointwise.py) computes between them, views
# are their bytes, a model's own NHWC <-> NCHW Transpose is a renaming in an NHWC network
# (xtune/firmware/relayout.py, which refuses one it would have to run); every other generated kernel is
# float32.
_INTEGER_KINDS = frozenset(("quantize", "qelementwise", "reshape", "transpose"))


def integer_tensor(graph: Graph, node: Node, kind: str) -> UnsupportedNode | None:
    """The refusal of a generated operator that would read or write an integer tensor as float32 (a
    quantized model's op with no int8 kernel), naming the first such tensor; None if there is none."""
    if kind in _INTEGER_KINDS or pools_8bit(graph, node):  # the pooling family's 8-bit mean and max
        return None
    for tensor in (*node.inputs, *node.outputs):
        if tensor and tensor not in graph.constants and graph.dtype(tensor) != "float32":
            dtype = graph.dtype(tensor)
            why = f"tensor '{tensor}' is {dtype}; xtune has no {dtype} kernel of {node.op}"
            return UnsupportedNode(graph.name, node.name, node.op, why, "")
    return None
