"""The per-step profile of a whole network (`build_model(profile=True)`, `profile_model`, `xtune bench
--model --profile`): the profile entry computes what the entry computes and writes one counter reading per
step, on the host and under qemu-aarch64; the profile names every step of the program in order with a
positive time and the log's standalone latency where the log has one; RISC-V and instruction-counting boards
are refused in one line, exit 2, nothing written."""

from __future__ import annotations

import json
import math
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import pytest

import xtune
from tests import networks
from tests.board_run import run_entry
from tests.test_artifact import _write_log
from xtune.boards.board import get_board
from xtune.cli import main
from xtune.codegen.compile import ObjectCode
from xtune.codegen.link import link_flat
from xtune.errors import InputError
from xtune.firmware.build import build_model
from xtune.firmware.entry import NetArtifact, step_label
from xtune.firmware.network_bench import random_input, run_network
from xtune.firmware.profile import profile_model
from xtune.firmware.program import program
from xtune.ops.workload import RTOL, compare_output
from xtune.tuning.measure import MeasureStatus
from xtune.tuning.peers import ort_network

pytest.importorskip("onnxruntime")
Capture = pytest.CaptureFixture[str]
# Kernel calls (conv2d, matmul) and generated operators (Transpose, MaxPool, GlobalAveragePool): every kind
# of step a profile stamps, in 16 steps; MobileNetV2's 55 (depthwise kernels beside them) take 3x the build.
NET = "resnet_small"


@cache
def model() -> onnx.ModelProto:
    return networks.NETWORKS[NET]()


@cache
def host_build() -> NetArtifact:
    """The plain build (no profile entry) for the host, built once for the tests that read it."""
    return build_model(model(), get_board("local").target)


def run_profile(board_name: str, artifact: NetArtifact) -> tuple[np.ndarray, np.ndarray]:
    """One call of the profile entry on the board: the output and the stamps."""
    obj = ObjectCode(artifact.target.name, artifact.target.arch, artifact.object, artifact.entry_points)
    x = random_input(artifact.program.input_shape)
    out = np.full(artifact.program.output_shape, np.nan, np.float32)
    workspace = np.zeros(max(64, artifact.workspace_bytes), np.uint8)
    stamps = np.zeros(len(artifact.program.calls) + 1, np.uint64)
    got = run_entry(board_name, link_flat(obj), artifact.profile_entry, [x, out, workspace, stamps])
    return got[1], got[3]


def test_the_profile_entry_computes_the_network_and_stamps_every_step_on_the_host() -> None:
    board = get_board("local")
    artifact = build_model(model(), board.target, profile=True)
    assert artifact.profile_entry in artifact.entry_points
    assert "net_profile" not in host_build().entry_points  # only when asked
    out, stamps = run_profile("local", artifact)
    plain, _ = run_network(board, artifact, random_input(artifact.program.input_shape))
    np.testing.assert_array_equal(out, plain)  # the same calls as the entry
    assert np.all(np.diff(stamps.astype(np.int64)) > 0)  # every step takes some ticks


def test_the_profile_entry_reads_the_counter_on_each_architecture(qemu_board: str) -> None:
    board = get_board(qemu_board)
    if board.target.arch == "riscv64":  # RDCYCLE traps in Linux user mode: refused, not built
        with pytest.raises(InputError, match="RDCYCLE traps in user mode"):
            build_model(model(), board.target, profile=True)
        return
    artifact = xtune.build_model(model(), board.target.name, profile=True)  # the library's entry
    out, stamps = run_profile(qemu_board, artifact)
    ref, _ = ort_network(model().SerializeToString(), random_input(artifact.program.input_shape))
    assert compare_output(out, ref, RTOL) == ""
    ticks = np.diff(stamps.astype(np.int64))
    assert np.all(ticks >= 0) and stamps[-1] > stamps[0]  # a coarse timer may not tick within a step


def test_the_profile_names_every_step_in_order_beside_the_logged_latency(tmp_path: Path) -> None:
    board = get_board("local")
    plain = host_build()
    task = next(k for k in plain.kernels if k.what.startswith("conv2d:"))
    log = tmp_path / "log.jsonl"
    _write_log(log, board.target.name, [(task.what, task.config_index, MeasureStatus.OK, 2.5e-6)])
    profile = profile_model(model(), board, logs=[log], runs=3)
    assert [s.label for s in profile.steps] == [step_label(c) for c in plain.program.calls]
    assert [s.index for s in profile.steps] == list(range(len(plain.program.calls)))
    assert all(math.isfinite(s.seconds) and s.seconds > 0 for s in profile.steps)
    assert profile.seconds > 0 and profile.ticks_per_second > 0 and profile.runs == 3
    logged = [s for s in profile.steps if s.standalone is not None]
    assert logged and all(s.what == task.what and s.standalone == 2.5e-6 for s in logged)
    assert profile.estimate == pytest.approx(2.5e-6 * len(logged))
    assert all(s.ratio is None for s in profile.steps if s.what != task.what)


def test_cli_bench_profile_prints_and_emits_every_step(tmp_path: Path, capsys: Capture) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(model(), path)
    assert main(["bench", "--model", str(path), "--profile", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    calls = len(host_build().program.calls)
    assert report["correct"] and len(report["profile"]["steps"]) == calls
    assert all(s["seconds"] > 0 and s["standalone_seconds"] is None for s in report["profile"]["steps"])
    assert main(["bench", "--model", str(path), "--profile"]) == 0
    lines = capsys.readouterr().out.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("profile:"))
    assert f"{calls} steps" in lines[first]
    assert len(lines) == first + 2 + calls  # the heading, a row per step (no log: no tuned-steps line)


def test_cli_build_profile_declares_the_entry_and_its_stamps(tmp_path: Path, capsys: Capture) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(model(), path)
    files = ["-o", str(tmp_path / "net.o"), "--header", str(tmp_path / "net.h")]
    assert main(["build", "--model", str(path), "--target", "arm-a72-neon", "--profile", *files]) == 0
    capsys.readouterr()
    header = (tmp_path / "net.h").read_text()
    calls = len(program(model()).calls)  # the calls any target's build makes (build_model's program)
    assert "int net_profile(const float *input, float *output, void *workspace, uint64_t *stamps);" in header
    assert f"#define NET_PROFILE_STAMPS {calls + 1}u" in header and "CNTVCT_EL0" in header


def refused(args: list[str], expected: str, tmp: Path, capsys: Capture) -> None:
    before = sorted(tmp.iterdir())
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("xtune: error:") and expected in err, err
    assert sorted(tmp.iterdir()) == before


def test_profiles_xtune_cannot_take_are_one_line_exit_2(tmp_path: Path, capsys: Capture) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(model(), path)
    files = ["-o", str(tmp_path / "net.o"), "--header", str(tmp_path / "net.h")]
    build = ["build", "--model", str(path), "--target", "riscv64-gcv", "--profile", *files]
    refused(build, "riscv64-gcv: a profile build needs a user-mode cycle or time counter", tmp_path, capsys)
    bench = ["bench", "--model", str(path), "--board", "qemu-aarch64", "--profile"]
    refused(bench, "qemu-aarch64: --profile times steps in wall time", tmp_path, capsys)
    kernel = ["bench", "--workload", "matmul:m=8,n=8,k=8", "--profile"]
    refused(kernel, "--profile times the steps of a whole network (--model)", tmp_path, capsys)
    kernels = ["build", "--workload", "matmul:m=8,n=8,k=8", "--target", "x86-avx2", "--profile", *files]
    refused(kernels, "--profile is for --model builds", tmp_path, capsys)
