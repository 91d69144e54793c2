"""The command-line contract: --json prints one object on stdout; user mistakes are one line, exit 2."""

from __future__ import annotations

import json

import pytest

from tests.conftest import CliRunner


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
