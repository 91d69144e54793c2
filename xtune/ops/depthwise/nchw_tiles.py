"""The NCHW depthwise template's rules on its tiles, rows and blocks: a depthwise shape (and target) in;
the register tiles and what they hold live, the packed rows' phases and vectors, FMAs per load and per
instruction of the load and ext taps, and the column blocks out (nchw.py builds the nest with them,
features.py describes its configs by them)."""

from __future__ import annotations

import numpy as np

from xtune.ops.conv import ConvShape
from xtune.ops.tiles import Real, Scalars, whole_tiles
from xtune.schedule.loopnest import LoopKind
from xtune.target import Target

OW_OPTIONS = (8, 16, 32, 64, 128, 256)


def register_tiles(target: Target) -> tuple[str, ...]:
    """Tiles "PxV" whose accumulators, one input vector and one weight broadcast fit in registers."""
    return tuple(
        f"{p}x{v}"
        for p in range(1, 9)
        for v in range(1, 7)
        if tile_registers(p, v) <= target.vector_registers and v * target.fp32_lanes <= 64
    )


def tile_registers(p: int, v: int) -> int:
    """Vector registers a P x V tile holds live: its accumulators, one input vector, one weight broadcast."""
    return p * v + 2


def phase_width(sh: ConvShape, lanes: int, aligned: bool = False, lead: int = 0) -> int:
    """Columns per phase of a packed row: `lead` columns (`phase_leads`), whole vectors of outputs plus the
    kernel's reach; `aligned` rounds it up to whole vectors, so that every phase of every packed row starts
    on a vector boundary (the "ext" taps' loads are then all aligned)."""
    width = lead + -(-sh.ow // lanes) * lanes + (sh.s - 1) * sh.dilation // sh.stride + 1
    return -(-width // lanes) * lanes if aligned else width


def phase_leads(sh: ConvShape, lanes: int) -> tuple[int, ...]:
    """Columns each phase of a packed row is shifted right so that its first input column lands on a
    vector boundary: the stride-2 copy's stores of both phases are then aligned (an immediate offset, no
    address add each), and the taps read that much further on, which at stride 2 costs no extra load."""
    firsts = [max(0, -(-(sh.left - phase) // sh.stride)) for phase in range(sh.stride)]
    return tuple(-q % lanes for q in firsts)


def fmas_per_load(sh: ConvShape, p: Real, nv: Real) -> Real:
    """FMAs per loaded vector of a P rows x V vectors tile: the tile's rows share the (P-1)*stride + r
    input rows they read (s kw positions, V vectors each), plus the r*s weight broadcasts."""
    loads = ((p - 1) * sh.stride + sh.r) * sh.s * nv + sh.r * sh.s
    return p * nv * sh.r * sh.s / loads


def ext_registers(sh: ConvShape, p: Real, nv: Real, lanes: int) -> Real:
    """Vector registers an "ext" P x V tile holds live: its accumulators, the r*s weights (whole vectors of
    them, a tap's a lane), the V + 1 aligned vectors of one input row and phase, and one shifted tap."""
    return p * nv + -(-sh.r * sh.s // lanes) + nv + 2


# Bounds on an "ext" tile beyond its live registers: LLVM's scheduler issues the loads and shifts of the
# next input rows ahead of their FMAs, and taller or wider tiles spilled in their loop (Cortex-A72: 8x2 30
# stack accesses, 6x2 2; the Cortex-A53, whose in-order model hoists more: 4x3 54, 8x1 40; 4x2 none on
# either), docs/benchmarks.md.
EXT_ACCUMULATORS = 8
EXT_ROWS = 6  # input rows a tile reads


def ext_spills_not(sh: ConvShape, p: int, nv: int) -> bool:
    """Whether an "ext" P x V tile stays within the bounds that kept its loop free of spills."""
    rows = (p - 1) * sh.stride + (sh.r - 1) * sh.dilation + 1
    return p * nv <= EXT_ACCUMULATORS and rows <= max(EXT_ROWS, sh.r)


def ext_fmas_per_instruction(sh: ConvShape, p: Real, nv: Real) -> Real:
    """FMAs per instruction of an "ext" P x V tile: P*V*r*s FMAs, and per input row of the
    (P-1)*stride + r the tile reads, V + 1 aligned loads per phase and V shuffles per shifted tap, then the
    P*V stores."""
    rows = (p - 1) * sh.stride + (sh.r - 1) * sh.dilation + 1
    shifted = sum(1 for j in range(sh.s) if j * sh.dilation >= sh.stride)
    per_row = min(sh.stride, sh.s) * (nv + 1) + shifted * nv
    fmas = p * nv * sh.r * sh.s
    return fmas / (fmas + rows * per_row + p * nv)


# A packed row of up to this many vector copies or deinterleave chunks is unrolled: each is 2-3
# instructions, which the loop's counter, compare and branch would otherwise nearly double.
PACK_UNROLL = 16


def row_lanes(extent: int, lanes: int) -> int:
    """The vectors that pack a row of `extent` floats: the target's, or for a narrower row the widest
    power of two that fits it (a 14-wide row is packed in 8-float pieces, not copied float by float)."""
    v = lanes
    while v > max(extent, 1):
        v //= 2
    return v


def pack_loop_kind(steps: int) -> LoopKind:
    return LoopKind.UNROLLED if steps <= PACK_UNROLL else LoopKind.SERIAL


def column_block(sh: ConvShape, width: Scalars, tile_ow: Scalars) -> np.ndarray:
    """The output columns per block a `tile_ow` knob resolves to for tiles `width` columns wide: whole
    tile widths, except a block that covers the row."""
    return whole_tiles(tile_ow, sh.ow, width)
