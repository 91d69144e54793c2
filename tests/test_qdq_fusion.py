"""Quantize/Dequantize at a quantized network's float/int8 boundaries fused into the kernels next to them:
an int8 kernel writing its result dequantized (dequant=1, checked against the reference in the nest
interpreter for every int8 family and both requantizations), the QLinear element-wise sandwiches
(DequantizeLinear -> Add/Mul/GlobalAveragePool/Sigmoid/LeakyRelu -> QuantizeLinear) as one kernel each,
a float element-wise node's QuantizeLinear as its kernel's last step; a quantize_static ResNet-ish network
built with fewer steps and a smaller workspace, equal to ONNX Runtime on the host and under qemu-aarch64."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.nest_interp import run_kernel
from tests.networks import quantize_qdq
from tests.test_qmatmul import measure_some
from xtune.boards.board import get_board
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import bench_model, network_input, run_network
from xtune.frontend.load import load_graph
from xtune.ops.qmlas import QGlobalAveragePool
from xtune.ops.qpointwise import Quantized
from xtune.ops.quantize import QParams
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.workload import Workload, random_inputs
from xtune.target import get_target
from xtune.tuning.measure import CompilePool
from xtune.tuning.peers import ort_network

pytest.importorskip("onnxruntime.quantization")
HOST = "x86-avx2"  # every x86 host of the project runs AVX2 code
OPSETS = [helper.make_opsetid("", 17)]

# --- dequant=1: the int8 kernel's epilogue writes float32 ------------------------------------------------

DEQUANT = (
    "qmatmul:m=5,n=20,k=13,dequant=1",
    "qmatmul:m=6,n=17,k=23,a=u8,requant=tflite,perchannel=1,dequant=1",
    "qconv2d:n=1,c=5,h=6,w=7,k=9,r=3,s=3,pad=1,perchannel=1,dequant=1",
    "qdepthwise:n=1,c=20,h=6,w=5,r=3,s=3,stride=2,pad=1,a=u8,requant=tflite,dequant=1",
)


@pytest.mark.parametrize("target", ["x86-avx512-vnni", "arm-a72-neon"])
@pytest.mark.parametrize("key", DEQUANT)
def test_a_dequantizing_epilogue_rounds_to_8_bits_first(key: str, target: str) -> None:
    """The reference is the 8-bit result dequantized as DequantizeLinear computes it, and the template's
    nest (run by tests/nest_interp.py) equals it bit for bit."""
    wl = parse_workload(key)
    inputs = random_inputs(wl, seed=3)
    assert wl.tensors()[-1].dtype == "float32" and wl.tensors()[-2].name == "qparams"
    as_int8 = parse_workload(key.replace(",dequant=1", ""))
    q = as_int8.reference(
        [t for t, spec in zip(inputs, wl.tensors(), strict=False) if spec.name != "out_scale"]
    )
    zero = int(inputs[-1][1])
    scale = np.float32(inputs[-2][0])
    expected = wl.reference(inputs)
    assert np.array_equal(expected, (q.astype(np.int32) - zero).astype(np.float32) * scale)
    template = template_for(wl, get_target(target))
    out = np.zeros(expected.shape, np.float32)
    run_kernel(
        template.kernel(template.default_config(), "k"),
        [*template.kernel_inputs(template.default_config(), inputs), out],
    )
    assert np.array_equal(out, expected)


def test_a_dequantizing_kernel_is_exact_on_the_local_board(compile_pool: CompilePool) -> None:
    """Measured as a tuning candidate is: the float32 output checked for equality (its spec is `exact`)."""
    assert parse_workload(DEQUANT[2]).tensors()[-1].exact
    measure_some("local", DEQUANT[2], compile_pool, "x86-avx2", extra=0)


# --- the QLinear element-wise sandwiches -----------------------------------------------------------------


def test_a_sandwich_kernel_dequantizes_each_load_and_quantizes_the_store() -> None:
    """Quantized(Add) in the nest interpreter: the three nodes' float32 arithmetic, bit for bit."""
    from xtune.ops.elementwise import Elementwise, ElementwiseOp

    a, b, c = (QParams(scale=s, zero=z, qtype="int8") for s, z in ((0.05, 3), (0.02, -7), (0.06, -20)))
    op = Quantized(inner=Elementwise(op=ElementwiseOp.ADD, shape=(3, 37)), reads=(a, b), writes=c)
    rng = np.random.default_rng(1)
    xs = [rng.integers(-128, 128, (3, 37)).astype(np.int8) for _ in range(2)]
    out = np.zeros((3, 37), np.int8)
    run_kernel(op.kernel_nest("k", 8), [*xs, out])
    expected = c.quantize(a.dequantize(xs[0]) + b.dequantize(xs[1]))
    assert np.array_equal(out, expected) and np.array_equal(op.reference(*xs), expected)


def _params(qtype: int) -> dict[str, QParams]:
    """The sandwich test's quantization of x, of its Relu r and of the output y, by element type."""
    kind: Literal["int8", "uint8"] = "int8" if qtype == TensorProto.INT8 else "uint8"
    zeros = {"x": 5, "r": -128, "y": -3} if kind == "int8" else {"x": 130, "r": 0, "y": 120}
    scales = {"x": 0.04, "r": 0.03, "y": 0.05}
    return {t: QParams(scale=scales[t], zero=zeros[t], qtype=kind) for t in zeros}


def _sandwich(path: Path, op: str, qtype: int) -> Path:
    """x -> Q -> DQ -> Relu -> Q -> DQ, then op (Add, Mul: of x and its Relu; LeakyRelu, Sigmoid: of the
    Relu) -> Q: the network's output is the sandwich's 8-bit result."""
    inits: dict[str, np.ndarray] = {}
    for t, q in _params(qtype).items():
        inits[f"{t}s"] = np.array(q.scale, np.float32)
        inits[f"{t}z"] = np.array(q.zero, q.qtype)
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"], name="qx"),
        helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"], name="dqx"),
        helper.make_node("Relu", ["xd"], ["r"], name="relu"),
        helper.make_node("QuantizeLinear", ["r", "rs", "rz"], ["rq"], name="qr"),
        helper.make_node("DequantizeLinear", ["rq", "rs", "rz"], ["rd"], name="dqr"),
    ]
    two = op in ("Add", "Mul")
    node = helper.make_node(op, ["xd", "rd"] if two else ["rd"], ["f"], name="op")
    if op == "LeakyRelu":
        node.attribute.append(helper.make_attribute("alpha", 0.1))
    nodes.append(node)
    nodes.append(helper.make_node("QuantizeLinear", ["f", "ys", "yz"], ["y"], name="qy"))
    graph = helper.make_graph(
        nodes,
        "sandwich",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 50])],
        [helper.make_tensor_value_info("y", qtype, [4, 50])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=OPSETS), path)
    return path


def _three_nodes(op: str, qtype: int, x: np.ndarray) -> np.ndarray:
    """The sandwich's output as its nodes compute it one after another, in numpy's float32 (an int8 Add
    as ONNX Runtime's x86-64 build runs it, unfused: xtune/frontend/quantized.py)."""
    q = _params(qtype)
    xd = q["x"].dequantize(q["x"].quantize(x))
    rd = q["r"].dequantize(q["r"].quantize(np.maximum(xd, np.float32(0))))
    f = {
        "Add": lambda: xd + rd,
        "Mul": lambda: xd * rd,
        "LeakyRelu": lambda: np.where(rd >= 0, rd, np.float32(0.1) * rd),
    }[op]()
    return q["y"].quantize(f)


@pytest.mark.parametrize(
    ("op", "qtype"),
    [
        ("Add", TensorProto.INT8),
        ("Mul", TensorProto.UINT8),
        ("LeakyRelu", TensorProto.INT8),
        ("Sigmoid", TensorProto.UINT8),
    ],
)
def test_a_qdq_sandwich_is_one_8_bit_kernel_and_matches(tmp_path: Path, op: str, qtype: int) -> None:
    """The sandwich's DequantizeLinear and QuantizeLinear steps are gone, and the float Relu's QuantizeLinear
    is its kernel's last step: four calls where there were eight, the output the nodes' own values."""
    path = _sandwich(tmp_path / f"{op}.onnx", op, qtype)
    names = [n.op for n in load_graph(path).nodes]
    assert f"com.microsoft.QLinear{op}" in names and op not in names
    artifact = build_model(path, HOST)
    labels = [c.kernel.label for c in artifact.program.calls if not isinstance(c.kernel, Workload)]
    assert labels == ["quantize", "dequantize", "qclip", f"q{'add' if op == 'Add' else op.lower()}"], labels
    x = 3 * network_input(artifact)
    got, _ = run_network(get_board("local"), artifact, x)
    if op != "Sigmoid":  # (xtune's exp is its own polynomial: ONNX Runtime's rule below)
        assert np.array_equal(got, _three_nodes(op, qtype, x))
    report = bench_model(path, get_board("local"), repeat=1)
    assert report.correct, report.error  # ONNX Runtime's own QLinear kernels: the one-step rule


# --- a quantize_static ResNet-ish network ----------------------------------------------------------------


def _resnetish(path: Path, float_head: bool = False) -> Path:
    """x[1,3,8,8] -> Conv 3x3 -> Relu -> Conv 3x3 -> Relu -> Conv 3x3 -> Add (the first Relu's output) ->
    Relu -> GlobalAveragePool -> Flatten -> Gemm: a residual block and a classifier, quantized by
    `quantize_static` (QDQ, per channel, int8 activations; its Relus fold into the QuantizeLinear ranges),
    with `float_head` all but the Gemm: a float classifier after the int8 pooling."""
    rng = np.random.default_rng(11)
    shapes = {"w1": (8, 3, 3, 3), "w2": (8, 8, 3, 3), "w3": (8, 8, 3, 3), "wf": (10, 8)}
    inits = {k: rng.normal(0, 0.3, s).astype(np.float32) for k, s in shapes.items()}
    inits |= {f"b{k[1]}": rng.normal(0, 0.3, s[0]).astype(np.float32) for k, s in shapes.items()}
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"], name="relu2"),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], name="conv3", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c3", "r1"], ["s"], name="add"),
        helper.make_node("Relu", ["s"], ["r3"], name="relu3"),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"], name="gap"),
        helper.make_node("Flatten", ["g"], ["f"], name="flat"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc", transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "resnetish",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    source = path.with_name("resnetish_float.onnx")
    onnx.save(helper.make_model(graph, opset_imports=OPSETS), source)

    batches = list(np.random.default_rng(12).uniform(-1, 1, (4, 1, 3, 8, 8)).astype(np.float32))
    op_types = ["Conv", "Add", "GlobalAveragePool", "Relu"] if float_head else None
    return quantize_qdq(source, path, batches, op_types)


@pytest.fixture(scope="module")
def resnetish(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _resnetish(tmp_path_factory.mktemp("qdq_fusion") / "resnetish.onnx")


def _kinds(artifact: object) -> list[str]:
    calls = artifact.program.calls  # type: ignore[attr-defined]
    return [c.kernel.op if isinstance(c.kernel, Workload) else c.kernel.label for c in calls]


def test_the_resnetish_network_runs_fused_in_8_steps_equal_to_onnx_runtime(resnetish: Path) -> None:
    """Unfused it ran in 14 steps (a DequantizeLinear after conv1 and conv3, the Add and the pooling in
    float32 with a QuantizeLinear and DequantizeLinear around them, the logits' DequantizeLinear) in a
    4608-byte workspace (11250 bytes of tensors): the Add and the pooling are now one 8-bit kernel each,
    the classifier's matmul writes the dequantized logits, and the workspace is three 8x8x8 int8 tensors
    at its peak (conv3 reads conv2's output and writes beside the residual conv1's)."""
    artifact = build_model(resnetish, HOST)
    prog = artifact.program
    assert _kinds(artifact) == [
        "transpose->nhwc",  # the float input to NHWC, then quantized
        "quantize",
        "qconv2d",
        "qconv2d",
        "qconv2d",
        "qadd",
        "qglobalaveragepool",
        "qmatmul",
    ]
    assert prog.calls[-1].kernel.key.endswith("dequant=1")  # type: ignore[union-attr]
    assert (prog.memory.workspace_bytes, prog.memory.lower_bound) == (3 * 512, 3 * 512)
    # the float input's NHWC copy (768) and every 8-bit tensor: x (192), 4 of 8x8x8, the pooled 8
    assert prog.memory.intermediate_bytes == 768 + 192 + 4 * 512 + 8
    x = network_input(artifact)
    got, _ = run_network(get_board("local"), artifact, x)
    assert np.array_equal(got, ort_network(resnetish.read_bytes(), x)[0])


def test_the_fused_resnetish_network_equals_onnx_runtime_under_qemu_aarch64(resnetish: Path) -> None:
    board = get_board("qemu-aarch64")
    if board.target.qemu_binary and shutil.which(board.target.qemu_binary) is None:
        pytest.skip(f"needs {board.target.qemu_binary}")
    artifact = build_model(resnetish, board.target)
    assert len(artifact.program.calls) == 8
    for seed in range(2):
        x = network_input(artifact) * (1 + seed)
        got, _ = run_network(board, artifact, x)
        assert np.array_equal(got, ort_network(resnetish.read_bytes(), x)[0])


def test_a_float_classifier_head_reads_the_pooling_kernels_float_output(tmp_path: Path) -> None:
    """The int8 pooling's DequantizeLinear (to the float Gemm) is its kernel's last step: the float
    classifier runs as the float matmul family, with no step between it and the 8-bit kernels."""
    path = _resnetish(tmp_path / "float_head.onnx", float_head=True)
    artifact = build_model(path, HOST)
    assert _kinds(artifact)[-2:] == ["qglobalaveragepool", "matmul"]
    pool = artifact.program.calls[-2]
    assert len(pool.nodes) == 2 and isinstance(pool.kernel, QGlobalAveragePool) and pool.kernel.dequantizes
    report = bench_model(path, get_board("local"), repeat=1)
    assert report.correct, report.error
