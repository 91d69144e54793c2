"""What a board measures: one `CostUnit`, declared by the board, stamped on every result, read everywhere.

The values are the log's spelling of `cost_unit` ("s" and "insn" since format 1; "none" added for boards
that check correctness only; "cycles" for the llvm-mca estimate), so logs written before the enum read
unchanged."""

from __future__ import annotations

import math
from enum import Enum


class CostUnit(Enum):
    SECONDS = "s"  # wall time per call on real hardware
    # Wall time per call with the kernel's constants evicted from every cache level before each call
    # (`MeasureOptions.cold_weights`): a layer of a network whose weights outgrow the caches. Not the
    # same figure as SECONDS, so the two are never ranked together.
    COLD_SECONDS = "s-cold"
    INSTRUCTIONS = "insn"  # instructions per call under qemu's insncount plugin (docs/emulated-costs.md)
    # Estimated core cycles per call: the plugin's per-block counts times llvm-mca's cycles per block
    # under the target's scheduling model (docs/emulated-costs.md, "The cycle model").
    CYCLES = "cycles"
    # Correctness only: the board checks outputs but gives no figure. Emulated wall time is no speed
    # signal (qemu-user's translation cost and its host inverted rankings, docs/emulated-costs.md).
    NONE = "none"

    @property
    def describe(self) -> str:
        """What a board of this unit is good for, as `xtune boards` lists it."""
        return _DESCRIBE[self]

    @property
    def noun(self) -> str:
        """How a count in this unit reads in a sentence: "1234 instructions", "5678 cycles"."""
        return _NOUN[self]


_DESCRIBE = {
    CostUnit.SECONDS: "wall time",
    CostUnit.COLD_SECONDS: "wall time, weights evicted",
    CostUnit.INSTRUCTIONS: "instructions (emulated)",
    CostUnit.CYCLES: "cycles (emulated, llvm-mca model)",
    CostUnit.NONE: "correctness only (emulated)",
}

_NOUN = {
    CostUnit.SECONDS: "seconds",
    CostUnit.COLD_SECONDS: "seconds",
    CostUnit.INSTRUCTIONS: "instructions",
    CostUnit.CYCLES: "cycles",
    CostUnit.NONE: "",
}

# Which figures decide when records of one workload and target come in several units: real seconds beat
# cycle estimates (a pipeline model) beat instruction counts beat nothing. Figures of two units are never
# compared with each other.
# Cold-weight timings were asked for by name (the option is off by default), so they lead.
RANKING_UNITS = (CostUnit.COLD_SECONDS, CostUnit.SECONDS, CostUnit.CYCLES, CostUnit.INSTRUCTIONS)
# The units that are a wall time: a speed (GFLOP/s), timed repeats worth confirming.
WALL_UNITS = frozenset({CostUnit.SECONDS, CostUnit.COLD_SECONDS})
# The units an emulated board counts in one exactly reproducible run (no timed repeats follow).
COUNTED_UNITS = frozenset({CostUnit.INSTRUCTIONS, CostUnit.CYCLES})


def gflops(flops: float, cost: float, unit: CostUnit) -> float | None:
    """GFLOP/s of a call costing `cost` in `unit`; None unless that is a wall time (a count is no speed)."""
    if unit not in WALL_UNITS or not math.isfinite(cost) or cost <= 0:
        return None
    return flops / cost / 1e9
