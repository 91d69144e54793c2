"""Features: a template and config indices in, a float matrix out, relative to the target so that a model
trained on one board's logs ranks configs for a similar board.

Computed analytically from each config's resolved loop structure (block sizes, register tile,
packing, order) rather than by building the nest, so that simulated annealing can score thousands
of configs per batch (vectorized over indices with numpy).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import cache

import numpy as np

from xtune.errors import InputError
from xtune.space import ConfigSpace, KnobValue
from xtune.target import Target
from xtune.templates import ScheduleTemplate
from xtune.templates.conv2d import padded
from xtune.templates.depthwise import phase_width
from xtune.templates.matmul import ORDERS, parse_tile
from xtune.workload import conv_shape

FEATURES_VERSION = 1

MATMUL_FEATURES = (
    "log2_m", "log2_n", "log2_k", "lanes_log2",
    "acc_regs_frac", "regs_used_frac", "fma_per_load", "mr", "nv",
    "b_strip_l1", "a_panel_l1", "a_block_l2", "b_panel_l2", "c_block_l2",
    "m_waste", "n_waste", "k_blocks_log2", "unroll_k_log2", "unrolled_fmas_log2",
    "pack_a", "pack_b", "inner_nm", "b_stride_log2", "a_stride_log2", "b_repacks_log2", "a_repacks_log2",
    *(f"order_{o}" for o in ORDERS),
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
    # Effective blocks, as MatmulTemplate.schedule resolves them.
    mc, nc, kc = ints("mc"), ints("nc"), ints("kc")
    mc = np.where(mc >= m, m, np.maximum(mr, np.floor(mc / mr) * mr))
    nc = np.where(nc >= n, n, np.maximum(nr, np.floor(nc / nr) * nr))
    order = cfg.values("order")
    pack_a, pack_b, unroll = ints("pack_a"), ints("pack_b"), ints("unroll_k")
    regs, l1, l2 = float(t.vector_registers), float(t.l1d_bytes), float(t.l2_bytes)
    # How often a panel is packed again: once per block of every loop outside the pair that fixes it.
    m_out = np.array([o.index("m") < max(o.index("n"), o.index("k")) for o in order], dtype=np.float64)
    n_out = np.array([o.index("n") < max(o.index("m"), o.index("k")) for o in order], dtype=np.float64)
    cols = [
        np.full_like(mr, np.log2(m)), np.full_like(mr, np.log2(n)), np.full_like(mr, np.log2(k)),
        np.full_like(mr, np.log2(lanes)),
        mr * nv / regs, (mr * nv + nv + 1) / regs, mr * nv / (mr + nv), mr, nv,
        _log2(4 * kc * nr / l1), _log2(4 * kc * mr / l1), _log2(4 * mc * kc / l2), _log2(4 * kc * nc / l2),
        _log2(4 * mc * nc / l2),
        np.ceil(m / mr) * mr / m - 1, np.ceil(n / nr) * nr / n - 1, _log2(np.ceil(k / kc)), _log2(unroll),
        _log2(unroll * mr * nv),
        pack_a, pack_b, cfg.flag("inner", "nm"),
        np.where(pack_b > 0, 0.0, np.log2(n)), np.where(pack_a > 0, 0.0, np.log2(k)),
        pack_b * m_out * _log2(np.ceil(m / mc)), pack_a * n_out * _log2(np.ceil(n / nc)),
        *((order == o).astype(np.float64) for o in ORDERS),
    ]  # fmt: skip
    return np.stack(cols, axis=1)


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
    hp, wp = (float(v) for v in padded(sh))
    # Effective blocks, as Conv2dTemplate.schedule resolves them (its stack-budget clamp aside).
    cb = np.minimum(ints("tile_ic"), sh.c)
    kb = np.maximum(nr, np.ceil(np.minimum(ints("tile_oc"), sh.k) / nr) * nr)
    ohb = np.minimum(ints("tile_oh"), sh.oh)
    unroll_kw, unroll = ints("unroll_kw"), ints("unroll")
    hwc = flag("pack_layout", "hwc")
    rows = (ohb - 1) * sh.stride + (sh.r - 1) * sh.dilation + 1
    fmas = float(sh.k * sh.oh * sh.ow * sh.c * sh.r * sh.s)
    one = np.ones_like(p)
    cols = [
        one * np.log2(sh.c), one * np.log2(sh.k), one * np.log2(sh.oh), one * np.log2(sh.ow),
        one * np.log2(sh.r * sh.s), one * sh.stride, one * sh.dilation, one * np.log2(lanes), one * sh.nhwc,
        p * nv / regs, (p * nv + nv + 1) / regs, p * nv / (p + nv), p, nv,
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
    owb = cfg.ints("tile_ow")
    owb = np.where(owb >= sh.ow, sh.ow, np.maximum(width, np.floor(owb / width) * width))
    unroll_kh = cfg.flag("unroll_kh", 1)
    plane = 4.0 * (sh.h + 2 * sh.pad) * sh.stride * phase_width(sh, t.fp32_lanes)
    loads = ((p - 1) * sh.stride + sh.r) * sh.s * nv + sh.r * sh.s
    one = np.ones_like(p)
    cols = [
        one * np.log2(sh.k), one * np.log2(sh.oh), one * np.log2(sh.ow), one * np.log2(sh.r * sh.s),
        one * sh.stride, one * sh.dilation, one * sh.multiplier, one * np.log2(lanes),
        p * nv / regs, p * nv * sh.r * sh.s / loads, p, nv,
        np.ceil(sh.ow / width) * width / sh.ow - 1, np.ceil(sh.oh / p) * p / sh.oh - 1,
        one * ((sh.h + 2 * sh.pad) * (sh.w + 2 * sh.pad) / (sh.h * sh.w) - 1),
        one * np.log2(plane / l1), one * np.log2(plane / l2), owb / sh.ow,
        cfg.flag("order", "yx"), unroll_kh,
        _log2(p * nv * sh.s * np.where(unroll_kh > 0, sh.r, 1)),
    ]  # fmt: skip
    return np.stack(cols, axis=1)


FEATURIZERS: dict[
    str, tuple[tuple[str, ...], Callable[[ScheduleTemplate, Sequence[int] | np.ndarray], np.ndarray]]
] = {
    "matmul": (MATMUL_FEATURES, matmul_features),
    "conv2d": (CONV2D_FEATURES, conv2d_features),
    "depthwise": (DEPTHWISE_FEATURES, depthwise_features),
}


def feature_names(op: str) -> tuple[str, ...]:
    return FEATURIZERS[op][0]


def featurize(template: ScheduleTemplate, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """An (len(indices), n_features) float64 matrix for configs of one template."""
    if template.workload.op not in FEATURIZERS:
        raise InputError(f"no features defined for operator '{template.workload.op}'")
    return FEATURIZERS[template.workload.op][1](template, indices)
