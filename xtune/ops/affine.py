"""Per-channel affine rules: a BatchNormalization node in, its inference form (a scale and shift per
channel, `batchnorm`) out; and a node after a kernel call (a graph IR `Node` after an `Anchor`) in,
whether it folds into that call's weights and bias and what they become out (`is_affine_step`,
`fold_affine`). The scales are BatchNormalization and a Mul or Div (the kernel's output first) by a
constant that varies along the output channels only: (conv(x, w) + b) * s = conv(x, w * s) + b * s,
one output channel at a time; the shift is an Add of such a constant, which joins the bias. The arith
family (xtune/ops/arith.py) runs a BatchNormalization with no kernel call before it, with the scale and
shift ONNX Runtime computes (`batchnorm_float32`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.anchor import Anchor

_SCALES = ("BatchNormalization", "Mul", "Div")
_SHIFT = "Add"


@dataclass(frozen=True)
class BatchNorm:
    """x * scale + shift per channel, scale = gamma / sqrt(var + eps), shift = beta - mean * scale (ONNX
    operator spec, BatchNormalization, inference mode), in float64."""

    scale: np.ndarray
    beta: np.ndarray
    mean: np.ndarray

    @property
    def shift(self) -> np.ndarray:
        return self.beta - self.mean * self.scale


def _parameters(graph: Graph, node: Node) -> list[np.ndarray] | None:
    """A BatchNormalization's gamma, beta, mean and variance, flat; None unless all are constants and
    it has no training outputs."""
    params = [graph.constant(t) for t in node.inputs[1:5]]
    if len(params) != 4 or any(p is None for p in params) or any(node.outputs[1:]):
        return None
    return [np.asarray(p).reshape(-1) for p in params]


def batchnorm(graph: Graph, node: Node) -> BatchNorm | None:
    """`node`'s inference form; None if its scale, bias, mean and variance are not all constants or it
    has training outputs. A zero (with epsilon 0), negative or NaN variance gives a non-finite scale,
    as numpy computes it (the caller chooses whether numpy warns)."""
    params = _parameters(graph, node)
    if params is None:
        return None
    gamma, beta, mean, var = (p.astype(np.float64) for p in params)
    eps = float(node.attr("epsilon", 1e-5))  # type: ignore[arg-type]
    return BatchNorm(scale=gamma / np.sqrt(var + eps), beta=beta, mean=mean)


def batchnorm_float32(graph: Graph, node: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """`node`'s scale and shift as ONNX Runtime's CPU kernel computes them before its per-element
    x * scale + shift (onnxruntime/core/providers/cpu/nn/batch_norm.h, inference): in float32,
    inv_std = 1 / sqrt(var + eps), scale = inv_std * gamma, shift = beta - mean * scale, each operation
    rounded (measured: not contracted into FMAs). A BatchNormalization between 8-bit tensors (a QDQ
    model's, which ONNX Runtime runs in float) is then bit for bit ONNX Runtime's. None as `batchnorm`."""
    params = _parameters(graph, node)
    if params is None:
        return None
    gamma, beta, mean, var = (p.astype(np.float32) for p in params)
    eps = np.float32(node.attr("epsilon", 1e-5))  # type: ignore[arg-type]
    scale = (np.float32(1) / np.sqrt(var + eps)) * gamma
    return scale, beta - mean * scale


def _operand(node: Node, out: str) -> str:
    """The input of a two-input node that is not the kernel's output `out` ("" if none)."""
    return next((t for t in node.inputs[:2] if t != out), "")


def is_affine_step(graph: Graph, node: Node, out: str, has_weights: bool) -> bool:
    """Whether `node`, reading the kernel's output `out`, is a scale (which needs constant weights to
    fold into) or a shift by a constant: then it folds (`fold_affine`) or nothing after the kernel does."""
    if node.op == _SHIFT:
        return graph.constant(_operand(node, out)) is not None
    return node.op in _SCALES and has_weights


def may_fold(graph: Graph, node: Node, out: str) -> bool:
    """Whether `node`, reading `out`, is a scale or shift whose other operands are all constants: one
    that would fold if the kernel before it could run (a refusal names that kernel, not it as well)."""
    constant = all(t == out or graph.constant(t) is not None for t in node.inputs if t)
    return node.op in (*_SCALES, _SHIFT) and constant


def fold_affine(
    graph: Graph, node: Node, out: str, a: Anchor, weights: np.ndarray | None, bias: np.ndarray | None
) -> tuple[np.ndarray | None, np.ndarray | None] | None:
    """The kernel's weights and bias with the affine step `node` (`is_affine_step`) folded in; None where
    it does not fold (a constant that is not per channel, BatchNormalization over another axis)."""
    other = _operand(node, out)
    if node.op == _SHIFT:
        vector = a.channel_vector(graph, graph.constants[other])
        return None if vector is None else (weights, vector if bias is None else bias + vector)
    assert weights is not None  # is_affine_step: a scale folds into constant weights only
    if node.op == "BatchNormalization":
        return _fold_batchnorm(graph, node, a, weights, bias) if a.channel_axis == 1 else None
    const = graph.constant(other)
    if const is None or (node.op == "Div" and node.inputs[1] != other):
        return None
    vector = a.channel_vector(graph, const)
    if vector is None:
        return None
    scale = 1 / vector.astype(np.float64) if node.op == "Div" else vector.astype(np.float64)
    folded = a.scale_channels(weights.astype(np.float64), scale).astype(np.float32)
    return folded, None if bias is None else (bias * scale).astype(np.float32)


def _fold_batchnorm(
    graph: Graph, bn: Node, a: Anchor, weights: np.ndarray, bias: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray] | None:
    """w' = w * g/sqrt(v+eps) per output channel, b' = (b - mean) * g/sqrt(v+eps) + beta."""
    # A non-finite scale is folded as it is: ONNX Runtime folds BatchNormalization into a Conv the same
    # way (its ConvBNFusion), so the NaN and inf outputs land where its do, and numpy's "invalid value"
    # warnings would only repeat that.
    with np.errstate(all="ignore"):
        form = batchnorm(graph, bn)
        if form is None or form.scale.size != a.channels:
            return None  # training mode, or statistics that are not constants
        folded = a.scale_channels(weights, form.scale).astype(np.float32)
        start = np.zeros(a.channels) if bias is None else bias.astype(np.float64)
        return folded, ((start - form.mean) * form.scale + form.beta).astype(np.float32)
