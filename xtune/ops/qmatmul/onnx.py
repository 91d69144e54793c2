"""The qmatmul family's ONNX side: a QLinearMatMul (ONNX's, or the one xtune/frontend/quantized.py makes of
a QDQ MatMul or Gemm, with its int32 bias as a ninth input and its output clamp as `out_lo`/`out_hi`) or a
MatMulInteger node with constant int8 weights in, its kernel call (`Anchor`) out: the workload's sizes,
the weights, the int32 bias and the requantization's constants ONNX Runtime computes (the float32 scale
a_scale * b_scale / y_scale, per tensor or per output column; the zero points and clamp as qparams)."""

from __future__ import annotations

import math

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.anchor import Anchor, refuse
from xtune.ops.qmatmul.reference import RANGES

_WORDS = {"int8": "s8", "uint8": "u8"}


def qmatmul_anchor(graph: Graph, node: Node) -> Anchor:
    """The kernel call of `node` (QLinearMatMul or MatMulInteger); UnsupportedNode for what the int8
    kernels do not take (weights that are not constant int8 of zero point 0, scales not per tensor or per
    output column, an activation of rank other than 2 or an output type other than the input's)."""
    integer = node.op == "MatMulInteger"
    x, w = node.inputs[0], node.inputs[1] if integer else node.inputs[3]
    word = _WORDS.get(graph.dtype(x))
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
    za, *others = (_integer(graph, node, t) for t in (*zero_names, "", "")[:3])
    zw = others[0]
    if zw.size not in (1, n) or np.any(zw != 0):
        raise refuse(graph, node, "weights with a zero point other than 0 (asymmetric) are not supported")
    bias = graph.constant(node.inputs[8]) if len(node.inputs) > 8 and node.inputs[8] else None
    if bias is not None and (bias.dtype != np.int32 or bias.size != n):
        raise refuse(graph, node, f"bias '{node.inputs[8]}' is not {n} int32 values")
    int32 = np.zeros(n, np.int32) if bias is None else bias.reshape(-1)
    quant: dict[str, np.ndarray] = {"A": np.zeros(0, np.dtype(graph.dtype(x)))}  # its element type
    if integer:
        lo, hi = RANGES[word]
        quant["qparams"] = np.array([int(za.reshape(-1)[0]), 0, lo, hi], np.int32)
    else:
        quant |= _requantization(graph, node, word, n, za, others[1])
    return Anchor(
        node=node,
        op="qmatmul",
        sizes=(("m", m), ("n", n), ("k", k)),
        out_shape=(m, n),
        channel_axis=1,
        weight_axis=1,
        weights=weights,
        bias=int32,
        quant=quant,
    )


def _requantization(
    graph: Graph, node: Node, word: str, n: int, za: np.ndarray, zy: np.ndarray
) -> dict[str, np.ndarray]:
    """A QLinearMatMul's float32 scale and qparams, as ONNX Runtime computes them."""
    if graph.dtype(node.outputs[0]) != graph.dtype(node.inputs[0]):
        raise refuse(graph, node, "the output's type differs from the input's")
    sa, sb, sy = (_float(graph, node, t) for t in (node.inputs[1], node.inputs[4], node.inputs[6]))
    if sa.size != 1 or sy.size != 1 or sb.size not in (1, n) or za.size != 1 or zy.size != 1:
        raise refuse(graph, node, "scales and zero points must be per tensor (the weights': or per column)")
    # ONNX Runtime's QLinearMatMul: output_scale[j] = a_scale * b_scale[j] / y_scale in float32.
    scale = (np.float32(sa.reshape(-1)[0]) * sb.reshape(-1)) / np.float32(sy.reshape(-1)[0])
    lo, hi = RANGES[word]
    lo = max(lo, node.int_attr("out_lo", lo))
    hi = min(hi, node.int_attr("out_hi", hi))
    qparams = np.array([za.reshape(-1)[0], zy.reshape(-1)[0], lo, hi], np.int32)
    return {"scale": scale.astype(np.float32), "qparams": qparams}


def _integer(graph: Graph, node: Node, tensor: str) -> np.ndarray:
    """A zero point: a constant 8-bit integer (absent: 0)."""
    if not tensor:
        return np.zeros(1, np.int32)
    value = graph.constant(tensor)
    if value is None or value.dtype not in (np.int8, np.uint8):
        raise refuse(graph, node, f"zero point '{tensor}' is not a constant 8-bit integer")
    return value.astype(np.int32)


def _float(graph: Graph, node: Node, tensor: str) -> np.ndarray:
    value = graph.constant(tensor)
    if (
        value is None
        or value.dtype != np.float32
        or not np.all(np.isfinite(value))
        or math.prod(value.shape) == 0
    ):
        raise refuse(graph, node, f"scale '{tensor}' is not a constant finite float32")
    return value.astype(np.float32)
