"""ONNX Runtime's float32 Conv as its CPU provider computes it on x86-64 and AArch64 (MLAS's im2col and
SGEMM, one thread): a float32 NCHW input, OIHW filter and bias in, the float32 output with MLAS's order of
roundings out (`mlas_conv`), and the K slices that order comes from (`sgemm_slices`).

Why it matters: where ONNX Runtime's optimized graph keeps a quantized Conv as DequantizeLinear -> float
Conv -> QuantizeLinear (xtune/frontend/qdqunits.py says where), the output's quantization rounds the float
sum, whose last bits depend on the order of the additions; any other order (an exact integer sum
included) lands on the other side of a rounding half now and then, and a network amplifies each such
step. MLAS's order (onnxruntime/core/mlas/lib/convolve.cpp, MlasConvOperation; sgemm.cpp,
MlasSgemmOperation; the FMA3 and AVX-512F SGEMM kernels):

- the filter is A (M = output channels, K = c * kh * kw in that order, ONNX's OIHW rows), the image
  patches are B (K x N, N the output pixels in row-major order, out-of-image taps 0), C = A x B;
- K is cut into slices (`sgemm_slices`): StrideN = StrideK = 128 (MLAS_SGEMM_STRIDEN/K); where N >= K
  StrideK halves (StrideN doubling) while StrideK / 2 >= K; otherwise StrideK doubles (StrideN halving)
  while StrideN > 16 and StrideN / 2 >= N. N is the output's pixel count (one thread: one segment); the
  same rule again inside each slice (MlasSgemmOperation) never cuts a slice further;
- each slice's sum starts from 0 and adds one product per k with a fused multiply-add (vfmadd231ps),
  k in order; the first slice's sum is C, each later one is added to C (one rounding each);
- then the bias is added (MlasActivation: C + bias), then the activation (a Relu: max with 0).

1x1 convolutions of stride 1 and no padding take the input as B directly (MlasConvAlgorithmGemmDirect):
the same order. Depthwise and NCHWc convolutions are other kernels, not this one.
"""

from __future__ import annotations

import itertools

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.qmlas import fma32
from xtune.ops.quantize import node_qparams

SGEMM_STRIDE = 128  # MLAS_SGEMM_STRIDEN and MLAS_SGEMM_STRIDEK (onnxruntime/core/mlas/lib/mlasi.h)


def sgemm_slices(n: int, k: int) -> tuple[int, ...]:
    """Where MLAS's SGEMM of an (m x k) by (k x n) product starts each slice of K (its first is 0)."""
    stride_n, stride_k = SGEMM_STRIDE, SGEMM_STRIDE
    if n >= k:
        while stride_k // 2 >= k:
            stride_n, stride_k = stride_n * 2, stride_k // 2
    else:
        while stride_n > 16 and stride_n // 2 >= n:
            stride_n, stride_k = stride_n // 2, stride_k * 2
    return tuple(range(0, k, stride_k))


def patches(
    x: np.ndarray, kernel: tuple[int, int], strides: tuple[int, int], pads: tuple[int, int, int, int]
) -> np.ndarray:
    """MLAS's im2col of one (c, h, w) image: (c * kh * kw, out_h * out_w), out-of-image taps 0. `pads` is
    ONNX's (top, left, bottom, right)."""
    c, h, w = x.shape
    (kh, kw), (sh, sw) = kernel, strides
    top, left, bottom, right = pads
    padded = np.pad(x, ((0, 0), (top, bottom), (left, right)))
    oh, ow = (h + top + bottom - kh) // sh + 1, (w + left + right - kw) // sw + 1
    rows = [
        padded[ch, i : i + sh * (oh - 1) + 1 : sh, j : j + sw * (ow - 1) + 1 : sw].reshape(-1)
        for ch in range(c)
        for i in range(kh)
        for j in range(kw)
    ]
    return np.stack(rows).astype(np.float32)


def mlas_conv(
    x: np.ndarray,
    w: np.ndarray,
    bias: np.ndarray | None,
    strides: tuple[int, int] = (1, 1),
    pads: tuple[int, int, int, int] = (0, 0, 0, 0),
) -> np.ndarray:
    """ONNX Runtime's float32 Conv (group 1, no dilation) of NCHW `x` by OIHW `w`, rounded as MLAS rounds
    it (module docstring); the output NCHW."""
    m, _, kh, kw = w.shape
    outs = []
    for image in x.astype(np.float32):
        b = patches(image, (kh, kw), strides, pads)
        a = w.reshape(m, -1).astype(np.float32)
        k, n = b.shape
        total: np.ndarray | None = None
        bounds = (*sgemm_slices(n, k), k)
        for start, end in itertools.pairwise(bounds):
            acc = np.zeros((m, n), np.float32)
            for i in range(start, end):
                acc = fma32(a[:, i : i + 1], b[i : i + 1, :], acc)
            total = acc if total is None else (total + acc).astype(np.float32)
        assert total is not None
        if bias is not None:
            total = (total + bias.astype(np.float32).reshape(-1, 1)).astype(np.float32)
        outs.append(total.reshape(m, (image.shape[1] + pads[0] + pads[2] - kh) // strides[0] + 1, -1))
    return np.stack(outs)


def dequantize_node(graph: Graph, dq: Node, q: np.ndarray, axis: int) -> np.ndarray:
    """DequantizeLinear `dq` of `q` as ONNX Runtime computes it, its scale and zero point along `axis`."""
    shape = [1] * q.ndim
    scale, zero = graph.constants[dq.inputs[1]], graph.constants[dq.inputs[2]]
    shape[axis] = scale.size
    diff = (q.astype(np.int32) - zero.reshape(shape).astype(np.int32)).astype(np.float32)
    return (diff * scale.reshape(shape).astype(np.float32)).astype(np.float32)


def float_unit(graph: Graph, conv: Node, x_q: np.ndarray) -> np.ndarray:
    """What ONNX Runtime computes for the QDQ unit of `conv` (a Conv of `graph` as load_graph(qdq=True)
    gives it: DequantizeLinear of the 8-bit input, of constant weights per output channel and of an int32
    bias -> Conv -> QuantizeLinear) where it runs it in float: the float Conv `mlas_conv` of the
    dequantized values, then QuantizeLinear; the 8-bit output for the 8-bit input `x_q` (NCHW)."""
    writers, readers = graph.producers(), graph.consumers()
    dq_x, dq_w, *dq_b = (graph.nodes[writers[t]] for t in conv.inputs)
    weights = graph.constants[dq_w.inputs[0]]
    bias = dequantize_node(graph, dq_b[0], graph.constants[dq_b[0].inputs[0]], 0) if dq_b else None
    (q,) = (graph.nodes[i] for i in readers[conv.outputs[0]])
    sh, sw = conv.ints("strides", (1, 1))
    top, left, bottom, right = conv.ints("pads", (0, 0, 0, 0))
    y = mlas_conv(
        dequantize_node(graph, dq_x, x_q, 1),
        dequantize_node(graph, dq_w, weights, 0),
        bias,
        (sh, sw),
        (top, left, bottom, right),
    )
    out = node_qparams(graph, q)
    assert out is not None, f"{q.name}: a per-tensor QuantizeLinear"
    return out.quantize(y)
