"""The command-line contract: --json prints one object on stdout; user mistakes are one line, exit 2."""

from __future__ import annotations

import errno
import gzip
import json
import os
import stat
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from xtune.cli import main
from xtune.firmware.kernels import MAX_STACK_BYTES
from xtune.ops.registry import parse_workload, template_for
from xtune.target import get_target
from xtune.tuning.database import make_record, record_to_json
from xtune.tuning.measure import MeasureResult, MeasureStatus


def xtune(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xtune.cli", *args], capture_output=True, text=True, timeout=300
    )


def test_targets_lists_all_five_and_marks_the_host(xtune_cli: CliRunner) -> None:
    out = xtune_cli("targets", "--json")
    assert out.returncode == 0
    data = json.loads(out.stdout)
    names = {t["name"] for t in data["targets"]}
    assert {"x86-avx2", "arm-a72-neon", "arm-a53-neon", "riscv64-gc", "riscv64-gcv"} <= names
    assert data["host"] in names


def test_bench_json_is_one_object_with_both_measurements(xtune_cli: CliRunner) -> None:
    out = xtune_cli("bench", "--workload", "matmul:m=96,n=80,k=72", "--json")
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)  # exactly one JSON document, nothing else on stdout
    assert report["correct"] is True and report["status"] == "ok"
    assert report["gflops"] > 0 and report["numpy_gflops"] > 0
    assert report["ratio_vs_numpy"] == pytest.approx(report["gflops"] / report["numpy_gflops"], rel=1e-2)
    assert report["config_source"] == "default"


@pytest.mark.parametrize(
    "args",
    [
        ("bench", "--workload", "conv:m=1"),
        ("bench", "--workload", "matmul:m=0,n=1,k=1"),
        ("bench", "--workload", "matmul:m=4,n=4,k=4", "--board", "no-such-board"),
        ("bench", "--workload", "matmul:m=4,n=4,k=4", "--config", "-1"),
        ("bench",),
        ("frobnicate",),
    ],
)
def test_user_mistakes_are_one_line_and_exit_2(args: tuple[str, ...], xtune_cli: CliRunner) -> None:
    out = xtune_cli(*args)
    assert out.returncode == 2
    assert out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr


# ---- input validation: each case a new user hit (one line, exit 2, nothing written) ----------------------

WL, TARGET = "matmul:m=8,n=8,k=8", "x86-avx2"


def run_main(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    """`xtune ARGV` in this process (faster than a subprocess): status, stdout, stderr."""
    try:
        status = main(argv)
    except SystemExit as e:  # argparse's usage errors
        status = int(e.code or 0)
    out = capsys.readouterr()
    return status, out.out, out.err


def refused(status: int, err: str, *words: str) -> bool:
    lines = err.strip().splitlines()
    return status == 2 and len(lines) == 1 and "Traceback" not in err and all(w in lines[0] for w in words)


def good_log(path: Path, indices: Sequence[int] = (3, 7, 11)) -> list[str]:
    """A log of OK records of WL on TARGET, the fastest last; returns its lines."""
    template = template_for(parse_workload(WL), get_target(TARGET))
    lines = [
        record_to_json(
            make_record(
                WL,
                TARGET,
                "local",
                template.space.config(i),
                MeasureResult(MeasureStatus.OK, (1e-6 * (len(indices) - n),)),
            )
        )
        for n, i in enumerate(indices)
    ]
    path.write_text("\n".join(lines) + "\n")
    return lines


@pytest.mark.parametrize(
    ("workload", "words"),
    [
        ("conv2d:n=17,c=3,h=16,w=9223372036854775808,k=3,r=5,s=3", ["'w' is 9223372036854775808"]),
        ("conv2d:n=17,c=3,h=16,w=9,k=18446744073709551616,r=5,s=3", ["'k' is 18446744073709551616"]),
        ("matmul:m=100000,n=100000,k=100000", ["tensor 'A'", "10000000000 elements"]),
        ("matmul:m=16,n=16,k=16,m=8", ["'m' is given twice"]),
    ],
)
def test_an_overflowing_or_lenient_workload_builds_nothing(
    workload: str, words: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    obj, hdr = tmp_path / "k.o", tmp_path / "k.h"
    status, _, err = run_main(
        ["build", "--target", "x86-avx512", "--workload", workload, "-o", str(obj), "--header", str(hdr)],
        capsys,
    )
    assert refused(status, err, *words), err
    assert not obj.exists() and not hdr.exists()
    if "100000" in workload:  # refused before anything allocates its 74.5 GiB
        status, _, err = run_main(["bench", "--workload", workload], capsys)
        assert refused(status, err, "tensor 'A'"), err


def test_outputs_are_checked_before_building_and_replace_only_regular_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log.jsonl"
    good_log(log)
    build = ["build", "--target", TARGET, "--workload", WL]
    folder, fifo = tmp_path / "folder", tmp_path / "fifo"
    folder.mkdir()
    os.mkfifo(fifo)
    for obj, hdr, words in [
        (folder, tmp_path / "k.h", ["object", "a directory"]),
        (tmp_path / "missing" / "k.o", tmp_path / "k.h", ["object", "no directory"]),
        (tmp_path / "k.o", fifo, ["header", "a FIFO"]),
        (
            tmp_path / "k.o",
            tmp_path / "k.o",
            ["the header", "is the object", "may not be an input or another"],
        ),
    ]:
        status, _, err = run_main([*build, "-o", str(obj), "--header", str(hdr)], capsys)
        assert refused(status, err, *words), err
        assert not (tmp_path / "k.o").exists() and not (tmp_path / "k.h").exists()
    status, _, err = run_main(["model", "train", str(log), "-o", str(fifo)], capsys)
    assert refused(status, err, "model file", "a FIFO") and stat.S_ISFIFO(os.stat(fifo).st_mode)
    status, _, err = run_main(["tune", "--workload", WL, "--log", str(folder)], capsys)
    assert refused(status, err, "log", "a directory"), err
    # A file that is there is replaced whole (atomically), keeping its permissions.
    (tmp_path / "k.h").write_text("old")
    (tmp_path / "k.h").chmod(0o640)
    status, _, err = run_main(
        [*build, "-o", str(tmp_path / "k.o"), "--header", str(tmp_path / "k.h")], capsys
    )
    assert status == 0, err
    assert (tmp_path / "k.h").read_text().startswith("/* Generated by xtune")
    assert stat.S_IMODE(os.stat(tmp_path / "k.h").st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "folder", "k.h", "k.o", "log.jsonl"]


@pytest.mark.skipif(os.geteuid() != 0, reason="making a character device needs root")
def test_a_device_node_stays_a_device(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`xtune model train LOG -o /dev/full` made the device node a regular file (here: a private node)."""
    log, full = tmp_path / "log.jsonl", tmp_path / "full"
    good_log(log)
    os.mknod(full, 0o666 | stat.S_IFCHR, os.makedev(1, 7))
    build = ["build", "--target", TARGET, "--workload", WL, "-o", str(full), "--header", str(tmp_path / "h")]
    for argv in (
        ["model", "train", str(log), "-o", str(full)],
        ["report", str(log), "--plot", str(full)],
        build,
    ):
        status, _, err = run_main(argv, capsys)
        assert refused(status, err, str(full), "a character device"), err
        assert stat.S_ISCHR(os.stat(full).st_mode)


@pytest.mark.parametrize(
    "argv",
    [
        ["tune", "--workload", WL, "--repeat", "5000"],
        ["tune", "--workload", WL, "--repeat", "0"],
        ["tune", "--workload", WL, "--timeout-ms", "0"],
        ["tune", "--workload", WL, "--min-repeat-ms", "nan"],
        ["tune", "--workload", WL, "--trials", "0"],
        ["tune", "--workload", WL, "--seed", "-1"],
        ["model", "train", "x.jsonl", "-o", "m.json", "--threads", str(2**64)],
        ["bench", "--workload", WL, "--config", "-1"],
        ["boards", "--timeout", "inf"],
    ],
)
def test_a_flag_out_of_range_is_a_usage_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    status, _, err = run_main(argv, capsys)
    assert refused(status, err, f"argument {argv[-2]}"), err


def test_tuning_with_cold_weights_logs_its_own_unit_and_refuses_a_counting_board(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--cold-weights on the host: every timing is logged as "s-cold" with the option beside it, and
    `best` ranks by it; on an instruction-counting board there is no cache to evict, one line, exit 2,
    nothing logged."""
    log = tmp_path / "log.jsonl"
    argv = ["tune", "--workload", "conv2d:n=1,c=8,h=8,w=8,k=16,r=3,s=3,pad=1", "--log", str(log)]
    status, _, err = run_main([*argv, "--trials", "3", "--repeat", "2", "--cold-weights"], capsys)
    assert status == 0, err
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert lines and {line["result"]["cost_unit"] for line in lines} == {"s-cold"}
    assert all(line["options"]["cold_weights"] for line in lines)
    status, out, err = run_main(["best", "--log", str(log), "--json"], capsys)
    assert status == 0 and json.loads(out)["best"][0]["best"]["cost_unit"] == "s-cold", err
    status, _, err = run_main([*argv, "--trials", "2", "--board", "qemu-aarch64", "--cold-weights"], capsys)
    assert refused(status, err, "--cold-weights", "timing board"), err
    assert len(log.read_text().splitlines()) == len(lines)


def test_records_a_build_cannot_use_are_skipped_with_a_warning_and_best_shows_what_build_takes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "log.jsonl"
    lines = good_log(log)
    template = template_for(parse_workload(WL), get_target(TARGET))
    fastest = json.loads(lines[-1])
    bad = []
    cases = [
        ("workload", "conv9:m=1"),
        ("index", -1),
        ("knobs", [["tile", "99x99"]]),
        ("target", 5),
        ("index", template.space.size),
    ]
    for key, value in cases:
        record = {
            **fastest,
            key: value,
            "result": {**fastest["result"], "costs": [1e-9]},
        }  # "faster" than all
        bad.append(json.dumps(record))
    log.write_text("\n".join(bad + lines) + "\n")
    status, out, err = run_main(["best", "--log", str(log), "--json"], capsys)
    assert status == 0
    (warning,) = err.splitlines()  # one line for the file, naming it and the lines
    assert (
        warning.startswith(f"xtune: warning: {log}: skipped 5 record(s)")
        and "(line 1, 2, 3, 4, 5)" in warning
    )
    (row,) = json.loads(out)["best"]
    assert row["best"]["index"] == fastest["index"]
    outputs = ["-o", str(tmp_path / "k.o"), "--header", str(tmp_path / "k.h")]
    status, out, err = run_main(
        ["build", "--target", TARGET, "--workload", WL, "--log", str(log), "--json", *outputs], capsys
    )
    assert status == 0, err
    assert json.loads(out)["kernels"][0]["config"] == row["best"]["index"]


@pytest.mark.parametrize(
    ("content", "words"),
    [
        (gzip.compress(b"\x00" * 100, mtime=0), ["skipped a torn last line"]),
        (b"\xff\xfe\x00binary", ["skipped a torn last line"]),
        (b"[" * 100_000, ["skipped a torn last line"]),
    ],
)
def test_junk_logs_are_one_line_each(
    content: bytes, words: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    log = tmp_path / "junk.jsonl"
    log.write_bytes(content)
    for argv in (["best", "--log", str(log)], ["report", str(log)]):
        status, _, err = run_main(argv, capsys)
        warning, error = err.splitlines()
        assert status == 2 and all(w in warning for w in words) and str(log) in warning
        assert error.startswith("xtune: error: no ") and str(log) in error


def test_a_gzip_log_by_any_name_is_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    plain, packed = tmp_path / "plain.jsonl", tmp_path / "packed.jsonl"
    good_log(plain)
    packed.write_bytes(gzip.compress(plain.read_bytes()))
    assert (
        run_main(["best", "--log", str(packed)], capsys)[1]
        == run_main(["best", "--log", str(plain)], capsys)[1]
    )
    status, _, err = run_main(["tune", "--workload", WL, "--log", str(packed)], capsys)
    assert refused(status, err, "compressed log"), err


def test_a_missing_log_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["report", "missing.jsonl"], ["best", "--log", "missing.jsonl"]):
        status, _, err = run_main(argv, capsys)
        assert refused(status, err, "no such log: missing.jsonl"), err


def test_plot_is_written_to_the_name_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    log, plot = tmp_path / "log.jsonl", tmp_path / "curve"
    good_log(log)
    status, _, err = run_main(["report", str(log), "--plot", str(plot)], capsys)
    assert status == 0 and f"plot written to {plot}\n" in err
    assert plot.read_bytes().startswith(b"\x89PNG") and not plot.with_suffix(".png").exists()


def test_a_kernel_needing_more_stack_than_allowed_is_not_built(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wl = "matmul:m=1024,n=1024,k=1024"
    template = template_for(parse_workload(wl), get_target(TARGET))
    index = template.space.size - 1  # mc = nc = kc = 1024, both panels packed: 8.4 MB
    record = make_record(
        wl, TARGET, "local", template.space.config(index), MeasureResult(MeasureStatus.OK, (1.0,))
    )
    log = tmp_path / "log.jsonl"
    log.write_text(record_to_json(record) + "\n")
    outputs = ["-o", str(tmp_path / "k.o"), "--header", str(tmp_path / "k.h")]
    status, _, err = run_main(
        ["build", "--target", TARGET, "--workload", wl, "--log", str(log), *outputs], capsys
    )
    assert refused(status, err, f"config {index}", "bytes of stack", str(MAX_STACK_BYTES)), err
    assert not (tmp_path / "k.o").exists()


def test_help_says_trials_are_new_trials() -> None:
    out = xtune("tune", "--help")
    help_text = " ".join(out.stdout.split())
    assert "new trials to measure in this run" in help_text and "resumed" in help_text


def test_the_firmware_docs_show_the_shipped_build_files() -> None:
    """docs/firmware.md's Makefile and CMake blocks are the shipped examples, so that a copy works."""
    root = Path(__file__).resolve().parent.parent
    docs = (root / "docs" / "firmware.md").read_text()
    blocks = {lang: [b.split("```")[0] for b in docs.split(f"```{lang}\n")[1:]] for lang in ("make", "cmake")}
    cmake = (root / "examples" / "firmware" / "CMakeLists.txt").read_text()
    assert cmake[cmake.index("cmake_minimum_required") :] == blocks["cmake"][0]
    assert blocks["make"][0] in (root / "examples" / "firmware" / "Makefile").read_text()


def test_a_disk_full_while_writing_leaves_the_old_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The header cannot be written (ENOSPC on its fsync): the old object and header stay, both of them."""
    obj, hdr = tmp_path / "k.o", tmp_path / "k.h"
    obj.write_text("old object")
    hdr.write_text("old header")
    real_fsync, calls = os.fsync, []

    def fsync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    argv = ["build", "--target", TARGET, "--workload", WL, "-o", str(obj), "--header", str(hdr)]
    status, _, err = run_main(argv, capsys)
    assert refused(status, err, "cannot write the header", "No space left on device"), err
    assert obj.read_text() == "old object" and hdr.read_text() == "old header"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["k.h", "k.o"]  # no partial file left behind


@pytest.mark.host_runs("x86-avx512-vnni")
def test_tuning_on_a_vnni_target_logs_float_tasks_as_its_base_and_int8_ones_as_itself(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A float task tuned on x86-avx512-vnni resumes from (and adds to) x86-avx512's records; an int8 task's
    records are the VNNI target's own."""
    log = tmp_path / "log.jsonl"
    budget = ["--trials", "2", "--batch-size", "2", "--confirm", "0", "--log", str(log), "--json"]
    for target in ("x86-avx512", "x86-avx512-vnni"):
        status, out, err = run_main(["tune", "--workload", WL, "--target", target, *budget], capsys)
        assert status == 0, err
    assert json.loads(out)["resumed"] == 2  # the first run's records, logged as x86-avx512
    status, _, err = run_main(
        ["tune", "--workload", "qmatmul:m=4,n=32,k=16", "--target", "x86-avx512-vnni", *budget], capsys
    )
    assert status == 0, err
    targets = [json.loads(line)["target"] for line in log.read_text().splitlines()]
    assert targets == ["x86-avx512"] * 4 + ["x86-avx512-vnni"] * 2
