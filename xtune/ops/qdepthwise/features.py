"""Features of int8 depthwise configs: a QDepthwiseTemplate and config indices in, a float matrix out
(relative to the target, vectorized over configs, for the XGBoost cost model)."""

from __future__ import annotations

import numpy as np

from xtune.ops.featurize import Configs, FeatureSet, Indices
from xtune.ops.qdepthwise.template import QDepthwiseTemplate
from xtune.ops.template import ScheduleTemplate

QDEPTHWISE_FEATURES = (
    "log2_pixels",
    "log2_c",
    "log2_taps",
    "log2_ow",
    "lanes_log2",
    "mr",
    "nv",
    "regs_used_frac",
    "order_cp",
    "taps_unrolled",
    "product_i32",
    "x_waste",
    "c_waste",
    "image_l1",
    "route_dot",
)


def qdepthwise_features(template: ScheduleTemplate, indices: Indices) -> np.ndarray:
    assert isinstance(template, QDepthwiseTemplate)
    t, sh, configs = template.target, template.sh, Configs(template, indices)
    mr, nv = configs.tiles()
    width = nv * template.lanes
    ones = np.ones(len(mr))
    cols = [
        ones * np.log2(sh.n * sh.oh * sh.ow),
        ones * np.log2(sh.c),
        ones * np.log2(sh.r * sh.s),
        ones * np.log2(sh.ow),
        ones * np.log2(template.lanes),
        mr,
        nv,
        (mr * nv + 4 * nv) / t.vector_registers,
        configs.flag("order", "cp"),
        configs.flag("taps", "unroll"),
        configs.flag("product", "i32"),
        np.ceil(sh.ow / mr) * mr / sh.ow - 1,
        np.ceil(sh.c / width) * width / sh.c - 1,
        ones * (sh.r * sh.padded[1] * sh.c / t.l1d_bytes),  # the image rows one output row reads
        configs.flag("route", "dot"),
    ]
    return np.stack(cols, axis=1)


FEATURES = FeatureSet(name="qdepthwise", columns=QDEPTHWISE_FEATURES, compute=qdepthwise_features)
