"""Features: a template and config indices in, a float matrix out, relative to the target so that a model
trained on one board's logs ranks configs for a similar board. Each operator family computes its own
(xtune/ops/<family>/features.py, found through xtune/ops/registry.py); here is what tuning needs of them:
the feature set a template's configs are described by, its columns, and the analytic estimate column as a
cost model that needs no data."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from xtune.ops.registry import FEATURE_SETS, features_of
from xtune.ops.template import ScheduleTemplate

FEATURES_VERSION = 2  # 2: matmul gained the analytic cycle estimate (est_* columns)


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
    """The analytic prior of feature set `op`, or None when it has no estimate column."""
    names = FEATURE_SETS[op].columns if op in FEATURE_SETS else ()
    return EstimatePrior(names.index(ESTIMATE_COLUMN)) if ESTIMATE_COLUMN in names else None


def feature_names(op: str) -> tuple[str, ...]:
    return FEATURE_SETS[op].columns


def features_op(template: ScheduleTemplate) -> str:
    """The name of the feature set (and of the cost models, and of the estimate) that describes
    `template`'s configs: its family's pick (a pointwise conv2d's is "matmul", an NHWC depthwise's
    "depthwise_nhwc", a Winograd conv2d's "winograd")."""
    return features_of(template)[0].name


def featurize(template: ScheduleTemplate, indices: Sequence[int] | np.ndarray) -> np.ndarray:
    """An (len(indices), n_features) float64 matrix for configs of one template."""
    features, view = features_of(template)
    return features.compute(view, indices)
