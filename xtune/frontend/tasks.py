"""Task extraction: an ONNX model and a target in, the unique tuning tasks of the network out.

Every Conv, Gemm and MatMul is a kernel call (`FusedOp`) with what follows it fused into its epilogue
while the chain allows it (each step's tensor read by that one next node only), in this order: affine
steps folded into the weights and bias, in any number and order (BatchNormalization, Mul, Div or Add by
a per-channel constant: xtune/ops/affine.py); an Add of a tensor shaped like the output, available
before the kernel runs (the residual of ResNet and MobileNetV2 blocks); then an activation (Relu, ReLU6,
sigmoid, SiLU ...: xtune/ops/epilogue.py, `activation_switches`), which ends the chain. A quantized
model's int8 calls (QLinearMatMul, QLinearConv, MatMulInteger: docs/int8.md) have their bias and clamp in
the node already; what they fuse is a DequantizeLinear after them (xtune/ops/epilogue.py,
`dequantize_output`): the call then writes the dequantized float32 itself. Calls with the same workload
are one `Task`, tuned once. The other nodes xtune runs (xtune/frontend/support.py) are listed as other
nodes; every node it cannot run is named in one refusal
(xtune/frontend/refusal.py), or listed in `TaskSet.unsupported` when asked for a partial answer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from xtune.errors import InputError, UnsupportedNode
from xtune.frontend.load import Source, load_graph
from xtune.frontend.refusal import Unsupported, by_op, refusal
from xtune.frontend.support import integer_tensor, not_run, runs
from xtune.graph import Graph
from xtune.ops.affine import fold_affine, is_affine_step, may_fold
from xtune.ops.anchor import Anchor
from xtune.ops.epilogue import activation_switches, dequantize_output, residual_operand, silu_switches
from xtune.ops.layout import DEFAULT, Layout, layout_for, parse_layout
from xtune.ops.registry import anchor_of, family, parse_workload, template_for
from xtune.ops.template import MAX_STACK_BYTES
from xtune.ops.workload import ParamValue, Workload
from xtune.target import Target, get_target, host_target
from xtune.tuning.database import Record, log_target
from xtune.tuning.ranking import build_choice

# Epilogue stages in the order they apply; a chain only moves forward (ops/epilogue.py, EPILOGUE). The
# affine stage takes any number of per-channel scales and shifts: each folds into the weights and bias.
_AFFINE, _RESIDUAL, _CLAMP = 1, 2, 3


@dataclass(frozen=True, kw_only=True)
class FusedOp:
    """One kernel call of the network: an anchor node (Conv, Gemm, MatMul) and the nodes fused after it.

    `weights` and `bias` are what the kernel takes, in ONNX's order (a Conv's OIHW, which the build turns
    into the workload's layout: its family's `task_weights`): BatchNormalization folded in,
    Gemm's transposed (n, k) weights transposed to (k, n) (`transposed`) and its alpha applied.
    `weights` is None when the second matmul operand is an activation (`weights_input` names it)."""

    anchor: str
    fused: tuple[str, ...]  # names of the nodes folded into the call, in graph order
    workload: Workload
    input: str  # the activation tensor the kernel reads
    weights_input: str  # the ONNX tensor its weights come from
    residual: str | None  # the tensor added in the epilogue (residual=1)
    output: str  # the tensor the call writes: the output of the last fused node
    weights: np.ndarray | None = field(default=None, compare=False, repr=False)
    bias: np.ndarray | None = field(default=None, compare=False, repr=False)
    transposed: bool = False
    quant: Mapping[str, np.ndarray] | None = field(default=None, compare=False, repr=False)  # Anchor.quant


@dataclass(frozen=True, kw_only=True)
class Task:
    """One unique tuning task: a workload (fused epilogue included) and the nodes that run it."""

    workload: Workload
    nodes: tuple[str, ...]  # names of the ONNX anchor nodes that run it
    flops: float  # per call
    ops: tuple[FusedOp, ...] = field(default=(), compare=False, repr=False)  # the calls, node by node

    @property
    def count(self) -> int:
        return len(self.nodes)

    @property
    def transposed(self) -> tuple[str, ...]:
        """Nodes whose constant weights were transposed at extraction (Gemm transB=1)."""
        return tuple(op.anchor for op in self.ops if op.transposed)


@dataclass(frozen=True, kw_only=True)
class OtherNode:
    """A node that is not a tuning task and was not fused into one."""

    name: str
    op: str
    kind: str  # the generated operator family that lists it (NodeFamily.kind)


@dataclass(frozen=True, kw_only=True)
class TaskSet:
    """What `xtune.tasks()` returns: the model's unique tasks in graph order and its other nodes."""

    model: str
    target: Target
    layout: Layout  # the network's (xtune/ops/layout.py); each task's workload carries its own
    tasks: tuple[Task, ...]
    other_nodes: tuple[OtherNode, ...]
    total_flops: float  # of every kernel call: sum of flops * count (other nodes are not counted)
    unsupported: tuple[Unsupported, ...] = ()  # what xtune cannot run, by op type (partial answers only)

    def share(self, task: Task) -> float:
        """The task's fraction of the model's flops (every call of it)."""
        return task.flops * task.count / self.total_flops if self.total_flops else 0.0


def extract_tasks(
    source: Source | Graph,
    target: str | Target | None = None,
    layout: str | Layout = DEFAULT,
    partial: bool = False,
) -> TaskSet:
    """The unique tasks of an ONNX model (path, ModelProto or imported Graph) for `target` (default: the
    host's), the network run in `layout` (xtune/ops/layout.py: NHWC unless asked). A model with nodes
    xtune cannot run is refused in one InputError naming them all; with `partial`, the tasks of the
    nodes it can run are returned with the others in `unsupported` (what task extraction knows; the
    build's own checks of its generated operators add to it: xtune.firmware.program.unsupported)."""
    tgt = target if isinstance(target, Target) else get_target(target) if target else host_target()
    where = parse_layout(layout)
    graph = source if isinstance(source, Graph) else load_graph(source)
    ops, others, failures = fuse(graph, where)
    calls: dict[str, list[FusedOp]] = {}
    for op in ops:
        calls.setdefault(op.workload.key, []).append(op)
    tasks = tuple(
        Task(
            workload=group[0].workload,
            nodes=tuple(o.anchor for o in group),
            flops=float(group[0].workload.flops()),
            ops=tuple(group),
        )
        for group in calls.values()
    )
    unsupported = by_op(failures)
    if unsupported and not partial:
        raise refusal(graph.name, unsupported)
    for task in tasks:  # in every mode: no config of such a task could be measured, nor built
        if failure := _stack_failure(graph, task, tgt):
            raise failure
    total = sum(t.flops * t.count for t in tasks)
    return TaskSet(
        model=graph.name,
        target=tgt,
        layout=where,
        tasks=tasks,
        other_nodes=tuple(others),
        total_flops=total,
        unsupported=unsupported,
    )


def _stack_failure(graph: Graph, task: Task, target: Target) -> UnsupportedNode | None:
    """The refusal of a task whose default kernel needs more stack than any kernel may (MAX_STACK_BYTES:
    the agent's stack, where every config would be measured as a crash), naming its first node."""
    template = template_for(task.workload, target)
    need = template.kernel(template.default_config(), "stack_check").stack_bytes
    if need <= MAX_STACK_BYTES:
        return None
    op = next(node.op for node in graph.nodes if node.name == task.nodes[0])
    why = (
        f"its kernel ({task.workload.key}) needs {need} bytes of stack, more than the {MAX_STACK_BYTES} "
        "a kernel may use (docs/firmware.md, Stack)"
    )
    return UnsupportedNode(graph.name, task.nodes[0], op, why, "the tensor is too large for xtune's kernels")


def logged_best(tasks: Iterable[Task], target: Target, records: Sequence[Record]) -> list[Record | None]:
    """Per task, the record `xtune build` would take from `records` on `target`, or None."""
    return [build_choice(records, task.workload.key, log_target(task.workload, target)) for task in tasks]


def fuse(
    graph: Graph, layout: Layout = DEFAULT
) -> tuple[list[FusedOp], list[OtherNode], list[UnsupportedNode]]:
    """The kernel calls of `graph` with their fused epilogues, each workload in the layout it runs in
    within a network of `layout`, the nodes left over, and the nodes xtune cannot run, in graph order."""
    readers, writers = graph.consumers(), graph.producers()
    ops: list[FusedOp] = []
    claimed: set[int] = set()
    failed: dict[int, UnsupportedNode] = {}
    generated: set[int] = set()  # nodes of a task's op type that a generated operator runs
    for i, node in enumerate(graph.nodes):
        if runs(node.op) == "task":
            try:
                anchor = anchor_of(graph, node)
            except UnsupportedNode as failure:
                failed[i] = failure
                claimed.update(_scales_after(graph, i, readers))
                continue
            if anchor is None:
                generated.add(i)
                continue
            op, used = _fuse_chain(graph, i, anchor, readers, writers, layout)
            ops.append(op)
            claimed.update(used)
    others = []
    for i, node in enumerate(graph.nodes):
        kind = runs(node.op, generated=i in generated)
        if i in claimed or kind == "task":
            continue
        if kind is None:
            failed[i] = not_run(graph, node)
            continue
        if refused := integer_tensor(graph, node, kind):
            failed[i] = refused
            continue
        others.append(OtherNode(name=node.name, op=node.op, kind=kind))
    return ops, others, [failed[i] for i in sorted(failed)]


def _scales_after(graph: Graph, index: int, readers: dict[str, list[int]]) -> list[int]:
    """The affine steps that would fold into the anchor at `index` if xtune ran it (ops/affine.py,
    `may_fold`): a refusal names the anchor, not them as well."""
    out, chain = graph.nodes[index].outputs[0], []
    while out not in graph.outputs and len(readers.get(out, [])) == 1:
        j = readers[out][0]
        if not may_fold(graph, graph.nodes[j], out):
            break
        chain.append(j)
        out = graph.nodes[j].outputs[0]
    return chain


def _fuse_chain(
    graph: Graph,
    index: int,
    a: Anchor,
    readers: dict[str, list[int]],
    writers: dict[str, int],
    layout: Layout,
) -> tuple[FusedOp, list[int]]:
    out, stage, used = a.node.outputs[0], 0, []
    flags: dict[str, ParamValue] = {"residual": 0, "relu": 0, "relu6": 0}
    weights, bias, residual, quant = a.weights, a.bias, None, a.quant
    if a.quant is not None:  # an int8 kernel: its epilogue (bias, clamp) is in the node already
        stage = _CLAMP
        if (dequantized := _dequantized_output(graph, out, a.quant, readers)) is not None:
            j, quant = dequantized
            used.append(j)
            out = graph.nodes[j].outputs[0]
    while stage < _CLAMP and out not in graph.outputs and len(readers.get(out, [])) in (1, 2):
        if len(readers[out]) == 2:  # an activation that reads x twice
            silu = silu_switches(graph, out, [graph.nodes[j] for j in readers[out]])
            if silu is None or any(len(readers.get(t, [])) != 1 for t in silu[0].inputs[:2] if t != out):
                break  # the Sigmoid's output read by the Mul alone
            flags.update(silu[1])
            used += sorted(readers[out])
            out = silu[0].outputs[0]
            break
        j = readers[out][0]
        nxt, other = graph.nodes[j], residual_operand(graph.nodes[j], out)
        if stage <= _AFFINE and is_affine_step(graph, nxt, out, weights is not None):
            folded = fold_affine(graph, nxt, out, a, weights, bias)
            if folded is None:
                break
            weights, bias, stage = *folded, _AFFINE
        elif stage < _RESIDUAL and _available(graph, other, out, index, writers):
            residual, flags["residual"], stage = other, 1, _RESIDUAL
        elif (act := activation_switches(graph, nxt, out)) is not None:
            flags.update(act)
            stage = _CLAMP
        else:
            break
        used.append(j)
        out = nxt.outputs[0]
    fam = family(a.op)
    switches = {"bias": int(bias is not None), **flags}
    try:
        # the weights as the kernel takes them (Winograd only if finite), a fused DequantizeLinear's scale
        as_run = replace(a, weights=weights, quant=quant)
        workload = parse_workload(fam.task_key(as_run, switches, layout_for(fam.layouts, layout)))
    except InputError as err:  # a size outside the workload's bounds: say which node has it
        raise InputError(f"{graph.name}: {a.node.label}: {err}") from None
    op = FusedOp(
        anchor=a.node.name,
        fused=tuple(graph.nodes[j].name for j in used),
        workload=workload,
        input=a.node.inputs[0],
        weights_input=a.node.inputs[1],
        residual=residual,
        output=out,
        weights=weights,
        bias=bias,
        transposed=a.transposed,
        quant=quant,
    )
    return op, used


def _dequantized_output(
    graph: Graph, out: str, quant: Mapping[str, np.ndarray], readers: dict[str, list[int]]
) -> tuple[int, Mapping[str, np.ndarray]] | None:
    """The node after an int8 kernel whose output `out` it reads alone that the kernel's epilogue takes
    (ops/epilogue.py, `dequantize_output`), and the kernel's constants with it; None if there is none."""
    if out in graph.outputs or len(readers.get(out, [])) != 1:
        return None
    j = readers[out][0]
    extra = dequantize_output(graph, graph.nodes[j], out, quant)
    return None if extra is None else (j, {**quant, **extra})


def _available(graph: Graph, other: str, out: str, anchor: int, writers: dict[str, int]) -> bool:
    """`other` can be the residual of the kernel that writes `out`: same shape, and already computed
    when the anchor runs (a graph input, or written by an earlier node), so the call needs no reorder."""
    if not other or graph.shapes.get(other) != graph.shapes.get(out):
        return False
    return other in graph.inputs or writers.get(other, anchor) < anchor
