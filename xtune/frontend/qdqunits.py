"""Which QDQ Conv node units of an imported graph ONNX Runtime's x86-64 build leaves in float: a `Graph` in
its QDQ form in, the names of the Conv nodes whose DequantizeLinear -> Conv -> QuantizeLinear ONNX Runtime
runs as DequantizeLinear, a float32 Conv and QuantizeLinear rather than one QLinearConv (`x86_float_convs`),
and the rule's first half, which int8 activation tensors that build turns into uint8 ones
(`u8_on_x86`), out.

The rule, from ONNX Runtime's graph optimizer (onnxruntime/core/optimizer/graph_transformer_utils.cc and
qdq_transformer/), in the order it runs:

1. Level 1, EnsureUniqueDQForNodeUnit: a DequantizeLinear read by several nodes (or by a node twice) is
   duplicated, one copy per reader, so that every node unit owns its DequantizeLinear; a QuantizeLinear
   whose DequantizeLinear had two readers now has two DequantizeLinear readers.
2. Level 2, QDQS8ToU8Transformer, added only where QDQIsInt8Allowed() is false (x86-64; the ARM builds
   allow int8): every int8 QuantizeLinear -> DequantizeLinear pair where the QuantizeLinear has exactly one
   output edge (optimizer_utils::CheckOutputEdges: one reader, not a graph output), to a
   DequantizeLinear, both with a constant per-tensor int8 zero point, the same, becomes uint8 (the zero
   points plus 128: the same real values).
3. Level 2, QDQSelectorActionTransformer: its ConvNodeGroupSelector takes a Conv unit only if its input
   and output types are the same and, where they are int8, only if int8 is allowed
   (qdq_selectors.cc). An int8 Conv unit either of whose activations stayed int8 in step 2 is therefore
   left as DequantizeLinear, a float Conv (MLAS's im2col and SGEMM: xtune/ops/mlasconv.py), QuantizeLinear.
   Its BinaryNodeGroupSelector (Add, Mul) only wants the three types equal, int8 included: an int8 Add
   whose activations all became uint8 is a uint8 QLinearAdd, one whose activations all stayed int8 an
   int8 QLinearAdd, a mixed one three float nodes (tests/test_ort_float_units.py measures all three).

Measured on ONNX Runtime 1.32 (x86-64): a ResNet-18 quantized with int8 activations after
quant_pre_process runs the first Conv of each residual block (whose input DequantizeLinear the residual
Add shares) and each downsampling Conv (sharing the block's input with that first Conv) in float, eleven
of twenty; uint8 activations need no conversion and every Conv unit fuses. docs/int8.md, "Exactness".
"""

from __future__ import annotations

import numpy as np

from xtune.frontend.qpattern import quantized_after
from xtune.graph import Graph, Node


def _int8_zero(graph: Graph, node: Node) -> int | None:
    """A QuantizeLinear's or DequantizeLinear's constant per-tensor int8 zero point, given explicitly."""
    if len(node.inputs) < 3 or not node.inputs[2]:
        return None
    zero = graph.constant(node.inputs[2])
    if zero is None or zero.size != 1 or zero.dtype != np.int8:
        return None
    return int(zero.reshape(-1)[0])


def u8_on_x86(graph: Graph) -> frozenset[str]:
    """The int8 tensors written by a QuantizeLinear that ONNX Runtime's x86-64 build turns into uint8
    (module docstring, steps 1 and 2): the QuantizeLinear's output is no graph output and is read once,
    by a DequantizeLinear of the same zero point that EnsureUniqueDQForNodeUnit leaves alone: one read
    and no graph output, or no read at all (a graph output only)."""
    readers = graph.consumers()
    edges = {  # one per input slot read, as ONNX Runtime counts a node's edges
        t: [graph.nodes[i] for i in at for s in graph.nodes[i].inputs if s == t] for t, at in readers.items()
    }
    converted = set()
    for q in graph.nodes:
        if q.op != "QuantizeLinear" or q.outputs[0] in graph.outputs:
            continue
        reads = edges.get(q.outputs[0], [])
        if len(reads) != 1 or reads[0].op != "DequantizeLinear":
            continue
        dq = reads[0]
        zero = _int8_zero(graph, q)
        if zero is None or zero != _int8_zero(graph, dq):
            continue
        uses = len(edges.get(dq.outputs[0], []))
        if uses == 0 or (uses == 1 and dq.outputs[0] not in graph.outputs):
            converted.add(q.outputs[0])
    return frozenset(converted)


def x86_float_convs(graph: Graph) -> frozenset[str]:
    """The Conv nodes of `graph`'s QDQ units (DequantizeLinear of an int8 activation and of constant
    weights -> Conv [-> Relu/Clip] -> QuantizeLinear to int8) that ONNX Runtime's x86-64 build runs in
    float (module docstring, step 3): those whose input or output stays int8."""
    writers, readers = graph.producers(), graph.consumers()
    u8 = u8_on_x86(graph)
    kept = set()
    for node in graph.nodes:
        if node.op != "Conv" or node.inputs[0] not in writers:
            continue
        dq = graph.nodes[writers[node.inputs[0]]]
        if dq.op != "DequantizeLinear" or graph.dtype(dq.inputs[0]) != "int8":
            continue
        found = quantized_after(graph, readers, node)
        if found is None or graph.dtype(found[1].outputs[0]) != "int8":
            continue
        q = found[1]
        if dq.inputs[0] not in u8 or q.outputs[0] not in u8:
            kept.add(node.name)
    return frozenset(kept)
