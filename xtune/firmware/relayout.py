"""The layout pass: the steps of a network in ONNX's order (NCHW) in, the same steps run in the network's
layout out, with a `Transpose` (xtune/ops/transpose.py) inserted wherever a tensor is not in the layout its
reader runs in (xtune/ops/layout.py decides both).

Every step runs in one layout (its family's `layouts`; an elementwise step in its first input's), and its
4-D activations are read and written in it. A tensor is named by its ONNX name in ONNX's order and by
"name@nhwc" in NHWC (`physical_name`); a tensor whose two layouts are the same bytes (`differs`) has one
name. A conversion is inserted right before the first reader that needs it and shared by later readers.
The model's input is in ONNX's order; its output is converted back at the end when its last writer ran in
NHWC. A 4-D constant read in NHWC is converted at build time. A model's own NHWC <-> NCHW Transpose (a
TFLite model's boundary) is a renaming in an NHWC network (`_Pass.relabel`). The memory planner then
places the new tensors like any other intermediate (xtune/firmware/memory.py).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from xtune.errors import InputError
from xtune.firmware.memory import Sharing
from xtune.graph import Graph
from xtune.ops.layout import Layout, differs, layout_for, to_layout, workload_layout
from xtune.ops.opkit import GeneratedOp
from xtune.ops.transpose import Transpose
from xtune.ops.workload import Workload


@dataclass(frozen=True)
class OpStep:
    """One call of the entry before placement: what it runs (None: a view, no code) and its arguments
    (inputs, then the output; tensor names)."""

    nodes: tuple[str, ...]
    kernel: Workload | GeneratedOp | None
    args: tuple[str, ...]
    sharing: Sharing
    runs_in: frozenset[Layout] = frozenset((Layout.NCHW,))  # a generated operator's (its family's)
    follows_input: bool = False  # it runs in the layout its first input has


def physical_name(graph: Graph, tensor: str, layout: Layout) -> str:
    """The name of `tensor` stored in `layout`."""
    if layout is Layout.NCHW or not differs(graph.shape(tensor)):
        return tensor
    return f"{tensor}@{layout.value}"


def relayout(
    graph: Graph, steps: list[OpStep], weights: dict[str, np.ndarray], network: Layout
) -> tuple[list[OpStep], dict[str, int]]:
    """`steps` run in `network`'s layout, conversions inserted (constants converted in `weights`, which
    then holds only what a step reads), and the byte size of every tensor the pass named."""
    run = _Pass(graph, weights)
    for step in steps:
        if not (isinstance(step.kernel, Transpose) and network is Layout.NHWC and run.relabel(step)):
            if isinstance(step.kernel, Transpose) and graph.dtype(step.args[0]) != "float32":
                raise InputError(
                    f"{graph.name}: node '{step.nodes[0]}' transposes the {graph.dtype(step.args[0])} "
                    f"tensor '{step.args[0]}'; xtune's Transpose moves float32 elements (an NHWC network "
                    "renames it instead: --layout nhwc)"
                )
            run.step(step, _layout(graph, step, network, run.have))
    for y in graph.outputs:  # in ONNX's order, whatever its writer ran in
        if y in run.writer:
            run.need(y, Layout.NCHW, run.writer[y])
    read = {t for step in run.steps for t in step.args}
    for name in [n for n in weights if n not in read]:  # a constant only read converted
        del weights[name]
    return run.steps, run.sizes


def _layout(graph: Graph, step: OpStep, network: Layout, have: dict[str, set[Layout]]) -> Layout:
    """The layout `step` runs in."""
    if isinstance(step.kernel, Workload):  # the task's workload says (xtune/frontend/tasks.py chose it)
        return workload_layout(step.kernel)
    keeps_shape = step.kernel is None and graph.shape(step.args[0]) == graph.shape(step.args[-1])
    if step.follows_input or keeps_shape:
        # Elementwise steps, and views that keep the shape: the layout their first input has, no conversion.
        first = have.get(step.args[0], {Layout.NCHW})
        return network if network in first else next(iter(first))
    return layout_for(step.runs_in, network)


def _in_layout(
    graph: Graph, kernel: Workload | GeneratedOp | None, args: tuple[str, ...], layout: Layout
) -> Workload | GeneratedOp | None:
    """`kernel` (built for ONNX's order) computing the same in `layout`."""
    if layout is Layout.NCHW or kernel is None or isinstance(kernel, Workload):
        return kernel
    return kernel.in_layout(layout, graph.shape(args[-1]))


class _Pass:
    def __init__(self, graph: Graph, weights: dict[str, np.ndarray]) -> None:
        self.graph, self.weights = graph, weights
        self.have: dict[str, set[Layout]] = {x: {Layout.NCHW} for x in graph.inputs}
        self.steps: list[OpStep] = []
        self.sizes: dict[str, int] = {}
        self.writer: dict[str, str] = {}  # tensor -> the node whose step wrote it
        self.same: dict[str, str] = {}  # a tensor's physical name -> the name of the bytes it is (relabel)

    def step(self, step: OpStep, layout: Layout) -> None:
        inputs = step.args[:-1]
        if isinstance(step.kernel, Workload):  # its weights and bias are already in the task's layout
            args = [t if t in self.weights else self.need(t, layout, step.nodes[0]) for t in inputs]
        else:
            args = [self.need(t, layout, step.nodes[0]) for t in inputs]
        out = step.args[-1]
        self.have[out], self.writer[out] = {layout}, step.nodes[0]
        kernel = _in_layout(self.graph, step.kernel, step.args, layout)
        self.steps.append(replace(step, kernel=kernel, args=(*args, self.name(out, layout))))

    def shape(self, tensor: str) -> tuple[int, ...]:
        """A tensor's ONNX shape; a constant an operator made at build time (a BatchNormalization's scale)
        is not in the graph, and has its array's."""
        if tensor not in self.graph.shapes and tensor in self.weights:
            return tuple(self.weights[tensor].shape)
        return self.graph.shape(tensor)

    def name(self, tensor: str, layout: Layout) -> str:
        name = physical_name(self.graph, tensor, layout)
        name = self.same.get(name, name)
        self.sizes[name] = np.dtype(self.graph.dtype(tensor)).itemsize * math.prod(self.graph.shape(tensor))
        return name

    def relabel(self, step: OpStep) -> bool:
        """A model's own NHWC <-> NCHW Transpose (a TFLite model's, at its input and output) in an NHWC
        network: the NCHW tensor stored in NHWC is the NHWC tensor's bytes, so the step is a renaming, no
        code. The output's writer then writes the model's output directly. False where it cannot be."""
        assert isinstance(step.kernel, Transpose)
        (x, out), node = step.args, step.nodes[0]
        if step.kernel.to is Layout.NCHW:  # x is (n, h, w, c) in its own order; out is (n, c, h, w)
            if not differs(self.graph.shape(out)) or Layout.NCHW not in self.have.get(x, {Layout.NCHW}):
                return False
            self.same[physical_name(self.graph, out, Layout.NHWC)] = self.need(x, Layout.NCHW, node)
            self.have[out], self.writer[out] = {Layout.NHWC}, node
            return True
        stored = physical_name(self.graph, x, Layout.NHWC)  # x is (n, c, h, w); out is (n, h, w, c)
        writes = [s for s in self.steps if s.args[-1] == stored]
        if Layout.NHWC not in self.have.get(x, set()) or not differs(self.graph.shape(x)) or len(writes) != 1:
            return False
        if writes[0].sharing is Sharing.ALIAS or x in self.graph.outputs:
            return False
        self.steps = [replace(s, args=tuple(out if a == stored else a for a in s.args)) for s in self.steps]
        self.same[stored] = out
        self.sizes[out] = self.sizes.pop(stored)
        self.have[out], self.writer[out] = {Layout.NCHW}, node
        return True

    def need(self, tensor: str, layout: Layout, node: str) -> str:
        """The name of `tensor` in `layout`, converting it first if it is not there yet."""
        if not tensor or not differs(self.shape(tensor)):
            return tensor
        if tensor in self.weights:  # a constant operand: converted here, at build time
            name = self.name(tensor, layout)
            self.weights.setdefault(name, to_layout(self.weights[tensor], layout))
            return name
        have = self.have.get(tensor)
        if have is None:  # nothing computes it: placement says so, naming the node
            return tensor
        if layout not in have:
            if self.graph.dtype(tensor) != "float32":  # the layout's Transpose moves float32 elements
                raise InputError(
                    f"{self.graph.name}: node '{node}' reads the {self.graph.dtype(tensor)} tensor "
                    f"'{tensor}' in {layout.value.upper()}; xtune converts float32 tensors between layouts "
                    "only"
                )
            (source,) = have
            n, c, h, w = self.graph.shape(tensor)
            convert = Transpose(n=n, c=c, h=h, w=w, to=layout)
            args = (self.name(tensor, source), self.name(tensor, layout))
            self.steps.append(OpStep((node,), convert, args, Sharing.NONE))
            have.add(layout)
        return self.name(tensor, layout)
