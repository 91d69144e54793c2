"""Networks: ONNX import, fusion and task extraction, against onnx's own reference evaluator;
the test networks (tests/networks.py); every refusal in one line; `xtune tasks`; the small networks'
tasks on the boards."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

import xtune
from tests import networks
from tests.test_conv import check, configs
from xtune.boards.board import get_board
from xtune.cli import main
from xtune.errors import InputError
from xtune.frontend.load import load_graph
from xtune.frontend.tasks import FusedOp, TaskSet, extract_tasks
from xtune.ops.layout import to_layout, workload_layout
from xtune.ops.registry import family, template_for
from xtune.ops.template import SumTemplate
from xtune.schedule.space import Config
from xtune.target import get_target
from xtune.tuning.database import TuningLog, make_record
from xtune.tuning.measure import MeasureResult, MeasureStatus

TARGET = "x86-avx2"
RNG = np.random.default_rng(7)
Capture = pytest.CaptureFixture[str]


def f32(*shape: int, scale: float = 1.0) -> np.ndarray:
    return (RNG.uniform(-1, 1, shape) * scale).astype(np.float32)


def make(
    nodes: list[onnx.NodeProto],
    inputs: dict[str, list[int | str]],
    outputs: list[str],
    inits: dict[str, np.ndarray] | None = None,
    opset: int = 17,
    dtype: int = TensorProto.FLOAT,
) -> onnx.ModelProto:
    """A model of `nodes`; output shapes are left to ONNX shape inference."""
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info(n, dtype, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
        [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def conv(name: str, x: str, w: str, out: str, *extra: str, **attrs: Any) -> onnx.NodeProto:
    return helper.make_node("Conv", [x, w, *extra], [out], name=name, **attrs)


def bn_inits(prefix: str, k: int) -> dict[str, np.ndarray]:
    return {
        f"{prefix}.{p}": RNG.uniform(lo, hi, k).astype(np.float32)
        for p, lo, hi in (("g", 0.5, 1.5), ("b", -1, 1), ("m", -1, 1), ("v", 0.5, 2))
    }


def bn(name: str, x: str, out: str) -> onnx.NodeProto:
    return helper.make_node(
        "BatchNormalization", [x, *(f"{name}.{p}" for p in "gbmv")], [out], name=name, epsilon=1e-3
    )


def assert_ops_match_onnx(model: onnx.ModelProto, ops: list[FusedOp] | tuple[FusedOp, ...]) -> None:
    """Each fused call — the workload's numpy reference on the extracted weights, bias and residual —
    computes what onnx's reference evaluator computes for the nodes it replaces."""
    constants = {t.name for t in model.graph.initializer}
    feeds = {
        i.name: f32(*(d.dim_value for d in i.type.tensor_type.shape.dim), scale=3.0)
        for i in model.graph.input
        if i.name not in constants
    }
    computed = ReferenceEvaluator(model).run(None, feeds, intermediate=True)
    assert isinstance(computed, dict)
    values = {**feeds, **computed}
    for op in ops:
        specs = op.workload.tensors()
        lay = workload_layout(op.workload)  # activations and weights as the workload takes them
        weights = (
            family(op.workload.op).task_weights(op.workload, op.weights)
            if op.weights is not None
            else values[op.weights_input]
        )
        args = [to_layout(values[op.input], lay), weights]
        args += [op.bias] if op.workload["bias"] else []
        args += [to_layout(values[op.residual], lay)] if op.residual else []
        args = [np.asarray(a, dtype=np.float32).reshape(s.shape) for a, s in zip(args, specs, strict=False)]
        got = op.workload.reference(args)
        want = to_layout(np.asarray(values[op.output]), lay)
        np.testing.assert_allclose(got.reshape(want.shape), want, rtol=1e-4, atol=1e-4, err_msg=op.anchor)


def only_op(model: onnx.ModelProto) -> tuple[TaskSet, FusedOp]:
    ts = extract_tasks(model, TARGET)
    ops = [op for t in ts.tasks for op in t.ops]
    assert_ops_match_onnx(model, ops)
    return ts, ops[0]


# --- fusion ---------------------------------------------------------------------------------------------


def test_conv_bias_batchnorm_residual_relu_fuse_into_one_call() -> None:
    """ResNet's block end: Conv(+B) -> BatchNormalization -> Add(skip) -> Relu is one conv2d call."""
    inits = {"w": f32(8, 4, 3, 3), "cb": f32(8), **bn_inits("bn", 8)}
    nodes = [
        conv("conv", "x", "w", "c", "cb", pads=[1] * 4, strides=[2, 2]),
        bn("bn", "c", "n"),
        helper.make_node("Add", ["n", "skip"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    model = make(nodes, {"x": [1, 4, 9, 9], "skip": [1, 8, 5, 5]}, ["y"], inits)
    ts, op = only_op(model)
    key = "conv2d:n=1,c=4,h=9,w=9,k=8,r=3,s=3,stride=2,pad=1,layout=nhwc,bias=1,residual=1,relu=1,prepacked=1"
    assert op.workload.key == key
    assert op.fused == ("bn", "add", "relu") and op.residual == "skip" and op.output == "y"
    assert ts.other_nodes == ()


@pytest.mark.parametrize("opset", [11, 13, 17])
def test_clip_0_6_is_relu6_and_a_per_channel_add_is_a_bias(opset: int) -> None:
    inits = {
        "w": f32(6, 3, 1, 1),
        "c": f32(1, 6, 1, 1),
        "lo": np.array(0, np.float32),
        "hi": np.array(6, np.float32),
    }
    nodes = [
        conv("conv", "x", "w", "o"),
        helper.make_node("Add", ["o", "c"], ["a"], name="bias"),
        helper.make_node("Clip", ["a", "lo", "hi"], ["y"], name="relu6"),
    ]
    model = make(nodes, {"x": [1, 3, 5, 4]}, ["y"], inits, opset=opset)
    _, op = only_op(model)
    key = "conv2d:n=1,c=3,h=5,w=4,k=6,r=1,s=1,stride=1,pad=0,layout=nhwc,bias=1,relu6=1,prepacked=1"
    assert op.workload.key == key
    nodes[-1] = helper.make_node("Clip", ["a", "lo"], ["y"], name="relu")  # no max: Clip(0, inf) is ReLU
    _, op = only_op(make(nodes, {"x": [1, 3, 5, 4]}, ["y"], inits, opset=opset))
    assert op.workload.key.endswith("bias=1,relu=1,prepacked=1") and op.fused == ("bias", "relu")


def test_per_channel_scales_and_shifts_fold_into_conv_and_gemm_weights() -> None:
    """Conv -> Mul -> Add -> Div -> BatchNormalization -> Relu, every constant per channel, is one call;
    so is Gemm -> Div -> Add over its columns. A Mul of a constant that varies along a spatial axis, or
    a Div of a constant by the output, ends the chain."""
    inits = {
        "w": f32(6, 3, 3, 3),
        "s": f32(1, 6, 1, 1) + 2,
        "t": f32(6, 1, 1),
        "d": f32(6, 1, 1) + 2,
        **bn_inits("bn", 6),
    }
    nodes = [
        conv("conv", "x", "w", "c", pads=[1] * 4),
        helper.make_node("Mul", ["c", "s"], ["m"], name="mul"),
        helper.make_node("Add", ["t", "m"], ["a"], name="add"),
        helper.make_node("Div", ["a", "d"], ["q"], name="div"),
        bn("bn", "q", "b"),
        helper.make_node("Relu", ["b"], ["y"], name="relu"),
    ]
    _, op = only_op(make(nodes, {"x": [1, 3, 6, 5]}, ["y"], inits))
    assert op.fused == ("mul", "add", "div", "bn", "relu") and op.workload["bias"] == 1
    gemm = {"w": f32(5, 7), "cols": f32(5) + 2, "b": f32(1, 5)}
    nodes = [
        helper.make_node("Gemm", ["x", "w"], ["g"], name="fc", transB=1),
        helper.make_node("Div", ["g", "cols"], ["q"], name="div"),
        helper.make_node("Add", ["q", "b"], ["y"], name="bias"),
    ]
    _, op = only_op(make(nodes, {"x": [3, 7]}, ["y"], gemm))
    assert op.fused == ("div", "bias") and op.workload.key == "matmul:m=3,n=5,k=7,bias=1,prepacked=1"
    rows = {"w": f32(6, 3, 1, 1), "r": f32(1, 1, 5, 1)}
    nodes = [conv("conv", "x", "w", "c"), helper.make_node("Mul", ["c", "r"], ["y"], name="rows")]
    ts = extract_tasks(make(nodes, {"x": [1, 3, 5, 4]}, ["y"], rows), TARGET, partial=True)
    assert ts.tasks[0].ops[0].fused == () and [(o.name, o.op) for o in ts.other_nodes] == [("rows", "Mul")]
    inverse = {"w": f32(6, 3, 1, 1), "k": f32(1, 6, 1, 1) + 2}
    nodes = [conv("conv", "x", "w", "c"), helper.make_node("Div", ["k", "c"], ["y"], name="inverse")]
    ts = extract_tasks(make(nodes, {"x": [1, 3, 5, 4]}, ["y"], inverse), TARGET, partial=True)
    assert ts.tasks[0].ops[0].fused == () and [(o.name, o.op) for o in ts.other_nodes] == [("inverse", "Div")]


def test_what_does_not_fuse_stays_a_node_of_its_own() -> None:
    """Clip(0, 5), an Add of a non-channel constant, and a conv output read twice stay separate."""
    inits = {
        "w": f32(6, 3, 1, 1),
        "w2": f32(6, 6, 1, 1),
        "lo": np.array(0, np.float32),
        "hi": np.array(5, np.float32),
        "full": f32(1, 6, 5, 4),
    }
    nodes = [
        conv("conv", "x", "w", "o"),
        helper.make_node("Clip", ["o", "lo", "hi"], ["c"], name="clip5"),
        helper.make_node("Add", ["c", "full"], ["a"], name="addfull"),
        conv("conv2", "a", "w2", "b"),
        helper.make_node("Relu", ["b"], ["r"], name="relu"),
        helper.make_node("Mul", ["b", "r"], ["y"], name="mul"),
    ]
    model = make(nodes, {"x": [1, 3, 5, 4]}, ["y"], inits)
    ts = extract_tasks(model, TARGET, partial=True)
    assert [(t.workload.key, t.nodes) for t in ts.tasks] == [
        ("conv2d:n=1,c=3,h=5,w=4,k=6,r=1,s=1,stride=1,pad=0,layout=nhwc,prepacked=1", ("conv",)),
        ("conv2d:n=1,c=6,h=5,w=4,k=6,r=1,s=1,stride=1,pad=0,layout=nhwc,prepacked=1", ("conv2",)),
    ]
    assert [(o.name, o.op, o.kind) for o in ts.other_nodes] == [
        ("clip5", "Clip", "elementwise"),
        ("addfull", "Add", "elementwise"),
        ("relu", "Relu", "elementwise"),
        ("mul", "Mul", "elementwise"),
    ]
    assert ts.unsupported == ()


def test_depthwise_with_multiplier_and_same_shapes_are_one_task() -> None:
    """group == channels is a depthwise task; two convs of one shape are one task used twice."""
    inits = {"w": f32(8, 1, 3, 3), "w2": f32(8, 1, 3, 3), "b": f32(8)}
    attrs = {"group": 4, "pads": [1] * 4}
    nodes = [
        conv("dw1", "x", "w", "a", "b", **attrs),
        conv("dw2", "x2", "w2", "y", **attrs),
        helper.make_node("Add", ["a", "y"], ["z"], name="sum"),
    ]
    model = make(nodes, {"x": [1, 4, 7, 6], "x2": [1, 4, 7, 6]}, ["z"], inits)
    ts = extract_tasks(model, TARGET)
    keys = [(t.workload.key, t.count) for t in ts.tasks]
    # dw2 takes the Add: its other operand (dw1's output) is computed before dw2 runs.
    shape = "depthwise:n=1,c=4,h=7,w=6,r=3,s=3,stride=1,pad=1,multiplier=2,layout=nhwc"
    assert keys == [(f"{shape},bias=1", 1), (f"{shape},residual=1", 1)]
    assert_ops_match_onnx(model, [op for t in ts.tasks for op in t.ops])
    twice = make(
        [conv("a", "x", "w", "y", **attrs), conv("b", "x", "w", "z", **attrs)],
        {"x": [1, 4, 7, 6]},
        ["y", "z"],
        inits,
    )
    (task,) = extract_tasks(twice, TARGET).tasks
    assert task.nodes == ("a", "b") and task.count == 2


def test_grouped_and_asymmetrically_padded_convs_are_conv2d_tasks() -> None:
    """group 2 of 8 channels is conv2d's groups=2; pads (0, 0, 1, 1) its own sides (TensorFlow "same")."""
    inits = {"w": f32(4, 4, 3, 3), "w2": f32(6, 4, 3, 3)}
    nodes = [
        conv("g", "x", "w", "a", group=2, pads=[1, 1, 1, 1]),
        conv("s", "a", "w2", "y", strides=[2, 2], pads=[0, 0, 1, 1]),
    ]
    model = make(nodes, {"x": [1, 8, 8, 8]}, ["y"], inits)
    ts = extract_tasks(model, TARGET, "nchw")
    assert [t.workload.key for t in ts.tasks] == [
        "conv2d:n=1,c=8,h=8,w=8,k=4,r=3,s=3,stride=1,pad=1,groups=2,prepacked=1",
        "conv2d:n=1,c=4,h=8,w=8,k=6,r=3,s=3,stride=2,pad=0,pad_bottom=1,pad_right=1,prepacked=1",
    ]
    assert_ops_match_onnx(model, [op for t in ts.tasks for op in t.ops])


def test_gemm_transposed_weights_alpha_beta_and_batchnorm() -> None:
    """PyTorch's Linear (Gemm transB=1): the (n, k) weight is transposed at extraction and noted."""
    inits = {"w": f32(5, 7), "c": f32(5), **bn_inits("bn", 5)}
    nodes = [
        helper.make_node("Gemm", ["x", "w", "c"], ["g"], name="fc", transB=1, alpha=0.5, beta=2.0),
        bn("bn", "g", "y"),
    ]
    ts, op = only_op(make(nodes, {"x": [3, 7]}, ["y"], inits))
    assert op.workload.key == "matmul:m=3,n=5,k=7,bias=1,prepacked=1"
    assert op.transposed and op.fused == ("bn",)
    assert ts.tasks[0].transposed == ("fc",)


def test_matmul_flattens_leading_axes_and_takes_bias_add_and_relu() -> None:
    inits = {"w": f32(6, 4), "b": f32(4)}
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["m"], name="mm"),
        helper.make_node("Add", ["b", "m"], ["a"], name="bias"),
        helper.make_node("Relu", ["a"], ["y"], name="relu"),
    ]
    _, op = only_op(make(nodes, {"x": [2, 3, 6]}, ["y"], inits))
    assert op.workload.key == "matmul:m=6,n=4,k=6,bias=1,relu=1,prepacked=1" and not op.transposed
    two = make([helper.make_node("MatMul", ["x", "z"], ["y"], name="mm")], {"x": [3, 6], "z": [6, 2]}, ["y"])
    _, op = only_op(two)
    assert op.workload.key == "matmul:m=3,n=2,k=6" and op.weights is None


def test_conv_same_upper_and_constant_nodes() -> None:
    """auto_pad=SAME_UPPER with an even total pad is a symmetric pad; weights from a Constant node."""
    w = helper.make_node("Constant", [], ["w"], value=numpy_helper.from_array(f32(4, 2, 3, 3)))
    nodes = [w, conv("conv", "x", "w", "y", auto_pad="SAME_UPPER")]
    _, op = only_op(make(nodes, {"x": [1, 2, 6, 5]}, ["y"]))
    key = "conv2d:n=1,c=2,h=6,w=5,k=4,r=3,s=3,stride=1,pad=1,layout=nhwc,prepacked=1"
    assert op.workload.key == key


@pytest.mark.parametrize(
    ("kernel", "attrs", "winograd"),
    [(3, {}, True), (3, {"strides": [2, 2]}, False), (3, {"dilations": [2, 2]}, False), (5, {}, False)],
)
def test_a_3x3_stride_1_convolution_with_constant_weights_explores_winograd(
    kernel: int, attrs: dict[str, Any], winograd: bool
) -> None:
    """Task extraction's one rule for the algorithm: the tuner's choice (direct and Winograd F(2x2, 3x3)
    in one space) wherever Winograd applies, direct elsewhere; the key names no algorithm either way."""
    nodes = [conv("conv", "x", "w", "y", pads=[1, 1, 1, 1], **attrs)]
    _, op = only_op(make(nodes, {"x": [1, 4, 9, 9]}, ["y"], {"w": f32(8, 4, kernel, kernel)}))
    assert "algo=" not in op.workload.key, op.workload.key
    template = template_for(op.workload, get_target("x86-avx2"))
    assert isinstance(template, SumTemplate) == winograd, op.workload.key


def test_initializers_declared_as_inputs_and_shape_tensors() -> None:
    """An export that lists its weights among the graph inputs (keep_initializers_as_inputs) and reads a
    constant shape tensor (Reshape): the weights are constants, not inputs to feed."""
    inits = {"w": f32(10, 96), "shape": np.array([1, 96], dtype=np.int64)}
    nodes = [
        helper.make_node("Reshape", ["x", "shape"], ["r"], name="reshape"),
        helper.make_node("Gemm", ["r", "w"], ["y"], name="fc", transB=1),
    ]
    model = make(nodes, {"x": [1, 6, 4, 4], "w": [10, 96]}, ["y"], inits)
    graph = load_graph(model)
    assert graph.inputs == ("x",) and graph.shape("r") == (1, 96)
    ts, op = only_op(model)
    assert op.workload.key == "matmul:m=1,n=10,k=96,prepacked=1"
    assert [o.op for o in ts.other_nodes] == ["Reshape"]


# --- refusals: one line naming the node and its op -----------------------------------------------------


def refusal(model: onnx.ModelProto) -> str:
    with pytest.raises(InputError) as err:
        extract_tasks(model, TARGET)
    message = str(err.value)
    assert "\n" not in message
    return message


def test_refusals_name_the_node_and_op() -> None:
    w4 = {"w": f32(4, 4, 3, 3)}
    dynamic = make([conv("c1", "x", "w", "y")], {"x": ["N", 4, 8, 8]}, ["y"], w4)
    assert "node 'c1' (Conv)" in refusal(dynamic) and "dynamic shape" in refusal(dynamic)
    strides = make([conv("s", "x", "w", "y", strides=[1, 2])], {"x": [1, 4, 8, 8]}, ["y"], w4)
    assert "node 's' (Conv): strides (1, 2) differ per axis" in refusal(strides)
    weights = make([conv("v", "x", "w", "y")], {"x": [1, 4, 8, 8], "w": [4, 4, 3, 3]}, ["y"])
    assert "node 'v' (Conv): weight 'w' is not a constant" in refusal(weights)
    ints = make(
        [
            helper.make_node("Cast", ["x"], ["i"], name="cast", to=TensorProto.INT32),
            helper.make_node("Cast", ["i"], ["y"], name="back", to=TensorProto.FLOAT),
        ],
        {"x": [1, 4]},
        ["y"],
    )
    assert "Cast ×2 (nodes 'cast', 'back'): tensor 'i' is int32, xtune runs float32 only" in refusal(ints)
    floor = make([helper.make_node("Floor", ["x"], ["y"], name="fl")], {"x": [1, 4]}, ["y"])
    assert "node 'fl' (Floor): not an operator xtune runs" in refusal(floor)
    old = make([helper.make_node("Relu", ["x"], ["y"], name="r")], {"x": [1, 4]}, ["y"], opset=6)
    assert "opset 6 is not supported (xtune reads 7 to" in refusal(old)


def test_refusals_of_matmul_and_weights() -> None:
    half = make(
        [conv("h", "x", "w", "y")], {"x": [1, 4, 8, 8]}, ["y"], {"w": f32(4, 4, 3, 3).astype(np.float16)}
    )
    assert "node 'h' (Conv): weight 'w' is float16, xtune runs float32 only" in refusal(half)
    dil = make(
        [conv("d", "x", "w", "y", dilations=[1, 2])], {"x": [1, 4, 8, 8]}, ["y"], {"w": f32(4, 4, 3, 3)}
    )
    assert "node 'd' (Conv): dilations (1, 2) differ per axis" in refusal(dil)
    gemm = helper.make_node("Gemm", ["x", "w"], ["y"], name="g", transA=1)
    assert "node 'g' (Gemm): transA=1" in refusal(make([gemm], {"x": [4, 3]}, ["y"], {"w": f32(4, 5)}))
    gemm = helper.make_node("Gemm", ["x", "w", "c"], ["y"], name="g")
    full_c = make([gemm], {"x": [3, 4]}, ["y"], {"w": f32(4, 5), "c": f32(3, 5)})
    assert "node 'g' (Gemm): C 'c' is not a constant per-column bias" in refusal(full_c)
    vec = helper.make_node("MatMul", ["a", "b"], ["y"], name="vec")
    vector = make([vec], {"a": [4], "b": [4, 5]}, ["y"])
    assert "node 'vec' (MatMul): MatMul of shapes (4,) @ (4, 5) is not supported (a 1-D operand)" in refusal(
        vector
    )


def test_unreadable_files_are_input_errors(tmp_path: Path) -> None:
    junk = tmp_path / "junk.onnx"
    junk.write_bytes(b"\x00not a protobuf\xff" * 10)
    with pytest.raises(InputError, match=r"junk\.onnx: not an ONNX model"):
        load_graph(junk)
    with pytest.raises(InputError, match=r"missing\.onnx: no such model file"):
        load_graph(tmp_path / "missing.onnx")


# --- the test networks ---------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("build", [networks.resnet_small, networks.mobilenet_v2_small])
def test_small_networks_fuse_every_batchnorm_and_activation_and_match_onnx(
    build: object, layout: str
) -> None:
    model = build()  # type: ignore[operator]
    onnx.checker.check_model(model, full_check=True)
    ts = extract_tasks(model, TARGET, layout)
    assert {o.op for o in ts.other_nodes} <= {"MaxPool", "GlobalAveragePool", "Flatten"}
    ops = [op for t in ts.tasks for op in t.ops]
    fused = {name for op in ops for name in op.fused}
    graph = load_graph(model)
    for node in graph.nodes:  # every BN, Relu, Clip and Add belongs to a kernel call
        assert node.op in ("Conv", "Gemm", "MatMul", "MaxPool", "GlobalAveragePool", "Flatten") or (
            node.name in fused
        ), node.label
    adds = [n.name for n in graph.nodes if n.op == "Add"]
    assert adds and sum(op.residual is not None for op in ops) == len(adds)
    assert ts.total_flops == sum(t.flops * t.count for t in ts.tasks)
    assert_ops_match_onnx(model, ops)


def test_full_networks_have_the_published_layer_structure() -> None:
    """ResNet-18: 20 convs and one fc, 1.82 GMAC; MobileNetV2 1.0: 52 convs, 17 of them depthwise, and
    ~300 MMAC at 224x224 (He et al., 2016, Table 1; Sandler et al., 2018, Table 3)."""
    r18 = extract_tasks(networks.resnet18(), TARGET)
    assert sum(t.count for t in r18.tasks) == 21 and len(r18.tasks) == 19
    assert r18.total_flops / 2 == pytest.approx(1.82e9, rel=0.01)
    mnv2 = extract_tasks(networks.mobilenet_v2(), TARGET)
    assert sum(t.count for t in mnv2.tasks if t.workload.op == "conv2d") == 35
    assert sum(t.count for t in mnv2.tasks if t.workload.op == "depthwise") == 17
    assert mnv2.total_flops / 2 == pytest.approx(300e6, rel=0.02)
    assert sum(t.workload["relu6"] * t.count for t in mnv2.tasks) == 35  # the 52 minus 17 projections
    assert sum(t.workload["residual"] * t.count for t in mnv2.tasks) == 10


# --- library and CLI ------------------------------------------------------------------------------------


def test_xtune_tasks_is_the_library_entry_and_import_stays_cheap() -> None:
    ts = xtune.tasks(networks.resnet_small(), TARGET)
    assert isinstance(ts, TaskSet) and ts.target.name == TARGET and ts.tasks
    import subprocess
    import sys

    code = "import sys, xtune; print('onnx' in sys.modules, 'numpy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_cli_tasks_table_json_and_log(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "net.onnx"
    onnx.save_model(networks.mobilenet_v2_small(), path)
    ts = extract_tasks(path, TARGET)
    first = ts.tasks[0]
    log = tmp_path / "log.jsonl"
    from xtune.ops.registry import template_for

    config: Config = template_for(first.workload, ts.target).default_config()
    result = MeasureResult(MeasureStatus.OK, costs=(first.flops / 5e9,))
    TuningLog(log).append([make_record(first.workload.key, TARGET, "local", config, result)])
    assert main(["tasks", str(path), "--target", TARGET, "--log", str(log)]) == 0
    out = capsys.readouterr().out
    assert f"{first.workload.key} " in out and "5.0 GFLOP/s" in out
    assert f"{len(ts.tasks)} tasks for 53 kernel calls" in out and "1 with a best" in out
    assert "avgpool (GlobalAveragePool)" in out
    assert main(["tasks", str(path), "--target", TARGET, "--log", str(log), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [t["workload"] for t in data["tasks"]] == [t.workload.key for t in ts.tasks]
    assert data["tasks"][0]["best"]["config"] == config.index and data["tasks"][1]["best"] is None
    assert sum(t["share"] for t in data["tasks"]) == pytest.approx(1.0)
    assert data["other_nodes"] == [
        {"name": "avgpool", "op": "GlobalAveragePool", "kind": "pooling"},
        {"name": "flatten", "op": "Flatten", "kind": "reshape"},
    ]


def exit_status(argv: list[str]) -> int:
    """main's status, or argparse's for a usage error (it exits)."""
    try:
        return main(argv)
    except SystemExit as stop:
        return int(stop.code or 0)


def test_tasks_carry_the_layout_the_network_runs_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """NHWC by default: every conv2d and depthwise task says layout=nhwc (a matmul has no layout);
    --layout nchw lists ONNX's layout; a bad layout is one line and exit 2."""
    path = tmp_path / "net.onnx"
    onnx.save_model(networks.mobilenet_v2_small(), path)
    for layout, how in (("nhwc", []), ("nhwc", ["--layout", "nhwc"]), ("nchw", ["--layout", "nchw"])):
        assert main(["tasks", str(path), "--target", TARGET, "--json", *how]) == 0
        data = json.loads(capsys.readouterr().out)
        assert data["layout"] == layout
        keys = [t["workload"] for t in data["tasks"]]
        convs = [k for k in keys if k.startswith(("conv2d:", "depthwise:"))]
        assert {k.split(":")[0] for k in convs} == {"conv2d", "depthwise"}
        assert all(("layout=nhwc" in k) == (layout == "nhwc") for k in convs), how
        assert not any("layout=" in k for k in keys if k not in convs)
        assert keys == [t.workload.key for t in xtune.tasks(path, TARGET, layout=layout).tasks]
    for argv in (
        ["tasks", str(path), "--layout", "nhcw"],
        ["bench", "--model", str(path), "--layout", "x"],
        [
            "build",
            "--model",
            str(path),
            "--target",
            TARGET,
            "-o",
            str(tmp_path / "n.o"),
            "--header",
            str(tmp_path / "n.h"),
            "--layout",
            "NCHW",
        ],
        ["tune", "--model", str(path), "--layout", "chw", "--log", str(tmp_path / "l.jsonl")],
        ["bench", "--workload", "matmul:m=8,n=8,k=8", "--layout", "nchw"],
    ):
        assert exit_status(argv) == 2, argv
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "layout" in err, argv
    assert not list(tmp_path.glob("n.*")) and not (tmp_path / "l.jsonl").exists()
    with pytest.raises(InputError, match="unknown layout 'nhcw'"):
        extract_tasks(path, TARGET, "nhcw")
    with pytest.raises(InputError, match="unknown layout 'NHWC'"):  # before any board is opened
        xtune.tune_model(path, board="no-such-board", trials=1, log=tmp_path / "t.jsonl", layout="NHWC")
    from xtune.firmware.network_bench import bench_model

    with pytest.raises(InputError, match="unknown layout 'hw'"):
        bench_model(path, get_board("local"), layout="hw")
    with pytest.raises(InputError, match="unknown layout 'hw'"):
        xtune.build_model(path, TARGET, layout="hw")


def test_cli_bad_model_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_text("hello")
    assert main(["tasks", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "bad.onnx: not an ONNX model" in err
    strided = tmp_path / "strided.onnx"
    model = make(
        [conv("g", "x", "w", "y", strides=[1, 2])], {"x": [1, 4, 8, 8]}, ["y"], {"w": f32(4, 4, 3, 3)}
    )
    onnx.save_model(model, strided)
    assert main(["tasks", str(strided), "--target", TARGET]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "node 'g' (Conv): strides (1, 2) differ per axis" in err


# --- the small networks' tasks compile and are correct on every board ----------------------------------


def small_tasks() -> list[str]:
    keys = [
        t.workload.key
        for build in (networks.resnet_small, networks.mobilenet_v2_small)
        for t in extract_tasks(build(), TARGET).tasks
    ]
    return list(dict.fromkeys(keys))


@pytest.mark.slow
@pytest.mark.parametrize("key", small_tasks())
def test_small_network_tasks_correct_on_host(key: str) -> None:
    check("local", key, configs(key, get_board("local").target.name, 0))


@pytest.mark.slow
@pytest.mark.board
@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-riscv64", "qemu-riscv64-v"])
def test_small_network_tasks_correct_under_qemu(board: str) -> None:
    for key in small_tasks():
        check(board, key, configs(key, get_board(board).target.name, 0))
