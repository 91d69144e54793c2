"""Small TFLite models written by the tests: layers in (`Net`: conv, depthwise, fully connected, pooling,
...), the .tflite bytes out (tests/tflite_write.py), float32, or int8 with
quantization parameters calibrated on the float model's own tensors (ranges seen by LiteRT on one input),
or uint8 as TFLite's older models are.

The int8 quantization follows TFLite's post-training scheme (https://ai.google.dev/edge/litert/models/
quantization_spec): activations asymmetric per tensor, conv and depthwise weights symmetric per output
channel, fully-connected weights symmetric per tensor, biases int32 in the accumulator's scale, SOFTMAX and
LOGISTIC outputs at scale 1/256 and zero point -128, TANH at 1/128 and 0, and pooling, reshapes and
padding keeping their input's parameters.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from tests.tflite_write import Op, Tensor, serialize

SAME, VALID = "SAME", "VALID"
ACT = {"NONE": 0, "RELU": 1, "RELU_N1_TO_1": 2, "RELU6": 3, "TANH": 4}
_FIXED = {"SOFTMAX": (1 / 256, -128), "LOGISTIC": (1 / 256, -128), "TANH": (1 / 128, 0)}
_KEEPS = (
    "AVERAGE_POOL_2D",
    "MAX_POOL_2D",
    "RESHAPE",
    "PAD",
    "TRANSPOSE",
)  # int8: output parameters = the input's
Ranges = Mapping[str, tuple[float, float]]


class Net:
    """A TFLite model under construction. Float unless `ranges` (tensor name -> (min, max), from
    `calibrate`) are given: then int8, every activation quantized from its range."""

    def __init__(
        self,
        ranges: Ranges | None = None,
        seed: int = 0,
        float_input: bool = False,
        unsigned: bool = False,
        stored: str = "float32",
    ) -> None:
        # A float net's weights as TFLite's converter can store them: float32; "float16" behind a
        # DEQUANTIZE (float16 quantization); "int8" per channel, read by float kernels (dynamic range).
        self.stored = stored
        self.float_input = float_input  # an int8 net whose input stays float (QUANTIZE it)
        # uint8: TFLite's older scheme, activations uint8 and weights uint8 asymmetric per tensor
        self.quantized, self.offset = ("uint8", 128) if unsigned else ("int8", 0)
        self.tensors: list[Tensor] = []
        self.ops: list[Op] = []
        self.ranges = ranges
        self.rng = np.random.default_rng(seed)
        self.inputs: list[int] = []
        self.count = 0

    # -- tensors ----------------------------------------------------------------------------------------
    def _activation(self, name: str, shape: tuple[int, ...], op: str = "", like: int = -1) -> int:
        t = Tensor(name=self._name(name, op), shape=shape, dtype="float32")
        if self.ranges is not None and op != "DEQUANTIZE" and not (op == "" and self.float_input):
            t.dtype = self.quantized
            if op in _FIXED:  # uint8: the int8 zero point moved up by `offset` (128), here and below
                scale, zero = _FIXED[op][0], _FIXED[op][1] + self.offset
            elif op in _KEEPS and like >= 0:
                src = self.tensors[like]
                assert src.scale is not None and src.zero_point is not None
                scale, zero = float(src.scale[0]), int(src.zero_point[0])
            else:
                lo, hi = self.ranges[self.tensors[like].name if op == "QUANTIZE" else t.name]
                lo, hi = min(lo, 0.0), max(hi, 0.0, lo + 1e-3)
                scale = (hi - lo) / 255
                zero = int(np.clip(round(-128 - lo / scale), -128, 127)) + self.offset
            t.scale, t.zero_point = np.array([scale], np.float32), np.array([zero], np.int64)
        self.tensors.append(t)
        return len(self.tensors) - 1

    def _name(self, base: str, op: str = "") -> str:
        """Tensors are named in creation order, not counting the QUANTIZE/DEQUANTIZE an int8 net adds,
        so that a float net and its int8 twin name their tensors alike (calibration finds them)."""
        if op in ("QUANTIZE", "DEQUANTIZE"):
            return f"{base}_{len(self.tensors)}_q"
        self.count += 1
        return f"{base}_{self.count}"

    def _weights(self, name: str, w: np.ndarray, axis: int | None) -> int:
        """Float weights, or int8 symmetric per channel along `axis` (per tensor if None), or uint8
        asymmetric per tensor."""
        t = Tensor(name=self._name(name), shape=w.shape, dtype="float32", data=w)
        if self.ranges is None and self.stored == "float16":
            t.dtype, t.data = "float16", w.astype(np.float16)
            self.tensors.append(t)
            return self._op("DEQUANTIZE", [len(self.tensors) - 1], w.shape)
        if self.ranges is None and self.stored == "int8" and axis is not None:
            scale = np.maximum(np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != axis)), 1e-6) / 127
            shape = [1] * w.ndim
            shape[axis] = -1
            t.data = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
            t.dtype, t.axis = "int8", axis
            t.scale, t.zero_point = scale.astype(np.float32), np.zeros(scale.size, np.int64)
        elif self.ranges is not None and self.offset:
            lo, hi = min(float(w.min()), 0.0), max(float(w.max()), 0.0)
            scale, zero = np.array([(hi - lo) / 255]), round(-lo / ((hi - lo) / 255))
            t.data = np.clip(np.round(w / scale[0]) + zero, 0, 255).astype(np.uint8)
            t.dtype, t.scale, t.zero_point = "uint8", scale.astype(np.float32), np.array([zero], np.int64)
        elif self.ranges is not None:
            peak = (
                np.abs(w).max(axis=tuple(i for i in range(w.ndim) if i != axis)) if axis is not None else None
            )
            scale = (
                np.maximum(peak, 1e-6) if peak is not None else np.array([max(np.abs(w).max(), 1e-6)])
            ) / 127
            shape = [1] * w.ndim
            if axis is not None:
                shape[axis] = -1
            t.data = np.clip(np.round(w / scale.reshape(shape)), -127, 127).astype(np.int8)
            t.dtype, t.axis = "int8", axis or 0
            t.scale, t.zero_point = scale.astype(np.float32), np.zeros(scale.size, np.int64)
        self.tensors.append(t)
        return len(self.tensors) - 1

    def _bias(self, name: str, b: np.ndarray, x: int, w: int) -> int:
        t = Tensor(name=self._name(name), shape=b.shape, dtype="float32", data=b)
        if self.ranges is not None:
            xs, ws = self.tensors[x].scale, self.tensors[w].scale
            assert xs is not None and ws is not None
            scale = (xs[0] * ws.astype(np.float64)) * np.ones(b.size)
            t.data, t.dtype = np.round(b / scale).astype(np.int32), "int32"
            t.scale, t.zero_point = scale.astype(np.float32), np.zeros(b.size, np.int64)
        self.tensors.append(t)
        return len(self.tensors) - 1

    def constant(self, name: str, data: np.ndarray) -> int:
        """A constant operand (an int32 shape, axes or paddings, or float data kept float)."""
        dtype = "int32" if data.dtype == np.int32 else "float32"
        self.tensors.append(Tensor(name=self._name(name), shape=data.shape, dtype=dtype, data=data))
        return len(self.tensors) - 1

    def shape(self, x: int) -> tuple[int, ...]:
        return self.tensors[x].shape

    # -- layers -----------------------------------------------------------------------------------------
    def input(self, shape: tuple[int, ...]) -> int:
        x = self._activation("input", shape)
        self.inputs.append(x)
        return x

    def _op(
        self,
        op: str,
        inputs: list[int],
        out_shape: tuple[int, ...],
        like: int = -1,
        **options: float | int | bool,
    ) -> int:
        y = self._activation(op.lower(), out_shape, op, like)
        self.ops.append(Op(op, inputs, [y], options))
        return y

    def _window(
        self, x: int, r: int, s: int, stride: int, padding: str, dilation: int = 1
    ) -> tuple[int, int]:
        _, h, w, _ = self.shape(x)
        if padding == SAME:
            return -(-h // stride), -(-w // stride)
        return (h - dilation * (r - 1) - 1) // stride + 1, (w - dilation * (s - 1) - 1) // stride + 1

    def conv(
        self,
        x: int,
        k: int,
        r: int,
        s: int,
        stride: int = 1,
        padding: str = SAME,
        act: str = "NONE",
        dilation: int = 1,
    ) -> int:
        c = self.shape(x)[3]
        filt = self.rng.normal(0, 1 / np.sqrt(r * s * c), (k, r, s, c)).astype(np.float32)
        return self._windowed("CONV_2D", x, filt, 0, stride, padding, act, dilation)

    def depthwise(
        self,
        x: int,
        r: int,
        s: int,
        multiplier: int = 1,
        stride: int = 1,
        padding: str = SAME,
        act: str = "NONE",
    ) -> int:
        c = self.shape(x)[3] * multiplier
        filt = self.rng.normal(0, 1 / np.sqrt(r * s), (1, r, s, c)).astype(np.float32)
        return self._windowed(
            "DEPTHWISE_CONV_2D", x, filt, 3, stride, padding, act, 1, DepthMultiplier=multiplier
        )

    def _windowed(
        self,
        op: str,
        x: int,
        filt: np.ndarray,
        axis: int,
        stride: int,
        padding: str,
        act: str,
        dilation: int,
        **extra: int,
    ) -> int:
        """CONV_2D (OHWI filter, output channels on axis 0) or DEPTHWISE_CONV_2D ([1, H, W, C*M], axis 3)."""
        k, r, s = filt.shape[axis], filt.shape[1], filt.shape[2]
        prefix = "" if op == "CONV_2D" else "dw_"
        w = self._weights(f"{prefix}filter", filt, axis)
        b = self._bias(f"{prefix}bias", self.rng.normal(0, 0.1, (k,)).astype(np.float32), x, w)
        oh, ow = self._window(x, r, s, stride, padding, dilation)
        window = _window_options(padding, stride, act)
        out = (self.shape(x)[0], oh, ow, k)
        return self._op(
            op, [x, w, b], out, DilationHFactor=dilation, DilationWFactor=dilation, **window, **extra
        )

    def fc(self, x: int, n: int, act: str = "NONE", keep_num_dims: bool = False) -> int:
        k = self.shape(x)[-1] if keep_num_dims else int(np.prod(self.shape(x)[1:]))
        w = self._weights("fc_weights", self.rng.normal(0, 1 / np.sqrt(k), (n, k)).astype(np.float32), None)
        b = self._bias("fc_bias", self.rng.normal(0, 0.1, n).astype(np.float32), x, w)
        out = (*self.shape(x)[:-1], n) if keep_num_dims else (int(np.prod(self.shape(x))) // k, n)
        return self._op(
            "FULLY_CONNECTED", [x, w, b], out, FusedActivationFunction=ACT[act], KeepNumDims=keep_num_dims
        )

    def pool(self, op: str, x: int, size: int, stride: int, padding: str = VALID, act: str = "NONE") -> int:
        oh, ow = self._window(x, size, size, stride, padding)
        n, _, _, c = self.shape(x)
        window = _window_options(padding, stride, act)
        return self._op(op, [x], (n, oh, ow, c), like=x, FilterHeight=size, FilterWidth=size, **window)

    def binary(self, op: str, a: int, b: int, act: str = "NONE") -> int:
        shape = tuple(np.broadcast_shapes(self.shape(a), self.shape(b)))
        return self._op(op, [a, b], shape, FusedActivationFunction=ACT[act])

    def unary(self, op: str, x: int) -> int:
        return self._op(op, [x], self.shape(x))

    def reshape(self, x: int, shape: tuple[int, ...]) -> int:
        target = self.constant("shape", np.asarray(shape, np.int32))
        return self._op("RESHAPE", [x, target], shape, like=x)

    def concat(self, xs: Sequence[int], axis: int, act: str = "NONE") -> int:
        """CONCATENATION; in an int8 net TFLite's kernel wants every input at the output's scale, so an
        input at another is requantized first (QUANTIZE int8 -> int8), as TFLite's converter does."""
        shape = list(self.shape(xs[0]))
        shape[axis] = sum(self.shape(x)[axis] for x in xs)
        y = self._activation("concatenation", tuple(shape), "CONCATENATION")
        inputs = [self._requantized(x, y) for x in xs] if self.ranges is not None else list(xs)
        self.ops.append(Op("CONCATENATION", inputs, [y], {"Axis": axis, "FusedActivationFunction": ACT[act]}))
        return y

    def _requantized(self, x: int, like: int) -> int:
        src, dst = self.tensors[x], self.tensors[like]
        assert src.scale is not None and dst.scale is not None and dst.zero_point is not None
        if src.scale[0] == dst.scale[0] and src.zero_point == dst.zero_point:
            return x
        t = Tensor(
            name=self._name("requantized", "QUANTIZE"),
            shape=src.shape,
            dtype=dst.dtype,
            scale=dst.scale.copy(),
            zero_point=dst.zero_point.copy(),
        )
        self.tensors.append(t)
        self.ops.append(Op("QUANTIZE", [x], [len(self.tensors) - 1], {}))
        return len(self.tensors) - 1

    def mean(self, x: int, axes: Sequence[int], keep_dims: bool, same_quantization: bool = False) -> int:
        """MEAN; quantized from its calibrated range, or (`same_quantization`) with its input's scale and
        zero point."""
        shape = [1 if i in axes else d for i, d in enumerate(self.shape(x))]
        out = tuple(shape) if keep_dims else tuple(d for i, d in enumerate(shape) if i not in axes)
        y = self._op("MEAN", [x, self.constant("axes", np.asarray(axes, np.int32))], out, KeepDims=keep_dims)
        src, dst = self.tensors[x], self.tensors[y]
        if same_quantization and src.scale is not None and src.zero_point is not None:
            dst.scale, dst.zero_point = src.scale.copy(), src.zero_point.copy()
        return y

    def pad(self, x: int, paddings: Sequence[tuple[int, int]], value: float | None = None) -> int:
        """PAD, or PADV2 filling with `value` (a float net's)."""
        p = self.constant("paddings", np.asarray(paddings, np.int32))
        shape = tuple(d + a + b for d, (a, b) in zip(self.shape(x), paddings, strict=True))
        if value is None:
            return self._op("PAD", [x, p], shape, like=x)
        fill = self.constant("fill", np.asarray([value], np.float32))
        return self._op("PADV2", [x, p, fill], shape, like=x)

    def transpose(self, x: int, perm: Sequence[int]) -> int:
        shape = tuple(self.shape(x)[i] for i in perm)
        return self._op("TRANSPOSE", [x, self.constant("perm", np.asarray(perm, np.int32))], shape, like=x)

    def quantize(self, x: int) -> int:
        """QUANTIZE: a float input made int8 (in a float net: nothing, `x` itself)."""
        return x if self.ranges is None else self._op("QUANTIZE", [x], self.shape(x), like=x)

    def dequantize(self, x: int) -> int:
        """DEQUANTIZE: an int8 output made float (in a float net: nothing, `x` itself)."""
        return x if self.ranges is None else self._op("DEQUANTIZE", [x], self.shape(x))

    def softmax(self, x: int, beta: float = 1.0) -> int:
        return self._op("SOFTMAX", [x], self.shape(x), Beta=beta)

    # -- the file ---------------------------------------------------------------------------------------
    def tflite(self, outputs: Sequence[int]) -> bytes:
        return serialize(self.tensors, self.ops, self.inputs, list(outputs))


def _pad(padding: str) -> int:
    return 0 if padding == SAME else 1


def _window_options(padding: str, stride: int, act: str) -> dict[str, int]:
    """The options convolutions and pooling share (schema.fbs: Conv2DOptions, Pool2DOptions)."""
    return {
        "Padding": _pad(padding),
        "StrideH": stride,
        "StrideW": stride,
        "FusedActivationFunction": ACT[act],
    }
