"""The ONNX graph a TFLite model becomes, under construction: TFLite tensors in (by index), ONNX nodes,
initializers and the float value of every tensor out, with the two translations every operator needs.

Layout. TFLite is NHWC; ONNX's Conv, pooling and GlobalAveragePool are NCHW. Every 4-D activation is held
in NCHW ("ONNX's order") here, every other tensor in TFLite's own order; `tfl_order` and `store` convert at
the few operators whose meaning depends on the order (Reshape, FullyConnected's flattening, Mean's axes).
A conversion is a Transpose, or a Reshape when the two orders are the same bytes (one channel, or one
pixel: after a global pool), which costs nothing in xtune (a view).

Quantization (ONNX's QDQ form, https://onnx.ai/onnx/operators/onnx__QuantizeLinear.html): a quantized
constant is its integers and a DequantizeLinear; the result of an operator whose output TFLite quantizes
goes through QuantizeLinear then DequantizeLinear, so every operator itself computes in float on the
dequantized values and rounds where TFLite's kernel rounds: at its output.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import onnx
from onnx import helper, numpy_helper

from xtune.errors import InputError
from xtune.frontend.tflite_file import Quantization, TflModel, TflOp, TflTensor

TO_NCHW, TO_NHWC = (0, 3, 1, 2), (0, 2, 3, 1)
QUANTIZED = (np.dtype(np.int8), np.dtype(np.uint8))  # the activation types ONNX's QDQ ops take at opset 17


def nchw(shape: tuple[int, ...]) -> tuple[int, ...]:
    """A TFLite shape in ONNX's order (4-D: NHWC -> NCHW; others unchanged)."""
    return tuple(shape[i] for i in TO_NCHW) if len(shape) == 4 else shape


def same_bytes(shape: tuple[int, ...]) -> bool:
    """Whether a 4-D NHWC tensor has the same bytes in NCHW (one channel, or one pixel)."""
    return len(shape) != 4 or shape[3] == 1 or shape[1] * shape[2] == 1


def dequantized(data: np.ndarray, quant: Quantization, axis: int) -> np.ndarray:
    """(q - zero_point) * scale in float32, per tensor or along `axis`: DequantizeLinear's arithmetic."""
    shape = [1] * data.ndim
    if quant.scale.size > 1:
        shape[axis] = quant.scale.size
    centered = (data.astype(np.int64) - quant.zero_point.reshape(shape)).astype(np.float32)
    return centered * quant.scale.reshape(shape)


class Emitter:
    """ONNX nodes and initializers for one TFLite subgraph, and the ONNX name of every tensor's value."""

    def __init__(self, model: TflModel) -> None:
        self.model = model
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.values: dict[int, str] = {}  # tensor -> its float value (4-D in ONNX's order)
        self.integers: dict[int, str] = {}  # quantized tensor -> its integer value (QuantizeLinear's)
        self.folded: dict[int, np.ndarray] = {}  # DEQUANTIZE of a constant: its float32 value, TFLite's order
        self._names: set[str] = set()
        self._reshaped: dict[str, str] = {}  # a Reshape's output -> its input
        self.op: TflOp | None = None  # the operator being converted: it names nodes and errors

    # -- names, nodes, constants --------------------------------------------------------------------
    def fresh(self, base: str) -> str:
        # TFLite's converter names a fused tensor by every op it fused, joined by ';': the first is enough.
        base = re.sub(r"[^0-9A-Za-z_./:-]", "_", base.split(";")[0]) or "t"
        name, k = base, 1
        while name in self._names:
            name, k = f"{base}_{k}", k + 1
        self._names.add(name)
        return name

    def node(self, op_type: str, inputs: list[str], base: str, **attrs: Any) -> str:
        """Append an ONNX node of one output (named after `base`) and return that output's name."""
        out = self.fresh(base)
        prefix = f"{self.op.op.lower()}_{self.op.index}" if self.op is not None else "boundary"
        self.nodes.append(
            helper.make_node(op_type, inputs, [out], name=self.fresh(f"{prefix}/{op_type}"), **attrs)
        )
        return out

    def const(self, array: np.ndarray, base: str) -> str:
        name = self.fresh(base)
        self.initializers.append(numpy_helper.from_array(np.array(array, order="C"), name))
        return name

    def tensor(self, index: int) -> TflTensor:
        return self.model.tensors[index]

    def fail(self, why: str) -> InputError:
        where = f"operator {self.op.index} ({self.op.op})" if self.op is not None else "the model's boundary"
        return InputError(f"{self.model.name}: {where}: {why}")

    def constant_data(self, index: int) -> np.ndarray:
        data = self.folded.get(index, self.tensor(index).data)
        if data is None:
            raise self.fail(f"tensor '{self.tensor(index).label}' must be a constant")
        return data

    # -- values ---------------------------------------------------------------------------------------
    def value(self, index: int) -> str:
        """The float value of tensor `index` (4-D in ONNX's order): an activation's, or a constant's."""
        if index in self.values:
            return self.values[index]
        t = self.tensor(index)
        if t.data is None:
            raise self.fail(f"tensor '{t.label}' is read before any operator writes it")
        data = t.data.transpose(TO_NCHW) if t.data.ndim == 4 else t.data
        if t.quant is None:
            name = self.const(data.astype(np.float32), t.name)
        else:
            axis = TO_NCHW.index(t.quant.axis) if t.data.ndim == 4 else t.quant.axis
            name = self.dequantize(data, t.quant, axis, t.name)
        self.values[index] = name
        return name

    def dequantize(self, data: np.ndarray, quant: Quantization, axis: int, base: str) -> str:
        """DequantizeLinear of an integer constant (per tensor, or per slice along `axis` of `data`)."""
        if data.dtype not in (*QUANTIZED, np.dtype(np.int32)):
            raise self.fail(f"a quantized {data.dtype} constant (xtune imports int8, uint8 and int32)")
        per_axis = quant.scale.size > 1
        scale = quant.scale if per_axis else quant.scale.reshape(())
        zero = quant.zero_point.astype(data.dtype) if per_axis else quant.zero_point.astype(data.dtype)[0]
        q = self.const(data, f"{base}/quantized")
        s, z = self.const(scale, f"{base}/scale"), self.const(np.asarray(zero), f"{base}/zero_point")
        attrs = {"axis": axis} if per_axis else {}
        return self.node("DequantizeLinear", [q, s, z], base, **attrs)

    def weights(self, index: int, data: np.ndarray, axis: int, x: int) -> str:
        """Constant weights already rearranged into ONNX's order (`data`), whose per-channel quantization,
        if any, runs along the tensor's output-channel axis, now `axis` of `data`, for an operator whose
        activation input is `x`. Quantized weights of a float operator (TFLite's dynamic-range and
        weight-only quantization) are dequantized here, to float32 exactly as DequantizeLinear computes
        them: the operator is a float one, with float weights."""
        t = self.tensor(index)
        if t.quant is None:
            return self.const(data.astype(np.float32), t.name)
        if self.tensor(x).quant is None:
            return self.const(dequantized(data, t.quant, axis), t.name)
        return self.dequantize(data, t.quant, axis, t.name)

    def bias(self, index: int, x: int, w: int) -> str:
        """A bias: float as it is; int32 in the accumulator's scale, x's scale times w's (TFLite's
        kernels ignore the bias tensor's own scale and add it to the int32 accumulator)."""
        t = self.tensor(index)
        data = self.constant_data(index)
        xq, wq = self.tensor(x).quant, self.tensor(w).quant
        if data.dtype != np.int32:
            if data.dtype.kind != "f":
                raise self.fail(f"bias '{t.label}' is {data.dtype} (TFLite's kernels take float or int32)")
            return self.const(data.astype(np.float32), t.name)
        if xq is None or wq is None:
            raise self.fail(f"int32 bias '{t.label}' of an operator whose input or weights are not quantized")
        scale = (xq.scale[0] * wq.scale.astype(np.float64)).astype(np.float32)
        quant = Quantization(scale=scale, zero_point=np.zeros(scale.size, np.int64), axis=0)
        return self.dequantize(data, quant, 0, t.name)

    def store(self, index: int, name: str, tfl_ordered: bool = False) -> None:
        """`name` is the float result of tensor `index` (4-D in ONNX's order, or in TFLite's if
        `tfl_ordered`): record it, rounded to the tensor's quantization if it has one."""
        t = self.tensor(index)
        if tfl_ordered and len(t.shape) == 4:
            name = self.reorder(name, t.shape, TO_NCHW)
        if t.quant is not None:
            s, z = self._activation_quantization(t)
            self.integers[index] = self.node("QuantizeLinear", [name, s, z], f"{t.name}/quantized")
            name = self.node("DequantizeLinear", [self.integers[index], s, z], t.name)
        elif t.dtype not in (np.float32, np.float16):
            raise self.fail(f"activation '{t.label}' is {t.dtype} without quantization parameters")
        self.values[index] = name

    def store_viewed(self, index: int, name: str) -> None:
        """`name` is the float result of tensor `index` with the same bytes in another shape (a pooled
        pixel per channel, NCHW, for an (n, c) tensor): quantized, if the tensor is, before the view, so
        that the operator's QuantizeLinear is its only reader (the pattern the quantized rewrite matches:
        xtune/frontend/quantized.py), the view then one of integers."""
        t = self.tensor(index)
        if t.quant is None:
            self.store(index, self.reshape(name, t.shape))
            return
        s, z = self._activation_quantization(t)
        quantized = self.node("QuantizeLinear", [name, s, z], f"{t.name}/quantized")
        self.integers[index] = self.reshape(quantized, t.shape)
        self.values[index] = self.node("DequantizeLinear", [self.integers[index], s, z], t.name)

    def dequantize_input(self, name: str, t: TflTensor) -> str:
        """The float value of a quantized graph input `name` (tensor `t`)."""
        s, z = self._activation_quantization(t)
        return self.node("DequantizeLinear", [name, s, z], f"{name}/dequantized")

    def _activation_quantization(self, t: TflTensor) -> tuple[str, str]:
        """The (scale, zero point) initializers of a quantized activation: per tensor, int8 or uint8."""
        if t.dtype not in QUANTIZED or t.quant is None:
            raise self.fail(f"activation '{t.label}' is quantized {t.dtype} (xtune imports int8 and uint8)")
        if t.quant.scale.size != 1:
            raise self.fail(f"activation '{t.label}' is quantized per axis (xtune reads per-tensor)")
        s = self.const(t.quant.scale.reshape(()), f"{t.name}/scale")
        return s, self.const(np.asarray(t.quant.zero_point[0], t.dtype), f"{t.name}/zero_point")

    # -- layout ---------------------------------------------------------------------------------------
    def reorder(self, name: str, shape: tuple[int, ...], perm: tuple[int, ...]) -> str:
        """`name` (4-D, of `shape` in the order it is in) permuted by `perm` (TO_NCHW or TO_NHWC): a
        Reshape when the two orders are the same bytes, else a Transpose."""
        out_shape = tuple(shape[i] for i in perm)
        nhwc = shape if perm == TO_NCHW else out_shape
        if same_bytes(nhwc):
            return self.reshape(name, out_shape)
        return self.node("Transpose", [name], f"{name}/{'nchw' if perm == TO_NCHW else 'nhwc'}", perm=perm)

    def reshape(self, name: str, shape: tuple[int, ...]) -> str:
        """`name` reshaped; a reshape of a reshape reads the first one's input (the Reshape in between,
        if nothing else reads it, is dropped with the other dead nodes at the end: `live_nodes`)."""
        source = self._reshaped.get(name, name)
        target = self.const(np.asarray(shape, np.int64), f"{name}/shape")
        out = self.node("Reshape", [source, target], f"{name}/reshaped")
        self._reshaped[out] = source
        return out

    def live_nodes(self, outputs: list[str]) -> list[onnx.NodeProto]:
        """The nodes that `outputs` depend on, in order, and the initializers they read (others dropped)."""
        needed, kept = set(outputs), []
        for node in reversed(self.nodes):
            if any(out in needed for out in node.output):
                kept.append(node)
                needed.update(node.input)
        self.initializers = [i for i in self.initializers if i.name in needed]
        return kept[::-1]

    def rows(self, index: int, shape: tuple[int, int]) -> str:
        """Tensor `index`'s float value in TFLite's order as a matrix of `shape` (FULLY_CONNECTED's
        flattening). A quantized tensor whose bytes are already in that order is reshaped as integers
        and dequantized after, so that the int8 layer reading it keeps the QDQ pattern the rewrite makes
        an int8 matmul of (xtune/frontend/quantized.py); a float Reshape between DequantizeLinear and
        the Gemm would leave it in float."""
        t = self.tensor(index)
        if t.shape == shape:
            return self.tfl_order(index)
        if index in self.integers and same_bytes(t.shape):
            s, z = self._activation_quantization(t)
            view = self.reshape(self.integers[index], shape)
            return self.node("DequantizeLinear", [view, s, z], f"{view}/dequantized")
        return self.reshape(self.tfl_order(index), shape)

    def tfl_order(self, index: int) -> str:
        """Tensor `index`'s float value in TFLite's order."""
        shape = self.tensor(index).shape
        return self.reorder(self.value(index), nchw(shape), TO_NHWC) if len(shape) == 4 else self.value(index)

    def broadcast_value(self, index: int, rank: int) -> str:
        """Tensor `index`'s value as an operand of a broadcasting elementwise op whose output has `rank`:
        TFLite broadcasts NumPy-style from the last axis of its NHWC order, so an operand of lower rank
        than a 4-D output is first given the leading ones of its NHWC rank, then put in ONNX's order."""
        t = self.tensor(index)
        if rank != 4 or len(t.shape) == 4:
            return self.value(index)
        padded = (1,) * (4 - len(t.shape)) + t.shape
        if t.data is not None and t.quant is None:
            return self.const(t.data.reshape(padded).transpose(TO_NCHW).astype(np.float32), t.name)
        return self.reorder(self.reshape(self.value(index), padded), padded, TO_NCHW)

    # -- fused activations ----------------------------------------------------------------------------
    def activation(self, name: str, code: int) -> str:
        """`name` after a TFLite fused activation (schema.fbs, `enum ActivationFunctionType`)."""
        if code == 0:
            return name
        if code == 1:
            return self.node("Relu", [name], f"{name}/relu")
        if code in (2, 3):
            lo, hi = (-1.0, 1.0) if code == 2 else (0.0, 6.0)
            bounds = [self.const(np.asarray(v, np.float32), f"{name}/clip") for v in (lo, hi)]
            return self.node("Clip", [name, *bounds], f"{name}/clip")
        if code == 4:
            # TFLite's kernels of the operators mapped here clamp to the range of their fused activation
            # (CalculateActivationRange, tensorflow/lite/kernels/kernel_util.h) and give TANH the whole
            # range: the interpreter computes no activation at all (only its RNN kernels apply TANH).
            return name
        raise self.fail(f"fused activation {code} (SIGN_BIT or unknown) is not supported")
