"""The conv2d family's features: a direct conv2d template (the "conv2d" cost models), a Winograd one
(the "winograd" models, another space) or the sum of both (the "conv2d_auto" models: an algorithm
indicator, each algorithm's block, and an estimate comparable across them) and config indices in, the
feature matrix out; Winograd's and the sum's with their analytic estimates. A pointwise conv2d is
featured as its matmul (xtune/ops/conv2d/__init__.py)."""

from __future__ import annotations

import numpy as np

from xtune.ops import tiles
from xtune.ops.conv import ConvShape, conv_shape
from xtune.ops.conv2d import direct as conv2d
from xtune.ops.conv2d.direct_schedule import padded, transposes_input, transposes_output
from xtune.ops.conv2d.winograd_transforms import MS
from xtune.ops.estimate import (
    L2_BW,
    L3_BW,
    LOADS_PER_CYCLE,
    STORES_PER_CYCLE,
    STRIDED_L2_BW,
    overlapped,
    tile_cycles,
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
from xtune.ops.template import ScheduleTemplate, SumTemplate
from xtune.target import Target

CONV2D_FEATURES = (
    "log2_c",
    *WINDOW_FEATURES,
    "lanes_log2",
    "nhwc",
    *tile_features("p"),
    "k_waste",
    "ow_waste",
    "pad_waste",
    "input_block_l2",
    "input_rows_l1",
    "weight_strip_l1",
    "weight_block_l2",
    "c_blocks_log2",
    "k_blocks_log2",
    "unroll_kw",
    "unroll_log2",
    "unrolled_fmas_log2",
    "order_pk",
    "reduction_rsc",
    "pack_hwc",
    "scalar_pack",
    "nchw_scatter_per_fma",
    "pack_per_fma",
)


def conv2d_features(template: ScheduleTemplate, indices: Indices) -> np.ndarray:
    # A grouped conv2d is described by one group's convolution: its space and blocking are that group's.
    t, sh = template.target, conv_shape(template.workload).per_group
    cfg = Configs(template, indices)
    ints, flag = cfg.ints, cfg.flag
    p, nv = cfg.tiles()
    lanes, regs, l1, l2 = target_sizes(t)
    nr = nv * lanes
    hp, wp = (float(v) for v in padded(sh))
    cb, kb, ohb = conv2d.channel_blocks(sh, nr, ints("tile_ic"), ints("tile_oc"), ints("tile_oh"))
    unroll_kw, unroll = ints("unroll_kw"), ints("unroll")
    hwc = flag("pack_layout", "hwc")
    sub = ints("subsample")
    copied = np.where(sub > 0, sh.oh * sh.ow, hp * wp)  # pixels of the packed input
    transposed = transposes_input(ints("transpose_in"), hwc, sub, cb, int(lanes), sh.stride)
    # The transposed NCHW tile store: about half the cycles of the scalar one per output (llvm-mca,
    # docs/benchmarks.md); old configs keep their features, so models trained before the knob still hold.
    scatter = np.where(transposes_output(ints("transpose_out"), p, int(lanes)), 0.5, 1.0)
    rows = (ohb - 1) * sh.stride + (sh.r - 1) * sh.dilation + 1
    fmas = float(sh.k * sh.oh * sh.ow * sh.c * sh.r * sh.s)
    one = np.ones_like(p)
    cols = [
        one * np.log2(sh.c),
        *window_columns(sh, one),
        one * np.log2(lanes),
        one * sh.nhwc,
        *tile_columns(p, nv, regs, tiles.tile_registers(p, nv), tiles.fmas_per_load(p, nv)),
        waste(sh.k, nr),
        waste(sh.ow, p),
        one * (hp * wp / (sh.h * sh.w) - 1),
        log2(4 * cb * hp * wp / l2),
        log2(4 * rows * wp * cb / l1),
        log2(4 * cb * sh.r * sh.s * nr / l1),
        log2(4 * cb * sh.r * sh.s * kb / l2),
        log2(np.ceil(sh.c / cb)),
        log2(np.ceil(sh.k / kb)),
        unroll_kw,
        log2(unroll),
        log2(p * nv * unroll * np.where(unroll_kw > 0, sh.s, 1)),
        flag("order", "pk"),
        flag("reduction", "rsc"),
        hwc,
        ((hwc != sh.nhwc) & ~transposed).astype(np.float64),
        scatter * (0.0 if sh.nhwc else 1.0 / (sh.c * sh.r * sh.s)),
        sh.c * copied / fmas,
    ]
    return np.stack(cols, axis=1)


WINOGRAD_FEATURES = (
    "log2_c",
    "log2_k",
    "log2_tiles",
    "lanes_log2",
    *tile_features("mr"),
    "block_tiles_log2",
    "group_waste",
    "k_waste",
    "v_block_l2",
    "m_block_l2",
    "u_strip_l1",
    "c_blocks_log2",
    "k_blocks_log2",
    "unroll_log2",
    "order_kt",
    "weight_transform_per_fma",
    "input_transforms_per_fma",
    "nhwc",
    "tile_side",  # m of F(m x m, 3x3)
    "est_gemm_eff",
    "est_transforms_per_gemm",
    "est_eff",
)


def winograd_features(template: ScheduleTemplate, indices: Indices) -> np.ndarray:
    """The generic register-tile and blocking columns of the e GEMMs (tiles x C x K) of a Winograd conv2d
    (e = (m + 2)^2: 16 for F(2x2, 3x3), 36 for F(4x4, 3x3))."""
    t, sh = template.target, conv_shape(template.workload)
    cfg = Configs(template, indices)
    mr, nv = cfg.tiles()
    lanes, regs, l1, l2 = target_sizes(t)
    nr = nv * lanes
    m, th, tw, e = tile_sizes(sh, cfg)
    nt = np.minimum(cfg.ints("tile_ty"), th) * np.minimum(cfg.ints("tile_tx"), tw)
    cb, kb = np.minimum(cfg.ints("tile_ic"), sh.c), np.ceil(np.minimum(cfg.ints("tile_oc"), sh.k) / nr) * nr
    one = np.ones_like(mr)
    cols = [
        one * np.log2(sh.c),
        one * np.log2(sh.k),
        one * np.log2(th * tw),
        one * np.log2(lanes),
        *tile_columns(mr, nv, regs, tiles.tile_registers(mr, nv), tiles.fmas_per_load(mr, nv)),
        log2(nt),
        waste(nt, mr),
        waste(sh.k, nr),
        log2(4 * e * nt * sh.c / l2),
        log2(4 * e * nt * kb / l2),
        log2(4 * cb * nr / l1),
        log2(np.ceil(sh.c / cb)),
        log2(np.ceil(sh.k / kb)),
        log2(cfg.ints("unroll")),
        cfg.flag("order", "kt"),
        # Per call, unless prepacked=1: U of every output-channel block (once per tile, not per FMA); the
        # input is transformed again for every output-channel block.
        one * (0.0 if template.workload["prepacked"] else 1.0 / (th * tw)),
        np.ceil(sh.k / kb) / sh.k,
        one * sh.nhwc,
        m,
        *winograd_estimate(
            t,
            (th * tw * sh.n, float(sh.c), float(sh.k)),
            (mr, nv),
            (nt, cb, kb),
            cfg.ints("unroll"),
            e,
            float(sh.n * least_gemm_tiles(sh) * sh.c * sh.k),
        ),
    ]
    return np.stack(cols, axis=1)


def least_gemm_tiles(sh: ConvShape) -> float:
    """The fewer GEMM multiplies per channel pair and image of F(2x2) and F(4x4): (m + 2)^2 per tile."""
    return float(min((m + 2) ** 2 * np.ceil(sh.oh / m) * np.ceil(sh.ow / m) for m in MS))


def tile_sizes(sh: ConvShape, cfg: Configs) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per config: the tile side m, the tiles down and across, and the floats of a transformed tile."""
    m = cfg.ints("m")
    return m, np.ceil(sh.oh / m), np.ceil(sh.ow / m), (m + 2) ** 2


# Vector instructions per tile and channel vector of the transforms (ops/conv2d/winograd_nest.py), per
# transformed float: F(2x2)'s input B^T d B is 16 loads, 32 adds and 16 stores, bound by its stores; the
# output's A^T M A is 16 loads, 24 adds and 4 stores, bound by its loads (LOADS_PER_CYCLE); F(4x4)'s
# (36 loads, 144 operations, 36 stores; 36 loads, 60 operations, 16 stores) are bound alike. In cycles.
INPUT_TRANSFORM, OUTPUT_TRANSFORM = 1.0 / STORES_PER_CYCLE, 1.0 / LOADS_PER_CYCLE


def winograd_estimate(
    t: Target,
    sizes: tuple[float, float, float],
    tile: tuple[np.ndarray, np.ndarray],
    blocks: tuple[np.ndarray, np.ndarray, np.ndarray],
    unroll: np.ndarray,
    e: np.ndarray,
    base_fmas: float,
) -> list[np.ndarray]:
    """The Winograd kernel's share of the FMA peak of its e GEMMs (tiles x C x K): the register tiles of
    each GEMM (the rows of a block's last tile group, per-call accumulator traffic, its channel loop's
    steps), the input transform (again for every output-channel block) and the output transform, and U
    streaming from L2 or beyond once per block of tiles. `sizes` is (tiles, c, k); `blocks` the tiles,
    input and output channels per block. Returns (GEMM share, transform cycles / GEMM cycles, the
    estimate: the share of the peak of `base_fmas`, the fewer GEMM multiplies of F(2x2) and F(4x4), so
    that both compare and the estimate stays within (0, 1])."""
    n_tiles, c, k = sizes  # tiles per config
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
    per_tile = np.ceil(c / lanes) * k_blocks * INPUT_TRANSFORM + np.ceil(k / lanes) * OUTPUT_TRANSFORM
    transforms = n_tiles * e * per_tile
    u_bytes = 4.0 * e * c * k
    u_bw = np.where(u_bytes <= t.l2_bytes / 2, L2_BW, L3_BW)
    ideal = e * n_tiles * c * k / (lanes * fma_rate)
    total = overlapped(gemm + transforms, tile_blocks * u_bytes / u_bw)
    return [ideal / gemm, transforms / gemm, base_fmas / (lanes * fma_rate) / total]


DIRECT = FeatureSet(name="conv2d", columns=CONV2D_FEATURES, compute=conv2d_features)
WINOGRAD = FeatureSet(name="winograd", columns=WINOGRAD_FEATURES, compute=winograd_features)


def direct_estimate(template: ScheduleTemplate, indices: Indices) -> np.ndarray:
    """The direct kernel's share of the FMA peak (crude, as every estimate): its register tiles over the
    (c, r, s) reduction, each channel block's call overhead, the padded input copy (a float at a time
    where it transposes) and, unless prepacked=1, the weights packed at every call (a float at a time for
    OIHW read in rsc order), the weight blocks streaming from L2 when they outgrow L1 per output row."""
    t, sh = template.target, conv_shape(template.workload).per_group
    cfg = Configs(template, indices)
    p, nv = cfg.tiles()
    lanes, fma_rate = float(t.fp32_lanes), vector_fma_rate(t)
    nr = nv * lanes
    cb, kb, _ = conv2d.channel_blocks(sh, nr, cfg.ints("tile_ic"), cfg.ints("tile_oc"), cfg.ints("tile_oh"))
    hp, wp = (float(v) for v in padded(sh))
    rs, strips = float(sh.r * sh.s), np.ceil(sh.k / nr)
    tiles_at = sh.n * sh.oh * np.ceil(sh.ow / p) * strips  # register tiles per channel block
    step = tile_cycles(p, nv, fma_rate, cb * rs)
    calls = tiles_at * np.ceil(sh.c / cb)
    gemm = tiles_at * sh.c * rs * step + calls * (2.0 * p * nv / LOADS_PER_CYCLE + 8.0)
    hwc, sub = cfg.flag("pack_layout", "hwc"), cfg.ints("subsample")
    transposed = transposes_input(cfg.ints("transpose_in"), hwc, sub, cb, int(lanes), sh.stride)
    scalar_copy = (hwc != sh.nhwc) & ~transposed
    pixels = np.where(sub > 0, sh.oh * sh.ow, hp * wp)
    copy = sh.n * sh.c * pixels / STORES_PER_CYCLE * np.where(scalar_copy, 1.0, 1.0 / lanes)
    scalar_pack = (not sh.nhwc) & (cfg.flag("reduction", "rsc") > 0)
    weights = strips * nr * sh.c * rs
    pack = (
        0.0
        if template.workload["prepacked"]
        else weights / STORES_PER_CYCLE * np.where(scalar_pack, 1, 1 / lanes)
    )
    stream = sh.n * sh.oh * np.ceil(sh.c / cb) * 4.0 * cb * rs * kb / STRIDED_L2_BW
    ideal = sh.n * sh.oh * sh.ow * sh.k * sh.c * rs / (lanes * fma_rate)
    return ideal / overlapped(gemm + copy + pack, np.where(4.0 * cb * rs * kb > t.l1d_bytes, stream, 0.0))


def winograd_gain(template: ScheduleTemplate) -> float:
    """The direct convolution's multiplies per Winograd GEMM multiply of the tile side with fewer (F(4x4):
    4 for outputs a multiple of 4, less where partial tiles waste some): what turns Winograd's estimate (a
    share of that peak, whatever m) into the direct's units."""
    sh = conv_shape(template.workload)
    return sh.oh * sh.ow * sh.r * sh.s / least_gemm_tiles(sh)


AUTO_FEATURES = (
    "algo",  # the part: 0 direct, 1 Winograd
    *(f"direct.{c}" for c in CONV2D_FEATURES),
    *(f"winograd.{c}" for c in WINOGRAD_FEATURES),
    "est_eff",
)


def auto_features(template: ScheduleTemplate, indices: Indices) -> np.ndarray:
    """A config of the sum of both algorithms: its part (1 for Winograd), the direct block (0 for a Winograd
    config), the Winograd block (0 for a direct one), and the estimate in the direct's units (each
    algorithm's estimate; Winograd's times its multiply gain): the analytic prior ranks both at once."""
    assert isinstance(template, SumTemplate)
    part, local = template.sum.split(indices)
    (_, direct), (_, wino) = template.parts
    nd = len(CONV2D_FEATURES)
    out = np.zeros((len(part), len(AUTO_FEATURES)))
    d, w = part == 0, part == 1
    out[:, 0] = w
    if d.any():
        out[d, 1 : 1 + nd] = conv2d_features(direct, local[d])
        out[d, -1] = direct_estimate(direct, local[d])
    if w.any():
        block = winograd_features(wino, local[w])
        out[w, 1 + nd : -1] = block
        out[w, -1] = block[:, WINOGRAD_FEATURES.index("est_eff")] * winograd_gain(wino)
    return out


_ND = len(CONV2D_FEATURES)
AUTO = FeatureSet(
    name="conv2d_auto",
    columns=AUTO_FEATURES,
    compute=auto_features,
    parts=((DIRECT.name, 1, 1 + _ND), (WINOGRAD.name, 1 + _ND, 1 + _ND + len(WINOGRAD_FEATURES))),
)
