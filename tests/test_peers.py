"""The peers a benchmark compares xtune with, on one thread: numpy, and ONNX Runtime running a small ONNX
model of the workload, which must compute what numpy computes."""

from __future__ import annotations

import numpy as np
import pytest

from xtune.ops.registry import parse_workload
from xtune.ops.workload import RTOL, compare_output, random_inputs
from xtune.tuning.peers import onnx_model, ort_network, ort_seconds

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

WORKLOADS = [
    "matmul:m=33,n=17,k=65",
    "matmul:m=8,n=24,k=40,bias=1,relu=1",
    "conv2d:n=1,c=5,h=13,w=11,k=7,r=3,s=3,stride=2,pad=1,bias=1,relu=1",
    "conv2d:n=2,c=3,h=9,w=10,k=4,r=3,s=2,dilation=2,pad=2",
    "conv2d:n=1,c=6,h=10,w=9,k=5,r=3,s=3,stride=2,pad=1,layout=nhwc,bias=1,relu=1",
    "depthwise:n=1,c=6,h=12,w=12,r=3,s=3,stride=2,pad=1,multiplier=2,bias=1,relu=1",
    "depthwise:n=1,c=4,h=9,w=9,r=5,s=5,pad=2,dilation=1",
    "depthwise:n=1,c=6,h=11,w=9,r=3,s=3,stride=2,pad=1,multiplier=2,layout=nhwc,bias=1,relu6=1",
    "depthwise:n=2,c=5,h=7,w=8,r=3,s=3,pad=1,layout=nhwc,residual=1,relu=1",
    "conv2d:n=1,c=3,h=8,w=8,k=5,r=3,s=3,pad=1,bias=1,residual=1,relu6=1",
    "matmul:m=5,n=9,k=200,residual=1,relu6=1",  # sums of 200 products: many past 6 for Clip to clamp
]


def ort_output(key: str) -> tuple[np.ndarray, np.ndarray]:
    """ONNX Runtime's output for the workload's model, and numpy's reference, from the same inputs."""
    wl = parse_workload(key)
    inputs = random_inputs(wl)
    session = ort.InferenceSession(onnx_model(wl).SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": inputs[0]})[0], wl.reference(inputs)


@pytest.mark.parametrize("key", WORKLOADS)
def test_the_onnx_model_computes_what_numpy_computes(key: str) -> None:
    got, expected = ort_output(key)
    assert got.shape == expected.shape
    assert compare_output(got, expected, RTOL) == ""
    if "relu=1" in key or "relu6=1" in key:
        assert got.min() == 0.0 and expected.min() == 0.0  # the epilogue clamps, on both sides
    if "relu6=1" in key:  # ReLU6 is Clip(0, 6)
        assert got.max() <= 6.0 and (got.max() == 6.0) == (expected.max() == 6.0)
    if "k=200" in key:
        assert got.max() == 6.0


@pytest.mark.parametrize("key", WORKLOADS)
def test_the_models_pass_the_onnx_checker(key: str) -> None:
    model = onnx_model(parse_workload(key))
    onnx.checker.check_model(model, full_check=True)  # full_check also infers and checks every shape


def test_a_plain_matmul_is_one_node() -> None:
    model = onnx_model(parse_workload("matmul:m=4,n=5,k=6"))
    assert [n.op_type for n in model.graph.node] == ["MatMul"]
    assert [
        n.op_type for n in onnx_model(parse_workload("depthwise:n=1,c=4,h=8,w=8,r=3,s=3")).graph.node
    ] == ["Conv"]


def test_ort_seconds_is_per_call_per_repeat() -> None:
    seconds = ort_seconds(
        parse_workload("conv2d:n=1,c=4,h=8,w=8,k=4,r=3,s=3,pad=1"), repeat=3, min_repeat_s=0.001
    )
    assert len(seconds) == 3 and all(s > 0 for s in seconds)


def test_without_onnxruntime_the_peer_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    from xtune.errors import InputError

    monkeypatch.setitem(__import__("sys").modules, "onnxruntime", None)  # `import onnxruntime` now fails
    with pytest.raises(InputError, match=r"pip install 'xtune\[bench\]'"):
        ort_seconds(parse_workload("matmul:m=4,n=4,k=4"))


def test_bench_reports_onnx_runtime_beside_numpy(monkeypatch: pytest.MonkeyPatch) -> None:
    from xtune.boards.board import get_board
    from xtune.tuning import kernel_bench as bench_module

    wl, board = parse_workload("conv2d:n=1,c=8,h=10,w=10,k=8,r=3,s=3,pad=1"), get_board("local")
    report = bench_module.bench(wl, board)
    d = report.as_dict()
    assert report.ort_gflops and report.ort_gflops > 0 and d["ort_gflops"] and d["ratio_vs_ort"]
    assert report.gflops and d["ratio_vs_ort"] == round(report.gflops / report.ort_gflops, 4)
    monkeypatch.setattr("xtune.tuning.peers.ort_available", lambda: False)  # as without the `bench` extra
    without = bench_module.bench(wl, board).as_dict()
    assert without["ort_gflops"] is None and without["ratio_vs_ort"] is None and without["numpy_gflops"]


def test_onnx_runtime_keeps_its_warnings_about_unused_initializers_to_itself(
    capfd: pytest.CaptureFixture[str],
) -> None:
    """Model-zoo files carry initializers no node reads; ONNX Runtime's default log level prints a
    warning line for each, which would bury `xtune bench --model`'s report."""
    from onnx import TensorProto, helper, numpy_helper

    unused = numpy_helper.from_array(np.zeros(2, np.int64), "unused_SHAPE")
    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        initializer=[unused],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    x = np.array([[-1.0, 2.0, -3.0, 4.0]], np.float32)
    got, _ = ort_network(model.SerializeToString(), x)
    np.testing.assert_array_equal(got, np.maximum(x, 0))
    out, err = capfd.readouterr()
    assert "unused_SHAPE" not in out + err
