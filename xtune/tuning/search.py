"""Vectorized search over a ConfigSpace: index arrays in, digit matrices, knob features and annealed
(index, score) candidates out; the model-based tuner's optimizer."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from xtune.errors import InputError
from xtune.schedule.space import ConfigSpace, SumSpace

Scorer = Callable[[np.ndarray], np.ndarray]  # config indices (int64) -> scores, higher = better


class SpaceArrays:
    """A space's mixed-radix arithmetic (ConfigSpace.digits/indices/with_digit) for the annealer: int64
    arrays only (so spaces must stay below 2**62 configs), and random one-knob moves."""

    def __init__(self, space: ConfigSpace) -> None:
        if space.size >= 2**62:
            raise InputError(f"config space of {space.size} configs is too large for vectorized search")
        self.space = space
        self.size = space.size
        self.radices, self.strides = space.radices, space.strides
        # Moves only make sense on knobs with a choice; a space of one config has none.
        self.movable = np.flatnonzero(self.radices > 1)
        # A sum moves within the part an index is in, or to another part (`random_moves`).
        self.parts = [SpaceArrays(part) for _, part in space.parts] if isinstance(space, SumSpace) else []

    def digits(self, indices: np.ndarray) -> np.ndarray:
        """(n,) indices -> (n, knobs) option numbers."""
        return self.space.digits(indices)

    def indices(self, digits: np.ndarray) -> np.ndarray:
        """(n, knobs) option numbers -> (n,) indices."""
        return self.space.indices(digits)

    def random_moves(self, indices: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Each index with one random knob set to a different random option (a `space.neighbour` step).
        In a sum, the knob is one of its part's or the tag: a new part is entered at a random config (its
        digits have no counterpart in the old part's)."""
        if self.parts:
            return self._sum_moves(np.asarray(indices, dtype=np.int64), rng)
        if len(self.movable) == 0:
            return indices.copy()
        knob = self.movable[rng.integers(len(self.movable), size=len(indices))]
        radix = self.radices[knob]
        old = self.space.digits(indices)[np.arange(len(indices)), knob]
        new = (old + rng.integers(1, radix)) % radix  # never the same option
        return self.space.with_digit(indices, knob, new)

    def _sum_moves(self, indices: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        space = self.space
        assert isinstance(space, SumSpace)
        part, local = space.split(indices)
        sizes = np.array([p.size for p in self.parts], dtype=np.int64)
        out = indices.copy()
        for p, arrays in enumerate(self.parts):
            mine = np.flatnonzero(part == p)
            if len(mine) == 0:
                continue
            moved = space.offsets[p] + arrays.random_moves(local[mine], rng)
            # The tag is one more movable knob of the part: switch with the share one knob gets.
            switch = rng.random(len(mine)) * (len(arrays.movable) + 1) < 1.0
            other = rng.integers(len(sizes) - 1, size=len(mine))
            other += other >= p
            jump = space.offsets[other] + (rng.random(len(mine)) * sizes[other]).astype(np.int64)
            out[mine] = np.where(switch, jump, moved)
        return out


def knob_featurizer(space: ConfigSpace) -> Callable[[Sequence[int]], np.ndarray]:
    """A plain featurizer: per knob, its integer option value (tile sizes, unroll factors) or, for named
    choices, the option number. Enough for trees; the real featurizer adds target-relative features."""
    arrays = SpaceArrays(space)
    tables = [
        np.array([float(o) if isinstance(o, int) else float(d) for d, o in enumerate(k.options)])
        for k in space.knobs
    ]

    def featurize(indices: Sequence[int]) -> np.ndarray:
        digits = arrays.digits(np.asarray(indices, dtype=np.int64).reshape(-1))
        out = np.empty(digits.shape, dtype=np.float32)
        for j, table in enumerate(tables):
            out[:, j] = table[digits[:, j]]
        return out

    return featurize


def anneal(
    arrays: SpaceArrays,
    score: Scorer,
    starts: np.ndarray,
    n_steps: int,
    rng: np.random.Generator,
    temperature: float = 1.0,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Parallel simulated annealing, one chain per start, maximizing `score`.

    Returns (candidates, their scores) — every distinct point any chain scored, for the caller to filter
    (measured, already proposed) and take the top of — and the chains' end points, to seed the next call.
    The temperature falls linearly to 0 and is scaled by the spread of the starting scores, so it does not
    depend on the model's units (a ranking margin or a throughput)."""
    current = np.asarray(starts, dtype=np.int64)
    current_score = score(current)
    scale = float(np.std(current_score)) or 1.0
    seen_idx, seen_score = [current], [current_score]
    for step in range(n_steps):
        t = temperature * scale * (1.0 - step / n_steps)
        proposal = arrays.random_moves(current, rng)
        proposal_score = score(proposal)
        gain = proposal_score - current_score
        with np.errstate(over="ignore", divide="ignore"):
            accept = (gain >= 0) | (rng.random(len(current)) < np.exp(gain / max(t, 1e-12)))
        current = np.where(accept, proposal, current)
        current_score = np.where(accept, proposal_score, current_score)
        seen_idx.append(proposal)
        seen_score.append(proposal_score)
    idx, first = np.unique(np.concatenate(seen_idx), return_index=True)
    return idx, np.concatenate(seen_score)[first], current


def top_unvisited(candidates: np.ndarray, scores: np.ndarray, n: int, visited: set[int]) -> list[int]:
    """The `n` best-scored candidates not in `visited` (ties to the lower index: deterministic)."""
    out: list[int] = []
    if n <= 0:
        return out
    order = np.lexsort((candidates, -scores))
    for i in candidates[order].tolist():
        if i not in visited:
            out.append(i)
            if len(out) == n:
                break
    return out
