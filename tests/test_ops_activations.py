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


def one(op: str, shape: tuple[int, ...]) -> onnx.ModelProto:
    node = helper.make_node(op, ["a"], ["y"], name="act")
    node.attribute.extend(helper.make_attribute(k, v) for k, v in ACTIVATIONS[op].items())
    return net([node], shape)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", list(ACTIVATIONS))
def test_each_activation_matches_onnx_runtime(op: str, layout: str, shape: tuple[int, ...]) -> None:
    artifact = check(one(op, shape), layout)
    assert "activation" in kinds(artifact)


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
    artifact = check(net(silu_and_gelu(), shape, GELU_CONSTANTS), layout)
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


def test_erf_is_within_a_few_ulps() -> None:
    """Eigen's rational Erf in the IR, interpreted in float32, against math.erf."""
    import math

    from tests.nest_interp import run_kernel

    x = np.concatenate([np.linspace(-5, 5, 4001), [-1e-6, 0, 1e-6, 30, -30]]).astype(np.float32)
    op = Activation(kind=ActivationKind.ERF, shape=x.shape)
    got = np.full_like(x, np.nan)
    run_kernel(op.kernel_nest("erf", 8), [x, got])
    want = np.array([math.erf(v) for v in x.astype(np.float64)])
    assert np.max(np.abs(got - want)) <= 4e-7


@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-riscv64"])
def test_activations_under_qemu(board: str) -> None:
    nodes = [
        helper.make_node("Sigmoid", ["a"], ["s"], name="s"),
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
