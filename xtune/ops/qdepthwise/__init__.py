"""The qdepthwise family: int8 depthwise 2-D convolution in NHWC (one filter per channel, multiplier 1),
widening multiply-adds into int32 (template.py) and qmatmul's requantizing epilogue. Its workload keys,
validation, tensors, exact integer reference (xtune/ops/qconv.py), flops, features (features.py), and
the ONNX QLinearConv nodes whose group is their channel count.

For a network build: `anchor` of such a QLinearConv is an `Anchor` whose `task_key` is the workload key
and whose constants are the workload's inputs after `input`: `task_weights(wl, anchor.weights)` (ONNX's
(c, 1, r, s) as (r, s, c); TFLite's depthwise filter (1, r, s, c) reshaped), `anchor.bias` (int32, c),
then `anchor.quant`'s "scale" and "qparams" as qconv2d's (xtune/ops/qconv2d/__init__.py).
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np

from xtune.ops.featurize import FeatureSet
from xtune.ops.qconv import WINDOW_KEYS, QConvOperator, qconv_shape, sample
from xtune.ops.qdepthwise.features import FEATURES
from xtune.ops.qdepthwise.template import QDepthwiseTemplate
from xtune.ops.qmatmul.operator import QTYPES, QUANT_KEYS, output_dtype, quant_tensors
from xtune.ops.template import ScheduleTemplate
from xtune.ops.workload import TensorSpec, Workload
from xtune.target import Target


class QDepthwise(QConvOperator):
    """Quantized output[n, y, x, c] = requantize(sum_{i,j} (input[n, y*stride + i*dil - top,
    x*stride + j*dil - left, c] - za) * weights[i, j, c] + bias[c]), the input padded with za: NHWC input
    (n, h, w, c) of type `a`, int8 weights (r, s, c) (symmetric), int32 bias (c,), the scales of
    `requant` per tensor or channel, qparams [za, zy, lo, hi]; output (n, oh, ow, c) of type `a`."""

    name: ClassVar[str] = "qdepthwise"
    sizes: ClassVar[tuple[str, ...]] = ("n", "c", "h", "w", "r", "s")
    keys: ClassVar[tuple[str, ...]] = (*sizes, *WINDOW_KEYS, *QUANT_KEYS)
    depthwise: ClassVar[bool] = True

    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]:
        sh = qconv_shape(wl)
        return (
            TensorSpec("input", (sh.n, sh.h, sh.w, sh.c), dtype=QTYPES[str(wl.value("a"))]),
            TensorSpec("weights", (sh.r, sh.s, sh.c), dtype="int8", constant=True),
            TensorSpec("bias", (sh.c,), dtype="int32", constant=True),
            *quant_tensors(wl, sh.c),
            TensorSpec(
                "output", (sh.n, sh.oh, sh.ow, sh.c), is_output=True, dtype=output_dtype(wl), exact=True
            ),
        )

    def sample(self, wl: Workload, rng: np.random.Generator) -> list[np.ndarray]:
        sh = qconv_shape(wl)
        return sample(wl, rng, (sh.r, sh.s, sh.c))

    def flops(self, wl: Workload) -> int:
        sh = qconv_shape(wl)
        return 2 * sh.n * sh.oh * sh.ow * sh.c * sh.r * sh.s

    feature_sets: ClassVar[tuple[FeatureSet, ...]] = (FEATURES,)

    def template(self, wl: Workload, target: Target) -> ScheduleTemplate:
        return QDepthwiseTemplate(wl, target)

    def features(self, template: ScheduleTemplate) -> tuple[FeatureSet, ScheduleTemplate]:
        return FEATURES, template

    def task_weights(self, wl: Workload, weights: np.ndarray) -> np.ndarray:
        """ONNX's (c, 1, r, s) int8 weights as the workload's (r, s, c)."""
        return np.ascontiguousarray(weights[:, 0].transpose(1, 2, 0))
