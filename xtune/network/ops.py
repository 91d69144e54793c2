"""The operators of a network that are not tuned tasks: shapes in; the output shape, a numpy reference and
a loop-nest `Kernel` (lowered by xtune.codegen.lower like any template's) out. NCHW, float32.

Every kernel takes its inputs then its output as pointer parameters, in that order, and writes every
element of the output. The parameters must not overlap, except that an elementwise kernel's output may be
exactly one of its inputs (it runs in place, `Kernel.noalias` is off). Semantics follow the ONNX operator
definitions (https://onnx.ai/onnx/operators/): MaxPool and AveragePool with `pads` as (top, left, bottom,
right), ceil_mode=0 and, for AveragePool, the default count_include_pad=0 (padding is neither a maximum
candidate nor counted in the mean); GlobalAveragePool; Add (same shapes, optionally followed by ReLU);
Relu and Clip; Softmax over the last axis (opset 13); Concat along channels; Flatten/Reshape, which need no
code at all: the output is the input's bytes (`Reshape.alias`), which the memory planner shares
(xtune/network/memory.py, `alias_of`).

Vectorization: elementwise ops, Concat and Softmax run along contiguous memory in vectors of the target's
fp32 lanes (a partial vector at the end, never a read past it); pooling with unit column stride runs whole
output rows as vectors; with column stride 2 the window's input columns are not contiguous and each output
is computed as a scalar (such pools are one layer of a network). Pooling windows that overlap the padding
are specialised at build time (their clipped extent is a constant), so the interior has no bounds checks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum

import numpy as np

from xtune.errors import InputError
from xtune.network.layout import Layout, physical, to_layout
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Broadcast,
    Buffer,
    BufferKind,
    Const,
    Exp,
    Kernel,
    Load,
    LoopKind,
    NestBuilder,
    Reg,
    Shuffle,
    Value,
)

Shape = tuple[int, ...]
UNROLL = 4  # vectors per iteration of an elementwise loop: enough independent work to hide latency


def _positive(op: str, **sizes: int) -> None:
    for name, value in sizes.items():
        if value < 1:
            raise InputError(f"{op}: '{name}' must be a positive integer, got {value}")


def _params(inputs: list[tuple[str, int]], output: int) -> tuple[Buffer, ...]:
    return (*(Buffer(n, s, BufferKind.INPUT) for n, s in inputs), Buffer("out", output, BufferKind.OUTPUT))


def _vector_map(b: NestBuilder, size: int, lanes: int, emit: Callable[[Affine, int, int], None]) -> None:
    """Calls emit(index, lanes, count) over range(size): UNROLL vectors per loop iteration, then the rest,
    the last vector partial (count < lanes) where size is not a multiple of lanes."""

    def block(base: Affine, n: int) -> None:
        if n == UNROLL * lanes:
            with b.loop(UNROLL, "u", LoopKind.UNROLLED) as u:
                emit(base + u * lanes, lanes, lanes)
            return
        for start in range(0, n, lanes):
            emit(base + start, lanes, min(lanes, n - start))

    b.split(size, UNROLL * lanes, block, "v")


def _hsum_or_max(b: NestBuilder, acc: Reg, lanes: int, op: BinaryOp) -> Value:
    """The lanes of vector register `acc` reduced to one scalar, through a stack slot."""
    if lanes == 1:
        return acc
    b.store("red", Affine(), acc, lanes)
    total: Value = Load("red", Affine())
    for lane in range(1, lanes):
        total = Binary(op, total, Load("red", Affine.of(lane)))
    return total


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
class Pool2d:
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

    def __post_init__(self) -> None:
        _positive("pool", n=self.n, c=self.c, h=self.h, w=self.w, kh=self.kernel[0], kw=self.kernel[1],
                  stride_h=self.stride[0], stride_w=self.stride[1])  # fmt: skip
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

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (physical((self.n, self.c, self.h, self.w), self.layout),)

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
                    taps = valid[i * sh : i * sh + kh, j * sw : j * sw + kw].sum()
                    out[:, :, i, j] = win.sum(axis=(2, 3)) / taps
        return out.astype(np.float32)

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
        size = self.n * self.c
        return b.kernel(name, _params([("x", size * self.h * self.w)], size * oh * ow))

    def _row(self, b: NestBuilder, in_row: Affine, out_row: Affine, rows: _Segment, cols: _Segment,
             lanes: int) -> None:  # fmt: skip
        """The outputs `cols` of one output row: vectors of outputs where columns are contiguous."""
        sw = self.stride[1]
        op = BinaryOp.MAX if self.kind is PoolKind.MAX else BinaryOp.ADD

        def window(ox: Affine, width: int, count: int) -> None:
            acc: Value | None = None
            for ky in range(rows.lo, rows.hi):
                for kx in range(cols.lo, cols.hi):
                    tap = Load("x", in_row + ky * self.w + ox * sw + kx, width, count)
                    acc = tap if acc is None else Binary(op, acc, tap)
            assert acc is not None
            if self.kind is PoolKind.AVERAGE:
                taps = (rows.hi - rows.lo) * (cols.hi - cols.lo)
                acc = Binary(BinaryOp.MUL, acc, Const(1.0 / taps, width))
            b.store("out", out_row + ox, acc, width, count)

        if sw == 1 and lanes > 1:
            b.split(cols.count, lanes, lambda t, n: window(t + cols.start, lanes, n), "x")
        else:
            with b.loop(cols.count, "x") as x:
                window(x + cols.start, 1, 1)

    def _nhwc_nest(self, name: str, lanes: int) -> Kernel:
        """NHWC: channels are contiguous, so every output pixel's channels run as vectors, any stride."""
        (kh, kw), (sh, sw), (pt, pl, _, _) = self.kernel, self.stride, self.pads
        _, oh, ow, c = self.output_shape
        op = BinaryOp.MAX if self.kind is PoolKind.MAX else BinaryOp.ADD
        b, row = NestBuilder(), self.w * c
        for rows in _segments(oh, self.h, kh, sh, pt):
            for cols in _segments(ow, self.w, kw, sw, pl):
                with b.loop(self.n, "n") as img, b.loop(rows.count, "y") as y, b.loop(cols.count, "x") as x:
                    oy, ox = y + rows.start, x + cols.start
                    at = img * (self.h * row) + (oy * sh + (-pt)) * row + (ox * sw + (-pl)) * c
                    out = img * (oh * ow * c) + (oy * ow + ox) * c

                    def window(ch: Affine, count: int, at: Affine = at, out: Affine = out,
                               rows: _Segment = rows, cols: _Segment = cols) -> None:  # fmt: skip
                        acc: Value | None = None
                        for ky in range(rows.lo, rows.hi):
                            for kx in range(cols.lo, cols.hi):
                                tap = Load("x", at + ch + ky * row + kx * c, lanes, count)
                                acc = tap if acc is None else Binary(op, acc, tap)
                        assert acc is not None
                        if self.kind is PoolKind.AVERAGE:
                            taps = (rows.hi - rows.lo) * (cols.hi - cols.lo)
                            acc = Binary(BinaryOp.MUL, acc, Const(1.0 / taps, lanes))
                        b.store("out", out + ch, acc, lanes, count)

                    b.split(c, lanes, window, "c")
        size = self.n * self.c
        return b.kernel(name, _params([("x", size * self.h * self.w)], size * oh * ow))


@dataclass(frozen=True, kw_only=True)
class GlobalAveragePool:
    """The mean of each channel of (n, c, h, w), or of (n, h, w, c) in NHWC: (n, c, 1, 1) either way."""

    n: int
    c: int
    h: int
    w: int
    layout: Layout = Layout.NCHW

    def __post_init__(self) -> None:
        _positive("global average pool", n=self.n, c=self.c, h=self.h, w=self.w)

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (physical((self.n, self.c, self.h, self.w), self.layout),)

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
            b.split(plane, lanes, lambda i, n: b.assign(acc, Binary(BinaryOp.ADD, acc,
                                                        Load("x", p * plane + i, lanes, n))))  # fmt: skip
            total = _hsum_or_max(b, acc, lanes, BinaryOp.ADD)
            b.store("out", p, Binary(BinaryOp.MUL, total, Const(1.0 / plane)))
        size = self.n * self.c
        red = (Buffer("red", lanes, BufferKind.LOCAL),) if lanes > 1 else ()
        return b.kernel(name, (*_params([("x", size * plane)], size), *red))

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
        return b.kernel(name, _params([("x", self.n * c * plane)], self.n * c))


@dataclass(frozen=True, kw_only=True)
class Transpose:
    """A 4-D activation converted between layouts: (n, c, h, w) to (n, h, w, c) (`to` NHWC), or back. The
    layout pass (xtune/network/relayout.py) inserts it."""

    n: int
    c: int
    h: int
    w: int
    to: Layout

    def __post_init__(self) -> None:
        _positive("transpose", n=self.n, c=self.c, h=self.h, w=self.w)

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (physical((self.n, self.c, self.h, self.w), _other(self.to)),)

    @property
    def output_shape(self) -> Shape:
        return physical((self.n, self.c, self.h, self.w), self.to)

    def reference(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x.transpose((0, 2, 3, 1) if self.to is Layout.NHWC else (0, 3, 1, 2)))

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        """Per image, the input is a rows x cols matrix (channels x pixels, or back) written transposed:
        blocks of lanes x lanes through log2(lanes) rounds of interleaving shuffles (each round pairs
        row i with row i + lanes/2; after the last, row j holds column j), the edges element by element."""
        b, plane = NestBuilder(), self.h * self.w
        rows, cols = (self.c, plane) if self.to is Layout.NHWC else (plane, self.c)
        width = lanes if lanes > 1 and lanes & (lanes - 1) == 0 and min(rows, cols) >= lanes else 1
        full_rows, full_cols = (rows - rows % width, cols - cols % width) if width > 1 else (0, 0)
        with b.loop(self.n, "n") as img:
            base = img * (rows * cols)
            if width > 1:
                with b.loop(rows // width, "r") as r, b.loop(cols // width, "q") as q:
                    self._block(b, base, r * width, q * width, rows, cols, width)
            for r0, r1, c0 in ((0, full_rows, full_cols), (full_rows, rows, 0)):  # the right edge, the bottom
                with b.loop(cols - c0, "j") as j, b.loop(r1 - r0, "i") as i:
                    b.store(
                        "out", base + (j + c0) * rows + i + r0, Load("x", base + (i + r0) * cols + j + c0)
                    )
        size = self.n * self.c * plane
        return b.kernel(name, _params([("x", size)], size))

    @staticmethod
    def _block(b: NestBuilder, base: Affine, r: Affine, q: Affine, rows: int, cols: int, width: int) -> None:
        half = width // 2
        lo = tuple(k // 2 + (k % 2) * width for k in range(width))  # a0 b0 a1 b1 ... of the first halves
        hi = tuple(half + k for k in lo)
        banks = [[b.register(f"{bank}{i}", width) for i in range(width)] for bank in "tu"]
        for i, reg in enumerate(banks[0]):
            b.assign(reg, Load("x", base + (r + i) * cols + q, width))
        for round_ in range(width.bit_length() - 1):
            old, new = banks[round_ % 2], banks[1 - round_ % 2]
            for i in range(half):
                b.assign(new[2 * i], Shuffle(old[i], old[i + half], lo))
                b.assign(new[2 * i + 1], Shuffle(old[i], old[i + half], hi))
        done = banks[(width.bit_length() - 1) % 2]
        for j, reg in enumerate(done):
            b.store("out", base + (q + j) * rows + r, reg, width)


def _other(layout: Layout) -> Layout:
    return Layout.NCHW if layout is Layout.NHWC else Layout.NHWC


class ElementwiseOp(Enum):
    ADD = "add"
    ADD_RELU = "add_relu"
    CLIP = "clip"  # Relu is Clip(0, +inf)


@dataclass(frozen=True, kw_only=True)
class Elementwise:
    """Add (two inputs of `shape`), Add followed by ReLU, or Clip(lo, hi) (one input)."""

    op: ElementwiseOp
    shape: Shape
    lo: float = -math.inf
    hi: float = math.inf

    def __post_init__(self) -> None:
        _positive("elementwise", **{f"dim{i}": d for i, d in enumerate(self.shape)})
        if not self.lo <= self.hi:
            raise InputError(f"clip: min {self.lo} is above max {self.hi}")

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (self.shape,) * (1 if self.op is ElementwiseOp.CLIP else 2)

    @property
    def output_shape(self) -> Shape:
        return self.shape

    def reference(self, *xs: np.ndarray) -> np.ndarray:
        if self.op is ElementwiseOp.CLIP:
            return np.clip(xs[0], np.float32(self.lo), np.float32(self.hi))
        out = xs[0] + xs[1]
        return np.maximum(out, np.float32(0)) if self.op is ElementwiseOp.ADD_RELU else out

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        b = NestBuilder()

        def emit(i: Affine, width: int, count: int) -> None:
            value: Value
            if self.op is ElementwiseOp.CLIP:
                value = Load("a", i, width, count)
                if self.lo > -math.inf:
                    value = Binary(BinaryOp.MAX, value, Const(self.lo, width))
                if self.hi < math.inf:
                    value = Binary(BinaryOp.MIN, value, Const(self.hi, width))
            else:
                value = Binary(BinaryOp.ADD, Load("a", i, width, count), Load("b", i, width, count))
                if self.op is ElementwiseOp.ADD_RELU:
                    value = Binary(BinaryOp.MAX, value, Const(0.0, width))
            b.store("out", i, value, width, count)

        _vector_map(b, self.size, lanes, emit)
        names = "a" if self.op is ElementwiseOp.CLIP else "ab"
        # In place (the memory plan's in_place_of): `out` may be `a` or `b`. Every element is loaded before
        # the same element is stored, so this is correct as long as LLVM is not told the pointers differ.
        return b.kernel(name, _params([(n, self.size) for n in names], self.size), noalias=False)


def relu(shape: Shape) -> Elementwise:
    return Elementwise(op=ElementwiseOp.CLIP, shape=shape, lo=0.0)


@dataclass(frozen=True, kw_only=True)
class Softmax:
    """Softmax over the last axis of (rows, length): exp(x - max) / sum, per row."""

    rows: int
    length: int

    def __post_init__(self) -> None:
        _positive("softmax", rows=self.rows, length=self.length)

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return ((self.rows, self.length),)

    @property
    def output_shape(self) -> Shape:
        return (self.rows, self.length)

    def reference(self, x: np.ndarray) -> np.ndarray:
        e = np.exp(x.astype(np.float64) - x.max(axis=-1, keepdims=True))
        return (e / e.sum(axis=-1, keepdims=True)).astype(np.float32)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        b, n = NestBuilder(), self.length
        full = n // lanes  # then n % lanes scalars
        mv, m, sv, s, e = (b.register(r, w) for r, w in (("mv", lanes), ("m", 1), ("sv", lanes), ("s", 1),
                                                         ("e", lanes)))  # fmt: skip
        es = b.register("es", 1)
        with b.loop(self.rows, "r") as r:
            row = r * n
            # 1. the row's maximum (subtracted so that exp cannot overflow)
            b.assign(mv, Const(-math.inf, lanes))
            with b.loop(full, "v") as v:
                b.assign(mv, Binary(BinaryOp.MAX, mv, Load("x", row + v * lanes, lanes)))
            b.assign(m, _hsum_or_max(b, mv, lanes, BinaryOp.MAX) if full else Const(-math.inf))
            for j in range(full * lanes, n):
                b.assign(m, Binary(BinaryOp.MAX, m, Load("x", row + j)))
            # 2. exp(x - max) into the output, and its sum
            b.assign(sv, Const(0.0, lanes))
            with b.loop(full, "v") as v:
                b.assign(e, Exp(Binary(BinaryOp.SUB, Load("x", row + v * lanes, lanes), Broadcast(m, lanes))))
                b.store("out", row + v * lanes, e, lanes)
                b.assign(sv, Binary(BinaryOp.ADD, sv, e))
            b.assign(s, _hsum_or_max(b, sv, lanes, BinaryOp.ADD) if full else Const(0.0))
            for j in range(full * lanes, n):
                b.assign(es, Exp(Binary(BinaryOp.SUB, Load("x", row + j), m)))
                b.store("out", row + j, es)
                b.assign(s, Binary(BinaryOp.ADD, s, es))
            # 3. times 1/sum
            b.assign(s, Binary(BinaryOp.DIV, Const(1.0), s))
            _vector_map(b, n, lanes, lambda i, w, c: b.store("out", row + i, Binary(
                BinaryOp.MUL, Load("out", row + i, w, c), Broadcast(s, w)), w, c))  # fmt: skip
        red = (Buffer("red", lanes, BufferKind.LOCAL),) if lanes > 1 else ()
        return b.kernel(name, (*_params([("x", self.rows * n)], self.rows * n), *red))


@dataclass(frozen=True, kw_only=True)
class Concat:
    """Concat along channels of NCHW inputs (n, c_i, h, w)."""

    n: int
    channels: tuple[int, ...]
    h: int
    w: int

    def __post_init__(self) -> None:
        _positive("concat", n=self.n, h=self.h, w=self.w, inputs=len(self.channels))
        _positive("concat", **{f"channels{k}": c for k, c in enumerate(self.channels)})

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return tuple((self.n, c, self.h, self.w) for c in self.channels)

    @property
    def output_shape(self) -> Shape:
        return (self.n, sum(self.channels), self.h, self.w)

    def reference(self, *xs: np.ndarray) -> np.ndarray:
        return np.concatenate(xs, axis=1)

    def kernel_nest(self, name: str, lanes: int) -> Kernel:
        b, plane, total = NestBuilder(), self.h * self.w, sum(self.channels)
        with b.loop(self.n, "n") as img:
            first = 0
            for k, c in enumerate(self.channels):
                dst = img * (total * plane) + first * plane
                self._copy(b, f"x{k}", img * (c * plane), dst, c * plane, lanes)
                first += c
        inputs = [(f"x{k}", self.n * c * plane) for k, c in enumerate(self.channels)]
        return b.kernel(name, _params(inputs, self.n * total * plane))

    @staticmethod
    def _copy(b: NestBuilder, src: str, at: Affine, to: Affine, size: int, lanes: int) -> None:
        _vector_map(b, size, lanes, lambda i, w, n: b.store("out", to + i, Load(src, at + i, w, n), w, n))


@dataclass(frozen=True, kw_only=True)
class Reshape:
    """Flatten / Reshape of a contiguous tensor: the same bytes, so no kernel (`alias`)."""

    input_shape: Shape
    shape: Shape
    alias = True

    def __post_init__(self) -> None:
        if math.prod(self.input_shape) != math.prod(self.shape):
            raise InputError(f"reshape: {self.input_shape} and {self.shape} differ in element count")

    @property
    def input_shapes(self) -> tuple[Shape, ...]:
        return (self.input_shape,)

    @property
    def output_shape(self) -> Shape:
        return self.shape

    def reference(self, x: np.ndarray) -> np.ndarray:
        return x.reshape(self.shape)


Operator = Pool2d | GlobalAveragePool | Elementwise | Softmax | Concat | Transpose
