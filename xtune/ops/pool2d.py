"""The pooling family of a network's generated operators: ONNX's MaxPool and AveragePool (`Pool2d`) and
GlobalAveragePool, in NCHW or NHWC (the layout pass's, xtune/firmware/relayout.py). Semantics as ONNX defines
them: `pads` as (top, left, bottom, right) (or auto_pad: conv.same_pads), ceil_mode=0 and, for AveragePool,
count_include_pad=0 (padding is neither a maximum candidate nor counted in the mean) or 1 (the mean of the
whole window, padding counted as zeros: what a zero Pad folded into it is). Pooling
with unit column stride runs whole output rows as vectors; with column stride 2 the window's input columns
are not contiguous and each output is computed as a scalar (such pools are one layer of a network); in NHWC,
pooling runs along channels, any stride. Pooling windows that overlap the padding are specialised at build
time (their clipped extent is a constant), so the interior has no bounds checks.

ONNX Runtime's QLinearAveragePool (com.microsoft; the quantized rewrite makes one of a QDQ AveragePool
and of a TFLite model's int8 AVERAGE_POOL_2D: xtune/frontend/quantized.py) is the same window over 8-bit
tensors, each window's mean computed as the model's reference computes it (xtune/ops/qpool.py); so is a
MaxPool whose input is int8 or uint8 (a QOperator model's, or the rewrite's of a QDQ MaxPool and of a
TFLite int8 MAX_POOL_2D), each window's maximum compared in the 8-bit type (qpool.py's ClampedMax); a TFLite
model's int8/uint8 MEAN over H and W (a QLinearGlobalAveragePool marked `requant="tflite"`, which
xtune/ops/qpointwise.py maps) is the global pool over 8-bit tensors, its int32 sums rescaled as TFLite's
MEAN does (qpool.py's ScaledMean)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.anchor import refuse
from xtune.ops.conv import same_pads
from xtune.ops.layout import Layout, physical, to_layout
from xtune.ops.opkit import (
    UNSUPPORTED,
    ChannelsOp,
    Consts,
    Mapped,
    NodeFamily,
    Shape,
    hsum_or_max,
    params,
    positive,
    refusing,
)
from xtune.ops.qpool import ClampedMax, QuantizedWindow, ScaledMean, clamped_max, quantized_mean
from xtune.ops.quantize import QDTYPES, RANGES
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Buffer,
    BufferKind,
    Cast,
    Const,
    DType,
    Kernel,
    Load,
    NestBuilder,
    Value,
)

QLINEAR_POOL = "com.microsoft.QLinearAveragePool"


class PoolKind(Enum):
    MAX = "max"
    AVERAGE = "average"


@dataclass(frozen=True)
class _Segment:
    """Consecutive outputs along one axis whose windows cover the same kernel taps [lo, hi)."""

    start: int
    count: int
    lo: int
    hi: int


def _segments(out: int, size: int, k: int, stride: int, pad: int) -> list[_Segment]:
    """Outputs along an axis: each one whose window overlaps the padding alone, the interior as one run."""
    first = min(out, -(-pad // stride))  # first output whose window starts inside the input
    last = min(out - 1, (size + pad - k) // stride)  # last output whose window ends inside it
    segments = []
    for o in range(out):
        if first <= o <= last:
            if o == first:
                segments.append(_Segment(first, last - first + 1, 0, k))
            continue
        lo, hi = max(0, pad - o * stride), min(k, size + pad - o * stride)
        segments.append(_Segment(o, 1, lo, hi))
    return segments


@dataclass(frozen=True, kw_only=True)
class Pool2d(ChannelsOp):
    """MaxPool / AveragePool over (n, c, h, w), or (n, h, w, c) in NHWC; pads (top, left, bottom, right)."""

    kind: PoolKind
    n: int
    c: int
    h: int
    w: int
    kernel: tuple[int, int]
    stride: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)
    layout: Layout = Layout.NCHW
    count_pad: bool = False  # an average divides by the whole window (ONNX's count_include_pad=1)
    quantized: QuantizedWindow | None = None  # an 8-bit mean or maximum of each window; float32 when None

    def __post_init__(self) -> None:
        positive(
            "pool",
            n=self.n,
            c=self.c,
            h=self.h,
            w=self.w,
            kh=self.kernel[0],
            kw=self.kernel[1],
            stride_h=self.stride[0],
            stride_w=self.stride[1],
        )
        if (
            min(self.pads) < 0
            or self.pads[0] >= self.kernel[0]
            or self.pads[2] >= self.kernel[0]
            or (self.pads[1] >= self.kernel[1] or self.pads[3] >= self.kernel[1])
        ):
            raise InputError(f"pool: pads {self.pads} must be non-negative and smaller than the kernel")
        oh, ow = self._nchw_output[2:]
        if oh < 1 or ow < 1:
            raise InputError(f"pool: a {self.kernel} window does not fit a padded {self.h}x{self.w} input")
        maximum = isinstance(self.quantized, ClampedMax)
        if self.quantized is not None and (self.kind is PoolKind.MAX) != maximum:
            what = type(self.quantized).__name__
            raise InputError(f"pool: an 8-bit {self.kind.value} pool cannot take {what}")

    @property
    def output_shape(self) -> Shape:
        return physical(self._nchw_output, self.layout)

    @property
    def _nchw_output(self) -> Shape:
        (kh, kw), (sh, sw), (pt, pl, pb, pr) = self.kernel, self.stride, self.pads
        return (self.n, self.c, (self.h + pt + pb - kh) // sh + 1, (self.w + pl + pr - kw) // sw + 1)

    def reference(self, x: np.ndarray) -> np.ndarray:
        if self.layout is Layout.NHWC:
            nchw = replace(self, layout=Layout.NCHW)
            return to_layout(nchw.reference(np.ascontiguousarray(x.transpose(0, 3, 1, 2))), Layout.NHWC)
        if self.quantized is not None:
            return self._quantized_reference(x)
        (kh, kw), (sh, sw), (pt, pl, pb, pr) = self.kernel, self.stride, self.pads
        fill = -np.inf if self.kind is PoolKind.MAX else 0.0
        padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
        valid = np.pad(np.ones((self.h, self.w)), ((pt, pb), (pl, pr)))
        oh, ow = self._nchw_output[2:]
        out = np.empty(self._nchw_output)
        for i in range(oh):
            for j in range(ow):
                win = padded[:, :, i * sh : i * sh + kh, j * sw : j * sw + kw]
                if self.kind is PoolKind.MAX:
                    out[:, :, i, j] = win.max(axis=(2, 3))
                else:
                    taps = (
                        kh * kw if self.count_pad else valid[i * sh : i * sh + kh, j * sw : j * sw + kw].sum()
                    )
                    out[:, :, i, j] = win.sum(axis=(2, 3)) / taps
        return out.astype(np.float32)

    def _quantized_reference(self, x: np.ndarray) -> np.ndarray:
        """NCHW 8-bit means or maxima, each from its window's pixels inside the input in window order."""
        assert self.quantized is not None
        (kh, kw), (sh, sw), (pt, pl, _, _) = self.kernel, self.stride, self.pads
        out = np.empty(self._nchw_output, self.quantized.qtype)
        for i in range(out.shape[2]):
            rows = range(max(0, i * sh - pt), min(self.h, i * sh - pt + kh))
            for j in range(out.shape[3]):
                cols = range(max(0, j * sw - pl), min(self.w, j * sw - pl + kw))
                taps = [x[:, :, r, c] for r in rows for c in cols]
                out[:, :, i, j] = self.quantized.reference(taps, kh * kw if self.count_pad else len(taps))
        return out

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        if isinstance(self.quantized, ClampedMax):
            # `lanes` counts float32 values: a vector register holds four times as many 8-bit ones, which
            # a maximum compares as they are (a mean widens them to int32 or float32 first).
            lanes *= 4
        if self.layout is Layout.NHWC:
            return self._nhwc_nest(name, lanes)
        (kh, kw), (sh, sw), (pt, pl, _, _) = self.kernel, self.stride, self.pads
        _, _, oh, ow = self.output_shape
        b = NestBuilder()
        for rows in _segments(oh, self.h, kh, sh, pt):
            for cols in _segments(ow, self.w, kw, sw, pl):
                with b.loop(self.n * self.c, "p") as p, b.loop(rows.count, "y") as y:
                    oy = y + rows.start
                    in_row = p * (self.h * self.w) + (oy * sh + (-pt)) * self.w + (-pl)
                    self._row(b, in_row, p * (oh * ow) + oy * ow, rows, cols, lanes)
        return b.kernel(name, self._params())

    def _row(
        self, b: NestBuilder, in_row: Affine, out_row: Affine, rows: _Segment, cols: _Segment, lanes: int
    ) -> None:
        """The outputs `cols` of one output row: vectors of outputs where columns are contiguous."""
        sw = self.stride[1]

        def window(ox: Affine, width: int, count: int) -> None:
            taps = [
                Load("x", in_row + ky * self.w + ox * sw + kx, width, count)
                for ky in range(rows.lo, rows.hi)
                for kx in range(cols.lo, cols.hi)
            ]
            b.store("out", out_row + ox, self._reduce(b, taps, width), width, count)

        if sw == 1 and lanes > 1:
            b.split(cols.count, lanes, lambda t, n: window(t + cols.start, lanes, n), "x")
        else:
            with b.loop(cols.count, "x") as x:
                window(x + cols.start, 1, 1)

    def _params(self) -> tuple[Buffer, ...]:
        """The input and output, float32 or the 8-bit type of a `quantized` pool."""
        size = self.n * self.c
        buffers = params([("x", size * self.h * self.w)], size * math.prod(self._nchw_output[2:]))
        if self.quantized is None:
            return buffers
        return tuple(replace(buf, dtype=QDTYPES[self.quantized.qtype]) for buf in buffers)

    def _reduce(self, b: NestBuilder, taps: Sequence[Value], width: int) -> Value:
        """A window's taps reduced: their max, or their mean (over the taps inside the image, ONNX's
        count_include_pad=0; over the whole window with `count_pad`), the model's reference's if
        `quantized`."""
        count = self.kernel[0] * self.kernel[1] if self.count_pad else len(taps)
        if self.quantized is not None:
            return self.quantized.value(b, taps, width, count)
        op = BinaryOp.MAX if self.kind is PoolKind.MAX else BinaryOp.ADD
        acc: Value = taps[0]
        for tap in taps[1:]:
            acc = Binary(op, acc, tap)
        if self.kind is PoolKind.AVERAGE:  # divided, as ONNX Runtime's AveragePool does: not by a reciprocal
            acc = Binary(BinaryOp.DIV, acc, Const(float(count), width))
        return acc

    def _nhwc_nest(self, name: str, lanes: int) -> Kernel:
        """NHWC: channels are contiguous, so every output pixel's channels run as vectors, any stride."""
        (kh, kw), (sh, sw), (pt, pl, _, _) = self.kernel, self.stride, self.pads
        _, oh, ow, c = self.output_shape
        b, row = NestBuilder(), self.w * c
        for rows in _segments(oh, self.h, kh, sh, pt):
            for cols in _segments(ow, self.w, kw, sw, pl):
                with b.loop(self.n, "n") as img, b.loop(rows.count, "y") as y, b.loop(cols.count, "x") as x:
                    oy, ox = y + rows.start, x + cols.start
                    at = img * (self.h * row) + (oy * sh + (-pt)) * row + (ox * sw + (-pl)) * c
                    out = img * (oh * ow * c) + (oy * ow + ox) * c

                    def window(
                        ch: Affine,
                        count: int,
                        at: Affine = at,
                        out: Affine = out,
                        rows: _Segment = rows,
                        cols: _Segment = cols,
                    ) -> None:
                        taps = [
                            Load("x", at + ch + ky * row + kx * c, lanes, count)
                            for ky in range(rows.lo, rows.hi)
                            for kx in range(cols.lo, cols.hi)
                        ]
                        b.store("out", out + ch, self._reduce(b, taps, lanes), lanes, count)

                    b.split(c, lanes, window, "c")
        return b.kernel(name, self._params())


@dataclass(frozen=True, kw_only=True)
class GlobalAveragePool(ChannelsOp):
    """The mean of each channel of (n, c, h, w), or of (n, h, w, c) in NHWC: (n, c, 1, 1) either way."""

    n: int
    c: int
    h: int
    w: int
    layout: Layout = Layout.NCHW
    quantized: ScaledMean | None = None  # TFLite's 8-bit MEAN over the plane; float32 when None

    def __post_init__(self) -> None:
        positive("global average pool", n=self.n, c=self.c, h=self.h, w=self.w)

    @property
    def output_shape(self) -> Shape:
        return (self.n, self.c, 1, 1)

    def reference(self, x: np.ndarray) -> np.ndarray:
        axes = (1, 2) if self.layout is Layout.NHWC else (2, 3)
        if self.quantized is not None:
            return self.quantized.reference(x.astype(np.int64).sum(axis=axes)).reshape(self.output_shape)
        return x.astype(np.float64).mean(axis=axes).reshape(self.output_shape).astype(np.float32)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        if self.quantized is not None:
            return self._integer_nest(name, lanes, self.quantized)
        if self.layout is Layout.NHWC:
            return self._nhwc_nest(name, lanes)
        b, plane = NestBuilder(), self.h * self.w
        acc = b.register("acc", lanes)
        with b.loop(self.n * self.c, "p") as p:
            b.assign(acc, Const(0.0, lanes))
            b.split(
                plane,
                lanes,
                lambda i, n: b.assign(acc, Binary(BinaryOp.ADD, acc, Load("x", p * plane + i, lanes, n))),
            )
            total = hsum_or_max(b, acc, lanes, BinaryOp.ADD)
            b.store("out", p, Binary(BinaryOp.MUL, total, Const(1.0 / plane)))
        size = self.n * self.c
        red = (Buffer("red", lanes, BufferKind.LOCAL),) if lanes > 1 else ()
        return b.kernel(name, (*params([("x", size * plane)], size), *red))

    def _nhwc_nest(self, name: str, lanes: int) -> Kernel:
        """NHWC: a vector of channels summed over the pixels, no horizontal reduction."""
        b, plane, c = NestBuilder(), self.h * self.w, self.c
        acc = b.register("acc", lanes)

        def channels(img: Affine, ch: Affine, count: int) -> None:
            b.assign(acc, Const(0.0, lanes))
            with b.loop(plane, "p") as p:
                b.assign(
                    acc, Binary(BinaryOp.ADD, acc, Load("x", img * (plane * c) + p * c + ch, lanes, count))
                )
            b.store("out", img * c + ch, Binary(BinaryOp.MUL, acc, Const(1.0 / plane, lanes)), lanes, count)

        with b.loop(self.n, "n") as img:
            b.split(c, lanes, lambda ch, count: channels(img, ch, count), "c")
        return b.kernel(name, params([("x", self.n * c * plane)], self.n * c))

    def _integer_nest(self, name: str, lanes: int, mean: ScaledMean) -> Kernel:
        """The 8-bit pixels summed in int32 (in the order of TFLite's loops; an integer sum is the same in
        any), then rescaled: NHWC a vector of channels at a time, NCHW one channel at a time."""
        b, plane, c = NestBuilder(), self.h * self.w, self.c
        nhwc = self.layout is Layout.NHWC
        width = lanes if nhwc else 1
        acc = b.register("acc", width, DType.I32)

        def channels(img: Affine, ch: Affine, count: int) -> None:
            b.assign(acc, Const(0, width, DType.I32))
            with b.loop(plane, "p") as p:
                at = img * (plane * c) + (p * c + ch if nhwc else ch * plane + p)
                b.assign(acc, Binary(BinaryOp.ADD, acc, Cast(Load("x", at, width, count), DType.I32)))
            b.store("out", img * c + ch, mean.value(acc, width), width, count)

        with b.loop(self.n, "n") as img:
            if nhwc:
                b.split(c, lanes, lambda ch, count: channels(img, ch, count), "c")
            else:
                with b.loop(c, "c") as ch:
                    channels(img, ch, 1)
        buffers = params([("x", self.n * c * plane)], self.n * c)
        return b.kernel(name, tuple(replace(buf, dtype=QDTYPES[mean.qtype]) for buf in buffers))


def _pool(graph: Graph, node: Node, shape: tuple[int, ...], quantized: QuantizedWindow | None) -> Pool2d:
    if len(shape) != 4:
        raise refuse(graph, node, f"only 2-D pooling (4-D NCHW input) is supported, the input is {shape}")
    auto_pad = str(node.attr("auto_pad", "NOTSET"))
    refusals = (
        (int(node.attr("ceil_mode", 0)) != 0, "ceil_mode=1"),  # type: ignore[arg-type]
        (any(d != 1 for d in node.ints("dilations", (1, 1))), "dilations"),
        (auto_pad not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"), f"auto_pad {auto_pad}"),
        (int(node.attr("storage_order", 0)) != 0, "storage_order=1"),  # type: ignore[arg-type]
    )
    for bad, what in refusals:
        if bad:
            raise refuse(graph, node, f"{what} is not supported")
    kernel = node.ints("kernel_shape", ())
    stride = node.ints("strides", (1, 1))
    pads = (0, 0, 0, 0) if auto_pad == "VALID" else node.ints("pads", (0, 0, 0, 0))
    if auto_pad.startswith("SAME") and len(kernel) == 2 and len(stride) == 2:
        pads = same_pads(auto_pad, shape[2:], stride, (1, 1), kernel)
    if len(kernel) != 2 or len(stride) != 2 or len(pads) != 4:
        raise refuse(graph, node, "kernel_shape, strides and pads must describe a 2-D window")
    kind = PoolKind.MAX if node.op == "MaxPool" else PoolKind.AVERAGE
    counts_pad = int(node.attr("count_include_pad", 0)) != 0  # type: ignore[arg-type]
    n, c, h, w = shape
    with refusing(graph, node):  # pads as large as the window, a window larger than the padded input
        return Pool2d(
            kind=kind,
            n=n,
            c=c,
            h=h,
            w=w,
            kernel=(kernel[0], kernel[1]),
            stride=(stride[0], stride[1]),
            pads=(pads[0], pads[1], pads[2], pads[3]),
            count_pad=kind is PoolKind.AVERAGE and counts_pad,
            quantized=quantized,
        )


def pools_8bit(graph: Graph, node: Node) -> bool:
    """Whether the pooling family runs `node` over 8-bit tensors: a QLinearAveragePool, a MaxPool of an int8
    or uint8 input."""
    return node.op == QLINEAR_POOL or (node.op == "MaxPool" and graph.dtype(node.inputs[0]) in RANGES)


def _quantized_window(graph: Graph, node: Node) -> QuantizedWindow | None:
    """How an 8-bit pool computes a window: a QLinearAveragePool's mean, the maximum of a MaxPool over an
    int8 or uint8 tensor; None for a float32 pool."""
    if not pools_8bit(graph, node):
        return None
    return quantized_mean(graph, node) if node.op == QLINEAR_POOL else clamped_max(graph, node)


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    x = node.inputs[0]
    shape = graph.shape(x)
    quantized = _quantized_window(graph, node)
    if node.op == "GlobalAveragePool":
        if len(shape) != 4:
            raise refuse(graph, node, UNSUPPORTED)
        return Mapped(kernel=GlobalAveragePool(n=shape[0], c=shape[1], h=shape[2], w=shape[3]), inputs=(x,))
    pool = _pool(graph, node, shape, quantized)
    # An 8-bit pool runs in the layout its input is in: xtune converts float32 tensors only.
    return Mapped(kernel=pool, inputs=(x,), follows_input=True if quantized is not None else None)


FAMILY = NodeFamily(
    kind="pooling",
    onnx_ops=("MaxPool", "AveragePool", "GlobalAveragePool", QLINEAR_POOL),
    layouts=frozenset(Layout),
    from_node=from_node,
)
