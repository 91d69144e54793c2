"""The TFLite front end (xtune/frontend/tflite.py) against the TFLite interpreter (LiteRT): small models
written here (tests/tflite_nets.py), float32 ones imported and run by ONNX Runtime (within 1e-5 of LiteRT)
and by xtune's whole-network build on the local board (the quantized ones: tests/test_tflite_int8.py);
unsupported operators refused once, every one listed; truncated and mutated files refused in one line,
never a traceback."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.tflite_nets import SAME, VALID, Net
from tests.tflite_run import feeds, litert, ort, quantized, random_feed
from xtune.boards.board import get_board
from xtune.errors import InputError
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import bench_model, run_network
from xtune.frontend.load import load_graph
from xtune.frontend.tflite import tflite_to_onnx
from xtune.frontend.tflite_file import read_tflite
from xtune.frontend.tflite_ops import pads
from xtune.tuning.peers import litert_network, ort_network

pytest.importorskip("onnxruntime")
pytest.importorskip("ai_edge_litert")
RTOL = 1e-5  # float32: the same sums in another order, relative to the output's largest magnitude


def buildable(net: Net) -> list[int]:
    """MobileNet-like, with only what a whole-network build runs today (symmetric padding)."""
    x = net.quantize(net.input((1, 15, 15, 3)))
    y = net.conv(x, 8, 3, 3, stride=2, padding=SAME, act="RELU6")  # 15 -> 8: one pixel each side
    y = net.depthwise(y, 3, 3, padding=SAME, act="RELU")
    y = net.binary("ADD", y, net.conv(y, 8, 1, 1, padding=VALID), act="RELU")
    y = net.pool("MAX_POOL_2D", y, 2, 2)
    y = net.conv(y, 16, 3, 3, padding=VALID, act="RELU")
    y = net.mean(y, (1, 2), keep_dims=False)
    return [net.dequantize(net.softmax(net.fc(y, 10)))]


def every_op(net: Net) -> list[int]:
    """Every mapped operator and option: SAME with the odd pixel at the end, stride 2 on even sizes, a
    depth multiplier, dilation, PAD, every fused activation, elementwise ops, CONCATENATION along
    channels, MEAN over one axis, RESHAPE flattening NHWC, keep_num_dims, a softmax beta; two outputs."""
    x = net.quantize(net.input((1, 16, 12, 4)))
    y = net.conv(x, 6, 3, 3, stride=2, padding=SAME, act="RELU_N1_TO_1")  # 16x12 -> 8x6
    y = net.depthwise(y, 3, 3, multiplier=2, stride=2, padding=SAME, act="RELU6")  # -> 4x3, 12 channels
    y = net.conv(y, 12, 2, 2, padding=SAME, act="TANH", dilation=2)
    y = net.pool("AVERAGE_POOL_2D", net.pad(y, ((0, 0), (1, 0), (0, 1), (0, 0))), 3, 2, padding=SAME)
    y = net.binary("MUL", y, net.unary("LOGISTIC", y))
    y = net.binary("SUB", y, net.unary("HARD_SWISH", y), act="RELU")
    y = net.concat([y, net.unary("TANH", y), net.unary("RELU6", y)], axis=3)
    y = net.pool("MAX_POOL_2D", net.unary("RELU", y), 2, 1, padding=SAME)
    rows = net.fc(net.mean(y, (1,), keep_dims=False), 5, act="RELU", keep_num_dims=True)
    flat = net.fc(net.reshape(y, (1, int(np.prod(net.shape(y))))), 8, act="RELU6")
    return [net.dequantize(net.softmax(flat, beta=0.5)), net.dequantize(rows)]


NETS: dict[str, Callable[[Net], list[int]]] = {"buildable": buildable, "every_op": every_op}


@cache
def float_model(name: str) -> bytes:
    net = Net()
    return net.tflite(NETS[name](net))


@cache
def int8_model(name: str) -> bytes:
    return quantized(NETS[name])


def _write(tmp_path: Path, data: bytes, name: str = "model.tflite") -> Path:
    path = tmp_path / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name", NETS)
def test_float_models_match_litert_through_onnx_runtime(name: str) -> None:
    data = float_model(name)
    model = tflite_to_onnx(data, f"{name}.tflite")
    assert not [n for n in model.graph.node if n.op_type in ("QuantizeLinear", "DequantizeLinear")]
    for seed in range(3):
        xs = feeds(data, seed)
        want, got = litert(data, xs), ort(model, xs)
        assert len(want) == len(got)
        for w, g in zip(want, got, strict=True):
            assert g.shape == w.shape and g.dtype == np.float32
            assert np.max(np.abs(g - w)) <= RTOL * max(1.0, float(np.max(np.abs(w)))), name


def test_float16_weights_behind_dequantize_are_float_weights(tmp_path: Path) -> None:
    net = Net(stored="float16")
    data = net.tflite(buildable(net))
    model = tflite_to_onnx(data)
    assert not [n for n in model.graph.node if "Quantize" in n.op_type]
    xs = feeds(data, 0)
    (want,), (got,) = litert(data, xs), ort(model, xs)
    assert np.max(np.abs(got - want)) <= RTOL
    path = _write(tmp_path, data)
    assert (
        load_graph(path).constant(next(n for n in load_graph(path).nodes if n.op == "Conv").inputs[1])
        is not None
    )


def test_a_dynamic_range_model_is_timed_on_litert_and_checked_on_its_import(tmp_path: Path) -> None:
    net = Net(stored="int8")
    path = _write(tmp_path, net.tflite(buildable(net)))
    report = bench_model(path, get_board("local"), repeat=1)
    assert report.correct, report.error
    assert report.peer == "LiteRT (outputs: ONNX Runtime on the import)" and report.ort_seconds
    plain = bench_model(
        _write(tmp_path, float_model("buildable"), "plain.tflite"), get_board("local"), repeat=1
    )
    assert plain.peer == "LiteRT"


def test_int8_weights_of_float_kernels_are_imported_dequantized() -> None:
    """Dynamic-range quantization: int8 weights, float activations. The weights become float32 exactly
    as DequantizeLinear computes them, so the network is a float one xtune builds; LiteRT's kernels
    quantize the activations on the fly instead (docs/networks.md, "TFLite"), so only the weights are
    compared here, bit for bit."""
    net = Net(stored="int8")
    data = net.tflite(buildable(net))
    model = tflite_to_onnx(data)
    assert not [n for n in model.graph.node if "Quantize" in n.op_type]
    inits = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    tfl = read_tflite(data, "hybrid.tflite")
    filters = [tfl.tensors[op.inputs[1]] for op in tfl.ops if op.op == "CONV_2D"]
    convs = [
        n
        for n in model.graph.node
        if n.op_type == "Conv" and not any(a.i > 1 for a in n.attribute if a.name == "group")
    ]
    assert len(filters) == len(convs) == 3
    for t, conv in zip(filters, convs, strict=True):
        assert t.data is not None and t.quant is not None and t.data.dtype == np.int8
        want = t.data.astype(np.float32) * t.quant.scale.reshape(-1, 1, 1, 1)  # (q - 0) * scale, OHWI
        np.testing.assert_array_equal(inits[conv.input[1]], want.transpose(0, 3, 1, 2))


def more_ops(net: Net) -> list[int]:
    """The elementwise and layout operators beyond the reference models' (float)."""
    a, b = net.input((1, 6, 5, 4)), net.input((1, 6, 5, 4))
    y = net.binary("MAXIMUM", a, net.binary("MINIMUM", b, net.unary("NEG", a)))
    y = net.binary("SQUARED_DIFFERENCE", y, net.unary("FLOOR", b))
    y = net.unary("RSQRT", net.binary("ADD", net.unary("SQRT", net.unary("ABS", y)), net.unary("EXP", b)))
    y = net.binary(
        "PRELU", net.binary("SUB", y, net.unary("COS", a)), net.constant("alpha", np.full(4, 0.2, np.float32))
    )
    t = net.transpose(y, (0, 2, 1, 3))  # swaps H and W: (1, 5, 6, 4)
    flat = net.transpose(net.reshape(t, (1, 30, 4)), (0, 2, 1))  # a 3-D transpose
    y = net.pad(y, ((0, 0), (0, 1), (2, 0), (0, 0)), value=-0.5)
    return [net.transpose(t, (0, 3, 1, 2)), flat, net.transpose(y, (0, 1, 2, 3))]


def test_more_operators_match_litert() -> None:
    net = Net()
    data = net.tflite(more_ops(net))
    model = tflite_to_onnx(data)
    # Two inputs and two 4-D outputs at the boundary, one for the 4-D -> 3-D reshape, one per TRANSPOSE
    # that is not the identity in the order the value is held (three): each composed into one node.
    assert sum(n.op_type == "Transpose" for n in model.graph.node) == 2 + 2 + 1 + 3
    for seed in range(3):
        xs = feeds(data, seed)
        for w, g in zip(litert(data, xs), ort(model, xs), strict=True):
            assert g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=RTOL)


def test_model_keeps_its_nhwc_boundary_and_tensorflow_same_padding() -> None:
    model = tflite_to_onnx(float_model("every_op"))
    (x,) = model.graph.input
    assert [d.dim_value for d in x.type.tensor_type.shape.dim] == [1, 16, 12, 4]  # TFLite's NHWC input
    first = model.graph.node[0]
    assert first.op_type == "Transpose" and list(first.attribute[0].ints) == [0, 3, 1, 2]
    conv = next(n for n in model.graph.node if n.op_type == "Conv")
    attrs = {a.name: list(a.ints) for a in conv.attribute}
    # SAME, 3x3 stride 2 over 16x12: output 8x6, total padding 1 each way, the odd pixel at the end.
    assert attrs["pads"] == [0, 0, 1, 1] == pads((16, 12), (3, 3), (2, 2), (1, 1), 0)
    assert pads((15, 15), (3, 3), (2, 2), (1, 1), 0) == [1, 1, 1, 1]
    assert pads((49, 10), (10, 4), (2, 2), (1, 1), 0) == [4, 1, 5, 1]  # DS-CNN's first conv
    assert pads((9, 9), (3, 3), (1, 1), (2, 2), 0) == [2, 2, 2, 2]  # dilation widens the window
    assert pads((16, 12), (3, 3), (2, 2), (1, 1), 1) == [0, 0, 0, 0]  # VALID
    depthwise = next(n for n in model.graph.node if n.op_type == "Conv" and n is not conv)
    assert {a.name: a.i for a in depthwise.attribute if a.name == "group"} == {"group": 6}


def test_float_model_builds_and_matches_litert_on_the_local_board(tmp_path: Path) -> None:
    path = _write(tmp_path, float_model("buildable"))
    board = get_board("local")
    report = bench_model(path, board, repeat=1)
    assert report.correct and report.peer == "LiteRT", report.error
    artifact = build_model(path, board.target)
    assert not [c for c in artifact.program.calls if type(c.kernel).__name__ == "Transpose"]  # relabelled
    for seed in range(3):
        x = random_feed((1, 15, 15, 3), seed)
        got, _ = run_network(board, artifact, x)
        (want,) = litert(float_model("buildable"), [x])
        assert np.max(np.abs(got - want)) <= RTOL * max(1.0, float(np.max(np.abs(want))))
    nchw = build_model(path, board.target, layout="nchw")
    got, _ = run_network(board, nchw, random_feed((1, 15, 15, 3)))
    want, _ = litert_network(float_model("buildable"), random_feed((1, 15, 15, 3)))
    assert np.max(np.abs(got - want)) <= RTOL


def feature_map(net: Net) -> list[int]:
    """A 4-D NHWC output (a detector's or segmenter's feature map): the output side of the boundary."""
    x = net.input((1, 9, 9, 4))
    y = net.depthwise(net.conv(x, 8, 3, 3, padding=SAME, act="RELU"), 3, 3, stride=2, padding=VALID)
    return [net.conv(y, 6, 1, 1, padding=VALID, act="RELU6")]


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
def test_a_4d_output_is_written_in_nhwc_directly(tmp_path: Path, layout: str) -> None:
    net = Net()
    data = net.tflite(feature_map(net))
    board = get_board("local")
    artifact = build_model(_write(tmp_path, data), board.target, layout=layout)
    transposes = [c for c in artifact.program.calls if type(c.kernel).__name__ == "Transpose"]
    assert len(transposes) == (0 if layout == "nhwc" else 2)  # NCHW: the model's own two run
    assert artifact.program.output_shape == (1, 4, 4, 6)
    for seed in range(2):
        x = random_feed((1, 9, 9, 4), seed)
        got, _ = run_network(board, artifact, x)
        (want,) = litert(data, [x])
        assert np.max(np.abs(got - want)) <= RTOL * max(1.0, float(np.max(np.abs(want))))


def test_a_tflite_file_loads_by_its_content_and_ort_network_agrees(tmp_path: Path) -> None:
    path = _write(tmp_path, float_model("buildable"), "model.bin")  # not named .tflite
    graph = load_graph(path)
    assert graph.shape(graph.inputs[0]) == (1, 15, 15, 3)
    x = random_feed((1, 15, 15, 3))
    want, _ = litert_network(float_model("buildable"), x)
    got, _ = ort_network(tflite_to_onnx(float_model("buildable")).SerializeToString(), x)
    assert np.max(np.abs(got - want)) <= RTOL


def test_unsupported_operators_are_refused_once_all_listed(tmp_path: Path) -> None:
    net = Net()
    x = net.input((1, 4, 4, 2))
    y = net.unary("SPACE_TO_DEPTH", net.unary("L2_NORMALIZATION", net.unary("SPACE_TO_DEPTH", x)))
    y = net.unary("RELU", net.unary("LOCAL_RESPONSE_NORMALIZATION", y))
    path = _write(tmp_path, net.tflite([y]))
    with pytest.raises(InputError) as err:
        load_graph(path)
    assert str(err.value) == (
        f"{path}: xtune cannot import 4 TFLite operators (3 kinds): SPACE_TO_DEPTH ×2 (operators 0, 2); "
        "L2_NORMALIZATION ×1 (operator 1); LOCAL_RESPONSE_NORMALIZATION ×1 (operator 3)"
    )
    result = _cli("tasks", str(path))
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and "SPACE_TO_DEPTH ×2" in result.stderr


def test_custom_operators_are_refused_with_what_would_help() -> None:
    net = Net()
    x = net.input((1, 4, 4, 2))
    data = net.tflite([net.unary("CUSTOM:FlexErf", net.unary("CUSTOM:MyOp", net.unary("CUSTOM:MyOp", x)))])
    with pytest.raises(InputError) as err:
        tflite_to_onnx(data, "custom.tflite")
    assert str(err.value) == (
        "custom.tflite: xtune cannot import 3 TFLite operators (2 kinds): CUSTOM:MyOp ×2 (operators 0, 1): "
        "a custom operator: convert with TFLite builtins only; CUSTOM:FlexErf ×1 (operator 2): a TensorFlow "
        "op (Flex delegate): convert with TFLite builtins only"
    )


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    code = "import sys; from xtune.cli import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("kind", ["float", "int8"])
def test_truncated_and_mutated_files_are_one_input_error(kind: str) -> None:
    data = float_model("every_op") if kind == "float" else int8_model("every_op")
    rng = np.random.default_rng(3)
    cuts = sorted({*range(0, 64), *rng.integers(64, len(data), 150).tolist(), len(data) - 1})
    cases = [data[:cut] for cut in cuts]
    for _ in range(300):
        mutated = bytearray(data)
        for at in rng.integers(0, len(data), int(rng.integers(1, 9))):
            mutated[at] = int(rng.integers(0, 256))
        cases.append(bytes(mutated))
    refused = 0
    for case in cases:
        try:
            tflite_to_onnx(case, "fuzz.tflite")
        except InputError as err:
            assert "\n" not in str(err) and str(err).startswith("fuzz.tflite: ")
            refused += 1
    assert refused >= len(cuts)  # every truncation at least; a mutation in weights may still be a model


def test_cli_refuses_a_truncated_file_in_one_line(tmp_path: Path) -> None:
    path = _write(tmp_path, float_model("buildable")[:300])
    out = ["-o", str(tmp_path / "out.o"), "--header", str(tmp_path / "out.h")]
    result = _cli("build", "--target", "x86-avx2", "--model", str(path), *out)
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr and str(path) in result.stderr
    assert not (tmp_path / "out.o").exists() and not (tmp_path / "out.h").exists()
