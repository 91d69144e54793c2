"""TFLite's int8 AVERAGE_POOL_2D as an integer kernel: TFLite's integer average (the int32 sum of the
stored values divided by the count, rounded half away from zero; a float average rounded by
QuantizeLinear rounds ties to even instead). The kernel against a transcription of TFLite's reference
loop, on the host, under qemu-aarch64 and through the loop-nest interpreter, in both layouts; a model
written here (int8 and uint8, pools whose windows tie often, a fused RELU) built whole and compared with
LiteRT's reference kernels in the same process; the same graph without the TFLite mark keeps ONNX
Runtime's float form."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

from tests.board_run import run_cases
from tests.nest_interp import check_one_input_op
from tests.tflite_nets import SAME, VALID, Net
from tests.tflite_run import feeds, litert, litert_ranges, ort
from xtune.boards.board import get_board
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import random_input, run_network
from xtune.frontend.load import load_graph
from xtune.frontend.tflite import tflite_to_onnx
from xtune.ops.layout import Layout
from xtune.ops.pool2d import QLINEAR_POOL, Pool2d, PoolKind
from xtune.ops.qpool import QLinearMean, QuantizedMean, RoundedMean

pytest.importorskip("ai_edge_litert")


def _windows(x: np.ndarray, op: Pool2d) -> list[tuple[tuple[int, int, int, int], list[np.generic]]]:
    """Each NCHW output's index and its window's pixels inside the input, rows then columns (the loops
    of both references)."""
    (kh, kw), (sh, sw), (pt, pl, _, _) = op.kernel, op.stride, op.pads
    _, _, oh, ow = op.output_shape
    found = []
    for b, ch, oy, ox in np.ndindex(op.n, op.c, oh, ow):
        y0, x0 = oy * sh - pt, ox * sw - pl
        rows, cols = range(max(0, -y0), min(kh, op.h - y0)), range(max(0, -x0), min(kw, op.w - x0))
        found.append(((b, ch, oy, ox), [x[b, ch, y0 + i, x0 + j] for i in rows for j in cols]))
    return found


def tflite_average(x: np.ndarray, op: Pool2d, mean: RoundedMean) -> np.ndarray:
    """reference_integer_ops::AveragePool (tensorflow/lite/kernels/internal/reference/integer_ops/
    pooling.h) transcribed, Python integers, NCHW."""
    out = np.zeros(op.output_shape, mean.qtype)
    for at, window in _windows(x, op):
        acc, count = sum(int(v) for v in window), len(window)
        num = acc + count // 2 if acc > 0 else acc - count // 2
        out[at] = min(max(int(num / count), mean.lo), mean.hi)  # C's `/` truncates toward zero
    return out


def ort_average(x: np.ndarray, op: Pool2d, mean: QLinearMean) -> np.ndarray:
    """ONNX Runtime's QLinearPool2DTask with its AveragePool (onnxruntime/contrib_ops/cpu/quantization/
    qlinear_pool.cc) transcribed, float32 scalars, NCHW."""
    f32 = np.float32
    out = np.zeros(op.output_shape, mean.qtype)
    lo, hi = np.iinfo(mean.qtype).min, np.iinfo(mean.qtype).max
    for at, window in _windows(x, op):
        y = f32(0)
        for v in window:
            y = f32(y + f32(mean.x_scale) * f32(int(v) - mean.x_zero))
        y = f32(y / f32(op.kernel[0] * op.kernel[1] if op.count_pad else len(window)))
        out[at] = max(lo, min(int(np.rint(f32(y / f32(mean.y_scale) + f32(mean.y_zero)))), hi))
    return out


def transcribed(x: np.ndarray, op: Pool2d) -> np.ndarray:
    if isinstance(op.quantized, RoundedMean):
        return tflite_average(x, op, op.quantized)
    assert isinstance(op.quantized, QLinearMean)
    return ort_average(x, op, op.quantized)


def _average(
    nchw: tuple[int, int, int, int], kernel: tuple[int, int], mean: QuantizedMean, **geometry: Any
) -> Pool2d:
    n, c, h, w = nchw
    return Pool2d(kind=PoolKind.AVERAGE, n=n, c=c, h=h, w=w, kernel=kernel, quantized=mean, **geometry)


TFLITE = RoundedMean(qtype="int8", lo=-128, hi=127)
POOLS = {
    "2x2s2-int8": _average((1, 19, 6, 7), (2, 2), TFLITE, stride=(2, 2)),
    "3x3s1-same-relu-int8": _average((2, 5, 5, 9), (3, 3), replace(TFLITE, lo=-7), pads=(1, 1, 1, 1)),
    "4x2s2-uint8": _average(
        (1, 3, 8, 6), (4, 2), RoundedMean(qtype="uint8", lo=0, hi=200), stride=(2, 2), pads=(1, 0, 1, 0)
    ),
    # ONNX Runtime's: another output scale, an odd output zero point, the padding counted or not
    "ort-3x3s1-uint8": _average(
        (1, 6, 7, 5),
        (3, 3),
        QLinearMean(qtype="uint8", x_scale=0.02, x_zero=131, y_scale=0.0125, y_zero=127),
        pads=(1, 1, 1, 1),
    ),
    "ort-2x2s2-count-pad-int8": _average(
        (1, 9, 5, 5),
        (2, 2),
        QLinearMean(qtype="int8", x_scale=0.05, x_zero=-3, y_scale=0.05, y_zero=-3),
        stride=(2, 2),
        pads=(0, 0, 1, 1),
        count_pad=True,
    ),
}


def _case(name: str, layout: Layout) -> tuple[Pool2d, np.ndarray, np.ndarray]:
    """The pool in `layout`, a random input in it and the reference's output in it."""
    nchw = POOLS[name]
    assert nchw.quantized is not None
    x = random_input(nchw.input_shapes[0], 3, nchw.quantized.qtype)
    want = transcribed(x, nchw)
    if layout is Layout.NHWC:
        return (
            replace(nchw, layout=layout),
            np.ascontiguousarray(x.transpose(0, 2, 3, 1)),
            np.ascontiguousarray(want.transpose(0, 2, 3, 1)),
        )
    return nchw, x, want


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("name", POOLS)
def test_the_8bit_means_are_the_references_transcribed(name: str, layout: Layout) -> None:
    check_one_input_op(*_case(name, layout), lanes=(1, 3))


@pytest.mark.parametrize("board", ["local", "qemu-aarch64"])
def test_the_integer_pool_runs_exactly_on_the_boards(board: str) -> None:
    run_cases(board, "pool", ((f"{n} {lay.value}", *_case(n, lay)) for n in POOLS for lay in Layout))


def _pools(net: Net) -> list[int]:
    """An int8 (or uint8) input pooled 2x2 (windows of 4: a tie wherever the sum is 2 mod 4), then 3x3
    SAME with a fused RELU (windows of 4, 6 and 9 pixels at the edges and inside)."""
    x = net.input((1, 8, 8, 16))
    y = net.pool("AVERAGE_POOL_2D", x, 2, 2, padding=VALID)
    return [net.pool("AVERAGE_POOL_2D", y, 3, 1, padding=SAME, act="RELU")]


def _model(unsigned: bool) -> bytes:
    calibration = Net()
    data = calibration.tflite(_pools(calibration))
    net = Net(litert_ranges(data, feeds(data, seed=7)), unsigned=unsigned)
    return net.tflite(_pools(net))


@pytest.fixture(scope="module", params=["int8", "uint8"])
def pooled(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[bytes, Path, str]:
    kind: str = request.param
    data = _model(kind == "uint8")
    path = tmp_path_factory.mktemp("tflite") / f"pools_{kind}.tflite"
    path.write_bytes(data)
    return data, path, kind


def test_a_tflite_average_pool_becomes_an_integer_pool(pooled: tuple[bytes, Path, str]) -> None:
    _, path, kind = pooled
    graph = load_graph(path)
    pools = [n for n in graph.nodes if n.op == QLINEAR_POOL]
    assert len(pools) == 2 and not [n for n in graph.nodes if n.op.endswith("QuantizeLinear")]
    assert all(n.attrs["requant"] == "tflite" and graph.dtype(n.inputs[0]) == kind for n in pools)
    assert "out_lo" not in pools[0].attrs and pools[1].int_attr("out_lo", 0) > np.iinfo(kind).min  # the RELU


def test_an_average_pool_with_ties_equals_litert_reference_kernels(pooled: tuple[bytes, Path, str]) -> None:
    """Equal to LiteRT's reference kernels on every output, where the float form (ONNX Runtime running
    the imported QDQ graph) is a step off at the ties."""
    data, path, kind = pooled
    artifact = build_model(path, get_board("local").target)
    float_form_off = 0
    for seed in range(3):
        x = random_input((1, 8, 8, 16), seed, kind)
        want = litert(data, [x], reference=True)[0]
        got, _ = run_network(get_board("local"), artifact, x)
        np.testing.assert_array_equal(got, want, err_msg=f"seed {seed}")
        float_form_off += int(np.count_nonzero(ort(tflite_to_onnx(data), [x])[0] != want))
    assert float_form_off > 0  # the inputs hold ties the two roundings disagree on


def test_an_onnx_models_average_pool_keeps_onnx_runtimes_float_form(
    pooled: tuple[bytes, Path, str], tmp_path: Path
) -> None:
    """Without the TFLite mark the graph is an ONNX model, and runs as ONNX Runtime runs it: the uint8
    DequantizeLinear -> AveragePool -> QuantizeLinear as its QLinearAveragePool, the int8 one and the
    pool with a Relu before its QuantizeLinear in float form."""
    data, _, kind = pooled
    model = tflite_to_onnx(data)
    del model.metadata_props[:]
    graph = load_graph(model)
    pools = [n for n in graph.nodes if n.op in ("AveragePool", QLINEAR_POOL)]
    assert [n.op for n in pools] == [QLINEAR_POOL if kind == "uint8" else "AveragePool", "AveragePool"]
    assert all("requant" not in n.attrs for n in pools)
    _equals_onnx_runtime(model, tmp_path, (1, 8, 8, 16), kind)


def _equals_onnx_runtime(model: onnx.ModelProto, tmp: Path, shape: tuple[int, ...], kind: str) -> None:
    """xtune's build of `model` on the host gives ONNX Runtime's outputs, on two seeded inputs."""
    path = tmp / "model.onnx"
    onnx.save(model, path)
    artifact = build_model(path, get_board("local").target)
    for seed in range(2):
        x = random_input(shape, seed, kind)
        got, _ = run_network(get_board("local"), artifact, x)
        np.testing.assert_array_equal(got, ort(model, [x])[0])


@pytest.mark.parametrize(
    ("kind", "attrs"),
    [("uint8", {"auto_pad": "SAME_UPPER"}), ("int8", {"pads": [1, 1, 1, 1], "count_include_pad": 1})],
)
def test_a_qoperator_qlinear_average_pool_equals_onnx_runtime(
    kind: str, attrs: dict[str, Any], tmp_path: Path
) -> None:
    """ONNX Runtime's own com.microsoft.QLinearAveragePool (QOperator), padded, input and output of
    different scales and odd zero points: equal to ONNX Runtime."""
    from onnx import TensorProto, helper, numpy_helper

    dtype = np.dtype(kind)
    inits = {
        "sx": np.float32(0.03),
        "zx": np.asarray(5 if kind == "int8" else 133, dtype),
        "sy": np.float32(0.021),
        "zy": np.asarray(-7 if kind == "int8" else 121, dtype),
    }
    elem = TensorProto.INT8 if kind == "int8" else TensorProto.UINT8
    node = helper.make_node(
        "QLinearAveragePool",
        ["x", "sx", "zx", "sy", "zy"],
        ["y"],
        domain="com.microsoft",
        kernel_shape=[3, 3],
        strides=[2, 2],
        **attrs,
    )
    graph = helper.make_graph(
        [node],
        "qpool",
        [helper.make_tensor_value_info("x", elem, [1, 8, 7, 9])],
        [helper.make_tensor_value_info("y", elem, [1, 8, 4, 5])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in inits.items()],
    )
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    )
    _equals_onnx_runtime(model, tmp_path, (1, 8, 7, 9), kind)
