"""The normalization pass (xtune/frontend/normalize.py), pass by pass: ONNX Runtime on the original model
against ONNX Runtime on the normalized one, and the whole-network build against ONNX Runtime where xtune
runs the result; external data; the one refusal that names every node xtune cannot run."""

from __future__ import annotations

import collections
import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests import exported
from xtune.boards.board import get_board
from xtune.cli import main
from xtune.errors import InputError
from xtune.firmware.network_bench import bench_model, random_input
from xtune.frontend.load import load_graph
from xtune.frontend.normalize import normalize
from xtune.frontend.tasks import extract_tasks
from xtune.ops.workload import RTOL, compare_output
from xtune.tuning.peers import ort_network

pytest.importorskip("onnxruntime")
Capture = pytest.CaptureFixture[str]


def ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    return ort_network(model.SerializeToString(), x)[0]


def input_shape(model: onnx.ModelProto) -> tuple[int, ...]:
    constants = {i.name for i in model.graph.initializer}
    (x,) = (i for i in model.graph.input if i.name not in constants)
    return tuple(d.dim_value for d in x.type.tensor_type.shape.dim)


def normalized_like_ort(model: onnx.ModelProto, exact: bool = False) -> onnx.ModelProto:
    """The normalized model, after checking that ONNX Runtime computes the same on both (bit for bit
    with `exact`)."""
    out = normalize(model, model.graph.name)
    x = random_input(input_shape(model))
    want, got = ort(model, x), ort(out, x)
    if exact:
        np.testing.assert_array_equal(got, want)
    assert compare_output(got, want, RTOL) == ""
    return out


def ops(model: onnx.ModelProto) -> dict[str, int]:
    return dict(collections.Counter(n.op_type for n in model.graph.node))


def builds_like_ort(model: onnx.ModelProto) -> None:
    """xtune builds the model for this machine and its output matches ONNX Runtime's on the original."""
    report = bench_model(model, get_board("local"), repeat=0)
    assert report.correct, report.error


def one_node(op: str, const: np.ndarray, opset: int = 17) -> onnx.ModelProto:
    node = helper.make_node(op, ["x", "c"], ["y"], name=op.lower())
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(const, "c")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


# --- every pass at once: an old export xtune builds once normalized -------------------------------------


def test_an_opset_9_export_with_every_quirk_is_normalized_exactly_and_builds() -> None:
    model = exported.quirks()
    out = normalized_like_ort(model)
    assert out.opset_import[0].version == 11
    # ConstantOfShape, Constant, Cast, Unsqueeze, the Shape chain: folded; Identity, Dropout: gone; Sum of
    # three: two Adds; Sub: an Add; Div by 0.25: a Mul; Div by 3 kept; the Scale merged into the BN.
    assert ops(out) == {
        "Conv": 2,
        "BatchNormalization": 1,
        "Relu": 1,
        "Add": 3,
        "Div": 1,
        "Mul": 1,
        "MaxPool": 1,
        "Reshape": 1,
        "Gemm": 1,
        "Softmax": 1,
    }
    tasks = extract_tasks(model, get_board("local").target)
    fused = {op.anchor: op.fused for t in tasks.tasks for op in t.ops}
    # BN and the merged scale and shift fold into conv; the Sub, both Divs and the residual into conv2.
    assert fused["conv"] == ("bn", "relu") and fused["conv2"] == ("sub", "div3", "div4", "sum.add1")
    builds_like_ort(model)


# --- pass by pass --------------------------------------------------------------------------------------


def test_opsets_are_upgraded_read_up_to_onnx_newest_and_refused_outside() -> None:
    model = exported.quirks()
    model.opset_import.append(helper.make_opsetid("ai.onnx.ml", 3))  # imported, used by no node
    assert [o.domain for o in normalized_like_ort(model).opset_import] == [""]
    newest = onnx.defs.onnx_opset_version()
    for opset, message in ((6, "opset 6 is not supported (xtune reads 7 to"), (newest + 1, "newer than the")):
        old = exported.quirks()
        old.opset_import[0].version = opset
        with pytest.raises(InputError, match=message.replace("(", r"\(")):
            load_graph(old)
    latest = one_node("Add", np.ones((1, 4, 1, 1), np.float32), opset=newest)
    assert load_graph(latest).opset == newest


def test_constants_fold_through_the_reference_evaluator() -> None:
    """The exporters' Flatten (Shape, Gather, Unsqueeze, Concat -> Reshape) and a ConstantOfShape bias
    become initializers; a node writing a graph output is never folded away."""
    out = normalized_like_ort(exported.quirks(), exact=False)
    names = {i.name for i in out.graph.initializer}
    assert {"bias", "flat.shape"} <= names
    assert numpy_helper.to_array(
        next(i for i in out.graph.initializer if i.name == "flat.shape")
    ).tolist() == [1, -1]


def test_div_by_a_power_of_two_becomes_a_mul_and_any_other_div_stays() -> None:
    """x / 2^k and x * 2^-k are one real number rounded once: ONNX Runtime gives the same bits. x / 3
    and x * fl(1/3) differ in the last bit for some x, so Div by 3 stays (ONNX Runtime's Div divides)."""
    quarter = normalized_like_ort(one_node("Div", np.full((1, 4, 1, 1), 0.25, np.float32)), exact=True)
    assert ops(quarter) == {"Mul": 1}
    assert numpy_helper.to_array(quarter.graph.initializer[0]).reshape(-1).tolist() == [4.0] * 4
    three = normalized_like_ort(one_node("Div", np.array(3.0, np.float32)), exact=True)
    assert ops(three) == {"Div": 1}
    x = random_input((1, 4, 8, 8))
    by_reciprocal = ort(one_node("Mul", np.array(1 / 3, np.float32)), x)
    assert not np.array_equal(by_reciprocal, ort(one_node("Div", np.array(3.0, np.float32)), x))


def test_sub_of_a_constant_is_an_add_and_a_leading_constant_goes_second() -> None:
    sub = normalized_like_ort(one_node("Sub", np.arange(4, dtype=np.float32).reshape(1, 4, 1, 1)), exact=True)
    assert ops(sub) == {"Add": 1} and sub.graph.node[0].input[0] == "x"
    mul = one_node("Mul", np.full((1, 4, 1, 1), 1.5, np.float32))
    mul.graph.node[0].input[:] = ["c", "x"]
    assert list(normalized_like_ort(mul, exact=True).graph.node[0].input) == ["x", "c"]


def identity_model(opset: int, mask_read: bool, training: bool = False) -> onnx.ModelProto:
    """x -> Relu -> Dropout (opset 12+: training_mode a constant) -> Identity -> the graph output y."""
    inputs = ["r", "ratio", "mode"] if opset >= 12 else ["r"]
    nodes = [
        helper.make_node("Relu", ["x"], ["r"], name="relu"),
        helper.make_node("Dropout", inputs, ["d", "mask"], name="dropout"),
        helper.make_node("Identity", ["d"], ["y"], name="identity"),
    ]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    if mask_read:
        outputs.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, None))
    inits = (
        [
            numpy_helper.from_array(np.array(0.5, np.float32), "ratio"),
            numpy_helper.from_array(np.array(training), "mode"),
        ]
        if opset >= 12
        else []
    )
    graph = helper.make_graph(
        nodes,
        "identities",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
        outputs,
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


@pytest.mark.parametrize("opset", [10, 13])
def test_identity_and_inference_dropout_disappear(opset: int) -> None:
    """The graph output is then written by the Relu itself; a Dropout whose mask is read stays, and is
    refused with what would help."""
    out = normalized_like_ort(identity_model(opset, mask_read=False), exact=True)
    assert ops(out) == {"Relu": 1} and list(out.graph.node[0].output) == ["y"]
    kept = normalize(identity_model(opset, mask_read=True), "m")
    assert ops(kept) == {"Relu": 1, "Dropout": 1}
    if opset >= 12:
        assert "Dropout" in ops(normalize(identity_model(opset, mask_read=False, training=True), "m"))


def test_batchnorm_scale_and_shift_merge_and_per_channel_scales_fold_into_the_conv() -> None:
    """DenseNet's pre-activation, BN -> Mul -> Add of Unsqueeze-d vectors, is one BatchNormalization."""
    nodes, inits = [], {}
    rng = np.random.default_rng(1)
    for p, lo in (("g", 0.5), ("b", -1), ("m", -1), ("v", 0.5)):
        inits[f"bn.{p}"] = rng.uniform(lo, 1.5, 4).astype(np.float32)
    inits["s"] = rng.uniform(0.5, 1.5, (4, 1, 1)).astype(np.float32)
    inits["t"] = rng.uniform(-1, 1, (4, 1, 1)).astype(np.float32)
    nodes = [
        helper.make_node("BatchNormalization", ["x", "bn.g", "bn.b", "bn.m", "bn.v"], ["b"], name="bn"),
        helper.make_node("Mul", ["b", "s"], ["bs"], name="scale"),
        helper.make_node("Add", ["bs", "t"], ["y"], name="shift"),
    ]
    graph = helper.make_graph(
        nodes,
        "pre",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 5, 5])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    out = normalized_like_ort(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]))
    assert ops(out) == {"BatchNormalization": 1} and list(out.graph.node[0].output) == ["y"]


# --- external data -------------------------------------------------------------------------------------


def test_external_data_loads_from_beside_the_model_and_nowhere_else(tmp_path: Path, capsys: Capture) -> None:
    model = exported.ds_cnn(channels=16, blocks=1)
    path = tmp_path / "kws.onnx"
    saved = onnx.ModelProto()
    saved.CopyFrom(model)  # saving with external data rewrites the model's tensors as references
    onnx.save_model(saved, str(path), save_as_external_data=True, location="kws.bin", size_threshold=0)
    assert (tmp_path / "kws.bin").stat().st_size > 4 * 16 * 40
    graph = load_graph(path)
    np.testing.assert_array_equal(
        graph.constants["conv1.w"], numpy_helper.to_array(model.graph.initializer[0])
    )
    escaping = onnx.load_model(str(path), load_external_data=False)
    for init in escaping.graph.initializer:
        for entry in init.external_data:
            if entry.key == "location":
                entry.value = "../kws.bin"
    (tmp_path / "inner").mkdir()
    (tmp_path / "inner" / "evil.onnx").write_bytes(escaping.SerializeToString())
    assert main(["tasks", str(tmp_path / "inner" / "evil.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "'../kws.bin', outside the model's folder" in err, err
    (tmp_path / "kws.bin").unlink()
    assert main(["tasks", str(path)]) == 2
    assert "which is missing" in capsys.readouterr().err


# --- one refusal names everything ----------------------------------------------------------------------


def unsupported_model() -> onnx.ModelProto:
    """A conv whose dilations differ per axis and a custom-domain op: two op types xtune does not run; and
    two LRNs with bias 0, a Pad in wrap mode and a MaxPool with ceil_mode=1, which only the build's
    generated operators refuse."""
    rng = np.random.default_rng(0)
    node = helper.make_node
    nodes = [
        node("Conv", ["x", "w"], ["c"], name="conv", group=2, pads=[1, 2, 1, 2], dilations=[1, 2]),
        node("BatchNormalization", ["c", "g", "b", "m", "v"], ["cb"], name="conv.bn"),
        node("LRN", ["cb"], ["n1"], name="lrn1", size=3, bias=0.0),
        node("LRN", ["n1"], ["n2"], name="lrn2", size=3, bias=0.0),
        node("Pad", ["n2", "pads"], ["t"], name="pad", mode="wrap"),
        node("MaxPool", ["t"], ["p"], name="pool", kernel_shape=[1, 1], ceil_mode=1),
        node("QuickGelu", ["p"], ["y"], name="gelu", domain="com.microsoft"),
    ]
    inits: dict[str, np.ndarray] = {
        "w": rng.standard_normal((8, 4, 3, 3)).astype(np.float32),
        **{p: rng.uniform(0.5, 1.5, 8).astype(np.float32) for p in "gbmv"},
        "pads": np.zeros(8, np.int64),
    }
    graph = helper.make_graph(
        nodes,
        "unsupported",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 6, 6])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    opsets = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
    return helper.make_model(graph, opset_imports=opsets)


def test_one_refusal_names_every_unsupported_node_by_op_type(tmp_path: Path, capsys: Capture) -> None:
    path = tmp_path / "u.onnx"
    onnx.save(unsupported_model(), path)
    for command in (
        ["tasks", str(path)],
        [
            "build",
            "--model",
            str(path),
            "--target",
            "x86-avx2",
            "-o",
            str(tmp_path / "n.o"),
            "--header",
            str(tmp_path / "n.h"),
        ],
    ):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1, err
        assert "xtune cannot run 6 nodes (5 op types): Conv ×1 (node 'conv'): dilations (1, 2) differ" in err
        assert "LRN ×2 (nodes 'lrn1', 'lrn2'): lrn: bias 0.0 must be positive" in err
        assert (
            "Pad ×1 (node 'pad'): mode 'wrap' is not supported" in err
            and "MaxPool ×1 (node 'pool'): ceil_mode=1" in err
        )
        assert (
            "com.microsoft.QuickGelu ×1 (node 'gelu'): not an operator xtune runs (an operator of the " in err
        )
        assert "BatchNormalization" not in err  # it would fold into the conv
    assert main(["tasks", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert [(u["op"], u["count"], u["nodes"]) for u in report["unsupported"]] == [
        ("Conv", 1, ["conv"]),
        ("LRN", 2, ["lrn1", "lrn2"]),
        ("Pad", 1, ["pad"]),
        ("MaxPool", 1, ["pool"]),
        ("com.microsoft.QuickGelu", 1, ["gelu"]),
    ]
    assert "export with standard ONNX operators only" in report["unsupported"][4]["hint"]
    assert report["tasks"] == []


def test_a_read_dropout_mask_is_refused_with_what_would_help(tmp_path: Path, capsys: Capture) -> None:
    with pytest.raises(
        InputError,
        match=r"node 'dropout' \(Dropout\): tensor 'mask' is bool, xtune runs float32 only \(export in",
    ):
        extract_tasks(identity_model(13, mask_read=True), "x86-avx2")


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty_graph"])
def test_malformed_truncated_or_non_onnx_files_are_one_line_exit_2(
    damage: str, tmp_path: Path, capsys: Capture
) -> None:
    data = exported.ds_cnn(channels=8, blocks=1).SerializeToString()
    path = tmp_path / "m.onnx"
    if damage == "truncated":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "garbage":
        path.write_bytes(b"\x08\x07garbage, not protobuf\xff\xfe" * 20)
    else:
        path.write_bytes(onnx.ModelProto(ir_version=8).SerializeToString())
    assert main(["tasks", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("xtune: error:"), err


def test_a_constant_node_the_evaluator_refuses_is_left_for_the_refusal(
    tmp_path: Path, capsys: Capture
) -> None:
    """A Gather of constants with an index out of range: onnx's evaluator raises inside folding; the node
    stays, and the user sees xtune's one refusal line, not the evaluator's traceback."""
    nodes = [
        helper.make_node("Gather", ["table", "index"], ["picked"], name="gather"),
        helper.make_node("Add", ["x", "picked"], ["y"], name="add"),
    ]
    inits = [
        numpy_helper.from_array(np.ones(4, np.float32), "table"),
        numpy_helper.from_array(np.array([9], np.int64), "index"),
    ]
    graph = helper.make_graph(
        nodes,
        "bad_gather",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
        inits,
    )
    path = tmp_path / "g.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    assert main(["tasks", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("xtune: error:") and "Traceback" not in err, err
