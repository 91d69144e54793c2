"""The slice family of a network's generated operators: ONNX's Slice of an activation (from opset 10
constant starts, ends, axes and steps inputs; opset 1's attributes the importer upgrades; negative indices
count from the end, indices past the ends are clamped, steps may be above 1 or negative) in, one `Slice`
kernel (xtune/ops/regions.py) out, in NCHW or NHWC (the slice then follows its axes)."""

from __future__ import annotations

from dataclasses import dataclass

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
from xtune.ops.regions import Piece, region_nest
from xtune.schedule.loopnest import Kernel


@dataclass(frozen=True, kw_only=True)
class Slice(GeneratedOp):
    """y of shape `sizes` from x of `shape`: y[i] = x[starts + steps * i] on every axis."""

    shape: Shape
    starts: Shape
    steps: Shape
    sizes: Shape

    def __post_init__(self) -> None:
        positive_dims("slice", self.shape)
        positive("slice", **{f"output dim{i}": d for i, d in enumerate(self.sizes)})
        for d, start, step, size in zip(self.shape, self.starts, self.steps, self.sizes, strict=True):
            if not (0 <= start < d and 0 <= start + step * (size - 1) < d):
                raise InputError(f"slice: {size} elements from {start} by {step} leave an axis of {d}")

    def in_layout(self, layout: Layout, out_shape: Shape) -> Slice:
        """The same computation in `layout`: the slice of a 4-D tensor follows its axes."""
        if layout is Layout.NCHW or len(self.shape) != 4:
            return self
        shape, starts, steps, sizes = (
            physical(v, layout) for v in (self.shape, self.starts, self.steps, self.sizes)
        )
        return Slice(shape=shape, starts=starts, steps=steps, sizes=sizes)

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (self.shape,)

    @property
    def output_shape(self) -> Shape:
        return self.sizes

    def reference(self, x: np.ndarray) -> np.ndarray:
        index = tuple(
            np.arange(size) * step + start
            for start, step, size in zip(self.starts, self.steps, self.sizes, strict=True)
        )
        return np.ascontiguousarray(x.reshape(self.shape)[np.ix_(*index)])

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        axes = [
            (Piece(size=size, start=start, step=step),)
            for start, step, size in zip(self.starts, self.steps, self.sizes, strict=True)
        ]
        return region_nest(name, self.shape, axes, 0.0, lanes)


def along(shape: Shape, axis: int, start: int, size: int) -> Slice:
    """`size` elements of `axis` from `start`, every other axis whole: one output of a Split."""
    starts, sizes = [0] * len(shape), list(shape)
    starts[axis], sizes[axis] = start, size
    return Slice(shape=shape, starts=tuple(starts), steps=(1,) * len(shape), sizes=tuple(sizes))


def _picked(dim: int, start: int, end: int, step: int) -> range:
    """The indices a Slice reads along an axis of `dim`: negative starts and ends count from the end, then
    both are clamped to [0, dim] (step > 0) or to [0, dim - 1] and [-1, dim - 1] (step < 0): ONNX operator
    spec, Slice. (Python's slicing differs for a negative step: it clamps a start below 0 to "none".)"""
    start, end = start + dim if start < 0 else start, end + dim if end < 0 else end
    if step > 0:
        return range(min(max(start, 0), dim), min(max(end, 0), dim), step)
    return range(min(max(start, 0), dim - 1), min(max(end, -1), dim - 1), step)


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    x = node.inputs[0]
    if graph.constant(x) is not None:
        raise refuse(graph, node, f"input '{x}' is a constant; xtune slices activations")
    shape = graph.shape(x)
    rank = len(shape)
    starts, ends = constant_ints(graph, node, 1, "starts") or (), constant_ints(graph, node, 2, "ends") or ()
    axes = constant_ints(graph, node, 3, "axes") or tuple(range(len(starts)))
    steps = constant_ints(graph, node, 4, "steps") or (1,) * len(starts)
    axes = tuple(a + rank if a < 0 else a for a in axes)
    if not len(starts) == len(ends) == len(axes) == len(steps) or not all(0 <= a < rank for a in axes):
        raise refuse(graph, node, f"starts, ends, axes and steps do not match a {rank}-D input")
    if 0 in steps or len(set(axes)) != len(axes):
        raise refuse(graph, node, "a step of 0 or an axis given twice")
    first, step, size = [0] * rank, [1] * rank, list(shape)
    for a, b, e, s in zip(axes, starts, ends, steps, strict=True):
        picked = _picked(shape[a], b, e, s)
        first[a], step[a], size[a] = (picked.start if picked else 0), picked.step, len(picked)
    with refusing(graph, node):
        kernel = Slice(shape=shape, starts=tuple(first), steps=tuple(step), sizes=tuple(size))
    return Mapped(kernel=kernel, inputs=(x,))


FAMILY = NodeFamily(kind="slice", onnx_ops=("Slice",), layouts=frozenset(Layout), from_node=from_node)
