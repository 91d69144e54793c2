"""Transfer learning: tuning logs in, a pretrained model (`modelfile`) out; and back: a model file, logs
or the shipped model in, the source a tuning run starts from."""

from __future__ import annotations

import math
import os
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import numpy as np

from xtune.boards.cost import CostUnit
from xtune.errors import InputError, XtuneWarning
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.template import ScheduleTemplate, SumTemplate
from xtune.target import Target, cpu_name, get_target
from xtune.transfer.modelfile import (
    MODEL_FORMAT,
    GroupCount,
    Manifest,
    PretrainedModel,
    is_model_file,
    read_model,
)
from xtune.transfer.options import TrainOptions
from xtune.tuning.costmodel import XGBoostCostModel
from xtune.tuning.database import Record, config_of, read_usable
from xtune.tuning.features import (
    ESTIMATE_COLUMN,
    FEATURES_VERSION,
    estimate_prior,
    feature_names,
    features_op,
    featurize,
    parts_of,
)
from xtune.tuning.measure import MeasureStatus
from xtune.tuning.ranking import cpu_of
from xtune.version import __version__

SourceKind = Literal["model", "builtin", "logs"]  # a model file, the shipped model, logs trained on the fly
BUILTIN = "builtin"  # --transfer-from builtin: the model shipped in xtune/data/models/ for the tuned target


class TransferWarning(XtuneWarning):
    """Log records were left out of training (stale configs, unknown workloads or targets), or a model is
    used on a target it never saw."""


# ---- training -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class OpData:
    """The training rows of one operator: features, min cost per config (+inf = failed), group ids."""

    op: str
    features: np.ndarray
    costs: np.ndarray
    groups: np.ndarray
    counts: tuple[GroupCount, ...]


@dataclass
class _Group:
    template: ScheduleTemplate
    cost_unit: CostUnit
    costs: dict[int, float] = field(default_factory=dict)  # config index -> min cost
    records: int = 0


# (workload key, target name, cost unit, cpu): seconds and instruction counts never mix, and each machine's
# costs are normalized by its own best (a shared corpus holds several machines' "local" boards of one target).
# Every record's unit is its board's, failures included (Measurer.run stamps it; database.logged_unit reads
# it back from older logs), so a failed config joins the group of its board's figures.
GroupKey = tuple[str, str, CostUnit, str]


def _template(key: GroupKey, cache: dict[GroupKey, ScheduleTemplate | None]) -> ScheduleTemplate | None:
    if key not in cache:
        try:
            cache[key] = template_for(parse_workload(key[0]), get_target(key[1]))
        except InputError:
            cache[key] = None  # a workload or target this xtune does not know (another version's log)
    return cache[key]


def _part_of(template: ScheduleTemplate, index: int) -> tuple[str, ScheduleTemplate, int]:
    """The part of a sum (SumTemplate) config `index` is in, that part's template and its index there;
    ("", the template, the index) for any other template."""
    if not isinstance(template, SumTemplate):
        return "", template, index
    part, own, config = template.part(template.space.config(index))
    return part, own, config.index


def _group(records: Sequence[Record]) -> tuple[dict[tuple[GroupKey, str], _Group], Counter[str]]:
    """Records -> per-group min cost per config; board errors, correctness-only boards' records (no
    figure to learn from), stale configs and unknown names skipped."""
    templates: dict[GroupKey, ScheduleTemplate | None] = {}
    valid: dict[tuple[GroupKey, int, tuple[tuple[str, object], ...]], bool] = {}
    groups: dict[tuple[GroupKey, str], _Group] = {}
    skipped: Counter[str] = Counter()
    for r in records:
        if r.result.status is MeasureStatus.BOARD_ERROR:  # says nothing about the config itself
            skipped["board_error"] += 1
            continue
        if r.result.cost_unit is CostUnit.NONE:
            skipped["correctness_only"] += 1
            continue
        key = (r.workload, r.target, r.result.cost_unit, cpu_of(r) or "")
        template = _template(key, templates)
        if template is None:
            skipped["unknown_workload_or_target"] += 1
            continue
        check = (key, r.index, r.knobs)
        if check not in valid:
            valid[check] = config_of(template, r) is not None
        if not valid[check]:  # the template changed since: the index now means another config
            skipped["stale_config"] += 1
            continue
        # A sum's record teaches its part's booster: its config in the part's template, grouped by part.
        part, own, index = _part_of(template, r.index)
        group = groups.setdefault((key, part), _Group(own, key[2]))
        cost = r.cost if math.isfinite(r.cost) and r.cost > 0 else math.inf  # failed/wrong answer: worst
        group.costs[index] = min(cost, group.costs.get(index, math.inf))
        group.records += 1
    return groups, skipped


def collect(records: Sequence[Record]) -> tuple[dict[str, OpData], Counter[str]]:
    """Training rows per operator (each group featurized in one vectorized call), and skip counts."""
    groups, skipped = _group(records)
    parts: dict[str, list[tuple[np.ndarray, np.ndarray, np.ndarray, GroupCount]]] = {}
    in_order = sorted(
        groups.items(), key=lambda item: (*item[0][0][:2], item[0][0][2].value, *item[0][0][3:], item[0][1])
    )
    for number, ((key, _), g) in enumerate(in_order):
        indices = np.fromiter(g.costs, dtype=np.int64, count=len(g.costs))
        costs = np.fromiter(g.costs.values(), dtype=np.float64, count=len(g.costs))
        op = features_op(g.template)
        count = GroupCount(
            op=op,
            workload=key[0],
            target=key[1],
            cost_unit=key[2],
            records=g.records,
            configs=len(indices),
            cpu=key[3],
        )
        features = np.asarray(featurize(g.template, indices), dtype=np.float32)
        parts.setdefault(op, []).append((features, costs, np.full(len(indices), number), count))
    data = {
        op: OpData(
            op,
            np.concatenate([p[0] for p in ps]),
            np.concatenate([p[1] for p in ps]),
            np.concatenate([p[2] for p in ps]),
            tuple(p[3] for p in ps),
        )
        for op, ps in sorted(parts.items())
    }
    return data, skipped


def train(
    records: Sequence[Record],
    options: TrainOptions = TrainOptions(),
    sources: Sequence[str] = (),
    left_out: Counter[str] | None = None,
) -> PretrainedModel:
    """One booster per operator on every usable record (labels: throughput relative to the group's best).

    `left_out` counts the records the log reader already left out (and warned about, with file and line):
    the manifest's skip counts include them."""
    if not records and not left_out:
        raise InputError(f"no log records in {', '.join(sources) or 'the logs'} (are they tuning logs?)")
    data, skipped = collect(records)
    if skipped["stale_config"] or skipped["unknown_workload_or_target"]:
        warnings.warn(
            f"left out {skipped['stale_config']} record(s) whose config no longer matches its "
            f"template and {skipped['unknown_workload_or_target']} of unknown workloads or targets",
            TransferWarning,
            stacklevel=2,
        )
    skipped.update(left_out or Counter())
    if not data:
        why = ", ".join(f"{k} {v}" for k, v in sorted(skipped.items()))
        raise InputError(
            f"no usable records to train on in {', '.join(sources) or 'the logs'} "
            f"({skipped.total()} left out: {why})"
        )
    nthread = options.nthread or os.cpu_count() or 1
    boosters, bases = [], []
    for op, d in data.items():
        prior = estimate_prior(op) if options.on_estimate else None
        model = XGBoostCostModel(
            seed=options.seed,
            objective=options.objective,
            n_trees=options.n_trees,
            max_depth=options.max_depth,
            learning_rate=options.learning_rate,
            max_rows=len(d.costs),
            nthread=nthread,
            base=prior,
            base_halflife=math.inf,
        )
        model.fit(d.features, d.costs, groups=d.groups)
        boosters.append((op, model.to_bytes()))
        if prior is not None:
            bases.append((op, ESTIMATE_COLUMN))
    counts = tuple(c for d in data.values() for c in d.counts)
    manifest = Manifest(
        format=MODEL_FORMAT,
        features_version=FEATURES_VERSION,
        objective=options.objective,
        feature_names=tuple((op, feature_names(op)) for op in data),
        targets=tuple(sorted({c.target for c in counts})),
        groups=counts,
        records_used=sum(c.records for c in counts),
        skipped=tuple(sorted(skipped.items())),
        xtune_version=__version__,
        created=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        sources=tuple(Path(s).name for s in sources),
        base_columns=tuple(bases),
    )
    return PretrainedModel(manifest, tuple(boosters))


def train_from_logs(
    paths: Sequence[str | os.PathLike[str]], options: TrainOptions = TrainOptions()
) -> PretrainedModel:
    for path in paths:
        if not Path(path).is_file():
            raise InputError(f"no log file {path}")
        if is_model_file(path):
            raise InputError(f"{path} is a model file, not a tuning log")
    records, left_out = read_usable(paths)
    return train(records, options, [os.fspath(p) for p in paths], left_out)


# ---- loading ------------------------------------------------------------------------------------------


def builtin_dir() -> Path:
    return Path(str(resources.files("xtune").joinpath("data", "models")))


def builtin_model_path(
    target: Target, op: str, directory: Path | None = None, cpu: str | None = None
) -> Path:
    """The shipped model for `target`'s `op`: one whose manifest lists the target, else one that lists a
    target of the same architecture (its features are relative to the target, so it still ranks); among
    those, one trained on logs of the board's `cpu` first, then one of a cpu of the same name (another
    generation of it), then any (the shipped corpus holds several machines, and cache sizes and port counts
    move the best configs). Models of this xtune's features version come first;
    one of another version is returned (and refused by `read_model` with its reason) only when no other
    fits."""
    directory = builtin_dir() if directory is None else directory
    ranked: list[tuple[int, int, Path]] = []  # (0 lists the target, 1 same arch, +2 stale; cpu_distance)
    for path in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            manifest = read_model(path, check_features=False).manifest
        except InputError:
            continue
        if not set(_boosters_for(op)) <= set(manifest.ops):
            continue
        stale = 2 * (manifest.features_version != FEATURES_VERSION)
        other_cpu = cpu_distance(cpu, {g.cpu for g in manifest.groups})
        if set(target.record_targets) & set(manifest.targets):  # its logs, or its float base's
            ranked.append((stale, other_cpu, path))
        elif any(_arch(t) == target.arch for t in manifest.targets):
            ranked.append((stale + 1, other_cpu, path))
    if ranked:
        return min(ranked)[2]
    raise InputError(
        f"no built-in {op} model for target {target.name} (nor for another {target.arch} "
        "target) ships with this xtune: train one with `xtune model train LOG ... -o MODEL` "
        "and pass --transfer-from MODEL"
    )


def _boosters_for(op: str) -> tuple[str, ...]:
    """The boosters a model needs to score `op`: its own, or those of a sum's parts that have no analytic
    estimate to stand in for a booster (`PretrainedModel.cost_model`; at least one booster)."""
    parts = [part for part, _, _ in parts_of(op)]
    return tuple(p for p in parts if estimate_prior(p) is None) or tuple(parts[:1]) or (op,)


def cpu_distance(cpu: str | None, trained_on: set[str]) -> int:
    """0: the model saw logs of `cpu`; 1: of a cpu of the same name, as "AMD EPYC (family 25, ...)" or a
    name-only "AMD EPYC" of older logs beside "AMD EPYC (family 26, model 2)"; 2: of neither."""
    if cpu in trained_on:
        return 0
    return 1 if cpu and any(cpu_name(c) == cpu_name(cpu) for c in trained_on) else 2


def _arch(target_name: str) -> str | None:
    try:
        return get_target(target_name).arch
    except InputError:
        return None


@dataclass(frozen=True, kw_only=True)
class TransferSource:
    """Where a tuning run's pretrained model came from, for its report."""

    kind: SourceKind
    paths: tuple[str, ...]
    model: PretrainedModel

    def saw(self, target: Target) -> bool:
        """Whether the model was trained on logs of `target` (else it is another hardware's model)."""
        return bool(set(target.record_targets) & set(self.model.manifest.targets))

    def as_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "paths": list(self.paths), "manifest": self.model.manifest.summary()}


def load_source(
    sources: Iterable[str],
    target: Target,
    op: str,
    options: TrainOptions = TrainOptions(),
    cpu: str | None = None,
) -> TransferSource:
    """`builtin` (the shipped model that fits `target` and the board's `cpu` best), one model file, or log
    files (trained on the fly, as `xtune model train` would). A TransferWarning if the model saw no log of
    `target`: what it learned of other hardware can mislead (docs/transfer.md)."""
    source = _load_source(list(sources), target, op, options, cpu)
    if not source.saw(target):
        warnings.warn(
            f"the pretrained model saw no {target.name} logs (only "
            f"{', '.join(source.model.manifest.targets)}); what it learned of other hardware can "
            "rank worse than no model, so the analytic estimate shares its first batches",
            TransferWarning,
            stacklevel=2,
        )
    return source


def _load_source(
    sources: list[str], target: Target, op: str, options: TrainOptions, cpu: str | None
) -> TransferSource:
    if not sources:
        raise InputError("--transfer-from needs a model file, log files or 'builtin'")
    if BUILTIN in sources:
        if len(sources) > 1:
            raise InputError("--transfer-from builtin takes no other sources")
        path = builtin_model_path(target, op, cpu=cpu)
        return TransferSource(kind="builtin", paths=(str(path),), model=read_model(path))
    missing = [s for s in sources if not Path(s).is_file()]
    if missing:
        raise InputError(f"--transfer-from: no such file {missing[0]}")
    models = [s for s in sources if is_model_file(s)]
    if models and len(sources) > 1:
        raise InputError("--transfer-from takes one model file, or log files to train on; not both")
    if models:
        return TransferSource(kind="model", paths=(models[0],), model=read_model(models[0]))
    return TransferSource(kind="logs", paths=tuple(sources), model=train_from_logs(sources, options))
