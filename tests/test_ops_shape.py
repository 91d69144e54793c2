"""The broadcasting arithmetic family (xtune/ops/arith.py) and the reduction family (xtune/ops/reduce.py):
Mul/Add/Sub/Div between activations (squeeze-and-excite) and with constants of every broadcastable shape,
a BatchNormalization with no convolution to fold into, ReduceMean/ReduceMax over the spatial axes; each
built through the real build path in NCHW and NHWC on odd shapes and checked against ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from tests.opnets import LAYOUTS, SHAPES, check, kinds, net

pytest.importorskip("onnxruntime")
node = helper.make_node


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", ["Mul", "Add", "Sub", "Div"])
def test_squeeze_and_excite_broadcasts_between_activations(
    op: str, layout: str, shape: tuple[int, ...]
) -> None:
    """[n,c,h,w] op [n,c,1,1] (and the other way round for Sub and Div: not commutative)."""
    nodes = [
        node("GlobalAveragePool", ["a"], ["g"], name="gap"),
        node("Sigmoid", ["g"], ["s"], name="gate"),  # Div: no division by zero
        node(op, ["a", "s"], ["m"], name="excite"),
        node(op, ["s", "m"], ["y"], name="again"),
    ]
    artifact = check(net(nodes, shape), layout)
    # At 1x1 the shapes agree: an Add is then the elementwise family's own (same-shape) Add.
    assert "arith" in kinds(artifact) or (op == "Add" and shape[2] * shape[3] == 1)


CONSTANT_SHAPES = [(), (1,), "w", "c11", "1c11", "hw", "chw", "n1hw"]


def constant(kind: str | tuple[int, ...], shape: tuple[int, ...]) -> np.ndarray:
    n, c, h, w = shape
    dims = {
        "w": (w,),
        "c11": (c, 1, 1),
        "1c11": (1, c, 1, 1),
        "hw": (h, w),
        "chw": (c, h, w),
        "n1hw": (n, 1, h, w),
    }
    size = dims[kind] if isinstance(kind, str) else kind
    return np.random.default_rng(5).uniform(0.5, 2.0, size).astype(np.float32)


@pytest.mark.parametrize("kind", CONSTANT_SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("op", ["Mul", "Add", "Sub", "Div"])
def test_arithmetic_with_constants_of_any_broadcastable_shape(op: str, layout: str, kind: str) -> None:
    """After a Sigmoid, so that nothing folds into the convolution (and no Div divides by 0): the constant
    on either side."""
    shape = (2, 3, 3, 5)
    nodes = [
        node("Sigmoid", ["a"], ["r"], name="sigmoid"),
        node(op, ["r", "k"], ["t"], name="first"),
        node(op, ["k", "t"], ["y"], name="second"),
    ]
    check(net(nodes, shape, {"k": constant(kind, shape)}), layout)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_a_batchnormalization_after_an_activation_is_a_scale_and_shift(
    layout: str, shape: tuple[int, ...]
) -> None:
    """DenseNet's pre-activation: conv -> Relu -> BatchNormalization, the BN with nothing to fold into."""
    rng = np.random.default_rng(2)
    c = shape[1]
    params = {
        "g": rng.uniform(0.5, 1.5, c),
        "b": rng.standard_normal(c),
        "mu": rng.standard_normal(c),
        "var": rng.uniform(0.5, 1.5, c),
    }
    nodes = [
        node("Relu", ["a"], ["r"], name="relu"),
        node("BatchNormalization", ["r", "g", "b", "mu", "var"], ["y"], name="bn", epsilon=1e-3),
    ]
    inits = {k: v.astype(np.float32) for k, v in params.items()}
    artifact = check(net(nodes, shape, inits), layout)
    assert "arith" in kinds(artifact)


REDUCTIONS = [("ReduceMean", 13, 0), ("ReduceMean", 18, 1), ("ReduceMax", 13, 1), ("ReduceMax", 18, 0)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(("op", "opset", "keepdims"), REDUCTIONS)
def test_reductions_over_the_spatial_axes(
    op: str, opset: int, keepdims: int, layout: str, shape: tuple[int, ...]
) -> None:
    """Global pooling as exporters write it: axes an attribute (opset 13) or an input (18), negative
    axes, both keepdims."""
    inits = {}
    if opset >= 18:
        inits["axes"] = np.array([-1, 2], np.int64)
        reduce = node(op, ["a", "axes"], ["y"], name="reduce", keepdims=keepdims)
    else:
        reduce = node(op, ["a"], ["y"], name="reduce", axes=[2, -1], keepdims=keepdims)
    check(net([reduce], shape, inits, opset=opset), layout)


def test_a_reduction_over_channels_is_refused_by_name() -> None:
    from xtune.errors import InputError
    from xtune.firmware.program import program

    model = net([node("ReduceMean", ["a"], ["y"], name="over_c", axes=[1])], (1, 4, 2, 2), opset=13)
    with pytest.raises(InputError, match=r"node 'over_c' \(ReduceMean\): a reduction over axes \[1\]"):
        program(model)


@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-riscv64"])
def test_broadcasts_and_reductions_under_qemu(board: str) -> None:
    nodes = [
        node("ReduceMean", ["a"], ["g"], name="mean", axes=[2, 3], keepdims=1),
        node("Mul", ["a", "g"], ["m"], name="excite"),
        node("Div", ["m", "k"], ["y"], name="scale"),
    ]
    check(net(nodes, (1, 6, 3, 5), {"k": constant("c11", (1, 6, 3, 5))}, opset=13), "nhwc", board)
