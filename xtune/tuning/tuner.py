"""Tuners: a ConfigSpace and the results measured so far in, the next batch of config indices to measure
out (random, grid, genetic, and the cost-model tuner). The loop that drives them is `xtune.tuning.loop`."""

from __future__ import annotations

import itertools
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence

import numpy as np

from xtune.errors import InputError
from xtune.schedule.space import ConfigSpace
from xtune.tuning.costmodel import CostModel, XGBoostCostModel
from xtune.tuning.measure import MeasureResult, MeasureStatus
from xtune.tuning.options import TUNERS
from xtune.tuning.search import SpaceArrays, anneal, knob_featurizer, top_unvisited

Featurize = Callable[[Sequence[int]], np.ndarray]  # config indices -> (n, features) float matrix


class Tuner(ABC):
    """Proposes batches of config indices and learns from their results.

    Contract: `next_batch` never returns an index that was already proposed, measured (`update`) or loaded
    (`load_history`), nor one twice; it returns fewer than `n` only when the space runs out. The same seed
    and the same results give the same proposals."""

    def __init__(self, space: ConfigSpace, seed: int = 0) -> None:
        self.space = space
        self.seed = seed
        self.arrays = SpaceArrays(space)
        self.rng = np.random.default_rng(seed)
        self.visited: set[int] = set()  # proposed, measured or loaded
        self.costs: dict[int, float] = {}  # measured index -> cost (+inf = failed); board errors left out
        self._first: list[int] = []  # proposed before anything the tuner chooses itself

    def propose_first(self, indices: Sequence[int]) -> None:
        """Measure these before the tuner's own picks (e.g. the template's default config)."""
        self._first.extend(int(i) for i in indices)

    def next_batch(self, n: int) -> list[int]:
        n = min(n, self.space.size - len(self.visited))
        if n <= 0:
            return []
        head = [i for i in dict.fromkeys(self._first) if i not in self.visited][:n]
        self._first = [i for i in self._first if i not in self.visited and i not in head]
        self.visited.update(head)
        batch = self._propose(n - len(head)) if n > len(head) else []
        if len(set(batch)) != len(batch) or not self.visited.isdisjoint(batch) or len(batch) > n - len(head):
            raise AssertionError(f"{type(self).__name__} broke the contract: repeated proposals")
        self.visited.update(batch)
        return head + batch

    def update(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        """Learn from measured results (in the order of `indices`)."""
        if len(indices) != len(results):
            raise InputError(f"{len(indices)} indices but {len(results)} results")
        for index, result in zip(indices, results, strict=True):
            if not 0 <= index < self.space.size:
                raise InputError(f"config index {index} is outside the space")
            self.visited.add(index)
            # A board error says nothing about the candidate: do not teach the model it is bad.
            if result.status is not MeasureStatus.BOARD_ERROR:
                self.costs[index] = min(result.cost, self.costs.get(index, math.inf))
        self._observe([int(i) for i in indices])

    def load_history(self, indices: Sequence[int], results: Sequence[MeasureResult]) -> None:
        """Resume: learn from results of an earlier run; these indices are never proposed."""
        self.update(indices, results)

    def has_next(self) -> bool:
        return len(self.visited) < self.space.size

    def first_picks(self) -> int:
        """How many configs the next batch holds before the tuner's own choice: those proposed first
        (`propose_first`, e.g. the template's default) and not measured yet. A task scheduler's first
        round measures just these on every task (xtune.tuning.task_scheduler)."""
        return len({i for i in self._first if i not in self.visited})

    @abstractmethod
    def _propose(self, n: int) -> list[int]:
        """`n` distinct indices outside `self.visited` (the space holds at least `n` of them)."""

    def _observe(self, indices: list[int]) -> None:  # noqa: B027 — optional hook, no-op by default
        """Called after `self.costs` took in new results."""

    def _random_unvisited(self, n: int, exclude: Sequence[int] = ()) -> list[int]:
        """`n` uniformly random distinct indices outside `visited` and `exclude`."""
        taken = set(exclude)
        out: list[int] = []
        for _ in range(20):  # rejection sampling; fine until the space is nearly exhausted
            if len(out) >= n:
                return out[:n]
            for i in self.rng.integers(self.space.size, size=2 * (n - len(out)) + 8).tolist():
                if i not in self.visited and i not in taken:
                    taken.add(i)
                    out.append(i)
        rest = [i for i in range(self.space.size) if i not in self.visited and i not in taken]
        picked = self.rng.choice(len(rest), size=min(n - len(out), len(rest)), replace=False)
        return (out + [rest[j] for j in sorted(picked.tolist())])[:n]

    def _best_measured(self, k: int) -> list[int]:
        """Up to `k` measured indices with finite cost, best first."""
        ok = [(c, i) for i, c in self.costs.items() if math.isfinite(c)]
        return [i for _, i in sorted(ok)[:k]]


class RandomTuner(Tuner):
    """Uniform sampling without replacement."""

    def _propose(self, n: int) -> list[int]:
        return self._random_unvisited(n)


class GridTuner(Tuner):
    """Index order 0, 1, 2, ..., skipping anything already measured."""

    def __init__(self, space: ConfigSpace, seed: int = 0) -> None:
        super().__init__(space, seed)
        self._cursor = 0

    def _propose(self, n: int) -> list[int]:
        out: list[int] = []
        while len(out) < n and self._cursor < self.space.size:
            if self._cursor not in self.visited:
                out.append(self._cursor)
            self._cursor += 1
        return out


class GATuner(Tuner):
    """Genetic search: the population is the `pop_size` best measured configs (so elites always survive);
    children are uniform crossovers of two rank-weighted parents with per-knob mutation. The first
    `elite_num` children of each batch have an elite as one parent."""

    def __init__(
        self,
        space: ConfigSpace,
        seed: int = 0,
        pop_size: int = 64,
        elite_num: int = 3,
        mutation_prob: float = 0.1,
    ) -> None:
        super().__init__(space, seed)
        self.pop_size, self.elite_num, self.mutation_prob = pop_size, elite_num, mutation_prob

    def _propose(self, n: int) -> list[int]:
        population = self._best_measured(self.pop_size)
        if len(self.costs) < min(self.pop_size, self.space.size // 2) or len(population) < 2:
            return self._random_unvisited(n)  # the first generation
        digits = self.arrays.digits(np.array(population, dtype=np.int64))
        weights = np.arange(len(population), 0, -1, dtype=np.float64)  # by rank: robust to cost scale
        weights /= weights.sum()
        out: list[int] = []
        taken: set[int] = set()
        for _ in range(30 * n):
            if len(out) == n:
                break
            elite = min(len(out), len(population) - 1)
            a = elite if len(out) < self.elite_num else self.rng.choice(len(population), p=weights)
            b = self.rng.choice(len(population), p=weights)
            child = np.where(self.rng.random(len(self.arrays.radices)) < 0.5, digits[a], digits[b])
            mutate = self.rng.random(len(child)) < self.mutation_prob
            child = np.where(mutate, self.rng.integers(0, self.arrays.radices), child)
            index = int(self.arrays.indices(child[None, :])[0])
            if index not in self.visited and index not in taken:
                taken.add(index)
                out.append(index)
        return out + self._random_unvisited(n - len(out), exclude=out)


class ModelTuner(Tuner):
    """A cost model plus simulated annealing over it (AutoTVM's XGBTuner).

    Until `min_fit` results are in, batches are random — or, with a `pretrained` model, the top of an
    annealing run over that model; with a `hedge` model too, the tops of both, alternating, the hedge's
    first (a model of other hardware shares the first batches with the analytic estimate, which leads: a
    wrong model then costs every other trial, never the first, nor the whole batch). Afterwards the model
    is refitted on all results before each batch and the batch is the best unvisited configs the
    annealing chains scored, except an `epsilon` share drawn at random (exploration, so a wrong model
    cannot trap the search). With a hedge, those first batches are a trial of the two: the local model's
    base is the one whose own picks measured fastest (the pretrained one on a tie), so a model of other
    hardware that misleads on this board stops steering the search.

    Whatever the prior, the first batch holds the seed configs `seeds` (the template's default; a sum's
    every algorithm's, `ops.template.seed_configs`) and, with an `estimate` that is not already one of
    the priors, the estimate's own top pick: a model of another machine can rank every config it picks
    far below the default (38 % of the default's speed for a held-out stride-2 layer's first 8 trials,
    docs/benchmarks.md), so a warm start then starts no lower than these."""

    def __init__(
        self,
        space: ConfigSpace,
        featurize: Featurize,
        model: CostModel,
        seed: int = 0,
        pretrained: CostModel | None = None,
        hedge: CostModel | None = None,
        n_chains: int = 256,
        n_steps: int = 64,
        epsilon: float = 0.1,
        min_fit: int = 16,
        seeds: Sequence[int] = (),
        estimate: CostModel | None = None,
    ) -> None:
        super().__init__(space, seed)
        self.seeds, self.estimate = [int(i) for i in seeds], estimate
        self._seeded = False  # the seeds went into a batch (or were already measured)
        self.featurize, self.model, self.pretrained, self.hedge = featurize, model, pretrained, hedge
        self.n_chains, self.n_steps, self.epsilon, self.min_fit = n_chains, n_steps, epsilon, min_fit
        self._rows: list[np.ndarray] = []  # feature rows of `_data`, cached: featurize may be costly
        self._data: list[int] = []  # measured indices in fit order
        self._in_data: set[int] = set()
        self._fitted_on = 0  # len(_data) at the last fit
        self._chain_ends = np.zeros(0, dtype=np.int64)  # where the last annealing run stopped
        self._prior_picks: tuple[set[int], set[int]] = (set(), set())  # first batches: pretrained's, hedge's
        self.last_fit_seconds = 0.0
        self.last_search_seconds = 0.0

    def _observe(self, indices: list[int]) -> None:
        new = [i for i in dict.fromkeys(indices) if i in self.costs and i not in self._in_data]
        if new:
            self._data.extend(new)
            self._in_data.update(new)
            self._rows.append(np.asarray(self.featurize(new), dtype=np.float32))

    def _annealed_top(self, scorer: CostModel, n: int) -> list[int]:
        """The `n` best unvisited configs an annealing run over `scorer` found."""

        def score(indices: np.ndarray) -> np.ndarray:
            return np.asarray(scorer.predict(self.featurize(indices.tolist())), dtype=np.float64)

        candidates, scores, self._chain_ends = anneal(
            self.arrays, score, self._starts(), self.n_steps, self.rng
        )
        return top_unvisited(candidates, scores, n, self.visited)

    def _fit(self) -> None:
        costs = np.array([self.costs[i] for i in self._data], dtype=np.float64)
        fresh = len(self._data) != self._fitted_on
        if len(self._data) < self.min_fit or not fresh or not np.isfinite(costs).any():
            return
        start = time.perf_counter()
        self._choose_base()
        self.model.fit(np.concatenate(self._rows), costs)
        self._fitted_on = len(self._data)
        self.last_fit_seconds = time.perf_counter() - start

    def _choose_base(self) -> None:
        """With a hedge: the local model's base is the prior whose first-batch picks measured fastest.

        The best pick, not how well each orders all that was measured: the search exploits the top of the
        base's order, and a rank correlation weighs the bottom as much: choosing by Spearman's rho left a
        model of SSE4.2 logs in charge of AVX2 runs, which then needed more trials (docs/benchmarks.md,
        History)."""
        if self.hedge is None or self.pretrained is None or not isinstance(self.model, XGBoostCostModel):
            return
        best = [
            min((self.costs[i] for i in picks if i in self.costs), default=math.inf)
            for picks in self._prior_picks
        ]
        self.model.base = self.hedge if best[1] < best[0] else self.pretrained

    def _seed_picks(self, n: int) -> list[int]:
        """Once, in the first batch: the unvisited seeds and the estimate's top pick (at most `n`). The
        estimate's pick is named even when the estimate also ranks the rest of the batch (it is the
        prior): a batch of just the seeds (`first_picks`) holds it then too, not an exploration pick."""
        if self._seeded:
            return []
        self._seeded = True
        head = [i for i in dict.fromkeys(self.seeds) if i not in self.visited]
        if self.estimate is not None:
            head += [i for i in self._annealed_top(self.estimate, 1) if i not in head]
        return head[:n]

    def first_picks(self) -> int:
        """The proposed-first configs, then, before the first fit, the seeds and the estimate's top
        pick (`_seed_picks`; counted as one more config even if it turns out to be a seed config)."""
        first = {i for i in self._first if i not in self.visited}
        if self._seeded or self._fitted_on:
            return len(first)
        head = first | {i for i in self.seeds if i not in self.visited}
        return len(head) + (self.estimate is not None)

    def _propose(self, n: int) -> list[int]:
        self._fit()
        head = [] if self._fitted_on else self._seed_picks(n)
        self.visited.update(head)  # the priors' picks below are other configs
        try:
            return head + self._propose_more(n - len(head))
        finally:
            self.visited.difference_update(head)  # next_batch adds the whole batch itself

    def _propose_more(self, n: int) -> list[int]:
        if n <= 0:
            return []
        if not self._fitted_on and self.pretrained is None:
            return self._random_unvisited(n)
        start = time.perf_counter()
        n_explore = int(self.epsilon * n + self.rng.random())  # epsilon * n on average
        if self._fitted_on:
            picks = self._annealed_top(self.model, n - n_explore)
        else:
            assert self.pretrained is not None
            scorers = [self.pretrained] + ([self.hedge] if self.hedge is not None else [])
            tops = [self._annealed_top(scorer, n - n_explore) for scorer in scorers]
            # The hedge leads the pairs: a model from other hardware can pick far worse first than the
            # analytic estimate does (docs/benchmarks.md, History).
            pairs = itertools.zip_longest(*reversed(tops))
            alternating = (i for row in pairs for i in row if i is not None)
            picks = list(dict.fromkeys(alternating))[: n - n_explore]
            for top, picked in zip(tops, self._prior_picks, strict=False):
                picked.update(set(top).intersection(picks))
        picks += self._random_unvisited(n - len(picks), exclude=picks)
        self.last_search_seconds = time.perf_counter() - start
        return picks

    def _starts(self) -> np.ndarray:
        """Chains start from the best measured configs, where the last run ended, and random points."""
        best = np.array(self._best_measured(self.n_chains // 4), dtype=np.int64)
        ends = self._chain_ends[: self.n_chains // 2]
        n_random = self.n_chains - len(best) - len(ends)
        random = self.rng.integers(self.space.size, size=n_random)
        return np.concatenate([best, ends, random]).astype(np.int64)


def make_tuner(
    name: str,
    space: ConfigSpace,
    seed: int = 0,
    featurize: Featurize | None = None,
    pretrained: CostModel | None = None,
    model: CostModel | None = None,
    hedge: CostModel | None = None,
    seeds: Sequence[int] = (),
    estimate: CostModel | None = None,
) -> Tuner:
    """The tuner called `name` ("xgb", "ga", "random", "grid"). For "xgb", `featurize` defaults to the
    knob values and `model` to an XGBoostCostModel whose base is `pretrained` (transfer); `seeds` and
    the `estimate`'s top pick join its first batch (ModelTuner)."""
    if name == "random":
        return RandomTuner(space, seed)
    if name == "grid":
        return GridTuner(space, seed)
    if name == "ga":
        return GATuner(space, seed)
    if name == "xgb":
        model = model or XGBoostCostModel(seed=seed, base=pretrained)
        return ModelTuner(
            space,
            featurize or knob_featurizer(space),
            model,
            seed,
            pretrained=pretrained,
            hedge=hedge,
            seeds=seeds,
            estimate=estimate,
        )
    raise InputError(f"unknown tuner '{name}' (known: {', '.join(TUNERS)})")
