"""Features of quantized matmul configs: a QMatmulTemplate and config indices in, a float matrix out
(relative to the target, vectorized over configs, for the XGBoost cost model)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xtune.ops.featurize import Configs, FeatureSet
from xtune.ops.qmatmul.template import QMatmulTemplate
from xtune.ops.template import ScheduleTemplate
from xtune.ops.tiles import whole_tiles

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
    t, wl = template.target, template.workload
    configs = Configs(template, indices)
    values, ints = configs.values, configs.ints
    mr, nv = configs.tiles()
    lmul = configs.lmul()
    m, n, k, lanes = float(wl["m"]), float(wl["n"]), float(wl["k"]), template.lanes * lmul
    nr = nv * lanes
    mc = whole_tiles(ints("mc"), m, mr)
    nc = whole_tiles(ints("nc"), n, nr)
    ksplit = ints("ksplit")
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
        np.log2(ints("unroll")),
        (values("order") == "nm").astype(np.float64),
        (values("inner") == "nm").astype(np.float64),
        mc * k / t.l2_bytes,
        nc * k / t.l2_bytes,
        nr * k / t.l1d_bytes,
        np.ceil(m / mr) * mr / m - 1,
        np.ceil(n / nr) * nr / n - 1,
    ]
    return np.stack(cols, axis=1)


FEATURES = FeatureSet(name="qmatmul", columns=QMATMUL_FEATURES, compute=qmatmul_features)
