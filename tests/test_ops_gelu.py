"""GELU (xtune/frontend/gelu.py, xtune/ops/activation.py): the erf form as torch.onnx writes it in both
association orders, the tanh approximation with its cube as Pow or as Muls, and opset 20's Gelu, each
recognized by normalization as one node, fused into the convolution or Gemm before it (act=gelu) or run
alone; built through the real build path in NCHW and NHWC against ONNX Runtime, one on qemu-aarch64."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import helper

from tests.opnets import LAYOUTS, check, kinds, net
from xtune.frontend.normalize import normalize
from xtune.ops.activation import Activation, ActivationKind

pytest.importorskip("onnxruntime")

node = helper.make_node


def _c(name: str, value: float) -> tuple[str, np.ndarray]:
    return name, np.array(value, np.float32)


def gelu_nodes(form: str, x: str, y: str) -> tuple[list[onnx.NodeProto], dict[str, np.ndarray]]:
    """GELU of x as exporters write it: "erf" (x * 0.5) * (1 + Erf(x / sqrt 2)) as torch.onnx; "erf-late"
    x * (1 + Erf(x * 1/sqrt 2)) * 0.5; "tanh-pow" and "tanh-mul" the tanh form with its cube as Pow or
    Mul(Mul(x, x), x); "gelu" and "gelu-tanh" opset 20's Gelu."""
    p = f"{y}."
    consts = dict(
        [
            _c(p + "sqrt2", math.sqrt(2)),
            _c(p + "rsqrt2", math.sqrt(0.5)),
            _c(p + "one", 1.0),
            _c(p + "half", 0.5),
            _c(p + "three", 3.0),
            _c(p + "k", 0.044715),
            _c(p + "s", math.sqrt(2 / math.pi)),
        ]
    )
    if form in ("gelu", "gelu-tanh"):
        return [
            node("Gelu", [x], [y], name=p + "g", approximate="tanh" if form == "gelu-tanh" else "none")
        ], {}
    if form == "erf":
        nodes = [
            node("Div", [x, p + "sqrt2"], [p + "d"], name=p + "div"),
            node("Erf", [p + "d"], [p + "e"], name=p + "erf"),
            node("Add", [p + "e", p + "one"], [p + "a"], name=p + "add"),
            node("Mul", [x, p + "half"], [p + "h"], name=p + "half"),
            node("Mul", [p + "h", p + "a"], [y], name=p + "mul"),
        ]
    elif form == "erf-late":
        nodes = [
            node("Mul", [x, p + "rsqrt2"], [p + "d"], name=p + "scale"),
            node("Erf", [p + "d"], [p + "e"], name=p + "erf"),
            node("Add", [p + "one", p + "e"], [p + "a"], name=p + "add"),
            node("Mul", [x, p + "a"], [p + "m"], name=p + "mul"),
            node("Mul", [p + "m", p + "half"], [y], name=p + "half"),
        ]
    else:
        cube = (
            [node("Pow", [x, p + "three"], [p + "cube"], name=p + "pow")]
            if form == "tanh-pow"
            else [
                node("Mul", [x, x], [p + "sq"], name=p + "sq"),
                node("Mul", [p + "sq", x], [p + "cube"], name=p + "cube"),
            ]
        )
        nodes = [
            *cube,
            node("Mul", [p + "cube", p + "k"], [p + "kc"], name=p + "kc"),
            node("Add", [x, p + "kc"], [p + "in"], name=p + "in"),
            node("Mul", [p + "in", p + "s"], [p + "u"], name=p + "u"),
            node("Tanh", [p + "u"], [p + "t"], name=p + "tanh"),
            node("Add", [p + "t", p + "one"], [p + "a"], name=p + "add"),
            node("Mul", [p + "half", x], [p + "h"], name=p + "halfx"),
            node("Mul", [p + "h", p + "a"], [y], name=p + "mul"),
        ]
    used = {t for n in nodes for t in n.input}
    return nodes, {k: v for k, v in consts.items() if k in used}


FORMS = ("erf", "erf-late", "tanh-pow", "tanh-mul", "gelu", "gelu-tanh")


def _opset(form: str) -> int:
    return 20 if form.startswith("gelu") else 17


def fused_net(form: str) -> onnx.ModelProto:
    """conv 1x1 -> GELU -> conv 1x1 -> GELU -> Flatten -> Gemm -> GELU: every GELU after a kernel."""
    rng = np.random.default_rng(2)
    inits = {"w": (rng.standard_normal((5, 5, 1, 1)) * 0.7).astype(np.float32)}
    inits["fc"] = (rng.standard_normal((45, 6)) * 0.3).astype(np.float32)
    nodes = []
    for x, y in (("a", "g1"), ("c2", "g2"), ("fco", "y")):
        if x == "c2":
            nodes.append(node("Conv", ["g1", "w"], ["c2"], name="conv2"))
        if x == "fco":
            nodes += [
                node("Flatten", ["g2"], ["f"], name="flat"),
                node("Gemm", ["f", "fc"], ["fco"], name="fc"),
            ]
        more, consts = gelu_nodes(form, x, y)
        nodes += more
        inits |= consts
    return net(nodes, (1, 5, 3, 3), inits, opset=_opset(form))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("form", FORMS)
def test_gelu_fuses_into_the_kernel_before_it(form: str, layout: str) -> None:
    artifact = check(fused_net(form), layout)
    keys = [k.what for k in artifact.kernels if k.what.split(":")[0] in ("conv2d", "matmul")]
    act = "act=gelu_tanh" if "tanh" in form else "act=gelu"
    assert len(keys) == 2 and all(act in k for k in keys), keys  # the two convolutions are one kernel
    assert "activation" not in kinds(artifact) and "arith" not in kinds(artifact)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("form", ["erf", "tanh-mul", "gelu"])
def test_gelu_alone_runs_as_its_activation(form: str, layout: str) -> None:
    """On the network's input, 7 channels (no multiple of any vector width): its own in-place call."""
    nodes, consts = gelu_nodes(form, "a", "y")
    artifact = check(net(nodes, (2, 7, 3, 5), consts, opset=_opset(form), conv=False), layout)
    assert kinds(artifact) == {"activation"}
    kind = "gelu_tanh" if "tanh" in form else "gelu"
    assert [k.what.split(",")[0] for k in artifact.kernels] == [f"activation:kind={kind}"]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gelu_on_qemu_aarch64(layout: str) -> None:
    check(fused_net("erf"), layout, board="qemu-aarch64")


def test_normalization_writes_one_node_and_keeps_lookalikes() -> None:
    """Below opset 20 the GELU is ONNX Runtime's contrib Gelu; x/2 (1 + Erf(x/2)) is no GELU: left be."""
    model = normalize(fused_net("erf"), "m")
    ops = [(n.domain, n.op_type) for n in model.graph.node]
    assert ops.count(("com.microsoft", "Gelu")) == 3 and ("", "Erf") not in ops
    nodes, consts = gelu_nodes("erf", "a", "y")
    consts["y.sqrt2"] = np.array(2.0, np.float32)
    lookalike = normalize(net(nodes, (1, 5, 3, 3), consts), "m")
    assert "Erf" in [n.op_type for n in lookalike.graph.node]
    assert all(n.op_type != "Gelu" for n in lookalike.graph.node)
    tanh = [n.op_type for n in normalize(fused_net("tanh-pow"), "m").graph.node]
    assert tanh.count("FastGelu") == 3 and "Tanh" not in tanh and "Pow" not in tanh


@pytest.mark.parametrize("kind", [ActivationKind.GELU, ActivationKind.GELU_TANH])
def test_gelu_reference_is_the_definition(kind: ActivationKind) -> None:
    x = np.linspace(-8, 8, 33, dtype=np.float32)
    got = Activation(kind=kind, shape=x.shape).reference(x)
    phi = np.array([0.5 * (1 + math.erf(v / math.sqrt(2))) for v in x.astype(np.float64)])
    assert np.allclose(got, x * phi, atol=1e-3 if kind is ActivationKind.GELU_TANH else 1e-7)
