"""Piecewise-affine copies, the kernel of the Pad, Slice and Split families (xtune/ops/pad.py, slice.py,
split.py): a row-major input shape and, for every output axis, its `Piece`s in; one loop nest that writes
every element of the output out.

Along an axis the output is a run of pieces, each either the constant (a constant Pad's border) or read
from input index `start + step * v` at its v-th position (step 1: a slice or a pad's interior; step > 1 or
< 0: a strided or reversed slice, a reflected border; step 0: an edge border repeating one element). An
axis that is whole (one piece, the input axis as it is) merges into the axis outside it, so a pad of the
two spatial axes of NCHW runs along whole rows and a crop of channels in NHWC copies one run per pixel.
Pieces of the innermost axis read with step 1 are copied a vector at a time, constant blocks filled a
vector at a time (every constant block is contiguous: the axes inside it are whole in the output), the
other pieces element by element."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from xtune.ops.opkit import Shape, params, vector_map
from xtune.schedule.loopnest import Affine, Const, Kernel, Load, NestBuilder


@dataclass(frozen=True, kw_only=True)
class Piece:
    """`size` consecutive output positions along an axis: the constant (`fill`), or input index
    start + step * v at the v-th of them."""

    size: int
    start: int = 0
    step: int = 1
    fill: bool = False

    def ends(self) -> tuple[int, int]:
        """The first and last input index it reads."""
        return self.start, self.start + self.step * (self.size - 1)


Axis = tuple[Piece, ...]


def whole(dim: int) -> Axis:
    """An axis copied as it is."""
    return (Piece(size=dim),)


def _merged(shape: Shape, axes: Sequence[Axis]) -> tuple[list[int], list[Axis]]:
    """The input dims and the axes with every whole axis merged into the axis outside it (where that one's
    reads run forwards one by one: each of its positions then covers a whole block of the inner axis)."""
    dims, out = [shape[0]], [tuple(axes[0])]
    for dim, axis in zip(shape[1:], axes[1:], strict=True):
        if axis == whole(dim) and all(p.fill or p.step == 1 for p in out[-1]):
            out[-1] = tuple(
                Piece(size=p.size * dim, start=p.start * dim, step=p.step, fill=p.fill) for p in out[-1]
            )
            dims[-1] *= dim
        else:
            dims.append(dim)
            out.append(tuple(axis))
    return dims, out


def region_nest(name: str, shape: Shape, axes: Sequence[Axis], value: float, lanes: int) -> Kernel:
    """The kernel writing the output the pieces describe from an input `x` of `shape` (row-major)."""
    assert len(axes) == len(shape) and all(p.size > 0 for a in axes for p in a), (shape, axes)
    assert all(
        0 <= i < d for a, d in zip(axes, shape, strict=True) for p in a if not p.fill for i in p.ends()
    )
    dims, merged = _merged(shape, axes)
    sizes = [sum(p.size for p in a) for a in merged]
    in_strides = [math.prod(dims[k + 1 :]) for k in range(len(dims))]
    out_strides = [math.prod(sizes[k + 1 :]) for k in range(len(sizes))]
    b = NestBuilder()

    def emit(k: int, src: Affine, dst: Affine) -> None:
        at = 0
        for p in merged[k]:
            here = dst + at * out_strides[k]
            if p.fill:
                _fill(b, here, p.size * out_strides[k], value, lanes)
            elif k == len(merged) - 1 and p.step == 1:
                _copy(b, src + p.start, here, p.size, lanes)
            elif k == len(merged) - 1:
                with b.loop(p.size, "e") as e:
                    b.store("out", here + e, Load("x", src + p.start + e * p.step))
            else:
                with b.loop(p.size, f"a{k}") as v:
                    emit(k + 1, src + (v * p.step + p.start) * in_strides[k], here + v * out_strides[k])
            at += p.size

    emit(0, Affine(), Affine())
    return b.kernel(name, params([("x", math.prod(shape))], math.prod(sizes)))


def _fill(b: NestBuilder, at: Affine, size: int, value: float, lanes: int) -> None:
    vector_map(b, size, lanes, lambda i, w, n: b.store("out", at + i, Const(value, w), w, n))


def _copy(b: NestBuilder, src: Affine, dst: Affine, size: int, lanes: int) -> None:
    vector_map(b, size, lanes, lambda i, w, n: b.store("out", dst + i, Load("x", src + i, w, n), w, n))
