"""The qmatmul family's ONNX side: a QLinearMatMul (ONNX's, or the one xtune/frontend/quantized.py makes of
a QDQ MatMul or Gemm, with its int32 bias as a ninth input and its output clamp as `out_lo`/`out_hi`) or a
MatMulInteger node with constant int8 weights in, its kernel call (`Anchor`) out: the workload's sizes,
the weights, the int32 bias and the requantization's constants ONNX Runtime computes (the float32 scale
a_scale * b_scale / y_scale, per tensor or per output column; the zero points and clamp as qparams)."""

from __future__ import annotations

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.anchor import Anchor, refuse
from xtune.ops.qlinear import WORDS, int32_bias, requantization, symmetric, zero_point
from xtune.ops.qmatmul.reference import RANGES


def qmatmul_anchor(graph: Graph, node: Node) -> Anchor:
    """The kernel call of `node` (QLinearMatMul or MatMulInteger); UnsupportedNode for what the int8
    kernels do not take (weights that are not constant int8 of zero point 0, scales not per tensor or per
    output column, an activation of rank other than 2 or an output type other than the input's)."""
    integer = node.op == "MatMulInteger"
    x, w = node.inputs[0], node.inputs[1] if integer else node.inputs[3]
    word = WORDS.get(graph.dtype(x))
    weights = graph.constant(w)
    if word is None:
        raise refuse(graph, node, f"input '{x}' is {graph.dtype(x)}, not int8 or uint8")
    if weights is None or weights.dtype != np.int8 or weights.ndim != 2:
        raise refuse(graph, node, f"weights '{w}' are not a constant int8 matrix")
    shape = graph.shape(x)
    if len(shape) != 2:
        raise refuse(graph, node, f"input '{x}' has rank {len(shape)}; xtune's int8 matmul takes rank 2")
    (m, k), n = shape, weights.shape[1]
    if weights.shape[0] != k:
        raise refuse(graph, node, f"weights '{w}' have {weights.shape[0]} rows, the input {k} columns")
    zero_names = node.inputs[2:4] if integer else (node.inputs[2], node.inputs[5], node.inputs[7])
    za, *others = (zero_point(graph, node, t) for t in (*zero_names, "", "")[:3])
    symmetric(graph, node, others[0], n)
    quant: dict[str, np.ndarray] = {"A": np.zeros(0, np.dtype(graph.dtype(x)))}  # its element type
    if integer:
        lo, hi = RANGES[word]
        quant["qparams"] = np.array([int(za.reshape(-1)[0]), 0, lo, hi], np.int32)
    else:
        quant |= requantization(graph, node, word, n, za, others[1])
    return Anchor(
        node=node,
        op="qmatmul",
        sizes=(("m", m), ("n", n), ("k", k)),
        out_shape=(m, n),
        channel_axis=1,
        weight_axis=1,
        weights=weights,
        bias=int32_bias(graph, node, n),
        quant=quant,
    )
