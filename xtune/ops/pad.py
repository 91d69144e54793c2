"""The pad family of a network's generated operators: ONNX's Pad (from opset 11 the pads, constant value
and, from opset 18, axes as constant inputs; opset 2's attributes the importer upgrades) of an activation
in, one `Pad` kernel (xtune/ops/regions.py) out, in NCHW or NHWC (the pads then follow their axes).

Modes (ONNX operator spec, Pad): "constant" with any value on any axis, a negative pad cropping its side;
"edge" (the border repeats the outermost element) and "reflect" (mirrored, the outermost element not
repeated; at most dim - 1 on a side) with pads of zero or more. "wrap" (opset 19) is refused. A zero
constant Pad of the spatial axes before a Conv or AveragePool is folded into their pads before this
(xtune/frontend/padfold.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.layout import Layout, physical
from xtune.ops.opkit import (
    Consts,
    GeneratedOp,
    Mapped,
    NodeFamily,
    Shape,
    constant_ints,
    positive,
    positive_dims,
    refusing,
)
from xtune.ops.regions import Axis, Piece, region_nest
from xtune.schedule.loopnest import Kernel


class PadMode(Enum):
    CONSTANT = "constant"
    EDGE = "edge"
    REFLECT = "reflect"


@dataclass(frozen=True, kw_only=True)
class Pad(GeneratedOp):
    """x of `shape` with before[k] and after[k] positions added (removed, if negative) on axis k."""

    shape: Shape
    before: Shape
    after: Shape
    mode: PadMode = PadMode.CONSTANT
    constant: float = 0.0  # the constant mode's border value

    def __post_init__(self) -> None:
        positive_dims("pad", self.shape)
        positive("pad", **{f"output dim{i}": d for i, d in enumerate(self.output_shape)})
        if self.mode is not PadMode.CONSTANT and min(*self.before, *self.after) < 0:
            raise InputError(f"pad: negative pads in {self.mode.value} mode (xtune crops in constant mode)")
        if self.mode is PadMode.REFLECT and any(
            max(b, a) >= d for d, b, a in zip(self.shape, self.before, self.after, strict=True)
        ):
            raise InputError("pad: a reflect pad as long as its axis (at most the axis' size - 1 on a side)")

    def in_layout(self, layout: Layout, out_shape: Shape) -> Pad:
        """The same computation in `layout`: the pads of a 4-D tensor follow its axes."""
        if layout is Layout.NCHW or len(self.shape) != 4:
            return self
        shape, before, after = (physical(v, layout) for v in (self.shape, self.before, self.after))
        return Pad(shape=shape, before=before, after=after, mode=self.mode, constant=self.constant)

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (self.shape,)

    @property
    def output_shape(self) -> Shape:
        return tuple(d + b + a for d, b, a in zip(self.shape, self.before, self.after, strict=True))

    def reference(self, x: np.ndarray) -> np.ndarray:
        x = x.reshape(self.shape)
        x = x[tuple(slice(max(-b, 0), d - max(-a, 0)) for d, b, a in self._sides())]  # the crops
        widths = [(max(b, 0), max(a, 0)) for _, b, a in self._sides()]
        if self.mode is PadMode.CONSTANT:
            return np.pad(x, widths, constant_values=np.float32(self.constant))
        return np.pad(x, widths, mode=self.mode.value)

    def _sides(self) -> list[tuple[int, int, int]]:
        return list(zip(self.shape, self.before, self.after, strict=True))

    def _axis(self, dim: int, before: int, after: int) -> Axis:
        """Constant: the border filled, the interior read (cropped where a pad is negative). Edge: the
        border reads the outermost element again and again (step 0). Reflect: before, output position v
        reads input index before - v; after, the k-th reads dim - 2 - k."""
        if self.mode is PadMode.CONSTANT:
            first, last = max(-before, 0), dim - max(-after, 0)
            pieces = [Piece(size=before, fill=True), Piece(size=last - first, start=first)]
            pieces.append(Piece(size=after, fill=True))
        elif self.mode is PadMode.EDGE:
            pieces = [Piece(size=before, step=0), Piece(size=dim), Piece(size=after, start=dim - 1, step=0)]
        else:
            pieces = [Piece(size=before, start=before, step=-1), Piece(size=dim)]
            pieces.append(Piece(size=after, start=dim - 2, step=-1))
        return tuple(p for p in pieces if p.size > 0)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        axes = [self._axis(d, b, a) for d, b, a in self._sides()]
        return region_nest(name, self.shape, axes, self.constant, lanes)


def _pads(graph: Graph, node: Node, rank: int) -> tuple[Shape, Shape, float]:
    """(before, after, constant value) per axis, from the inputs (opset 11 on; the importer has upgraded
    opset 2's attributes to them with onnx's version converter, xtune/frontend/normalize.py)."""
    pads = constant_ints(graph, node, 1, "pads") or ()
    axes = constant_ints(graph, node, 3, "axes") or tuple(range(rank))
    value = 0.0
    if len(node.inputs) > 2 and node.inputs[2]:
        given = graph.constant(node.inputs[2])
        if given is None or given.size != 1:
            raise refuse(graph, node, "the constant value is not a constant scalar")
        value = float(given.reshape(-1)[0])
    axes = tuple(a + rank if a < 0 else a for a in axes)
    if len(pads) != 2 * len(axes) or any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        raise refuse(graph, node, f"pads {list(pads)} do not match axes {list(axes)} of a {rank}-D input")
    before, after = [0] * rank, [0] * rank
    for k, a in enumerate(axes):  # ONNX: [x1_begin, x2_begin, ..., x1_end, x2_end, ...]
        before[a], after[a] = pads[k], pads[k + len(axes)]
    return tuple(before), tuple(after), value


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    x = node.inputs[0]
    if graph.constant(x) is not None:
        raise refuse(graph, node, f"input '{x}' is a constant; xtune pads activations")
    mode = str(node.attr("mode", "constant"))
    if mode not in {m.value for m in PadMode}:
        raise refuse(graph, node, f"mode '{mode}' is not supported (xtune pads constant, edge and reflect)")
    shape = graph.shape(x)
    before, after, value = _pads(graph, node, len(shape))
    with refusing(graph, node):
        kernel = Pad(shape=shape, before=before, after=after, mode=PadMode(mode), constant=value)
    return Mapped(kernel=kernel, inputs=(x,))


FAMILY = NodeFamily(kind="pad", onnx_ops=("Pad",), layouts=frozenset(Layout), from_node=from_node)
