"""TFLite's int8 AVERAGE_POOL_2D as an integer kernel: TFLite's integer average (the int32 sum of the
stored values divided by the count, rounded half away from zero; a float average rounded by
QuantizeLinear rounds ties to even instead). The kernel against a transcription of TFLite's reference
loop, on the host, under qemu-aarch64 and through the loop-nest interpreter, in both layouts; a model
written here (int8 and uint8, pools whose windows tie often, a fused RELU) built whole and compared with
LiteRT's reference kernels in the same process; the same graph without the TFLite mark keeps ONNX
Runtime's float form."""

from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import onnx
import pytest

from tests.board_run import run_entry
from tests.nest_interp import run_kernel
from tests.test_ops import image
from tests.tflite_nets import SAME, VALID, Net
from tests.tflite_run import feeds, litert, litert_ranges, ort
from xtune.boards.board import get_board
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import random_input, run_network
from xtune.frontend.load import load_graph
from xtune.frontend.tflite import tflite_to_onnx
from xtune.ops.layout import Layout
from xtune.ops.pool2d import Pool2d, PoolKind, RoundedMean

pytest.importorskip("ai_edge_litert")


def tflite_average(x: np.ndarray, op: Pool2d) -> np.ndarray:
    """reference_integer_ops::AveragePool (tensorflow/lite/kernels/internal/reference/integer_ops/
    pooling.h) transcribed loop for loop, Python integers, NCHW."""
    assert op.rounded is not None
    (kh, kw), (sh, sw), (pt, pl, _, _) = op.kernel, op.stride, op.pads
    _, _, oh, ow = op.output_shape
    out = np.zeros((op.n, op.c, oh, ow), np.int64)
    for b in range(op.n):
        for ch in range(op.c):
            for oy in range(oh):
                for ox in range(ow):
                    y0, x0 = oy * sh - pt, ox * sw - pl
                    window = [
                        int(x[b, ch, y0 + i, x0 + j])
                        for i in range(max(0, -y0), min(kh, op.h - y0))
                        for j in range(max(0, -x0), min(kw, op.w - x0))
                    ]
                    acc, count = sum(window), len(window)
                    # C's `/` truncates toward zero
                    num = acc + count // 2 if acc > 0 else acc - count // 2
                    mean = abs(num) // count * (1 if num >= 0 else -1)
                    out[b, ch, oy, ox] = min(max(mean, op.rounded.lo), op.rounded.hi)
    return out


POOLS = {
    "2x2s2-int8": Pool2d(
        kind=PoolKind.AVERAGE,
        n=1,
        c=19,
        h=6,
        w=7,
        kernel=(2, 2),
        stride=(2, 2),
        rounded=RoundedMean(qtype="int8", lo=-128, hi=127),
    ),
    "3x3s1-same-relu-int8": Pool2d(
        kind=PoolKind.AVERAGE,
        n=2,
        c=5,
        h=5,
        w=9,
        kernel=(3, 3),
        pads=(1, 1, 1, 1),
        rounded=RoundedMean(qtype="int8", lo=-7, hi=127),
    ),
    "4x2s2-uint8": Pool2d(
        kind=PoolKind.AVERAGE,
        n=1,
        c=3,
        h=8,
        w=6,
        kernel=(4, 2),
        stride=(2, 2),
        pads=(1, 0, 1, 0),
        rounded=RoundedMean(qtype="uint8", lo=0, hi=200),
    ),
}


def _case(name: str, layout: Layout) -> tuple[Pool2d, np.ndarray, np.ndarray]:
    """The pool in `layout`, a random input in it and TFLite's output in it."""
    nchw = POOLS[name]
    assert nchw.rounded is not None
    x = random_input(nchw.input_shapes[0], 3, nchw.rounded.qtype)
    want = tflite_average(x, nchw).astype(nchw.rounded.qtype)
    if layout is Layout.NHWC:
        return (
            replace(nchw, layout=layout),
            np.ascontiguousarray(x.transpose(0, 2, 3, 1)),
            np.ascontiguousarray(want.transpose(0, 2, 3, 1)),
        )
    return nchw, x, want


@pytest.mark.parametrize("layout", list(Layout))
@pytest.mark.parametrize("name", POOLS)
def test_the_rounded_mean_is_tflites_integer_average(name: str, layout: Layout) -> None:
    op, x, want = _case(name, layout)
    np.testing.assert_array_equal(op.reference(x), want)
    for lanes in (1, 3):
        out = np.zeros_like(want)
        run_kernel(op.kernel_nest("pool", lanes), [x, out])
        np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("board", ["local", "qemu-aarch64"])
def test_the_integer_pool_runs_exactly_on_the_boards(board: str) -> None:
    target = get_board(board).target
    if target.qemu_binary and shutil.which(target.qemu_binary) is None:
        pytest.skip(f"needs {target.qemu_binary}")
    for name in POOLS:
        for layout in Layout:
            op, x, want = _case(name, layout)
            kernel = op.kernel_nest("pool", target.fp32_lanes)
            got = run_entry(board, image(kernel, target), "pool", [x, np.zeros_like(want)])
            np.testing.assert_array_equal(got[-1], want, err_msg=f"{name} {layout.value}")


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
    pools = [n for n in graph.nodes if n.op == "AveragePool"]
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
    """Without the TFLite mark the graph is an ONNX model: ONNX Runtime runs DequantizeLinear ->
    AveragePool -> QuantizeLinear as QLinearAveragePool, in float rounded half to even, and so does
    xtune."""
    data, _, kind = pooled
    if kind == "uint8":
        pytest.skip("ONNX Runtime runs a uint8 QDQ AveragePool as QLinearAveragePool: not yet")
    model = tflite_to_onnx(data)
    del model.metadata_props[:]
    graph = load_graph(model)
    assert all(graph.dtype(n.inputs[0]) == "float32" for n in graph.nodes if n.op == "AveragePool")
    path = tmp_path / "pools.onnx"
    onnx.save(model, path)
    artifact = build_model(path, get_board("local").target)
    for seed in range(2):
        x = random_input((1, 8, 8, 16), seed, kind)
        got, _ = run_network(get_board("local"), artifact, x)
        np.testing.assert_array_equal(got, ort(model, [x])[0])
