"""The quantized rewrite's pools (xtune/frontend/quantized.py): a graph being rewritten (`Rewrite`) and the
index of an AveragePool or MaxPool between a DequantizeLinear and a QuantizeLinear in; that pool as one
pool over the 8-bit tensor out (xtune/ops/qpool.py computes each window), where it is exactly what the
model's reference computes, the float form kept otherwise."""

from __future__ import annotations

from dataclasses import replace

from xtune.frontend.qpattern import (
    Rewrite,
    activation_clamp,
    dequantized,
    drop_fused,
    only_reader,
    quantized_after,
    scalar_q,
    zero_name,
)
from xtune.graph import AttrValue, Node
from xtune.ops.pool2d import QLINEAR_POOL
from xtune.ops.quantize import RANGES

Writers = dict[str, int]
Readers = dict[str, list[int]]


def integer_average(edit: Rewrite, index: int, writers: Writers, readers: Readers) -> None:
    """DequantizeLinear -> AveragePool [-> Relu/Clip] -> QuantizeLinear as one QLinearAveragePool of the
    8-bit tensor (xtune/ops/qpool.py computes each reference's mean), where the reference runs it so:
    TFLite's int8 AVERAGE_POOL_2D, its input's scale and zero point its output's (TFLite's pooling
    Prepare wants the scales within 1e-6 and the zero points equal: tensorflow/lite/kernels/pooling.cc),
    the fused activation the clamp `out_lo`/`out_hi`; and ONNX Runtime's fusion of the pattern with
    nothing between the op and its QuantizeLinear, uint8 only (its UnaryNodeGroupSelector:
    onnxruntime/core/optimizer/qdq_transformer/selectors_actions/qdq_selectors.h). The rest stays in
    float form, as ONNX Runtime runs it too."""
    graph = edit.graph
    node = graph.nodes[index]
    dq = dequantized(graph, writers, node.inputs[0])
    after = quantized_after(graph, readers, node)
    if dq is None or after is None or graph.constant(dq.inputs[0]) is not None:
        return
    act, q = after
    x, y = scalar_q(graph, dq), scalar_q(graph, q)
    if x is None or y is None or x[2] != y[2]:
        return
    if edit.requant == "tflite":
        if x[1] != y[1] or abs(x[0] - y[0]) > 1e-6:
            return
        clamp = (
            activation_clamp(graph, act, y[0], y[1], y[2], edit.requant) if act is not None else RANGES[y[2]]
        )
    else:
        clamp = RANGES[y[2]] if act is None and y[2] == "uint8" else None
    if clamp is None:
        return
    attrs: dict[str, AttrValue] = dict(node.attrs)
    if edit.requant != "onnx":
        attrs["requant"] = edit.requant
    if clamp != RANGES[y[2]]:
        attrs |= {"out_lo": clamp[0], "out_hi": clamp[1]}
    inputs = (dq.inputs[0], dq.inputs[1], zero_name(edit, dq, x[2]), q.inputs[1], zero_name(edit, q, y[2]))
    edit.nodes[index] = Node(name=node.name, op=QLINEAR_POOL, inputs=inputs, outputs=q.outputs, attrs=attrs)
    drop_fused(edit, writers, act, q)


def integer_max(edit: Rewrite, index: int, writers: Writers, readers: Readers) -> None:
    """DequantizeLinear -> MaxPool [-> Relu/Clip] -> QuantizeLinear as a MaxPool of the 8-bit tensor.

    A maximum commutes with a dequantization, (q - zero) * scale being non-decreasing in q for a positive
    scale (float32 multiplication by a positive number is monotonic too): the float maximum of the
    dequantized pixels is the dequantized maximum of the stored ones. So where the QuantizeLinear has the
    DequantizeLinear's scale and zero point (ONNX Runtime's quantizer writes it so, and runs a uint8 one
    as an 8-bit MaxPool: its QDQ transformer's DropQDQNodesRules; an int8 one in float on x86-64, the
    same values; TFLite's pooling Prepare asks it of an int8 MAX_POOL_2D, within 1e-6 of scale), the
    pair is the identity on the maximum and the pool is one over
    the stored values; a fused Relu or Clip is the clamp `out_lo`/`out_hi` (each reference's rounding of
    its bounds, xtune/frontend/qpattern.py), TFLite's reference_integer_ops::MaxPool clamps alike.
    Otherwise (an ONNX model whose QuantizeLinear differs, or whose pooled tensor is read as float) the
    DequantizeLinear moves after the pool: the pool reads and writes 8-bit, and what followed reads the
    same float32 values as before (ONNX Runtime's float form, exactly)."""
    graph = edit.graph
    node = graph.nodes[index]
    dq = dequantized(graph, writers, node.inputs[0])
    if dq is None or graph.constant(dq.inputs[0]) is not None or any(node.outputs[1:]):
        return
    x = scalar_q(graph, dq)
    if x is None or x[0] <= 0:
        return
    after = quantized_after(graph, readers, node)
    clamp = _kept_encoding(edit, x, after)
    if after is not None and clamp is not None:
        act, q = after
        bounds: dict[str, AttrValue] = {"out_lo": clamp[0], "out_hi": clamp[1]}
        attrs = {**node.attrs, **(bounds if clamp != RANGES[x[2]] else {})}
        edit.nodes[index] = replace(node, inputs=(dq.inputs[0],), outputs=q.outputs, attrs=attrs)
        drop_fused(edit, writers, act, q)
    elif edit.requant == "onnx" and only_reader(graph, readers, dq.outputs[0]) is node:
        # TFLite's int8 MAX_POOL_2D of another output scale runs its integer kernel all the same, which
        # is neither form: that (invalid: Prepare's check) model keeps its float form.
        pooled = edit.tensor(f"{node.outputs[0]}.q", graph.shape(node.outputs[0]), x[2])
        edit.nodes[writers[dq.outputs[0]]] = replace(node, inputs=(dq.inputs[0],), outputs=(pooled,))
        edit.nodes[index] = replace(dq, inputs=(pooled, *dq.inputs[1:]), outputs=node.outputs)


def _kept_encoding(
    edit: Rewrite, x: tuple[float, int, str], after: tuple[Node | None, Node] | None
) -> tuple[int, int] | None:
    """The output clamp of a MaxPool whose QuantizeLinear (`after`, with the activation before it) keeps its
    input's encoding `x`; None where it does not (or the activation is not a clamp)."""
    if after is None:
        return None
    act, q = after
    y = scalar_q(edit.graph, q)
    if y is None or y[1:] != x[1:]:
        return None
    if y[0] != x[0] and (edit.requant != "tflite" or abs(x[0] - y[0]) > 1e-6):
        return None
    if act is None:
        return RANGES[y[2]]
    return activation_clamp(edit.graph, act, y[0], y[1], y[2], edit.requant)
