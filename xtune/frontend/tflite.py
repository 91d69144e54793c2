"""The TFLite front end: a .tflite file (path or bytes) in, an onnx.ModelProto out that computes the same
function, so that every later pass, task extraction, build and check takes it as it takes an ONNX file.

The model keeps the input and output TFLite declares (NHWC, int8 where quantized): 4-D tensors are
converted to ONNX's NCHW at the boundary (tflite_emit.py says how), weights are rearranged at import,
and quantized tensors become ONNX QDQ (DequantizeLinear on constants, QuantizeLinear/DequantizeLinear
on activations). What cannot be imported is refused once, naming every unsupported operator with its
count; a file that is not a valid TFLite model is one InputError line.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, shape_inference

from xtune.errors import InputError
from xtune.frontend.quantized import REQUANT_PROP
from xtune.frontend.tflite_emit import TO_NCHW, TO_NHWC, Emitter, nchw
from xtune.frontend.tflite_file import TflModel, read_tflite
from xtune.frontend.tflite_ops import CONVERTERS

OPSET = 17  # HardSwish is opset 14; DequantizeLinear's axis (per-channel) opset 13
IR_VERSION = 8  # opset 17's IR version (onnx/docs/Versioning.md)


def load_tflite(path: str | os.PathLike[str]) -> onnx.ModelProto:
    """The ONNX model of the TFLite file at `path`, or one InputError naming the file."""
    try:
        data = Path(path).read_bytes()
    except OSError as err:
        raise InputError(f"{path}: cannot read the TFLite file ({err.strerror})") from None
    return tflite_to_onnx(data, str(path))


SHOWN = 3  # operator indices a refusal shows per operator kind


def unsupported(model: TflModel) -> dict[str, list[int]]:
    """Every operator of `model` that xtune cannot import: its kind -> the indices of its operators, in
    the order each kind first appears."""
    found: dict[str, list[int]] = {}
    for op in model.ops:
        if op.op not in CONVERTERS:
            found.setdefault(op.op, []).append(op.index)
    return found


def refusal(where: str, found: dict[str, list[int]]) -> InputError:
    """One line naming every operator xtune cannot import, by kind with its count (the style of the ONNX
    importer's refusal), and what would help where something would."""
    parts = []
    for op, indices in found.items():
        shown = ", ".join(str(i) for i in indices[:SHOWN])
        more = f" and {len(indices) - SHOWN} more" if len(indices) > SHOWN else ""
        hint = _hint(op)
        plural = "s" if len(indices) > 1 else ""
        parts.append(f"{op} ×{len(indices)} (operator{plural} {shown}{more})" + (f": {hint}" if hint else ""))
    total = sum(len(i) for i in found.values())
    kinds = f"{len(found)} kind{'s' if len(found) > 1 else ''}"
    return InputError(
        f"{where}: xtune cannot import {total} TFLite operator{'s' if total > 1 else ''} "
        f"({kinds}): " + "; ".join(parts)
    )


def _hint(op: str) -> str:
    if op.startswith("CUSTOM:Flex"):
        return "a TensorFlow op (Flex delegate): convert with TFLite builtins only"
    if op.startswith("CUSTOM:"):
        return "a custom operator: convert with TFLite builtins only"
    return ""


def dynamic_range(data: bytes, where: str = "model.tflite") -> bool:
    """Whether float operators of the model read integer weights (TFLite's dynamic-range quantization).
    The import dequantizes them (the model's meaning); LiteRT's kernels instead quantize the activations
    on the fly, so its outputs are off by that rounding (docs/networks.md, "TFLite")."""
    model = read_tflite(data, where)
    for op in model.ops:
        if op.op == "DEQUANTIZE" or not op.outputs or model.tensors[op.outputs[0]].quant is not None:
            continue
        for i in op.inputs:
            t = model.tensors[i] if i >= 0 else None
            if t is not None and t.data is not None and t.quant is not None and t.dtype.kind in "iu":
                return True
    return False


def tflite_to_onnx(data: bytes, where: str = "model.tflite") -> onnx.ModelProto:
    """The ONNX model of a TFLite file's bytes (`where` names it in errors)."""
    model = read_tflite(data, where)
    missing = unsupported(model)
    if missing:
        raise refusal(where, missing)
    em = Emitter(model)
    try:
        inputs = [_input(em, i) for i in model.inputs]
        for op in model.ops:
            em.op = op
            CONVERTERS[op.op](em, op)
        em.op = None
        outputs = [_output(em, i) for i in model.outputs]
    except InputError:
        raise
    except Exception as err:  # numpy on data the file's own shapes contradict: a malformed file
        raise em.fail(f"malformed operands ({type(err).__name__}: {err})") from None
    nodes = em.live_nodes([o.name for o in outputs])
    graph = helper.make_graph(nodes, Path(where).stem or "tflite", inputs, outputs, em.initializers)
    result = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="xtune")
    result.ir_version = IR_VERSION
    # Its quantized layers are TFLite's: the rewrite of their QDQ form gives them TFLite's requantization.
    helper.set_model_props(result, {REQUANT_PROP: "tflite"})
    _check(em, result)
    return result


def _declared(em: Emitter, index: int, name: str) -> onnx.ValueInfoProto:
    t = em.tensor(index)
    return helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(t.dtype), list(t.shape))


def _input(em: Emitter, index: int) -> onnx.ValueInfoProto:
    """A graph input in TFLite's declared type and order; its float value in ONNX's order."""
    t = em.tensor(index)
    if t.data is not None:
        raise em.fail(f"input '{t.label}' is a constant")
    name = em.fresh(t.name)
    value = name
    if t.quant is None and t.dtype != np.float32:
        raise em.fail(f"input '{t.label}' is {t.dtype} without quantization parameters")
    if len(t.shape) == 4:  # a quantized one's integers reordered (a renaming in an NHWC network)
        value = em.reorder(value, t.shape, TO_NCHW)
    if t.quant is not None:
        # The integers, then their float value: the first layer then stands in the QDQ pattern that
        # makes an int8 kernel of it (xtune/frontend/quantized.py).
        em.integers[index] = value
        value = em.dequantize_input(value, t)
    em.values[index] = value
    return _declared(em, index, name)


def _output(em: Emitter, index: int) -> onnx.ValueInfoProto:
    """A graph output named as TFLite names it, in its declared type and order."""
    t = em.tensor(index)
    if index not in em.values or t.data is not None:
        raise em.fail(f"output '{t.label}' is not computed by any operator")
    value = em.integers.get(index, em.values[index])
    if len(t.shape) == 4:
        value = em.reorder(value, nchw(t.shape), TO_NHWC)
    name = em.fresh(t.name)
    _rename(em.nodes, value, name)
    return _declared(em, index, name)


def _rename(nodes: list[onnx.NodeProto], old: str, new: str) -> None:
    """Tensor `old` called `new` everywhere (an output keeps its TFLite name, with no copy node)."""
    for node in nodes:
        for i, name in enumerate(node.output):
            if name == old:
                node.output[i] = new
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new


def _check(em: Emitter, model: onnx.ModelProto) -> None:
    """ONNX's checker and strict shape inference on the result, and every tensor's inferred shape
    against the shape TFLite declares: a TFLite file whose shapes contradict its operators is refused
    here, naming the tensor."""
    try:
        onnx.checker.check_model(model)
        inferred = shape_inference.infer_shapes(model, strict_mode=True)
    except Exception as err:  # onnx's ValidationError, InferenceError: the file's operators disagree
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise InputError(f"{em.model.name}: the TFLite model is inconsistent: {first}") from None
    shapes = {
        info.name: tuple(d.dim_value for d in info.type.tensor_type.shape.dim)
        for info in (*inferred.graph.value_info, *inferred.graph.output)
    }
    for index, name in em.values.items():
        t = em.tensor(index)
        got = shapes.get(name)
        if t.data is None and got is not None and got != nchw(t.shape):
            raise InputError(
                f"{em.model.name}: tensor '{t.label}' is declared {t.shape}, its operator computes "
                f"{got} (in NCHW order)"
            )
