"""What training a pretrained cost model is asked to do (`TrainOptions`, the `Objective` names): `xtune model
train` reads its defaults into its flags, so it imports no xgboost (`xtune --help` stays light)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# "reg": squared error on tuning's [0, 1] throughput labels; "rank": pairwise ranking (costmodel.py)
Objective = Literal["reg", "rank"]


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """How `xtune model train` fits; the model quality knobs live here, not in the CLI."""

    objective: Objective = (
        "reg"  # "reg": labels on tuning's [0, 1] scale, fit for a base margin; "rank": pairwise
    )
    # Boost from the operator's analytic estimate (features.py): the trees learn where the estimate is wrong,
    # and where the logs say nothing (shapes and configs far from theirs) the estimate still ranks.
    on_estimate: bool = True
    # The smallest forest that ranked held-out shapes as well as larger ones (docs/benchmarks.md, History):
    # model files ship inside the package.
    n_trees: int = 200
    max_depth: int = 6
    learning_rate: float = 0.1
    seed: int = 0
    # 1 by default: xgboost's OpenMP threads spin at every barrier, so with another process busy on a core
    # (a board timing kernels on this host) more threads train far slower than one and steal that core
    # from the timing (docs/benchmarks.md, History). 0 = every core, for an otherwise idle machine.
    nthread: int = 1
