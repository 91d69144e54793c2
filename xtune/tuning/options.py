"""What a tuning run is asked to do (`TuneOptions`, `MeasureOptions`, the tuner names): the CLI,
`tune_workload`, the measurer, the tuners, the session and the task scheduler all read it, so it sits below
every one of them and imports none of their libraries (the command line's parser reads its defaults:
`xtune --help` loads no xgboost, scipy or paramiko)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, get_args

from xtune.boards.cost import CostUnit
from xtune.errors import InputError
from xtune.ops.workload import RTOL

TunerName = Literal["xgb", "ga", "random", "grid"]
TUNERS: tuple[TunerName, ...] = get_args(TunerName)

# How many timings a confirmed best's median is over (`TuneOptions.confirm`, session.py's confirmation).
CONFIRM_TIMINGS = 3


@dataclass(frozen=True, kw_only=True)
class MeasureOptions:
    """How a board times a candidate; written into the log with every result."""

    number: int = 1  # calls per repeat (raised by the agent until a repeat lasts min_repeat_ms)
    repeat: int = 3
    min_repeat_ms: float = 10.0
    warmup: int = 1
    timeout_ms: int = 10_000
    flush_cache: bool = False
    # Each timed call with the kernel's constants (weights, bias: `TensorSpec.constant`) evicted from every
    # cache level first, one call per repeat: how a layer of a network whose weights outgrow the caches
    # finds them (docs/design.md, "Measurement"). Off, a kernel timed alone keeps its weights in L2/L3
    # between calls, and the tuner ranks by a latency the network does not see.
    cold_weights: bool = False
    rtol: float = RTOL

    def unit_on(self, board_unit: CostUnit) -> CostUnit:
        """What a board of `board_unit` measures under these options (the unit its results are stamped
        with): cold weights make a wall time COLD_SECONDS; a board that counts or only checks has no
        cache state to set up, and is refused rather than quietly measured warm."""
        if not self.cold_weights:
            return board_unit
        if board_unit is not CostUnit.SECONDS:
            raise InputError(
                f"--cold-weights times calls with the weights out of the caches: it needs a timing board, "
                f"not one that measures {board_unit.describe}"
            )
        return CostUnit.COLD_SECONDS


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    """Everything a tuning run was asked to do; written into the report and (measure part) the log."""

    tuner: TunerName = "xgb"
    trials: int = 64
    batch_size: int = 16
    early_stopping: int | None = None
    seed: int = 0
    measure: MeasureOptions = field(default_factory=MeasureOptions)
    # Measure the template's heuristic default first, so a tuned result is never worse than it.
    # Benchmarks of search efficiency turn it off to compare tuners on their own picks.
    start_from_default: bool = True
    # With no pretrained model, the xgb tuner ranks its first batch by the analytic estimate (features.py)
    # and keeps it as a fading base; False makes it start blind (random first batch), as AutoTVM did.
    analytic_prior: bool = True
    # At the end of a run the `confirm` fastest configs are timed again until each has CONFIRM_TIMINGS
    # timings, and the best is the config with the lowest median (ranking.best): on a noisy host the
    # fastest of a run's single timings is mostly the luckiest (docs/benchmarks.md, "winner's curse"),
    # and `xtune build` should ship the fastest kernel, not the best-timed one. 0 skips it.
    confirm: int = 3
