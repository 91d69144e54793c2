"""8-bit MaxPool: the pooling family's maximum over int8/uint8 tensors (xtune/ops/qpool.py's ClampedMax)
against ONNX's definition (padding -inf) transcribed, interpreted and on the host and qemu-aarch64; ONNX
models whose DequantizeLinear -> MaxPool -> QuantizeLinear the quantized rewrite turns into a MaxPool of
the stored values (quantize_static's, and written here: the same and other scales, an odd zero point, a
Relu before the QuantizeLinear, a float output), a QOperator model's MaxPool of an 8-bit input, and a
TFLite int8/uint8 MAX_POOL_2D with a fused RELU, each built whole and equal to ONNX Runtime (or LiteRT's
reference kernels); the stem of a quantize_static conv -> MaxPool -> conv network writes 8-bit."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.board_run import run_cases
from tests.nest_interp import check_one_input_op
from tests.networks import quantize_qdq
from tests.tflite_nets import SAME, VALID, Net
from tests.tflite_run import feeds, litert, litert_ranges
from xtune.boards.board import get_board
from xtune.errors import InputError
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import network_input, random_input, run_network
from xtune.frontend.load import load_graph
from xtune.ops.layout import Layout
from xtune.ops.pool2d import Pool2d, PoolKind
from xtune.ops.qpool import ClampedMax
from xtune.tuning.peers import ort_network

pytest.importorskip("onnxruntime")
HOST = get_board("local").target
OPSETS = [helper.make_opsetid("", 17)]
ELEM = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}


def onnx_max(x: np.ndarray, op: Pool2d) -> np.ndarray:
    """ONNX's MaxPool of NCHW `x` (the padding -inf), clamped to [lo, hi]."""
    assert isinstance(op.quantized, ClampedMax)
    (kh, kw), (sh, sw), (pt, pl, pb, pr) = op.kernel, op.stride, op.pads
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (pt, pb), (pl, pr)), constant_values=-np.inf)
    _, _, oh, ow = op.output_shape
    out = np.empty(op.output_shape)
    for i, j in np.ndindex(oh, ow):
        out[:, :, i, j] = padded[:, :, i * sh : i * sh + kh, j * sw : j * sw + kw].max(axis=(2, 3))
    return np.clip(out, op.quantized.lo, op.quantized.hi).astype(x.dtype)


def _max(
    nchw: tuple[int, int, int, int], kernel: tuple[int, int], window: ClampedMax, **geometry: Any
) -> Pool2d:
    n, c, h, w = nchw
    return Pool2d(kind=PoolKind.MAX, n=n, c=c, h=h, w=w, kernel=kernel, quantized=window, **geometry)


S8, U8 = ClampedMax(qtype="int8", lo=-128, hi=127), ClampedMax(qtype="uint8", lo=0, hi=255)
POOLS = {
    "3x3s2p1-int8": _max((1, 5, 9, 7), (3, 3), S8, stride=(2, 2), pads=(1, 1, 1, 1)),
    "2x2s2-uint8": _max((2, 3, 7, 7), (2, 2), U8, stride=(2, 2)),
    "3x3s1-relu-int8": _max((1, 4, 6, 5), (3, 3), replace(S8, lo=-9), pads=(1, 1, 1, 1)),
    "3x2-uneven-uint8-hi": _max((1, 6, 6, 8), (3, 2), replace(U8, hi=200), stride=(1, 2), pads=(2, 0, 1, 1)),
}


def _case(name: str, layout: Layout) -> tuple[Pool2d, np.ndarray, np.ndarray]:
    """The pool in `layout`, an input of values mostly near the type's minimum (whole windows at the border
    below 0 or 128: a padding of anything but the minimum shows) and the expected output."""
    nchw = POOLS[name]
    assert nchw.quantized is not None
    info = np.iinfo(nchw.quantized.qtype)
    x = np.random.default_rng(5).integers(info.min, info.min + 150, nchw.input_shapes[0], endpoint=True)
    x = x.astype(nchw.quantized.qtype)
    want = onnx_max(x, nchw)
    if layout is Layout.NHWC:
        x, want = (np.ascontiguousarray(a.transpose(0, 2, 3, 1)) for a in (x, want))
        return replace(nchw, layout=layout), x, want
    return nchw, x, want


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("name", POOLS)
def test_the_8bit_maximum_is_onnx_maxpool(name: str, layout: Layout) -> None:
    check_one_input_op(*_case(name, layout), lanes=(1, 3))


@pytest.mark.parametrize("board", ["local", "qemu-aarch64"])
def test_the_8bit_maximum_runs_exactly_on_the_boards(board: str) -> None:
    run_cases(board, "maxpool", ((f"{n} {lay.value}", *_case(n, lay)) for n in POOLS for lay in Layout))


def test_an_average_pool_does_not_take_an_8bit_maximum() -> None:
    with pytest.raises(InputError, match="8-bit average pool cannot take ClampedMax"):
        replace(POOLS["2x2s2-uint8"], kind=PoolKind.AVERAGE)


# --- a quantize_static conv -> Relu -> MaxPool -> conv network ------------------------------------------


def _stem(path: Path, uint8: bool) -> Path:
    """x[1,3,32,32] -> Conv 3x3 3->16 -> Relu -> MaxPool 3x3 s2 p1 -> Conv 3x3 16->8: ResNet's stem in
    small, quantized by quantize_static (QDQ, per channel, calibrated on random inputs)."""
    rng = np.random.default_rng(3)
    inits = {
        "w1": rng.normal(0, 0.3, (16, 3, 3, 3)),
        "b1": rng.normal(0, 0.3, 16),
        "w2": rng.normal(0, 0.3, (8, 16, 3, 3)),
        "b2": rng.normal(0, 0.3, 8),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node(
            "MaxPool", ["r1"], ["p"], name="pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1] * 4
        ),
        helper.make_node("Conv", ["p", "w2", "b2"], ["y"], name="conv2", pads=[1, 1, 1, 1]),
    ]
    graph = helper.make_graph(
        nodes,
        "stem",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 16, 16])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    source = path.with_name(f"{path.stem}_float.onnx")
    onnx.save(helper.make_model(graph, opset_imports=OPSETS), source)
    batches = list(np.random.default_rng(4).uniform(-1, 1, (4, 1, 3, 32, 32)).astype(np.float32))
    return quantize_qdq(source, path, batches, uint8=uint8)


@pytest.fixture(scope="module", params=["int8", "uint8"])
def stem(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    kind: str = request.param
    return _stem(tmp_path_factory.mktemp("stem") / f"stem_{kind}.onnx", kind == "uint8"), kind


def test_the_stem_conv_writes_8bit_for_the_maxpool(stem: tuple[Path, str]) -> None:
    """Before the 8-bit MaxPool the stem conv wrote float32 (`dequant=1`, 64 KB at 16x32x32) for a float
    MaxPool with its QuantizeLinear, a 69 632-byte workspace (that tensor and the pooled one) for a
    network whose float32 build needs 81 920; now every tensor between the QuantizeLinear of the input
    and the last conv is 8-bit, and the peak is the conv's 16x32x32 output beside the pooled 16x16x16."""
    path, kind = stem
    graph = load_graph(path)
    (pool,) = [n for n in graph.nodes if n.op == "MaxPool"]
    assert graph.dtype(pool.inputs[0]) == kind and graph.dtype(pool.outputs[0]) == kind
    assert graph.nodes[graph.producers()[pool.inputs[0]]].op == "QLinearConv"
    artifact = build_model(path, HOST)
    calls = artifact.program.calls
    keys = [c.kernel.key if hasattr(c.kernel, "key") else c.kernel.label for c in calls]
    assert [k.split(":")[0] for k in keys] == [
        "transpose->nhwc",
        "quantize",
        "qconv2d",
        "pool2d",
        "qconv2d",
        "transpose->nchw",
    ]
    assert not keys[2].endswith("dequant=1") and keys[4].endswith("dequant=1")
    memory = artifact.program.memory
    assert memory.workspace_bytes == memory.lower_bound == 16 * 32 * 32 + 16 * 16 * 16
    float_build = build_model(path.with_name(f"{path.stem}_float.onnx"), HOST).program.memory
    assert 4 * memory.workspace_bytes == float_build.workspace_bytes == 81920
    for seed in range(2):
        x = network_input(artifact) * (1 + seed)
        got, _ = run_network(get_board("local"), artifact, x)
        assert np.array_equal(got, ort_network(path.read_bytes(), x)[0]), seed


def test_the_stem_equals_onnx_runtime_under_qemu_aarch64(stem: tuple[Path, str]) -> None:
    board = get_board("qemu-aarch64")
    if board.target.qemu_binary and shutil.which(board.target.qemu_binary) is None:
        pytest.skip(f"needs {board.target.qemu_binary}")
    path, _ = stem
    artifact = build_model(path, board.target)
    x = network_input(artifact)
    got, _ = run_network(board, artifact, x)
    assert np.array_equal(got, ort_network(path.read_bytes(), x)[0])


# --- QDQ MaxPools written here ---------------------------------------------------------------------------

# (x scale, x zero point) and (y scale, y zero point) of each kind; "same" keeps x's for y.
QPARAMS = {"int8": ((0.011, 37), (0.0073, -21)), "uint8": ((0.009, 141), (0.013, 99))}


def _qdq_pool(kind: str, form: str) -> onnx.ModelProto:
    """x[1,6,7,9] float -> QuantizeLinear -> DequantizeLinear -> MaxPool 3x3 s2 p1 -> ..., `form`:
    "same" QuantizeLinear of x's scale and zero point -> DequantizeLinear; "requant" of another;
    "relu" a Relu, then "same"; "float" the pooled float32 as the output. The zero point is odd and far
    from the type's minimum, so a padding of zero points would show at the border."""
    (sx, zx), (sy, zy) = QPARAMS[kind]
    if form != "requant":
        sy, zy = sx, zx
    dtype = np.dtype(kind)
    inits = {"sx": np.float32(sx), "zx": dtype.type(zx), "sy": np.float32(sy), "zy": dtype.type(zy)}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", "sx", "zx"], ["xq"], name="q_in"),
        helper.make_node("DequantizeLinear", ["xq", "sx", "zx"], ["xf"], name="dq_in"),
        helper.make_node(
            "MaxPool", ["xf"], ["p"], name="pool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]
        ),
    ]
    pooled = "p"
    if form == "relu":
        nodes.append(helper.make_node("Relu", ["p"], ["r"], name="relu"))
        pooled = "r"
    if form != "float":
        nodes += [
            helper.make_node("QuantizeLinear", [pooled, "sy", "zy"], ["yq"], name="q_out"),
            helper.make_node("DequantizeLinear", ["yq", "sy", "zy"], ["y"], name="dq_out"),
        ]
    graph = helper.make_graph(
        nodes,
        f"maxpool_{form}",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 6, 7, 9])],
        [helper.make_tensor_value_info("y" if form != "float" else "p", TensorProto.FLOAT, [1, 6, 4, 5])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=OPSETS)


def _equals_onnx_runtime(model: onnx.ModelProto, path: Path, seeds: int = 2) -> None:
    """xtune's build of `model` on the host gives ONNX Runtime's output on `seeds` random inputs."""
    onnx.save(model, path)
    artifact = build_model(path, HOST)
    for seed in range(seeds):
        x = random_input(artifact.program.input_shape, seed, artifact.program.input_type)
        got, _ = run_network(get_board("local"), artifact, x)
        np.testing.assert_array_equal(got, ort_network(path.read_bytes(), x)[0], err_msg=f"seed {seed}")


@pytest.mark.parametrize("form", ["same", "requant", "relu", "float"])
@pytest.mark.parametrize("kind", ["int8", "uint8"])
def test_a_qdq_maxpool_pools_the_stored_values_and_equals_onnx_runtime(
    kind: str, form: str, tmp_path: Path
) -> None:
    """Of one scale and zero point the pair around the pool goes (a Relu becomes the clamp `out_lo`, the
    zero point); otherwise the DequantizeLinear moves after the pool, which reads the 8-bit tensor."""
    model = _qdq_pool(kind, form)
    graph = load_graph(model)
    (pool,) = [n for n in graph.nodes if n.op == "MaxPool"]
    assert graph.dtype(pool.inputs[0]) == kind and graph.dtype(pool.outputs[0]) == kind
    after = [n.op for n in graph.nodes[graph.nodes.index(pool) + 1 :]]
    requantized = ["DequantizeLinear", "QuantizeLinear", "DequantizeLinear"]
    assert after == (requantized if form == "requant" else ["DequantizeLinear"])
    assert pool.attrs.get("out_lo") == (QPARAMS[kind][0][1] if form == "relu" else None)
    _equals_onnx_runtime(model, tmp_path / "model.onnx")


@pytest.mark.parametrize("kind", ["int8", "uint8"])
def test_a_qoperator_maxpool_of_an_8bit_input_equals_onnx_runtime(kind: str, tmp_path: Path) -> None:
    """A MaxPool reading an 8-bit tensor itself (ONNX Runtime's QOperator form writes its MaxPool so),
    padded (SAME_UPPER: the extra row and column at the end)."""
    node = helper.make_node(
        "MaxPool", ["x"], ["y"], name="pool", kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_UPPER"
    )
    graph = helper.make_graph(
        [node],
        "qmaxpool",
        [helper.make_tensor_value_info("x", ELEM[kind], [1, 8, 8, 9])],
        [helper.make_tensor_value_info("y", ELEM[kind], [1, 8, 4, 5])],
    )
    _equals_onnx_runtime(helper.make_model(graph, opset_imports=OPSETS), tmp_path / "model.onnx", seeds=1)


# --- TFLite's int8 and uint8 MAX_POOL_2D -----------------------------------------------------------------


def _tflite_pools(net: Net) -> list[int]:
    """An int8 (or uint8) input max-pooled 2x2, then 3x3 SAME with a fused RELU (TFLite keeps the input's
    scale and zero point, so the RELU clamps at the zero point)."""
    x = net.input((1, 9, 9, 8))
    y = net.pool("MAX_POOL_2D", x, 2, 2, padding=VALID)
    return [net.pool("MAX_POOL_2D", y, 3, 1, padding=SAME, act="RELU")]


@pytest.mark.parametrize("kind", ["int8", "uint8"])
def test_a_tflite_max_pool_is_an_8bit_maxpool_equal_to_litert(kind: str, tmp_path: Path) -> None:
    pytest.importorskip("ai_edge_litert")
    calibration = Net()
    data = calibration.tflite(_tflite_pools(calibration))
    net = Net(litert_ranges(data, feeds(data, seed=7)), unsigned=kind == "uint8")
    data = net.tflite(_tflite_pools(net))
    path = tmp_path / "pools.tflite"
    path.write_bytes(data)
    graph = load_graph(path)
    pools = [n for n in graph.nodes if n.op == "MaxPool"]
    assert len(pools) == 2 and not [n for n in graph.nodes if n.op.endswith("QuantizeLinear")]
    assert all(graph.dtype(n.inputs[0]) == kind for n in pools)
    assert "out_lo" not in pools[0].attrs and pools[1].int_attr("out_lo", 0) > np.iinfo(kind).min  # the RELU
    artifact = build_model(path, HOST)
    for seed in range(2):
        x = random_input((1, 9, 9, 8), seed, kind)
        got, _ = run_network(get_board("local"), artifact, x)
        np.testing.assert_array_equal(got, litert(data, [x], reference=True)[0], err_msg=f"seed {seed}")
