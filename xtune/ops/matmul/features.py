"""The matmul family's features: a matmul template and config indices in, the feature matrix out (the
"matmul" cost models), with the analytic cycle estimate of the BLIS-style kernel (its `est_*` columns)."""

from __future__ import annotations

import numpy as np

from xtune.ops import tiles
from xtune.ops.estimate import (
    L2_BW,
    L3_BW,
    LOADS_PER_CYCLE,
    STRIDED_L2_BW,
    STRIDED_L3_BW,
    capacity,
    level,
    tile_cycles,
)
from xtune.ops.featurize import (
    Configs,
    FeatureSet,
    Indices,
    log2,
    target_sizes,
    tile_columns,
    tile_features,
    waste,
)
from xtune.ops.matmul import schedule
from xtune.ops.matmul import template as matmul
from xtune.ops.matmul.template import ORDERS
from xtune.ops.template import ScheduleTemplate
from xtune.ops.tiles import group_lanes
from xtune.target import Target

MATMUL_FEATURES = (
    "log2_m",
    "log2_n",
    "log2_k",
    "lanes_log2",
    *tile_features("mr"),
    "b_strip_l1",
    "a_panel_l1",
    "a_block_l2",
    "b_panel_l2",
    "c_block_l2",
    "m_waste",
    "n_waste",
    "k_blocks_log2",
    "unroll_k_log2",
    "unrolled_fmas_log2",
    "pack_a",
    "pack_b",
    "inner_nm",
    "b_stride_log2",
    "a_stride_log2",
    "b_repacks_log2",
    "a_repacks_log2",
    *(f"order_{o}" for o in ORDERS),
    "est_micro_eff",
    "est_call_overhead",
    "est_pack_a",
    "est_pack_b",
    "est_b_level",
    "est_a_level",
    "est_mem_stall",
    "est_eff",
)


def matmul_features(template: ScheduleTemplate, indices: Indices) -> np.ndarray:
    t, wl = template.target, template.workload
    m, n, k = float(wl["m"]), float(wl["n"]), float(wl["k"])
    cfg = Configs(template, indices)
    ints = cfg.ints
    mr, nv = cfg.tiles()
    lmul = cfg.lmul()
    lanes = group_lanes(t, mr, nv, lmul).astype(np.float64)
    nr = nv * lanes
    mc, nc, kc = matmul.effective_blocks(wl, lanes, (mr, nv), (ints("mc"), ints("nc"), ints("kc")))
    order = cfg.values("order")
    pack_a, pack_b, unroll = ints("pack_a"), ints("pack_b"), ints("unroll_k")
    # Panels the kernel copies at every call: none of the operand passed prepacked (the weights).
    assert isinstance(template, matmul.MatmulTemplate)
    prepacked = template.operands.prepacked
    copy_a, copy_b = (schedule.packed_per_call(p, prepacked, o) for p, o in ((pack_a, "A"), (pack_b, "B")))
    regs, l1, l2 = float(t.vector_registers), float(t.l1d_bytes), float(t.l2_bytes)
    # How often a panel is packed again: once per block of every loop outside the pair that fixes it.
    m_out = np.array([schedule.repacked_per_block(o, "B") for o in order], dtype=np.float64)
    n_out = np.array([schedule.repacked_per_block(o, "A") for o in order], dtype=np.float64)
    cols = [
        np.full_like(mr, np.log2(m)),
        np.full_like(mr, np.log2(n)),
        np.full_like(mr, np.log2(k)),
        np.full_like(mr, np.log2(lanes)),
        *tile_columns(mr, nv, regs, tiles.tile_registers(mr, nv), tiles.fmas_per_load(mr, nv)),
        log2(4 * kc * nr / l1),
        log2(4 * kc * mr / l1),
        log2(4 * mc * kc / l2),
        log2(4 * kc * nc / l2),
        log2(4 * mc * nc / l2),
        waste(m, mr),
        waste(n, nr),
        log2(np.ceil(k / kc)),
        log2(unroll),
        log2(unroll * mr * nv),
        pack_a,
        pack_b,
        cfg.flag("inner", "nm"),
        np.where(pack_b > 0, 0.0, np.log2(n)),
        np.where(pack_a > 0, 0.0, np.log2(k)),
        copy_b * m_out * log2(np.ceil(m / mc)),
        copy_a * n_out * log2(np.ceil(n / nc)),
        *((order == o).astype(np.float64) for o in ORDERS),
        *_matmul_estimate(
            t,
            (m, n, k),
            (mr, nv * lanes / t.fp32_lanes, mc, nc, kc, unroll),  # a register group costs its registers
            (pack_a, pack_b, copy_a, copy_b),
            order,
            (m_out, n_out),
            cfg.flag("inner", "nm"),
        ),
    ]
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
    lanes, _, _, _ = target_sizes(t)
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
    return [
        ideal / micro,
        overhead / ideal,
        pack_a_cycles / ideal,
        pack_b_cycles / ideal,
        b_level.astype(np.float64),
        a_level.astype(np.float64),
        stall,
        ideal / total,
    ]


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


FEATURES = FeatureSet(name="matmul", columns=MATMUL_FEATURES, compute=matmul_features)
