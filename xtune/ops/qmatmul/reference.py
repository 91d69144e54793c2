"""The integer references of quantized matmul: int8/uint8 operands, zero points, int32 bias and scales in;
the int32 accumulators and their requantization (ONNX Runtime's and TFLite's, bit for bit) out.

Both requantizations are written in integer (or exactly specified float32) numpy arithmetic, so that a
kernel's output is compared for equality, not within a tolerance:
- "onnx": ONNX Runtime's MLAS (onnxruntime/core/mlas/lib/quantize.cpp, MlasRequantizeOutput): the int32
  sum plus bias converted to float32, times the float32 scale (a_scale * b_scale / y_scale, per tensor or
  per output channel), clamped to [lo - zy, hi - zy] in float, rounded to nearest even (cvtps2dq,
  vcvtnq_s32_f32), plus zy.
- "tflite": TFLite's reference kernels (MultiplyByQuantizedMultiplier, with gemmlowp's
  SaturatingRoundingDoublingHighMul and RoundingDivideByPOT, gemmlowp/fixedpoint/fixedpoint.h): an int32
  multiplier in [2^30, 2^31) and a shift per tensor or channel (`quantize_multiplier`), then plus zy,
  clamped to [lo, hi].
- "none": the int32 sums themselves (ONNX MatMulInteger).
[lo, hi] is the output type's range, narrowed by a fused ReLU or ReLU6 (`activation_range`).
"""

from __future__ import annotations

import math
from typing import Literal

import numpy as np

Requant = Literal["onnx", "tflite", "none"]
INT32_MIN, INT32_MAX = -(1 << 31), (1 << 31) - 1
# The range of each 8-bit type by its workload word.
RANGES = {"u8": (0, 255), "s8": (-128, 127)}
NUMPY_TYPES = {"u8": np.uint8, "s8": np.int8}


def quantize_multiplier(real: float) -> tuple[int, int]:
    """TFLite's QuantizeMultiplier (tensorflow/lite/kernels/internal/quantization_util.cc): real =
    q * 2^(shift - 31) with q in [2^30, 2^31), q rounded half away from zero (TfLiteRound)."""
    if real == 0.0:
        return 0, 0
    fraction, shift = math.frexp(real)
    q = math.floor(abs(fraction) * (1 << 31) + 0.5) * (1 if fraction > 0 else -1)
    if abs(q) == 1 << 31:
        q //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return q, shift


def activation_range(
    out: str, zero_point: int, scale: float, act: Literal["", "relu", "relu6"]
) -> tuple[int, int]:
    """TFLite's CalculateActivationRangeQuantized: the output type's range, narrowed to the quantized
    0 (ReLU) and 6 (ReLU6), each zero_point + round(x / scale) (half away from zero)."""
    lo, hi = RANGES[out]
    if act:
        lo = max(lo, zero_point)
    if act == "relu6":
        hi = min(hi, zero_point + math.floor(6.0 / scale + 0.5))
    return lo, hi


def saturating_rounding_doubling_high_mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """gemmlowp's SaturatingRoundingDoublingHighMul on int32 arrays (in int64, as the reference)."""
    a64, b64 = a.astype(np.int64), b.astype(np.int64)
    ab = a64 * b64
    total = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    quotient = np.where(total >= 0, total >> 31, -((-total) >> 31))  # C's division truncates toward zero
    overflow = (a64 == INT32_MIN) & (b64 == INT32_MIN)
    return np.where(overflow, INT32_MAX, quotient).astype(np.int32)


def rounding_divide_by_pot(x: np.ndarray, exponent: np.ndarray) -> np.ndarray:
    """gemmlowp's RoundingDivideByPOT: x / 2^exponent, rounded to nearest with ties away from zero."""
    x64, e = x.astype(np.int64), np.asarray(exponent, np.int64)
    mask = (np.int64(1) << e) - 1
    remainder = x64 & mask
    threshold = (mask >> 1) + (x64 < 0)
    return ((x64 >> e) + (remainder > threshold)).astype(np.int32)


def multiply_by_quantized_multiplier(x: np.ndarray, multiplier: np.ndarray, shift: np.ndarray) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplier (reference kernels, gemmlowp double rounding). The left shift
    wraps around in int32 as the C code does on every target xtune builds for."""
    shift = np.asarray(shift, np.int64)
    left, right = np.maximum(shift, 0), np.maximum(-shift, 0)
    shifted = wrap32(x.astype(np.int64) << left)
    return rounding_divide_by_pot(saturating_rounding_doubling_high_mul(shifted, multiplier), right)


def wrap32(x: np.ndarray) -> np.ndarray:
    """int64 values as int32 two's complement (what an i32 add or shift of the kernel leaves)."""
    return (np.asarray(x, np.int64) & 0xFFFFFFFF).astype(np.uint32).view(np.int32)


def accumulate(a: np.ndarray, b: np.ndarray, bias: np.ndarray, a_zero: int) -> np.ndarray:
    """sum_k (a[i,k] - a_zero) * b[k,j] + bias[j], in int32 as the kernels add it (wrapping: the workload
    bounds k so that the sum of products fits; a bias near the int32 limits wraps as in MLAS)."""
    return wrap32((a.astype(np.int64) - a_zero) @ b.astype(np.int64) + bias.astype(np.int64))


def requantize_onnx(acc: np.ndarray, scale: np.ndarray, zero: int, lo: int, hi: int) -> np.ndarray:
    """MLAS's MlasRequantizeOutput: float32(acc) * scale, clamped to [lo - zero, hi - zero] in float,
    rounded half to even, plus zero. int32 lanes out (the caller narrows)."""
    f = acc.astype(np.float32) * np.asarray(scale, np.float32)
    f = np.minimum(np.maximum(f, np.float32(lo - zero)), np.float32(hi - zero))
    return np.rint(f).astype(np.int32) + np.int32(zero)


def requantize_tflite(
    acc: np.ndarray, multiplier: np.ndarray, shift: np.ndarray, zero: int, lo: int, hi: int
) -> np.ndarray:
    """TFLite's reference FullyConnected/Conv output stage: MultiplyByQuantizedMultiplier, plus the output
    offset, clamped to [lo, hi]."""
    y = multiply_by_quantized_multiplier(acc, multiplier, shift).astype(np.int64) + zero
    return np.clip(y, lo, hi).astype(np.int32)


def qmatmul(inputs: list[np.ndarray], a_type: str, requant: Requant) -> np.ndarray:
    """The whole operator on the workload's tensors (operator.py, QMatmul.tensors): A, B, bias, the
    scales (onnx: scale; tflite: multiplier, shift; none: nothing), qparams = [za, zy, lo, hi], in order."""
    a, b, bias, *scales, qparams = inputs
    return output(accumulate(a, b, bias, int(qparams[0])), scales, qparams, a_type, requant)


def output(
    acc: np.ndarray, scales: list[np.ndarray], qparams: np.ndarray, a_type: str, requant: Requant
) -> np.ndarray:
    """The stored output of int32 sums `acc` (bias included; channels on the last axis): requantized by
    `requant` with the scales per tensor or channel, in the activation's type (none: the sums); where
    `scales` has one more, the workload's dequant=1 output scale, that 8-bit result dequantized to float32
    as DequantizeLinear computes it: (int32(q) - zy) in float32, times the scale."""
    _, zy, lo, hi = (int(v) for v in qparams)
    if requant == "none":
        return acc
    if requant == "onnx":
        y = requantize_onnx(acc, scales[0], zy, lo, hi)
    else:
        y = requantize_tflite(acc, scales[0], scales[1], zy, lo, hi)
    q = y.astype(NUMPY_TYPES[a_type])
    if len(scales) == _SCALES[requant]:
        return q
    diff = (q.astype(np.int32) - np.int32(zy)).astype(np.float32)
    return (diff * np.float32(scales[-1].reshape(-1)[0])).astype(np.float32)


_SCALES = {"onnx": 1, "tflite": 2}  # how many scale-like inputs each requantization takes


def sample_inputs(
    shape: tuple[int, int, int],
    a_type: str,
    requant: Requant,
    channels: int,
    rng: np.random.Generator,
    dequant: bool = False,
) -> list[np.ndarray]:
    """Random tensors of a realistic quantized layer: full-range activations and weights, a zero point
    anywhere in the activation type, a bias of the size a float bias over the scales gives, and scales
    that spread the outputs over the whole output range (some saturate, as in a real layer)."""
    m, n, k = shape
    lo, hi = RANGES[a_type]
    a = rng.integers(lo, hi + 1, (m, k)).astype(NUMPY_TYPES[a_type])
    b = rng.integers(-128, 128, (k, n)).astype(np.int8)
    za = int(rng.integers(lo, hi + 1))
    typical = 74.0 * 74.0 * math.sqrt(k)  # the spread of a sum of k products of uniform bytes
    bias = rng.integers(-int(typical), int(typical) + 1, n).astype(np.int32)
    zy = int(rng.integers(lo + 64, hi - 63))
    real = (90.0 / typical) * rng.uniform(0.5, 2.0, channels)  # ~90 output steps per spread
    if requant == "none":
        return [a, b, bias, np.array([za, 0, 0, 0], np.int32)]
    qparams = np.array([za, zy, lo, hi], np.int32)
    out_scale = [np.array([rng.uniform(0.005, 0.05)], np.float32)] if dequant else []
    if requant == "onnx":
        return [a, b, bias, real.astype(np.float32), *out_scale, qparams]
    pairs = [quantize_multiplier(float(r)) for r in real]
    multiplier = np.array([q for q, _ in pairs], np.int32)
    shift = np.array([s for _, s in pairs], np.int32)
    return [a, b, bias, multiplier, shift, *out_scale, qparams]
