"""The in-memory network IR: an imported model's nodes (op, inputs, outputs, attributes), its constants as
numpy arrays and every tensor's static shape. Pure data: the front ends (xtune/frontend/) fill it, the
operator families map its nodes, the firmware build reads it; nothing here reads a file."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

AttrValue = int | float | str | tuple[int, ...] | tuple[float, ...] | tuple[str, ...] | np.ndarray


@dataclass(frozen=True, kw_only=True)
class Node:
    """One ONNX node: `op` is its op_type; an omitted optional input is the empty string, as in ONNX."""

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    attrs: Mapping[str, AttrValue] = field(default_factory=dict, compare=False)

    def attr(self, key: str, default: AttrValue) -> AttrValue:
        return self.attrs.get(key, default)

    def int_attr(self, key: str, default: int) -> int:
        value = self.attrs.get(key, default)
        assert isinstance(value, int), (self.name, key, value)
        return value

    def float_attr(self, key: str, default: float) -> float:
        value = self.attrs.get(key, default)
        assert isinstance(value, int | float), (self.name, key, value)
        return float(value)

    def ints(self, key: str, default: tuple[int, ...]) -> tuple[int, ...]:
        value = self.attrs.get(key, default)
        assert isinstance(value, tuple), (self.name, key, value)
        return tuple(int(v) for v in value)

    @property
    def label(self) -> str:
        """How errors name the node: "node 'layer1.0.conv1' (Conv)"."""
        return f"node '{self.name}' ({self.op})"


@dataclass(frozen=True, kw_only=True)
class Graph:
    """A model's main graph in topological order (ONNX requires it), with constants and static shapes."""

    name: str  # the file it came from, or the graph's own name for an in-memory model
    opset: int
    nodes: tuple[Node, ...]
    inputs: tuple[str, ...]  # graph inputs that are not initializers: what a caller feeds
    outputs: tuple[str, ...]
    constants: Mapping[str, np.ndarray] = field(compare=False)  # initializers and Constant nodes' values
    shapes: Mapping[str, tuple[int, ...]] = field(compare=False)  # every tensor's shape
    # Element types (numpy names) of the activations that are not float32: a quantized model's int8,
    # uint8 and int32 tensors. Constants carry their own.
    dtypes: Mapping[str, str] = field(default_factory=dict, compare=False)

    def shape(self, tensor: str) -> tuple[int, ...]:
        return self.shapes[tensor]

    def dtype(self, tensor: str) -> str:
        """The element type of `tensor` as numpy names it ("float32", "int8", ...)."""
        value = self.constants.get(tensor)
        return str(value.dtype) if value is not None else self.dtypes.get(tensor, "float32")

    def constant(self, tensor: str) -> np.ndarray | None:
        return self.constants.get(tensor)

    def producers(self) -> dict[str, int]:
        """Tensor -> the index of the node that writes it."""
        return {out: i for i, node in enumerate(self.nodes) for out in node.outputs}

    def consumers(self) -> dict[str, list[int]]:
        """Tensor -> the indices of the nodes that read it, in graph order."""
        readers: dict[str, list[int]] = {}
        for i, node in enumerate(self.nodes):
            for name in dict.fromkeys(node.inputs):
                if name:
                    readers.setdefault(name, []).append(i)
        return readers
