"""The pooling family of a network's generated operators: ONNX's MaxPool and AveragePool (`Pool2d`) and
GlobalAveragePool, in NCHW or NHWC (the layout pass's, xtune/firmware/relayout.py). Semantics as ONNX defines
them: `pads` as (top, left, bottom, right) (or auto_pad: conv.same_pads), ceil_mode=0 and, for AveragePool,
count_include_pad=0 (padding is neither a maximum candidate nor counted in the mean) or 1 (the mean of the
whole window, padding counted as zeros: what a zero Pad folded into it is). Pooling
with unit column stride runs whole output rows as vectors; with column stride 2 the window's input columns
are not contiguous and each output is computed as a scalar (such pools are one layer of a network); in NHWC,
pooling runs along channels, any stride. Pooling windows that overlap the padding are specialised at build
time (their clipped extent is a constant), so the interior has no bounds checks.

An int8 or uint8 AveragePool (the quantized rewrite makes one of a TFLite model's AVERAGE_POOL_2D:
xtune/frontend/quantized.py) is TFLite's integer average (`RoundedMean`), as its reference kernel computes
it (tensorflow/lite/kernels/internal/reference/integer_ops/pooling.h, AveragePool; reference_ops' uint8
one alike): the stored integers of the window's pixels inside the input summed in int32, divided by their
count rounding half away from zero (`acc > 0 ? (acc + n/2) / n : (acc - n/2) / n`, C's truncating
division), clamped to the fused activation's range. The input and output share one scale and zero point
(TFLite's pooling Prepare checks it), so no rescaling and no float; a float average rounded by
QuantizeLinear (half to even) differs from it on exact ties."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from enum import Enum
from typing import cast

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
from xtune.ops.quantize import QDTYPES, RANGES, QType
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
class RoundedMean:
    """TFLite's integer average of `qtype` values: a window's int32 sum divided by its count, rounded half
    away from zero, clamped to [lo, hi] (the fused activation's range, CalculateActivationRangeQuantized)."""

    qtype: QType
    lo: int
    hi: int

    def reference(self, total: np.ndarray, count: int | np.ndarray) -> np.ndarray:
        """The rounded means of integer sums `total` over `count` taps, as C computes them."""
        half = np.asarray(count) // 2
        away = np.where(total > 0, (total + half) // count, -((half - total) // count))
        return np.clip(away, self.lo, self.hi)

    def value(self, b: NestBuilder, taps: Sequence[Value], width: int) -> Value:
        """The rounded mean of the taps (8-bit loads), stored type. The sum is a register: it is read
        twice, by its sign and by the division."""
        total = b.register(f"sum{width}", width, DType.I32)
        acc: Value = Cast(taps[0], DType.I32)
        for tap in taps[1:]:
            acc = Binary(BinaryOp.ADD, acc, Cast(tap, DType.I32))
        b.assign(total, acc)
        i32 = lambda v: Const(v, width, DType.I32)  # noqa: E731
        sign = Binary(BinaryOp.SHR, total, i32(31))  # -1 where the sum is negative, else 0
        half = Binary(BinaryOp.SUB, Binary(BinaryOp.XOR, i32(len(taps) // 2), sign), sign)  # +-n/2
        mean = Binary(BinaryOp.DIV, Binary(BinaryOp.ADD, total, half), i32(len(taps)))
        clamped = Binary(BinaryOp.MIN, Binary(BinaryOp.MAX, mean, i32(self.lo)), i32(self.hi))
        return Cast(clamped, QDTYPES[self.qtype])


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
    rounded: RoundedMean | None = None  # an 8-bit average, TFLite's (float32 when None)

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
        if self.rounded is not None and (self.kind is PoolKind.MAX or self.count_pad):
            raise InputError("pool: an 8-bit pool is an average over the pixels inside the input")

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
        (kh, kw), (sh, sw), (pt, pl, pb, pr) = self.kernel, self.stride, self.pads
        fill = -np.inf if self.kind is PoolKind.MAX else 0.0
        kind = np.float64 if self.rounded is None else np.int64
        padded = np.pad(x.astype(kind), ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=fill)
        valid = np.pad(np.ones((self.h, self.w), np.int64), ((pt, pb), (pl, pr)))
        oh, ow = self._nchw_output[2:]
        out = np.empty(self._nchw_output, kind)
        for i in range(oh):
            for j in range(ow):
                win = padded[:, :, i * sh : i * sh + kh, j * sw : j * sw + kw]
                if self.kind is PoolKind.MAX:
                    out[:, :, i, j] = win.max(axis=(2, 3))
                else:
                    taps = (
                        kh * kw if self.count_pad else valid[i * sh : i * sh + kh, j * sw : j * sw + kw].sum()
                    )
                    total = win.sum(axis=(2, 3))
                    out[:, :, i, j] = (
                        total / taps if self.rounded is None else self.rounded.reference(total, taps)
                    )
        return out.astype(np.float32 if self.rounded is None else self.rounded.qtype)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
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
        """The input and output, float32 or the 8-bit type of a `rounded` average."""
        size = self.n * self.c
        buffers = params([("x", size * self.h * self.w)], size * math.prod(self._nchw_output[2:]))
        if self.rounded is None:
            return buffers
        return tuple(replace(buf, dtype=QDTYPES[self.rounded.qtype]) for buf in buffers)

    def _reduce(self, b: NestBuilder, taps: Sequence[Value], width: int) -> Value:
        """A window's taps reduced: their max, or their mean (over the taps inside the image, ONNX's
        count_include_pad=0; over the whole window with `count_pad`), TFLite's integer one if `rounded`."""
        if self.rounded is not None:
            return self.rounded.value(b, taps, width)
        op = BinaryOp.MAX if self.kind is PoolKind.MAX else BinaryOp.ADD
        acc: Value = taps[0]
        for tap in taps[1:]:
            acc = Binary(op, acc, tap)
        if self.kind is PoolKind.AVERAGE:
            count = self.kernel[0] * self.kernel[1] if self.count_pad else len(taps)
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

    def __post_init__(self) -> None:
        positive("global average pool", n=self.n, c=self.c, h=self.h, w=self.w)

    @property
    def output_shape(self) -> Shape:
        return (self.n, self.c, 1, 1)

    def reference(self, x: np.ndarray) -> np.ndarray:
        axes = (1, 2) if self.layout is Layout.NHWC else (2, 3)
        return x.astype(np.float64).mean(axis=axes).reshape(self.output_shape).astype(np.float32)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
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


def _pool(graph: Graph, node: Node, shape: tuple[int, ...], rounded: RoundedMean | None) -> Pool2d:
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
            rounded=rounded,
        )


def _rounded(graph: Graph, node: Node) -> RoundedMean:
    """The integer average of an 8-bit AveragePool: one the quantized rewrite made of a TFLite model's
    (its `requant="tflite"`; the fused activation's clamp in `out_lo`/`out_hi`, xtune/frontend/
    quantized.py). ONNX has no 8-bit AveragePool: any other is refused."""
    qtype = graph.dtype(node.inputs[0])
    if node.op != "AveragePool" or node.attr("requant", "") != "tflite" or qtype not in RANGES:
        raise refuse(graph, node, f"the input is {qtype}; xtune pools 8-bit tensors as TFLite's AveragePool")
    if graph.dtype(node.outputs[0]) != qtype:
        raise refuse(graph, node, "the output's type differs from the input's")
    lo, hi = RANGES[qtype]
    return RoundedMean(
        qtype=cast(QType, qtype),
        lo=max(lo, node.int_attr("out_lo", lo)),
        hi=min(hi, node.int_attr("out_hi", hi)),
    )


def from_node(graph: Graph, node: Node, consts: Consts, nxt: Node | None) -> Mapped:
    x = node.inputs[0]
    shape = graph.shape(x)
    rounded = _rounded(graph, node) if graph.dtype(x) != "float32" else None
    if node.op == "GlobalAveragePool":
        if len(shape) != 4:
            raise refuse(graph, node, UNSUPPORTED)
        return Mapped(kernel=GlobalAveragePool(n=shape[0], c=shape[1], h=shape[2], w=shape[3]), inputs=(x,))
    pool = _pool(graph, node, shape, rounded)
    # An 8-bit pool runs in the layout its input is in: xtune converts float32 tensors only.
    return Mapped(kernel=pool, inputs=(x,), follows_input=True if rounded is not None else None)


FAMILY = NodeFamily(
    kind="pooling",
    onnx_ops=("MaxPool", "AveragePool", "GlobalAveragePool"),
    layouts=frozenset(Layout),
    from_node=from_node,
)
