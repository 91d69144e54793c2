"""Quantized ONNX networks end to end: small MLPs quantized by ONNX Runtime's own `quantize_static` (QDQ per
tensor and per channel, and the QOperator form), built whole with `build_model`, run on the host and on
qemu-aarch64, and compared with ONNX Runtime's output on the same input for equality; a mixed graph (int8
matmuls, then a float Softmax); ONNX Runtime's QuantizeLinear rounding; MatMulInteger with an int8 input
and an int32 output; and a quantized conv as the int8 conv family's task (tests/test_qconv.py has more)."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import xtune
from xtune.boards.board import get_board
from xtune.errors import InputError
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import bench_model, network_input, reference_file, run_network
from xtune.frontend.load import load_graph
from xtune.tuning.peers import ort_network

ort_quant = pytest.importorskip("onnxruntime.quantization")
HOST = "x86-avx2"  # every x86 host of the project runs AVX2 code


def _two_branches() -> onnx.ModelProto:
    """x[64, 16] -> MatMul, MatMul -> Add -> Relu: quantized as QOperator, a com.microsoft.QLinearAdd."""
    rng = np.random.default_rng(6)
    w1, w2 = (rng.normal(0, 0.3, (16, 32)).astype(np.float32) for _ in range(2))
    graph = helper.make_graph(
        [
            helper.make_node("MatMul", ["x", "w1"], ["a"], name="m1"),
            helper.make_node("MatMul", ["x", "w2"], ["b"], name="m2"),
            helper.make_node("Add", ["a", "b"], ["s"], name="add"),
            helper.make_node("Relu", ["s"], ["y"], name="relu"),
        ],
        "branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [64, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [64, 32])],
        [numpy_helper.from_array(w1, "w1"), numpy_helper.from_array(w2, "w2")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _mlp(tail: str = "") -> onnx.ModelProto:
    """x[4, 16] -> Gemm(transB=1, bias) -> Relu -> MatMul: PyTorch's Linear layers; with `tail`
    "softmax" a Softmax after, "reshape" a Reshape to (8, 16) before the MatMul (then 16 x 10)."""
    rng = np.random.default_rng(1)
    w1 = rng.normal(0, 0.3, (32, 16)).astype(np.float32)
    b1 = rng.normal(0, 0.1, 32).astype(np.float32)
    rows, k = (8, 16) if tail == "reshape" else (4, 32)
    w2 = rng.normal(0, 0.3, (k, 10)).astype(np.float32)
    inits: dict[str, np.ndarray] = {"w1": w1, "b1": b1, "w2": w2, "shape": np.array([rows, k], np.int64)}
    nodes = [
        helper.make_node("Gemm", ["x", "w1", "b1"], ["h"], name="fc1", transB=1),
        helper.make_node("Relu", ["h"], ["r"], name="relu1"),
        helper.make_node("Reshape", ["r", "shape"], ["rs"], name="reshape"),
        helper.make_node("MatMul", ["rs", "w2"], ["logits"], name="fc2"),
        helper.make_node("Softmax", ["logits"], ["y"], name="softmax", axis=-1),
    ]
    if tail != "reshape":
        nodes[3] = helper.make_node("MatMul", ["r", "w2"], ["logits"], name="fc2")
        del nodes[2]
    if tail != "softmax":
        nodes[-2].output[0] = "y"
        del nodes[-1]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [rows, 10])],
        [numpy_helper.from_array(a, n) for n, a in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


class _Calibration(ort_quant.CalibrationDataReader):  # type: ignore[name-defined]
    def __init__(self, rows: int) -> None:
        rng = np.random.default_rng(2)
        self.batches = iter([{"x": rng.uniform(-1, 1, (rows, 16)).astype(np.float32)} for _ in range(4)])

    def get_next(self) -> dict[str, np.ndarray] | None:
        return next(self.batches, None)


def _quantized(
    tmp: Path, form: str, per_channel: bool, tail: str = "", uint8: bool = False, branches: bool = False
) -> Path:
    """The MLP (or `_two_branches`) quantized by ONNX Runtime (int8 weights, int8 or uint8 activations)."""
    tag = f"{tail}_{uint8}_{branches}"
    source, out = tmp / f"float_{tag}.onnx", tmp / f"{form}_{per_channel}_{tag}.onnx"
    onnx.save(_two_branches() if branches else _mlp(tail), source)
    logging.getLogger().setLevel(logging.ERROR)  # quantize_static's advice to pre-process the model
    ort_quant.quantize_static(
        str(source),
        str(out),
        _Calibration(64 if branches else 4),
        quant_format=ort_quant.QuantFormat.QDQ if form == "qdq" else ort_quant.QuantFormat.QOperator,
        per_channel=per_channel,
        activation_type=ort_quant.QuantType.QUInt8 if uint8 else ort_quant.QuantType.QInt8,
        weight_type=ort_quant.QuantType.QInt8,
        # The mixed model: its matmuls only, so its Relu and Softmax stay float between int8 tensors.
        op_types_to_quantize=["Gemm", "MatMul"] if tail == "softmax" else None,
    )
    return out


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("int8")
    return {
        "qdq": _quantized(tmp, "qdq", False),
        "qdq_per_channel": _quantized(tmp, "qdq", True),
        "qoperator": _quantized(tmp, "qoperator", False),
        "qoperator_per_channel": _quantized(tmp, "qoperator", True),
        "qdq_uint8": _quantized(tmp, "qdq", True, uint8=True),
        "mixed": _quantized(tmp, "qdq", False, tail="softmax"),
        "reshape": _quantized(tmp, "qdq", False, tail="reshape"),
        "branches": _quantized(tmp, "qoperator", False, branches=True),
        "float": _save(tmp / "float.onnx", _mlp()),
    }


def _save(path: Path, model: onnx.ModelProto) -> Path:
    onnx.save(model, path)
    return path


def _ort(path: Path, x: np.ndarray) -> np.ndarray:
    return ort_network(path.read_bytes(), x)[0]


@pytest.mark.parametrize(
    "name", ["qdq", "qdq_per_channel", "qoperator", "qoperator_per_channel", "qdq_uint8"]
)
def test_quantized_mlps_are_int8_tasks_and_equal_onnx_runtime_on_the_host(
    models: dict[str, Path], name: str
) -> None:
    tasks = xtune.tasks(models[name], HOST)
    keys = ",a=u8" if name.endswith("uint8") else ""
    keys += ",perchannel=1" if name.endswith(("per_channel", "uint8")) else ""
    assert [t.workload.key for t in tasks.tasks] == [
        f"qmatmul:m=4,n=32,k=16{keys}",
        f"qmatmul:m=4,n=10,k=32{keys},dequant=1",  # the output's DequantizeLinear is its epilogue
    ]
    assert [(o.op, o.kind) for o in tasks.other_nodes] == [("QuantizeLinear", "quantize")]
    artifact = build_model(models[name], HOST)
    x = network_input(artifact)
    got, _ = run_network(get_board("local"), artifact, x)
    assert np.array_equal(got, _ort(models[name], x))


def test_a_quantized_mlp_equals_onnx_runtime_under_qemu_aarch64(models: dict[str, Path]) -> None:
    board = get_board("qemu-aarch64")
    if board.target.qemu_binary and shutil.which(board.target.qemu_binary) is None:
        pytest.skip(f"needs {board.target.qemu_binary}")
    artifact = build_model(models["qdq_per_channel"], board.target)
    x = network_input(artifact)
    got, _ = run_network(board, artifact, x)
    assert np.array_equal(got, _ort(models["qdq_per_channel"], x))


def test_the_int8_build_holds_int8_weights_an_int8_workspace_and_says_the_quantization(
    models: dict[str, Path],
) -> None:
    int8, fp32 = build_model(models["qdq"], HOST), build_model(models["float"], HOST)
    # 32x16 + 32x10 int8 weights, int32 biases, scales and qparams, each 64-byte aligned.
    assert int8.weights_bytes < 0.5 * fp32.weights_bytes
    graph = load_graph(models["qdq"])
    prog = int8.program
    assert prog.memory.intermediate_bytes == sum(
        np.dtype(graph.dtype(t)).itemsize * int(np.prod(graph.shape(t)))
        for t in {a for call in prog.calls for a in call.args}
        if prog.places[t][0].value == "workspace"
    )
    assert prog.memory.intermediate_bytes == 4 * 16 + 4 * 32  # x_q, r_q: one byte each (y_q fused away)
    assert prog.input_quant is not None and prog.output_quant is not None
    assert "int net_run(const float *input, float *output, void *workspace);" in int8.header
    assert f"#define NET_INPUT_SCALE {prog.input_quant[0]!r}f" in int8.header
    assert f"#define NET_OUTPUT_ZERO_POINT {prog.output_quant[1]}" in int8.header
    assert "input quantization: quantized inside to 8-bit q" in int8.header
    shown = int8.as_dict()
    assert shown["input_type"] == "float32" and shown["output_quantization"] == prog.output_quant


def test_a_mixed_graph_runs_its_int8_matmuls_then_a_float_softmax(models: dict[str, Path]) -> None:
    tasks = xtune.tasks(models["mixed"], HOST)
    assert [t.workload.op for t in tasks.tasks] == ["qmatmul", "qmatmul"]
    # Each matmul writes its output dequantized (dequant=1): Relu in float32 between them, the float
    # Softmax after the second.
    assert [t.workload["dequant"] for t in tasks.tasks] == [1, 1]
    assert [o.op for o in tasks.other_nodes] == ["QuantizeLinear", "Relu", "QuantizeLinear", "Softmax"]
    report = bench_model(models["mixed"], get_board("local"), repeat=1)
    assert report.correct, report.error
    assert report.peer == "ONNX Runtime" and report.ort_seconds is not None


def _fused_activation(path: Path, act: str, zero: int, weight_zero: int = 0) -> Path:
    """x -> Q -> DQ -> MatMul(per-column int8 weights) -> Relu or Clip(0, 6) -> Q(zero) -> DQ: the
    activation becomes the int8 kernel's output clamp (out_lo/out_hi where it narrows the range)."""
    rng = np.random.default_rng(5)
    inits: dict[str, np.ndarray] = {
        "s": np.array(0.02, np.float32),
        "z": np.array(3, np.int8),
        "w": rng.integers(-127, 128, (64, 48)).astype(np.int8),
        "ws": rng.uniform(0.001, 0.01, 48).astype(np.float32),
        "wz": np.full(48, weight_zero, np.int8),
        "ys": np.array(0.05, np.float32),
        "yz": np.array(zero, np.int8),
        "lo": np.array(0.0, np.float32),
        "hi": np.array(6.0, np.float32),
    }
    activation = (
        helper.make_node("Relu", ["m"], ["a"], name="act")
        if act == "relu"
        else helper.make_node("Clip", ["m", "lo", "hi"], ["a"], name="act")
    )
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
            helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
            helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], name="dqw", axis=1),
            helper.make_node("MatMul", ["xd", "wd"], ["m"], name="mm"),
            activation,
            helper.make_node("QuantizeLinear", ["a", "ys", "yz"], ["aq"], name="qa"),
            helper.make_node("DequantizeLinear", ["aq", "ys", "yz"], ["y"], name="dqa"),
        ],
        "act",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 64])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 48])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return _save(path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


@pytest.mark.parametrize(("act", "zero", "clamp"), [("relu", 10, (10, 127)), ("clip", -128, (-128, -8))])
def test_a_relu_or_clip_before_quantize_linear_is_the_int8_kernels_clamp(
    tmp_path: Path, act: str, zero: int, clamp: tuple[int, int]
) -> None:
    path = _fused_activation(tmp_path / f"{act}.onnx", act, zero)
    (mm,) = [n for n in load_graph(path).nodes if n.op == "QLinearMatMul"]
    assert (mm.attrs["out_lo"], mm.attrs["out_hi"]) == clamp  # Clip: -128 + round(6 / 0.05) = -8
    artifact = build_model(path, HOST)
    x = 3 * network_input(artifact)
    got, _ = run_network(get_board("local"), artifact, x)
    assert np.array_equal(got, _ort(path, x))


def test_a_reshape_between_int8_layers_is_a_view_of_the_int8_bytes(models: dict[str, Path]) -> None:
    """quantize_static wraps the Reshape in DequantizeLinear/QuantizeLinear of one scale: dropped."""
    assert [n.op for n in load_graph(models["reshape"]).nodes] == [
        "QuantizeLinear",
        "QLinearMatMul",
        "Reshape",
        "QLinearMatMul",
        "DequantizeLinear",
    ]
    artifact = build_model(models["reshape"], HOST)
    x = network_input(artifact)
    got, _ = run_network(get_board("local"), artifact, x)
    assert np.array_equal(got, _ort(models["reshape"], x))


def test_asymmetric_weights_leave_the_layer_in_float_and_it_still_matches(tmp_path: Path) -> None:
    """A weight zero point of 2: not the int8 kernels' (symmetric weights), so the layer stays QDQ and runs
    in float32, its weights dequantized at import as ONNX Runtime computes them."""
    path = _fused_activation(tmp_path / "asym.onnx", "relu", 10, weight_zero=2)
    ops = [n.op for n in load_graph(path).nodes]
    assert ops == [
        "QuantizeLinear",
        "DequantizeLinear",
        "MatMul",
        "Relu",
        "QuantizeLinear",
        "DequantizeLinear",
    ]
    report = bench_model(path, get_board("local"), repeat=1)
    assert report.correct, report.error


def test_qoperator_add_pooling_and_sigmoid_run_as_one_int8_kernel_each(
    models: dict[str, Path], tmp_path: Path
) -> None:
    """com.microsoft QLinearAdd (ORT's QOperator residual), QLinearGlobalAveragePool and QLinearSigmoid:
    one kernel each reading and writing 8-bit (xtune/ops/qpointwise.py), no float32 tensor between."""
    assert "com.microsoft.QLinearAdd" in {
        f"{n.domain}.{n.op_type}" for n in onnx.load(models["branches"]).graph.node
    }
    assert [(o.op, o.kind) for o in xtune.tasks(models["branches"], HOST).other_nodes] == [
        ("QuantizeLinear", "quantize"),
        ("com.microsoft.QLinearAdd", "qelementwise"),
        ("DequantizeLinear", "quantize"),
    ]
    scales: dict[str, np.ndarray] = {
        "s": np.array(0.01, np.float32),
        "z": np.array(-3, np.int8),
        "ys": np.array(0.004, np.float32),
        "yz": np.array(5, np.int8),
    }
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="q"),
            helper.make_node(
                "QLinearGlobalAveragePool",
                ["xq", "s", "z", "ys", "yz"],
                ["pq"],
                name="gap",
                domain="com.microsoft",
            ),
            helper.make_node(
                "QLinearSigmoid", ["pq", "ys", "yz", "s", "z"], ["sq"], name="sig", domain="com.microsoft"
            ),
            helper.make_node("DequantizeLinear", ["sq", "s", "z"], ["y"], name="dq"),
        ],
        "pool",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 64, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 64, 1, 1])],
        [numpy_helper.from_array(v, k) for k, v in scales.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    pool = _save(tmp_path / "pool.onnx", helper.make_model(graph, opset_imports=opsets))
    for path in (models["branches"], pool):
        report = bench_model(path, get_board("local"), repeat=1)
        assert report.correct, (path.name, report.error)


def test_quantize_linear_rounds_half_to_even_and_saturates_as_onnx_runtime(tmp_path: Path) -> None:
    """x -> QuantizeLinear(scale 0.5, zero 3) -> DequantizeLinear: ties both ways and both saturations."""
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
            helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq"),
        ],
        "qdq",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 24])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 24])],
        [
            numpy_helper.from_array(np.array(0.5, np.float32), "s"),
            numpy_helper.from_array(np.array(3, np.int8), "z"),
        ],
    )
    path = _save(tmp_path / "qdq.onnx", helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    ties = np.array([0.25, 0.75, -0.25, -0.75, 1.25, -1.25, 2.25, -2.25], np.float32)
    x = np.concatenate([ties, [100.0, -100.0, 65.0, -66.0], np.linspace(-3, 3, 12)]).astype(np.float32)[None]
    got, _ = run_network(get_board("local"), build_model(path, HOST), x)
    assert np.array_equal(got, _ort(path, x))


def test_matmul_integer_takes_an_int8_input_and_writes_int32_sums(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    b = rng.integers(-128, 128, (16, 8)).astype(np.int8)
    graph = helper.make_graph(
        [helper.make_node("MatMulInteger", ["x", "b", "za"], ["y"], name="mmi")],
        "mmi",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.INT32, [4, 8])],
        [numpy_helper.from_array(b, "b"), numpy_helper.from_array(np.array(-5, np.int8), "za")],
    )
    path = _save(tmp_path / "mmi.onnx", helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))
    artifact = build_model(path, HOST)
    assert [c.kernel.key for c in artifact.program.calls] == ["qmatmul:m=4,n=8,k=16,requant=none"]  # type: ignore[union-attr]
    assert "int net_run(const int8_t *input, int32_t *output, void *workspace);" in artifact.header
    x = network_input(artifact)
    got, _ = run_network(get_board("local"), artifact, x)
    ref = (x.astype(np.int32) + 5) @ b.astype(np.int32)
    assert got.dtype == np.int32 and np.array_equal(got, ref)
    with pytest.raises(
        InputError, match="a reference file holds float32 arrays; this network's input is int8"
    ):
        reference_file(artifact, path)


def _qdq_conv(path: Path) -> Path:
    """DequantizeLinear -> Conv -> QuantizeLinear with int8 weights: a QLinearConv once imported."""
    rng = np.random.default_rng(4)
    w = rng.integers(-100, 100, (8, 4, 3, 3)).astype(np.int8)
    inits: dict[str, np.ndarray] = {
        "s": np.array(0.05, np.float32),
        "z": np.array(0, np.int8),
        "w": w,
        "ws": np.array(0.01, np.float32),
        "wz": np.array(0, np.int8),
        "ys": np.array(0.1, np.float32),
    }
    graph = helper.make_graph(
        [
            helper.make_node("QuantizeLinear", ["x", "s", "z"], ["xq"], name="qx"),
            helper.make_node("DequantizeLinear", ["xq", "s", "z"], ["xd"], name="dqx"),
            helper.make_node("DequantizeLinear", ["w", "ws", "wz"], ["wd"], name="dqw"),
            helper.make_node("Conv", ["xd", "wd"], ["c"], name="conv", pads=[1, 1, 1, 1]),
            helper.make_node("QuantizeLinear", ["c", "ys", "z"], ["cq"], name="qc"),
            helper.make_node("DequantizeLinear", ["cq", "ys", "z"], ["y"], name="dqc"),
        ],
        "qconv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return _save(path, helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]))


def test_a_quantized_conv_is_a_qconv2d_task_and_equals_onnx_runtime(tmp_path: Path) -> None:
    """The QLinearConv the import makes runs as the int8 conv family's task, in NHWC (the quantize steps
    in the network's layout, the float input converted before its QuantizeLinear)."""
    path = _qdq_conv(tmp_path / "qconv.onnx")
    assert [n.op for n in load_graph(path).nodes] == ["QuantizeLinear", "QLinearConv", "DequantizeLinear"]
    tasks = xtune.tasks(path, HOST)
    assert [t.workload.key for t in tasks.tasks] == [
        "qconv2d:n=1,c=4,h=6,w=6,k=8,r=3,s=3,stride=1,pad=1,dequant=1"
    ]
    artifact = build_model(path, HOST)
    x = network_input(artifact)
    got, _ = run_network(get_board("local"), artifact, x)
    assert np.array_equal(got, _ort(path, x))


def test_a_float_operator_reading_an_int8_tensor_is_refused_in_one_line_naming_it(tmp_path: Path) -> None:
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")],
        "int8_relu",
        [helper.make_tensor_value_info("x", TensorProto.INT8, [4, 16])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [4, 16])],
    )
    path = _save(
        tmp_path / "relu.onnx", helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    )
    with pytest.raises(InputError) as err:
        build_model(path, HOST)
    assert "\n" not in str(err.value)
    assert "node 'relu' (Relu): tensor 'x' is int8; xtune has no int8 kernel of Relu" in str(err.value)
