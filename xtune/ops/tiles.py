"""What every template shares: register tiles and their cost rules, blocks resolved against an axis,
peeled edge tiles, and the fused epilogue (bias, residual, ReLU/ReLU6) as every template emits it.

The rules take Python ints (a template resolving one config) or numpy arrays (features.py resolving
thousands at once): one home for each, whichever the caller needs."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np

from xtune.ops.activation import Activation
from xtune.ops.epilogue import activation
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import (
    Affine,
    Binary,
    BinaryOp,
    Bitcast,
    Buffer,
    BufferKind,
    Const,
    DType,
    Load,
    MulAdd,
    NestBuilder,
    Reg,
    Shuffle,
    Value,
)
from xtune.schedule.space import Config, Knob, KnobKind
from xtune.target import Target

Num = TypeVar("Num", int, float, np.ndarray)


Real = TypeVar("Real", float, np.ndarray)


Scalars = int | float | np.ndarray  # one config's value, or one per config


def tile_registers(rows: Num, vectors: Num, lanes_of_a: bool = False) -> Num:
    """Vector registers a rows x vectors register tile holds live: its accumulators, one row of B
    vectors (conv2d: weight vectors) and one broadcast of A (conv2d: of the input); with `lanes_of_a`
    (a lane-FMA target reading A as vectors of k steps, matmul's `a_value`) one vector of A per row and
    the one B vector its FMAs take at a time instead."""
    if lanes_of_a:
        return rows * vectors + rows + 1
    return rows * vectors + vectors + 1


def register_budget(target: Target) -> int:
    """The registers a default config's register tile may hold live (`tile_registers`) without a spill in
    its loop: the vector register file (scalar FP without vectors) less one, into which the scheduler
    loads the next step's operand while this step's FMAs run (a tile that fills the file exactly spilled:
    conv2d, Winograd and depthwise on AArch64; matmul on the in-order Cortex-A53), and less one more
    without FMA (x86 SSE: MULPS overwrites a source, so each product needs a register before its ADDPS).
    The spaces keep every tile that fits the file (`register_tiles`): the tuner measures the rest.
    tests/test_spills.py counts the stack accesses in the emitted loops."""
    return target.vector_registers - (target.arch != "x86_64") - (not target.has_fma)


def fmas_per_load(rows: Real, vectors: Real) -> Real:
    """FMAs per loaded value of a rows x vectors tile: rows * vectors FMAs per rows + vectors loads."""
    return rows * vectors / (rows + vectors)


def whole_tiles(block: Scalars, extent: Scalars, tile: Scalars) -> np.ndarray:
    """A block size resolved against its axis: whole register tiles (at least one), except a block that
    covers the whole axis, which is the axis (so no block is larger than its axis)."""
    return np.where(block >= extent, extent, np.maximum(tile, block // tile * tile))


def roomy_tiles(
    tiles: Sequence[object], target: Target, live: Callable[[int, int], int] = tile_registers
) -> list[str]:
    """The tiles ("RxV") a default config may pick: those whose live registers (`live(rows, vectors)`)
    fit the `register_budget`; all of them if none does."""
    names = [str(t) for t in tiles]
    return [t for t in names if live(*parse_tile(t)) <= register_budget(target)] or names


def register_tiles(target: Target) -> tuple[str, ...]:
    """Tiles "MRxNV" whose accumulators, B vectors and one broadcast fit in the register file."""
    tiles = []
    for mr in range(1, 13):
        for nv in range(1, 7):
            if tile_registers(mr, nv) <= target.vector_registers and nv * target.fp32_lanes <= 64:
                tiles.append(f"{mr}x{nv}")
    return tuple(tiles)


LMUL_OPTIONS = (1, 2, 4)


def lmul_knobs(target: Target) -> list[Knob]:
    """RVV: vectors of lmul registers (LMUL, the RVV spec's register grouping, RVV 1.0 §3.4.2), so a
    tile's vectors are lmul times longer and the register file holds 32 / lmul of them: one load and one
    FMA instruction per lmul registers. No knob elsewhere."""
    return [Knob("lmul", KnobKind.CHOICE, LMUL_OPTIONS)] if "+v" in target.features.split(",") else []


def lmul_of(config: Config) -> int:
    """The config's lmul knob, 1 where the space has none (every target without RVV)."""
    return config.int("lmul") if "lmul" in config.as_dict() else 1


def group_lanes(target: Target, rows: Num, vectors: Num, lmul: Num) -> np.ndarray:
    """The lanes of one vector of a rows x vectors float tile (`tile_registers`) asking for `lmul`:
    fp32_lanes times the largest lmul, halving, whose register groups hold the tile and whose rows stay
    within 64 lanes (the templates' widest row)."""
    need, lm = np.asarray(tile_registers(rows, vectors)), np.asarray(lmul)
    for _ in LMUL_OPTIONS:
        too_big = (need * lm > target.vector_registers) | (vectors * target.fp32_lanes * lm > 64)
        lm = np.where((lm > 1) & too_big, lm // 2, lm)
    return target.fp32_lanes * lm


def clipped(options: tuple[int, ...], extent: int) -> tuple[int, ...]:
    """Tile sizes no larger than the axis, plus the whole axis."""
    return tuple(sorted({o for o in options if o < extent} | {extent}))


def parse_tile(tile: str) -> tuple[int, int]:
    mr, nv = tile.split("x")
    return int(mr), int(nv)


def split_edges(
    b: NestBuilder, extent: int, tile: int, body: Callable[[Affine, int, bool, bool], None], prefix: str = "t"
) -> None:
    """Like NestBuilder.split, but the first and last tiles are peeled into constant code and the body
    is told which it is (first, last): an accumulation can then start and finish without a branch."""
    tile = max(1, min(tile, extent))
    full, tail = divmod(extent, tile)
    if full + (tail > 0) == 1:
        body(Affine(), extent, True, True)
        return
    body(Affine(), tile, True, False)
    middle = full - 1 if tail else full - 2
    if middle:
        with b.loop(middle, prefix) as t:
            body(t * tile + tile, tile, False, False)
    if tail:
        body(Affine.of(full * tile), tail, False, True)
    else:
        body(Affine.of((full - 1) * tile), tile, False, True)


SIX_BITS = 0x40C00000  # 6.0f as an int32 (IEEE 754 binary32: exponent 129, fraction 0.5)


@dataclass(frozen=True)
class Epilogue:
    """A workload's fused epilogue (operators.EPILOGUE) as every template emits it: the bias and the
    residual are the accumulators' initial value (added once, in the first reduction block), ReLU or
    ReLU6 clamps them before the last block's store."""

    bias: bool
    residual: bool
    relu: bool
    relu6: bool
    act: Activation | None = None  # the fused activation (`act`), applied where the clamp is
    bits: bool = False  # ReLU and ReLU6 clamp the lanes' bits as int32 (the target's `integer_clamp`)

    @staticmethod
    def of(workload: Workload, bits: bool = False) -> Epilogue:
        w = workload
        return Epilogue(
            bool(w["bias"]), bool(w["residual"]), bool(w["relu"]), bool(w["relu6"]), activation(w), bits
        )

    @property
    def clamps(self) -> bool:
        """Whether anything applies to the accumulators before the last block's store."""
        return self.relu or self.relu6 or self.act is not None

    def buffers(self, channels: int, out_size: int) -> list[Buffer]:
        """The kernel parameters after the operator's own inputs, in workload.tensors() order."""
        return [
            *([Buffer("bias", channels, BufferKind.INPUT)] if self.bias else []),
            *([Buffer("residual", out_size, BufferKind.INPUT)] if self.residual else []),
        ]

    def initial(self, lanes: int, bias: Value, residual: Value) -> Value:
        """bias + residual (the loads of whichever the workload has), else 0: where accumulation starts."""
        parts = [*([bias] if self.bias else []), *([residual] if self.residual else [])]
        if not parts:
            return Const(0.0, lanes)
        return parts[0] if len(parts) == 1 else Binary(BinaryOp.ADD, parts[0], parts[1])

    def apply(self, acc: Value, lanes: int, last: bool) -> Value:
        """The clamp on the accumulators before their store, in the last reduction block only."""
        if not last or not self.clamps:
            return acc
        if self.act is not None:
            return self.act.expr(acc, lanes)
        if self.bits:
            # On the raw bits: every negative float (-0 too) is a negative int32, and non-negative floats
            # order as their bits do (IEEE 754-2019, 3.4), so max(bits, 0) is ReLU and min(., bits of 6)
            # ReLU6, for every input but NaN (which the fused epilogue never promises to keep).
            bits: Value = Binary(BinaryOp.MAX, Bitcast(acc, DType.I32), Const(0, lanes, DType.I32))
            if self.relu6:
                bits = Binary(BinaryOp.MIN, bits, Const(SIX_BITS, lanes, DType.I32))
            return Bitcast(bits, DType.F32)
        out: Value = Binary(BinaryOp.MAX, acc, Const(0.0, lanes))
        return Binary(BinaryOp.MIN, out, Const(6.0, lanes)) if self.relu6 else out


def whole_vectors(extent: int, lanes: int) -> int:
    """`extent` rounded up to whole vectors: the row width of a `replicate` copy."""
    return -(-extent // lanes) * lanes


def replicate(
    b: NestBuilder, src: str, at: Affine, extent: int, lanes: int, shape: tuple[int, int], dst: str
) -> None:
    """dst[i * width + j] = src[at + j] for each of (copies, width) = `shape` and j < extent, zero up to
    whole vectors: a register tile's bias once per accumulator row (`Target.load_initial`), so that each
    accumulator starts from a load of its own address rather than from a register copy of one load."""
    copies, width = shape

    def vector(j: Affine, cols: int) -> None:
        value = Load(src, at + j, lanes, cols % lanes)
        for i in range(copies):
            b.store(dst, j + i * width, value, lanes)

    b.split(extent, lanes, vector, "rep")


def div(index: Affine, d: int) -> Affine:
    """index / d for an index that is a multiple of d (tile offsets are)."""
    assert index.const % d == 0 and all(c % d == 0 for _, c in index.terms), (index, d)
    return Affine(tuple((v, c // d) for v, c in index.terms), index.const // d)


def unrolled(
    b: NestBuilder, extent: int, unroll: int, body: Callable[[Affine], None], prefix: str, peel: bool = False
) -> None:
    """`extent` steps of `body(index)`: a loop whose body is `unroll` steps unrolled, then the remainder
    unrolled after it (the reduction loops of the register tiles: LLVM then schedules whole steps). The
    steps are unrolled here, each index's constant part known to the body (`lane_group` reads it). With
    `peel` and no remainder, the loop's last group runs after it as the remainder would: the code after
    the loop (a tile's clamp and stores) then shares a basic block with FMAs (`Target.peel_reduction`)."""
    unroll = max(1, min(unroll, extent))
    full, rest = divmod(extent, unroll)
    if peel and full and not rest:
        full, rest = full - 1, unroll
    if full:
        with b.loop(full, f"{prefix}o") as outer:
            for inner in range(unroll):
                body(outer * unroll + inner)
    for tail in range(rest):
        body(Affine.of(full * unroll + tail))


def lane_group(step: Affine, extent: int, lanes: int) -> tuple[Affine, int] | None:
    """A reduction step as `unrolled` numbers them (outer * unroll + inner, or a constant in the remainder)
    as (the first step of its group of `lanes`, its lane in that group), when the whole group is in
    range(extent): in the loop if the unroll is a multiple of `lanes` (the coefficient says so), in the
    remainder if the group ends by `extent`. None otherwise: the step is loaded on its own."""
    lane = step.const % lanes
    if any(c % lanes for _, c in step.terms):
        return None
    start = step + (-lane)
    if not step.terms and start.const + lanes > extent:
        return None
    return start, lane


def transpose(b: NestBuilder, rows: Sequence[Value], prefix: str = "tp") -> list[Reg]:
    """The n x n transpose of n vectors of n lanes (n >= 2 a power of two): register i of the result holds
    lane i of every row. log2(n) stages of n two-input shuffles; stage k swaps bit k of the row number
    with bit k of the lane number (rows u and u + k, bit k of u clear: u takes u's lanes with the bit
    clear and u + k's shifted down, u + k the rest), so after the last stage element (u, v) is at (v, u)."""
    n = len(rows)
    assert n >= 2 and n & (n - 1) == 0, "a power of two"
    current: Sequence[Value] = rows
    regs: list[Reg] = []
    for stage, k in enumerate(1 << e for e in range(n.bit_length() - 1)):
        regs = [b.register(f"{prefix}{stage % 2}_{u}", n) for u in range(n)]
        low = tuple(v if not v & k else n + v - k for v in range(n))
        high = tuple(v + k if not v & k else n + v for v in range(n))
        for u in (u for u in range(n) if not u & k):
            b.assign(regs[u], Shuffle(current[u], current[u + k], low))
            b.assign(regs[u + k], Shuffle(current[u], current[u + k], high))
        current = regs
    return regs


@dataclass(frozen=True, kw_only=True)
class Rows:
    """`count` rows of a buffer, row u starting at `start(u)`, each `length` floats: contiguous, or (step 2)
    every other float of a row of `span` readable floats."""

    buffer: str
    start: Callable[[int], Affine]
    count: int
    length: int
    step: int = 1
    span: int = 0

    def load(self, u: int, at: Affine, lanes: int, n: int) -> Value:
        """Row u's floats at..at+n (n <= lanes) as a vector. Step 2: one load of 2*lanes floats and its even
        lanes by a shuffle (AArch64 LD2, RISC-V VLSEG2 after LLVM's InterleavedAccess pass; two loads and a
        permute on x86), reading 2n - 1 floats where the row ends before a whole 2*lanes."""
        if self.step == 1:
            return Load(self.buffer, self.start(u) + at, lanes, n % lanes)
        assert self.step == 2, "contiguous rows or every other float"
        whole = 2 * (self.length // lanes) * lanes <= self.span  # every full chunk's 2*lanes are readable
        count = 0 if n == lanes and whole else 2 * n - 1
        both = Load(self.buffer, self.start(u) + at * 2, 2 * lanes, count)
        return Shuffle(both, both, tuple(range(0, 2 * lanes, 2)))


def transposed_copy(b: NestBuilder, lanes: int, rows: Rows, dst: str, at: Affine, width: int) -> None:
    """dst[at + l*width + u] <- row u's float l, for every l and u < width (0 for the rows past
    `rows.count`): the rows written column by column, `width` (a multiple of `lanes`) floats to a column.
    In lanes x lanes tiles of vector loads, `transpose` and vector stores: (2 + log2 lanes) / lanes
    instructions per float, where a scalar copy takes 2 and its loop's."""

    def chunk(l0: Affine, n: int) -> None:  # n < lanes: the last columns
        for g in range(width // lanes):
            loads: list[Value] = [
                rows.load(u, l0, lanes, n) if u < rows.count else Const(0.0, lanes)
                for u in range(g * lanes, (g + 1) * lanes)
            ]
            for v, column in enumerate(transpose(b, loads)[:n]):
                b.store(dst, at + (l0 + v) * width + g * lanes, column, lanes)

    b.split(rows.length, lanes, chunk, "tl")


def fma_columns_outer(
    b: NestBuilder,
    acc: Sequence[Sequence[Reg]],
    rows: Sequence[Value],
    regs: Sequence[Reg],
    columns: Sequence[Value],
) -> None:
    """acc[r][c] += rows[r] * columns[c], column by column: each column's vector goes into regs[c] and every
    row's FMA takes it there, so one column vector is live beside the accumulators and the rows' values
    (a lane-FMA tile, whose rows are vectors of several k steps: `tile_registers` with lane_fma)."""
    for c, column in enumerate(columns):
        b.assign(regs[c], column)
        for r, row in enumerate(rows):
            b.assign(acc[r][c], MulAdd(row, regs[c], acc[r][c]))
