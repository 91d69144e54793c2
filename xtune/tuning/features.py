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
from xtune.tuning.costmodel import CostModel

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


class PartsModel:
    """A sum's cost model made of its parts' (FeatureSet.parts): each row scored by its part's model on its
    part's block. A pretrained model of direct and Winograd logs thus ranks the configs of a conv2d whose
    algorithm is the tuner's (each part's scores in its own model's units: the local model, fitted on
    the sum's own features, weighs the parts against each other)."""

    def __init__(self, parts: Sequence[tuple[CostModel, int, int]]) -> None:
        self.parts = list(parts)

    def fit(self, features: np.ndarray, costs: np.ndarray) -> None:
        """Nothing to learn here: the parts are pretrained."""

    def predict(self, features: np.ndarray) -> np.ndarray:
        x = np.asarray(features)
        out = np.zeros(len(x), dtype=np.float64)
        for number, (model, first, end) in enumerate(self.parts):
            mine = x[:, 0] == number
            if mine.any():
                out[mine] = model.predict(x[mine, first:end])
        return out


def parts_of(op: str) -> tuple[tuple[str, int, int], ...]:
    """The parts' feature sets of a sum's set `op` and their blocks (none for any other set)."""
    return FEATURE_SETS[op].parts if op in FEATURE_SETS else ()


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
