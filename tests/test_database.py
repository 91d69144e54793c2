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
from xtune.boards.cost import CostUnit
from xtune.errors import InputError
from xtune.firmware.kernels import build, choose
from xtune.ops.registry import parse_workload, template_for
from xtune.schedule.space import Config
from xtune.target import get_target
from xtune.tuning.database import (
    FORMAT_VERSION,
    LogWarning,
    Record,
    TuningLog,
    config_of,
    log_target,
    make_record,
    read_logs,
    record_from_json,
    record_to_json,
)
from xtune.tuning.measure import MeasureResult, MeasureStatus
from xtune.tuning.options import MeasureOptions
from xtune.tuning.ranking import best, measured, ranking_unit
from xtune.tuning.report import format_table, summarize

WL, TARGET = "matmul:m=64,n=64,k=64", "x86-avx2"


def rec(
    index: int,
    costs: tuple[float, ...] = (),
    status: MeasureStatus = MeasureStatus.OK,
    workload: str = WL,
    target: str = TARGET,
    unit: CostUnit = CostUnit.SECONDS,
    when: float = 1.0,
) -> Record:
    result = MeasureResult(status, costs, "" if status is MeasureStatus.OK else "boom", cost_unit=unit)
    return Record(workload, target, "local", index, knobs_of(index), result, time=when)


def knobs_of(index: int) -> tuple[tuple[str, int | str], ...]:
    """The real knobs of config `index` of WL on TARGET: read_logs leaves out records that do not match."""
    return template_for(parse_workload(WL), get_target(TARGET)).space.config(index).values


def test_round_trip_keeps_every_field() -> None:
    result = MeasureResult(
        MeasureStatus.OK, (1e-3, 1.1e-3, 0.9e-3), "", 0.025, CostUnit.SECONDS, (("gflops", 12.5),)
    )
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
        rec(6, (0.01,), unit=CostUnit.INSTRUCTIONS),  # another unit: not comparable with seconds
        rec(7, (0.01,), workload="matmul:m=1,n=1,k=1"),
        rec(8, (0.01,), target="riscv64-gc"),
        rec(9, (7.0,)),
        rec(9, (3.0,), when=2.0),  # timed twice: the faster of its middle two represents it
    ]
    assert [r.index for r in best(records, WL, TARGET)] == [9]
    assert [(r.index, r.cost) for r in best(records, WL, TARGET, k=3)] == [(9, 3.0), (1, 5.0), (2, 100.0)]
    assert [r.index for r in best(records, WL, TARGET, cost_unit=CostUnit.INSTRUCTIONS)] == [6]
    assert best(records, "conv2d:n=1", TARGET) == []
    assert best([rec(1, status=MeasureStatus.RUNTIME_ERROR)], WL, TARGET) == []


def test_cold_weight_timings_lead_and_are_never_ranked_with_warm_ones(tmp_path: Path) -> None:
    """A log tuned warm and then again with --cold-weights: its best is the best cold timing, though
    warm timings are faster (weights in cache); and the unit survives the log round trip."""
    records = [
        rec(1, (1.0, 1.0, 1.0)),
        rec(2, (0.5, 0.5, 0.5)),  # the fastest warm: not comparable with cold figures
        rec(3, (3.0, 3.0, 3.0), unit=CostUnit.COLD_SECONDS),
        rec(1, (2.0, 2.0, 2.0), unit=CostUnit.COLD_SECONDS),
    ]
    assert ranking_unit(records) is CostUnit.COLD_SECONDS
    assert [(r.index, r.cost) for r in best(records, WL, TARGET, k=3)] == [(1, 2.0), (3, 3.0)]
    assert [r.index for r in best(records, WL, TARGET, cost_unit=CostUnit.SECONDS)] == [2]
    log = TuningLog(tmp_path / "log.jsonl")
    log.append(records)
    units = [r.result.cost_unit for r in read_logs([tmp_path / "log.jsonl"])]
    assert units == [r.result.cost_unit for r in records]


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
    assert [r.index for r in best(TuningLog(a).read(), WL, TARGET)] == [1]


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
    done = measured(log.read(), WL, TARGET)
    assert sorted(done) == [1, 2]  # a board error is measured again; other workloads do not count
    assert done[1].time == 5.0  # the latest record
    assert measured(log.read(), WL, TARGET, board="pi4") == {}


def test_resume_takes_only_this_cpus_records(tmp_path: Path) -> None:
    """A shared log holds several machines' "local" boards: another cpu's costs are not this one's."""
    log = TuningLog(tmp_path / "log.jsonl")
    epyc, xeon = (("cpu", "AMD EPYC"),), (("cpu", "Intel Xeon"),)
    log.append(
        [replace(rec(1, (1.0,)), fingerprint=epyc), replace(rec(2, (1.0,)), fingerprint=xeon), rec(3, (1.0,))]
    )
    records = log.read()
    assert sorted(measured(records, WL, TARGET, cpu="AMD EPYC")) == [1, 3]  # no fingerprint: this cpu's
    assert sorted(measured(records, WL, TARGET, cpu="Intel Xeon")) == [2, 3]
    assert sorted(measured(records, WL, TARGET)) == [1, 2, 3]


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


# ---- what a board measured: logs of emulated boards, old and new ----------------------------------------

ARM_WL, ARM = "matmul:m=16,n=16,k=16", "arm-a72-neon"
# Fingerprints as the boards wrote them before cost_unit "none" existed (xtune/boards/board.py, ssh.py).
QEMU_FP = {
    "board": "qemu-aarch64",
    "target": ARM,
    "uname": "Linux 6.1.0 x86_64 (emulated aarch64)",
    "cpu": "qemu-aarch64 version 7.2.9 -cpu cortex-a72",
    "cores": "1",
    "agent": "a1",
    "cost": "instructions per call (insncount plugin)",
}
WRAPPER_FP = {
    "board": "pi-emu",
    "target": ARM,
    "uname": "Linux lab 6.1.0 #1 SMP x86_64 GNU/Linux",
    "cpu": "AMD EPYC (family 25, model 1)",
    "cores": "4",
    "agent": "a1",
    "wrapper": "qemu-aarch64 -cpu cortex-a72",
}
PI_FP = {
    "board": "pi4",
    "target": ARM,
    "uname": "Linux pi4 6.1.21-v8+ aarch64",
    "cpu": "Cortex-A72",
    "cores": "4",
    "agent": "a1",
}


def old_line(index: int, status: str, costs: list[float], unit: str, fp: dict[str, str]) -> str:
    """One log line as xtune wrote it before the CostUnit enum: failures always said "s"."""
    knobs = template_for(parse_workload(ARM_WL), get_target(ARM)).space.config(index).values
    return json.dumps(
        {
            "v": 1,
            "workload": ARM_WL,
            "target": ARM,
            "board": fp["board"],
            "fingerprint": [list(pair) for pair in fp.items()],
            "index": index,
            "knobs": [list(k) for k in knobs],
            "result": {
                "status": status,
                "costs": costs,
                "error": "" if status == "ok" else "bad",
                "compile_seconds": 0.1,
                "cost_unit": unit,
                "extra": [],
            },
            "options": {},
            "xtune": "0.1.0",
            "time": 1000.0 + index,
        }
    )


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.fixture
def qemu_log(tmp_path: Path) -> Path:
    return write_lines(
        tmp_path / "qemu.jsonl",
        [
            old_line(
                1, "compile_error", [], "s", QEMU_FP
            ),  # the first record failed: its "s" decides nothing
            old_line(2, "ok", [5000.0], "insn", QEMU_FP),
            old_line(3, "ok", [4000.0], "insn", QEMU_FP),
            old_line(4, "timeout", [], "s", QEMU_FP),
        ],
    )


@pytest.fixture
def wrapper_log(tmp_path: Path) -> Path:
    # qemu behind SSH timed emulated wall time: config 5 "ran at 0.3 GFLOP/s", which is no speed at all.
    return write_lines(
        tmp_path / "wrapper.jsonl",
        [
            old_line(5, "ok", [2.7e-5], "s", WRAPPER_FP),
            old_line(3, "ok", [9e-4], "s", WRAPPER_FP),
            old_line(6, "wrong_answer", [], "s", WRAPPER_FP),
        ],
    )


def test_an_old_qemu_log_whose_first_record_failed_still_has_a_best(qemu_log: Path) -> None:
    records = read_logs([qemu_log])
    assert [r.result.cost_unit for r in records] == [CostUnit.INSTRUCTIONS] * 4  # failures: the board's unit
    (row,) = summarize(records)
    assert row.cost_unit is CostUnit.INSTRUCTIONS and row.best is not None and row.best.index == 3
    assert "4000 insn" in format_table([row]) and "no correct run" not in format_table([row])
    out = subprocess.run(
        [sys.executable, "-m", "xtune.cli", "best", "--log", str(qemu_log), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["best"][0]["best"]["cost_unit"] == "insn"


def test_best_never_takes_a_wall_time_from_a_correctness_only_board(
    qemu_log: Path, wrapper_log: Path
) -> None:
    records = read_logs([qemu_log, wrapper_log])
    assert {r.result.cost_unit for r in records if r.board == "pi-emu"} == {CostUnit.NONE}
    assert [r.index for r in best(records, ARM_WL, ARM, k=5)] == [3, 2]  # counts; config 5's time is none
    (row,) = summarize(records)
    assert row.best is not None and row.best.index == 3 and row.best_gflops is None
    artifact = build(ARM, [ARM_WL], logs=[wrapper_log, qemu_log])  # what `xtune build` ships
    assert (artifact.kernels[0].source, artifact.kernels[0].config_index) == ("log", 3)
    # A wrapper board's log alone: correct configs, nothing to rank them by.
    (alone,) = summarize(read_logs([wrapper_log]))
    assert alone.best is None and alone.checked_only and "checked only" in format_table([alone])
    kernel = build(ARM, [ARM_WL], logs=[wrapper_log]).kernels[0]
    assert kernel.source == "default" and "correctness-only" in kernel.reason


def test_real_seconds_beat_instruction_counts_and_are_never_compared_with_them(qemu_log: Path) -> None:
    seconds = write_lines(
        qemu_log.with_name("pi.jsonl"),
        [
            old_line(7, "ok", [2e-3], "s", PI_FP),
            old_line(2, "ok", [1e-3], "s", PI_FP),
            old_line(8, "runtime_error", [], "s", PI_FP),
        ],
    )
    records = read_logs([qemu_log, seconds])
    assert ranking_unit(records) is CostUnit.SECONDS
    assert [r.index for r in best(records, ARM_WL, ARM, k=5)] == [2, 7]  # seconds only, in seconds order
    assert [r.index for r in best(records, ARM_WL, ARM, k=5, cost_unit=CostUnit.INSTRUCTIONS)] == [3, 2]
    (row,) = summarize(records)
    assert row.cost_unit is CostUnit.SECONDS and row.best_gflops is not None


def test_cycle_estimates_beat_instruction_counts_and_are_never_compared_with_them(qemu_log: Path) -> None:
    cycles_fp = {
        **QEMU_FP,
        "board": "qemu-aarch64-cycles",
        "cost": "cycles per call (llvm-mca 22 -mcpu=cortex-a72 over the plugin's blocks)",
    }
    lines = [
        old_line(3, "ok", [9000.0], "cycles", cycles_fp),
        old_line(2, "ok", [8000.0], "cycles", cycles_fp),
        old_line(5, "compile_error", [], "cycles", cycles_fp),
    ]
    cycles = write_lines(qemu_log.with_name("cycles.jsonl"), lines)
    records = read_logs([qemu_log, cycles])
    assert {r.result.cost_unit for r in records if r.board == "qemu-aarch64-cycles"} == {CostUnit.CYCLES}
    assert ranking_unit(records) is CostUnit.CYCLES
    assert [r.index for r in best(records, ARM_WL, ARM, k=5)] == [2, 3]  # by cycles: 8000 < 9000
    assert [r.index for r in best(records, ARM_WL, ARM, k=5, cost_unit=CostUnit.INSTRUCTIONS)] == [3, 2]
    (row,) = summarize(records)
    assert row.cost_unit is CostUnit.CYCLES and row.best_gflops is None
    assert "8000 cycles" in format_table([row])


def test_a_correctness_only_result_round_trips_as_none_and_has_no_figure() -> None:
    result = MeasureResult(MeasureStatus.OK, cost_unit=CostUnit.NONE)
    config = template_for(parse_workload(ARM_WL), get_target(ARM)).space.config(1)
    line = record_to_json(make_record(ARM_WL, ARM, "pi-emu", config, result, fingerprint=(("cores", "4"),)))
    assert json.loads(line)["result"]["cost_unit"] == "none"
    back = record_from_json(line)
    assert back.result == result and back.result.ok and back.cost == float("inf")
    assert ranking_unit([back]) is None and best([back], ARM_WL, ARM) == []


def test_a_vnni_target_shares_its_float_records_with_its_base_and_keeps_its_int8_ones() -> None:
    """A VNNI target runs its base target's float code: a float task's records are the base's, written
    and read (so a VNNI host resumes and builds from logs tuned as x86-avx512); an int8 task's are its own."""
    vnni, base = get_target("x86-avx512-vnni"), get_target("x86-avx512")
    matmul, qmatmul = parse_workload(WL), parse_workload("qmatmul:m=4,n=32,k=16")
    assert log_target(matmul, vnni) == log_target(matmul, base) == "x86-avx512"
    assert log_target(qmatmul, vnni) == "x86-avx512-vnni" and log_target(qmatmul, base) == "x86-avx512"
    template = template_for(matmul, vnni)
    logged = rec(3, (1e-3,), target="x86-avx512")
    logged = replace(logged, knobs=template.space.config(3).values)
    assert config_of(template, logged) is not None
    assert choose(matmul, vnni, template, [logged]).config.index == 3
    assert choose(
        matmul, get_target("x86-avx2"), template_for(matmul, get_target("x86-avx2")), [logged]
    ).source == ("default")
    int8 = template_for(qmatmul, vnni)
    as_base = replace(logged, workload=qmatmul.key, index=0, knobs=int8.space.config(0).values)
    assert config_of(int8, as_base) is None  # vpmaddwd code's record is not a vpdpbusd kernel's
    assert config_of(int8, replace(as_base, target="x86-avx512-vnni")) is not None


def test_a_float_record_logged_under_a_vnni_target_reads_as_its_base(tmp_path: Path) -> None:
    """Float tasks tuned with --target x86-avx512-vnni before their records were the base target's: their
    log still resumes and builds on both targets; an int8 record keeps its VNNI name."""
    vnni = get_target("x86-avx512-vnni")
    float_template = template_for(parse_workload(WL), vnni)
    int8_template = template_for(parse_workload("qmatmul:m=4,n=32,k=16"), vnni)
    ok = MeasureResult(MeasureStatus.OK, (1e-3,))
    log = TuningLog(tmp_path / "log.jsonl")
    log.append(
        [
            make_record(t.workload.key, vnni.name, "local", t.default_config(), ok)
            for t in (float_template, int8_template)
        ]
    )
    assert [r.target for r in read_logs([log.path])] == ["x86-avx512", "x86-avx512-vnni"]
