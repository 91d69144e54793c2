"""Winograd F(m x m, 3x3)'s three transforms for m = 4, as formulas over an `Arith` (nest expressions or
numpy float32 arrays): a column of alpha = m + 2 values in, the rows of B^T d, G g or A^T M out.

The matrices are Lavin & Gray's for F(4x4, 3x3) ("Fast Algorithms for Convolutional Neural Networks",
CVPR 2016, section 4.2), interpolation points (0, 1, -1, 2, -2, infinity). The formulas share the
subexpressions of the usual factorisation (as NNPACK's and ncnn's kernels do), so that B^T d costs 12
operations per column of 6 instead of 20; every multiply in G's formula but the last of a row is by a
power of two, exact, so a fused and an unfused multiply-add round alike and `prepack`'s numpy U is the
kernel's to the bit. F(2x2, 3x3)'s transforms stay written out in winograd_nest.py/winograd_weights.py.

Accuracy: with these points a float32 F(4x4) output is about 15x further from the exact sum than
F(2x2)'s (1.5e-5 against 1e-6 at ResNet-18's 3x3 layers, He-scaled weights, ReLU inputs: docs/design.md,
Convolutions), 25x within compare_output's RTOL; Barabasz et al., "Error analysis and improving the
accuracy of Winograd convolution for deep neural networks" (ACM TOMS 46(4), 2020) give other points
that shrink it further.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar

import numpy as np

from xtune.schedule.loopnest import Binary, BinaryOp, Const, MulAdd, NestBuilder, Value

MS = (2, 4)  # output tile sizes

# Lavin & Gray's F(4x4, 3x3), float64, for the tests and the error analysis (the nest uses the formulas).
BT4 = np.array(
    [
        [4, 0, -5, 0, 1, 0],
        [0, -4, -4, 1, 1, 0],
        [0, 4, -4, -1, 1, 0],
        [0, -2, -1, 2, 1, 0],
        [0, 2, -1, -2, 1, 0],
        [0, 4, 0, -5, 0, 1],
    ],
    dtype=np.float64,
)
G4 = np.array(
    [
        [1 / 4, 0, 0],
        [-1 / 6, -1 / 6, -1 / 6],
        [-1 / 6, 1 / 6, -1 / 6],
        [1 / 24, 1 / 12, 1 / 6],
        [1 / 24, -1 / 12, 1 / 6],
        [0, 0, 1],
    ]
)
AT4 = np.array(
    [[1, 1, 1, 1, 1, 0], [0, 1, -1, 2, -2, 0], [0, 1, 1, 4, 4, 0], [0, 1, -1, 8, -8, 1]], np.float64
)


def alpha(m: int) -> int:
    """The side of an input tile (and of a transformed one)."""
    return m + 2


def elements(m: int) -> int:
    """Floats of a transformed tile: the GEMMs per block."""
    return alpha(m) ** 2


T = TypeVar("T")


class Arith(Protocol[T]):
    def add(self, a: T, b: T) -> T: ...
    def sub(self, a: T, b: T) -> T: ...
    def scale(self, a: T, c: float) -> T: ...
    def fma(self, a: T, c: float, b: T) -> T:
        """a * c + b."""
        ...

    def keep(self, name: str, a: T) -> T:
        """`a` computed once, for a value used twice."""
        ...

    def neg(self, a: T) -> T:
        """0 - a: exact, and +0 for a zero."""
        ...


class NestArith:
    """Formulas into nest expressions of `lanes`; `keep` assigns registers named `prefix` + name."""

    def __init__(self, b: NestBuilder, lanes: int, prefix: str):
        self.b, self.lanes, self.prefix = b, lanes, prefix

    def add(self, a: Value, b: Value) -> Value:
        return Binary(BinaryOp.ADD, a, b)

    def sub(self, a: Value, b: Value) -> Value:
        return Binary(BinaryOp.SUB, a, b)

    def scale(self, a: Value, c: float) -> Value:
        return Binary(BinaryOp.MUL, a, Const(c, self.lanes))

    def fma(self, a: Value, c: float, b: Value) -> Value:
        return MulAdd(a, Const(c, self.lanes), b)

    def keep(self, name: str, a: Value) -> Value:
        reg = self.b.register(self.prefix + name, self.lanes)
        self.b.assign(reg, a)
        return reg

    def neg(self, a: Value) -> Value:
        return Binary(BinaryOp.SUB, Const(0.0, self.lanes), a)


class NumpyArith:
    """The same formulas on float32 arrays, an operation at a time (each rounds as the nest's does)."""

    def add(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.add(a, b, dtype=np.float32)

    def sub(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        return np.subtract(a, b, dtype=np.float32)

    def scale(self, a: np.ndarray, c: float) -> np.ndarray:
        return np.multiply(a, np.float32(c), dtype=np.float32)

    def fma(self, a: np.ndarray, c: float, b: np.ndarray) -> np.ndarray:
        """Two roundings: the nest's fused one rounds alike where c is a power of two (`filter_rows4`)."""
        return self.add(self.scale(a, c), b)

    def keep(self, name: str, a: np.ndarray) -> np.ndarray:
        return a

    def neg(self, a: np.ndarray) -> np.ndarray:
        return np.subtract(np.float32(0), a, dtype=np.float32)


def input_rows4(ar: Arith[T], d: Sequence[T]) -> list[T]:
    """B^T d of a column d0..d5: (4d0 - 5d2 + d4, (d3 - 4d1) + (d4 - 4d2), (d4 - 4d2) - (d3 - 4d1),
    (d4 - d2) - 2(d1 - d3), (d4 - d2) + 2(d1 - d3), 4d1 - 5d3 + d5)."""
    d0, d1, d2, d3, d4, d5 = d
    p = ar.keep("p", ar.fma(d2, -4.0, d4))
    q = ar.keep("q", ar.fma(d1, -4.0, d3))
    s = ar.keep("s", ar.sub(d4, d2))
    u = ar.keep("u", ar.sub(d1, d3))
    return [
        ar.fma(d2, -5.0, ar.fma(d0, 4.0, d4)),
        ar.add(q, p),
        ar.sub(p, q),
        ar.fma(u, -2.0, s),
        ar.fma(u, 2.0, s),
        ar.fma(d3, -5.0, ar.fma(d1, 4.0, d5)),
    ]


def output_rows4(ar: Arith[T], v: Sequence[T]) -> list[T]:
    """A^T v of a column v0..v5: (v0 + a + c, b + 2d, a + 4c, b + 8d + v5) with a = v1 + v2, b = v1 - v2,
    c = v3 + v4, d = v3 - v4."""
    v0, v1, v2, v3, v4, v5 = v
    a, b = ar.keep("a", ar.add(v1, v2)), ar.keep("b", ar.sub(v1, v2))
    c, d = ar.keep("c", ar.add(v3, v4)), ar.keep("d", ar.sub(v3, v4))
    return [ar.add(ar.add(v0, a), c), ar.fma(d, 2.0, b), ar.fma(c, 4.0, a), ar.add(ar.fma(d, 8.0, b), v5)]


def filter_rows4(ar: Arith[T], g: Sequence[T]) -> list[T]:
    """G g of a column g0..g2: (g0 / 4, (-(g0 + g2) - g1) / 6, (g1 - (g0 + g2)) / 6, (g0 + 4g2 + 2g1) / 24,
    (g0 + 4g2 - 2g1) / 24, g2): the sums exact up to one rounding each, then one multiply by a positive
    constant, so that zero weights (the lanes past k of a strip) give +0 as `prepack`'s zero fill."""
    g0, g1, g2 = g
    even = ar.keep("e", ar.add(g0, g2))
    four = ar.keep("f", ar.fma(g2, 4.0, g0))
    return [
        ar.scale(g0, 0.25),
        ar.scale(ar.sub(ar.neg(even), g1), 1 / 6),
        ar.scale(ar.sub(g1, even), 1 / 6),
        ar.scale(ar.fma(g1, 2.0, four), 1 / 24),
        ar.scale(ar.fma(g1, -2.0, four), 1 / 24),
        g2,
    ]


def filter_transform4(w: np.ndarray) -> np.ndarray:
    """U = G g G^T (6, 6, ...) of filters w (3, 3, ...), float32, in the nest's operations and order."""
    ar: Arith[np.ndarray] = NumpyArith()
    g = np.asarray(w, np.float32)
    rows: list[np.ndarray] = [g[i] for i in range(3)]
    gg = filter_rows4(ar, rows)  # (G g)[a], each (3, ...) over g's columns
    out: list[np.ndarray] = []
    for row in gg:
        u: list[np.ndarray] = filter_rows4(ar, [row[j] for j in range(3)])
        out.append(np.stack(u))
    return np.stack(out)
