"""The ONNX Model Zoo's classification graphs as the zoo ships them (the light copies inside the onnx
package: opset 9, every weight a ConstantOfShape): normalization keeps each one's output (ONNX Runtime
on the original against ONNX Runtime on the normalized model), the refusal names exactly the op types
xtune cannot run yet, and those it runs build and match ONNX Runtime on this machine."""

from __future__ import annotations

import shutil
from functools import cache

import onnx
import pytest

from tests import exported
from xtune.boards.board import get_board
from xtune.errors import InputError
from xtune.firmware.network_bench import bench_model, random_input
from xtune.firmware.program import unsupported
from xtune.frontend.load import load_graph
from xtune.frontend.normalize import normalize
from xtune.frontend.tasks import extract_tasks
from xtune.ops.workload import RTOL, compare_output
from xtune.tuning.peers import ort_network

pytest.importorskip("onnxruntime")
LIGHT = exported.light_models()
# The op types xtune cannot run yet, per graph. It shrinks as operators land: a model whose set empties
# moves into BUILDS below.
NOT_YET: dict[str, set[str]] = {
    "alexnet": set(),
    "densenet121": set(),
    "inception_v1": set(),
    "inception_v2": set(),
    "resnet50": set(),
    "shufflenet": set(),
    "squeezenet": set(),
    "vgg19": set(),
    "zfnet512": set(),
}
# Those xtune runs, built and run here. VGG-19 is refused by the build itself: the default config of its
# 224x224 Winograd layers needs 13 MB of stack, more than a built kernel may use (docs/firmware.md, Stack).
BUILDS = [name for name, ops in NOT_YET.items() if not ops and name != "vgg19"]


@cache
def zoo(name: str) -> onnx.ModelProto:
    """The graph with seeded random weights (with every weight 0.02 a wrong channel order goes unseen),
    its output the logits."""
    return exported.zoo_logits(name)


def input_shape(model: onnx.ModelProto) -> tuple[int, ...]:
    constants = {i.name for i in model.graph.initializer}
    (x,) = (i for i in model.graph.input if i.name not in constants)
    return tuple(d.dim_value for d in x.type.tensor_type.shape.dim)


def test_the_table_covers_every_light_model_the_onnx_package_ships() -> None:
    assert set(LIGHT) == set(NOT_YET)


@pytest.mark.parametrize("name", list(NOT_YET))
def test_normalization_keeps_the_output_of_every_zoo_graph(name: str) -> None:
    model = zoo(name)
    out = normalize(model, name)
    assert [(o.domain, o.version) for o in out.opset_import] == [("", 11)]
    left = {n.op_type for n in out.graph.node}
    assert not left & {"Constant", "ConstantOfShape", "Identity", "Dropout", "Sum", "Unsqueeze"}, left
    if name in BUILDS:
        return  # its build (the test below) runs the normalized graph against ONNX Runtime on the file
    x = random_input(input_shape(model))
    want, _ = ort_network(model.SerializeToString(), x)
    got, _ = ort_network(out.SerializeToString(), x)
    assert compare_output(got, want, RTOL) == "", name


@pytest.mark.parametrize("name", [name for name, ops in NOT_YET.items() if ops or name not in BUILDS])
def test_the_refusal_names_exactly_the_op_types_xtune_cannot_run_yet(name: str) -> None:
    """As shipped (the file itself): what the build refuses (task extraction's refusals and the generated
    operators' own, as `xtune tasks` lists them) by op type; without `partial`, one line names them. The
    file is imported once and the graph given to both (importing normalizes it, most of the time taken).
    A graph the build test below builds and runs has nothing to refuse, and is not imported again here."""
    path = str(LIGHT[name])
    graph = load_graph(path)
    partial = extract_tasks(graph, "x86-avx2", partial=True)
    assert {u.op for u in unsupported(graph)} == NOT_YET[name]
    assert {u.op for u in partial.unsupported} <= NOT_YET[name]
    assert partial.tasks
    if not NOT_YET[name]:
        return
    with pytest.raises(InputError) as refused:
        extract_tasks(graph, "x86-avx2")
    message = str(refused.value)
    assert "\n" not in message and message.startswith(path)
    for part in partial.unsupported:
        assert f"{part.op} ×{part.count} " in message or f"({part.op}): " in message, message


@pytest.mark.parametrize("name", BUILDS)
def test_the_zoo_graphs_xtune_runs_build_and_match_onnx_runtime(name: str) -> None:
    report = bench_model(zoo(name), get_board("local"), repeat=0)
    assert report.correct, (name, report.error)


# The exporter-style networks of tests/exported.py and the op types xtune cannot run in each yet.
EXPORTED: dict[str, tuple[onnx.ModelProto, set[str]]] = {
    "ds_cnn": (exported.ds_cnn(), set()),
    "se_block": (exported.se_block(), set()),
    "reduce_mean_13": (exported.reduce_mean_head(13), set()),
    "reduce_mean_18": (exported.reduce_mean_head(18), set()),
}


@pytest.mark.parametrize("name", list(EXPORTED))
def test_exporter_style_networks_normalize_exactly_and_name_what_is_missing(name: str) -> None:
    model, missing = EXPORTED[name]
    x = random_input(input_shape(model))
    want, _ = ort_network(model.SerializeToString(), x)
    got, _ = ort_network(normalize(model, name).SerializeToString(), x)
    assert compare_output(got, want, RTOL) == "", name
    partial = extract_tasks(model, "x86-avx2", partial=True)
    assert {u.op for u in partial.unsupported} == missing


@pytest.mark.parametrize(
    ("board", "layout", "channels"),
    [
        ("local", "nhwc", 64),
        ("local", "nchw", 64),
        ("qemu-aarch64", "nhwc", 16),
        ("qemu-riscv64", "nchw", 16),
    ],
)
def test_ds_cnn_with_its_asymmetric_same_padding_builds_and_matches_onnx_runtime(
    board: str, layout: str, channels: int
) -> None:
    """The first conv's TensorFlow "same" pads (4 on top, 5 below, 1 left and right) run as they are."""
    if board != "local" and shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip(f"needs {get_board(board).target.qemu_binary} (qemu-user)")
    model = exported.ds_cnn(channels=channels, blocks=4 if board == "local" else 1)
    first = extract_tasks(model, "x86-avx2", layout).tasks[0].workload.key
    assert ",pad=4,pad_left=1,pad_bottom=5,pad_right=1," in first, first
    report = bench_model(model, get_board(board), repeat=0, layout=layout)
    assert report.correct, report.error


@pytest.mark.parametrize("layout", ["nchw", "nhwc"])
@pytest.mark.parametrize("name", [name for name, (_, missing) in EXPORTED.items() if not missing])
def test_the_exporter_style_networks_xtune_runs_build_and_match_onnx_runtime(name: str, layout: str) -> None:
    report = bench_model(EXPORTED[name][0], get_board("local"), repeat=0, layout=layout)
    assert report.correct, (name, report.error)
