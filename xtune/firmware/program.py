"""The network as a program: an imported graph in, the calls that run it in order out (`Program`): each a
tuned task (a `FusedOp`'s workload) or a generated operator (its family in xtune/ops/, e.g.
elementwise.py) with the tensors it reads and writes, every tensor placed in one of four spaces (the
caller's input, output and workspace, or the object's weights), the workspace laid out by the static
memory planner (xtune/firmware/memory.py).

Execution order is the graph's (ONNX requires topological order): a fused call runs where its anchor
node stands, which is valid because the nodes fused after it read only the anchor's chain and its
residual exists before the anchor runs (xtune/frontend/tasks.py). Add followed by its only reader Relu is
one Add+ReLU call. A node of several outputs (Split) is one call per output. Flatten, Reshape, Squeeze,
Unsqueeze and Identity are views (xtune/ops/reshape.py): no call, the same bytes. A view that is the
network's output makes its source be written straight into the caller's output; a view of the input or of
a constant is that input or constant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import numpy as np

from xtune.errors import InputError, UnsupportedNode
from xtune.firmware.memory import MemoryPlan, Sharing, Step, lifetimes, plan_memory
from xtune.firmware.relayout import OpStep, relayout
from xtune.frontend.load import Source, load_graph
from xtune.frontend.quantized import quantization
from xtune.frontend.refusal import Unsupported, by_op, refusal
from xtune.frontend.tasks import FusedOp, fuse
from xtune.frontend.validate import nonfinite
from xtune.graph import Graph, Node
from xtune.ops.layout import DEFAULT, Layout, parse_layout
from xtune.ops.opkit import UNSUPPORTED, GeneratedOp, Mapped, NodeFamily
from xtune.ops.qpointwise import fused_boundary
from xtune.ops.registry import family, node_family
from xtune.ops.workload import Workload


class Space(Enum):
    """Where a tensor lives: the entry's three pointers, or the object's read-only weights."""

    INPUT = "input"
    OUTPUT = "output"
    WORKSPACE = "workspace"
    WEIGHTS = "weights"


@dataclass(frozen=True, kw_only=True)
class Call:
    """One kernel call of the entry: a task's workload or a generated operator, and its arguments (tensor
    names, in the kernel's parameter order: inputs, then the output)."""

    nodes: tuple[str, ...]  # the ONNX nodes it runs, anchor first
    kernel: Workload | GeneratedOp
    args: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class Program:
    """The calls in execution order and where every tensor they touch lives. A weights tensor's offset
    is 0 here: the object's weights layout (xtune/codegen/rodata.py, `WeightsLayout`) places it."""

    model: str
    layout: Layout  # what the network runs in between its input and output (those are in ONNX's order)
    input: str
    output: str
    input_shape: tuple[int, ...]
    output_shape: tuple[int, ...]
    calls: tuple[Call, ...]
    places: Mapping[str, tuple[Space, int]]  # tensor -> (space, byte offset; weights: see firmware/build.py)
    weights: tuple[tuple[str, np.ndarray], ...]  # constant arrays by tensor name, in first-use order
    memory: MemoryPlan
    nonfinite: tuple[tuple[str, int], ...] = ()  # the model's constants holding NaN or inf, and how many
    input_type: str = "float32"  # element types of the entry's input and output (numpy names)
    output_type: str = "float32"
    # The (scale, zero point) of the input and output: an int8 one's own, or a float one's where the
    # network quantizes it right away (input) or dequantized it last (output); None elsewhere.
    input_quant: tuple[float, int] | None = None
    output_quant: tuple[float, int] | None = None


def program(source: Source, layout: str | Layout = DEFAULT) -> Program:
    """The calls that run `source`'s network (a path or a ModelProto) in `layout` (NHWC unless asked:
    xtune/ops/layout.py), or one InputError naming every node xtune cannot run (or the file it cannot
    read)."""
    where = parse_layout(layout)
    graph = load_graph(source)
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        raise InputError(
            f"{graph.name}: the network has {len(graph.inputs)} input(s) and {len(graph.outputs)} output(s); "
            "xtune builds networks of one input and one output"
        )
    if graph.outputs[0] in graph.inputs:
        raise InputError(f"{graph.name}: the output '{graph.outputs[0]}' is the input: nothing to compute")
    names = [n.name for n in graph.nodes]
    if len(set(names)) != len(names):
        twice = next(n for n in names if names.count(n) > 1)
        raise InputError(f"{graph.name}: two nodes are named '{twice}'; node names must be unique")
    ops, others, failures = fuse(graph, where)
    runnable = {o.name for o in others}
    if refused := _refused(graph, runnable, failures):
        raise refusal(graph.name, by_op(refused))
    steps, weights = _calls(graph, ops, runnable)
    steps, sizes = relayout(graph, steps, weights, where)
    places, plan = _place(graph, steps, weights, sizes)
    calls = tuple(Call(nodes=s.nodes, kernel=s.kernel, args=s.args) for s in steps if s.kernel is not None)
    (x,), (y,) = graph.inputs, graph.outputs
    read = dict.fromkeys(t for node in graph.nodes for t in node.inputs)
    return Program(
        model=graph.name,
        layout=where,
        input=x,
        output=y,
        input_shape=graph.shape(x),
        output_shape=graph.shape(y),
        calls=calls,
        places=places,
        weights=tuple(weights.items()),
        memory=plan,
        nonfinite=tuple(nonfinite((t, graph.constants[t]) for t in read if t in graph.constants)),
        input_type=graph.dtype(x),
        output_type=graph.dtype(y),
        input_quant=quantization(graph, x),
        output_quant=quantization(graph, y),
    )


def unsupported(source: Source | Graph, layout: str | Layout = DEFAULT) -> tuple[Unsupported, ...]:
    """Every node of the network that a whole-network build cannot run, by op type: what `program`
    refuses, as data (`xtune tasks --json` lists it)."""
    graph = source if isinstance(source, Graph) else load_graph(source)
    _, others, failures = fuse(graph, parse_layout(layout))
    return by_op(_refused(graph, {o.name for o in others}, failures))


def _refused(graph: Graph, others: set[str], failures: list[UnsupportedNode]) -> list[UnsupportedNode]:
    """`failures` (from task extraction) and the nodes of `others` whose generated operator refuses
    them, in graph order."""
    refused = {f.name: f for f in failures}
    scratch: dict[str, np.ndarray] = {}
    for node in graph.nodes:
        if node.name in others:
            try:
                _other(graph, node, scratch, None)
            except UnsupportedNode as failure:
                refused[node.name] = failure
    return [refused[n.name] for n in graph.nodes if n.name in refused]


def _calls(graph: Graph, ops: list[FusedOp], others: set[str]) -> tuple[list[OpStep], dict[str, np.ndarray]]:
    """The steps in execution order (the kernel calls `ops` and the generated operators of `others`) and
    the weights they read."""
    by_anchor = {op.anchor: op for op in ops}
    claimed = {name for op in ops for name in op.fused}
    readers = graph.consumers()
    weights: dict[str, np.ndarray] = {}
    steps: list[OpStep] = []
    for i, node in enumerate(graph.nodes):
        if node.name in claimed or (node.name not in by_anchor and node.name not in others):
            continue
        if node.name in by_anchor:
            steps.append(_task_step(by_anchor[node.name], weights))
            continue
        following = readers.get(node.outputs[0], []) if node.outputs else []
        later = graph.nodes[following[0]] if len(following) == 1 and following[0] > i else None
        made = _other(graph, node, weights, later)
        claimed.update(made[0].nodes[1:])
        steps.extend(made)
    return steps, weights


def _task_step(op: FusedOp, weights: dict[str, np.ndarray]) -> OpStep:
    wl = op.workload
    if op.quant is not None:
        return _int8_step(op, weights)
    if op.weights is not None:
        weights[f"{op.anchor}.weights"] = family(wl.op).task_weights(wl, op.weights)  # the workload's layout
        w = f"{op.anchor}.weights"
    else:
        w = op.weights_input
    args = [op.input, w]
    if wl["bias"]:
        assert op.bias is not None
        weights[f"{op.anchor}.bias"] = op.bias
        args.append(f"{op.anchor}.bias")
    if wl["residual"]:
        assert op.residual is not None
        args.append(op.residual)
    return OpStep((op.anchor, *op.fused), wl, (*args, op.output), Sharing.NONE)


def _int8_step(op: FusedOp, weights: dict[str, np.ndarray]) -> OpStep:
    """An int8 kernel's call: the activation, the int8 weights, then its other constant inputs (int32
    bias, scales, qparams) in the order of its workload's tensors, then the output."""
    assert op.weights is not None and op.quant is not None
    wl, prefix = op.workload, op.anchor
    weights[f"{prefix}.weights"] = family(wl.op).task_weights(wl, op.weights)
    args = [op.input, f"{prefix}.weights"]
    constants = {"bias": op.bias, **op.quant}
    for spec in wl.tensors()[2:]:
        if spec.is_output:
            continue
        value = constants[spec.name]
        assert value is not None, (op.anchor, spec.name)
        weights[f"{prefix}.{spec.name}"] = value
        args.append(f"{prefix}.{spec.name}")
    return OpStep((op.anchor, *op.fused), wl, (*args, op.output), Sharing.NONE)


def _refuse(graph: Graph, node: Node, why: str) -> UnsupportedNode:
    return UnsupportedNode(graph.name, node.name, node.op, why)


def _other(graph: Graph, node: Node, weights: dict[str, np.ndarray], later: Node | None) -> list[OpStep]:
    """The generated operator of a node that is not a task (or a view), with its arguments: its family's
    mapping (xtune/ops/registry.py, NODE_FAMILIES), which may fold `later`, the only node reading its
    output, into it, as may a QuantizeLinear there (xtune/ops/qpointwise.py, `fused_boundary`); a node of
    several outputs is one step per output."""
    fam = node_family(node.op)
    if fam is None:
        raise _refuse(graph, node, UNSUPPORTED)
    mapped = fused_boundary(graph, node, fam.from_node(graph, node, weights, later), fam.layouts, later)
    return [_step(graph, node, fam, part, weights) for part in (mapped, *mapped.more)]


def _step(
    graph: Graph, node: Node, fam: NodeFamily, mapped: Mapped, weights: dict[str, np.ndarray]
) -> OpStep:
    """One call of `node`'s generated operator, its sizes checked against the model's shapes."""
    out = mapped.output or (mapped.fused or node).outputs[0]
    nodes = (node.name, mapped.fused.name) if mapped.fused is not None else (node.name,)
    layouts = mapped.layouts or fam.layouts
    follows_input = fam.follows_input if mapped.follows_input is None else mapped.follows_input
    if mapped.kernel is None:
        return OpStep(nodes, None, (*mapped.inputs, out), Sharing.ALIAS, layouts, follows_input)
    kernel = mapped.kernel
    sizes = (weights[t].size if t in weights else math.prod(graph.shape(t)) for t in mapped.inputs)
    if tuple(math.prod(s) for s in kernel.input_shapes) != tuple(sizes):
        raise _refuse(graph, node, "the operator's inputs do not have the sizes it reads")
    if math.prod(kernel.output_shape) != math.prod(graph.shape(out)):
        raise _refuse(graph, node, f"xtune computes {kernel.output_shape}, the model says {graph.shape(out)}")
    sharing = Sharing.IN_PLACE if mapped.in_place else Sharing.NONE
    # A node whose own layouts differ from its family's runs in them, not in its first input's.
    follows = follows_input and mapped.layouts is None
    return OpStep(nodes, kernel, (*mapped.inputs, out), sharing, layouts, follows)


def _place(
    graph: Graph, steps: list[OpStep], weights: dict[str, np.ndarray], sizes: dict[str, int]
) -> tuple[dict[str, tuple[Space, int]], MemoryPlan]:
    """Every tensor's (space, byte offset): the input, the output (and what views make the output), the
    weights (offsets filled in by the caller's layout: 0 here), the rest planned in the workspace."""
    (x,), (y,) = graph.inputs, graph.outputs
    places: dict[str, tuple[Space, int]] = {x: (Space.INPUT, 0), y: (Space.OUTPUT, 0)}
    for name in weights:
        places[name] = (Space.WEIGHTS, 0)
    for step in reversed(steps):  # the output's sources through views are written into the output
        src, view = step.args[0], step.args[-1]
        if step.kernel is None and places.get(view) == (Space.OUTPUT, 0):
            if src in places:
                raise InputError(
                    f"{graph.name}: the output '{y}' is a view of '{src}', which the network "
                    "does not compute (nothing to run)"
                )
            places[src] = (Space.OUTPUT, 0)
    for step in steps:  # views of the input or of a constant are that tensor
        if step.kernel is None and step.args[0] in places:
            places.setdefault(step.args[1], places[step.args[0]])
        if step.kernel is None and step.args[0] in graph.constants and step.args[0] not in places:
            raise InputError(
                f"{graph.name}: node '{step.nodes[0]}' reshapes a constant; xtune runs "
                "reshapes of activations"
            )
    plan_steps = [Step(inputs=s.args[:-1], output=s.args[-1], sharing=s.sharing) for s in steps]
    # Bytes by element type: an int8 activation takes a quarter of a float32 one.
    nbytes = {t: np.dtype(graph.dtype(t)).itemsize * math.prod(s) for t, s in graph.shapes.items()} | sizes
    plan = plan_memory(lifetimes(plan_steps, nbytes, frozenset(places)))
    for name, offset in plan.offsets:
        places[name] = (Space.WORKSPACE, offset)
    for step in steps:
        for t in step.args:
            if t not in places:
                raise InputError(f"{graph.name}: node '{step.nodes[0]}' reads '{t}', which nothing computes")
    return places, plan
