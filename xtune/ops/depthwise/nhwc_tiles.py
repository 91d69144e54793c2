"""The NHWC depthwise template's rules on its tiles and blocks: a depthwise layout=nhwc shape (and target)
in; its interior, the register tiles and what they hold live, FMAs per loaded vector, and the channel and
row blocks out (nhwc.py builds the nest with them, features.py describes its configs by them)."""

from __future__ import annotations

import numpy as np

from xtune.ops.conv import ConvShape
from xtune.ops.tiles import Real, Scalars, whole_tiles
from xtune.target import Target


def interior(extent: int, out: int, kernel: int, stride: int, pad: int, dilation: int) -> tuple[int, int]:
    """[lo, hi): the outputs along one axis whose window lies inside the input (no tap on padding)."""
    lo = min(out, -(-pad // stride))
    hi = (extent - 1 + pad - (kernel - 1) * dilation) // stride + 1
    return lo, max(lo, min(out, hi))


def interiors(sh: ConvShape) -> tuple[tuple[int, int], tuple[int, int]]:
    """The interior rows and columns of the output (`interior` along h and w)."""
    rows = interior(sh.h, sh.oh, sh.r, sh.stride, sh.top, sh.dilation)
    return rows, interior(sh.w, sh.ow, sh.s, sh.stride, sh.left, sh.dilation)


def tile_registers(sh: ConvShape, p: Real, nv: Real) -> Real:
    """Vector registers a P x V tile holds live: its accumulators, the s*V weight vectors of a kernel row
    and the V vectors of one input column."""
    return p * nv + sh.s * nv + nv


def register_tiles(sh: ConvShape, target: Target) -> tuple[str, ...]:
    """Tiles "PxV" that fit the register file (at least one: 1x1 even if a wide kernel row does not)."""
    tiles = tuple(
        f"{p}x{v}"
        for p in range(1, 13)
        for v in range(1, 7)
        if tile_registers(sh, p, v) <= target.vector_registers and v * target.fp32_lanes <= 64
    )
    return tiles or ("1x1",)


def input_columns(sh: ConvShape, p: Real) -> Real:
    """Distinct input columns the taps of p neighbouring output pixels read along a row."""
    return np.minimum(p * sh.s, (p - 1) * sh.stride + (sh.s - 1) * sh.dilation + 1)


def fmas_per_load(sh: ConvShape, p: Real, nv: Real) -> Real:
    """FMAs per loaded vector of a P pixels x V vectors tile, per kernel row: P*V*s FMAs against s*V
    weight vectors and V vectors of each input column the P pixels read."""
    return p * nv * sh.s / (sh.s * nv + nv * input_columns(sh, p))


def pair_registers(sh: ConvShape, p: Real, nv: Real) -> Real:
    """Vector registers a two-row P x V tile holds live: its 2*P*V accumulators, all r*s*V weight vectors
    of its channel strip (loaded once per strip and row pair) and the V vectors of every input column of
    one input row: LLVM's scheduler issues a row's loads ahead of their FMAs (to hide the load latency the
    Cortex-A72 Software Optimization Guide lists), and a tile that left it fewer registers spilled."""
    return 2 * p * nv + sh.r * sh.s * nv + input_columns(sh, p) * nv


def pair_fmas_per_load(sh: ConvShape, p: Real, nv: Real) -> Real:
    """FMAs per loaded input vector of a two-row P x V tile: 2*P*V*r*s FMAs against the V vectors of each
    input column of the input rows both output rows read (r + stride of them when they overlap)."""
    rows = min(2 * sh.r, sh.stride + (sh.r - 1) * sh.dilation + 1)
    return 2 * p * nv * sh.r * sh.s / (rows * nv * input_columns(sh, p))


def channel_block(sh: ConvShape, nr: Scalars, tile_k: Scalars) -> np.ndarray:
    """The output channels per block a `tile_k` knob resolves to: whole strips of nr (unless it covers k),
    and whole multipliers, so that a block starts at an input channel."""
    kb = whole_tiles(tile_k, sh.k, nr)
    return np.where(kb >= sh.k, sh.k, np.maximum(sh.multiplier, kb - kb % sh.multiplier))


def row_block(sh: ConvShape, tile_oh: Scalars) -> np.ndarray:
    (lo, hi), _ = interiors(sh)
    return np.maximum(1, np.minimum(tile_oh, hi - lo))


def rows_bytes(sh: ConvShape, kb: Scalars) -> Scalars:
    """Bytes of the input rows one output row reads for a block of kb output channels: what stays in
    cache for the next output row to reuse ((r-1)*dilation + 1 rows, of kb / multiplier channels)."""
    return 4.0 * ((sh.r - 1) * sh.dilation + 1) * sh.w * kb / sh.multiplier


def reuses_rows(sh: ConvShape, kb: Scalars, target: Target) -> np.ndarray:
    """Whether the input rows one output row reads for a block of kb channels stay in L1 for the next
    output row (half of it: the weights and the output lines share it)."""
    return np.asarray(rows_bytes(sh, kb)) <= target.l1d_bytes / 2
