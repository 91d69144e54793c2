"""Quantized graphs: an imported `Graph` holding ONNX's QDQ form in, the same network with each quantized
Conv, MatMul and Gemm as one QOperator node out (`qoperators`), which the int8 families map; and the
scale and zero point of a tensor (`quantization`), which a network's header states for its input and
output.

ONNX Runtime's `quantize_static` (QDQ format) writes a quantized layer as
`DequantizeLinear(x_q) -> {Conv, MatMul, Gemm} -> QuantizeLinear`, its constant int8 weights behind their
own DequantizeLinear (per tensor, or per output channel with `axis`), the bias as int32 behind a
DequantizeLinear of scale x_scale * w_scale, and the ReLU it could not remove between the op and the
QuantizeLinear. ONNX Runtime's graph optimizer runs that pattern as one integer kernel (its
QDQSelectorActionTransformer: QLinearConv, QLinearMatMul, com.microsoft.QGemm); so does xtune:

- Conv becomes `QLinearConv(x_q, sx, zx, w_q, sw, zw, sy, zy, bias)` as ONNX defines it;
- MatMul and Gemm become `QLinearMatMul(x_q, sx, zx, w_q, sw, zw, sy, zy[, bias])`: a Gemm's transposed
  weights (transB=1) are transposed to (k, n) and its int32 bias is a ninth input, which ONNX's
  QLinearMatMul does not have: xtune's own convention, the same slot as QLinearConv's bias. ORT's
  QOperator form of a Gemm, com.microsoft.QGemm (alpha 1, a scale for its output), becomes the same node;
- a fused Relu or Clip between the op and its QuantizeLinear becomes the output clamp, the node's
  attributes `out_lo` and `out_hi` (quantized values, the output type's range when absent: also xtune's
  own convention), each bound zy + round(bound / sy) as QuantizeLinear would round it.

A view (Reshape, Flatten, ...) between a DequantizeLinear and a QuantizeLinear of one scale and zero point
becomes the view of the 8-bit tensor. A bias given as float (or as int32 of another scale) is requantized to
int32 of scale sx * sw, rounded half to even. What does not fit the pattern (weights with a zero point other
than 0, an output read by more than the QuantizeLinear, an attribute xtune's int8 kernels do not take, a
MatMul input of rank other than 2) stays as it is and runs in float32: DequantizeLinear of a constant is
folded into a float32 constant here (ONNX Runtime's arithmetic: (q - zero_point) * scale), and the
QuantizeLinear/DequantizeLinear between activations run as the generated operators of xtune/ops/quantize.py.
docs/int8.md is the user's view.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from xtune.frontend.qfloat import with_float_forms
from xtune.frontend.qpattern import (
    Requant,
    Rewrite,
    activation_clamp,
    dequantized,
    drop_fused,
    only_reader,
    quantized_after,
    scalar_q,
    zero_name,
    zero_point,
)
from xtune.frontend.qpools import integer_average, integer_max
from xtune.graph import AttrValue, Graph, Node
from xtune.ops.pool2d import QLINEAR_POOL
from xtune.ops.qpointwise import FLOAT_FORMS, QLINEAR_OF
from xtune.ops.quantize import RANGES
from xtune.ops.reshape import VIEWS

# The model property (ONNX ModelProto.metadata_props) by which an imported model says whose integer
# arithmetic its quantized nodes follow: "tflite" for the ONNX form of a TFLite file (xtune/frontend/
# tflite.py), absent for an ONNX model (ONNX Runtime's).
REQUANT_PROP = "xtune.requant"

_FLOAT_ON_X86 = ("com.microsoft.QLinearAdd", "com.microsoft.QLinearMul")
_QOPS = frozenset(("QuantizeLinear", "DequantizeLinear", "com.microsoft.QGemm", *FLOAT_FORMS))


def qoperators(graph: Graph, requant: Requant = "onnx") -> Graph:
    """`graph` with its quantized patterns as QOperator nodes and its constant DequantizeLinear folded
    (the graph itself when it holds no QuantizeLinear, DequantizeLinear or QGemm). `requant` is whose
    arithmetic the model's int8 nodes follow: ONNX Runtime's, or TFLite's for a model the TFLite import
    made (`REQUANT_PROP`); the QOperator nodes made of a TFLite model say so (`requant="tflite"`)."""
    if not any(n.op in _QOPS for n in graph.nodes):
        return graph
    graph = with_float_forms(graph)
    edit = Rewrite(
        requant=requant,
        graph=graph,
        nodes=list(graph.nodes),
        constants=dict(graph.constants),
        shapes=dict(graph.shapes),
        dtypes=dict(graph.dtypes),
    )
    writers, readers = graph.producers(), graph.consumers()
    for i, node in enumerate(graph.nodes):
        if node.op in ("Conv", "MatMul", "Gemm"):
            _fuse_qdq(edit, i, writers, readers)
        elif node.op == "AveragePool":
            integer_average(edit, i, writers, readers)
        elif node.op == "MaxPool":
            integer_max(edit, i, writers, readers)
        elif node.op == "com.microsoft.QGemm":
            _from_qgemm(edit, i)
        elif node.op in VIEWS:
            _view_of_integers(edit, i, writers, readers)
        elif node.op in QLINEAR_OF:
            _qlinear_pointwise(edit, i, writers, readers)
    _drop_unread(edit)
    _fold_constant_dequantize(edit)
    nodes = tuple(n for n in edit.nodes if n is not None)
    shapes = edit.shapes | {name: value.shape for name, value in edit.constants.items()}
    return replace(graph, nodes=nodes, constants=edit.constants, shapes=shapes, dtypes=edit.dtypes)


@dataclass(frozen=True)
class _Weights:
    """The int8 weights of a matched op in the layout its QOperator node takes, and their scale."""

    values: np.ndarray
    scale: np.ndarray  # float32, one per tensor or per output channel
    zero: np.ndarray


def _weights(graph: Graph, dq: Node, node: Node) -> _Weights | None:
    """The constant int8 weights behind `dq` for `node`, per tensor or per output channel, with zero
    points of 0 (xtune's int8 kernels take symmetric weights); None otherwise."""
    values, scale = graph.constant(dq.inputs[0]), graph.constant(dq.inputs[1])
    if values is None or scale is None or values.dtype != np.int8 or scale.dtype != np.float32:
        return None
    zero = zero_point(graph, dq, scale.size)
    if np.any(zero != 0):
        return None
    transposed = node.op == "Gemm" and node.int_attr("transB", 0) == 1
    channel_axis = 0 if node.op == "Conv" or transposed else values.ndim - 1
    axis = dq.int_attr("axis", 1) % values.ndim
    if scale.size != 1 and (axis != channel_axis or scale.size != values.shape[axis]):
        return None
    if node.op != "Conv" and values.ndim != 2:
        return None
    out = values.T.copy() if transposed else values
    return _Weights(values=out, scale=scale.reshape(-1), zero=np.zeros(scale.size, np.int8))


def _int32_bias(
    graph: Graph, bias: str, writers: dict[str, int], accumulator_scale: np.ndarray
) -> np.ndarray | None:
    """The int32 bias of scale sx * sw: a DequantizeLinear'd int32 constant of that scale as it is, any
    other constant bias requantized (round half to even)."""
    dq = dequantized(graph, writers, bias)
    if dq is not None:
        values, scale = graph.constant(dq.inputs[0]), graph.constant(dq.inputs[1])
        zero = zero_point(graph, dq, 1)
        assert values is not None and scale is not None
        if (
            values.dtype == np.int32
            and not np.any(zero)
            and np.array_equal(np.broadcast_to(scale.reshape(-1), accumulator_scale.shape), accumulator_scale)
        ):
            return values.reshape(-1)
        real = (values.astype(np.float64) - zero.astype(np.float64)) * scale.astype(np.float64)
    else:
        const = graph.constant(bias)
        if const is None or not np.issubdtype(const.dtype, np.floating):
            return None
        real = const.astype(np.float64)
    quantized = np.rint(real.reshape(-1) / accumulator_scale.astype(np.float64))
    if np.any(np.abs(quantized) >= 2**31):
        return None
    return quantized.astype(np.int32)


def _pattern(
    graph: Graph, node: Node, writers: dict[str, int], readers: dict[str, list[int]]
) -> tuple[Node, Node, Node | None, Node] | None:
    """The DequantizeLinear of `node`'s input and weights, the Relu or Clip after it (or None) and the
    QuantizeLinear of its output, if `node` stands in the QDQ pattern xtune's int8 kernels take."""
    if node.op == "Gemm" and (
        node.int_attr("transA", 0) != 0
        or node.float_attr("alpha", 1.0) != 1.0
        or node.float_attr("beta", 1.0) != 1.0
    ):
        return None
    dx, dw = (dequantized(graph, writers, t) for t in node.inputs[:2])
    if dx is None or dw is None or graph.constant(dx.inputs[0]) is not None:
        return None
    if node.op != "Conv" and len(graph.shapes.get(dx.inputs[0], ())) != 2:
        return None  # the int8 matmul takes rank 2: a batched MatMul runs in float32
    after = quantized_after(graph, readers, node)
    return (dx, dw, *after) if after is not None else None


def _fuse_qdq(edit: Rewrite, index: int, writers: dict[str, int], readers: dict[str, list[int]]) -> None:
    """DequantizeLinear -> op [-> Relu/Clip] -> QuantizeLinear at `index`, as one QOperator node."""
    graph = edit.graph
    node = graph.nodes[index]
    matched = _pattern(graph, node, writers, readers)
    if matched is None:
        return
    dx, dw, act, q = matched
    x = scalar_q(graph, dx)
    weights = _weights(graph, dw, node)
    if x is None or weights is None:
        return
    y = scalar_q(graph, q)
    if y is None or y[2] != x[2]:
        return
    clamp = activation_clamp(graph, act, y[0], y[1], y[2], edit.requant) if act is not None else RANGES[y[2]]
    accumulator_scale = np.float32(x[0]) * weights.scale.astype(np.float32)
    bias = node.inputs[2] if len(node.inputs) > 2 else ""
    int32 = _int32_bias(graph, bias, writers, accumulator_scale) if bias else None
    if clamp is None or (bias and int32 is None):
        return
    name = node.name
    inputs = [
        dx.inputs[0],
        dx.inputs[1],
        zero_name(edit, dx, x[2]),
        edit.constant(f"{name}.weights_q", weights.values),
        edit.constant(f"{name}.weights_scale", weights.scale),
        edit.constant(f"{name}.weights_zero", weights.zero),
        q.inputs[1],
        zero_name(edit, q, y[2]),
    ]
    if int32 is not None:
        inputs.append(edit.constant(f"{name}.bias_q", int32))
    attrs: dict[str, AttrValue] = {k: v for k, v in node.attrs.items() if node.op == "Conv"}
    if clamp != RANGES[y[2]]:
        attrs |= {"out_lo": clamp[0], "out_hi": clamp[1]}
    if edit.requant != "onnx":
        attrs |= {"requant": edit.requant}
    op = "QLinearConv" if node.op == "Conv" else "QLinearMatMul"
    edit.nodes[index] = Node(name=name, op=op, inputs=tuple(inputs), outputs=q.outputs, attrs=attrs)
    drop_fused(edit, writers, act, q)


def _view_of_integers(
    edit: Rewrite, index: int, writers: dict[str, int], readers: dict[str, list[int]]
) -> None:
    """DequantizeLinear -> view (Reshape, Flatten, ...) -> QuantizeLinear of the same scale and zero point
    (ORT's quantizer wraps a view so): the view of the 8-bit tensor itself. The pair is the identity on
    the integers ((q - z) * s / s rounds back to q - z), so dropping it changes no value."""
    graph = edit.graph
    node = graph.nodes[index]
    dq = dequantized(graph, writers, node.inputs[0])
    q = only_reader(graph, readers, node.outputs[0])
    if dq is None or q is None or q.op != "QuantizeLinear" or graph.constant(dq.inputs[0]) is not None:
        return
    if scalar_q(graph, dq) is None or scalar_q(graph, dq) != scalar_q(graph, q):
        return
    edit.nodes[index] = replace(node, inputs=(dq.inputs[0], *node.inputs[1:]), outputs=q.outputs)
    drop_fused(edit, writers, q)


def _qlinear_pointwise(
    edit: Rewrite, index: int, writers: dict[str, int], readers: dict[str, list[int]]
) -> None:
    """DequantizeLinear of each activation -> Add, Mul, GlobalAveragePool, Sigmoid or LeakyRelu ->
    QuantizeLinear, per tensor: ONNX Runtime's QOperator node of it (QLinearAdd, ...), which
    xtune/ops/qpointwise.py runs as one kernel reading and writing the 8-bit tensors. A TFLite model's
    nodes are marked `requant="tflite"` (its GlobalAveragePool, a MEAN over H and W: TFLite's integer
    MEAN; the others keep the float form), an int8 Add or Mul of an ONNX model `requant="float"`."""
    graph = edit.graph
    node = graph.nodes[index]
    op = QLINEAR_OF[node.op]
    dqs = [dequantized(graph, writers, t) for t in node.inputs]
    q = only_reader(graph, readers, node.outputs[0])
    if len(dqs) != FLOAT_FORMS[op][1] or q is None or q.op != "QuantizeLinear" or scalar_q(graph, q) is None:
        return
    inputs: list[str] = []
    for dq in dqs:
        if dq is None or graph.constant(dq.inputs[0]) is not None or scalar_q(graph, dq) is None:
            return
        inputs += [dq.inputs[0], dq.inputs[1], zero_name(edit, dq, graph.dtype(dq.inputs[0]))]
    inputs += [q.inputs[1], zero_name(edit, q, graph.dtype(q.outputs[0]))]
    attrs: dict[str, AttrValue] = {k: v for k, v in node.attrs.items() if k == "alpha"}
    if edit.requant != "onnx":  # whose arithmetic the kernel keeps (xtune/ops/qpointwise.py)
        attrs["requant"] = edit.requant
    elif op in _FLOAT_ON_X86 and graph.dtype(q.outputs[0]) == "int8":
        # ONNX Runtime's x86-64 build fuses int8 QDQ groups only where its selector allows int8
        # (onnxruntime/core/optimizer/qdq_transformer/selectors_actions/qdq_selector_action_transformer.h,
        # QDQIsInt8Allowed: ARM only); measured, an int8 Add or Mul stays DequantizeLinear, the float
        # operator, QuantizeLinear there: the float form's arithmetic, not QLinearAdd's. A build for a
        # target whose ONNX Runtime fuses it (ARM) runs the QLinearAdd (xtune/ops/qmlas.py, fuses_int8_qdq).
        attrs["requant"] = "float"
    edit.nodes[index] = Node(name=node.name, op=op, inputs=tuple(inputs), outputs=q.outputs, attrs=attrs)
    drop_fused(edit, writers, q)


def _from_qgemm(edit: Rewrite, index: int) -> None:
    """com.microsoft.QGemm (alpha 1, transA 0, an output scale) as QLinearMatMul with its bias."""
    graph = edit.graph
    node = graph.nodes[index]
    if (
        node.int_attr("transA", 0) != 0
        or node.float_attr("alpha", 1.0) != 1.0
        or len(node.inputs) < 9
        or not node.inputs[7]
    ):
        return
    a, sa, za, b, sb, zb, c, sy, zy = node.inputs[:9]
    weights, zero = graph.constant(b), graph.constant(zy)
    if weights is None or weights.ndim != 2 or zero is None or len(graph.shapes.get(a, ())) != 2:
        return
    if node.int_attr("transB", 0):
        weights = weights.T.copy()
        b = edit.constant(f"{node.name}.weights_q", weights)
    # onnx's shape inference does not know com.microsoft's operators: the output is (m, n), zy's type.
    edit.shapes[node.outputs[0]] = (graph.shape(a)[0], weights.shape[1])
    edit.dtypes[node.outputs[0]] = str(zero.dtype)
    inputs = (a, sa, za, b, sb, zb, sy, zy, *((c,) if c else ()))
    edit.nodes[index] = Node(name=node.name, op="QLinearMatMul", inputs=inputs, outputs=node.outputs)


def _drop_unread(edit: Rewrite) -> None:
    """DequantizeLinear nodes nobody reads any more (the ones the rewrites replaced)."""
    read = {t for n in edit.nodes if n is not None for t in n.inputs} | set(edit.graph.outputs)
    for i, node in enumerate(edit.nodes):
        if node is not None and node.op == "DequantizeLinear" and node.outputs[0] not in read:
            edit.nodes[i] = None


def _fold_constant_dequantize(edit: Rewrite) -> None:
    """DequantizeLinear of a constant as the float32 constant ONNX Runtime computes: (q - zero) * scale,
    the difference in int32, the product in float32, per tensor or along `axis`."""
    for i, node in enumerate(edit.nodes):
        if node is None or node.op != "DequantizeLinear" or node.outputs[0] in edit.graph.outputs:
            continue
        values, scale = (edit.constants.get(t) for t in node.inputs[:2])
        if values is None or scale is None:
            continue
        zero = zero_point(edit.graph, node, scale.size)
        if values.ndim and scale.size > 1:
            shape = [1] * values.ndim
            shape[node.int_attr("axis", 1) % values.ndim] = scale.size
            scale, zero = scale.reshape(shape), zero.reshape(shape)
        diff = values.astype(np.int32) - zero.astype(np.int32)
        edit.constants[node.outputs[0]] = (diff.astype(np.float32) * scale.astype(np.float32)).astype(
            np.float32
        )
        edit.nodes[i] = None


# Where a node keeps the (scale, zero point) of the tensor it reads as input 0 and of the one it writes;
# ONNX Runtime's QOperator element-wise nodes hold each 8-bit input's, then the output's.
_READ_QUANT = {
    "QuantizeLinear": 1,
    "DequantizeLinear": 1,
    "QLinearMatMul": 1,
    "QLinearConv": 1,
    QLINEAR_POOL: 1,
    **{op: 1 for op in FLOAT_FORMS},
}
_WRITE_QUANT = {
    "QuantizeLinear": 1,
    "DequantizeLinear": 1,
    "QLinearMatMul": 6,
    "QLinearConv": 6,
    QLINEAR_POOL: 3,
    **{op: 3 * inputs for op, (_, inputs) in FLOAT_FORMS.items()},
}


def quantization(graph: Graph, tensor: str) -> tuple[float, int] | None:
    """The scale and zero point of `tensor` (per tensor): those of the node that writes it, or of its
    first reader; None if neither is a quantizing node."""
    writer = graph.producers().get(tensor)
    candidates = [(graph.nodes[writer], _WRITE_QUANT)] if writer is not None else []
    readers = [graph.nodes[i] for i in graph.consumers().get(tensor, [])[:1]]
    if readers and readers[0].op in (*VIEWS, "Transpose") and graph.dtype(tensor) != "float32":
        return quantization(graph, readers[0].outputs[0])  # its bytes moved (a TFLite int8 input's)
    candidates += [(node, _READ_QUANT) for node in readers]
    for node, where in candidates:
        at = where.get(node.op)
        if at is None or (where is _READ_QUANT and node.inputs[0] != tensor) or len(node.inputs) <= at:
            continue
        scale = graph.constant(node.inputs[at])
        zero_name = node.inputs[at + 1] if len(node.inputs) > at + 1 else ""
        zero = graph.constant(zero_name) if zero_name else np.zeros(1, np.uint8)
        if scale is not None and zero is not None and scale.size == 1 and zero.size == 1:
            return float(scale.reshape(-1)[0]), int(zero.reshape(-1)[0])
    return None
