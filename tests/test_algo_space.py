"""The algorithm as a knob: a 3x3 stride-1 conv2d without `algo=` is tuned over direct and Winograd in one
sum space (direct's indices first, unchanged), through the tuner, the log, `best`, the kernel artifact and
a network's tasks; `algo=` still forces one; logs of the direct template resume."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import xtune
from tests.test_pack_functions import check_packs
from xtune.boards.board import get_board
from xtune.cli import main
from xtune.firmware.build import NetArtifact
from xtune.firmware.network_bench import random_input, run_network
from xtune.frontend.tasks import extract_tasks
from xtune.ops.conv2d.direct import Conv2dTemplate
from xtune.ops.conv2d.features import CONV2D_FEATURES, WINOGRAD_FEATURES, conv2d_features, winograd_features
from xtune.ops.conv2d.winograd import WinogradTemplate
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.template import SumTemplate, seed_configs
from xtune.ops.workload import RTOL, compare_output
from xtune.schedule.space import ConfigSpace, Knob, KnobKind, sum_space
from xtune.target import Target, get_target
from xtune.transfer.pretrained import builtin_model_path, read_model, train
from xtune.tuning.database import TuningLog, log_target, make_record, read_logs
from xtune.tuning.features import EstimatePrior, PartsModel, estimate_prior, features_op, featurize
from xtune.tuning.measure import MeasureResult, MeasureStatus
from xtune.tuning.peers import ort_network
from xtune.tuning.ranking import build_choice
from xtune.tuning.search import SpaceArrays

KEY = "conv2d:n=1,c=8,h=6,w=6,k=12,r=3,s=3,pad=1"  # small: a tuning trial compiles in well under a second
TARGET = get_target("x86-avx2")
Capture = pytest.CaptureFixture[str]


def sum_of(key: str, target: Target = TARGET) -> SumTemplate:
    template = template_for(parse_workload(key), target)
    assert isinstance(template, SumTemplate), key
    return template


def winograd_seed_of(template: SumTemplate) -> int:
    """The Winograd part's default config, as an index of the sum."""
    return next(i for i in seed_configs(template) if template.part(template.space.config(i))[0] == "winograd")


# ---- the space -------------------------------------------------------------------------------------------


def test_the_direct_part_is_the_direct_template_index_for_index() -> None:
    wl = parse_workload(KEY)
    template, direct, wino = sum_of(KEY), Conv2dTemplate(wl, TARGET), WinogradTemplate(wl, TARGET)
    n = direct.space.size
    assert template.space.size == n + wino.space.size
    for i in [*range(0, n, 977), n - 1]:
        assert template.space.config(i).values == (("algo", "direct"), *direct.space.config(i).values)
        assert template.space.matches(i, direct.space.config(i).values)  # a record logged before the sum
        assert template.space.index_of(direct.space.config(i).as_dict()) == i
    for j in [0, 5, wino.space.size - 1]:
        config = template.space.config(n + j)
        assert config.values == (("algo", "winograd"), *wino.space.config(j).values)
        assert not template.space.matches(n + j, wino.space.config(j).values)
    seeds = [direct.default_config().index, n + wino.default_config().index]
    assert sorted(seed_configs(template)) == seeds and template.default_config().index in seeds


def test_an_untuned_deep_3x3_layer_runs_winograd_as_before_the_sum() -> None:
    """The default config (what a build without a log runs) is the part the analytic estimate rates
    higher: on a 64-channel 3x3 layer Winograd, the algorithm such layers of a network ran untuned
    before direct and Winograd were one space."""
    template = template_for(parse_workload("conv2d:n=1,c=64,h=28,w=28,k=64,r=3,s=3,stride=1,pad=1"), TARGET)
    assert isinstance(template, SumTemplate)
    assert template.part(template.default_config())[0] == "winograd"


def test_algo_forces_one_template_and_auto_is_direct_where_winograd_does_not_apply() -> None:
    assert isinstance(template_for(parse_workload(KEY + ",algo=direct"), TARGET), Conv2dTemplate)
    assert isinstance(template_for(parse_workload(KEY + ",algo=winograd"), TARGET), WinogradTemplate)
    stride2 = parse_workload(KEY + ",stride=2,algo=direct")
    assert "algo" not in stride2.key  # direct is all auto means there: one key, one log
    assert isinstance(template_for(stride2, TARGET), Conv2dTemplate)
    # Winograd's padded image copy of a VGG-sized layer would not fit its stack budget: direct alone.
    big = parse_workload("conv2d:n=1,c=64,h=224,w=224,k=64,r=3,s=3,pad=1")
    assert isinstance(template_for(big, TARGET), Conv2dTemplate)


def test_sum_space_digits_moves_and_legacy_records() -> None:
    a = ConfigSpace((Knob("x", KnobKind.TILE, (1, 2, 4)), Knob("y", KnobKind.CHOICE, ("p", "q"))))
    b = ConfigSpace((Knob("z", KnobKind.TILE, (8, 16)),))
    space = sum_space("algo", [("a", a), ("b", b)])
    assert space.size == 8 and [k.name for k in space.knobs] == ["algo", "x", "y", "z"]
    idx = np.arange(space.size)
    digits = space.digits(idx)
    assert digits.tolist()[5] == [0, 2, 1, 0] and digits.tolist()[7] == [1, 0, 0, 1]
    assert space.indices(digits).tolist() == idx.tolist()
    assert space.neighbour(7, 0, 0) == 0  # into part a at its digits 0
    assert space.neighbour(3, 3, 1) == 3  # a knob of the other part: no move
    assert space.index_of({"x": 4, "y": "q"}) == 5 and space.index_of({"algo": "b", "z": 16}) == 7
    assert space.matches(5, (("x", 4), ("y", "q"))) and not space.matches(7, (("z", 16),))
    rng = np.random.default_rng(0)
    moved = SpaceArrays(space).random_moves(np.repeat(idx, 50), rng)
    assert moved.min() >= 0 and moved.max() < space.size
    parts_before, parts_after = space.split(np.repeat(idx, 50))[0], space.split(moved)[0]
    assert (parts_before != parts_after).any() and (parts_before == parts_after).any()


def test_features_describe_both_algorithms_with_an_estimate_in_one_unit() -> None:
    template = sum_of(KEY)
    (_, direct), (_, wino) = template.parts
    n = direct.space.size
    local_d, local_w = np.array([0, 17, n - 1]), np.array([0, 3, wino.space.size - 1])
    x = featurize(template, [*local_d.tolist(), *(n + local_w).tolist()])
    assert features_op(template) == "conv2d_auto" and np.all(np.isfinite(x))
    assert x[:, 0].tolist() == [0, 0, 0, 1, 1, 1]
    nd = len(CONV2D_FEATURES)
    np.testing.assert_array_equal(x[:3, 1 : 1 + nd], conv2d_features(direct, local_d))
    np.testing.assert_array_equal(x[3:, 1 + nd : -1], winograd_features(wino, local_w))
    assert not x[:3, 1 + nd : -1].any() and not x[3:, 1 : 1 + nd].any()
    wino_est = winograd_features(wino, local_w)[:, WINOGRAD_FEATURES.index("est_eff")]
    assert np.all(x[3:, -1] > wino_est)  # in the direct's units: Winograd's multiply gain counts
    prior = estimate_prior("conv2d_auto")
    assert prior is not None and np.all(prior.predict(x) > 0)


# ---- tuning, the log, `best`, the kernel artifact ----------------------------------------------------------


def _main(argv: list[str], capsys: Capture) -> dict[str, object]:
    assert main([*argv, "--json"]) == 0
    return dict(json.loads(capsys.readouterr().out))


def _tune(what: list[str], trials: int, log: Path, capsys: Capture) -> dict[str, object]:
    """`xtune tune` of `what` on the host, `trials` in one batch, no confirmation timings."""
    budget = ["--trials", str(trials), "--batch-size", str(trials), "--confirm", "0"]
    return _main(["tune", *what, *budget, "--log", str(log)], capsys)


def test_a_tiny_budget_measures_both_algorithms_and_best_names_the_winner(
    tmp_path: Path, capsys: Capture
) -> None:
    log = tmp_path / "log.jsonl"
    _tune(["--workload", KEY], 4, log, capsys)
    records = TuningLog(log).read()
    assert {dict(r.knobs)["algo"] for r in records} == {"direct", "winograd"}
    target = records[0].target
    winner = build_choice(read_logs([log]), parse_workload(KEY).key, target)
    assert winner is not None
    best = _main(["best", "--log", str(log)], capsys)["best"]
    assert isinstance(best, list) and best[0]["best"]["index"] == winner.index
    assert best[0]["best"]["knobs"]["algo"] == dict(winner.knobs)["algo"]


def _fastest(log: Path, key: str, target: str, config_index: int) -> None:
    """`log` gains a record that makes config `config_index` the best of `key` (the build's choice; its
    timing made up, faster than anything measured)."""
    wl = parse_workload(key)
    config = template_for(wl, get_target(target)).space.config(config_index)
    ok = MeasureResult(MeasureStatus.OK, (1e-12,), "")
    TuningLog(log).append([make_record(wl.key, target, "local", config, ok)])


def test_the_artifact_of_a_winograd_winner_names_it_and_packs_for_it(tmp_path: Path, capsys: Capture) -> None:
    key = KEY + ",prepacked=1"
    winograd_seed = winograd_seed_of(sum_of(key))
    log, header = tmp_path / "log.jsonl", tmp_path / "k.h"
    _fastest(log, key, TARGET.name, winograd_seed)
    build = ["build", "--workload", key, "--target", TARGET.name, "--log", str(log)]
    _main([*build, "-o", str(tmp_path / "k.o"), "--header", str(header)], capsys)
    text = header.read_text()
    assert f"config {winograd_seed} " in text and "algo=winograd tile=" in text
    assert "_pack(const float *weights, float *packed);" in text


SUM_PACKED = KEY + ",bias=1,prepacked=1"


def test_the_sums_pack_functions_follow_each_algorithm_on_the_host() -> None:
    """Each algorithm's default: its pack function writes what its kernel reads, which computes the
    reference (the sum dispatches every call to the config's part)."""
    target = get_board("local").target
    check_packs("local", SUM_PACKED, seed_configs(template_for(parse_workload(SUM_PACKED), target)))


def test_the_sums_pack_functions_follow_each_algorithm_under_qemu(qemu_board: str) -> None:
    target = get_board(qemu_board).target
    check_packs(qemu_board, SUM_PACKED, seed_configs(template_for(parse_workload(SUM_PACKED), target)))


def test_a_log_of_the_direct_template_resumes(tmp_path: Path, capsys: Capture) -> None:
    """Records written before the sum (keyed without algo, knobs without it) are the sum's direct configs."""
    wl, target = parse_workload(KEY), get_board("local").target
    direct = Conv2dTemplate(wl, target)
    log = tmp_path / "old.jsonl"
    old = [direct.default_config().index, 11, 4242]
    ok = MeasureResult(MeasureStatus.OK, (1e-9,), "")  # made up: faster than anything measured
    TuningLog(log).append(
        [make_record(wl.key, target.name, "local", direct.space.config(i), ok) for i in old]
    )
    report = _tune(["--workload", KEY], 2, log, capsys)
    assert report["resumed"] == len(old)
    new = [r.index for r in TuningLog(log).read()[len(old) :]]
    assert len(new) == 2 and not set(new) & set(old)
    best = _main(["best", "--log", str(log)], capsys)["best"]
    assert isinstance(best, list) and best[0]["best"]["index"] in old
    assert best[0]["best"]["knobs"]["algo"] == "direct"  # the old record, in the sum's words


# ---- a network's tasks -------------------------------------------------------------------------------------


def _network() -> onnx.ModelProto:
    """A 3x3 stride-1 Conv with bias and ReLU (Winograd applies: a sum task), then a stride-2 one (direct)."""
    rng = np.random.default_rng(3)
    inits = [
        onnx.numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)
        for name, shape in (("w1", (12, 8, 3, 3)), ("b1", (12,)), ("w2", (8, 12, 3, 3)))
    ]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
        helper.make_node("Conv", ["r1", "w2"], ["y"], name="conv2", pads=[1, 1, 1, 1], strides=[2, 2]),
    ]
    graph = helper.make_graph(
        nodes,
        "algo_net",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8, 3, 3])],
        inits,
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def _check_against_ort(model: onnx.ModelProto, log: Path) -> NetArtifact:
    board = get_board("local")
    artifact = xtune.build_model(model, board.target.name, logs=[log])
    x = random_input(artifact.program.input_shape)
    got, _ = run_network(board, artifact, x)
    ref, _ = ort_network(model.SerializeToString(), x)
    assert compare_output(got, ref, RTOL) == ""
    return artifact


def test_a_networks_3x3_task_explores_both_and_its_build_follows_the_winner(
    tmp_path: Path, capsys: Capture
) -> None:
    pytest.importorskip("onnxruntime")
    model, path, log = _network(), tmp_path / "net.onnx", tmp_path / "net.jsonl"
    onnx.save(model, path)
    _tune(["--model", str(path)], 6, log, capsys)
    target, records = get_board("local").target, TuningLog(log).read()
    (task,) = {r.workload for r in records if "stride=1" in r.workload}
    assert isinstance(template_for(parse_workload(task), target), SumTemplate)
    assert {dict(r.knobs)["algo"] for r in records if r.workload == task} == {"direct", "winograd"}
    winner = build_choice(read_logs([log]), task, log_target(parse_workload(task), target))
    assert winner is not None
    row = next(k for k in _check_against_ort(model, log).kernels if k.what == task)
    assert (row.source, row.config_index) == ("log", winner.index)
    # Whichever won above: a log whose best is the Winograd seed builds Winograd, weights packed as U.
    winograd_seed = winograd_seed_of(sum_of(task, target))
    _fastest(log, task, target.name, winograd_seed)
    row = next(k for k in _check_against_ort(model, log).kernels if k.what == task)
    assert row.config_index == winograd_seed


def test_a_log_keyed_algo_winograd_builds_and_resumes_the_sum(tmp_path: Path, capsys: Capture) -> None:
    """A network's 3x3 tasks were keyed algo=winograd before the algorithm was the tuner's: such a log's
    records are the sum's Winograd configs, which the network's build takes and a tuning run resumes."""
    pytest.importorskip("onnxruntime")
    model, target, log = _network(), get_board("local").target, tmp_path / "old.jsonl"
    (task,) = (t.workload.key for t in extract_tasks(model, target).tasks if "stride=1" in t.workload.key)
    forced = parse_workload(task + ",algo=winograd")
    winograd = template_for(forced, target)
    own = winograd.default_config().index + 1
    _fastest(log, forced.key, target.name, own)
    summed = template_for(parse_workload(task), target)
    assert isinstance(summed, SumTemplate)
    offset = summed.parts[0][1].space.size
    row = next(k for k in _check_against_ort(model, log).kernels if k.what == task)
    assert (row.source, row.config_index) == ("log", offset + own)
    report = _tune(["--workload", task], 1, log, capsys)
    assert report["resumed"] == 1


# ---- transfer: the parts' boosters, never a sum's own ----------------------------------------------------


def test_logs_of_the_sum_train_the_parts_boosters_which_score_the_sum() -> None:
    template = sum_of(KEY)
    n = template.parts[0][1].space.size
    rng = np.random.default_rng(5)
    indices = [*rng.integers(0, n, 40).tolist(), *(n + rng.integers(0, 500, 40)).tolist()]
    records = [
        make_record(
            template.workload.key,
            TARGET.name,
            "local",
            template.space.config(i),
            MeasureResult(MeasureStatus.OK, (float(1e-6 * (1 + i % 7)),), ""),  # made-up costs: labels
        )
        for i in indices
    ]
    model = train(records)
    assert model.manifest.ops == ("conv2d", "winograd")
    scorer = model.cost_model("conv2d_auto")
    assert isinstance(scorer, PartsModel)
    x = featurize(template, indices)
    (direct_model, a, b), (wino_model, c, d) = scorer.parts
    np.testing.assert_array_equal(scorer.predict(x)[:40], direct_model.predict(x[:40, a:b]))
    np.testing.assert_array_equal(scorer.predict(x)[40:], wino_model.predict(x[40:, c:d]))
    # The shipped models hold no Winograd booster: its analytic estimate stands in for one.
    shipped = read_model(builtin_model_path(TARGET, "conv2d_auto")).cost_model("conv2d_auto")
    assert isinstance(shipped, PartsModel) and isinstance(shipped.parts[1][0], EstimatePrior)
