"""The tuning log: `Record`s in, append-only JSON lines out, and back: the records that still match their
templates (ranking them is tuning/ranking.py)."""

from __future__ import annotations

import functools
import gzip
import json
import os
import time
import warnings
import zlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from xtune.boards.cost import CostUnit
from xtune.errors import InputError, XtuneWarning
from xtune.files import PathLike, check_input, check_paths
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.template import SUM_TAG, ScheduleTemplate, SumTemplate
from xtune.ops.workload import Workload
from xtune.schedule.space import Config, KnobValue
from xtune.target import Target, get_target
from xtune.tuning.measure import MeasureResult, MeasureStatus
from xtune.tuning.options import MeasureOptions
from xtune.version import __version__

FORMAT_VERSION = 1
GZIP_MAGIC = b"\x1f\x8b"  # RFC 1952, section 2.3.1
DEFAULT_OPTIONS = MeasureOptions()
Knobs = tuple[tuple[str, KnobValue], ...]
TemplateOrWhy = ScheduleTemplate | str  # a template, or why a record has none


class LogWarning(XtuneWarning):
    """A log line was skipped: torn by a kill, corrupt, or written by another format version."""


@dataclass(frozen=True)
class Record:
    """One measurement of one config of one workload on one board; one JSON line in the log."""

    workload: str  # Workload.key
    target: str  # Target.name
    board: str
    index: int  # config index in the template's ConfigSpace
    knobs: Knobs  # the config's knob values, for humans and for checking
    result: MeasureResult
    options: MeasureOptions = DEFAULT_OPTIONS
    fingerprint: tuple[tuple[str, str], ...] = ()  # the board's uname, cpu info, ... as recorded at deploy
    version: int = FORMAT_VERSION
    xtune_version: str = __version__
    time: float = 0.0  # unix seconds when measured

    @property
    def cost(self) -> float:
        return self.result.cost


def make_record(
    workload: str,
    target: str,
    board: str,
    config: Config,
    result: MeasureResult,
    options: MeasureOptions = DEFAULT_OPTIONS,
    fingerprint: tuple[tuple[str, str], ...] = (),
) -> Record:
    """A record of `result` for `config`, stamped with the current time and xtune version."""
    return Record(
        workload, target, board, config.index, config.values, result, options, fingerprint, time=time.time()
    )


# ---- the JSON edge: dicts exist only here -------------------------------------------------------------


def record_to_json(record: Record) -> str:
    """One line of JSON (no newline) for `record`."""
    result = record.result
    data = {
        "v": record.version,
        "workload": record.workload,
        "target": record.target,
        "board": record.board,
        "fingerprint": [list(pair) for pair in record.fingerprint],
        "index": record.index,
        "knobs": [list(pair) for pair in record.knobs],
        "result": {
            "status": result.status.value,
            "costs": list(result.costs),
            "error": result.error,
            "compile_seconds": result.compile_seconds,
            "cost_unit": result.cost_unit.value,
            "extra": [list(pair) for pair in result.extra],
        },
        "options": asdict(record.options),
        "xtune": record.xtune_version,
        "time": record.time,
    }
    return json.dumps(data, separators=(",", ":"))


def record_from_json(line: str) -> Record:
    """The record of one log line; InputError if it is not a record of FORMAT_VERSION."""
    try:
        data = json.loads(line)
    except RecursionError:
        raise InputError("JSON nested too deeply") from None
    except ValueError as e:  # JSONDecodeError, or an integer of more than 4300 digits
        raise InputError(f"not JSON: {e}") from None
    if not isinstance(data, dict):
        raise InputError("not a JSON object")
    if data.get("v") != FORMAT_VERSION:
        raise InputError(f"format version {data.get('v')!r}, expected {FORMAT_VERSION}")
    try:
        return _record_from_dict(data)
    except (KeyError, TypeError, ValueError, AttributeError, OverflowError) as e:
        raise InputError(f"malformed record: {type(e).__name__}: {e}") from None


def logged_unit(spelled: str, fingerprint: Mapping[str, str]) -> CostUnit:
    """The unit of a logged result. Before "none" existed, every board's failures and an emulated
    board's wall times were logged as "s"; the board's fingerprint says what it really measured:
    an instruction-counting qemu board says so under "cost" (since counting began, commit 10f1fca), a
    qemu board's uname ends "(emulated ARCH)", and an SSH board behind qemu lists its "wrapper"."""
    unit = CostUnit(spelled)
    if unit is not CostUnit.SECONDS:
        return unit
    if fingerprint.get("cost", "").startswith("instructions"):
        return CostUnit.INSTRUCTIONS  # a failure on a counting board: it never reached the counter
    if "wrapper" in fingerprint or "(emulated " in fingerprint.get("uname", ""):
        return CostUnit.NONE  # emulated wall time: correctness only
    return unit


def _record_from_dict(data: dict[str, Any]) -> Record:
    res = data["result"]
    fingerprint = tuple((str(k), str(v)) for k, v in data.get("fingerprint", ()))
    result = MeasureResult(
        status=MeasureStatus(res["status"]),
        costs=tuple(float(c) for c in res["costs"]),
        error=str(res.get("error", "")),
        compile_seconds=float(res.get("compile_seconds", 0.0)),
        cost_unit=logged_unit(str(res.get("cost_unit", "s")), dict(fingerprint)),
        extra=tuple((str(k), float(v)) for k, v in res.get("extra", ())),
    )
    # Fields added to MeasureOptions later keep their defaults; fields it lost are ignored.
    known = {f.name for f in fields(MeasureOptions)}
    options = MeasureOptions(**{k: v for k, v in data.get("options", {}).items() if k in known})
    return Record(
        workload=str(data["workload"]),
        target=_logged_as(str(data["workload"]), str(data["target"])),
        board=str(data["board"]),
        index=_integer(data["index"]),
        knobs=tuple((str(k), _knob_value(v)) for k, v in data["knobs"]),
        result=result,
        options=options,
        fingerprint=fingerprint,
        version=int(data["v"]),
        xtune_version=str(data.get("xtune", "")),
        time=float(data.get("time", 0.0)),
    )


def _integer(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{value!r} is not an integer")
    return value


def _knob_value(value: object) -> KnobValue:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"knob value {value!r} is neither int nor str")
    return value


# ---- the file -----------------------------------------------------------------------------------------


class TuningLog:
    """An append-only JSON-lines file of records; every `append` is flushed and fsync'ed once.

    A log whose name ends in ".gz" is read (a shipped or shared log, compressed ~15x) but never appended to:
    gzip members cannot be made durable line by line."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @property
    def compressed(self) -> bool:
        return self.path.suffix == ".gz"

    def check_appendable(self, inputs: Sequence[tuple[PathLike | None, str]] = ()) -> None:
        """InputError unless records can be appended: a writable plain log (a regular file or none yet),
        which is none of `inputs` (the model tuned, the logs a cost model is trained on)."""
        check_paths([(self.path, "log")], inputs, append=True)  # before it is opened: a FIFO would block
        if self.compressed or _starts_with(self.path, GZIP_MAGIC):
            raise InputError(
                f"{self.path} is a compressed log: xtune reads it but appends only to plain "
                "JSON-lines logs (give --log a name without .gz)"
            )

    def append(self, records: Sequence[Record]) -> None:
        """Write `records` as complete lines and make them durable before returning."""
        if not records:
            return
        self.check_appendable()
        text = "".join(record_to_json(r) + "\n" for r in records)
        with open(self.path, "a+b") as f:
            # A run killed mid-write leaves a torn line without its newline; start on a fresh line so the
            # torn fragment does not swallow our first record.
            if f.tell() > 0:
                f.seek(-1, os.SEEK_END)
                if f.read(1) != b"\n":
                    text = "\n" + text
            f.write(text.encode())
            f.flush()
            os.fsync(f.fileno())

    def read(self) -> list[Record]:
        """Every readable record, in file order; torn, corrupt and unknown-version lines are warned about."""
        return [record for _, record in self.numbered()]

    def numbered(self) -> list[tuple[int, Record]]:
        """`read`, each record with its line number (from 1)."""
        if not self.path.exists():
            return []
        check_input(self.path, "log")  # a FIFO would block the read, a device never end
        try:
            raw = self.path.read_bytes()
        except OSError as e:
            raise InputError(f"cannot read the log {self.path}: {e.strerror or e}") from None
        if self.compressed or raw.startswith(GZIP_MAGIC):  # a gzip log by any name is read as one
            try:
                raw = gzip.decompress(raw)
            except (OSError, EOFError, zlib.error) as e:
                raise InputError(f"{self.path} is not a readable gzip file ({e})") from None
        lines = raw.decode(errors="replace").split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        records: list[tuple[int, Record]] = []
        corrupt: list[int] = []
        versions: dict[str, int] = {}
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                records.append((number, record_from_json(line)))
            except InputError:
                version = _version_of(line)
                if version is not None and version != FORMAT_VERSION:
                    shown = repr(version)[:40]  # any JSON value, e.g. a dict: not hashable, maybe long
                    versions[shown] = versions.get(shown, 0) + 1
                else:
                    corrupt.append(number)
        self._warn(corrupt, versions, len(lines))
        return records

    def _warn(self, corrupt: list[int], versions: dict[str, int], n_lines: int) -> None:
        if corrupt == [n_lines]:
            warnings.warn(
                f"{self.path}: skipped a torn last line {n_lines} (a killed run?)", LogWarning, stacklevel=3
            )
        elif corrupt:
            shown = ", ".join(map(str, corrupt[:5])) + (", ..." if len(corrupt) > 5 else "")
            warnings.warn(
                f"{self.path}: skipped {len(corrupt)} unreadable line(s): {shown}", LogWarning, stacklevel=3
            )
        for version, count in versions.items():
            warnings.warn(
                f"{self.path}: skipped {count} record(s) of format version {version} "
                f"(this xtune reads version {FORMAT_VERSION})",
                LogWarning,
                stacklevel=3,
            )


def _starts_with(path: Path, magic: bytes) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(len(magic)) == magic
    except OSError:
        return False  # missing, or unreadable: appending says why


def _version_of(line: str) -> object:
    """The "v" of a line that is a JSON object, else None."""
    try:
        data = json.loads(line)
    except (ValueError, RecursionError):
        return None
    return data.get("v") if isinstance(data, dict) else None


def read_logs(paths: Iterable[str | os.PathLike[str]]) -> list[Record]:
    """The usable records of several logs, concatenated in the order given (and those of a forced part of
    a sum again as the sum's, `with_sum_copies`).

    A missing log is an InputError (a typo, almost always). A record this xtune cannot use (unknown
    operator or target, a config outside its template's space or whose knobs no longer match) is left
    out with one LogWarning per log naming the file and its line numbers; it never stops the rest."""
    return with_sum_copies(read_usable(paths)[0])


def with_sum_copies(records: Sequence[Record]) -> list[Record]:
    """`records`, then each record of a workload that forces one part of a sum (a conv2d's algo=winograd,
    where the conv2d without `algo` is the tuner's choice of direct and Winograd, a SumTemplate) again as
    a record of the sum: its key without the tag, its config at the part's offset with the tag among its
    knobs. So a log tuned on the forced key is the sum's too: a network's 3x3 tasks were keyed
    algo=winograd before their algorithm was the tuner's, and such a log still resumes and builds them."""
    found: dict[tuple[str, str], tuple[str, SumTemplate, int] | None] = {}
    copies = []
    for r in records:
        if f",{SUM_TAG}=" not in r.workload:
            continue
        if (r.workload, r.target) not in found:
            found[r.workload, r.target] = _forced_part(r.workload, r.target)
        if (hit := found[r.workload, r.target]) is None:
            continue
        key, template, part = hit
        space = template.parts[part][1].space
        if space.matches(r.index, r.knobs):  # else another version's config: not the sum's either
            config = template.of_part(part, space.config(r.index))
            copies.append(replace(r, workload=key, index=config.index, knobs=config.values))
    return [*records, *copies]


def _forced_part(workload: str, target: str) -> tuple[str, SumTemplate, int] | None:
    """The sum `workload` forces a part of (its key without the tag, its template on `target`, the part's
    number), or None."""
    items = workload.split(",")
    forced = [item for item in items if item.startswith(f"{SUM_TAG}=")]
    try:
        wl = parse_workload(",".join(item for item in items if item not in forced))
        template = template_for(wl, get_target(target))
    except InputError:
        return None
    if not isinstance(template, SumTemplate) or not forced:
        return None
    names = [name for name, _ in template.parts]
    name = forced[0].partition("=")[2]
    return (wl.key, template, names.index(name)) if name in names else None


def read_usable(paths: Iterable[str | os.PathLike[str]]) -> tuple[list[Record], Counter[str]]:
    """`read_logs`, and how many records it left out by kind: "unknown_workload_or_target" and
    "stale_config" (a model file's manifest counts them)."""
    records: list[Record] = []
    left_out: Counter[str] = Counter()
    templates: dict[tuple[str, str], TemplateOrWhy] = {}
    for path in paths:
        log = TuningLog(path)
        if not log.path.exists():
            raise InputError(f"no such log: {path}")
        skipped: list[tuple[int, str]] = []
        for number, record in log.numbered():
            template = _template_of(record, templates)
            why = template if isinstance(template, str) else _mismatch(template, record)
            if why:
                skipped.append((number, why))
                left_out["unknown_workload_or_target" if template is why else "stale_config"] += 1
            else:  # in its template's words: a record logged before its space grew (a sum) gains the tag
                assert not isinstance(template, str)
                knobs = template.space.config(record.index).values
                records.append(record if knobs == record.knobs else replace(record, knobs=knobs))
        if skipped:
            lines = ", ".join(str(n) for n, _ in skipped[:5]) + (", ..." if len(skipped) > 5 else "")
            warnings.warn(
                f"{path}: skipped {len(skipped)} record(s) this xtune cannot use (line {lines}); "
                f"line {skipped[0][0]}: {skipped[0][1]}",
                LogWarning,
                stacklevel=3,
            )
    return records, left_out


def _template_of(record: Record, cache: dict[tuple[str, str], TemplateOrWhy]) -> TemplateOrWhy:
    """The template of the record's workload on its target, or why there is none."""
    key = (record.workload, record.target)
    if key not in cache:
        try:
            cache[key] = template_for(parse_workload(record.workload), get_target(record.target))
        except InputError as e:
            cache[key] = str(e)
    return cache[key]


def config_of(template: ScheduleTemplate, record: Record) -> Config | None:
    """The record's config if its index still means the same knobs in `template`, else None.

    The one rule for "a logged record still matches its template": a changed template renumbers its
    space, and an index outside it, or one whose knobs differ, is another version's config."""
    return None if _mismatch(template, record) else template.space.config(record.index)


def log_target(workload: Workload, target: Target) -> str:
    """The target name the tuning records of `workload` on `target` carry, written and read: a float
    task's on a target that only adds integer instructions to another (`Target.float_records_of`) are
    that target's, whose float code it runs, so one log serves both; an integer task's are its own
    (vpdpbusd kernels are other code than vpmaddwd ones)."""
    if not target.float_records_of:
        return target.name  # every record check asks: most targets answer without the tensors
    integer = any(t.dtype != "float32" for t in workload.tensors() if not t.is_output)
    return target.name if integer else target.float_records_of


@functools.cache
def _logged_as(workload: str, target: str) -> str:
    """The name a logged record's target is read as: `log_target`'s, so a float task's record written
    under a VNNI target's own name (before its float records were its base's) is its base's like the
    rest; an unknown workload or target stays as written (read_logs says why it cannot be used)."""
    try:
        return log_target(parse_workload(workload), get_target(target))
    except InputError:
        return target


def _mismatch(template: ScheduleTemplate, record: Record) -> str:
    space = template.space
    if record.workload != template.workload.key or record.target != log_target(
        template.workload, template.target
    ):
        return f"the record is of {record.workload} on {record.target}"
    if not 0 <= record.index < space.size:
        return f"config index {record.index} is outside the space of {space.size} configs"
    if not space.matches(record.index, record.knobs):
        return f"config {record.index}'s knobs no longer match the template"
    return ""
