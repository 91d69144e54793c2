"""The qconv2d family: int8 direct 2-D convolution in NHWC, an implicit GEMM through qmatmul's register
tile (template.py), int32 accumulation and qmatmul's requantizing epilogue. Its workload keys,
validation, tensors, exact integer reference (xtune/ops/qconv.py), flops, features (features.py), and
the ONNX QLinearConv nodes of group 1 it runs.

For a network build (xtune/frontend/quantized.py turns QDQ patterns into QLinearConv nodes): `anchor`
of a QLinearConv with constant int8 weights is an `Anchor` whose `task_key` is the workload key and whose
constants are the workload's inputs after `input`: `task_weights(wl, anchor.weights)` (ONNX's OIHW as
(r, s, c, k)), `anchor.bias` (int32, k), then `anchor.quant`'s "scale" (float32, ONNX Runtime's x_scale *
w_scale / y_scale, per tensor or output channel) and "qparams" ([x_zero_point, y_zero_point, lo, hi],
the clamp narrowed by `out_lo`/`out_hi`: docs/int8.md). TFLite's OHWI filters are transpose(1, 2, 3, 0).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from xtune.ops.featurize import FeatureSet
from xtune.ops.qconv import WINDOW_KEYS, QConvOperator, qconv_shape, sample
from xtune.ops.qconv2d.features import FEATURES
from xtune.ops.qconv2d.template import QConv2dTemplate
from xtune.ops.qmatmul.operator import QTYPES, QUANT_KEYS, output_dtype, quant_tensors
from xtune.ops.template import ScheduleTemplate
from xtune.ops.workload import TensorSpec, Workload
from xtune.target import Target


class QConv2d(QConvOperator):
    """Quantized output[n, y, x, k] = requantize(sum_{i,j,c} (input[n, y*stride + i*dil - top,
    x*stride + j*dil - left, c] - za) * weights[i, j, c, k] + bias[k]), the input padded with za: NHWC
    input (n, h, w, c) of type `a`, int8 HWIO weights (r, s, c, k) (symmetric: zero point 0), int32
    bias, the scales of `requant` (qmatmul's: onnx, tflite, none) per tensor or output channel, qparams
    [za, zy, lo, hi]; output (n, oh, ow, k) of type `a` (int32 with requant=none: ONNX's ConvInteger)."""

    name: ClassVar[str] = "qconv2d"
    sizes: ClassVar[tuple[str, ...]] = ("n", "c", "h", "w", "k", "r", "s")
    keys: ClassVar[tuple[str, ...]] = (*sizes, *WINDOW_KEYS, *QUANT_KEYS)
    depthwise: ClassVar[bool] = False

    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]:
        sh = qconv_shape(wl)
        return (
            TensorSpec("input", (sh.n, sh.h, sh.w, sh.c), dtype=QTYPES[str(wl.value("a"))]),
            TensorSpec("weights", (sh.r, sh.s, sh.c, sh.k), dtype="int8", axes="HWIO", constant=True),
            TensorSpec("bias", (sh.k,), dtype="int32", constant=True),
            *quant_tensors(wl, sh.k),
            TensorSpec(
                "output", (sh.n, sh.oh, sh.ow, sh.k), is_output=True, dtype=output_dtype(wl), exact=True
            ),
        )

    def sample(self, wl: Workload, rng: np.random.Generator) -> list[np.ndarray]:
        sh = qconv_shape(wl)
        return sample(wl, rng, (sh.r, sh.s, sh.c, sh.k))

    def flops(self, wl: Workload) -> int:
        sh = qconv_shape(wl)
        return 2 * sh.n * sh.oh * sh.ow * sh.k * sh.r * sh.s * sh.c

    feature_sets: ClassVar[tuple[FeatureSet, ...]] = (FEATURES,)

    def template(self, wl: Workload, target: Target) -> ScheduleTemplate:
        return QConv2dTemplate(wl, target)

    def features(self, template: ScheduleTemplate) -> tuple[FeatureSet, ScheduleTemplate]:
        return FEATURES, template

    def task_weights(self, wl: Workload, weights: np.ndarray) -> np.ndarray:
        """ONNX's OIHW int8 weights as the workload's (r, s, c, k)."""
        return np.ascontiguousarray(weights.transpose(2, 3, 1, 0))
