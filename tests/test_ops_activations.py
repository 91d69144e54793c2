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


@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-riscv64"])
def test_activations_under_qemu(board: str) -> None:
    nodes = [
        helper.make_node("Sigmoid", ["a"], ["s"], name="s"),
        helper.make_node("Tanh", ["s"], ["t"], name="t"),
        helper.make_node("Elu", ["t"], ["e"], name="e", alpha=0.5),
        helper.make_node("HardSwish", ["e"], ["y"], name="hs"),
    ]
    check(net(nodes, (1, 6, 3, 5)), "nhwc", board)


def test_the_reference_keeps_the_limits() -> None:
    """Where e^x overflows, Sigmoid and Tanh saturate instead of giving NaN (reference and ONNX agree)."""
    x = np.array([-200.0, -20.0, 0.0, 20.0, 200.0], np.float32)
    sig = Activation(kind=ActivationKind.SIGMOID, shape=(5,)).reference(x)
    tanh = Activation(kind=ActivationKind.TANH, shape=(5,)).reference(x)
    assert np.all(np.isfinite(sig)) and sig[0] == 0 and sig[-1] == 1
    assert tanh[0] == -1 and tanh[2] == 0 and tanh[-1] == 1
