"""Which int8 QDQ Conv units ONNX Runtime's x86-64 build runs in float, and how it computes them: a residual
block (conv -> relu -> conv, plus the block's input) quantized by quant_pre_process and quantize_static
with int8 activations, its ONNX Runtime optimized graph (ORT_ENABLE_ALL, one thread) against
xtune/frontend/qdqunits.py's rule (which Convs stay float, which tensors become uint8), and ONNX Runtime's
float Conv output, every bit, against xtune/ops/mlasconv.py's MLAS order (and not another order's)."""

from __future__ import annotations

import platform
import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.conftest import NO_ARM_PEERS
from tests.networks import quantize_qdq
from xtune.frontend.load import load_graph
from xtune.frontend.qdqunits import u8_on_x86, x86_float_convs
from xtune.graph import Graph
from xtune.ops.mlasconv import dequantize_node, float_unit, mlas_conv, patches, sgemm_slices
from xtune.ops.qmlas import fuses_int8_qdq
from xtune.target import get_target
from xtune.tuning.arm_peers import optimized_aarch64, peers_built

ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxruntime.quantization")
X86 = platform.machine() in ("x86_64", "AMD64")
C, HW = 32, 10  # K = 32 * 3 * 3 = 288: three SGEMM slices of K


def _block() -> onnx.ModelProto:
    """x[1, 32, 10, 10] -> conv1 -> relu -> conv2 -> add(x) -> y: the first Conv's input DequantizeLinear
    is the Add's too."""
    rng = np.random.default_rng(5)
    inits = [
        numpy_helper.from_array(rng.normal(0, 0.1, (C, C, 3, 3)).astype(np.float32), "w1"),
        numpy_helper.from_array(rng.normal(0, 0.1, C).astype(np.float32), "b1"),
        numpy_helper.from_array(rng.normal(0, 0.1, (C, C, 3, 3)).astype(np.float32), "w2"),
        numpy_helper.from_array(rng.normal(0, 0.1, C).astype(np.float32), "b2"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
        helper.make_node("Add", ["c2", "x"], ["y"], name="add"),
    ]
    shape = [1, C, HW, HW]
    graph = helper.make_graph(
        nodes,
        "block",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, shape)],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    from onnxruntime.quantization.shape_inference import quant_pre_process

    tmp = tmp_path_factory.mktemp("block")
    onnx.save(_block(), tmp / "block.onnx")
    quant_pre_process(str(tmp / "block.onnx"), str(tmp / "pre.onnx"))
    rng = np.random.default_rng(2)
    batches = [rng.uniform(-1, 1, (1, C, HW, HW)).astype(np.float32) for _ in range(4)]
    return {
        kind: quantize_qdq(tmp / "pre.onnx", tmp / f"{kind}.onnx", batches, uint8=kind == "u8")
        for kind in ("s8", "u8")
    }


def _optimized(path: Path, tmp: Path) -> onnx.ModelProto:
    """ONNX Runtime's optimized graph of `path` on this host (ORT_ENABLE_ALL, one thread)."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.optimized_model_filepath = str(tmp / f"{path.stem}.opt.onnx")
    ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    return onnx.load(options.optimized_model_filepath)


@pytest.mark.skipif(not X86, reason="the rule is ONNX Runtime's x86-64 build's")
@pytest.mark.parametrize("kind", ["s8", "u8"])
def test_the_rule_names_the_convs_onnx_runtime_keeps_in_float(
    kind: str, models: dict[str, Path], tmp_path: Path
) -> None:
    """int8: conv1 (its input shared with the Add, so never made uint8) stays a float Conv, conv2 (both
    its activations made uint8) becomes a QLinearConv; uint8 needs no conversion and both fuse."""
    graph = load_graph(models[kind], qdq=True)
    optimized = _optimized(models[kind], tmp_path)
    floats = {n.name for n in optimized.graph.node if n.op_type == "Conv" and n.domain in ("", "ai.onnx")}
    fused = [n for n in optimized.graph.node if n.op_type == "QLinearConv"]
    assert x86_float_convs(graph) == floats == ({"conv1"} if kind == "s8" else set())
    assert len(fused) == (1 if kind == "s8" else 2)
    u8 = u8_on_x86(graph) if kind == "s8" else None  # a uint8 model's quantizers are all uint8
    assert _uint8_quantizers(optimized) == _quantizers(graph, u8, optimized)


def _uint8_quantizers(optimized: onnx.ModelProto) -> set[str]:
    """The QuantizeLinear nodes of ONNX Runtime's optimized graph that write uint8."""
    zeros = {i.name: numpy_helper.to_array(i) for i in optimized.graph.initializer}
    return {
        n.name
        for n in optimized.graph.node
        if n.op_type == "QuantizeLinear" and str(zeros[n.input[2]].dtype) == "uint8"
    }


def _quantizers(graph: Graph, tensors: frozenset[str] | None, optimized: onnx.ModelProto) -> set[str]:
    """The QuantizeLinear nodes of `graph` writing `tensors` (None: all of them, a uint8 model's) that are
    still nodes of ONNX Runtime's `optimized` graph (a fused unit's are inside its QLinear node)."""
    kept = {n.name for n in optimized.graph.node}
    return {
        n.name
        for n in graph.nodes
        if n.op == "QuantizeLinear" and n.name in kept and (tensors is None or n.outputs[0] in tensors)
    }


def _sum_of_two(shared: bool) -> onnx.ModelProto:
    """Two 1x1 convs of x added; `shared`: both conv outputs and the sum read twice (a Mul, two outputs)."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.normal(0, 0.2, (8, 8, 1, 1)).astype(np.float32), w) for w in "ab"]
    nodes = [
        helper.make_node("Conv", ["x", "a"], ["ya"], name="conv_a"),
        helper.make_node("Conv", ["x", "b"], ["yb"], name="conv_b"),
        helper.make_node("Add", ["ya", "yb"], ["s"], name="add"),
    ]
    outs = ["s"]
    if shared:
        nodes += [
            helper.make_node("Mul", ["ya", "yb"], ["m"], name="mul"),
            helper.make_node("Sigmoid", ["s"], ["z"], name="sigmoid"),
        ]
        outs = ["s", "z", "m"]
    shape = [1, 8, 6, 6]
    graph = helper.make_graph(
        nodes,
        "sum",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, shape) for o in outs],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.skipif(not X86, reason="the rule is ONNX Runtime's x86-64 build's")
@pytest.mark.parametrize("shared", [False, True])
def test_an_int8_add_fuses_on_x86_where_its_activations_end_one_type(shared: bool, tmp_path: Path) -> None:
    """Not every int8 Add stays float on x86: read once, its three activations become uint8 and ONNX
    Runtime fuses a uint8 QLinearAdd; all read twice, they stay int8 and it fuses an int8 QLinearAdd;
    the Mul of two int8 inputs into a uint8 output (its own read once) stays float."""
    onnx.save(_sum_of_two(shared), tmp_path / "sum.onnx")
    rng = np.random.default_rng(3)
    batches = [rng.uniform(-1, 1, (1, 8, 6, 6)).astype(np.float32) for _ in range(3)]
    path = quantize_qdq(tmp_path / "sum.onnx", tmp_path / "sum_s8.onnx", batches)
    graph = load_graph(path, qdq=True)
    optimized = _optimized(path, tmp_path)
    assert _uint8_quantizers(optimized) == _quantizers(graph, u8_on_x86(graph), optimized)
    ops = {n.name: n.op_type for n in optimized.graph.node}
    assert ops["add"] == "QLinearAdd" and ops["conv_a"] == ops["conv_b"] == "Conv"
    assert x86_float_convs(graph) == {"conv_a", "conv_b"}
    assert ops.get("mul", "Mul") == "Mul"


def _tensors(graph: Graph, path: Path, names: list[str], x: np.ndarray) -> list[np.ndarray]:
    model = onnx.load(str(path))
    for name in names:
        elem = TensorProto.FLOAT if graph.dtype(name) == "float32" else TensorProto.INT8
        model.graph.output.append(helper.make_tensor_value_info(name, elem, None))
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return list(session.run(names, {"x": x}))


def test_mlas_order_is_onnx_runtimes_float_conv_bit_for_bit(models: dict[str, Path]) -> None:
    """conv1's float output as ONNX Runtime computes it (float32, every bit) is mlas_conv's of the
    dequantized input, weights and bias; the exact sum rounded once differs from it in the last bits."""
    graph = load_graph(models["s8"], qdq=True)
    (conv,) = [n for n in graph.nodes if n.name == "conv1"]
    writers = {t: n for n in graph.nodes for t in n.outputs}
    x = np.random.default_rng(9).uniform(-1, 1, (1, C, HW, HW)).astype(np.float32)
    dq_x = writers[conv.inputs[0]]
    xq, out = _tensors(graph, models["s8"], [dq_x.inputs[0], conv.outputs[0]], x)

    w_dq, b_dq = (writers[t] for t in conv.inputs[1:])
    xf = dequantize_node(graph, dq_x, xq, 1)
    w = dequantize_node(graph, w_dq, graph.constants[w_dq.inputs[0]], 0)
    b = dequantize_node(graph, b_dq, graph.constants[b_dq.inputs[0]], 0)
    assert sgemm_slices(HW * HW, C * 9) == (0, 128, 256)
    got = mlas_conv(xf, w, b, pads=(1, 1, 1, 1))
    assert got.tobytes() == np.asarray(out, np.float32).tobytes()
    (q,) = [n for n in graph.nodes if n.op == "QuantizeLinear" and n.inputs[0] == conv.outputs[0]]
    (yq,) = _tensors(graph, models["s8"], [q.outputs[0]], x)
    assert np.array_equal(float_unit(graph, conv, xq), yq)
    k = C * 9
    flat = (
        w.reshape(C, k).astype(np.float64) @ patches(xf[0], (3, 3), (1, 1), (1, 1, 1, 1)).astype(np.float64)
    ).astype(np.float32)
    assert not np.array_equal(flat.reshape(got.shape) + b.reshape(1, -1, 1, 1), got)


def test_sgemm_slices_follow_mlas_strides() -> None:
    """MlasSgemmOperation's K strides: 128; halved while the whole K fits in half (N >= K); doubled
    while N fits in half of a StrideN above 16 (N < K)."""
    assert sgemm_slices(3136, 576) == (0, 128, 256, 384, 512)
    assert sgemm_slices(784, 64) == (0,)
    assert sgemm_slices(49, 2304) == tuple(range(0, 2304, 256))
    assert sgemm_slices(10, 2304) == tuple(range(0, 2304, 1024))
    assert sgemm_slices(196, 1152) == tuple(range(0, 1152, 128))


def test_onnx_runtimes_aarch64_build_fuses_the_int8_units(models: dict[str, Path]) -> None:
    """ONNX Runtime's aarch64 build allows int8 (QDQIsInt8Allowed) and converts nothing: under
    qemu-aarch64 both Convs of the int8 block are QLinearConv and its Add a QLinearAdd, as xtune's ARM
    targets compute them (xtune/ops/qmlas.py, `fuses_int8_qdq`)."""
    if not peers_built():
        pytest.skip(NO_ARM_PEERS)
    if shutil.which("qemu-aarch64") is None:
        pytest.skip("needs qemu-aarch64")
    optimized = onnx.load_from_string(optimized_aarch64(models["s8"]))
    ops = sorted(n.op_type for n in optimized.graph.node if n.op_type not in ("Transpose", "QuantizeLinear"))
    assert ops == ["DequantizeLinear", "QLinearAdd", "QLinearConv", "QLinearConv"]
    assert fuses_int8_qdq(get_target("arm-a72-neon")) and not fuses_int8_qdq(get_target("x86-avx2"))
