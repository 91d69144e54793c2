"""The requantization of ONNX's QLinear nodes, shared by the int8 families' ONNX mappings: a QLinearMatMul
or QLinearConv (inputs x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point[, bias];
the output clamp in xtune's attributes `out_lo`/`out_hi`: docs/int8.md) in, the kernel's constant inputs
as ONNX Runtime computes them out: the float32 scale a_scale * b_scale / y_scale and qparams = [za, zy,
lo, hi] (the qmatmul family's `requant=onnx` tensors, xtune/ops/qmatmul/operator.py) — or, for a node of
a TFLite model's convolution (xtune's attribute `requant="tflite"`, set by the import: docs/int8.md),
TFLite's quantized multiplier and shift (`requant=tflite`)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.qmatmul.reference import RANGES, quantize_multiplier
from xtune.ops.quantize import node_arithmetic

WORDS = {"int8": "s8", "uint8": "u8"}  # an 8-bit activation's element type -> the workloads' `a` word


def requantization(
    graph: Graph, node: Node, word: str, channels: int, za: np.ndarray, zy: np.ndarray
) -> dict[str, np.ndarray]:
    """A QLinearMatMul's or QLinearConv's float32 scale (per tensor, or per output channel where the
    weights' scale is) and qparams, as ONNX Runtime computes them; `word` is the activation's type ("s8",
    "u8"), `channels` the output channels, `za` and `zy` the zero points (`zero_point`)."""
    if graph.dtype(node.outputs[0]) != graph.dtype(node.inputs[0]):
        raise refuse(graph, node, "the output's type differs from the input's")
    sa, sb, sy = (float_scale(graph, node, t) for t in (node.inputs[1], node.inputs[4], node.inputs[6]))
    if sa.size != 1 or sy.size != 1 or sb.size not in (1, channels) or za.size != 1 or zy.size != 1:
        raise refuse(
            graph, node, "scales and zero points must be per tensor (the weights': or per output channel)"
        )
    lo, hi = RANGES[word]
    lo = max(lo, node.int_attr("out_lo", lo))
    hi = min(hi, node.int_attr("out_hi", hi))
    qparams = np.array([za.reshape(-1)[0], zy.reshape(-1)[0], lo, hi], np.int32)
    if node_arithmetic(node) == "tflite" and node.op == "QLinearConv":
        return tflite_multipliers(sa, sb, sy) | {"qparams": qparams}
    # A TFLite FULLY_CONNECTED takes the float32 epilogue as well: LiteRT's FULLY_CONNECTED kernels
    # (reference, optimized and XNNPACK alike) round the product once, not gemmlowp's twice, which the
    # float32 product rounded half to even equals but within 2^-17 of a tie (docs/int8.md, "Exactness").
    # ONNX Runtime's QLinearMatMul and QLinearConv: scale[j] = a_scale * b_scale[j] / y_scale in float32.
    scale = (np.float32(sa.reshape(-1)[0]) * sb.reshape(-1)) / np.float32(sy.reshape(-1)[0])
    return {"scale": scale.astype(np.float32), "qparams": qparams}


def tflite_multipliers(sa: np.ndarray, sb: np.ndarray, sy: np.ndarray) -> dict[str, np.ndarray]:
    """TFLite's int32 multiplier and shift per output channel (or per tensor) of a CONV_2D or
    DEPTHWISE_CONV_2D: QuantizeMultiplier of a_scale * b_scale[j] / y_scale, multiplied and divided in
    double as PopulateConvolutionQuantizationParams does (tensorflow/lite/kernels/kernel_util.cc)."""
    a, y = float(sa.reshape(-1)[0]), float(sy.reshape(-1)[0])
    pairs = [quantize_multiplier(a * float(b) / y) for b in sb.reshape(-1)]
    return {
        "multiplier": np.array([q for q, _ in pairs], np.int32),
        "shift": np.array([s for _, s in pairs], np.int32),
    }


def requant_key(quant: Mapping[str, np.ndarray]) -> tuple[tuple[str, str | int], ...]:
    """The workload's ("requant", ...), ("perchannel", ...) and ("dequant", ...) of an int8 call's
    constants: tflite where they hold a multiplier, onnx where a float32 scale, none (MatMulInteger's int32
    sums) otherwise; dequant=1 where they hold the `out_scale` of a DequantizeLinear fused after it."""
    requant = "tflite" if "multiplier" in quant else "onnx" if "scale" in quant else "none"
    scales = quant.get("multiplier", quant.get("scale"))
    perchannel = int(scales is not None and scales.size > 1)
    return ("requant", requant), ("perchannel", perchannel), ("dequant", int("out_scale" in quant))


def zero_point(graph: Graph, node: Node, tensor: str) -> np.ndarray:
    """A zero point: a constant 8-bit integer (absent: 0)."""
    if not tensor:
        return np.zeros(1, np.int32)
    value = graph.constant(tensor)
    if value is None or value.dtype not in (np.int8, np.uint8):
        raise refuse(graph, node, f"zero point '{tensor}' is not a constant 8-bit integer")
    return value.astype(np.int32)


def float_scale(graph: Graph, node: Node, tensor: str) -> np.ndarray:
    """A scale: a constant of finite float32 values."""
    value = graph.constant(tensor)
    if (
        value is None
        or value.dtype != np.float32
        or not np.all(np.isfinite(value))
        or math.prod(value.shape) == 0
    ):
        raise refuse(graph, node, f"scale '{tensor}' is not a constant finite float32")
    return value.astype(np.float32)


def symmetric(graph: Graph, node: Node, zw: np.ndarray, channels: int) -> None:
    """Refuses weights whose zero point is not 0 (per tensor or per output channel): xtune's int8 kernels
    multiply the weights as they are."""
    if zw.size not in (1, channels) or np.any(zw != 0):
        raise refuse(graph, node, "weights with a zero point other than 0 (asymmetric) are not supported")


def int32_bias(graph: Graph, node: Node, channels: int) -> np.ndarray:
    """The node's ninth input, its int32 bias of one value per output channel (absent: zeros)."""
    name = node.inputs[8] if len(node.inputs) > 8 else ""
    bias = graph.constant(name) if name else None
    if name and (bias is None or bias.dtype != np.int32 or bias.size != channels):
        raise refuse(graph, node, f"bias '{name}' is not {channels} constant int32 values")
    return np.zeros(channels, np.int32) if bias is None else bias.reshape(-1)
