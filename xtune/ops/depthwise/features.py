"""The depthwise family's features: an NCHW depthwise template (the "depthwise" cost models) or an NHWC
one (the "depthwise_nhwc" models, another template and space) and config indices in, the feature matrix
out; the NHWC one's with its analytic estimate."""

from __future__ import annotations

import numpy as np

from xtune.ops.conv import ConvShape, conv_shape
from xtune.ops.depthwise import nchw_tiles as depthwise
from xtune.ops.depthwise import nhwc_tiles as depthwise_nhwc
from xtune.ops.estimate import (
    FMA_LATENCY,
    L2_BW,
    L3_BW,
    LOADS_PER_CYCLE,
    LOOP_CYCLES,
    STORES_PER_CYCLE,
    WINDOW,
    overlapped,
    vector_fma_rate,
)
from xtune.ops.featurize import (
    WINDOW_FEATURES,
    Configs,
    FeatureSet,
    Indices,
    log2,
    target_sizes,
    tile_columns,
    tile_features,
    waste,
    window_columns,
)
from xtune.ops.template import ScheduleTemplate
from xtune.target import Target

DEPTHWISE_FEATURES = (
    *WINDOW_FEATURES,
    "multiplier",
    "lanes_log2",
    "acc_regs_frac",
    "fma_per_load",
    "p",
    "nv",
    "ow_waste",
    "oh_waste",
    "pad_waste",
    "plane_l1",
    "plane_l2",
    "block_cols_frac",
    "order_yx",
    "unroll_kh",
    "unrolled_fmas_log2",
    "ext_taps",
)


def depthwise_features(template: ScheduleTemplate, indices: Indices) -> np.ndarray:
    t, sh = template.target, conv_shape(template.workload)
    cfg = Configs(template, indices)
    p, nv = cfg.tiles()
    lanes, regs, l1, l2 = target_sizes(t)
    width = nv * lanes
    owb = depthwise.column_block(sh, width, cfg.ints("tile_ow"))
    unroll_kh = cfg.flag("unroll_kh", 1)
    plane = 4.0 * sh.padded[0] * sh.stride * depthwise.phase_width(sh, t.fp32_lanes)
    one = np.ones_like(p)
    cols = [
        *window_columns(sh, one),
        one * sh.multiplier,
        one * np.log2(lanes),
        p * nv / regs,
        depthwise.fmas_per_load(sh, p, nv),
        p,
        nv,
        waste(sh.ow, width),
        waste(sh.oh, p),
        one * (sh.padded[0] * sh.padded[1] / (sh.h * sh.w) - 1),
        one * np.log2(plane / l1),
        one * np.log2(plane / l2),
        owb / sh.ow,
        cfg.flag("order", "yx"),
        unroll_kh,
        log2(p * nv * sh.s * np.where(unroll_kh > 0, sh.r, 1)),
        cfg.flag("taps", "ext"),
    ]
    return np.stack(cols, axis=1)


DEPTHWISE_NHWC_FEATURES = (
    *WINDOW_FEATURES,
    "multiplier",
    "lanes_log2",
    *tile_features("p"),
    "k_waste",
    "ow_waste",
    "border_frac",
    "rows_l1",
    "row_block_l2",
    "weights_l1",
    "k_blocks_log2",
    "oh_blocks_log2",
    "unroll_kh",
    "unrolled_fmas_log2",
    "expand_per_fma",
    "two_rows",
    "est_compute_eff",
    "est_memory_per_compute",
    "est_eff",
)


def depthwise_nhwc_features(template: ScheduleTemplate, indices: Indices) -> np.ndarray:
    """The NHWC depthwise template's configs (ops/depthwise/nhwc.py): channels are its vectors,
    output pixels along a row its tile rows, channel and row blocks what stays in cache."""
    t, sh = template.target, conv_shape(template.workload)
    cfg = Configs(template, indices)
    p, nv = cfg.tiles()
    lanes, regs, l1, l2 = target_sizes(t)
    nr = nv * lanes
    kb = depthwise_nhwc.channel_block(sh, nr, cfg.ints("tile_k"))
    ohb = depthwise_nhwc.row_block(sh, cfg.ints("tile_oh"))
    (ylo, yhi), (xlo, xhi) = depthwise_nhwc.interiors(sh)
    inner = max(1, xhi - xlo)
    unroll_kh = cfg.flag("unroll_kh", 1)
    pair = cfg.flag("rows", 2) * (sh.multiplier == 1)  # two-row tiles (a multiplier runs one-row ones)
    rows = np.asarray(depthwise_nhwc.rows_bytes(sh, kb))
    block_rows = (ohb - 1) * sh.stride + (sh.r - 1) * sh.dilation + 1
    border = 1.0 - (yhi - ylo) * (xhi - xlo) / (sh.oh * sh.ow)
    expand = (sh.multiplier > 1) * sh.r * sh.w / (sh.ow * sh.r * sh.s)  # copies per FMA, per output row
    one = np.ones_like(p)
    cols = [
        *window_columns(sh, one),
        one * sh.multiplier,
        one * np.log2(lanes),
        *tile_columns(
            p * (1 + pair),
            nv,
            regs,
            np.where(
                pair > 0, depthwise_nhwc.pair_registers(sh, p, nv), depthwise_nhwc.tile_registers(sh, p, nv)
            ),
            np.where(
                pair > 0,
                depthwise_nhwc.pair_fmas_per_load(sh, p, nv),
                depthwise_nhwc.fmas_per_load(sh, p, nv),
            ),
        ),
        waste(sh.k, nr),
        waste(inner, p),
        one * border,
        log2(rows / l1),
        log2(rows * block_rows / ((sh.r - 1) * sh.dilation + 1) / l2),
        log2(4 * sh.r * sh.s * kb / l1),
        log2(np.ceil(sh.k / kb)),
        log2(np.ceil(max(1, yhi - ylo) / ohb)),
        unroll_kh,
        log2(p * nv * sh.s * np.where(unroll_kh > 0, sh.r, 1)),
        one * expand,
        pair,
        *depthwise_nhwc_estimate(t, sh, (p, nv), (kb, ohb), unroll_kh),
    ]
    return np.stack(cols, axis=1)


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
        (p, np.floor(inner / p)),
        (inner - np.floor(inner / p) * p, np.ones_like(p)),
        *((np.minimum(p, float(e)), np.ceil(e / p)) for e in (xlo, sh.ow - xhi) if e > 0),
    ]
    # The channel strips of a row: k // kb blocks of kb channels and the rest, each in strips of nv.
    blocks_whole = np.floor(sh.k / kb)
    rest = sh.k - blocks_whole * kb
    strips: list[tuple[np.ndarray, np.ndarray]] = []
    for kcur, count in ((kb, blocks_whole), (rest, np.ones_like(kb))):
        whole, tail = _strips(kcur, nv, lanes)
        strips += [(nv, count * whole), (tail, count)]
    serial = 1.0 - unroll_kh
    row = sum(
        cn * sc * _nhwc_tile_cycles(sh, px, v, fma_rate, serial) for px, cn in columns for v, sc in strips
    )
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


NCHW = FeatureSet(name="depthwise", columns=DEPTHWISE_FEATURES, compute=depthwise_features)
NHWC = FeatureSet(name="depthwise_nhwc", columns=DEPTHWISE_NHWC_FEATURES, compute=depthwise_nhwc_features)
