"""Features of int8 direct convolution configs: a QConv2dTemplate and config indices in, a float matrix
out (relative to the target, vectorized over configs, for the XGBoost cost model)."""

from __future__ import annotations

import numpy as np

from xtune.ops.featurize import Configs, FeatureSet, Indices, log2
from xtune.ops.qconv2d.template import QConv2dTemplate
from xtune.ops.template import ScheduleTemplate
from xtune.ops.tiles import whole_tiles

QCONV2D_FEATURES = (
    "log2_pixels",
    "log2_k",
    "log2_groups",
    "log2_ow",
    "lanes_log2",
    "mr",
    "nv",
    "regs_used_frac",
    "dots_per_load",
    "ksplit",
    "unroll_log2",
    "order_pk",
    "inner_nm",
    "taps_unrolled",
    "panel_l2",
    "strip_l1",
    "x_waste",
    "k_waste",
    "copied",
)


def qconv2d_features(template: ScheduleTemplate, indices: Indices) -> np.ndarray:
    assert isinstance(template, QConv2dTemplate)
    t, sh, configs = template.target, template.sh, Configs(template, indices)
    mr, nv = configs.tiles()
    lmul = configs.lmul()
    lanes = template.lanes * lmul
    nr = nv * lanes
    ksplit = configs.ints("ksplit")
    used = np.array(
        [template.plan.registers(int(r), int(v), int(p)) for r, v, p in zip(mr, nv, ksplit, strict=True)]
    )
    nc = whole_tiles(configs.ints("nc"), float(sh.k), nr)
    panel = template.groups * 4.0
    ones = np.ones(len(mr))
    cols = [
        ones * np.log2(sh.n * sh.oh * sh.ow),
        ones * np.log2(sh.k),
        ones * np.log2(template.groups),
        ones * np.log2(sh.ow),
        log2(lanes),
        mr,
        nv,
        used / t.vector_registers,
        mr * nv / (mr + nv),
        ksplit,
        log2(configs.ints("unroll")),
        configs.flag("order", "pk"),
        configs.flag("inner", "nm"),
        configs.flag("taps", "unroll"),
        nc * panel / t.l2_bytes,
        nr * panel / t.l1d_bytes,
        np.ceil(sh.ow / mr) * mr / sh.ow - 1,
        np.ceil(sh.k / nr) * nr / sh.k - 1,
        ones * float(template.image(template.lanes).copied),
    ]
    return np.stack(cols, axis=1)


FEATURES = FeatureSet(name="qconv2d", columns=QCONV2D_FEATURES, compute=qconv2d_features)
