"""The network as a program: an imported graph in, the calls that run it in order out (`Program`): each a
tuned task (a `FusedOp`'s workload) or a generated operator (xtune/ops/generated.py) with the tensors it
reads and writes, every tensor placed in one of four spaces (the caller's input, output and workspace, or
the object's weights), the workspace laid out by the static memory planner (xtune/firmware/memory.py).

Execution order is the graph's (ONNX requires topological order): a fused call runs where its anchor
node stands, which is valid because the nodes fused after it read only the anchor's chain and its
residual exists before the anchor runs (xtune/frontend/tasks.py). Add followed by its only reader Relu is
one Add+ReLU call. Flatten, Reshape, Squeeze, Unsqueeze and Identity are views
(xtune/frontend/support.py, VIEWS): no call, the same bytes. A view that is the network's output makes
its source be written straight into the caller's output; a view of the input or of a constant is that
input or constant.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum

import numpy as np

from xtune.errors import InputError
from xtune.firmware.memory import MemoryPlan, Sharing, Step, lifetimes, plan_memory
from xtune.firmware.relayout import OpStep, relayout
from xtune.frontend.load import Source, load_graph
from xtune.frontend.refusal import Unsupported, UnsupportedNode, by_op, refusal
from xtune.frontend.support import VIEWS
from xtune.frontend.tasks import FusedOp, fuse
from xtune.frontend.validate import nonfinite
from xtune.graph import Graph, Node
from xtune.ops.generated import (
    Concat,
    Elementwise,
    ElementwiseOp,
    GlobalAveragePool,
    Operator,
    Pool2d,
    PoolKind,
    Softmax,
    relu,
)
from xtune.ops.layout import DEFAULT, Layout, parse_layout, task_weights
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
    kernel: Workload | Operator
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
        model=graph.name, layout=where, input=x, output=y, input_shape=graph.shape(x),
        output_shape=graph.shape(y), calls=calls, places=places, weights=tuple(weights.items()), memory=plan,
        nonfinite=tuple(nonfinite((t, graph.constants[t]) for t in read if t in graph.constants)),
    )  # fmt: skip


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
                _other(graph, node, scratch)
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
        nxt = graph.nodes[following[0]] if len(following) == 1 else None
        if (
            node.op == "Add"
            and nxt is not None
            and nxt.op == "Relu"
            and node.outputs[0] not in graph.outputs
            and following[0] > i
        ):
            claimed.add(nxt.name)
            step = _other(graph, node, weights, fuse_relu=True)
            steps.append(
                OpStep((node.name, nxt.name), step.kernel, (*step.args[:-1], nxt.outputs[0]), step.sharing)
            )
            continue
        steps.append(_other(graph, node, weights))
    return steps, weights


def _task_step(op: FusedOp, weights: dict[str, np.ndarray]) -> OpStep:
    wl = op.workload
    if op.weights is not None:
        weights[f"{op.anchor}.weights"] = task_weights(wl, op.weights)  # in the workload's layout
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


def _refuse(graph: Graph, node: Node, why: str) -> UnsupportedNode:
    return UnsupportedNode(graph.name, node.name, node.op, why)


def _other(graph: Graph, node: Node, weights: dict[str, np.ndarray], fuse_relu: bool = False) -> OpStep:
    """The generated operator of a node that is not a task (or a view), with its arguments."""
    x, out = node.inputs[0] if node.inputs else "", node.outputs[0]
    if node.op in VIEWS:
        return OpStep((node.name,), None, (x, out), Sharing.ALIAS)
    shape = graph.shape(x)
    kernel: Operator
    inputs: tuple[str, ...] = (x,)
    sharing = Sharing.NONE
    if node.op in ("MaxPool", "AveragePool"):
        kernel = _pool(graph, node, shape)
    elif node.op == "GlobalAveragePool" and len(shape) == 4:
        kernel = GlobalAveragePool(n=shape[0], c=shape[1], h=shape[2], w=shape[3])
    elif node.op == "Add":
        inputs = tuple(node.inputs[:2])
        for t in inputs:
            if graph.shape(t) != graph.shape(out):
                raise _refuse(graph, node, f"broadcasting {graph.shape(t)} to {graph.shape(out)} is not "
                              "supported (xtune adds tensors of one shape)")  # fmt: skip
            _constant(graph, node, t, weights)
        op = ElementwiseOp.ADD_RELU if fuse_relu else ElementwiseOp.ADD
        kernel, sharing = Elementwise(op=op, shape=graph.shape(out)), Sharing.IN_PLACE
    elif node.op == "Relu":
        kernel, sharing = relu(graph.shape(out)), Sharing.IN_PLACE
    elif node.op == "Clip":
        lo, hi = (_bound(graph, node, t) for t in (*node.inputs[1:3], "", "")[:2])
        lo, hi = -math.inf if lo is None else lo, math.inf if hi is None else hi
        kernel = Elementwise(op=ElementwiseOp.CLIP, shape=graph.shape(out), lo=lo, hi=hi)
        sharing = Sharing.IN_PLACE
    elif node.op == "Softmax":
        kernel = _softmax(graph, node, shape)
    elif node.op == "Concat":
        kernel, inputs = _concat(graph, node), tuple(node.inputs)
    else:
        raise _refuse(graph, node, "xtune cannot run this operator in a whole-network build (it runs Conv, "
                      "Gemm, MatMul, pooling, Add, Relu, Clip, Softmax, Concat and reshapes)")  # fmt: skip
    if tuple(math.prod(s) for s in kernel.input_shapes) != tuple(math.prod(graph.shape(t)) for t in inputs):
        raise _refuse(graph, node, "the operator's inputs do not have the sizes it reads")
    if math.prod(kernel.output_shape) != math.prod(graph.shape(out)):
        raise _refuse(graph, node, f"xtune computes {kernel.output_shape}, the model says {graph.shape(out)}")
    return OpStep((node.name,), kernel, (*inputs, out), sharing)


def _constant(graph: Graph, node: Node, tensor: str, weights: dict[str, np.ndarray]) -> None:
    value = graph.constant(tensor)
    if value is None:
        return
    if value.dtype != np.float32:
        raise _refuse(graph, node, f"constant '{tensor}' is {value.dtype}, xtune runs float32 only")
    weights[tensor] = value


def _bound(graph: Graph, node: Node, tensor: str) -> float | None:
    if not tensor:
        return None
    value = graph.constant(tensor)
    if value is None or value.size != 1:
        raise _refuse(graph, node, f"bound '{tensor}' is not a constant scalar")
    return float(value.reshape(-1)[0])


def _pool(graph: Graph, node: Node, shape: tuple[int, ...]) -> Pool2d:
    if len(shape) != 4:
        raise _refuse(graph, node, f"only 2-D pooling (4-D NCHW input) is supported, the input is {shape}")
    auto_pad = str(node.attr("auto_pad", "NOTSET"))
    refusals = (
        (int(node.attr("ceil_mode", 0)) != 0, "ceil_mode=1"),  # type: ignore[arg-type]
        (any(d != 1 for d in node.ints("dilations", (1, 1))), "dilations"),
        (auto_pad not in ("NOTSET", "VALID"), f"auto_pad {auto_pad}"),
        (int(node.attr("storage_order", 0)) != 0, "storage_order=1"),  # type: ignore[arg-type]
        (int(node.attr("count_include_pad", 0)) != 0, "count_include_pad=1"),  # type: ignore[arg-type]
    )
    for bad, what in refusals:
        if bad:
            raise _refuse(graph, node, f"{what} is not supported")
    kernel = node.ints("kernel_shape", ())
    stride = node.ints("strides", (1, 1))
    pads = (0, 0, 0, 0) if auto_pad == "VALID" else node.ints("pads", (0, 0, 0, 0))
    if len(kernel) != 2 or len(stride) != 2 or len(pads) != 4:
        raise _refuse(graph, node, "kernel_shape, strides and pads must describe a 2-D window")
    kind = PoolKind.MAX if node.op == "MaxPool" else PoolKind.AVERAGE
    n, c, h, w = shape
    try:
        return Pool2d(kind=kind, n=n, c=c, h=h, w=w, kernel=(kernel[0], kernel[1]),
                      stride=(stride[0], stride[1]), pads=(pads[0], pads[1], pads[2], pads[3]))  # fmt: skip
    except InputError as err:  # pads as large as the window, a window larger than the padded input
        raise _refuse(graph, node, str(err)) from None


def _softmax(graph: Graph, node: Node, shape: tuple[int, ...]) -> Softmax:
    rank = len(shape)
    # Opset 13 normalizes along `axis` alone (default -1); before, the input was coerced to 2-D at
    # `axis` (default 1) and normalized along the second dimension (ONNX operator spec, Softmax).
    axis = int(node.attr("axis", -1 if graph.opset >= 13 else 1))  # type: ignore[arg-type]
    axis = axis + rank if axis < 0 else axis
    if graph.opset >= 13 and axis != rank - 1:
        raise _refuse(graph, node, f"softmax over axis {axis} of {rank}: xtune normalizes the last axis")
    return Softmax(rows=math.prod(shape[:axis]), length=math.prod(shape[axis:]))


def _concat(graph: Graph, node: Node) -> Concat:
    shapes = [graph.shape(t) for t in node.inputs]
    rank = len(shapes[0])
    axis = int(node.attr("axis", 1))  # type: ignore[arg-type]
    axis = axis + rank if axis < 0 else axis
    for t in node.inputs:
        if graph.constant(t) is not None:
            raise _refuse(graph, node, f"input '{t}' is a constant; xtune concatenates activations")
    # Along `axis`, row-major: outer = the axes before it, inner = the axes after it (one plane).
    return Concat(n=math.prod(shapes[0][:axis]), channels=tuple(s[axis] for s in shapes),
                  h=math.prod(shapes[0][axis + 1 :]), w=1)  # fmt: skip


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
                raise InputError(f"{graph.name}: the output '{y}' is a view of '{src}', which the network "
                                 "does not compute (nothing to run)")  # fmt: skip
            places[src] = (Space.OUTPUT, 0)
    for step in steps:  # views of the input or of a constant are that tensor
        if step.kernel is None and step.args[0] in places:
            places.setdefault(step.args[1], places[step.args[0]])
        if step.kernel is None and step.args[0] in graph.constants and step.args[0] not in places:
            raise InputError(f"{graph.name}: node '{step.nodes[0]}' reshapes a constant; xtune runs "
                             "reshapes of activations")  # fmt: skip
    plan_steps = [Step(inputs=s.args[:-1], output=s.args[-1], sharing=s.sharing) for s in steps]
    nbytes = {t: 4 * math.prod(s) for t, s in graph.shapes.items()} | sizes
    plan = plan_memory(lifetimes(plan_steps, nbytes, frozenset(places)))
    for name, offset in plan.offsets:
        places[name] = (Space.WORKSPACE, offset)
    for step in steps:
        for t in step.args:
            if t not in places:
                raise InputError(f"{graph.name}: node '{step.nodes[0]}' reads '{t}', which nothing computes")
    return places, plan
