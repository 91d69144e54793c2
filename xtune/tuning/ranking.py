"""Ranking a log's records: `Record`s in; the configs to resume, the ranking unit and the best configs out.

The best of a workload on a target is each config's median timing (`best`, `leaders`), never a config
that once gave a wrong answer or crashed; `build_choice` is the record `xtune build` compiles."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from xtune.boards.cost import RANKING_UNITS, CostUnit
from xtune.tuning.database import Knobs, Record
from xtune.tuning.measure import MeasureStatus

# A kernel that once computed a wrong answer or died by a signal has a bug that some run may hit again.
DISQUALIFYING = frozenset({MeasureStatus.WRONG_ANSWER, MeasureStatus.RUNTIME_ERROR})


def build_choice(records: Iterable[Record], workload: str, target: str) -> Record | None:
    """The record `xtune build` compiles and `xtune best` shows for `workload` on `target`: the best
    (`best`) in the records' `ranking_unit` (wall time, else instruction counts; never a correctness-only
    board's), or None. The log reader has already left out records that no longer match their template."""
    top = best(records, workload, target, k=1)
    return top[0] if top else None


def cpu_of(record: Record) -> str | None:
    """The cpu its board reported when the record was measured (None in records without a fingerprint)."""
    return dict(record.fingerprint).get("cpu")


def of_machine(
    records: Iterable[Record], workload: str, target: str, board: str | None = None, cpu: str | None = None
) -> list[Record]:
    """The records of `workload` on `target` (and `board`, if given). With `cpu`, records measured on
    another cpu do not count (a shared log or corpus holds several machines' "local" boards, and one
    machine's costs say little about another's); records without a fingerprint are taken as this cpu's."""
    return [
        r
        for r in records
        if r.workload == workload
        and r.target == target
        and (board is None or r.board == board)
        and (cpu is None or cpu_of(r) in (None, cpu))
    ]


def measured(
    records: Iterable[Record], workload: str, target: str, board: str | None = None, cpu: str | None = None
) -> dict[int, Record]:
    """Config index -> its latest record (of `cpu`, see `of_machine`), for resume. Board errors do not
    count: the candidate was never really measured, so a resumed run measures it again."""
    return {
        r.index: r
        for r in of_machine(records, workload, target, board, cpu)
        if r.result.status is not MeasureStatus.BOARD_ERROR
    }


def unmeasured(
    records: Iterable[Record], workload: str, target: str, board: str | None = None, cpu: str | None = None
) -> list[int]:
    """Configs that have board-error records and nothing else (of `cpu`, see `of_machine`), in the order
    they were first tried: an earlier run chose them, but never measured them. `measured` leaves them out."""
    mine = of_machine(records, workload, target, board, cpu)
    done = measured(mine, workload, target)
    return list(dict.fromkeys(r.index for r in mine if r.index not in done))


def ranking_unit(records: Iterable[Record]) -> CostUnit | None:
    """The unit whose figures decide among `records` (of one workload and target): real seconds beat
    instruction counts beat nothing (cost.RANKING_UNITS). Only a figure of a config that could be a best
    counts: a failed record's unit decides nothing, a correctness-only board has no figure, and a config
    that ever gave a wrong answer or crashed is out. None if no config has a figure."""
    return _preferred(_figures(records))


def _preferred(figures: Mapping[CostUnit, object]) -> CostUnit | None:
    return next((unit for unit in RANKING_UNITS if unit in figures), None)


def _figures(records: Iterable[Record]) -> dict[CostUnit, dict[tuple[int, Knobs], list[Record]]]:
    """Unit -> config -> its OK records with a figure in that unit; disqualified configs left out."""
    figures: dict[CostUnit, dict[tuple[int, Knobs], list[Record]]] = {}
    disqualified: set[tuple[int, Knobs]] = set()
    for r in records:
        if r.result.status in DISQUALIFYING:
            disqualified.add((r.index, r.knobs))
        elif r.result.ok and math.isfinite(r.cost) and r.cost > 0:
            figures.setdefault(r.result.cost_unit, {}).setdefault((r.index, r.knobs), []).append(r)
    for configs in figures.values():
        for config in disqualified & configs.keys():
            del configs[config]
    return {unit: configs for unit, configs in figures.items() if configs}


def best(
    records: Iterable[Record],
    workload: str,
    target: str,
    k: int = 1,
    cost_unit: CostUnit | None = None,
    board: str | None = None,
) -> list[Record]:
    """The `k` distinct configs with the lowest cost among OK records in `cost_unit` (by default the
    `ranking_unit` of the records of `workload` on `target`), best first; figures of other units are
    never compared with these.

    A config measured several times (`xtune tune` times its leaders again at the end of a run, see
    `TuneOptions.confirm`) is represented by its median record, the faster of the middle two for an even
    count: the fastest of hundreds of noisy timings is the luckiest one, not the config's speed (the
    winner's curse, docs/benchmarks.md). A config that ever gave a wrong answer or crashed is never a best,
    whatever its other records say (a correctness-only board's records count for that). Ties go to the
    earlier record, then to the lower index, so the answer does not depend on file order."""
    return [leader.record for leader in leaders(records, workload, target, k, cost_unit, board)]


@dataclass(frozen=True, kw_only=True)
class Leader:
    """A config's median record among its timings, and how many timings that median is over."""

    record: Record
    timings: int

    @property
    def cost(self) -> float:
        return self.record.cost

    @property
    def index(self) -> int:
        return self.record.index


def leaders(
    records: Iterable[Record],
    workload: str,
    target: str,
    k: int = 1,
    cost_unit: CostUnit | None = None,
    board: str | None = None,
) -> list[Leader]:
    """`best`, each with the count of timings its median record is the median of.

    A config is an index with its knobs: a changed template renumbers, and one version's wrong answer
    says nothing about another config that now has its index."""
    figures = _figures(of_machine(records, workload, target, board))
    unit = _preferred(figures) if cost_unit is None else cost_unit
    timings = figures.get(unit, {}) if unit is not None else {}
    medians = [Leader(record=_median_record(rs), timings=len(rs)) for rs in timings.values()]
    return sorted(medians, key=lambda leader: _rank(leader.record))[: max(k, 0)]


def _median_record(records: list[Record]) -> Record:
    ranked = sorted(records, key=_rank)
    return ranked[(len(ranked) - 1) // 2]


def _rank(r: Record) -> tuple[float, float, int]:
    return (r.cost, r.time, r.index)
