"""Anchors: a node of the network IR that one tunable family runs as a kernel call (a Conv, Gemm or
MatMul) in, the workload sizes, weights and bias of its kernel out, before any fusion. Each family maps
its own ONNX op types (its `anchor`); here are what they share: the `Anchor` itself, the workload key it
becomes, and the refusals of weights xtune cannot take."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from xtune.errors import UnsupportedNode
from xtune.graph import Graph, Node
from xtune.ops.workload import ParamValue


@dataclass(frozen=True, kw_only=True)
class Anchor:
    node: Node
    op: str  # the family that runs it
    sizes: tuple[tuple[str, int], ...]  # the workload's keys before the epilogue, in its order
    out_shape: tuple[int, ...]
    channel_axis: int  # of the output: where bias and BatchNormalization apply
    weight_axis: int = 0  # of the weights: their output channels (a Conv's O, a matmul's n)
    weights: np.ndarray | None = field(default=None, compare=False, repr=False)
    bias: np.ndarray | None = field(default=None, compare=False, repr=False)
    transposed: bool = False
    # An int8 kernel's other constant inputs by its workload's tensor names (a qmatmul's "scale" and
    # "qparams"; "A": an empty array of the activation's element type); None for a float kernel. Its
    # int32 bias is `bias`.
    quant: Mapping[str, np.ndarray] | None = field(default=None, compare=False, repr=False)

    @property
    def channels(self) -> int:
        return self.out_shape[self.channel_axis]

    def key(self, extra: tuple[tuple[str, ParamValue], ...], switches: dict[str, ParamValue]) -> str:
        """The workload key: the sizes, the family's `extra` keys (layout, algorithm), the switches."""
        return f"{self.op}:" + ",".join(f"{k}={v}" for k, v in (*self.sizes, *extra, *switches.items()))

    def channel_vector(self, graph: Graph, const: np.ndarray) -> np.ndarray | None:
        """A constant that broadcasts against the output along its channel axis only, as a (channels,)
        vector; None for any other constant (it is then no bias)."""
        rank = len(self.out_shape)
        if const.dtype != np.float32 or const.ndim > rank:
            return None
        shape = (1,) * (rank - const.ndim) + const.shape
        for axis, dim in enumerate(shape):
            if dim != 1 and (axis != self.channel_axis or dim != self.channels):
                return None
        return np.broadcast_to(const.reshape(-1), (self.channels,)).astype(np.float32)

    def scale_channels(self, weights: np.ndarray, scale: np.ndarray) -> np.ndarray:
        """The weights with output channel j multiplied by scale[j]."""
        shape = [1] * weights.ndim
        shape[self.weight_axis] = scale.size
        return weights * scale.reshape(shape)


def refuse(graph: Graph, node: Node, why: str) -> UnsupportedNode:
    """A node xtune cannot run, and why: the refusal gathers them all (xtune/frontend/refusal.py)."""
    return UnsupportedNode(graph.name, node.name, node.op, why)


def float_constant(graph: Graph, node: Node, tensor: str, what: str) -> np.ndarray:
    value = graph.constant(tensor)
    if value is None:
        raise refuse(graph, node, f"{what} '{tensor}' is not a constant (xtune tunes constant weights)")
    if value.dtype != np.float32:
        raise refuse(graph, node, f"{what} '{tensor}' is {value.dtype}, xtune runs float32 only")
    return value
