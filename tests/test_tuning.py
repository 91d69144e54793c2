"""Tuning on the local board end to end: the log, resume, Ctrl-C, and the best/report commands."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import CliRunner, interrupt_cli
from xtune.boards.board import LocalBoard, QemuBoard, get_board
from xtune.boards.cost import CostUnit
from xtune.cli.progress import _ProgressBar
from xtune.errors import InputError
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.template import ScheduleTemplate
from xtune.target import get_target
from xtune.transfer.modelfile import Manifest
from xtune.tuning.database import Record, TuningLog, log_target, make_record, read_logs
from xtune.tuning.kernel_bench import BenchReport
from xtune.tuning.loop import TuneProgress
from xtune.tuning.measure import MeasureResult, MeasureStatus
from xtune.tuning.options import MeasureOptions, TuneOptions
from xtune.tuning.ranking import best, leaders
from xtune.tuning.run import Confirmation, TuningReport, run_tuning
from xtune.tuning.session import _confirm

WORKLOAD = "matmul:m=64,n=48,k=40"
QUICK = MeasureOptions(repeat=2, min_repeat_ms=2.0, timeout_ms=2000)


@pytest.fixture(scope="module")
def tuned_log(tmp_path_factory: pytest.TempPathFactory, xtune_cli: CliRunner) -> Path:
    path = tmp_path_factory.mktemp("tune") / "log.jsonl"
    out = xtune_cli(
        "tune",
        "--workload",
        WORKLOAD,
        "--trials",
        "12",
        "--batch-size",
        "4",
        "--log",
        str(path),
        "--repeat",
        "2",
        "--min-repeat-ms",
        "2",
        "--json",
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    path.with_name("report.json").write_text(out.stdout)
    assert report["trials"] == 12 and report["counts"]["ok"] == 12
    assert report["best_gflops"] > 0 and report["numpy_gflops"] > 0
    assert len(report["curve_gflops"]) == 12
    assert report["curve_gflops"] == sorted(report["curve_gflops"])  # best so far never drops
    return path


def test_every_trial_is_in_the_log_and_best_is_the_fastest_correct(tuned_log: Path) -> None:
    records = read_logs([tuned_log])
    report = json.loads(tuned_log.with_name("report.json").read_text())
    assert len(records) == 12 + report["confirm_timings"] and len({r.index for r in records}) == 12
    assert {r.target for r in records} == {log_target(parse_workload(WORKLOAD), get_board("local").target)}
    assert all(dict(r.fingerprint) for r in records)  # the board fingerprint travels with every record
    # Each config's speed is the median of its timings; the leaders were timed again to settle it.
    timings: dict[int, list[float]] = {}
    for r in records:
        timings.setdefault(r.index, []).append(r.cost)
    medians = {i: sorted(t)[(len(t) - 1) // 2] for i, t in timings.items()}
    leaders = sorted(medians, key=medians.__getitem__)[:3]
    # Every leader has three timings, unless near-ties kept replacing leaders until the budget ran out.
    assert all(len(timings[i]) == 3 for i in leaders) or report["confirm_timings"] == 12
    assert report["best_config"]["index"] == leaders[0] and report["best_timings"] == len(timings[leaders[0]])
    assert report["best_cost"] == medians[leaders[0]]
    shipped = best(TuningLog(tuned_log).read(), parse_workload(WORKLOAD).key, records[0].target)[0]
    assert (shipped.index, shipped.cost) == (leaders[0], medians[leaders[0]])  # what `xtune build` ships


def test_resume_learns_from_the_log_and_measures_only_new_configs(tuned_log: Path, tmp_path: Path) -> None:
    log_copy = tmp_path / "log.jsonl"
    log_copy.write_text(tuned_log.read_text())
    board = get_board("local")
    before = len(read_logs([tuned_log]))
    options = TuneOptions(tuner="xgb", trials=8, batch_size=4, seed=1, measure=QUICK, confirm=0)
    report = run_tuning(parse_workload(WORKLOAD), [board], options, TuningLog(log_copy))
    assert report.resumed == 12 and report.trials == 8 and report.confirm_timings == 0
    # The best of a run that was asked not to confirm says so, not just "timed once".
    assert report.confirmation in (Confirmation.CONFIRMED, Confirmation.OFF)
    if report.best_timings < 3:
        assert report.timings_text().endswith("confirmation is off (--confirm 0)")
    indices = [r.index for r in read_logs([log_copy])[before:]]
    assert len(indices) == 8 == len(set(indices) - {r.index for r in read_logs([tuned_log])})


def test_best_and_report_commands(tuned_log: Path, tmp_path: Path, xtune_cli: CliRunner) -> None:
    out = xtune_cli("best", "--log", str(tuned_log), "--workload", "matmul:k=40,m=64,n=48", "--json")
    assert out.returncode == 0, out.stderr
    (row,) = json.loads(out.stdout)["best"]
    assert row["trials"] == 12 and row["failed"] == 0 and row["best"]["gflops"] > 0
    table = xtune_cli("report", str(tuned_log))
    assert table.returncode == 0 and WORKLOAD in table.stdout and "GFLOP/s" in table.stdout
    pytest.importorskip("matplotlib")
    png = tmp_path / "curve.png"
    assert xtune_cli("report", str(tuned_log), "--plot", str(png)).returncode == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ctrl_c_stops_cleanly_with_the_log_intact(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    out = interrupt_cli(
        "tune",
        "--workload",
        "matmul:m=96,n=96,k=96",
        "--trials",
        "400",
        "--batch-size",
        "4",
        "--log",
        str(log),
        "--repeat",
        "2",
        "--min-repeat-ms",
        "5",
        log=log,
    )
    stdout, stderr = out.stdout, out.stderr
    assert out.returncode == 130, stderr
    assert "Traceback" not in stderr
    assert "best config" in stdout  # the best so far is printed
    records = read_logs([log])  # every line parses: nothing torn
    assert 8 <= len(records) < 400


def test_boards_of_different_targets_cannot_share_a_run(xtune_cli: CliRunner) -> None:
    out = xtune_cli(
        "tune", "--workload", WORKLOAD, "--board", "local", "--board", "qemu-aarch64", "--trials", "1"
    )
    assert out.returncode == 2 and "same target" in out.stderr


class _OtherCpu(LocalBoard):
    """This host, reporting another cpu: a stand-in for a second machine's board of the same target."""

    def fingerprint(self) -> dict[str, str]:
        return {**super().fingerprint(), "cpu": f"other cpu of {self.name}"}


def test_two_boards_of_one_target_share_a_run_and_each_record_names_its_board(tmp_path: Path) -> None:
    target = get_board("local").target
    boards = [LocalBoard(target, "local"), _OtherCpu(target, "local-2")]
    log = TuningLog(tmp_path / "log.jsonl")
    options = TuneOptions(tuner="random", trials=8, batch_size=4, measure=QUICK, confirm=0)
    report = run_tuning(parse_workload(WORKLOAD), boards, options, log)
    assert report.trials == 8 and dict(report.counts)["ok"] == 8
    records = log.read()
    # Each record carries the name and fingerprint of the board that measured it: per-machine resume and
    # training group by that fingerprint's cpu.
    assert {(r.board, dict(r.fingerprint)["board"]) for r in records} == {
        ("local", "local"),
        ("local-2", "local-2"),
    }
    assert {dict(r.fingerprint)["cpu"] for r in records if r.board == "local-2"} == {"other cpu of local-2"}
    # Resuming on the second machine alone learns from what it measured, not from the first one's timings.
    resumed = run_tuning(parse_workload(WORKLOAD), boards[1:], replace(options, trials=1), log)
    assert resumed.resumed == sum(r.board == "local-2" for r in records) == 4


def test_tune_refuses_a_correctness_only_board_in_one_line(tmp_path: Path, xtune_cli: CliRunner) -> None:
    boards = tmp_path / "boards.toml"  # qemu behind SSH: never contacted, the refusal comes first
    boards.write_text(
        '[boards.emu]\nhost = "127.0.0.1"\ntarget = "arm-a72-neon"\n'
        'wrapper = "qemu-aarch64 -cpu cortex-a72"\n'
    )
    out = xtune_cli(
        "tune",
        "--workload",
        WORKLOAD,
        "--board",
        "emu",
        "--boards",
        str(boards),
        "--log",
        str(tmp_path / "log.jsonl"),
    )
    assert out.returncode == 2 and out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1 and "correctness only" in out.stderr, out.stderr
    assert not (tmp_path / "log.jsonl").exists()
    emulated = QemuBoard("qemu-aarch64", get_target("arm-a72-neon"), CostUnit.NONE)
    with pytest.raises(InputError, match="correctness only"):
        run_tuning(parse_workload(WORKLOAD), [emulated], TuneOptions(trials=1))


@pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="needs qemu-user")
def test_an_instruction_counting_run_says_its_best_is_an_exact_count(tmp_path: Path) -> None:
    board = get_board("qemu-aarch64")
    options = TuneOptions(tuner="random", trials=3, batch_size=3, measure=QUICK)
    report = run_tuning(parse_workload("matmul:m=8,n=8,k=8"), [board], options, TuningLog(tmp_path / "l"))
    assert report.cost_unit is CostUnit.INSTRUCTIONS and report.confirm_timings == 0
    assert report.confirmation is Confirmation.EXACT and report.best_gflops is None
    assert report.timings_text() == "an exact count" and "timed once" not in report.timings_text()


def _logged_as(template: ScheduleTemplate) -> str:
    """The target name the template's records carry in a log."""
    return log_target(template.workload, template.target)


def _local_record(template: ScheduleTemplate, index: int, result: MeasureResult) -> Record:
    """The log record of `template`'s config `index` measured on the local board."""
    return make_record(
        template.workload.key, _logged_as(template), "local", template.space.config(index), result
    )


def test_confirm_times_a_lucky_leader_again_until_medians_decide() -> None:
    """The logic of the end-of-run confirmation, on made-up timings: config 0's one timing was lucky."""
    template = template_for(parse_workload(WORKLOAD), get_board("local").target)
    typical = {0: 3.0, 1: 2.0, 2: 2.5, 3: 4.0}
    first = {0: 1.0, 1: 2.0, 2: 2.5, 3: 4.0}
    records = [_local_record(template, i, MeasureResult(MeasureStatus.OK, (c,))) for i, c in first.items()]
    rounds: list[list[int]] = []

    def measure(batch: list[int]) -> list[MeasureResult]:
        rounds.append(batch)
        return [MeasureResult(MeasureStatus.OK, (typical[i],)) for i in batch]

    def keep(batch: Sequence[int], results: Sequence[MeasureResult]) -> None:
        records.extend(_local_record(template, i, r) for i, r in zip(batch, results, strict=True))

    _confirm(lambda: records, template, CostUnit.SECONDS, 2, measure, keep)
    # 0 and 1 lead; after two rounds 0's median is its typical 3.0, so 2 moves up and is timed twice.
    assert rounds == [[0, 1], [0, 1], [2], [2]]
    top = best(records, template.workload.key, _logged_as(template), k=2)
    assert [(r.index, r.cost) for r in top] == [(1, 2.0), (2, 2.5)]


def test_confirm_keeps_its_promise_when_leaders_keep_changing() -> None:
    """Every config's first timing is lucky; the lead changes each time one is timed again, past the
    budget of the first leaders. The run's best must still be a median of three timings."""
    template = template_for(parse_workload(WORKLOAD), get_board("local").target)
    first = {0: 1.0, 1: 1.1, 2: 1.2, 3: 1.3, 4: 1.4}
    typical = {i: 5.0 + i for i in first}
    records = [_local_record(template, i, MeasureResult(MeasureStatus.OK, (c,))) for i, c in first.items()]

    def measure(batch: list[int]) -> list[MeasureResult]:
        return [MeasureResult(MeasureStatus.OK, (typical[i],)) for i in batch]

    def keep(batch: Sequence[int], results: Sequence[MeasureResult]) -> None:
        records.extend(_local_record(template, i, r) for i, r in zip(batch, results, strict=True))

    _confirm(lambda: records, template, CostUnit.SECONDS, 1, measure, keep)
    (leader,) = leaders(records, template.workload.key, _logged_as(template))
    top, timings = leader.record, leader.timings
    assert timings == 3 and top.cost == typical[top.index]


def test_confirm_gives_up_on_a_config_whose_timings_keep_failing() -> None:
    template = template_for(parse_workload(WORKLOAD), get_board("local").target)
    records = [_local_record(template, 0, MeasureResult(MeasureStatus.OK, (1.0,)))]
    tried: list[int] = []

    def measure(batch: list[int]) -> list[MeasureResult]:
        tried.extend(batch)
        return [MeasureResult(MeasureStatus.TIMEOUT) for _ in batch]

    def keep(batch: Sequence[int], results: Sequence[MeasureResult]) -> None:
        records.extend(_local_record(template, i, r) for i, r in zip(batch, results, strict=True))

    _confirm(lambda: records, template, CostUnit.SECONDS, 3, measure, keep)
    assert tried == [0] * 4  # twice the two timings it needed, then the run goes on


def test_the_progress_bar_reads_the_boards_unit_not_the_first_result() -> None:
    failed = MeasureResult(MeasureStatus.COMPILE_ERROR, error="x", cost_unit=CostUnit.INSTRUCTIONS)
    counted = MeasureResult(MeasureStatus.OK, (4000.0,), cost_unit=CostUnit.INSTRUCTIONS)
    progress = TuneProgress((1, 2), (failed, counted), 2, 4, 2, 4000.0, 0)
    bar = _ProgressBar(4, 2 * 8 * 8 * 8, None, CostUnit.INSTRUCTIONS)
    bar.update(progress)
    postfix = str(bar.bar.postfix)
    bar.close()
    assert "GFLOP/s" not in postfix and "4000 insn" in postfix and "failed=1" in postfix


@pytest.mark.parametrize("record", [TuneOptions, TuningReport, BenchReport, Manifest, MeasureOptions])
def test_wide_records_take_keywords_only(record: type) -> None:
    """A positional slip (trials where batch_size was meant) cannot compile into a wrong run."""
    with pytest.raises(TypeError, match="positional"):
        record("xgb", 64, 16)


def test_the_xgb_first_batch_holds_the_default_even_when_not_measured_first() -> None:
    """start_from_default=False (search-efficiency benchmarks) still leaves the default in the xgb tuner's
    first batch: it is a seed config of the model tuner itself."""
    workload = parse_workload("conv2d:n=1,c=5,h=9,w=11,k=13,r=3,s=3,stride=2,pad=1")
    board = get_board("local")
    default = template_for(workload, board.target).default_config().index
    batches: list[tuple[int, ...]] = []
    options = TuneOptions(
        tuner="xgb", trials=4, batch_size=4, seed=3, measure=QUICK, start_from_default=False, confirm=0
    )
    run_tuning(workload, [board], options, None, lambda progress: batches.append(progress.batch))
    assert default in batches[0]
