"""Model validation: a ModelProto in, the same model with its nodes in topological order out (or one
InputError naming the file and the node), before anything reads a tensor of it.

A model file is input from anyone: what ONNX Runtime refuses, and what onnx's checker refuses, must not
build (ONNX IR spec, "Graphs": single static assignment, topologically sorted nodes, every input defined).
So this checks, in an order that names the culprit: names (none empty), element types (defined, and one
xtune's numpy can hold), initializers (dense, their data as long as shape and type say), attributes (no
sparse tensors, type protos or subgraphs), one producer per tensor, a topological order (a cycle refused,
an out-of-order graph sorted as ONNX Runtime sorts it), every graph output computed, then onnx's checker
on the shape-inferred model (`check`), and last the weights of Conv, Gemm and MatMul against the shapes
of what they read (`check_weights`). Non-finite constants are not refused here: `nonfinite` names them.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import onnx

from xtune.errors import InputError

# Element types a constant may have: numpy holds each natively (ONNX IR spec, "Tensor Element Types").
# Activations are float32 only; integers are shape tensors and indices, float16/float64 convertible data.
_T = onnx.TensorProto
_CONSTANT_TYPES = frozenset((_T.FLOAT, _T.DOUBLE, _T.FLOAT16, _T.BOOL, _T.INT8, _T.INT16, _T.INT32, _T.INT64))
_CONSTANT_TYPES |= {_T.UINT8, _T.UINT16, _T.UINT32, _T.UINT64}
_A = onnx.AttributeProto
_REFUSED_ATTRIBUTES = {
    _A.SPARSE_TENSOR: "a sparse tensor",
    _A.SPARSE_TENSORS: "sparse tensors",
    _A.TYPE_PROTO: "a type",
    _A.TYPE_PROTOS: "types",
    _A.UNDEFINED: "an undefined kind",
    _A.GRAPH: "a subgraph (control flow)",
    _A.GRAPHS: "subgraphs (control flow)",
}


def label(node: onnx.NodeProto, index: int) -> str:
    """How errors name a node: "node 'conv1' (Conv)"; an unnamed node by its op and place in the graph."""
    return f"node '{node.name or f'{node.op_type}_{index}'}' ({node.op_type})"


def validate(model: onnx.ModelProto, where: str) -> onnx.ModelProto:
    """`model` if it is well formed, with its nodes sorted topologically (a copy only when they were
    not), else InputError in one line beginning with `where` (the file) and naming the node or tensor."""
    g = model.graph
    if not (g.node or g.input or g.output or model.opset_import):
        raise InputError(f"{where}: not an ONNX model (it holds no graph)")
    if not g.node:
        raise InputError(f"{where}: the graph has no nodes: nothing to compute")
    if g.sparse_initializer:
        raise InputError(
            f"{where}: sparse initializer '{g.sparse_initializer[0].values.name}' is not "
            "supported (store it dense)"
        )
    _check_names(g, where)
    for info in (*g.input, *g.output, *g.value_info):
        _check_value_type(info, where)
    for init in g.initializer:
        check_tensor(init, where, f"initializer '{init.name}'")
    for index, node in enumerate(g.node):
        _check_attributes(node, index, where)
    order = _topological_order(g, where)
    if order == list(range(len(g.node))):
        return model
    ordered = onnx.ModelProto()
    ordered.CopyFrom(model)
    del ordered.graph.node[:]
    ordered.graph.node.extend(g.node[i] for i in order)
    return ordered


def check(inferred: onnx.ModelProto, where: str) -> None:
    """onnx's checker on the shape-inferred model (inference gives every output the shape the checker
    wants), its message cut to one line."""
    try:
        onnx.checker.check_model(inferred)
    except (onnx.checker.ValidationError, ValueError) as err:
        text = " ".join(str(err).split())
        raise InputError(f"{where}: onnx's checker refuses the model: {text[:300]}") from None


def _check_names(g: onnx.GraphProto, where: str) -> None:
    for part in ("input", "output", "initializer"):
        for i, item in enumerate(getattr(g, part)):
            if not item.name:
                raise InputError(f"{where}: graph {part} {i} has an empty name")
    for index, node in enumerate(g.node):
        if not any(node.output):
            raise InputError(f"{where}: {label(node, index)} has no named output")


def _check_value_type(info: onnx.ValueInfoProto, where: str) -> None:
    if info.type.HasField("tensor_type"):
        elem = info.type.tensor_type.elem_type
        if elem not in onnx.TensorProto.DataType.values() or elem == onnx.TensorProto.UNDEFINED:
            raise InputError(f"{where}: tensor '{info.name}' has an undefined element type ({elem})")


def check_tensor(t: onnx.TensorProto, where: str, what: str) -> None:
    """InputError unless `t` is dense data of a supported type whose length matches its shape."""
    if t.data_type not in _CONSTANT_TYPES:
        name = (
            onnx.TensorProto.DataType.Name(t.data_type)
            if t.data_type in onnx.TensorProto.DataType.values()
            else f"undefined ({t.data_type})"
        )
        raise InputError(f"{where}: {what} has element type {name}, which xtune does not read")
    if any(d < 0 for d in t.dims):
        raise InputError(f"{where}: {what} has a negative dimension {tuple(t.dims)}")
    count = math.prod(t.dims)
    if t.data_location == onnx.TensorProto.EXTERNAL:
        raise InputError(f"{where}: {what} has external data that was not loaded")
    if t.HasField("raw_data"):
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
        got, want, unit = len(t.raw_data), count * itemsize, "bytes"
    else:
        got, want, unit = len(getattr(t, onnx.helper.tensor_dtype_to_field(t.data_type))), count, "values"
    if got != want:
        raise InputError(
            f"{where}: {what} of shape {tuple(t.dims)} holds {got} {unit} of data, its shape "
            f"and type need {want}"
        )


def _check_attributes(node: onnx.NodeProto, index: int, where: str) -> None:
    for a in node.attribute:
        if a.type in _REFUSED_ATTRIBUTES:
            raise InputError(
                f"{where}: {label(node, index)}: attribute '{a.name}' is "
                f"{_REFUSED_ATTRIBUTES[a.type]}, which xtune does not support"
            )
        tensors = [a.t] if a.type == _A.TENSOR else list(a.tensors) if a.type == _A.TENSORS else []
        for t in tensors:
            check_tensor(t, where, f"{label(node, index)}: attribute '{a.name}'")


def _topological_order(g: onnx.GraphProto, where: str) -> list[int]:
    """The nodes' indices in an order where each reads only tensors written before it, the graph's own
    order where it is one (Kahn's algorithm, lowest index first). Refused: a tensor written twice (or a
    graph input or initializer written), a tensor nothing provides, a cycle, an output not computed."""
    given = {i.name for i in g.input} | {i.name for i in g.initializer}
    producer: dict[str, int] = {}
    for index, node in enumerate(g.node):
        for out in filter(None, node.output):
            if out in given:
                raise InputError(
                    f"{where}: {label(node, index)} writes '{out}', a graph input or initializer"
                )
            if out in producer:
                first = label(g.node[producer[out]], producer[out])
                raise InputError(f"{where}: {label(node, index)} and {first} both write '{out}'")
            producer[out] = index
    waiting: list[set[int]] = []
    readers: dict[int, list[int]] = {}
    for index, node in enumerate(g.node):
        needs = set()
        for name in filter(None, node.input):
            if name in given:
                continue
            if name not in producer:
                raise InputError(
                    f"{where}: {label(node, index)} reads '{name}', which no node, graph "
                    "input or initializer provides"
                )
            needs.add(producer[name])
            readers.setdefault(producer[name], []).append(index)
        waiting.append(needs)
    order = _kahn(waiting, readers)
    if len(order) < len(g.node):
        stuck = min(set(range(len(g.node))) - set(order))
        raise InputError(
            f"{where}: {label(g.node[stuck], stuck)} is in a cycle: it depends on its own output"
        )
    initializers = {i.name for i in g.initializer}
    for out in g.output:
        if out.name in initializers:
            raise InputError(
                f"{where}: graph output '{out.name}' is an initializer (a constant), which no node computes"
            )
        if out.name not in producer and out.name not in given:
            raise InputError(f"{where}: graph output '{out.name}' is never produced by a node")
    return order


def _kahn(waiting: list[set[int]], readers: Mapping[int, list[int]]) -> list[int]:
    pending = [len(w) for w in waiting]
    ready = [i for i, n in enumerate(pending) if n == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for j in set(readers.get(i, [])):
            pending[j] -= 1
            if pending[j] == 0:
                heapq.heappush(ready, j)
    return order


def check_weights(nodes: Sequence[onnx.NodeProto], shapes: Mapping[str, tuple[int, ...]], where: str) -> None:
    """The weights of every Conv, Gemm and MatMul agree with what the node reads: a Conv's input channels
    are its weight's times `group` and its output channels a multiple of `group`, a bias has one value per
    output channel; Gemm and MatMul share their inner dimension (ONNX operator specs)."""
    for index, node in enumerate(nodes):
        dims = [shapes.get(t) if t else None for t in node.input]
        if node.op_type == "Conv" and len(dims) >= 2 and dims[0] and dims[1]:
            _check_conv(node, index, dims, where)
        elif node.op_type in ("Gemm", "MatMul") and len(dims) >= 2 and dims[0] and dims[1]:
            _check_inner(node, index, dims[0], dims[1], where)


def _check_conv(node: onnx.NodeProto, index: int, dims: list[tuple[int, ...] | None], where: str) -> None:
    x, w = dims[0], dims[1]
    assert x is not None and w is not None
    group = next((a.i for a in node.attribute if a.name == "group"), 1)
    fail = f"{where}: {label(node, index)}:"
    if len(w) != len(x) or len(w) < 3:
        raise InputError(f"{fail} weight shape {w} does not fit input shape {x}")
    if group < 1 or w[0] % group or x[1] != w[1] * group:
        raise InputError(
            f"{fail} the input has {x[1]} channels, the weight {w} with group {group} takes "
            f"{w[1] * group} (and needs output channels divisible by the group)"
        )
    kernel = next((tuple(a.ints) for a in node.attribute if a.name == "kernel_shape"), w[2:])
    if kernel != w[2:]:
        raise InputError(f"{fail} kernel_shape {kernel} is not the weight's {w[2:]}")
    bias = dims[2] if len(dims) > 2 else None
    if bias is not None and bias != (w[0],):
        raise InputError(f"{fail} the bias has shape {bias}, the weight {w[0]} output channels")


def _check_inner(
    node: onnx.NodeProto, index: int, a: tuple[int, ...], b: tuple[int, ...], where: str
) -> None:
    flags = {x.name: x.i for x in node.attribute}
    if node.op_type == "Gemm":
        if len(a) != 2 or len(b) != 2:
            raise InputError(f"{where}: {label(node, index)}: Gemm takes 2-D operands, not {a} and {b}")
        k_a = a[0] if flags.get("transA", 0) else a[1]
        k_b = b[1] if flags.get("transB", 0) else b[0]
    else:
        if not a or not b:
            raise InputError(f"{where}: {label(node, index)}: MatMul takes operands of rank 1 or more")
        k_a, k_b = a[-1], b[-2] if len(b) > 1 else b[0]
    if k_a != k_b:
        raise InputError(
            f"{where}: {label(node, index)}: the operands {a} and {b} do not share their inner dimension"
        )


def nonfinite(constants: Iterable[tuple[str, np.ndarray]]) -> list[tuple[str, int]]:
    """The floating-point constants holding NaN or infinity, each with how many such values."""
    found = []
    for name, value in constants:
        if value.dtype.kind == "f" and value.size:
            bad = int(value.size - np.count_nonzero(np.isfinite(value)))
            if bad:
                found.append((name, bad))
    return found
