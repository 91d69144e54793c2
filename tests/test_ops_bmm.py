"""MatMul with batch dimensions: attention between Gemms (Q @ K^T and scores @ V, both operands
activations: the batched matmul generated operator, xtune/ops/bmm.py), a constant stack of matrices with
broadcast batch axes, and a MatMul by one (k, n) matrix with a batched A (the matmul task, A's leading
axes its rows); built through the real build path in NCHW and NHWC against ONNX Runtime, one under qemu."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.opnets import LAYOUTS, check, kinds, net
from xtune.frontend.tasks import extract_tasks

pytest.importorskip("onnxruntime")

node = helper.make_node


def attention(seq: int = 5, heads: int = 2, dim: int = 3) -> onnx.ModelProto:
    """x (seq, heads*dim) -> Gemm q, k, v -> heads apart -> softmax(q @ k^T) @ v -> heads together -> Gemm."""
    rng = np.random.default_rng(4)
    width = heads * dim
    inits = {f"w{p}": (rng.standard_normal((width, width)) * 0.5).astype(np.float32) for p in "qkvo"}
    inits["split"] = np.array([seq, heads, dim], np.int64)
    inits["joined"] = np.array([seq, width], np.int64)
    nodes = [node("Gemm", ["x", f"w{p}"], [p], name=f"proj_{p}") for p in "qkv"]
    for p, perm in (("q", [1, 0, 2]), ("k", [1, 2, 0]), ("v", [1, 0, 2])):
        nodes += [
            node("Reshape", [p, "split"], [f"{p}.r"], name=f"{p}.reshape"),
            node("Transpose", [f"{p}.r"], [f"{p}.h"], name=f"{p}.heads", perm=perm),
        ]
    nodes += [
        node("MatMul", ["q.h", "k.h"], ["scores"], name="qk"),
        node("Softmax", ["scores"], ["attn"], name="softmax", axis=-1),
        node("MatMul", ["attn", "v.h"], ["ctx"], name="av"),
        node("Transpose", ["ctx"], ["ctx.t"], name="ctx.t", perm=[1, 0, 2]),
        node("Reshape", ["ctx.t", "joined"], ["ctx.j"], name="ctx.join"),
        node("Gemm", ["ctx.j", "wo"], ["y"], name="proj_o"),
    ]
    graph = helper.make_graph(
        nodes,
        "attention",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [seq, width])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("layout", LAYOUTS)
def test_attention_between_gemms_matches_onnx_runtime(layout: str) -> None:
    artifact = check(attention(), layout)
    assert [k.what.split(":")[0] for k in artifact.kernels].count("batchedmatmul") == 2


def test_attention_on_qemu_aarch64() -> None:
    check(attention(seq=3, heads=3, dim=5), "nhwc", board="qemu-aarch64")


def stacked(shape: tuple[int, ...], b: tuple[int, ...]) -> onnx.ModelProto:
    """conv 1x1 -> MatMul by a constant B of shape `b` (its batch axes broadcast against the conv's
    output's) -> conv 1x1 of the product's channels."""
    rng = np.random.default_rng(6)
    inits = {"B": (rng.standard_normal(b) * 0.5).astype(np.float32)}
    out_c = int(np.broadcast_shapes(shape[:2], (1,) * (4 - len(b)) + b[:-2])[1])
    inits["w2"] = rng.standard_normal((out_c, out_c, 1, 1)).astype(np.float32)
    nodes = [
        node("MatMul", ["a", "B"], ["p"], name="stack"),
        node("Conv", ["p", "w2"], ["y"], name="conv2"),
    ]
    return net(nodes, shape, inits)


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    ("shape", "b"),
    [((1, 3, 4, 5), (3, 5, 9)), ((2, 1, 3, 5), (3, 5, 19)), ((1, 2, 1, 7), (1, 2, 7, 2))],
    ids=["per-channel", "broadcast-channels", "one-row"],
)
def test_constant_stack_of_matrices(shape: tuple[int, ...], b: tuple[int, ...], layout: str) -> None:
    """B's batch axes broadcast against A's (A of 1 channel times 3 matrices), n no multiple of a vector."""
    artifact = check(stacked(shape, b), layout)
    assert "batchedmatmul" in kinds(artifact)


def test_one_matrix_b_with_a_batched_a_is_one_task() -> None:
    """(2, 3, 4, 5) @ (5, 6): one matmul task of 24 rows, no generated operator."""
    rng = np.random.default_rng(8)
    model = net(
        [node("MatMul", ["a", "B"], ["y"], name="mm")],
        (2, 3, 4, 5),
        {"B": rng.standard_normal((5, 6)).astype(np.float32)},
    )
    (task,) = extract_tasks(model, "x86-avx2").tasks[1:]
    assert task.workload.key.startswith("matmul:m=24,n=6,k=5")
    artifact = check(model, "nhwc")
    assert "batchedmatmul" not in kinds(artifact)
