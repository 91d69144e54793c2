"""The tuning log: round trips, torn and foreign lines, resume sets and best() over the whole history."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

import xtune
from tests.conftest import CliRunner
from xtune.errors import InputError
from xtune.schedule.space import Config
from xtune.target import get_target
from xtune.templates import template_for
from xtune.tuning.database import (
    FORMAT_VERSION,
    LogWarning,
    Record,
    TuningLog,
    best,
    make_record,
    read_logs,
    record_from_json,
    record_to_json,
)
from xtune.tuning.measure import MeasureOptions, MeasureResult, MeasureStatus
from xtune.workload import parse_workload

WL, TARGET = "matmul:m=64,n=64,k=64", "x86-avx2"


def rec(
    index: int,
    costs: tuple[float, ...] = (),
    status: MeasureStatus = MeasureStatus.OK,
    workload: str = WL,
    target: str = TARGET,
    unit: str = "s",
    when: float = 1.0,
) -> Record:
    result = MeasureResult(status, costs, "" if status is MeasureStatus.OK else "boom", cost_unit=unit)
    return Record(workload, target, "local", index, knobs_of(index), result, time=when)


def knobs_of(index: int) -> tuple[tuple[str, int | str], ...]:
    """The real knobs of config `index` of WL on TARGET: read_logs leaves out records that do not match."""
    return template_for(parse_workload(WL), get_target(TARGET)).space.config(index).values


def test_round_trip_keeps_every_field() -> None:
    result = MeasureResult(MeasureStatus.OK, (1e-3, 1.1e-3, 0.9e-3), "", 0.025, "s", (("gflops", 12.5),))
    options = MeasureOptions(number=4, repeat=5, flush_cache=True)
    fingerprint = (("uname", "Linux 6.1"), ("cpu", "A72"))
    record = Record(
        WL,
        TARGET,
        "pi4",
        1234,
        (("tile_m", 8), ("order", "nmk")),
        result,
        options,
        fingerprint,
        time=1700000000.5,
    )
    line = record_to_json(record)
    assert "\n" not in line
    assert record_from_json(line) == record
    failed = rec(7, status=MeasureStatus.WRONG_ANSWER)
    assert record_from_json(record_to_json(failed)) == failed
    assert json.loads(line)["v"] == FORMAT_VERSION


def test_make_record_stamps_time_and_version() -> None:
    config = Config(3, (("tile", 4),))
    r = make_record(WL, TARGET, "local", config, MeasureResult(MeasureStatus.OK, (1.0,)))
    assert r.index == 3 and r.knobs == (("tile", 4),)
    assert r.xtune_version == xtune.__version__ and r.time > 1.6e9


def test_record_from_json_rejects_garbage() -> None:
    for line in ["", "{", "[1, 2]", '{"v": 1}', '{"v": 99, "workload": "x"}']:
        with pytest.raises(InputError):
            record_from_json(line)


def test_append_and_read(tmp_path: Path) -> None:
    log = TuningLog(tmp_path / "log.jsonl")
    assert log.read() == []
    records = [rec(i, (float(i + 1),)) for i in range(5)]
    log.append(records[:2])
    log.append(records[2:])
    log.append([])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert log.read() == records


def test_torn_last_line_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    log = TuningLog(path)
    log.append([rec(i, (1.0,)) for i in range(3)])
    with open(path, "a") as f:
        f.write(record_to_json(rec(3, (1.0,)))[:40])  # a kill in the middle of a write
    with pytest.warns(LogWarning, match="torn last line"):
        assert [r.index for r in log.read()] == [0, 1, 2]
    # The next run appends after the torn fragment on a fresh line: nothing it writes is lost.
    log.append([rec(4, (1.0,))])
    with pytest.warns(LogWarning, match="1 unreadable line"):
        assert [r.index for r in log.read()] == [0, 1, 2, 4]


def test_unknown_version_is_skipped_with_a_warning(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    TuningLog(path).append([rec(0, (1.0,))])
    future = json.loads(record_to_json(rec(1, (0.5,))))
    future["v"] = FORMAT_VERSION + 1
    with open(path, "a") as f:
        f.write(json.dumps(future) + "\n")
    TuningLog(path).append([rec(2, (2.0,))])
    with pytest.warns(LogWarning, match="format version 2"):
        records = TuningLog(path).read()
    assert [r.index for r in records] == [0, 2]


def test_best_picks_lowest_median_of_ok_records_only(tmp_path: Path) -> None:
    records = [
        rec(1, (5.0, 5.0, 5.0)),
        rec(2, (1.0, 100.0, 100.0)),  # lowest minimum, but the median is what counts
        rec(3, (0.1,), MeasureStatus.WRONG_ANSWER),  # a wrong answer is never a best
        rec(4, status=MeasureStatus.COMPILE_ERROR),
        rec(5, (0.2,), MeasureStatus.TIMEOUT),
        rec(6, (0.01,), unit="insn"),  # another unit: not comparable with seconds
        rec(7, (0.01,), workload="matmul:m=1,n=1,k=1"),
        rec(8, (0.01,), target="riscv64-gc"),
        rec(9, (7.0,)),
        rec(9, (3.0,), when=2.0),  # timed twice: the faster of its middle two represents it
    ]
    assert [r.index for r in best(records, WL, TARGET)] == [9]
    assert [(r.index, r.cost) for r in best(records, WL, TARGET, k=3)] == [(9, 3.0), (1, 5.0), (2, 100.0)]
    assert [r.index for r in best(records, WL, TARGET, cost_unit="insn")] == [6]
    assert best(records, "conv2d:n=1", TARGET) == []
    assert best([rec(1, status=MeasureStatus.RUNTIME_ERROR)], WL, TARGET) == []


def test_a_config_timed_again_is_judged_by_its_median_not_its_luckiest_timing() -> None:
    lucky = [rec(1, (1.0,), when=1.0), rec(1, (4.0,), when=2.0), rec(1, (4.5,), when=3.0)]
    steady = [rec(2, (3.0,)), rec(2, (3.1,), when=2.0), rec(2, (2.9,), when=3.0)]
    top = best(lucky + steady, WL, TARGET, k=2)
    assert [(r.index, r.cost) for r in top] == [(2, 3.0), (1, 4.0)]


def test_a_config_that_ever_failed_its_check_or_crashed_is_never_a_best() -> None:
    for status in (MeasureStatus.WRONG_ANSWER, MeasureStatus.RUNTIME_ERROR):
        records = [rec(1, (1.0,)), rec(1, (1.0,), status, when=2.0), rec(2, (5.0,))]
        assert [r.index for r in best(records, WL, TARGET)] == [2]
    # A timeout or a board error may be the host's fault: the config's OK timings still count.
    for status in (MeasureStatus.TIMEOUT, MeasureStatus.BOARD_ERROR):
        records = [rec(1, (1.0,)), rec(1, (1.0,), status, when=2.0), rec(2, (5.0,))]
        assert [r.index for r in best(records, WL, TARGET)] == [1]
    # The same index with other knobs is another config (a changed template renumbers).
    renumbered = replace(rec(1, (0.5,), MeasureStatus.WRONG_ANSWER), knobs=(("tile", 99),))
    assert [r.index for r in best([rec(1, (1.0,)), renumbered], WL, TARGET)] == [1]


def test_best_over_several_logs(tmp_path: Path) -> None:
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    TuningLog(a).append([rec(1, (2.0,)), rec(2, (3.0,))])
    TuningLog(b).append([rec(3, (1.5,)), rec(4, (0.5,), MeasureStatus.WRONG_ANSWER)])
    records = read_logs([a, b])
    with pytest.raises(InputError, match=r"no such log: .*missing\.jsonl"):
        read_logs([a, tmp_path / "missing.jsonl"])
    assert [r.index for r in best(records, WL, TARGET, k=2)] == [3, 1]
    assert [r.index for r in TuningLog(a).best(WL, TARGET)] == [1]


def test_measured_for_resume(tmp_path: Path) -> None:
    log = TuningLog(tmp_path / "log.jsonl")
    log.append(
        [
            rec(1, (2.0,)),
            rec(2, status=MeasureStatus.COMPILE_ERROR),
            rec(3, status=MeasureStatus.BOARD_ERROR),
            rec(4, (1.0,), workload="other:x=1"),
        ]
    )
    log.append([rec(1, (1.0,), when=5.0)])
    done = log.measured(WL, TARGET)
    assert sorted(done) == [1, 2]  # a board error is measured again; other workloads do not count
    assert done[1].time == 5.0  # the latest record
    assert log.measured(WL, TARGET, board="pi4") == {}


def test_resume_takes_only_this_cpus_records(tmp_path: Path) -> None:
    """A shared log holds several machines' "local" boards: another cpu's costs are not this one's."""
    log = TuningLog(tmp_path / "log.jsonl")
    epyc, xeon = (("cpu", "AMD EPYC"),), (("cpu", "Intel Xeon"),)
    log.append(
        [replace(rec(1, (1.0,)), fingerprint=epyc), replace(rec(2, (1.0,)), fingerprint=xeon), rec(3, (1.0,))]
    )
    assert sorted(log.measured(WL, TARGET, cpu="AMD EPYC")) == [1, 3]  # no fingerprint: taken as this cpu's
    assert sorted(log.measured(WL, TARGET, cpu="Intel Xeon")) == [2, 3]
    assert sorted(log.measured(WL, TARGET)) == [1, 2, 3]


def test_a_gzip_log_is_read_and_never_appended_to(tmp_path: Path, xtune_cli: CliRunner) -> None:
    plain, packed = TuningLog(tmp_path / "log.jsonl"), TuningLog(tmp_path / "log.jsonl.gz")
    plain.append([rec(1, (2.0,)), rec(2, (1.0,))])
    packed.path.write_bytes(gzip.compress(plain.path.read_bytes()))
    assert packed.read() == plain.read() and [r.index for r in read_logs([packed.path])] == [1, 2]
    with pytest.raises(InputError, match="compressed log"):
        packed.append([rec(3, (1.0,))])
    packed.path.write_bytes(b"not gzip")
    with pytest.raises(InputError, match="not a readable gzip"):
        packed.read()
    out = xtune_cli("tune", "--workload", "matmul:m=8,n=8,k=8", "--trials", "1", "--log", str(packed.path))
    assert out.returncode == 2 and out.stderr.count("\n") == 1 and "compressed log" in out.stderr


def test_one_fsync_per_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    real = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(os, "fsync", counting_fsync)
    log = TuningLog(tmp_path / "log.jsonl")
    log.append([rec(i, (1.0,)) for i in range(10)])
    log.append([rec(10, (1.0,))])
    assert len(calls) == 2


def test_a_killed_writer_leaves_complete_lines(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    script = (
        "import os, signal\n"
        "from xtune.tuning.database import Record, TuningLog\n"
        "from xtune.tuning.measure import MeasureResult, MeasureStatus\n"
        "r = [Record('w', 't', 'b', i, (), MeasureResult(MeasureStatus.OK, (1.0,))) for i in range(50)]\n"
        f"TuningLog({str(path)!r}).append(r)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == -9
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [r.index for r in TuningLog(path).read()] == list(range(50))
