"""ONNX Runtime's QOperator element-wise and pooling nodes (com.microsoft QLinearAdd, QLinearMul,
QLinearGlobalAveragePool, QLinearSigmoid, QLinearLeakyRelu) with a constant 8-bit operand in, their float
form out (`with_float_forms`): DequantizeLinear of each 8-bit input (a constant one folded to float32 by
the import), the float32 operator, QuantizeLinear of its result, which xtune runs with its generated
operators. Those of activations only stay as they are: xtune/ops/qpointwise.py runs each as one kernel
(and the QDQ form of the same node becomes it: xtune/frontend/quantized.py).

ONNX Runtime computes these nodes with MLAS's own float formulas (MlasQLinearAdd: the inputs scaled by
a_scale / c_scale and b_scale / c_scale and added, then rounded), so the float form is not bit for bit
theirs: an output can differ by one quantization step where the two roundings fall on either side of a
half; docs/int8.md, "Exactness", says how often. Also the output shapes of these nodes, and of QGemm,
and QLinearAveragePool (which xtune runs as the 8-bit pool of xtune/ops/qpool.py, not in float form),
which onnx's shape inference does not know (`contrib_shapes`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np
import onnx

from xtune.graph import Graph, Node
from xtune.ops.qpointwise import FLOAT_FORMS

Dims = list[int]


def _broadcast(shapes: list[Dims], attrs: dict[str, object]) -> Dims:
    return list(np.broadcast_shapes(*(tuple(s) for s in shapes)))


def _pooled(shapes: list[Dims], attrs: dict[str, object]) -> Dims:
    n, *rest = shapes[0]
    return [n, 1, 1, rest[-1]] if attrs.get("channels_last", 0) else [n, rest[0], *([1] * (len(rest) - 1))]


def _windowed(shapes: list[Dims], attrs: dict[str, object]) -> Dims:
    """A pool's output shape (ONNX operator spec, AveragePool: auto_pad, pads, ceil_mode)."""
    n, *dims = shapes[0]
    c, spatial = (dims[-1], dims[:-1]) if attrs.get("channels_last", 0) else (dims[0], dims[1:])
    kernel = list(attrs["kernel_shape"])  # type: ignore[call-overload]
    strides = list(attrs.get("strides", [1] * len(kernel)))  # type: ignore[call-overload]
    pads = list(attrs.get("pads", [0] * 2 * len(kernel)))  # type: ignore[call-overload]
    auto = attrs.get("auto_pad", b"NOTSET")
    out = []
    for i, (size, k, s) in enumerate(zip(spatial, kernel, strides, strict=True)):
        if auto in (b"SAME_UPPER", b"SAME_LOWER"):
            out.append(-(-size // s))
        elif auto == b"VALID":
            out.append(-(-(size - k + 1) // s))
        else:
            span = size + pads[i] + pads[i + len(kernel)] - k
            out.append((-(-span // s) if attrs.get("ceil_mode", 0) else span // s) + 1)
    return [n, *out, c] if attrs.get("channels_last", 0) else [n, c, *out]


def _gemm(shapes: list[Dims], attrs: dict[str, object]) -> Dims:
    a, b = shapes[0], shapes[1]
    return [a[1] if attrs.get("transA", 0) else a[0], b[0] if attrs.get("transB", 0) else b[1]]


# com.microsoft op -> (its shaped inputs, the output's shape from theirs, the index of its output zero point)
_SHAPES: dict[str, tuple[tuple[int, ...], Callable[[list[Dims], dict[str, object]], Dims], int]] = {
    "QGemm": ((0, 3), _gemm, 8),
    "QLinearAdd": ((0, 3), _broadcast, 7),
    "QLinearMul": ((0, 3), _broadcast, 7),
    "QLinearGlobalAveragePool": ((0,), _pooled, 4),
    "QLinearAveragePool": ((0,), _windowed, 4),
    "QLinearSigmoid": ((0,), lambda s, a: s[0], 4),
    "QLinearLeakyRelu": ((0,), lambda s, a: s[0], 4),
}


def contrib_shapes(
    model: onnx.ModelProto, infer: Callable[[onnx.ModelProto], onnx.ModelProto]
) -> onnx.ModelProto:
    """`model` with the output types and shapes of its com.microsoft quantized nodes declared (onnx's shape
    inference does not know com.microsoft's operators, and stops at them), each from its inputs' shapes
    as `infer` finds them (ORT's contrib operator docs), of its output zero point's type."""
    nodes = [n for n in model.graph.node if n.domain == "com.microsoft" and n.op_type in _SHAPES]
    if not nodes:
        return model
    model = _copy(model)
    for _ in nodes:  # one more known per round at least, in a chain of them
        known = {i.name: i for i in (*infer(model).graph.value_info, *model.graph.input)}
        consts = {i.name: i for i in model.graph.initializer}
        added = False
        for node in nodes:
            shaped, rule, zero_at = _SHAPES[node.op_type]
            inputs = [node.input[i] for i in shaped]
            if node.output[0] in known or not all(t in known or t in consts for t in inputs):
                continue
            attrs = {x.name: onnx.helper.get_attribute_value(x) for x in node.attribute}
            dims = rule([_dims(t, known, consts) for t in inputs], attrs)
            zero = consts.get(node.input[zero_at]) if len(node.input) > zero_at else None
            elem = zero.data_type if zero is not None else onnx.TensorProto.FLOAT
            model.graph.value_info.append(onnx.helper.make_tensor_value_info(node.output[0], elem, dims))
            added = True
        if not added:
            break
    return model


def _dims(tensor: str, known: dict[str, onnx.ValueInfoProto], consts: dict[str, onnx.TensorProto]) -> Dims:
    if tensor in consts:
        return list(consts[tensor].dims)
    return [d.dim_value for d in known[tensor].type.tensor_type.shape.dim]


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def float_forms(
    graph: Graph, fresh: Callable[[str, np.ndarray | None], str]
) -> tuple[list[Node], dict[str, tuple[int, ...]]]:
    """The nodes of `graph` with each QOperator node of FLOAT_FORMS replaced by its float form, and the
    shapes of the float tensors that form adds. `fresh(name, value)` makes a unique tensor name (a
    constant of `value` when one is given: the 8-bit zero point an omitted input stands for)."""
    nodes: list[Node] = []
    shapes: dict[str, tuple[int, ...]] = {}
    for node in graph.nodes:
        form = FLOAT_FORMS.get(node.op)
        if form is None or not any(graph.constant(node.inputs[3 * i]) is not None for i in range(form[1])):
            nodes.append(node)  # one kernel of the 8-bit activations: xtune/ops/qpointwise.py
            continue
        op, count = form
        floats = []
        for i in range(count):
            x, scale, zero = (*node.inputs[3 * i : 3 * i + 3], "")[:3]
            kind = graph.dtype(x)
            zero = zero or fresh(f"{node.name}.zero{i}", np.zeros((), np.dtype(kind)))
            real = fresh(f"{node.name}.input{i}", None)
            shapes[real] = graph.shape(x)
            nodes.append(Node(name=real, op="DequantizeLinear", inputs=(x, scale, zero), outputs=(real,)))
            floats.append(real)
        out = node.outputs[0]
        scale, zero = (*node.inputs[3 * count : 3 * count + 2], "")[:2]
        zero = zero or fresh(f"{node.name}.zero", np.zeros((), np.dtype(graph.dtype(out))))
        result = fresh(f"{node.name}.float", None)
        shapes[result] = graph.shape(out)
        attrs = {k: v for k, v in node.attrs.items() if k == "alpha"}
        nodes.append(
            Node(name=f"{node.name}.op", op=op, inputs=tuple(floats), outputs=(result,), attrs=attrs)
        )
        nodes.append(Node(name=node.name, op="QuantizeLinear", inputs=(result, scale, zero), outputs=(out,)))
    return nodes, shapes


def with_float_forms(graph: Graph) -> Graph:
    """`graph` with ORT's QOperator element-wise nodes of a constant operand in their float form."""
    constants, taken = dict(graph.constants), set(graph.shapes) | set(graph.constants)

    def fresh(name: str, value: np.ndarray | None) -> str:
        unique, i = name, 0
        while unique in taken:
            i += 1
            unique = f"{name}.{i}"
        taken.add(unique)
        if value is not None:
            constants[unique] = value
        return unique

    nodes, shapes = float_forms(graph, fresh)
    if len(nodes) == len(graph.nodes):
        return graph
    all_shapes = {**graph.shapes, **shapes, **{n: v.shape for n, v in constants.items()}}
    return replace(graph, nodes=tuple(nodes), constants=constants, shapes=all_shapes)
