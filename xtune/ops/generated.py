"""The operators of a network that are not tuned tasks: shapes in; the output shape, a numpy reference and
a loop-nest `Kernel` (lowered by xtune.codegen.lower like any template's) out. Float32; 4-D tensors in
NCHW, or NHWC where the operator has a `layout` (pooling, in xtune/ops/pooling.py; the layout pass,
xtune/firmware/relayout.py, gives it, re-expresses Concat along channels and inserts `Transpose`).

Every kernel takes its inputs then its output as pointer parameters, in that order, and writes every
element of the output. The parameters must not overlap, except that an elementwise kernel's output may be
exactly one of its inputs (it runs in place, `Kernel.noalias` is off). Semantics follow the ONNX operator
definitions (https://onnx.ai/onnx/operators/): MaxPool and AveragePool with `pads` as (top, left, bottom,
right), ceil_mode=0 and, for AveragePool, the default count_include_pad=0 (padding is neither a maximum
candidate nor counted in the mean); GlobalAveragePool; Add (same shapes, optionally followed by ReLU);
Relu and Clip; Softmax over the last axis (opset 13); Concat along channels; Flatten/Reshape, which need no
code at all: the output is the input's bytes (`Reshape.alias`), which the memory planner shares
(xtune/firmware/memory.py, `alias_of`).

Vectorization: elementwise ops, Concat and Softmax run along contiguous memory in vectors of the target's
fp32 lanes (a partial vector at the end, never a read past it); pooling with unit column stride runs whole
output rows as vectors; with column stride 2 the window's input columns are not contiguous and each output
is computed as a scalar (such pools are one layer of a network); in NHWC, pooling runs along channels, any
stride. Pooling windows that overlap the padding are specialised at build time (their clipped extent is a
constant), so the interior has no bounds checks. A Transpose runs in blocks of lanes x lanes shuffles.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

import numpy as np

from xtune.errors import InputError
from xtune.ops.layout import Layout, physical
from xtune.ops.opkit import Shape, hsum_or_max, params, positive, vector_map
from xtune.ops.pooling import GlobalAveragePool as GlobalAveragePool
from xtune.ops.pooling import Pool2d as Pool2d
from xtune.ops.pooling import PoolKind as PoolKind
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
    NestBuilder,
    Shuffle,
    Value,
)


@dataclass(frozen=True, kw_only=True)
class Transpose:
    """A 4-D activation converted between layouts: (n, c, h, w) to (n, h, w, c) (`to` NHWC), or back. The
    layout pass (xtune/firmware/relayout.py) inserts it."""

    n: int
    c: int
    h: int
    w: int
    to: Layout

    def __post_init__(self) -> None:
        positive("transpose", n=self.n, c=self.c, h=self.h, w=self.w)

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
        row i with row i + lanes/2; after the last, row j holds column j), the edges element by element.
        Fewer rows than lanes (an image's 3 channels to NHWC, the network's input): `lanes` columns of
        every row loaded as one vector each and interleaved into `rows` output vectors (`_interleave`)."""
        b, plane = NestBuilder(), self.h * self.w
        rows, cols = (self.c, plane) if self.to is Layout.NHWC else (plane, self.c)
        vectors = lanes > 1 and lanes & (lanes - 1) == 0
        width = lanes if vectors and min(rows, cols) >= lanes else 1
        few = vectors and 1 < rows < lanes <= cols  # the interleave path: every row, whole vectors of cols
        full_rows, full_cols = (rows - rows % width, cols - cols % width) if width > 1 else (0, 0)
        if few:
            full_rows, full_cols = rows, cols - cols % lanes
        with b.loop(self.n, "n") as img:
            base = img * (rows * cols)
            if width > 1:
                with b.loop(rows // width, "r") as r, b.loop(cols // width, "q") as q:
                    self._block(b, base, r * width, q * width, rows, cols, width)
            if few:
                with b.loop(cols // lanes, "q") as q:
                    self._interleave(b, base, q * lanes, rows, cols, lanes)
            for r0, r1, c0 in ((0, full_rows, full_cols), (full_rows, rows, 0)):  # the right edge, the bottom
                with b.loop(cols - c0, "j") as j, b.loop(r1 - r0, "i") as i:
                    b.store(
                        "out", base + (j + c0) * rows + i + r0, Load("x", base + (i + r0) * cols + j + c0)
                    )
        size = self.n * self.c * plane
        return b.kernel(name, params([("x", size)], size))

    @staticmethod
    def _interleave(b: NestBuilder, base: Affine, q: Affine, rows: int, cols: int, width: int) -> None:
        """Columns q..q+width of all `rows` (< width) rows, written as rows*width contiguous outputs:
        output lane e of the block is row e % rows, column e // rows. Each output vector gathers its lanes
        from the rows it touches by two-vector shuffles, one per row after the first."""
        loaded = [b.register(f"v{i}", width) for i in range(rows)]
        for i, reg in enumerate(loaded):
            b.assign(reg, Load("x", base + i * cols + q, width))
        acc = b.register("acc", width)
        for k in range(rows):
            sources = [(e % rows, e // rows) for e in range(k * width, (k + 1) * width)]
            order = sorted({i for i, _ in sources})
            first = tuple(j if i == order[0] else (width + j if i == order[1] else 0) for i, j in sources)
            b.assign(acc, Shuffle(loaded[order[0]], loaded[order[1]], first))
            for row in order[2:]:
                mask = tuple(width + j if i == row else lane for lane, (i, j) in enumerate(sources))
                b.assign(acc, Shuffle(acc, loaded[row], mask))
            b.store("out", base + q * rows + k * width, acc, width)

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
        positive("elementwise", **{f"dim{i}": d for i, d in enumerate(self.shape)})
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

        vector_map(b, self.size, lanes, emit)
        names = "a" if self.op is ElementwiseOp.CLIP else "ab"
        # In place (the memory plan's in_place_of): `out` may be `a` or `b`. Every element is loaded before
        # the same element is stored, so this is correct as long as LLVM is not told the pointers differ.
        return b.kernel(name, params([(n, self.size) for n in names], self.size), noalias=False)


def relu(shape: Shape) -> Elementwise:
    return Elementwise(op=ElementwiseOp.CLIP, shape=shape, lo=0.0)


@dataclass(frozen=True, kw_only=True)
class Softmax:
    """Softmax over the last axis of (rows, length): exp(x - max) / sum, per row."""

    rows: int
    length: int

    def __post_init__(self) -> None:
        positive("softmax", rows=self.rows, length=self.length)

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
            b.assign(m, hsum_or_max(b, mv, lanes, BinaryOp.MAX) if full else Const(-math.inf))
            for j in range(full * lanes, n):
                b.assign(m, Binary(BinaryOp.MAX, m, Load("x", row + j)))
            # 2. exp(x - max) into the output, and its sum
            b.assign(sv, Const(0.0, lanes))
            with b.loop(full, "v") as v:
                b.assign(e, Exp(Binary(BinaryOp.SUB, Load("x", row + v * lanes, lanes), Broadcast(m, lanes))))
                b.store("out", row + v * lanes, e, lanes)
                b.assign(sv, Binary(BinaryOp.ADD, sv, e))
            b.assign(s, hsum_or_max(b, sv, lanes, BinaryOp.ADD) if full else Const(0.0))
            for j in range(full * lanes, n):
                b.assign(es, Exp(Binary(BinaryOp.SUB, Load("x", row + j), m)))
                b.store("out", row + j, es)
                b.assign(s, Binary(BinaryOp.ADD, s, es))
            # 3. times 1/sum
            b.assign(s, Binary(BinaryOp.DIV, Const(1.0), s))
            vector_map(b, n, lanes, lambda i, w, c: b.store("out", row + i, Binary(
                BinaryOp.MUL, Load("out", row + i, w, c), Broadcast(s, w)), w, c))  # fmt: skip
        red = (Buffer("red", lanes, BufferKind.LOCAL),) if lanes > 1 else ()
        return b.kernel(name, (*params([("x", self.rows * n)], self.rows * n), *red))


@dataclass(frozen=True, kw_only=True)
class Concat:
    """Concat along channels of NCHW inputs (n, c_i, h, w)."""

    n: int
    channels: tuple[int, ...]
    h: int
    w: int

    def __post_init__(self) -> None:
        positive("concat", n=self.n, h=self.h, w=self.w, inputs=len(self.channels))
        positive("concat", **{f"channels{k}": c for k, c in enumerate(self.channels)})

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
        return b.kernel(name, params(inputs, self.n * total * plane))

    @staticmethod
    def _copy(b: NestBuilder, src: str, at: Affine, to: Affine, size: int, lanes: int) -> None:
        vector_map(b, size, lanes, lambda i, w, n: b.store("out", to + i, Load(src, at + i, w, n), w, n))


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
