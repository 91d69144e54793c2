"""The model file: a manifest of what a pretrained model was trained on, and one serialized booster per
operator; written by `xtune model train`, read by `--transfer-from` and `xtune model info`."""

from __future__ import annotations

import base64
import binascii
import json
import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, get_args

from xtune.boards.cost import CostUnit
from xtune.errors import InputError
from xtune.files import write_atomic
from xtune.transfer.options import Objective
from xtune.tuning.costmodel import CostModel, XGBoostCostModel
from xtune.tuning.features import (
    FEATURES_VERSION,
    EstimatePrior,
    PartsModel,
    estimate_prior,
    feature_names,
    parts_of,
)

MODEL_FORMAT = 1
_MODEL_HEAD = re.compile(rb'^\s*\{\s*"manifest"\s*:')  # a log line starts {"v": ...


@dataclass(frozen=True, kw_only=True)
class GroupCount:
    """What one (workload, target, cost unit, cpu) of the logs contributed to its operator's booster."""

    op: str
    workload: str
    target: str
    cost_unit: CostUnit
    records: int  # log records used (repeats of a config included)
    configs: int  # distinct configs = training rows
    cpu: str = ""  # the cpu the board reported (fingerprint); "" in logs without one


@dataclass(frozen=True, kw_only=True)
class Manifest:
    """What a model file was trained on; `xtune model info` prints it."""

    format: int
    features_version: int
    objective: Objective
    feature_names: tuple[tuple[str, tuple[str, ...]], ...]  # op -> the columns its booster expects
    targets: tuple[str, ...]
    groups: tuple[GroupCount, ...]
    records_used: int
    skipped: tuple[tuple[str, int], ...]  # reason -> records left out
    xtune_version: str
    created: str  # UTC, ISO 8601
    sources: tuple[str, ...]  # log file names (base names: paths are private and differ per machine)
    # op -> the feature column its booster was boosted from (its base margin); ops not listed have none.
    base_columns: tuple[tuple[str, str], ...] = ()

    @property
    def ops(self) -> tuple[str, ...]:
        return tuple(op for op, _ in self.feature_names)

    @property
    def records_skipped(self) -> int:
        return sum(n for _, n in self.skipped)

    def version_mismatch(self) -> str:
        return (
            f"trained with features version {self.features_version}, this xtune computes "
            f"{FEATURES_VERSION}: retrain it with `xtune model train`"
        )

    def unusable_reason(self) -> str | None:
        """Why this xtune cannot tune with the model (its features mean other things), or None."""
        if self.features_version != FEATURES_VERSION:
            return self.version_mismatch()
        for op, names in self.feature_names:
            try:
                current = feature_names(op)
            except KeyError:
                continue  # an operator this xtune does not tune; the others may still be used
            if names != current:
                return (
                    f"its {op} feature columns differ from this xtune's: retrain it with `xtune model train`"
                )
        return None

    def as_dict(self) -> dict[str, Any]:
        workloads: dict[str, list[dict[str, Any]]] = {op: [] for op in self.ops}
        for g in self.groups:
            row = {k: v for k, v in asdict(g).items() if k != "op"}
            workloads[g.op].append({**row, "cost_unit": g.cost_unit.value})
        return {
            "format": self.format,
            "features_version": self.features_version,
            "objective": self.objective,
            "feature_names": {op: list(names) for op, names in self.feature_names},
            "targets": list(self.targets),
            "workloads": workloads,
            "records_used": self.records_used,
            "records_skipped": self.records_skipped,
            "skipped": dict(self.skipped),
            "xtune_version": self.xtune_version,
            "created": self.created,
            "sources": list(self.sources),
            "base_columns": dict(self.base_columns),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        groups = tuple(
            GroupCount(
                op=op,
                workload=str(g["workload"]),
                target=str(g["target"]),
                cost_unit=CostUnit(g["cost_unit"]),
                records=int(g["records"]),
                configs=int(g["configs"]),
                cpu=str(g.get("cpu", "")),
            )
            for op, rows in d["workloads"].items()
            for g in rows
        )
        return cls(
            format=int(d["format"]),
            features_version=int(d["features_version"]),
            objective=objective(d["objective"]),
            feature_names=tuple(
                (str(op), tuple(map(str, names))) for op, names in d["feature_names"].items()
            ),
            targets=tuple(map(str, d["targets"])),
            groups=groups,
            records_used=int(d["records_used"]),
            skipped=tuple((str(k), int(v)) for k, v in d.get("skipped", {}).items()),
            xtune_version=str(d["xtune_version"]),
            created=str(d["created"]),
            sources=tuple(map(str, d["sources"])),
            base_columns=tuple((str(op), str(col)) for op, col in d.get("base_columns", {}).items()),
        )

    def summary(self) -> dict[str, Any]:
        """The short form a tuning report carries."""
        return {
            "features_version": self.features_version,
            "objective": self.objective,
            "ops": list(self.ops),
            "targets": list(self.targets),
            "records": self.records_used,
            "workloads": len(self.groups),
            "created": self.created,
            "xtune_version": self.xtune_version,
        }


@dataclass(frozen=True)
class PretrainedModel:
    """A trained model file in memory: its manifest and one serialized booster (UBJSON) per operator."""

    manifest: Manifest
    boosters: tuple[tuple[str, bytes], ...]

    def cost_model(self, op: str, nthread: int = 1) -> CostModel:
        """The model scoring feature rows of `op` (a sum's: its parts' boosters, or a part's analytic
        estimate where the model has no booster of it: `PartsModel`); InputError if it has none or its
        columns differ."""
        boosters = dict(self.boosters)
        parts = parts_of(op)
        if op not in boosters and parts:  # a part without a booster is ranked by its estimate, if it has one
            models = [
                (self.cost_model(part, nthread) if part in boosters else estimate_prior(part), a, b)
                for part, a, b in parts
            ]
            if all(model is not None for model, _, _ in models):
                return PartsModel([(model, a, b) for model, a, b in models if model is not None])
        if op not in boosters:
            have = ", ".join(self.manifest.ops) or "none"
            raise InputError(
                f"the pretrained model has no booster for operator '{op}' (it has: {have}); "
                f"train one on {op} logs with `xtune model train`"
            )
        if dict(self.manifest.feature_names).get(op) != feature_names(op):
            raise InputError(
                f"the pretrained {op} booster was trained on other feature columns than this "
                "xtune computes: retrain with `xtune model train`"
            )
        base_column = dict(self.manifest.base_columns).get(op)
        base = EstimatePrior(feature_names(op).index(base_column)) if base_column else None
        try:
            return XGBoostCostModel.from_bytes(
                boosters[op], nthread=nthread, objective=self.manifest.objective, base=base
            )
        except InputError as e:
            raise InputError(f"the pretrained model's {op} booster is damaged ({e})") from None

    def to_json(self) -> str:
        # The manifest goes first, so that the file's first bytes say what it is (is_model_file).
        boosters = {op: base64.b64encode(raw).decode("ascii") for op, raw in self.boosters}
        return json.dumps({"manifest": self.manifest.as_dict(), "boosters": boosters}, separators=(",", ":"))

    def save(self, path: str | os.PathLike[str]) -> None:
        """Write atomically: a concurrent reader sees the old file or the new one, never half of one."""
        write_atomic(path, self.to_json() + "\n", "model file")


# ---- reading ----------------------------------------------------------------------------------------


def is_model_file(path: str | os.PathLike[str]) -> bool:
    """A model file is one JSON object opening with its manifest; a log is JSON lines opening with "v"."""
    try:
        with open(path, "rb") as f:
            return bool(_MODEL_HEAD.match(f.read(4096)))
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None


def read_model(path: str | os.PathLike[str], check_features: bool = True) -> PretrainedModel:
    """The model file at `path`; InputError if it is none, or (with `check_features`) if its features
    version is not the one this xtune computes: its columns would mean other things."""
    if not Path(path).is_file():
        raise InputError(f"no model file {path}")
    if not is_model_file(path):
        raise InputError(
            f"{path} is not an xtune model file (expected the JSON that `xtune model train` writes)"
        )
    try:
        data = json.loads(Path(path).read_bytes())
        # The format first: another format's manifest may not parse as this one's.
        if data["manifest"].get("format") != MODEL_FORMAT:
            raise InputError(
                f"{path} is model format {data['manifest'].get('format')!r}; this xtune reads "
                f"format {MODEL_FORMAT}"
            )
        manifest = Manifest.from_dict(data["manifest"])
        boosters = tuple(
            (str(op), base64.b64decode(raw, validate=True)) for op, raw in data["boosters"].items()
        )
    except OSError as e:
        raise InputError(f"cannot read {path}: {e.strerror or e}") from None
    except (ValueError, KeyError, TypeError, AttributeError, binascii.Error, RecursionError) as e:
        raise InputError(f"{path} is a damaged xtune model file ({type(e).__name__}: {e})") from None
    if check_features and manifest.features_version != FEATURES_VERSION:
        raise InputError(f"{path} was {manifest.version_mismatch()}")
    return PretrainedModel(manifest, boosters)


# ---- the manifest for humans --------------------------------------------------------------------------


def format_manifest(manifest: Manifest, path: str = "") -> str:
    """A few header lines and a table of the workloads the model saw."""
    reason = manifest.unusable_reason()
    lines = [
        f"model {path}".rstrip(),
        f"  trained   {manifest.created} by xtune {manifest.xtune_version}, objective {manifest.objective}",
        f"  features  version {manifest.features_version}",
        f"  targets   {', '.join(manifest.targets)}",
        f"  records   {manifest.records_used} used, {manifest.records_skipped} skipped"
        + "".join(f"; {k} {v}" for k, v in manifest.skipped if v),
        f"  sources   {', '.join(manifest.sources) or '-'}",
        f"  boosted   {', '.join(f'{op} from {col}' for op, col in manifest.base_columns) or 'from 0'}",
        f"  usable    {'yes' if reason is None else 'NO, ' + reason}",
        "",
        f"{'op':<10} {'workload':<56} {'target':<12} {'unit':<5} {'records':>8} {'configs':>8}  cpu",
    ]
    for g in manifest.groups:
        lines.append(
            f"{g.op:<10} {g.workload:<56} {g.target:<12} {g.cost_unit.value:<5} {g.records:>8} "
            f"{g.configs:>8}  {g.cpu or '-'}"
        )
    return "\n".join(lines)


def objective(value: object) -> Objective:
    """`value` as an Objective; ValueError (a damaged manifest, or a user's typo) if it is none."""
    if value == "reg":
        return "reg"
    if value == "rank":
        return "rank"
    raise ValueError(f"unknown objective {value!r} (known: {', '.join(get_args(Objective))})")
