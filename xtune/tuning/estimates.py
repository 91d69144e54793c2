"""Analytic estimates: first-order cycle models of a template's configs, as the share of the FMA peak a
config would reach (features.py's `est_*` columns; the analytic prior ranks a cold search's first batch
by them, `EstimatePrior`). Crude on purpose: they order configs across shapes and targets, and the trees
learn what they miss. The machine constants and the shared rules (a register tile's cycles, the cache
level a working set lives in) are here; each operator's estimate sits beside its features."""

from __future__ import annotations

import numpy as np

from xtune.operators import ConvShape
from xtune.target import Target
from xtune.templates import depthwise_nhwc

# Machine constants the estimate assumes for every target (none is in the descriptors; fitted by eye to
# a few matmul shapes on one machine, docs/benchmarks.md, History): FMA latency in cycles, vector loads and
# broadcasts per cycle, cache line bytes, cache associativity, and the bytes per cycle that L2 and what
# lies beyond it stream to one core.
FMA_LATENCY, LOADS_PER_CYCLE, BROADCASTS_PER_CYCLE = 4.0, 2.0, 1.0
STORES_PER_CYCLE = 1.0
# Instructions an out-of-order core keeps in flight: a short call's FMA chains overlap with the next call's.
WINDOW = 128.0
LINE, WAYS, L2_BW, L3_BW = 64.0, 8.0, 32.0, 20.0
# An unpacked B strip jumps a whole row of B per k step: the prefetchers, which follow streams within a
# page, fall behind, so beyond L1 it arrives at a fraction of the streaming bandwidth.
STRIDED_L2_BW, STRIDED_L3_BW = 16.0, 4.0
# The share of the shorter of a kernel's compute and memory streams that runs under the longer: the
# prefetchers and the out-of-order window hide most of it, not all (a depthwise layer whose compute and
# L3 stream take about as long ran at 85 % of FMA peak, docs/benchmarks.md).
HIDDEN = 0.9
# Cycles a loop iteration the template did not unroll adds (increment, compare, branch).
LOOP_CYCLES = 1.0


def tile_cycles(rows: np.ndarray, vecs: np.ndarray, fma_rate: float, kc: np.ndarray) -> np.ndarray:
    """Cycles per k step of a rows x vecs register tile: bound by FMA issue, by one accumulator's FMA
    latency chain (unless a call of kc steps is short enough for the next call's chains to overlap it),
    by the loads (vecs B vectors + rows A values) or by the rows broadcasts of A. 0 for an empty tile."""
    overlap = 1.0 + WINDOW / (kc * (rows * vecs + rows + vecs) + 1.0)
    cycles = np.maximum.reduce(
        [
            rows * vecs / fma_rate,
            FMA_LATENCY / overlap,
            (rows + vecs) / LOADS_PER_CYCLE,
            rows / BROADCASTS_PER_CYCLE,
        ]
    )
    return np.where((rows > 0) & (vecs > 0), cycles, 0.0)


def capacity(cache: float, row_bytes: np.ndarray | float, stride_bytes: float) -> np.ndarray:
    """Bytes of a cache that a block of rows `stride_bytes` apart can use: a power-of-two stride maps
    every row to the same few sets (set index = line address mod sets), the rest of the cache sits idle."""
    sets = cache / (LINE * WAYS)
    stride_lines = stride_bytes / LINE
    if stride_lines != int(stride_lines) or stride_lines == 0:
        return np.full_like(np.asarray(row_bytes, dtype=np.float64), cache)
    reach = sets / np.gcd(int(stride_lines), int(sets))  # distinct starting sets of the rows
    return np.minimum(1.0, reach * np.ceil(np.asarray(row_bytes) / LINE) / sets) * cache


def level(working_set: np.ndarray, l1: np.ndarray | float, l2: np.ndarray | float) -> np.ndarray:
    """0 if the working set fits the usable L1, 1 if L2, else 2."""
    return np.where(working_set <= l1, 0, np.where(working_set <= l2, 1, 2))


def vector_fma_rate(t: Target) -> float:
    """Vector FMAs the target issues per cycle."""
    return max(t.fp32_flops_per_cycle / (2.0 * t.fp32_lanes), 1.0)


def overlapped(*cycles: np.ndarray) -> np.ndarray:
    """Cycles of streams (compute, each cache level's traffic) that run side by side: the longest, plus
    the part of the others it does not hide (HIDDEN)."""
    stacked = np.stack(np.broadcast_arrays(*cycles))
    longest = stacked.max(axis=0)
    return longest + (1.0 - HIDDEN) * (stacked.sum(axis=0) - longest)


# ---- depthwise, NHWC (templates/depthwise_nhwc.py) ---------------------------------------------------


def _nhwc_tile_cycles(
    sh: ConvShape, pixels: np.ndarray, vecs: np.ndarray, fma_rate: float, serial_kh: np.ndarray
) -> np.ndarray:
    """Cycles of one P pixels x V vectors tile over its whole window: per kernel row, s*P*V FMAs against
    the s*V weight and V-per-input-column loads (depthwise_nhwc.input_columns); each accumulator is a
    chain of r*s FMAs (their latency shows unless P*V chains, or the next tiles', cover it); P*V stores;
    a loop step per kernel row unless unrolled. 0 for an empty tile."""
    loads = sh.r * vecs * (sh.s + depthwise_nhwc.input_columns(sh, pixels))
    fmas = sh.r * sh.s * pixels * vecs
    chain = sh.r * sh.s * FMA_LATENCY / (1.0 + WINDOW / (fmas + loads + 1.0))
    cycles = (
        np.maximum.reduce([fmas / fma_rate, loads / LOADS_PER_CYCLE, pixels * vecs / STORES_PER_CYCLE, chain])
        + serial_kh * sh.r * LOOP_CYCLES
    )
    return np.where((pixels > 0) & (vecs > 0), cycles, 0.0)


def _strips(kcur: np.ndarray, nv: np.ndarray, lanes: float) -> tuple[np.ndarray, np.ndarray]:
    """Whole strips of nv vectors in kcur channels, and the vectors of the last, narrower strip (a
    partial vector costs a whole one: masked loads and stores)."""
    whole = np.floor(kcur / (nv * lanes))
    return whole, np.ceil((kcur - whole * nv * lanes) / lanes)


def depthwise_nhwc_estimate(
    t: Target,
    sh: ConvShape,
    tile: tuple[np.ndarray, np.ndarray],
    blocks: tuple[np.ndarray, np.ndarray],
    unroll_kh: np.ndarray,
) -> list[np.ndarray]:
    """The NHWC depthwise kernel's share of the FMA peak: its register tiles (with the row's tail and
    border pixels and the channel blocks' tail strips), and the input and output streams: from L2 if the
    layer's tensors stay there between calls, else from beyond; the input rows that consecutive output
    rows share are fetched again from L2 when a channel block's rows do not stay in L1
    (depthwise_nhwc.reuses_rows) or, at every row block's edge, when other channel blocks ran in between,
    and from beyond L2 there when those blocks push them out of L2 too. Returns (compute share, memory
    cycles / compute cycles, the estimate)."""
    p, nv = tile
    kb, ohb = blocks
    lanes, fma_rate = float(t.fp32_lanes), vector_fma_rate(t)
    l2 = float(t.l2_bytes)
    (_, _), (xlo, xhi) = depthwise_nhwc.interiors(sh)
    inner = max(0, xhi - xlo)
    # The pixel tiles of a row: whole tiles and the tail of the interior, and the border pixels in tiles
    # of at most p (their taps on the padding are left out: counted whole here).
    columns = [
        (p, np.floor(inner / p)), (inner - np.floor(inner / p) * p, np.ones_like(p)),
        *((np.minimum(p, float(e)), np.ceil(e / p)) for e in (xlo, sh.ow - xhi) if e > 0),
    ]  # fmt: skip
    # The channel strips of a row: k // kb blocks of kb channels and the rest, each in strips of nv.
    blocks_whole = np.floor(sh.k / kb)
    rest = sh.k - blocks_whole * kb
    strips: list[tuple[np.ndarray, np.ndarray]] = []
    for kcur, count in ((kb, blocks_whole), (rest, np.ones_like(kb))):
        whole, tail = _strips(kcur, nv, lanes)
        strips += [(nv, count * whole), (tail, count)]
    serial = 1.0 - unroll_kh
    row = sum(cn * sc * _nhwc_tile_cycles(sh, px, v, fma_rate, serial) for px, cn in columns
              for v, sc in strips)  # fmt: skip
    rows = float(sh.n * sh.oh)
    # A multiplier above 1 copies each output row's input rows, a float at a time, repeated m times.
    expand = (sh.multiplier > 1) * rows * sh.r * sh.w * sh.k / STORES_PER_CYCLE
    compute = rows * row + expand
    ideal = sh.n * sh.oh * sh.ow * sh.k * sh.r * sh.s / (lanes * fma_rate)
    # Streams: the input once and the output once per call, from L2 or beyond (a tensor that does not
    # stay in L2 between calls comes from beyond it).
    in_bytes, out_bytes = 4.0 * sh.n * sh.h * sh.w * sh.c, 4.0 * sh.n * sh.oh * sh.ow * sh.k
    stays_in_l2 = in_bytes + out_bytes + 4.0 * sh.r * sh.s * sh.k <= l2
    # Input rows an output row shares with the next (per output row) come again from L2 unless its channel
    # block's rows stay in L1; if they do, only the first row of a row block refetches them when other
    # channel blocks ran in between (kb < k: the channel blocks run inside a row block).
    window_rows = (sh.r - 1) * sh.dilation + 1
    shared = max(0, window_rows - sh.stride)
    in_l1 = depthwise_nhwc.reuses_rows(sh, kb, t)
    refetched = shared * np.where(in_l1, np.where(kb < sh.k, 1.0 / ohb, 0.0), 1.0)
    from_l2 = in_bytes * (1.0 + refetched / sh.stride)
    block_rows = (ohb - 1) * sh.stride + window_rows
    edge = (kb < sh.k) & (4.0 * block_rows * sh.w * sh.c > l2 / 2)
    beyond = in_bytes * (1.0 + np.where(edge, shared / (ohb * sh.stride), 0.0))
    if stays_in_l2:
        memory = [(from_l2 + out_bytes) / L2_BW]
    else:
        memory = [from_l2 / L2_BW, (beyond + out_bytes) / L3_BW]
    total = overlapped(compute, *memory)
    return [ideal / compute, np.maximum.reduce(memory) / compute, ideal / total]


# ---- Winograd F(2x2, 3x3) (templates/winograd.py) ----------------------------------------------------

# Vector instructions per 4x4 tile and channel vector of the transforms (templates/winograd_nest.py):
# the input's B^T d B is 16 loads, 32 adds and 16 stores, bound by its stores; the output's A^T M A is 16
# loads, 24 adds and 4 stores, bound by its loads (LOADS_PER_CYCLE). Per channel vector, in cycles.
INPUT_TRANSFORM, OUTPUT_TRANSFORM = 16.0 / STORES_PER_CYCLE, 16.0 / LOADS_PER_CYCLE


def winograd_estimate(
    t: Target,
    sizes: tuple[float, float, float],
    tile: tuple[np.ndarray, np.ndarray],
    blocks: tuple[np.ndarray, np.ndarray, np.ndarray],
    unroll: np.ndarray,
    e: int,
) -> list[np.ndarray]:
    """The Winograd kernel's share of the FMA peak of its e GEMMs (tiles x C x K): the register tiles of
    each GEMM (the rows of a block's last tile group, per-call accumulator traffic, its channel loop's
    steps), the input transform (again for every output-channel block) and the output transform, and U
    streaming from L2 or beyond once per block of tiles. `sizes` is (tiles, c, k); `blocks` the tiles,
    input and output channels per block. Returns (GEMM share, transform cycles / GEMM cycles, the
    estimate)."""
    n_tiles, c, k = sizes
    mr, nv = tile
    nt, cb, kb = blocks
    lanes, fma_rate = float(t.fp32_lanes), vector_fma_rate(t)
    nr = nv * lanes
    tile_blocks, k_blocks, c_blocks = np.ceil(n_tiles / nt), np.ceil(k / kb), np.ceil(c / cb)
    groups, tail = np.floor(nt / mr), nt - np.floor(nt / mr) * mr
    strips = k_blocks * kb / nr
    step = groups * tile_cycles(mr, nv, fma_rate, cb) + tile_cycles(tail, nv, fma_rate, cb)
    calls = e * tile_blocks * c_blocks * strips * np.ceil(nt / mr)
    overhead = calls * (2.0 * mr * nv / LOADS_PER_CYCLE + 8.0 + 0.5 * np.ceil(cb / unroll))
    gemm = e * tile_blocks * strips * c * step + overhead
    transforms = n_tiles * (
        np.ceil(c / lanes) * k_blocks * INPUT_TRANSFORM + np.ceil(k / lanes) * OUTPUT_TRANSFORM
    )
    u_bytes = 4.0 * e * c * k
    u_bw = L2_BW if u_bytes <= t.l2_bytes / 2 else L3_BW
    ideal = e * n_tiles * c * k / (lanes * fma_rate)
    total = overlapped(gemm + transforms, tile_blocks * u_bytes / u_bw)
    return [ideal / gemm, transforms / gemm, ideal / total]
