"""The pieces the quantized rewrite (xtune/frontend/quantized.py) matches QDQ patterns with: a graph being
rewritten (`Rewrite`) and its nodes in; the DequantizeLinear behind a tensor, the QuantizeLinear (and the
Relu or Clip before it) after a node, a per-tensor scale and zero point, the clamp a fused activation makes
in quantized values (each reference's rounding), out."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.quantize import RANGES

Requant = Literal["onnx", "tflite"]  # whose integer arithmetic a model's quantized nodes follow


@dataclass
class Rewrite:
    """The graph being rewritten: its nodes by index (None: removed) and its new constants."""

    requant: Requant
    graph: Graph
    nodes: list[Node | None]
    constants: dict[str, np.ndarray]
    shapes: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]

    def constant(self, name: str, value: np.ndarray) -> str:
        """`value` as a new constant named after `name` (made unique)."""
        unique = self._unique(name)
        self.constants[unique] = value
        return unique

    def tensor(self, name: str, shape: tuple[int, ...], dtype: str) -> str:
        """A new activation of `shape` and `dtype`, named after `name` (made unique)."""
        unique = self._unique(name)
        self.shapes[unique], self.dtypes[unique] = shape, dtype
        return unique

    def _unique(self, name: str) -> str:
        unique, i = name, 0
        while unique in self.constants or unique in self.shapes:  # the graph's own and the new ones
            i += 1
            unique = f"{name}.{i}"
        return unique


def dequantized(graph: Graph, writers: dict[str, int], tensor: str) -> Node | None:
    """The DequantizeLinear that writes `tensor`, if one does, with constant scale and zero point."""
    at = writers.get(tensor)
    node = graph.nodes[at] if at is not None else None
    if node is None or node.op != "DequantizeLinear":
        return None
    return node if all(graph.constant(t) is not None for t in node.inputs[1:] if t) else None


def zero_point(graph: Graph, node: Node, scale_size: int) -> np.ndarray:
    """A QuantizeLinear/DequantizeLinear's zero point (absent: uint8 0, ONNX's default)."""
    name = node.inputs[2] if len(node.inputs) > 2 else ""
    value = graph.constant(name) if name else None
    return value if value is not None else np.zeros(max(scale_size, 1), np.uint8)


def scalar_q(graph: Graph, node: Node) -> tuple[float, int, str] | None:
    """(scale, zero point, element type) of a per-tensor QuantizeLinear/DequantizeLinear."""
    scale = graph.constant(node.inputs[1])
    if scale is None or scale.size != 1 or scale.dtype != np.float32:
        return None
    zero = zero_point(graph, node, 1)
    if zero.size != 1 or str(zero.dtype) not in RANGES:
        return None
    return float(scale.reshape(-1)[0]), int(zero.reshape(-1)[0]), str(zero.dtype)


def only_reader(graph: Graph, readers: dict[str, list[int]], tensor: str) -> Node | None:
    read = readers.get(tensor, [])
    if tensor in graph.outputs or len(read) != 1:
        return None
    return graph.nodes[read[0]]


def activation_clamp(
    graph: Graph, node: Node, scale: float, zero: int, kind: str, requant: Requant
) -> tuple[int, int] | None:
    """The output clamp of a Relu or Clip fused before QuantizeLinear, in quantized values: each bound
    rounded as QuantizeLinear rounds (half to even), or for a TFLite model as TFLite's
    CalculateActivationRangeQuantized does (float32 bound / scale, half away from zero)."""
    lo, hi = RANGES[kind]
    if node.op == "Relu":
        return max(lo, zero), hi
    bounds = []
    for name in (*node.inputs[1:3], "", "")[:2]:
        value = graph.constant(name) if name else None
        if name and (value is None or value.size != 1):
            return None
        bounds.append(None if value is None else float(value.reshape(-1)[0]))
    steps = [None if b is None else float(np.float32(b) / np.float32(scale)) for b in bounds]
    rounded = [None if v is None else _ROUND[requant](v) for v in steps]
    if rounded[0] is not None:
        lo = max(lo, zero + rounded[0])
    if rounded[1] is not None:
        hi = min(hi, zero + rounded[1])
    return (lo, hi) if lo <= hi else None


# How each reference rounds a quantized bound: ONNX's QuantizeLinear half to even; TFLite's TfLiteRound
# (std::round) half away from zero.
_ROUND = {
    "onnx": lambda v: int(np.rint(v)),
    "tflite": lambda v: int(math.copysign(math.floor(abs(v) + 0.5), v)),
}


def quantized_after(
    graph: Graph, readers: dict[str, list[int]], node: Node
) -> tuple[Node | None, Node] | None:
    """The Relu or Clip that alone reads `node`'s output (or None) and the QuantizeLinear that alone reads
    what comes out, if there is one."""
    after = only_reader(graph, readers, node.outputs[0])
    act = after if after is not None and after.op in ("Relu", "Clip") else None
    q = only_reader(graph, readers, act.outputs[0]) if act is not None else after
    return (act, q) if q is not None and q.op == "QuantizeLinear" else None


def drop_fused(edit: Rewrite, writers: dict[str, int], *fused: Node | None) -> None:
    for done in fused:
        if done is not None:
            edit.nodes[writers[done.outputs[0]]] = None


def zero_name(edit: Rewrite, node: Node, kind: str) -> str:
    """A QuantizeLinear/DequantizeLinear's zero-point tensor, made explicit where ONNX's default (0) was
    meant: a QOperator node's inputs have fixed positions."""
    if len(node.inputs) > 2 and node.inputs[2]:
        return node.inputs[2]
    return edit.constant(f"{node.name}.zero_point", np.zeros((), np.dtype(kind)))
