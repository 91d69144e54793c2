"""Features: a template and config indices in, a float matrix out, relative to the target so that a model
trained on one board's logs ranks configs for a similar board.

Computed analytically from each config's resolved loop structure (block sizes, register tile,
packing, order) rather than by building the nest, so that simulated annealing can score thousands
of configs per batch (vectorized over indices with numpy). What a config resolves to (effective
blocks, register use, loads per FMA) is the templates' rule, called here on arrays
(templates.matmul.effective_blocks, conv2d.channel_blocks, ...), never restated.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

import numpy as np

from xtune.errors import InputError
from xtune.operators import conv_shape
from xtune.ops.qmatmul.features import QMATMUL_FEATURES, qmatmul_features
from xtune.schedule.space import ConfigSpace, KnobValue
from xtune.target import Target
from xtune.templates import (
    ScheduleTemplate,
    conv2d,
    conv2d_nest,
    depthwise,
    depthwise_nhwc,
    features_template,
    matmul,
    tiles,
    winograd,
    winograd_nest,
)
from xtune.templates.matmul import ORDERS
from xtune.templates.tiles import parse_tile
from xtune.tuning.estimates import (
    L2_BW,
    L3_BW,
    LOADS_PER_CYCLE,
    STRIDED_L2_BW,
    STRIDED_L3_BW,
    capacity,
    depthwise_nhwc_estimate,
    level,
    tile_cycles,
    winograd_estimate,
)

FEATURES_VERSION = 2  # 2: matmul gained the analytic cycle estimate (est_* columns)

MATMUL_FEATURES = (
    "log2_m", "log2_n", "log2_k", "lanes_log2",
    "acc_regs_frac", "regs_used_frac", "fma_per_load", "mr", "nv",
    "b_strip_l1", "a_panel_l1", "a_block_l2", "b_panel_l2", "c_block_l2",
    "m_waste", "n_waste", "k_blocks_log2", "unroll_k_log2", "unrolled_fmas_log2",
    "pack_a", "pack_b", "inner_nm", "b_stride_log2", "a_stride_log2", "b_repacks_log2", "a_repacks_log2",
    *(f"order_{o}" for o in ORDERS),
    "est_micro_eff", "est_call_overhead", "est_pack_a", "est_pack_b", "est_b_level", "est_a_level",
    "est_mem_stall", "est_eff",
)  # fmt: skip


@cache
def _knob_tables(space: ConfigSpace) -> dict[str, tuple[int, np.ndarray]]:
    """Each knob's digit column and its options as an array, built once per space."""
    return {k.name: (col, np.asarray(k.options, dtype=object)) for col, k in enumerate(space.knobs)}


@cache
def _tile_table(options: tuple[KnobValue, ...]) -> np.ndarray:
    """(rows, vectors) of every "MRxNV" tile option: parsed once, not once per config."""
    return np.array([parse_tile(str(o)) for o in options], dtype=np.float64).reshape(-1, 2)


class _Configs:
    """Knob values of many configs at once: one table lookup per knob (SA featurizes every step)."""

    def __init__(self, template: ScheduleTemplate, indices: Sequence[int] | np.ndarray):
        self.digits = template.space.digits(np.asarray(indices, dtype=np.int64))
        self.tables = _knob_tables(template.space)

    def values(self, name: str) -> np.ndarray:
        col, table = self.tables[name]
        return table[self.digits[:, col]]

    def ints(self, name: str) -> np.ndarray:
        return self.values(name).astype(np.float64)

    def flag(self, name: str, value: KnobValue) -> np.ndarray:
        return (self.values(name) == value).astype(np.float64)

    def tiles(self) -> tuple[np.ndarray, np.ndarray]:
        col, table = self.tables["tile"]
        picked = _tile_table(tuple(table))[self.digits[:, col]]
        return picked[:, 0], picked[:, 1]


def _target_sizes(t: Target) -> tuple[float, float, float, float]:
    """fp32 lanes, vector registers, L1d and L2 bytes: the denominators of the relative features."""
    return float(t.fp32_lanes), float(t.vector_registers), float(t.l1d_bytes), float(t.l2_bytes)


def _log2(x: np.ndarray) -> np.ndarray:
    return np.log2(np.maximum(x.astype(np.float64), 1e-9))


def matmul_features(template: ScheduleTemplate, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    t, wl = template.target, template.workload
    m, n, k = float(wl["m"]), float(wl["n"]), float(wl["k"])
    cfg = _Configs(template, indices)
    ints = cfg.ints
    mr, nv = cfg.tiles()
    lanes = float(t.fp32_lanes)
    nr = nv * lanes
    mc, nc, kc = matmul.effective_blocks(wl, t.fp32_lanes, (mr, nv), (ints("mc"), ints("nc"), ints("kc")))
    order = cfg.values("order")
    pack_a, pack_b, unroll = ints("pack_a"), ints("pack_b"), ints("unroll_k")
    # Panels the kernel copies at every call: none of the operand passed prepacked (the weights).
    assert isinstance(template, matmul.MatmulTemplate)
    prepacked = template.operands.prepacked
    copy_a, copy_b = (matmul.packed_per_call(p, prepacked, o) for p, o in ((pack_a, "A"), (pack_b, "B")))
    regs, l1, l2 = float(t.vector_registers), float(t.l1d_bytes), float(t.l2_bytes)
    # How often a panel is packed again: once per block of every loop outside the pair that fixes it.
    m_out = np.array([matmul.repacked_per_block(o, "B") for o in order], dtype=np.float64)
    n_out = np.array([matmul.repacked_per_block(o, "A") for o in order], dtype=np.float64)
    cols = [
        np.full_like(mr, np.log2(m)), np.full_like(mr, np.log2(n)), np.full_like(mr, np.log2(k)),
        np.full_like(mr, np.log2(lanes)),
        mr * nv / regs, tiles.tile_registers(mr, nv) / regs, tiles.fmas_per_load(mr, nv), mr, nv,
        _log2(4 * kc * nr / l1), _log2(4 * kc * mr / l1), _log2(4 * mc * kc / l2), _log2(4 * kc * nc / l2),
        _log2(4 * mc * nc / l2),
        np.ceil(m / mr) * mr / m - 1, np.ceil(n / nr) * nr / n - 1, _log2(np.ceil(k / kc)), _log2(unroll),
        _log2(unroll * mr * nv),
        pack_a, pack_b, cfg.flag("inner", "nm"),
        np.where(pack_b > 0, 0.0, np.log2(n)), np.where(pack_a > 0, 0.0, np.log2(k)),
        copy_b * m_out * _log2(np.ceil(m / mc)), copy_a * n_out * _log2(np.ceil(n / nc)),
        *((order == o).astype(np.float64) for o in ORDERS),
        *_matmul_estimate(t, (m, n, k), (mr, nv, mc, nc, kc, unroll), (pack_a, pack_b, copy_a, copy_b),
                          order, (m_out, n_out), cfg.flag("inner", "nm")),
    ]  # fmt: skip
    return np.stack(cols, axis=1)


def _matmul_estimate(
    t: Target,
    shape: tuple[float, float, float],
    blocks: tuple[np.ndarray, ...],
    packs: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray],
    order: np.ndarray,
    outer: tuple[np.ndarray, np.ndarray],
    inner_nm: np.ndarray,
) -> list[np.ndarray]:
    """A first-order cycle model of the BLIS-style kernel, as fractions of the ideal cycle count: the
    microkernel (with its tail tiles), per-call overhead (accumulators in and out of C), packing (of the
    panels copied per call: `packs` is (pack_a, pack_b, copy_a, copy_b)), and the cache level each
    operand streams from. Crude on purpose: it orders configs across shapes and
    targets, and the trees learn what it misses."""
    m, n, k = shape
    mr, nv, mc, nc, kc, unroll = blocks
    pack_a, pack_b, copy_a, copy_b = packs
    lanes, _, _, _ = _target_sizes(t)
    fma_rate = max(t.fp32_flops_per_cycle / (2.0 * lanes), 1.0)  # vector FMAs issued per cycle
    nr, kc = nv * lanes, np.minimum(kc, k)
    ideal = m * n * k / (lanes * fma_rate)
    full_r, full_v = np.floor(m / mr), np.floor(n / nr)
    tail_r, tail_v = m - full_r * mr, np.ceil((n - full_v * nr) / lanes)
    micro = k * (
        full_r * full_v * tile_cycles(mr, nv, fma_rate, kc)
        + full_r * tile_cycles(mr, tail_v, fma_rate, kc)
        + full_v * tile_cycles(tail_r, nv, fma_rate, kc)
        + tile_cycles(tail_r, tail_v, fma_rate, kc)
    )
    level_bw = np.array([LOADS_PER_CYCLE * 4.0 * lanes, L2_BW, L3_BW])
    # Once per call the accumulators go out to C, and come in from it when k is blocked. Between two k
    # blocks, C is swept over the extents of the m and n loops inside the k loop: that decides its level.
    k_pos = np.array([o.index("k") for o in order])
    m_in = np.array([o.index("m") for o in order]) > k_pos
    n_in = np.array([o.index("n") for o in order]) > k_pos
    c_sweep = 4.0 * np.where(m_in, m, mc) * np.where(n_in, n, nc)
    c_l1, c_l2 = capacity(t.l1d_bytes, 4.0 * nc, 4.0 * n), capacity(t.l2_bytes, 4.0 * nc, 4.0 * n)
    c_level = level(c_sweep, c_l1, c_l2)
    calls = np.ceil(m / mr) * np.ceil(n / nr) * np.ceil(k / kc)
    c_bytes = 4.0 * mr * nr * (1.0 + (k > kc))
    overhead = calls * (c_bytes / level_bw[c_level] + 8.0 + 0.5 * np.ceil(kc / unroll))
    # Packing: B copied a vector per cycle, A a float per cycle, once per block of every outer loop.
    m_out, n_out = (x > 0 for x in outer)
    pack_b_cycles = copy_b * k * np.ceil(n / nr) * nr / lanes * np.where(m_out, np.ceil(m / mc), 1.0)
    pack_a_cycles = copy_a * k * np.ceil(m / mr) * mr * np.where(n_out, np.ceil(n / nc), 1.0)
    b_level, a_level = _stream_levels(t, (n, k), (mr, nr, mc, nc, kc), (pack_a, pack_b), inner_nm)
    # Per k step of a full tile: the bytes that come from beyond L1 against the tile's own cycles.
    step = tile_cycles(mr, nv, fma_rate, kc)
    strided_bw = np.array([level_bw[0], STRIDED_L2_BW, STRIDED_L3_BW])
    memory = (
        4.0 * nr / np.where(pack_b > 0, level_bw[b_level], strided_bw[b_level]) + 4.0 * mr / level_bw[a_level]
    )
    stall = np.maximum(memory - step, 0.0) / step
    total = micro * (1.0 + stall) + overhead + pack_a_cycles + pack_b_cycles
    return [ideal / micro, overhead / ideal, pack_a_cycles / ideal, pack_b_cycles / ideal,
            b_level.astype(np.float64), a_level.astype(np.float64), stall, ideal / total]  # fmt: skip


def _stream_levels(
    t: Target,
    nk: tuple[float, float],
    blocks: tuple[np.ndarray, ...],
    packs: tuple[np.ndarray, np.ndarray],
    inner_nm: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """Cache level (0 L1, 1 L2, 2 beyond) the microkernel streams B and A from.

    inner "nm": one B strip meets every row panel of the A block, so the strip must stay in L1 and the A
    block is re-read from L2 per strip; "mn": the A panel stays in L1 and the B block is re-read per
    panel. An unpacked operand is rows of the source matrix, whose stride limits the usable cache."""
    n, k = nk
    mr, nr, mc, nc, kc = blocks
    pack_a, pack_b = packs
    l1, l2 = float(t.l1d_bytes), float(t.l2_bytes)
    # Usable capacity for each operand's rows: packed panels are contiguous, unpacked rows are n (B) or
    # k (A) floats apart.
    b_l1 = np.where(pack_b > 0, l1, capacity(l1, 4.0 * nr, 4.0 * n))
    b_l2 = np.where(pack_b > 0, l2, capacity(l2, 4.0 * nc, 4.0 * n))
    a_l1 = np.where(pack_a > 0, l1, capacity(l1, 4.0 * kc, 4.0 * k))
    a_l2 = np.where(pack_a > 0, l2, capacity(l2, 4.0 * kc, 4.0 * k))
    strip, a_panel = 4.0 * kc * nr, 4.0 * kc * mr
    b_block, a_block = 4.0 * kc * nc, 4.0 * mc * kc
    b_nm = level(strip + a_panel, b_l1, b_l2 - a_block)
    a_nm = level(a_block + strip, a_l1, a_l2 - b_block)
    b_mn = level(b_block + a_panel, b_l1, b_l2 - a_block)
    return np.where(inner_nm > 0, b_nm, b_mn), np.where(inner_nm > 0, a_nm, 0)


CONV2D_FEATURES = (
    "log2_c", "log2_k", "log2_oh", "log2_ow", "log2_rs", "stride", "dilation", "lanes_log2", "nhwc",
    "acc_regs_frac", "regs_used_frac", "fma_per_load", "p", "nv",
    "k_waste", "ow_waste", "pad_waste",
    "input_block_l2", "input_rows_l1", "weight_strip_l1", "weight_block_l2",
    "c_blocks_log2", "k_blocks_log2", "unroll_kw", "unroll_log2", "unrolled_fmas_log2",
    "order_pk", "reduction_rsc", "pack_hwc", "scalar_pack", "nchw_scatter_per_fma", "pack_per_fma",
)  # fmt: skip

DEPTHWISE_FEATURES = (
    "log2_k", "log2_oh", "log2_ow", "log2_rs", "stride", "dilation", "multiplier", "lanes_log2",
    "acc_regs_frac", "fma_per_load", "p", "nv", "ow_waste", "oh_waste", "pad_waste",
    "plane_l1", "plane_l2", "block_cols_frac", "order_yx", "unroll_kh", "unrolled_fmas_log2",
)  # fmt: skip


def conv2d_features(template: ScheduleTemplate, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    t, sh = template.target, conv_shape(template.workload)
    cfg = _Configs(template, indices)
    ints, flag = cfg.ints, cfg.flag
    p, nv = cfg.tiles()
    lanes, regs, l1, l2 = _target_sizes(t)
    nr = nv * lanes
    hp, wp = (float(v) for v in conv2d_nest.padded(sh))
    cb, kb, ohb = conv2d.channel_blocks(sh, nr, ints("tile_ic"), ints("tile_oc"), ints("tile_oh"))
    unroll_kw, unroll = ints("unroll_kw"), ints("unroll")
    hwc = flag("pack_layout", "hwc")
    rows = (ohb - 1) * sh.stride + (sh.r - 1) * sh.dilation + 1
    fmas = float(sh.k * sh.oh * sh.ow * sh.c * sh.r * sh.s)
    one = np.ones_like(p)
    cols = [
        one * np.log2(sh.c), one * np.log2(sh.k), one * np.log2(sh.oh), one * np.log2(sh.ow),
        one * np.log2(sh.r * sh.s), one * sh.stride, one * sh.dilation, one * np.log2(lanes), one * sh.nhwc,
        p * nv / regs, tiles.tile_registers(p, nv) / regs, tiles.fmas_per_load(p, nv), p, nv,
        np.ceil(sh.k / nr) * nr / sh.k - 1, np.ceil(sh.ow / p) * p / sh.ow - 1,
        one * (hp * wp / (sh.h * sh.w) - 1),
        _log2(4 * cb * hp * wp / l2), _log2(4 * rows * wp * cb / l1), _log2(4 * cb * sh.r * sh.s * nr / l1),
        _log2(4 * cb * sh.r * sh.s * kb / l2),
        _log2(np.ceil(sh.c / cb)), _log2(np.ceil(sh.k / kb)), unroll_kw, _log2(unroll),
        _log2(p * nv * unroll * np.where(unroll_kw > 0, sh.s, 1)),
        flag("order", "pk"), flag("reduction", "rsc"), hwc, (hwc != sh.nhwc).astype(np.float64),
        one * (0.0 if sh.nhwc else 1.0 / (sh.c * sh.r * sh.s)), one * sh.c * hp * wp / fmas,
    ]  # fmt: skip
    return np.stack(cols, axis=1)


def depthwise_features(template: ScheduleTemplate, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    t, sh = template.target, conv_shape(template.workload)
    cfg = _Configs(template, indices)
    p, nv = cfg.tiles()
    lanes, regs, l1, l2 = _target_sizes(t)
    width = nv * lanes
    owb = depthwise.column_block(sh, width, cfg.ints("tile_ow"))
    unroll_kh = cfg.flag("unroll_kh", 1)
    plane = 4.0 * (sh.h + 2 * sh.pad) * sh.stride * depthwise.phase_width(sh, t.fp32_lanes)
    one = np.ones_like(p)
    cols = [
        one * np.log2(sh.k), one * np.log2(sh.oh), one * np.log2(sh.ow), one * np.log2(sh.r * sh.s),
        one * sh.stride, one * sh.dilation, one * sh.multiplier, one * np.log2(lanes),
        p * nv / regs, depthwise.fmas_per_load(sh, p, nv), p, nv,
        np.ceil(sh.ow / width) * width / sh.ow - 1, np.ceil(sh.oh / p) * p / sh.oh - 1,
        one * ((sh.h + 2 * sh.pad) * (sh.w + 2 * sh.pad) / (sh.h * sh.w) - 1),
        one * np.log2(plane / l1), one * np.log2(plane / l2), owb / sh.ow,
        cfg.flag("order", "yx"), unroll_kh,
        _log2(p * nv * sh.s * np.where(unroll_kh > 0, sh.r, 1)),
    ]  # fmt: skip
    return np.stack(cols, axis=1)


DEPTHWISE_NHWC_FEATURES = (
    "log2_k", "log2_oh", "log2_ow", "log2_rs", "stride", "dilation", "multiplier", "lanes_log2",
    "acc_regs_frac", "regs_used_frac", "fma_per_load", "p", "nv", "k_waste", "ow_waste", "border_frac",
    "rows_l1", "row_block_l2", "weights_l1", "k_blocks_log2", "oh_blocks_log2", "unroll_kh",
    "unrolled_fmas_log2", "expand_per_fma", "est_compute_eff", "est_memory_per_compute", "est_eff",
)  # fmt: skip


def depthwise_nhwc_features(template: ScheduleTemplate, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """The NHWC depthwise template's configs (templates/depthwise_nhwc.py): channels are its vectors,
    output pixels along a row its tile rows, channel and row blocks what stays in cache."""
    t, sh = template.target, conv_shape(template.workload)
    cfg = _Configs(template, indices)
    p, nv = cfg.tiles()
    lanes, regs, l1, l2 = _target_sizes(t)
    nr = nv * lanes
    kb = depthwise_nhwc.channel_block(sh, nr, cfg.ints("tile_k"))
    ohb = depthwise_nhwc.row_block(sh, cfg.ints("tile_oh"))
    (ylo, yhi), (xlo, xhi) = depthwise_nhwc.interiors(sh)
    inner = max(1, xhi - xlo)
    unroll_kh = cfg.flag("unroll_kh", 1)
    rows = np.asarray(depthwise_nhwc.rows_bytes(sh, kb))
    block_rows = (ohb - 1) * sh.stride + (sh.r - 1) * sh.dilation + 1
    border = 1.0 - (yhi - ylo) * (xhi - xlo) / (sh.oh * sh.ow)
    expand = (sh.multiplier > 1) * sh.r * sh.w / (sh.ow * sh.r * sh.s)  # copies per FMA, per output row
    one = np.ones_like(p)
    cols = [
        one * np.log2(sh.k), one * np.log2(sh.oh), one * np.log2(sh.ow), one * np.log2(sh.r * sh.s),
        one * sh.stride, one * sh.dilation, one * sh.multiplier, one * np.log2(lanes),
        p * nv / regs, depthwise_nhwc.tile_registers(sh, p, nv) / regs,
        depthwise_nhwc.fmas_per_load(sh, p, nv), p, nv,
        np.ceil(sh.k / nr) * nr / sh.k - 1, np.ceil(inner / p) * p / inner - 1, one * border,
        _log2(rows / l1), _log2(rows * block_rows / ((sh.r - 1) * sh.dilation + 1) / l2),
        _log2(4 * sh.r * sh.s * kb / l1), _log2(np.ceil(sh.k / kb)), _log2(np.ceil(max(1, yhi - ylo) / ohb)),
        unroll_kh, _log2(p * nv * sh.s * np.where(unroll_kh > 0, sh.r, 1)), one * expand,
        *depthwise_nhwc_estimate(t, sh, (p, nv), (kb, ohb), unroll_kh),
    ]  # fmt: skip
    return np.stack(cols, axis=1)


WINOGRAD_FEATURES = (
    "log2_c", "log2_k", "log2_tiles", "lanes_log2", "acc_regs_frac", "regs_used_frac", "fma_per_load",
    "mr", "nv", "block_tiles_log2", "group_waste", "k_waste", "v_block_l2", "m_block_l2", "u_strip_l1",
    "c_blocks_log2", "k_blocks_log2", "unroll_log2", "order_kt", "weight_transform_per_fma",
    "input_transforms_per_fma", "nhwc", "est_gemm_eff", "est_transforms_per_gemm", "est_eff",
)  # fmt: skip


def winograd_features(template: ScheduleTemplate, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """The generic register-tile and blocking columns of the 16 GEMMs (tiles x C x K) of a Winograd conv2d."""
    t, sh = template.target, conv_shape(template.workload)
    cfg = _Configs(template, indices)
    mr, nv = cfg.tiles()
    lanes, regs, l1, l2 = _target_sizes(t)
    nr = nv * lanes
    th, tw = winograd_nest.tiles(sh)
    e = winograd_nest.E  # floats per transformed tile
    nt = np.minimum(cfg.ints("tile_ty"), th) * np.minimum(cfg.ints("tile_tx"), tw)
    cb, kb = np.minimum(cfg.ints("tile_ic"), sh.c), np.ceil(np.minimum(cfg.ints("tile_oc"), sh.k) / nr) * nr
    one = np.ones_like(mr)
    cols = [
        one * np.log2(sh.c), one * np.log2(sh.k), one * np.log2(th * tw), one * np.log2(lanes),
        mr * nv / regs, tiles.tile_registers(mr, nv) / regs, tiles.fmas_per_load(mr, nv), mr, nv,
        _log2(nt), np.ceil(nt / mr) * mr / nt - 1, np.ceil(sh.k / nr) * nr / sh.k - 1,
        _log2(4 * e * nt * sh.c / l2), _log2(4 * e * nt * kb / l2), _log2(4 * cb * nr / l1),
        _log2(np.ceil(sh.c / cb)), _log2(np.ceil(sh.k / kb)), _log2(cfg.ints("unroll")),
        cfg.flag("order", "kt"),
        # Per call, unless prepacked=1: U of every output-channel block (once per tile, not per FMA); the
        # input is transformed again for every output-channel block.
        one * (0.0 if template.workload["prepacked"] else 1.0 / (th * tw)), np.ceil(sh.k / kb) / sh.k,
        one * sh.nhwc,
        *winograd_estimate(t, (float(th * tw * sh.n), float(sh.c), float(sh.k)), (mr, nv), (nt, cb, kb),
                           cfg.ints("unroll"), e),
    ]  # fmt: skip
    return np.stack(cols, axis=1)


FEATURIZERS: dict[
    str, tuple[tuple[str, ...], Callable[[ScheduleTemplate, Sequence[int] | np.ndarray], np.ndarray]]
] = {
    "matmul": (MATMUL_FEATURES, matmul_features),
    "conv2d": (CONV2D_FEATURES, conv2d_features),
    "depthwise": (DEPTHWISE_FEATURES, depthwise_features),
    "depthwise_nhwc": (DEPTHWISE_NHWC_FEATURES, depthwise_nhwc_features),
    "winograd": (WINOGRAD_FEATURES, winograd_features),
    "qmatmul": (QMATMUL_FEATURES, qmatmul_features),
}


class EstimatePrior:
    """A cost model that needs no data: the operator's analytic estimate column (`est_eff`) as the score.

    A cold model-based tuner ranks its first batch with it instead of drawing at random, and the local
    model starts from it as a fading base margin (XGBoostCostModel's `base`)."""

    def __init__(self, column: int) -> None:
        self.column = column

    def fit(self, features: np.ndarray, costs: np.ndarray) -> None:
        """Nothing to learn: the estimate is fixed."""

    def predict(self, features: np.ndarray) -> np.ndarray:
        return np.asarray(features, dtype=np.float64)[:, self.column]


ESTIMATE_COLUMN = "est_eff"  # the analytic estimate's share of peak throughput, in (0, 1]


def estimate_prior(op: str) -> EstimatePrior | None:
    """The analytic prior of `op`'s features, or None when its features have no estimate column."""
    names = FEATURIZERS[op][0] if op in FEATURIZERS else ()
    return EstimatePrior(names.index(ESTIMATE_COLUMN)) if ESTIMATE_COLUMN in names else None


def feature_names(op: str) -> tuple[str, ...]:
    return FEATURIZERS[op][0]


def features_op(template: ScheduleTemplate) -> str:
    """The operator whose features (and cost models, and estimate) describe `template`'s configs: its own,
    "matmul" for a conv2d that lowers through the matmul template (templates.features_template), or
    "depthwise_nhwc" for an NHWC depthwise, whose template (and space) is not the NCHW one's, or
    "winograd" for a conv2d with algo=winograd (another space than the direct conv2d's)."""
    view = features_template(template)
    if isinstance(view, depthwise_nhwc.DepthwiseNhwcTemplate):
        return "depthwise_nhwc"
    return "winograd" if isinstance(view, winograd.WinogradTemplate) else view.workload.op


def featurize(template: ScheduleTemplate, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """An (len(indices), n_features) float64 matrix for configs of one template."""
    view, op = features_template(template), features_op(template)
    if op not in FEATURIZERS:
        raise InputError(f"no features defined for operator '{op}'")
    return FEATURIZERS[op][1](view, indices)
