"""int8 TFLite models as int8 networks: a small model written here (a CONV_2D, a DEPTHWISE_CONV_2D, a
1x1 CONV_2D, a 6x6 CONV_2D to one pixel and a FULLY_CONNECTED reading its 4-D output, calibrated on
LiteRT's ranges: tests/tflite_run.py) imports with TFLite's requantization marked, becomes qconv2d,
qdepthwise and qmatmul tasks, builds with `build_model`, and its outputs on the host and on qemu-aarch64
equal LiteRT's interpreter (same process) run with TFLite's reference kernels, as docs/int8.md says."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest

import xtune
from tests.tflite_nets import SAME, VALID, Net
from tests.tflite_run import feeds, litert, litert_ranges, quantized
from xtune.boards.board import get_board
from xtune.errors import InputError
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import random_input, run_network
from xtune.frontend.load import load_graph
from xtune.frontend.quantized import REQUANT_PROP
from xtune.frontend.tflite import tflite_to_onnx
from xtune.ops.qlinear import tflite_multipliers
from xtune.ops.qmatmul.reference import quantize_multiplier

pytest.importorskip("ai_edge_litert")
HOST = "x86-avx2"


def _layers(net: Net, int8_io: bool = False) -> list[int]:
    """The layers; with `int8_io` the model's input and output are int8 themselves (as MLPerf Tiny's
    are: no QUANTIZE, no DEQUANTIZE)."""
    x = net.input((1, 12, 12, 3)) if int8_io else net.quantize(net.input((1, 12, 12, 3)))
    y = net.conv(x, 16, 3, 3, stride=2, padding=SAME, act="RELU6")
    y = net.depthwise(y, 3, 3, padding=SAME, act="RELU")
    y = net.conv(y, 24, 1, 1, padding=VALID, act="RELU")
    y = net.conv(y, 32, 6, 6, padding=VALID)  # (1, 1, 1, 32): FULLY_CONNECTED flattens it, no RESHAPE
    y = net.fc(y, 40)
    return [y if int8_io else net.dequantize(y)]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Path]:
    data = quantized(_layers)
    path = tmp_path_factory.mktemp("tflite") / "layers.tflite"
    path.write_bytes(data)
    return data, path


def test_the_import_marks_the_model_as_tflites_and_its_layers_become_int8_tasks(
    model: tuple[bytes, Path],
) -> None:
    data, path = model
    props = {p.key: p.value for p in tflite_to_onnx(data).metadata_props}
    assert props[REQUANT_PROP] == "tflite"
    graph = load_graph(path)
    ops = [n.op for n in graph.nodes]
    assert ops.count("QLinearConv") == 4 and ops.count("QLinearMatMul") == 1
    assert not {"Conv", "Gemm", "MatMul"} & set(ops)  # nothing runs in float
    assert all(n.attrs.get("requant") == "tflite" for n in graph.nodes if n.op.startswith("QLinear"))
    workloads = [t.workload for t in xtune.tasks(path, HOST).tasks]
    convs = [w for w in workloads if w.op in ("qconv2d", "qdepthwise")]
    assert len(convs) == 4 and all(w.value("requant") == "tflite" and w["perchannel"] for w in convs)
    (fc,) = [w for w in workloads if w.op == "qmatmul"]
    assert fc.value("requant") == "onnx" and not fc["perchannel"]  # FULLY_CONNECTED: float32 epilogue


def test_a_onnx_model_keeps_onnx_runtimes_requantization(model: tuple[bytes, Path], tmp_path: Path) -> None:
    """The same QDQ graph without the import's mark is an ONNX model: ONNX Runtime's arithmetic."""
    onnx_model = tflite_to_onnx(model[0])
    del onnx_model.metadata_props[:]
    path = tmp_path / "layers.onnx"
    onnx.save(onnx_model, path)
    workloads = [t.workload for t in xtune.tasks(path, HOST).tasks]
    assert len(workloads) == 5 and all(w.value("requant") == "onnx" for w in workloads)


def test_tflites_multipliers_are_quantize_multiplier_of_the_double_product() -> None:
    sa, sb, sy = (np.array(v, np.float32) for v in ([0.02], [0.003, 0.0071], [0.05]))
    got = tflite_multipliers(sa, sb, sy)
    for j, b in enumerate(sb):
        q, shift = quantize_multiplier(float(sa[0]) * float(b) / float(sy[0]))
        assert (got["multiplier"][j], got["shift"][j]) == (q, shift)
        assert 1 << 30 <= q < 1 << 31


def _steps(board: str, data: bytes, path: Path, seeds: int) -> tuple[int, int]:
    """(outputs one step off LiteRT's reference kernels, outputs) over `seeds` inputs; more than one
    step fails at once."""
    artifact = build_model(path, get_board(board).target)
    scale = artifact.program.output_quant
    assert scale is not None
    off = total = 0
    for seed in range(seeds):
        xs = feeds(data, seed)
        want = litert(data, xs, reference=True)[0]
        got, _ = run_network(get_board(board), artifact, xs[0])
        steps = np.rint((got.astype(np.float64) - want) / scale[0])
        assert np.max(np.abs(steps)) <= 1, seed
        off += int(np.count_nonzero(steps))
        total += steps.size
    return off, total


def test_the_int8_network_equals_litert_on_the_host(model: tuple[bytes, Path]) -> None:
    off, total = _steps("local", *model, seeds=6)
    assert off <= 0.001 * total, (off, total)


def test_the_int8_network_equals_litert_under_qemu_aarch64(model: tuple[bytes, Path]) -> None:
    board = get_board("qemu-aarch64")
    if board.target.qemu_binary and shutil.which(board.target.qemu_binary) is None:
        pytest.skip(f"needs {board.target.qemu_binary}")
    off, total = _steps("qemu-aarch64", *model, seeds=2)
    assert off <= 0.001 * total, (off, total)


def test_an_int8_nhwc_input_and_output_need_no_int8_layout_conversion(tmp_path: Path) -> None:
    """The model's int8 NHWC input is dequantized where it is (a DequantizeLinear runs in its input's
    layout), so the NHWC network converts no int8 tensor; its int8 output equals LiteRT's."""
    calibration = Net()
    data = calibration.tflite(_layers(calibration, int8_io=True))
    net = Net(litert_ranges(data, feeds(data, seed=7)))
    data = net.tflite(_layers(net, int8_io=True))
    path = tmp_path / "int8_io.tflite"
    path.write_bytes(data)
    artifact = build_model(path, HOST)
    assert artifact.program.input_type == "int8" and artifact.program.output_type == "int8"
    details = _io_quantization(data)
    assert artifact.program.input_quant == details[0] and artifact.program.output_quant == details[1]
    for seed in range(3):
        x = random_input((1, 12, 12, 3), seed, "int8")
        got, _ = run_network(get_board("local"), artifact, x)
        np.testing.assert_array_equal(got, litert(data, [x], reference=True)[0])
    with pytest.raises(InputError, match="transposes the int8 tensor") as refused:
        build_model(path, HOST, layout="nchw")  # there the int8 input would have to move: refused
    assert "\n" not in str(refused.value)


def _io_quantization(data: bytes) -> list[tuple[float, int]]:
    """(scale, zero point) of the model's input and output, as LiteRT reads them."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=data)
    found = [*interpreter.get_input_details(), *interpreter.get_output_details()]
    return [(float(np.float32(d["quantization"][0])), int(d["quantization"][1])) for d in found]


def _clipped_matmul(tflite: bool) -> onnx.ModelProto:
    """QDQ x[2, 4] @ w -> Clip(0, 6) -> QuantizeLinear of scale 12: the clamp's upper bound is 6 / 12 =
    0.5 steps above the zero point, a tie."""
    from onnx import TensorProto, helper, numpy_helper

    inits = {
        "sx": np.float32(0.1),
        "zx": np.int8(0),
        "w": np.ones((4, 3), np.int8),
        "sw": np.float32(0.5),
        "zw": np.int8(0),
        "sy": np.float32(12.0),
        "zy": np.int8(3),
        "lo": np.float32(0.0),
        "hi": np.float32(6.0),
    }
    node = helper.make_node
    nodes = [
        node("QuantizeLinear", ["x", "sx", "zx"], ["xq"]),
        node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"]),
        node("DequantizeLinear", ["w", "sw", "zw"], ["wf"]),
        node("MatMul", ["xf", "wf"], ["h"]),
        node("Clip", ["h", "lo", "hi"], ["c"]),
        node("QuantizeLinear", ["c", "sy", "zy"], ["yq"]),
        node("DequantizeLinear", ["yq", "sy", "zy"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "clipped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if tflite:
        helper.set_model_props(model, {REQUANT_PROP: "tflite"})
    return model


@pytest.mark.parametrize(("tflite", "hi"), [(False, 3), (True, 4)])
def test_a_fused_clamp_bound_on_a_tie_rounds_as_the_models_reference_does(tflite: bool, hi: int) -> None:
    """ONNX's QuantizeLinear rounds 0.5 to even (0); TFLite's CalculateActivationRangeQuantized rounds it
    away from zero (1)."""
    (node,) = [n for n in load_graph(_clipped_matmul(tflite)).nodes if n.op == "QLinearMatMul"]
    assert node.attrs["out_lo"] == 3 and node.attrs["out_hi"] == hi
    assert node.attrs.get("requant", "onnx") == ("tflite" if tflite else "onnx")
