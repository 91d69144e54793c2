"""The activation family (xtune/ops/activation.py): each activation after a convolution, built through the
real build path in NCHW and NHWC on odd shapes, against ONNX Runtime on the host; a few under qemu."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.opnets import LAYOUTS, SHAPES, check, kinds, net
from xtune.ops.activation import Activation, ActivationKind

pytest.importorskip("onnxruntime")

ACTIVATIONS: dict[str, dict[str, float]] = {
    "Sigmoid": {},
    "HardSigmoid": {"alpha": 0.3, "beta": 0.4},
    "HardSwish": {},
    "Tanh": {},
    "LeakyRelu": {"alpha": 0.15},
    "Elu": {"alpha": 0.7},
    "Erf": {},
}


def act(op: str, x: str, y: str) -> onnx.NodeProto:
    node = helper.make_node(op, [x], [y], name=f"{y}.act")
    node.attribute.extend(helper.make_attribute(k, v) for k, v in ACTIVATIONS[op].items())
    return node


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", list(ACTIVATIONS))
def test_each_activation_alone_matches_onnx_runtime(op: str, layout: str, shape: tuple[int, ...]) -> None:
    """On the network's input (no kernel before it to fuse into): its own in-place call."""
    artifact = check(net([act(op, "a", "y")], shape, conv=False), layout)
    assert "activation" in kinds(artifact)


def fused_net(op: str) -> onnx.ModelProto:
    """conv 3x3 (Winograd) -> act -> depthwise 3x3 -> act -> conv 1x1 -> act -> Flatten -> Gemm -> act,
    5 channels (no multiple of any vector width); `op` "SiLU" is x * Sigmoid(x)."""
    rng = np.random.default_rng(1)
    node = helper.make_node
    inits = {
        "w1": rng.standard_normal((5, 3, 3, 3)) * 0.5,
        "w2": rng.standard_normal((5, 1, 3, 3)) * 0.5,
        "w3": rng.standard_normal((5, 5, 1, 1)) * 0.5,
        "fc": rng.standard_normal((7, 45)) * 0.3,
    }

    def activation(x: str, y: str) -> list[onnx.NodeProto]:
        if op == "SiLU":
            return [
                node("Sigmoid", [x], [f"{y}.s"], name=f"{y}.sig"),
                node("Mul", [x, f"{y}.s"], [y], name=y),
            ]
        return [act(op, x, y)]

    nodes = [
        node("Conv", ["x", "w1"], ["c1"], name="c1", pads=[1, 1, 1, 1]),
        *activation("c1", "a1"),
        node("Conv", ["a1", "w2"], ["c2"], name="c2", pads=[1, 1, 1, 1], group=5),
        *activation("c2", "a2"),
        node("Conv", ["a2", "w3"], ["c3"], name="c3"),
        *activation("c3", "a3"),
        node("Flatten", ["a3"], ["f"], name="flat"),
        node("Gemm", ["f", "fc"], ["g"], name="fc", transB=1),
        *activation("g", "y"),
    ]
    graph = helper.make_graph(
        nodes,
        "fused",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 3, 3])],
        [helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", [*ACTIVATIONS, "SiLU"])
def test_each_activation_fuses_into_conv_depthwise_and_gemm(op: str, layout: str) -> None:
    """Into every template's epilogue (Winograd, depthwise, the pointwise conv's matmul, Gemm): no call of
    its own, the workload key says `act=`, and the network matches ONNX Runtime."""
    artifact = check(fused_net(op), layout)
    assert "activation" not in kinds(artifact)
    keys = [c.kernel.key for c in artifact.program.calls if hasattr(c.kernel, "key")]
    kind = op.lower()
    assert len(keys) == 4 and all(f"act={kind}" in key for key in keys), keys


def silu_and_gelu() -> list[onnx.NodeProto]:
    """SiLU as exporters write it (x * Sigmoid(x)), then GELU's Erf form x * 0.5 * (1 + Erf(x / sqrt 2))."""
    node = helper.make_node
    return [
        node("Sigmoid", ["a"], ["s"], name="sig"),
        node("Mul", ["a", "s"], ["silu"], name="silu"),
        node("Div", ["silu", "sqrt2"], ["d"], name="gelu.div"),
        node("Erf", ["d"], ["e"], name="gelu.erf"),
        node("Add", ["e", "one"], ["p"], name="gelu.add"),
        node("Mul", ["silu", "p"], ["m"], name="gelu.mul"),
        node("Mul", ["m", "half"], ["y"], name="gelu.half"),
    ]


GELU_CONSTANTS = {k: np.array(v, np.float32) for k, v in (("sqrt2", np.sqrt(2)), ("one", 1.0), ("half", 0.5))}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_silu_is_one_kernel_and_gelu_runs(layout: str, shape: tuple[int, ...]) -> None:
    artifact = check(net(silu_and_gelu(), shape, GELU_CONSTANTS, conv=False), layout)
    silu = [c for c in artifact.program.calls if "silu" in c.nodes]
    assert len(silu) == 1 and silu[0].nodes == ("sig", "silu")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_prelu_with_a_slope_per_channel_and_a_scalar(layout: str, shape: tuple[int, ...]) -> None:
    c = shape[1]
    slopes = {
        "k": np.linspace(-0.5, 0.5, c, dtype=np.float32).reshape(c, 1, 1),
        "s": np.array([0.2], np.float32),
    }
    nodes = [
        helper.make_node("PRelu", ["a", "k"], ["p"], name="per_channel"),
        helper.make_node("PRelu", ["p", "s"], ["y"], name="scalar"),
    ]
    check(net(nodes, shape, slopes), layout)


def erf_sweep() -> np.ndarray:
    """A dense sweep of erf's range, both signs: 0.0001 apart to +-6, the tails to 1e30, tiny values down
    to 1e-30, both infinities and both zeros."""
    dense = np.linspace(-6, 6, 120_001)
    tiny = np.logspace(-30, 0, 3_001)
    huge = np.logspace(0.7, 30, 301)
    return np.concatenate([dense, tiny, -tiny, huge, -huge, [np.inf, -np.inf, 0.0, -0.0]]).astype(np.float32)


@pytest.mark.parametrize("board", ["local", "qemu-aarch64"])
def test_erf_kernel_is_within_1_5e_7_relative(board: str) -> None:
    """The built kernel's erf (xtune/codegen/transcend.py) against math.erf in float64, over the whole range,
    in relative error: Juffa's fits stay within 8.1e-8 before the kernel's own exp adds its 1e-8."""
    import math

    from xtune.boards.board import get_board
    from xtune.firmware.build import build_model
    from xtune.firmware.network_bench import run_network

    x = erf_sweep()
    b = get_board(board)
    model = net([act("Erf", "a", "y")], (1, 1, 1, x.size), conv=False)
    got, _ = run_network(b, build_model(model, b.target, layout="nchw"), x.reshape(1, 1, 1, -1))
    got = got.reshape(-1).astype(np.float64)
    want = np.array([math.erf(v) for v in x.astype(np.float64)])
    zero = want == 0
    assert np.all(got[zero] == 0)
    rel = np.abs(got[~zero] - want[~zero]) / np.abs(want[~zero])
    assert rel.max() <= 1.5e-7, (rel.max(), x[~zero][np.argmax(rel)])
    assert np.all(np.abs(got) <= 1) and np.all(np.sign(got[~zero]) == np.sign(want[~zero]))


@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-riscv64"])
def test_activations_under_qemu(board: str) -> None:
    nodes = [
        helper.make_node("Relu", ["a"], ["r"], name="r"),  # fused: the activations after it are calls
        helper.make_node("Sigmoid", ["r"], ["s"], name="s"),
        helper.make_node("Tanh", ["s"], ["t"], name="t"),
        helper.make_node("Elu", ["t"], ["e"], name="e", alpha=0.5),
        helper.make_node("HardSwish", ["e"], ["h"], name="hs"),
        helper.make_node("Erf", ["h"], ["y"], name="erf"),
    ]
    check(net(nodes, (1, 6, 3, 5)), "nhwc", board)
    check(net(silu_and_gelu(), (1, 6, 3, 5), GELU_CONSTANTS), "nchw", board)


def test_the_reference_keeps_the_limits() -> None:
    """Where e^x overflows, Sigmoid and Tanh saturate instead of giving NaN (reference and ONNX agree)."""
    x = np.array([-200.0, -20.0, 0.0, 20.0, 200.0], np.float32)
    sig = Activation(kind=ActivationKind.SIGMOID, shape=(5,)).reference(x)
    tanh = Activation(kind=ActivationKind.TANH, shape=(5,)).reference(x)
    assert np.all(np.isfinite(sig)) and sig[0] == 0 and sig[-1] == 1
    assert tanh[0] == -1 and tanh[2] == 0 and tanh[-1] == 1


def test_the_activation_keys_keep_old_workloads_and_exclude_relu() -> None:
    """`act` (with alpha and beta in millionths) is left out at its default, so older keys and logs are
    unchanged; it excludes relu and relu6; the reference applies it after bias and residual."""
    from xtune.errors import InputError
    from xtune.ops.registry import parse_workload
    from xtune.ops.workload import random_inputs

    assert parse_workload("matmul:m=4,n=5,k=3,bias=1,relu=1,act=none,alpha=0").key == (
        "matmul:m=4,n=5,k=3,bias=1,relu=1"
    )
    wl = parse_workload("matmul:m=4,n=5,k=3,bias=1,act=leakyrelu,alpha=100000")
    a, b, bias = random_inputs(wl)
    pre = a @ b + bias
    assert np.allclose(wl.reference([a, b, bias]), np.where(pre > 0, pre, 0.1 * pre), atol=1e-6)
    with pytest.raises(InputError, match="'act' excludes 'relu' and 'relu6'"):
        parse_workload("conv2d:n=1,c=3,h=4,w=4,k=2,r=1,s=1,relu=1,act=tanh")
    with pytest.raises(InputError, match="'act' must be one of"):
        parse_workload("depthwise:n=1,c=3,h=4,w=4,r=3,s=3,act=softplus")
