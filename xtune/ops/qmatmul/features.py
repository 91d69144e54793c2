"""Features of quantized matmul configs: a QMatmulTemplate and config indices in, a float matrix out
(relative to the target, vectorized over configs, for the XGBoost cost model)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xtune.ops.qmatmul.template import QMatmulTemplate
from xtune.templates import ScheduleTemplate
from xtune.templates.tiles import parse_tile, whole_tiles

QMATMUL_FEATURES = (
    "log2_m",
    "log2_n",
    "log2_k",
    "lanes_log2",
    "mr",
    "nv",
    "acc_regs_frac",
    "regs_used_frac",
    "dots_per_load",
    "ksplit",
    "unroll_log2",
    "order_nm",
    "inner_nm",
    "a_block_l2",
    "b_panel_l2",
    "b_strip_l1",
    "m_waste",
    "n_waste",
)


def qmatmul_features(template: ScheduleTemplate, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    assert isinstance(template, QMatmulTemplate)
    t, wl, space = template.target, template.workload, template.space
    digits = space.digits(np.asarray(indices, dtype=np.int64))
    options = {knob.name: (col, knob.options) for col, knob in enumerate(space.knobs)}

    def values(name: str) -> np.ndarray:
        col, opts = options[name]
        return np.asarray(opts, dtype=object)[digits[:, col]]

    tiles = np.array([parse_tile(str(v)) for v in values("tile")], dtype=np.float64).reshape(-1, 2)
    mr, nv = tiles[:, 0], tiles[:, 1]
    lmul = values("lmul").astype(np.float64) if "lmul" in options else np.ones(len(mr))
    m, n, k, lanes = float(wl["m"]), float(wl["n"]), float(wl["k"]), template.lanes * lmul
    nr = nv * lanes
    mc = whole_tiles(values("mc").astype(np.float64), m, mr)
    nc = whole_tiles(values("nc").astype(np.float64), n, nr)
    ksplit = values("ksplit").astype(np.float64)
    regs = float(t.vector_registers)
    used = np.array(
        [template.plan.registers(int(r), int(v), int(p)) for r, v, p in zip(mr, nv, ksplit, strict=True)]
    )
    ones = np.ones(len(mr))
    cols = [
        ones * np.log2(m),
        ones * np.log2(n),
        ones * np.log2(k),
        ones * np.log2(lanes),
        mr,
        nv,
        mr * nv * ksplit / regs,
        used / regs,
        mr * nv / (mr + nv),
        ksplit,
        np.log2(values("unroll").astype(np.float64)),
        (values("order") == "nm").astype(np.float64),
        (values("inner") == "nm").astype(np.float64),
        mc * k / t.l2_bytes,
        nc * k / t.l2_bytes,
        nr * k / t.l1d_bytes,
        np.ceil(m / mr) * mr / m - 1,
        np.ceil(n / nr) * nr / n - 1,
    ]
    return np.stack(cols, axis=1)
