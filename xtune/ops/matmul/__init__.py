"""The matmul family: C[m,n] = A[m,k] @ B[k,n] with the fused epilogue. Its workload keys, validation,
tensors, numpy reference and flops; the ONNX Gemm and MatMul nodes it runs (B as (k, n): a constant B
stored transposed, PyTorch's Linear, is transposed here, alpha folded into it, beta * C into the bias;
MatMul by one (k, n) matrix, constant weights or an activation, the leading axes of A flattened into m;
a MatMul whose B has batch axes is the batched matmul generated operator's, xtune/ops/bmm.py);
its template (template.py) and features (features.py). A network runs it in NCHW: it reads the last
axis of ONNX's order."""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from xtune.graph import Graph, Node
from xtune.ops.anchor import Anchor, float_constant, refuse
from xtune.ops.bmm import batched
from xtune.ops.epilogue import (
    ACTIVATION,
    ACTIVATION_WORDS,
    EPILOGUE,
    PREPACKED,
    apply_epilogue,
    epilogue_tensors,
    require_positive,
    require_switches,
)
from xtune.ops.featurize import FeatureSet
from xtune.ops.layout import Layout
from xtune.ops.matmul.features import FEATURES
from xtune.ops.matmul.template import MatmulTemplate
from xtune.ops.template import ScheduleTemplate
from xtune.ops.workload import Inits, ParamValue, TensorSpec, Workload
from xtune.target import Target

if TYPE_CHECKING:
    import onnx


class Matmul:
    """C[m,n] = A[m,k] @ B[k,n] (+ bias[n]) (+ residual[m,n]) (then ReLU/ReLU6), float32; overwrites C.
    prepacked=1: B holds the weights, passed in the packed layout of the kernel's config."""

    name: ClassVar[str] = "matmul"
    keys: ClassVar[tuple[str, ...]] = ("m", "n", "k", *EPILOGUE, *PREPACKED, *ACTIVATION)
    defaults: ClassVar[dict[str, ParamValue]] = {**EPILOGUE, **PREPACKED, **ACTIVATION}
    optional: ClassVar[frozenset[str]] = frozenset((*EPILOGUE, *PREPACKED, *ACTIVATION))
    words: ClassVar[dict[str, tuple[str, ...]]] = {**ACTIVATION_WORDS}

    def validate(self, params: dict[str, ParamValue]) -> None:
        require_positive(self.name, params, ("m", "n", "k"))
        require_switches(self.name, params)

    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]:
        m, n, k = wl["m"], wl["n"], wl["k"]
        return (
            TensorSpec("A", (m, k)),
            TensorSpec("B", (k, n), axes="k, n", constant=True),
            *epilogue_tensors(wl, n, (m, n)),
            TensorSpec("C", (m, n), is_output=True),
        )

    def reference(self, wl: Workload, inputs: list[np.ndarray]) -> np.ndarray:
        out = np.matmul(inputs[0], inputs[1], dtype=np.float32)
        return apply_epilogue(wl, out, inputs[2:], axis=1)

    def flops(self, wl: Workload) -> int:
        return 2 * wl["m"] * wl["n"] * wl["k"]

    onnx_ops: ClassVar[tuple[str, ...]] = ("Gemm", "MatMul")
    layouts: ClassVar[frozenset[Layout]] = frozenset((Layout.NCHW,))
    feature_sets: ClassVar[tuple[FeatureSet, ...]] = (FEATURES,)

    def template(self, wl: Workload, target: Target) -> ScheduleTemplate:
        return MatmulTemplate(wl, target)

    def features(self, template: ScheduleTemplate) -> tuple[FeatureSet, ScheduleTemplate]:
        return FEATURES, template

    def anchor(self, graph: Graph, node: Node) -> Anchor | None:
        return gemm_anchor(graph, node) if node.op == "Gemm" else matmul_anchor(graph, node)

    def task_key(self, anchor: Anchor, switches: dict[str, ParamValue], layout: Layout) -> str:
        """Constant weights are packed once, at build time (xtune/firmware/build.py), so the task is tuned
        as it runs: prepacked=1."""
        packed = {"prepacked": 1} if anchor.weights is not None else {}
        return anchor.key((), {**switches, **packed})

    def onnx_nodes(self, wl: Workload, x: str, out: str, inits: Inits) -> list[onnx.NodeProto]:
        """MatMul of `x` by the initializer B (+ Add bias)."""
        from onnx import helper

        product = out if not wl["bias"] else "product"
        nodes = [helper.make_node("MatMul", [x, "B"], [product])]
        if wl["bias"]:
            nodes.append(helper.make_node("Add", [product, "bias"], [out]))
        return nodes

    def task_weights(self, wl: Workload, weights: np.ndarray) -> np.ndarray:
        """B's (k, n) have no layout."""
        return weights


def gemm_anchor(graph: Graph, node: Node) -> Anchor:
    a = graph.shape(node.inputs[0])
    if int(node.attr("transA", 0)):  # type: ignore[arg-type]
        raise refuse(graph, node, "transA=1 (a transposed activation) is not supported")
    alpha, beta = float(node.attr("alpha", 1.0)), float(node.attr("beta", 1.0))  # type: ignore[arg-type]
    transposed = bool(node.attr("transB", 0))
    weights: np.ndarray | None = None
    if graph.constant(node.inputs[1]) is not None:
        w = float_constant(graph, node, node.inputs[1], "weight")
        w = w.T if transposed else w  # the workload takes B as (k, n)
        weights = np.ascontiguousarray(w * np.float32(alpha) if alpha != 1 else w, dtype=np.float32)
    elif transposed or alpha != 1:
        raise refuse(graph, node, "an activation as B needs transB=0 and alpha=1")
    if len(a) != 2:
        raise refuse(graph, node, f"A has shape {a}, Gemm takes 2-D A")
    m, k = a
    n = graph.shape(node.outputs[0])[1]
    anchor = Anchor(
        node=node,
        op="matmul",
        sizes=(("m", m), ("n", n), ("k", k)),
        out_shape=(m, n),
        channel_axis=1,
        weight_axis=1,
        weights=weights,
        transposed=transposed,
    )
    if len(node.inputs) < 3 or not node.inputs[2]:
        return anchor
    c = graph.constant(node.inputs[2])
    bias = anchor.channel_vector(graph, c * np.float32(beta)) if c is not None else None
    if bias is None:
        raise refuse(graph, node, f"C '{node.inputs[2]}' is not a constant per-column bias")
    return replace(anchor, bias=bias)


def matmul_anchor(graph: Graph, node: Node) -> Anchor | None:
    """A MatMul by one (k, n) matrix B, constant (weights) or an activation, the leading axes of A
    flattened into m (B is shared: they are rows of one matrix product); None where B has batch axes
    (the batched matmul generated operator's, xtune/ops/bmm.py)."""
    a, b = graph.shape(node.inputs[0]), graph.shape(node.inputs[1])
    out = graph.shape(node.outputs[0])
    if batched(a, b):
        return None
    if len(a) < 2 or len(b) != 2:
        raise refuse(graph, node, f"MatMul of shapes {a} @ {b} is not supported (a 1-D operand)")
    weights = graph.constant(node.inputs[1])
    if weights is not None:
        weights = float_constant(graph, node, node.inputs[1], "weight")
    sizes = (("m", int(np.prod(a[:-1]))), ("n", b[1]), ("k", a[-1]))
    return Anchor(
        node=node,
        op="matmul",
        sizes=sizes,
        out_shape=out,
        channel_axis=len(out) - 1,
        weight_axis=1,
        weights=weights,
    )
