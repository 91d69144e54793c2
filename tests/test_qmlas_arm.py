"""ONNX Runtime's aarch64 QLinearAdd (MLAS's NEON kernel, in fixed point; xtune/ops/qmlas.py) on xtune's
ARM targets: MLAS's fixed-point parameters, the reference against ONNX Runtime for aarch64 under
qemu-aarch64 (the arm64 peer root of scripts/arm_peers.sh) on every pair of 8-bit inputs, its fixed point
and its float fallback, its fusion of an int8 QDQ Add, and QDQ Adds built for the QEMU board's ARM target
and run under qemu-aarch64, equal to the reference bit for bit and to ONNX Runtime's aarch64 output."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import NO_ARM_PEERS
from tests.test_qmlas import ADDS, ONNX_TYPES, OPSETS, QType, _params, _qdq_add
from xtune.boards.board import Board, get_board
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import run_network
from xtune.ops.elementwise import Elementwise, ElementwiseOp
from xtune.ops.qmlas import AddKernel, QAdd, add_kernel, fixed_point, fuses_int8_qdq
from xtune.ops.qpointwise import Quantized
from xtune.ops.quantize import RANGES
from xtune.target import get_target
from xtune.tuning.arm_peers import peer_outputs, peers_built

pytest.importorskip("onnxruntime.quantization")
BOARD = "qemu-aarch64"
# name -> (type, scales and zero points of a, b, c)
CASES: dict[str, tuple[QType, tuple[tuple[float, int], ...]]] = {
    "int8": ("int8", ADDS["int8"]),
    "uint8": ("uint8", ADDS["uint8"]),
    # sA / sC >= 256: MLAS's float fallback, on a tie where contracting sA·(a - zA) into the sum shows
    "fallback": (
        "int8",
        ((0.2720411419868469, 116), (0.12110485136508942, -81), (0.0009329699678346515, 68)),
    ),
    # sA / sC < 2^-14: the fallback too
    "small": ("uint8", ((0.00001, 120), (0.02, 130), (0.5, 128))),
}
FIXED = ("int8", "uint8")  # the cases in fixed point


def _pairs(qtype: QType) -> tuple[np.ndarray, np.ndarray]:
    """Every pair of 8-bit levels, a major."""
    lo, hi = RANGES[qtype]
    levels = np.arange(lo, hi + 1)
    return np.repeat(levels, 256).astype(qtype), np.tile(levels, 256).astype(qtype)


def _qadd(case: str) -> QAdd:
    qtype, adds = CASES[case]
    qa, qb, qc = _params(qtype, adds)
    return QAdd(shape=(65536,), reads=(qa, qb), writes=qc).for_target(get_target("arm-a72-neon"))


def _model(path: Path) -> tuple[Path, tuple[np.ndarray, ...]]:
    """Per case a QLinearAdd of inputs `case.a` and `case.b`, output `case`; per int8 case also the
    DequantizeLinear -> Add -> QuantizeLinear of the same inputs, output `case.qdq`; and every pair of
    levels to feed them."""
    nodes, inputs, outputs, inits = [], [], [], []
    feeds: list[np.ndarray] = []
    for case, (qtype, adds) in CASES.items():
        kind = ONNX_TYPES[qtype]
        names = []
        for i, q in enumerate(_params(qtype, adds)):
            scale, zero = f"{case}.s{i}", f"{case}.z{i}"
            inits += [
                helper.make_tensor(scale, TensorProto.FLOAT, [], [q.scale]),
                helper.make_tensor(zero, kind, [], [q.zero]),
            ]
            names += [f"{case}.{'ab'[i]}", scale, zero] if i < 2 else [scale, zero]
        nodes.append(helper.make_node("QLinearAdd", names, [case], domain="com.microsoft"))
        outs = [case]
        if qtype == "int8":
            nodes += [
                helper.make_node("DequantizeLinear", names[0:3], [f"{case}.da"]),
                helper.make_node("DequantizeLinear", names[3:6], [f"{case}.db"]),
                helper.make_node("Add", [f"{case}.da", f"{case}.db"], [f"{case}.sum"]),
                helper.make_node("QuantizeLinear", [f"{case}.sum", *names[6:8]], [f"{case}.qdq"]),
            ]
            outs.append(f"{case}.qdq")
        inputs += [helper.make_tensor_value_info(f"{case}.{x}", kind, [65536]) for x in "ab"]
        outputs += [helper.make_tensor_value_info(o, kind, [65536]) for o in outs]
        feeds += _pairs(qtype)
    graph = helper.make_graph(nodes, "qladd", inputs, outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=OPSETS), path)
    return path, tuple(feeds)


@pytest.fixture(scope="module")
def aarch64_ort(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """ONNX Runtime's aarch64 build under qemu-aarch64 (cortex-a72): every output of `_model`, by name."""
    if not peers_built():
        pytest.skip(NO_ARM_PEERS)
    path, feeds = _model(tmp_path_factory.mktemp("qladd") / "qladd.onnx")
    names = [o.name for o in onnx.load(path).graph.output]
    return dict(zip(names, peer_outputs(path, feeds), strict=True))


def test_the_formula_follows_the_targets_architecture() -> None:
    assert add_kernel(get_target("arm-a72-neon")) is AddKernel.NEON
    assert add_kernel(get_target("x86-avx512")) is AddKernel.AVX2
    assert fuses_int8_qdq(get_target("arm-a53-neon")) and not fuses_int8_qdq(get_target("x86-avx2"))
    qa, qb, qc = _params("int8", ADDS["int8"])
    x86 = QAdd(shape=(4,), reads=(qa, qb), writes=qc)
    assert x86.for_target(get_target("x86-avx2")) == x86
    inner = Elementwise(op=ElementwiseOp.ADD, shape=(4,))
    unfused = Quantized(inner=inner, reads=(qa, qb), writes=qc, dequantizes=True, fused=x86)
    assert unfused.for_target(get_target("x86-avx2")) is unfused
    on_arm = unfused.for_target(get_target("arm-a76-dotprod"))
    assert on_arm == QAdd(shape=(4,), reads=(qa, qb), writes=qc, dequantizes=True, mlas=AddKernel.NEON)


def test_mlas_fixed_point_parameters() -> None:
    """MlasCalcQLinearAddParameters: the greater ratio's multiplier in [2^21, 2^22) over 2^shift, each
    rounded to nearest; the float fallback outside [2^-14, 256) and where the multiplier rounds to 2^22."""
    for r in (np.float32(0.75), np.float32(2.0**-10), np.float32(255.9)):
        fixed = fixed_point(r, np.float32(r / 3))
        assert fixed is not None
        ma, mb = fixed.multipliers
        assert 1 << 21 <= ma < 1 << 22 and 13 <= fixed.shift <= 31
        for m, ratio in ((ma, r), (mb, np.float32(r / 3))):
            assert abs(m - float(ratio) * 2.0**fixed.shift) <= 0.5
    assert fixed_point(np.float32(256), np.float32(1)) is None
    assert fixed_point(np.float32(1), np.float32(2.0**-15)) is None
    assert fixed_point(np.nextafter(np.float32(2), np.float32(0)), np.float32(1)) is None  # 2^22 - 1/4
    assert fixed_point(np.float32(2.0**-11), np.float32(2.0**-12)) is None  # shift 32


@pytest.mark.board
@pytest.mark.parametrize("case", list(CASES))
def test_the_neon_reference_is_onnx_runtime_aarch64s_on_every_pair(
    aarch64_ort: dict[str, np.ndarray], case: str
) -> None:
    """All 65536 pairs: the reference is ONNX Runtime's aarch64 QLinearAdd exactly; in fixed point the x86
    formula is not."""
    op = _qadd(case)
    a, b = _pairs(op.writes.qtype)
    assert (fixed_point(*op.ratios()) is not None) == (case in FIXED)
    assert np.array_equal(op.reference(a, b), aarch64_ort[case])
    if case in FIXED:
        assert not np.array_equal(
            QAdd(shape=op.shape, reads=op.reads, writes=op.writes).reference(a, b), aarch64_ort[case]
        )


@pytest.mark.board
@pytest.mark.parametrize("case", [c for c, (qtype, _) in CASES.items() if qtype == "int8"])
def test_onnx_runtime_aarch64_fuses_the_int8_qdq_add(aarch64_ort: dict[str, np.ndarray], case: str) -> None:
    op = _qadd(case)
    a, b = _pairs("int8")
    assert np.array_equal(aarch64_ort[f"{case}.qdq"], aarch64_ort[case])
    float_form = Quantized(
        inner=Elementwise(op=ElementwiseOp.ADD, shape=op.shape), reads=op.reads, writes=op.writes
    )
    assert not np.array_equal(float_form.reference(a, b), aarch64_ort[case])


@pytest.fixture(scope="module")
def arm_board() -> Board:
    board = get_board(BOARD)
    if board.target.qemu_binary and shutil.which(board.target.qemu_binary) is None:
        pytest.skip(f"needs {board.target.qemu_binary}")
    return board


@pytest.mark.board
@pytest.mark.parametrize("case", list(CASES))
def test_a_qdq_add_built_for_arm_runs_the_reference_under_qemu(
    tmp_path: Path, arm_board: Board, case: str
) -> None:
    """The QDQ Add network of tests/test_qmlas.py built for the board's ARM target (int8 too: ONNX
    Runtime fuses it there) and run under qemu-aarch64: MLAS's NEON QLinearAdd of the quantized inputs."""
    qtype, adds = CASES[case]
    board = arm_board
    path, x = _qdq_add(tmp_path / f"{case}.onnx", qtype, adds)
    got, _ = run_network(board, build_model(path, board.target), x)
    op = _qadd(case)
    assert np.array_equal(got, op.reference(*_levels(op, x)))


def _levels(op: QAdd, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 8-bit a and b the QDQ Add network of tests/test_qmlas.py adds for input `x`."""
    qa, qb = op.reads
    k = np.float32(qb.scale / qa.scale)
    return qa.quantize(x), qb.quantize(np.ascontiguousarray(x.transpose(0, 1, 3, 2)) * k)


@pytest.mark.board
@pytest.mark.parametrize("case", ["uint8", "fallback"])
def test_a_qdq_add_dequantized_after_runs_the_reference_under_qemu(
    tmp_path: Path, arm_board: Board, case: str
) -> None:
    """The same network with a DequantizeLinear of the sum as its output: folded into the Add's kernel,
    fixed point and fallback."""
    qtype, adds = CASES[case]
    path, x = _qdq_add(tmp_path / f"{case}.onnx", qtype, adds)
    model = onnx.load(path)
    model.graph.node.append(helper.make_node("DequantizeLinear", ["y", "c.s", "c.z"], ["yd"]))
    model.graph.output[0].CopyFrom(helper.make_tensor_value_info("yd", TensorProto.FLOAT, [1, 1, 256, 256]))
    onnx.save(model, path)
    artifact = build_model(path, arm_board.target)
    assert sum(k.what.startswith("qadd:") and "dequantizes=True" in k.what for k in artifact.kernels) == 1
    got, _ = run_network(arm_board, artifact, x)
    op = replace(_qadd(case), dequantizes=True)
    assert np.array_equal(got, op.reference(*_levels(op, x)))


@pytest.mark.board
def test_an_int8_qdq_add_built_for_arm_is_onnx_runtime_aarch64s(tmp_path: Path, arm_board: Board) -> None:
    """End to end, the same network: xtune under qemu-aarch64 and ONNX Runtime's aarch64 build."""
    if not peers_built():
        pytest.skip(NO_ARM_PEERS)
    board = arm_board
    path, x = _qdq_add(tmp_path / "int8.onnx", "int8")
    got, _ = run_network(board, build_model(path, board.target), x)
    assert np.array_equal(got, peer_outputs(path, (x,))[0])
