"""Fuzzing the command line: random workload strings, flags out of range and junk logs (gzip, binary, deeply
nested JSON, wrong types) through `xtune.cli.main`. Whatever the input, the answer is exit 0 (the input was
valid) or exit 2 with exactly one "error" line on stderr, every other stderr line a one-line warning, and
never a traceback. Seeded and bounded: the same inputs every run, well under a minute.

The figures of the last change to this file are in docs/faults.md ("Fuzz")."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import os
import random
import stat
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from xtune.cli import main
from xtune.ops.registry import OPERATORS, parse_workload, template_for
from xtune.schedule.space import Config
from xtune.target import get_target
from xtune.tuning.database import make_record, record_to_json
from xtune.tuning.measure import MeasureResult, MeasureStatus

SEED = 20261125
WL, TARGET = "matmul:m=8,n=8,k=8", "x86-avx2"


@dataclass
class Outcome:
    argv: list[str]
    status: int
    stderr: str
    traceback: str = ""


@dataclass
class Tally:
    inputs: int = 0
    tracebacks: list[Outcome] = field(default_factory=list)
    bad: list[tuple[Outcome, str]] = field(default_factory=list)
    by_status: dict[int, int] = field(default_factory=dict)


def run(argv: list[str]) -> Outcome:
    """`xtune ARGV` in this process: its exit status and stderr, and the traceback if one escaped."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except SystemExit as e:  # argparse's usage errors
            status = e.code if isinstance(e.code, int) else 1
        except BaseException:  # the very thing this test looks for
            return Outcome(argv, -1, err.getvalue(), traceback.format_exc())
    return Outcome(argv, status, err.getvalue())


def judge(outcome: Outcome, tally: Tally) -> None:
    tally.inputs += 1
    tally.by_status[outcome.status] = tally.by_status.get(outcome.status, 0) + 1
    if outcome.traceback or "Traceback" in outcome.stderr:
        tally.tracebacks.append(outcome)
        return
    lines = outcome.stderr.splitlines()
    errors = [line for line in lines if line.startswith("xtune") and ": error: " in line]
    others = [line for line in lines if not line.startswith("xtune")]  # errors, warnings, notes: one line
    if outcome.status not in (0, 2):
        tally.bad.append((outcome, f"exit status {outcome.status}"))
    elif others:
        tally.bad.append((outcome, f"stderr lines that are not xtune's one-line messages: {others[:2]}"))
    elif outcome.status == 2 and len(errors) != 1:
        tally.bad.append((outcome, f"{len(errors)} error lines"))
    elif outcome.status == 0 and errors:
        tally.bad.append((outcome, "an error line with exit 0"))


# ---- generators ---------------------------------------------------------------------------------------

VALUES = [
    "8",
    "1",
    "0",
    "-1",
    "+8",
    " 8",
    "8 ",
    "1_6",
    "\u0661\u0666",
    "\uff11\uff16",
    "\u00b2",
    "1e3",
    "0x10",
    "08",
    "",
    "x",
    "nchw",
    "nhwc",
    "NHWC",
    "8\x00",
    "8\n",
    str(2**31 - 1),
    str(2**31),
    str(2**63),
    str(2**64),
    "9" * 5000,
    "4.0",
    "nan",
]
SIZES = [1, 2, 3, 4, 8, 16, 5000, 70000]
KEYS = sorted({k for op in OPERATORS.values() for k in op.keys} | {"q", "M", "", " m", "m "})


def random_workload(rng: random.Random) -> str:
    op = rng.choice([*OPERATORS, *OPERATORS, "conv", "", "MATMUL", "matmul ", "\u043catmul"])
    keys = list(OPERATORS[op].keys) if op in OPERATORS else KEYS
    items = []
    for key in rng.sample(keys, k=min(len(keys), rng.randint(0, len(keys) + 1))):
        value = rng.choice(VALUES) if rng.random() < 0.3 else str(rng.choice(SIZES))
        items.append(f"{key}={value}" if rng.random() < 0.95 else key)
    if items and rng.random() < 0.2:
        items.append(rng.choice(items))  # a key given twice
    if rng.random() < 0.1:
        items.insert(rng.randint(0, len(items)), "")  # an empty item
    text = f"{op}:" + ",".join(items) if rng.random() < 0.95 else op
    return text.replace(",", ", ") if rng.random() < 0.05 else text


def breaks_the_grammar(text: str) -> bool:
    """A partial oracle, independent of the parser: text that README's grammar never allows."""
    _, _, rest = text.partition(":")
    items = rest.split(",")
    keys = [item.partition("=")[0] for item in items]
    return (
        bool(set(text) - set("abcdefghijklmnopqrstuvwxyz0123456789:=,"))
        or "" in items
        or len(set(keys)) != len(keys)
        or any(item.count("=") != 1 for item in items)
    )


# Flags whose values are numbers, per command; each gets values out of its range or no number at all.
FLAGS = {
    "tune": [
        "--trials",
        "--early-stopping",
        "--seed",
        "--batch-size",
        "--repeat",
        "--min-repeat-ms",
        "--timeout-ms",
        "--confirm",
    ],
    "bench": ["--config"],
    "boards": ["--timeout"],
    "model train": ["--threads", "--seed"],
}
BAD_NUMBERS = [
    "-1",
    "0",
    "-0",
    "1025",
    "5000",
    str(2**31),
    str(2**32),
    str(2**63),
    str(2**64),
    "9" * 40,
    "nan",
    "inf",
    "-inf",
    "1e999",
    "abc",
    "",
    "\u0661",
    "1_0",
    "0x10",
    "3.5",
    " 3",
]


def flag_argv(rng: random.Random, tmp: Path, command: str, flag: str, value: str) -> list[str]:
    base = {
        "tune": ["tune", "--workload", WL, "--board", "no-such-board", "--log", str(tmp / "t.jsonl")],
        "bench": ["bench", "--workload", WL, "--board", "no-such-board"],
        "boards": ["boards", "--boards", str(tmp / "no-boards.toml")],
        "model train": ["model", "train", str(tmp / "missing.jsonl"), "-o", str(tmp / "m.json")],
    }[command]
    return [*base, f"{flag}={value}"] if rng.random() < 0.5 or not value else [*base, flag, value]


# ---- junk logs ----------------------------------------------------------------------------------------


def good_lines() -> list[str]:
    template = template_for(parse_workload(WL), get_target(TARGET))
    rng = random.Random(SEED)
    records = [
        make_record(
            WL, TARGET, "local", template.space.config(i), MeasureResult(MeasureStatus.OK, (rng.random(),))
        )
        for i in rng.sample(range(template.space.size), 8)
    ]
    stale = Config(records[0].index, template.space.config(records[1].index).values)
    records.append(make_record(WL, TARGET, "local", stale, MeasureResult(MeasureStatus.OK, (1e-9,))))
    return [record_to_json(r) for r in records]


JUNK_VALUES: list[object] = [None, True, -1, 2**70, 1e308, "x", "", [], {}, [[1, 2, 3]], {"a": 1}, "5", 5]


def junk_logs(rng: random.Random, tmp: Path) -> Iterator[Path]:
    lines = good_lines()
    plain = "\n".join(lines) + "\n"

    def file(name: str, data: bytes | str) -> Path:
        path = tmp / name
        path.write_bytes(data.encode() if isinstance(data, str) else data)
        return path

    yield file("good.jsonl", plain)
    yield file("packed-by-another-name.jsonl", gzip.compress(plain.encode()))
    yield file("truncated.jsonl.gz", gzip.compress(plain.encode())[:40])
    yield file("gzip-of-binary.jsonl.gz", gzip.compress(rng.randbytes(3000)))
    yield file("empty.jsonl", "")
    yield tmp / "a-directory"
    yield tmp / "missing.jsonl"
    for n in range(6):
        yield file(f"binary{n}.jsonl", rng.randbytes(rng.randint(1, 5000)))
    for depth in (1000, 100_000):
        yield file(f"deep{depth}.jsonl", "[" * depth + "]" * depth + "\n" + lines[0] + "\n")
        yield file(
            f"deep-object{depth}.jsonl", '{"v":1,"result":' + '{"a":' * depth + "1" + "}" * depth + "}\n"
        )
    yield file("huge-int.jsonl", '{"v":1,"index":' + "9" * 5000 + "}\n" + plain)
    for n in range(30):  # one field of a good record replaced by a value of another type
        data = json.loads(rng.choice(lines))
        where = data if rng.random() < 0.7 else data["result"]
        where[rng.choice(sorted(where))] = rng.choice(JUNK_VALUES)
        yield file(f"wrong-type{n}.jsonl", plain + json.dumps(data) + "\n")
    for n, (key, value) in enumerate(
        [
            ("workload", "conv9:m=1"),
            ("workload", "matmul:m=8,n=8,k=8,m=8"),
            ("index", -1),
            ("index", 10**9),
            ("target", 5),
            ("target", "pdp11"),
            ("knobs", [["tile", "99x99"]]),
        ]
    ):
        data = json.loads(lines[0])
        data[key] = value
        yield file(f"unusable{n}.jsonl", json.dumps(data) + "\n" + plain)


# ---- the test -----------------------------------------------------------------------------------------


def fuzz(tmp: Path) -> Tally:
    rng = random.Random(SEED)
    tally = Tally()
    (tmp / "a-directory").mkdir()
    log = tmp / "good-for-workloads.jsonl"
    log.write_text("\n".join(good_lines()) + "\n")
    for _ in range(2000):
        text = random_workload(rng)
        outcome = run(["best", "--log", str(log), "--workload", text])
        judge(outcome, tally)
        if outcome.status == 0 and breaks_the_grammar(text):
            tally.bad.append((outcome, "a workload outside the grammar was accepted"))
    for flagged, flags in FLAGS.items():
        for flag in flags:
            for value in BAD_NUMBERS:
                judge(run(flag_argv(rng, tmp, flagged, flag, value)), tally)
    commands: list[Callable[[Path], list[str]]] = [
        lambda p: ["best", "--log", str(p)],
        lambda p: ["report", str(p)],
        lambda p: ["report", str(p), "--json"],
        lambda p: ["model", "info", str(p)],
        lambda p: ["tune", "--workload", WL, "--transfer-from", str(p), "--board", "no-such-board"],
    ]
    for path in junk_logs(rng, tmp):
        for command in commands:
            judge(run(command(path)), tally)
        if path.name.startswith(("good", "unusable", "wrong-type1")):  # a build compiles: only a few
            build = ["build", "--target", TARGET, "--workload", WL, "--log", str(path), *outputs(tmp)]
            judge(run(build), tally)
    for argv in bad_outputs(tmp):
        judge(run(argv), tally)
    return tally


def private_fifo(tmp: Path) -> Path:
    path = tmp / "fifo"
    if not path.exists():
        os.mkfifo(path)
    return path


def private_device(tmp: Path) -> list[Path]:
    """A character device like /dev/full (1, 7) inside `tmp`, where the system allows making one (root)."""
    path = tmp / "full"
    if not path.exists():
        try:
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
        except OSError:
            return []
    return [path]


def outputs(tmp: Path) -> list[str]:
    return ["-o", str(tmp / "k.o"), "--header", str(tmp / "k.h")]


def bad_outputs(tmp: Path) -> Iterator[list[str]]:
    """Output paths that cannot be written: refused before anything is compiled or trained."""
    read_only = tmp / "read-only.h"
    read_only.write_text("")
    read_only.chmod(0o444)
    log = tmp / "good.jsonl"
    # Never the machine's own /dev/full or /dev/null: a regression would turn them into regular files.
    specials = [private_fifo(tmp), *private_device(tmp)]
    for path in [tmp / "a-directory", tmp / "no-folder" / "k.o", *specials, read_only, tmp / "k.h", Path("")]:
        yield ["build", "--target", TARGET, "--workload", WL, "-o", str(path), "--header", str(tmp / "k.h")]
        yield ["build", "--target", TARGET, "--workload", WL, *outputs(tmp), "--archive", str(path)]
        yield ["model", "train", str(log), "-o", str(path)]
        yield ["report", str(log), "--plot", str(path)]
        yield ["tune", "--workload", WL, "--log", str(path), "--board", "no-such-board"]


def test_no_input_gives_a_traceback_and_every_refusal_is_one_line(tmp_path: Path) -> None:
    tally = fuzz(tmp_path)
    shown = [f"{' '.join(o.argv)[:200]}\n{o.traceback[-1500:]}" for o in tally.tracebacks[:3]]
    assert not tally.tracebacks, f"{len(tally.tracebacks)} of {tally.inputs} inputs: " + "\n".join(shown)
    assert not tally.bad, "\n".join(
        f"{why}: {' '.join(o.argv)[:200]}\n{o.stderr[-600:]}" for o, why in tally.bad[:5]
    )
    assert tally.inputs > 2000 and tally.by_status.get(0, 0) > 50 and tally.by_status.get(2, 0) > 1500


if __name__ == "__main__":  # the figures for docs/faults.md
    import tempfile
    import time

    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        result = fuzz(Path(tmp))
        for o in result.tracebacks + [b[0] for b in result.bad]:
            print([a[:80] for a in o.argv], o.status, o.stderr[-300:], o.traceback[-600:])
        print(
            f"{result.inputs} inputs, {len(result.tracebacks)} tracebacks, {len(result.bad)} other faults, "
            f"exit statuses {dict(sorted(result.by_status.items()))}, {time.perf_counter() - start:.1f} s"
        )
