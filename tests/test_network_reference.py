"""Which reference a network check compares with (xtune/firmware/network_bench.py, `onnx_peer`): a
quantized network built for an ARM target is checked against ONNX Runtime's aarch64 build under
qemu-aarch64 on the target's core, what a user of that board compares with; without that build here, the
host's ONNX Runtime by the one-step rule, and the check's line says which it was. The network is
tests/test_qmlas.py's uint8 QDQ Add, whose seeded input meets pairs where the two builds' QLinearAdds
round apart on more than 0.1 % of the outputs."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import NO_ARM_PEERS, run_cli
from tests.networks import resnet_small
from tests.test_qmlas import ADDS, _qdq_add
from xtune.boards.board import get_board
from xtune.firmware import network_bench
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import bench_model, network_peer, tolerance
from xtune.target import get_target, host_cpu
from xtune.tuning.arm_peers import SETUP_HINT, peers_built

pytest.importorskip("onnxruntime")
BOARD = "qemu-aarch64"  # arm-a72-neon
STEP_RULE = "quantized: equal, or one step off on at most 0.1% of the outputs"


@pytest.fixture(scope="module")
def uint8_add(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if shutil.which("qemu-aarch64") is None:
        pytest.skip("needs qemu-aarch64")
    path, _ = _qdq_add(tmp_path_factory.mktemp("ref") / "uint8_add.onnx", "uint8")
    return path


@pytest.mark.board
def test_an_arm_boards_int8_check_is_onnx_runtime_aarch64s_exactly(uint8_add: Path) -> None:
    """`xtune bench --model` on the emulated A72: equal to ONNX Runtime's aarch64 output bit for bit."""
    if not peers_built():
        pytest.skip(NO_ARM_PEERS)
    proc = run_cli("bench", "--model", str(uint8_add), "--board", BOARD)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "matches ONNX Runtime (max abs error 0)" in proc.stdout
    reference = "ONNX Runtime's aarch64 build under qemu-aarch64 -cpu cortex-a72"
    assert f"  check  against {reference}; {STEP_RULE}\n" in proc.stdout


@pytest.mark.board
def test_without_the_aarch64_build_the_host_reference_says_so(
    uint8_add: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The arm64 root missing (as on a machine without scripts/arm_peers.sh): the host's ONNX Runtime by
    the one-step rule, which this Add exceeds, and the report names the reference and how to get the
    aarch64 one."""
    if host_cpu().arch == "aarch64":
        pytest.skip("this host's ONNX Runtime is the aarch64 build")
    monkeypatch.setattr(network_bench, "emulation_missing", lambda core: f"no arm64 Python: {SETUP_HINT}")
    report = bench_model(uint8_add, get_board(BOARD), repeat=0)
    assert not report.correct and report.error.startswith("124 of 65536 quantized outputs differ")
    assert report.check == (
        f"against ONNX Runtime on this host ({host_cpu().machine}), not its aarch64 build (no arm64 Python: "
        f"{SETUP_HINT}); {STEP_RULE}"
    )


def test_float_networks_and_other_targets_keep_the_host_reference(tmp_path: Path) -> None:
    """Only a quantized network built for an aarch64 target needs the aarch64 build."""
    here = f"ONNX Runtime on this host ({host_cpu().machine})"
    path, _ = _qdq_add(tmp_path / "uint8_add.onnx", "uint8")
    assert network_peer(path, get_target("x86-avx2")).reference == here
    assert network_peer(path, get_target("riscv64-gcv")).reference == here
    assert network_peer(resnet_small(), get_target("arm-a72-neon")).reference == here


def test_an_output_a_qoperator_node_writes_has_its_quantization(tmp_path: Path) -> None:
    """The QLinearAdd ONNX Runtime and xtune make of the QDQ Add writes the 8-bit output: its scale and zero
    point are the header's and the program's, and the output is checked by the one-step rule."""
    path, _ = _qdq_add(tmp_path / "uint8_add.onnx", "uint8")
    artifact = build_model(path, get_target("arm-a72-neon"))
    scale, zero = ADDS["uint8"][2]
    assert artifact.program.output_quant == (float(np.float32(scale)), zero)
    assert f"#define NET_OUTPUT_ZERO_POINT {zero}\n" in artifact.header
    assert tolerance(artifact) == STEP_RULE
