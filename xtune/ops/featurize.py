"""The featurize machinery the families share: a family's `FeatureSet` (its booster name, columns and
the function that computes them from a template and config indices), the vectorized knob lookups those
functions use, and the columns (with their names) that several families' sets share. Features are
computed analytically from each config's resolved loop structure (block sizes, register tile, packing,
order) rather than by building the nest, so that simulated annealing can score thousands of configs per
batch; what a config resolves to is the template's rule, called on arrays, never restated."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache

import numpy as np

from xtune.ops.conv import ConvShape
from xtune.ops.template import ScheduleTemplate
from xtune.ops.tiles import parse_tile
from xtune.schedule.space import ConfigSpace, KnobValue
from xtune.target import Target

Indices = Sequence[int] | np.ndarray


@dataclass(frozen=True, kw_only=True)
class FeatureSet:
    """One set of features: `name` keys its cost models (a model file's boosters, a log's tuner), so it
    never changes once models are trained on it; `columns` name the matrix's columns."""

    name: str
    columns: tuple[str, ...]
    compute: Callable[[ScheduleTemplate, Indices], np.ndarray]
    # A sum of templates' set (SumTemplate): column 0 the part number, then each part's own set as a block
    # (its name, first column, end column). A pretrained model of the parts scores the sum (transfer).
    parts: tuple[tuple[str, int, int], ...] = ()


@cache
def _knob_tables(space: ConfigSpace) -> dict[str, tuple[int, np.ndarray]]:
    """Each knob's digit column and its options as an array, built once per space."""
    return {k.name: (col, np.asarray(k.options, dtype=object)) for col, k in enumerate(space.knobs)}


@cache
def _tile_table(options: tuple[KnobValue, ...]) -> np.ndarray:
    """(rows, vectors) of every "MRxNV" tile option: parsed once, not once per config."""
    return np.array([parse_tile(str(o)) for o in options], dtype=np.float64).reshape(-1, 2)


class Configs:
    """Knob values of many configs at once: one table lookup per knob (SA featurizes every step)."""

    def __init__(self, template: ScheduleTemplate, indices: Sequence[int] | np.ndarray):
        self.digits = template.space.digits(np.asarray(indices, dtype=np.int64))
        self.tables = _knob_tables(template.space)

    def values(self, name: str) -> np.ndarray:
        col, table = self.tables[name]
        return table[self.digits[:, col]]

    def ints(self, name: str) -> np.ndarray:
        return self.values(name).astype(np.float64)

    def flag(self, name: str, value: KnobValue) -> np.ndarray:
        return (self.values(name) == value).astype(np.float64)

    def lmul(self) -> np.ndarray:
        """The lmul knob of every config (`tiles.lmul_knobs`), 1 where the space has none."""
        return self.ints("lmul") if "lmul" in self.tables else np.ones(len(self.digits))

    def tiles(self) -> tuple[np.ndarray, np.ndarray]:
        col, table = self.tables["tile"]
        picked = _tile_table(tuple(table))[self.digits[:, col]]
        return picked[:, 0], picked[:, 1]


def target_sizes(t: Target) -> tuple[float, float, float, float]:
    """fp32 lanes, vector registers, L1d and L2 bytes: the denominators of the relative features."""
    return float(t.fp32_lanes), float(t.vector_registers), float(t.l1d_bytes), float(t.l2_bytes)


def log2(x: np.ndarray) -> np.ndarray:
    return np.log2(np.maximum(x.astype(np.float64), 1e-9))


# ---- columns several families' sets share, each with its names ----------------------------------------

# The convolution window's columns conv2d's and depthwise's sets share, in this order.
WINDOW_FEATURES = ("log2_k", "log2_oh", "log2_ow", "log2_rs", "stride", "dilation")


def window_columns(sh: ConvShape, one: np.ndarray) -> list[np.ndarray]:
    """`WINDOW_FEATURES` of `sh`, one row per config (`one`: a one per config): log2 of the output
    channels, rows and columns and of the window's taps, then stride and dilation."""
    return [
        one * np.log2(sh.k),
        one * np.log2(sh.oh),
        one * np.log2(sh.ow),
        one * np.log2(sh.r * sh.s),
        one * sh.stride,
        one * sh.dilation,
    ]


def tile_features(rows: str) -> tuple[str, ...]:
    """The names of `tile_columns`, the tile's rows named `rows` ("mr" in a GEMM, "p" pixels in a conv)."""
    return ("acc_regs_frac", "regs_used_frac", "fma_per_load", rows, "nv")


def tile_columns(
    rows: np.ndarray, nv: np.ndarray, regs: float, used: np.ndarray, per_load: np.ndarray
) -> list[np.ndarray]:
    """A rows x nv-vector register tile's columns (`tile_features`): accumulators and all the registers
    it holds (`used`) as shares of the target's `regs`, its FMAs per loaded value, rows and nv."""
    return [rows * nv / regs, used / regs, per_load, rows, nv]


def waste(extent: float | np.ndarray, step: np.ndarray) -> np.ndarray:
    """The share of work past `extent` when whole steps of `step` cover it (0: none)."""
    return np.ceil(extent / step) * step / extent - 1
