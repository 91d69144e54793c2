"""Cost models: feature matrices and measured costs in, scores (higher = faster) for new configs out."""

from __future__ import annotations

import math
import os
from typing import Any, Protocol, runtime_checkable

import numpy as np
import xgboost as xgb

from xtune.errors import InputError


@runtime_checkable
class CostModel(Protocol):
    """What a tuner needs of a model: learn from (features, costs), then score new feature rows."""

    def fit(self, features: np.ndarray, costs: np.ndarray) -> None:
        """`costs` in seconds (or any unit, lower = better); +inf marks a config that failed."""
        ...

    def predict(self, features: np.ndarray) -> np.ndarray:
        """One score per row; only the order matters, higher = better."""
        ...


def throughput_target(costs: np.ndarray) -> np.ndarray:
    """Costs -> training labels in [0, 1]: the best cost in the data gets 1, a failed config 0.

    Normalizing by the best makes labels comparable across workloads of different sizes (AutoTVM did the
    same with flop/s over the max), and a failed config is a known-bad point, not a missing one."""
    costs = np.asarray(costs, dtype=np.float64)
    ok = np.isfinite(costs) & (costs > 0)
    y = np.zeros(costs.shape, dtype=np.float32)
    if ok.any():
        y[ok] = costs[ok].min() / costs[ok]
    return y


def grouped_throughput_target(costs: np.ndarray, groups: np.ndarray) -> np.ndarray:
    """`throughput_target` within each group: every (workload, target) is normalized by its own best, so
    a pretrained model's labels are on the same [0, 1] scale as one tuning run's."""
    costs, groups = np.asarray(costs, dtype=np.float64), np.asarray(groups)
    ok = np.isfinite(costs) & (costs > 0)
    _, inverse = np.unique(groups, return_inverse=True)
    best = np.full(inverse.max(initial=-1) + 1, np.inf)
    np.minimum.at(best, inverse[ok], costs[ok])
    y = np.zeros(costs.shape, dtype=np.float32)
    y[ok] = best[inverse[ok]] / costs[ok]
    return y


class XGBoostCostModel:
    """Gradient-boosted trees on normalized throughput.

    `objective` is "reg" (squared error on the [0, 1] throughput) or "rank" (pairwise ranking within the
    data, AutoTVM's `rank` loss). On our synthetic spaces "reg" finds the optimum in fewer trials: the
    tuner only needs the top of the order right, and regression keeps failed regions decisively low.

    Transfer hook: with `base` (a model pretrained on other logs), the base's score times a weight is the
    booster's starting margin in both fit and predict, so the local trees learn the residual. The weight is
    `base_weight * 0.5 ** (n / base_halflife)`, n = rows fitted so far: the prior fades as local data grows.
    """

    def __init__(
        self,
        seed: int = 0,
        objective: str = "rank",
        n_trees: int = 100,
        max_depth: int = 5,
        learning_rate: float = 0.15,
        max_bin: int = 64,
        max_rows: int = 2000,
        nthread: int = 1,
        base: CostModel | None = None,
        base_weight: float = 1.0,
        base_halflife: float = 200.0,
    ) -> None:
        if objective not in ("reg", "rank"):
            raise InputError(f"unknown cost model objective '{objective}' (known: reg, rank)")
        self.seed = seed
        self.objective = objective
        self.n_trees = n_trees
        self.max_rows = max_rows
        self.params: dict[str, Any] = {
            "objective": "reg:squarederror" if objective == "reg" else "rank:pairwise",
            "tree_method": "hist",
            "max_depth": max_depth,
            # Fewer bins than xgboost's 256 fit faster and rank the same (docs/benchmarks.md, History).
            "max_bin": max_bin,
            "eta": learning_rate,
            "subsample": 1.0,
            "min_child_weight": 1,
            "gamma": 1e-4,
            "lambda": 1.0,
            "nthread": nthread,
            "seed": seed,
            "verbosity": 0,
        }
        if objective == "reg":
            self.params["base_score"] = 0.0
        else:
            # A few random pairs per row (not xgboost's default top-k pairs) fit faster and rank as well
            # (docs/benchmarks.md, History).
            self.params.update(lambdarank_pair_method="mean", lambdarank_num_pair_per_sample=4)
        self.base = base
        self.base_weight = base_weight
        self.base_halflife = base_halflife
        self._booster: xgb.Booster | None = None
        self._fitted_rows = 0

    @property
    def fitted(self) -> bool:
        return self._booster is not None

    def current_base_weight(self) -> float:
        if self.base is None:
            return 0.0
        return float(self.base_weight * 0.5 ** (self._fitted_rows / self.base_halflife))

    def _base_margin(self, features: np.ndarray) -> np.ndarray | None:
        weight = self.current_base_weight()
        if self.base is None or weight == 0.0:
            return None
        return (weight * np.asarray(self.base.predict(features), dtype=np.float32)).astype(np.float32)

    def fit(self, features: np.ndarray, costs: np.ndarray, groups: np.ndarray | None = None) -> None:
        """Fit on rows of one tuning run, or with `groups` (one id per row) on rows of many runs: labels are
        normalized per group and "rank" compares configs only within a group (one query per group)."""
        x = np.asarray(features, dtype=np.float32)
        if x.ndim != 2 or len(x) != len(costs) or (groups is not None and len(groups) != len(costs)):
            raise InputError(f"features {x.shape} do not match {len(costs)} costs (and groups)")
        self._fitted_rows = len(x)  # all local data, subsampled or not, fades the base model out
        if groups is None:
            g = np.zeros(len(x), dtype=np.int64)
            y = throughput_target(costs)
        else:
            order = np.argsort(groups, kind="stable")  # xgboost's queries are runs of consecutive rows
            x, g = x[order], np.unique(np.asarray(groups)[order], return_inverse=True)[1]
            y = grouped_throughput_target(np.asarray(costs)[order], g)
        keep = self._subsample(y)
        x, y, g = x[keep], y[keep], g[keep]
        dtrain = xgb.DMatrix(x, label=y, nthread=int(self.params["nthread"]))
        if self.objective == "rank":
            dtrain.set_group(np.bincount(g)[np.unique(g)])  # sizes of the sorted groups subsampling left
        margin = self._base_margin(x)
        if margin is not None:
            dtrain.set_base_margin(margin)
        # Fewer rounds while data is scarce: a few dozen rows do not support 100 trees.
        rounds = int(min(self.n_trees, max(30, len(x))))
        self._booster = xgb.train(self.params, dtrain, num_boost_round=rounds)

    def _subsample(self, y: np.ndarray) -> np.ndarray:
        """Sorted row numbers of at most `max_rows` rows, keeping the best quarter and a seeded random sample
        of the rest: fit time grows linearly with rows and the tuning loop refits after every batch."""
        if len(y) <= self.max_rows:
            return np.arange(len(y))
        order = np.argsort(-y, kind="stable")
        top, rest = order[: self.max_rows // 4], order[self.max_rows // 4 :]
        rng = np.random.default_rng(self.seed + len(y))
        return np.sort(np.concatenate([top, rng.choice(rest, self.max_rows - len(top), replace=False)]))

    def predict(self, features: np.ndarray) -> np.ndarray:
        x = np.asarray(features, dtype=np.float32)
        if self._booster is None:
            if self.base is not None:
                return np.asarray(self.base.predict(x), dtype=np.float64)
            raise InputError("cost model used before fit (and it has no base model)")
        margin = self._base_margin(x)
        out = (
            self._booster.inplace_predict(x, base_margin=margin)
            if margin is not None
            else self._booster.inplace_predict(x)
        )
        return np.asarray(out, dtype=np.float64)

    def to_bytes(self) -> bytes:
        """The booster as UBJSON bytes (xgboost's own model format, portable across its versions >= 1.6)."""
        if self._booster is None:
            raise InputError("cannot save a cost model that was never fitted")
        return bytes(self._booster.save_raw(raw_format="ubj"))

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        seed: int = 0,
        nthread: int = 1,
        objective: str = "reg",
        base: CostModel | None = None,
    ) -> XGBoostCostModel:
        """A fitted model from `to_bytes` output; InputError if `data` is not an xgboost model. `base` is the
        model it was boosted from, a fixed part of it that does not fade."""
        model = cls(seed=seed, nthread=nthread, objective=objective, base=base, base_halflife=math.inf)
        booster = xgb.Booster(params={"nthread": nthread})
        try:
            booster.load_model(bytearray(data))
        except xgb.core.XGBoostError as e:
            raise InputError(f"not an xgboost model: {str(e).splitlines()[0]}") from None
        model._booster = booster
        return model

    def save(self, path: str | os.PathLike[str]) -> None:
        """The booster as JSON (".json") or UBJSON (any other suffix, e.g. ".ubj"); the base is not saved."""
        if self._booster is None:
            raise InputError("cannot save a cost model that was never fitted")
        self._booster.save_model(os.fspath(path))

    def load(self, path: str | os.PathLike[str]) -> None:
        if not os.path.exists(path):
            raise InputError(f"no cost model at {path}")
        booster = xgb.Booster(params={"nthread": self.params["nthread"]})
        try:
            booster.load_model(os.fspath(path))
        except xgb.core.XGBoostError as e:
            raise InputError(f"{path} is not an xgboost model: {str(e).splitlines()[0]}") from None
        self._booster = booster

    @classmethod
    def from_file(cls, path: str | os.PathLike[str], seed: int = 0, nthread: int = 1) -> XGBoostCostModel:
        """A fitted model loaded from `path` (e.g. a pretrained model for transfer)."""
        model = cls(seed=seed, nthread=nthread)
        model.load(path)
        return model
