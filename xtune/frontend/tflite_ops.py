"""TFLite builtin operators as ONNX nodes: one converter per builtin (`CONVERTERS`), an operator and the
`Emitter` of its model in, the ONNX nodes that compute its output appended and that output stored.

Semantics follow TFLite's reference kernels (tensorflow/lite/kernels/internal/reference/): filters are
OHWI for CONV_2D and [1, H, W, C*M] for DEPTHWISE_CONV_2D (ONNX: OIHW, and (C*M, 1, H, W) with group C);
FULLY_CONNECTED's weights are [out, in] and its input is flattened to rows of `in` in TFLite's order;
padding SAME makes the output ceil(in / stride) with the odd pixel of padding at the end (bottom, right),
as TensorFlow's `GetWindowedOutputSizeVerbose` computes it; AVERAGE_POOL_2D divides by the pixels inside
the input (ONNX's count_include_pad=0); SOFTMAX is exp(beta * x) normalized along the last axis.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from xtune.frontend.tflite_emit import TO_NCHW, TO_NHWC, Emitter, dequantized, nchw
from xtune.frontend.tflite_file import TflOp

Converter = Callable[[Emitter, TflOp], None]
SAME, VALID = 0, 1  # schema.fbs, `enum Padding`
NHWC_TO_NCHW_AXIS = (0, 2, 3, 1)  # where NHWC axis a is in NCHW


def _int(op: TflOp, key: str) -> int:
    return int(op.options[key])


def pads(
    size: tuple[int, int],
    window: tuple[int, int],
    stride: tuple[int, int],
    dilation: tuple[int, int],
    padding: int,
) -> list[int]:
    """ONNX pads (top, left, bottom, right) for TFLite's padding of a window over `size` (h, w)."""
    if padding == VALID:
        return [0, 0, 0, 0]
    begin, end = [], []
    for n, k, s, d in zip(size, window, stride, dilation, strict=True):
        out = -(-n // s)
        total = max((out - 1) * s + (k - 1) * d + 1 - n, 0)
        begin.append(total // 2)
        end.append(total - total // 2)
    return begin + end


def _geometry(em: Emitter, op: TflOp, x: int, window: tuple[int, int]) -> dict[str, object]:
    if _int(op, "Padding") not in (SAME, VALID):
        raise em.fail(f"padding {op.options['Padding']} is neither SAME nor VALID")
    stride = (_int(op, "StrideH"), _int(op, "StrideW"))
    dilation = (
        (_int(op, "DilationHFactor"), _int(op, "DilationWFactor"))
        if "DilationHFactor" in op.options
        else (1, 1)
    )
    if min(*stride, *dilation, *window) < 1:
        raise em.fail(f"strides {stride}, dilations {dilation} and window {window} must be positive")
    shape = em.tensor(x).shape
    if len(shape) != 4:
        raise em.fail(f"the input has shape {shape}; a 2-D window needs a 4-D NHWC input")
    return {
        "strides": list(stride),
        "pads": pads(shape[1:3], window, stride, dilation, _int(op, "Padding")),
        **({"dilations": list(dilation)} if "DilationHFactor" in op.options else {}),
    }


def _operands(em: Emitter, op: TflOp, count: int) -> tuple[int, ...]:
    present = tuple(i for i in op.inputs[:count])
    if len(op.inputs) < count or any(i < 0 for i in present) or len(op.outputs) != 1:
        raise em.fail(f"expects {count} inputs and 1 output, has {op.inputs} -> {op.outputs}")
    return present


def _bias(em: Emitter, op: TflOp, x: int, w: int) -> list[str]:
    if len(op.inputs) < 3 or op.inputs[2] < 0:
        return []
    return [em.bias(op.inputs[2], x, w)]


def conv_2d(em: Emitter, op: TflOp) -> None:
    x, w = _operands(em, op, 2)
    filt = em.constant_data(w)  # OHWI
    c = em.tensor(x).shape[-1] if len(em.tensor(x).shape) == 4 else -1
    if filt.ndim != 4 or c % filt.shape[3] != 0:
        raise em.fail(f"filter of shape {filt.shape} for an input of {c} channels")
    attrs = _geometry(em, op, x, (filt.shape[1], filt.shape[2]))
    weights = em.weights(w, filt.transpose(TO_NCHW), 0, x)
    y = em.node(
        "Conv",
        [em.value(x), weights, *_bias(em, op, x, w)],
        em.tensor(op.outputs[0]).name,
        group=c // filt.shape[3],
        kernel_shape=[filt.shape[1], filt.shape[2]],
        **attrs,
    )
    em.store(op.outputs[0], em.activation(y, _int(op, "FusedActivationFunction")))


def depthwise_conv_2d(em: Emitter, op: TflOp) -> None:
    x, w = _operands(em, op, 2)
    filt = em.constant_data(w)  # [1, H, W, C*M]
    c = em.tensor(x).shape[-1] if len(em.tensor(x).shape) == 4 else -1
    if filt.ndim != 4 or filt.shape[0] != 1 or c < 1 or filt.shape[3] % c != 0:
        raise em.fail(f"depthwise filter of shape {filt.shape} for an input of {c} channels")
    multiplier = _int(op, "DepthMultiplier")
    if multiplier not in (0, filt.shape[3] // c):  # 0: older converters left it unset
        raise em.fail(f"depth_multiplier {multiplier}, but the filter has {filt.shape[3]} of {c} channels")
    attrs = _geometry(em, op, x, (filt.shape[1], filt.shape[2]))
    weights = em.weights(w, filt[0].transpose(2, 0, 1)[:, None], 0, x)  # (C*M, 1, H, W)
    y = em.node(
        "Conv",
        [em.value(x), weights, *_bias(em, op, x, w)],
        em.tensor(op.outputs[0]).name,
        group=c,
        kernel_shape=[filt.shape[1], filt.shape[2]],
        **attrs,
    )
    em.store(op.outputs[0], em.activation(y, _int(op, "FusedActivationFunction")))


def fully_connected(em: Emitter, op: TflOp) -> None:
    x, w = _operands(em, op, 2)
    if _int(op, "WeightsFormat") != 0:
        raise em.fail("shuffled weights (a format for one ARM kernel) are not supported")
    shape = em.tensor(w).shape
    if len(shape) != 2:
        raise em.fail(f"weights of shape {shape}, FULLY_CONNECTED takes [out, in]")
    out, k = shape
    size = int(np.prod(em.tensor(x).shape))
    if k < 1 or size % k:
        raise em.fail(f"an input of {size} elements is not rows of {k}")
    rows = em.rows(x, (size // k, k))
    data = em.folded.get(w, em.tensor(w).data)
    weights = em.value(w) if data is None else em.weights(w, data, 0, x)
    y = em.node("Gemm", [rows, weights, *_bias(em, op, x, w)], em.tensor(op.outputs[0]).name, transB=1)
    y = em.activation(y, _int(op, "FusedActivationFunction"))
    target = em.tensor(op.outputs[0]).shape
    if tuple(target) != (size // k, out):  # keep_num_dims, or an output of another rank
        y = em.reshape(y, target)
    em.store(op.outputs[0], y, tfl_ordered=True)


def _pool(kind: str) -> Converter:
    def convert(em: Emitter, op: TflOp) -> None:
        (x,) = _operands(em, op, 1)
        window = (_int(op, "FilterHeight"), _int(op, "FilterWidth"))
        attrs = _geometry(em, op, x, window)
        y = em.node(kind, [em.value(x)], em.tensor(op.outputs[0]).name, kernel_shape=list(window), **attrs)
        em.store(op.outputs[0], em.activation(y, _int(op, "FusedActivationFunction")))

    return convert


def reshape(em: Emitter, op: TflOp) -> None:
    """RESHAPE, SQUEEZE, EXPAND_DIMS: the output tensor's static shape says what they do."""
    x = op.inputs[0] if op.inputs else -1
    if x < 0 or len(op.outputs) != 1:
        raise em.fail("expects an input and one output")
    target = em.tensor(op.outputs[0]).shape
    if int(np.prod(target)) != int(np.prod(em.tensor(x).shape)):
        raise em.fail(f"reshapes {em.tensor(x).shape} to {target}, another number of elements")
    em.store(op.outputs[0], em.reshape(em.tfl_order(x), target), tfl_ordered=True)


def softmax(em: Emitter, op: TflOp) -> None:
    (x,) = _operands(em, op, 1)
    value = em.value(x)
    beta = float(op.options["Beta"])
    if beta != 1.0:
        value = em.node("Mul", [value, em.const(np.asarray(beta, np.float32), "beta")], f"{value}/beta")
    axis = 1 if len(em.tensor(x).shape) == 4 else -1  # channels: NHWC's last axis, NCHW's second
    em.store(op.outputs[0], em.node("Softmax", [value], em.tensor(op.outputs[0]).name, axis=axis))


def _binary(kind: str) -> Converter:
    def convert(em: Emitter, op: TflOp) -> None:
        a, b = _operands(em, op, 2)
        rank = len(em.tensor(op.outputs[0]).shape)
        y = em.node(
            kind, [em.broadcast_value(a, rank), em.broadcast_value(b, rank)], em.tensor(op.outputs[0]).name
        )
        em.store(op.outputs[0], em.activation(y, _int(op, "FusedActivationFunction")))

    return convert


def _binary_no_activation(kind: str) -> Converter:
    """MAXIMUM, MINIMUM, PRELU: broadcasting like ADD, without a fused activation."""

    def convert(em: Emitter, op: TflOp) -> None:
        a, b = _operands(em, op, 2)
        rank = len(em.tensor(op.outputs[0]).shape)
        inputs = [em.broadcast_value(a, rank), em.broadcast_value(b, rank)]
        if kind in ("Max", "Min"):
            inputs = [
                _as_output_integers(em, x, t, op.outputs[0]) for x, t in zip(inputs, (a, b), strict=True)
            ]
        em.store(op.outputs[0], em.node(kind, inputs, em.tensor(op.outputs[0]).name))

    return convert


def _as_output_integers(em: Emitter, name: str, index: int, out: int) -> str:
    """TFLite's quantized MAXIMUM and MINIMUM compare the operands' integers as they are and give the
    larger one the output's scale and zero point (reference_ops::MaximumMinimumBroadcastSlow, no
    requantization). Max and min commute with the increasing map q -> (q - zo) * so, so the float
    operand x = (q - z) * s is first mapped to what its integers mean at the output's parameters:
    x * so / s + (z - zo) * so (nothing to do where the parameters are the same)."""
    q, qo = em.tensor(index).quant, em.tensor(out).quant
    if q is None or qo is None or (q.scale[0] == qo.scale[0] and q.zero_point[0] == qo.zero_point[0]):
        return name
    ratio = np.asarray(float(qo.scale[0]) / float(q.scale[0]), np.float32)
    shift = np.asarray((int(q.zero_point[0]) - int(qo.zero_point[0])) * float(qo.scale[0]), np.float32)
    scaled = em.node("Mul", [name, em.const(ratio, f"{name}/ratio")], f"{name}/as_output")
    return em.node("Add", [scaled, em.const(shift, f"{name}/shift")], f"{name}/as_output")


def squared_difference(em: Emitter, op: TflOp) -> None:
    a, b = _operands(em, op, 2)
    rank = len(em.tensor(op.outputs[0]).shape)
    name = em.tensor(op.outputs[0]).name
    diff = em.node("Sub", [em.broadcast_value(a, rank), em.broadcast_value(b, rank)], f"{name}/difference")
    em.store(op.outputs[0], em.node("Mul", [diff, diff], name))


def transpose(em: Emitter, op: TflOp) -> None:
    """TRANSPOSE of TFLite's order, composed with the conversions to and from ONNX's order into one
    permutation of the value as it is held (an identity needs no node at all)."""
    x, p = _operands(em, op, 2)
    perm = [int(v) % max(len(em.tensor(x).shape), 1) for v in em.constant_data(p).reshape(-1)]
    rank = len(em.tensor(x).shape)
    if sorted(perm) != list(range(rank)) or len(em.tensor(op.outputs[0]).shape) != rank:
        raise em.fail(f"permutation {perm} of a rank-{rank} tensor")
    held = list(TO_NHWC) if rank == 4 else list(range(rank))  # a 4-D value is NCHW: TO_NHWC gives TFLite's
    composed = [held[i] for i in perm]
    if rank == 4:
        composed = [composed[i] for i in TO_NCHW]
    if composed == list(range(rank)):
        em.store(op.outputs[0], em.value(x))
        return
    em.store(op.outputs[0], em.node("Transpose", [em.value(x)], em.tensor(op.outputs[0]).name, perm=composed))


def _rsqrt(em: Emitter, op: TflOp) -> None:
    (x,) = _operands(em, op, 1)
    root = em.node("Sqrt", [em.value(x)], f"{em.tensor(op.outputs[0]).name}/sqrt")
    em.store(op.outputs[0], em.node("Reciprocal", [root], em.tensor(op.outputs[0]).name))


def _unary(kind: str, **attrs: Any) -> Converter:
    def convert(em: Emitter, op: TflOp) -> None:
        (x,) = _operands(em, op, 1)
        em.store(op.outputs[0], em.node(kind, [em.value(x)], em.tensor(op.outputs[0]).name, **attrs))

    return convert


def _clip(lo: float, hi: float) -> Converter:
    def convert(em: Emitter, op: TflOp) -> None:
        (x,) = _operands(em, op, 1)
        bounds = [em.const(np.asarray(v, np.float32), "clip") for v in (lo, hi)]
        em.store(op.outputs[0], em.node("Clip", [em.value(x), *bounds], em.tensor(op.outputs[0]).name))

    return convert


def leaky_relu(em: Emitter, op: TflOp) -> None:
    _unary("LeakyRelu", alpha=float(op.options["Alpha"]))(em, op)


def identity(em: Emitter, op: TflOp) -> None:
    """QUANTIZE and DEQUANTIZE: the float value is the same; `store` rounds to the output's quantization
    (QUANTIZE, or a requantization int8 -> int8) or leaves it float (DEQUANTIZE)."""
    (x,) = _operands(em, op, 1)
    t, out = em.tensor(x), em.tensor(op.outputs[0])
    if t.shape != out.shape:
        raise em.fail(f"changes the shape {t.shape} to {out.shape}")
    if t.data is not None and out.quant is None:  # float16 or int8 weights made float: a float constant
        data = t.data if t.quant is None else dequantized(t.data, t.quant, t.quant.axis)
        em.folded[op.outputs[0]] = data.astype(np.float32)  # read as weights by the operators after it
        em.values[op.outputs[0]] = em.const(
            (data.transpose(TO_NCHW) if data.ndim == 4 else data).astype(np.float32), out.name
        )
        return
    em.store(op.outputs[0], em.value(x))


def concatenation(em: Emitter, op: TflOp) -> None:
    if not op.inputs or any(i < 0 for i in op.inputs) or len(op.outputs) != 1:
        raise em.fail("expects inputs and one output")
    rank = len(em.tensor(op.outputs[0]).shape)
    axis = _int(op, "Axis")
    if not -rank <= axis < rank:
        raise em.fail(f"axis {axis} of a rank-{rank} output")
    axis %= rank
    if rank == 4:
        axis = NHWC_TO_NCHW_AXIS[axis]
    y = em.node("Concat", [em.value(i) for i in op.inputs], em.tensor(op.outputs[0]).name, axis=axis)
    em.store(op.outputs[0], em.activation(y, _int(op, "FusedActivationFunction")))


def mean(em: Emitter, op: TflOp) -> None:
    x, a = _operands(em, op, 2)
    shape = em.tensor(x).shape
    axes = sorted({int(v) % max(len(shape), 1) for v in em.constant_data(a).reshape(-1)})
    keep = bool(op.options["KeepDims"])
    name = em.tensor(op.outputs[0]).name
    if len(shape) != 4:
        em.store(op.outputs[0], em.node("ReduceMean", [em.value(x)], name, axes=axes, keepdims=int(keep)))
        return
    if axes == [1, 2]:  # over the pixels: a global average pool, as classifier heads write it
        y = em.node("GlobalAveragePool", [em.value(x)], name)
        if not keep:  # (n, c, 1, 1) and (n, c) are the same bytes
            em.store_viewed(op.outputs[0], y)
            return
    else:
        y = em.node(
            "ReduceMean", [em.value(x)], name, axes=sorted(NHWC_TO_NCHW_AXIS[i] for i in axes), keepdims=1
        )
    if keep:
        em.store(op.outputs[0], y)
        return
    kept = tuple(1 if i in axes else d for i, d in enumerate(shape))
    flat = em.reorder(y, nchw(kept), (0, 2, 3, 1))
    em.store(op.outputs[0], em.reshape(flat, em.tensor(op.outputs[0]).shape), tfl_ordered=True)


def pad(em: Emitter, op: TflOp) -> None:
    """PAD and PADV2 (its third input: the constant value, in the input's quantization)."""
    x, p = _operands(em, op, 2)
    paddings = em.constant_data(p).astype(np.int64)
    rank = len(em.tensor(x).shape)
    if paddings.shape != (rank, 2) or np.any(paddings < 0):
        raise em.fail(f"paddings of shape {paddings.shape} (and negative?) for a rank-{rank} input")
    if rank == 4:
        paddings = paddings[list(TO_NCHW)]
    inputs = [em.value(x), em.const(np.concatenate([paddings[:, 0], paddings[:, 1]]), "pads")]
    if len(op.inputs) > 2 and op.inputs[2] >= 0:  # ONNX's constant_value is a scalar; TFLite's often (1,)
        fill = em.value(op.inputs[2])
        inputs.append(fill if em.tensor(op.inputs[2]).shape == () else em.reshape(fill, ()))
    em.store(op.outputs[0], em.node("Pad", inputs, em.tensor(op.outputs[0]).name))


CONVERTERS: Mapping[str, Converter] = {
    "CONV_2D": conv_2d,
    "DEPTHWISE_CONV_2D": depthwise_conv_2d,
    "FULLY_CONNECTED": fully_connected,
    "AVERAGE_POOL_2D": _pool("AveragePool"),
    "MAX_POOL_2D": _pool("MaxPool"),
    "RESHAPE": reshape,
    "SQUEEZE": reshape,
    "EXPAND_DIMS": reshape,
    "SOFTMAX": softmax,
    "ADD": _binary("Add"),
    "SUB": _binary("Sub"),
    "MUL": _binary("Mul"),
    "DIV": _binary("Div"),
    "CONCATENATION": concatenation,
    "MEAN": mean,
    "PAD": pad,
    "PADV2": pad,
    "QUANTIZE": identity,
    "DEQUANTIZE": identity,
    "LOGISTIC": _unary("Sigmoid"),
    "TANH": _unary("Tanh"),
    "RELU": _unary("Relu"),
    "RELU6": _clip(0.0, 6.0),
    "RELU_N1_TO_1": _clip(-1.0, 1.0),
    "HARD_SWISH": _unary("HardSwish"),
    "LEAKY_RELU": leaky_relu,
    "MAXIMUM": _binary_no_activation("Max"),
    "MINIMUM": _binary_no_activation("Min"),
    "PRELU": _binary_no_activation("PRelu"),
    "SQUARED_DIFFERENCE": squared_difference,
    "TRANSPOSE": transpose,
    "EXP": _unary("Exp"),
    "LOG": _unary("Log"),
    "SQRT": _unary("Sqrt"),
    "RSQRT": _rsqrt,
    "ABS": _unary("Abs"),
    "NEG": _unary("Neg"),
    "FLOOR": _unary("Floor"),
    "CEIL": _unary("Ceil"),
    "SIN": _unary("Sin"),
    "COS": _unary("Cos"),
}
