"""Transfer learning: `xtune model train/info`, the model file and its refusals, `--transfer-from`, and what
a pretrained model buys a tuner (fewer trials to the optimum)."""

from __future__ import annotations

import base64
import json
import statistics
import subprocess
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import xtune
from tests.conftest import CliRunner
from tests.test_database import QEMU_FP, WRAPPER_FP, old_line
from tests.test_tuner import COSTS, OPTIMUM, SPACE, fake_measurer
from xtune.boards.cost import CostUnit
from xtune.errors import InputError
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.template import ScheduleTemplate
from xtune.schedule.space import Config
from xtune.target import get_target
from xtune.transfer.modelfile import PretrainedModel, read_model
from xtune.transfer.options import Objective, TrainOptions
from xtune.transfer.pretrained import (
    TransferWarning,
    builtin_model_path,
    collect,
    load_source,
    train,
    train_from_logs,
)
from xtune.tuning.costmodel import XGBoostCostModel, grouped_throughput_target
from xtune.tuning.database import LogWarning, Record, make_record, read_logs, record_from_json, record_to_json
from xtune.tuning.features import FEATURES_VERSION, feature_names, features_op, featurize
from xtune.tuning.loop import TuneProgress, tune
from xtune.tuning.measure import MeasureResult, MeasureStatus
from xtune.tuning.search import SpaceArrays, knob_featurizer
from xtune.tuning.tuner import ModelTuner, make_tuner

TUNED = "matmul:m=64,n=48,k=40"  # the workload tuned with transfer; the logs hold its neighbours
NEIGHBOURS = ("matmul:m=64,n=64,k=48", "matmul:m=48,n=48,k=32")
TARGETS = ("x86-avx2", "x86-sse42")
ModelFile = tuple[Path, dict[str, object]]  # a model written by `xtune model train`, and its --json report


def spearman(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.corrcoef(np.argsort(np.argsort(a)), np.argsort(np.argsort(b)))[0, 1])


def assert_one_line_error(out: subprocess.CompletedProcess[str], *words: str) -> None:
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert out.stdout == ""
    assert len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert "Traceback" not in out.stderr and out.stderr.startswith("xtune: error: ")
    for word in words:
        assert word in out.stderr, out.stderr


# ---- synthetic logs: real spaces and features, costs from the analytic estimate (nothing is measured) ------


def template(workload: str, target: str) -> ScheduleTemplate:
    return template_for(parse_workload(workload), get_target(target))


def estimated_seconds(t: ScheduleTemplate, indices: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """Seconds per call if each config ran at its estimated efficiency (est_eff) of the target's peak, with
    5% noise: a plausible machine, so that what the model learns can be checked."""
    eff = featurize(t, indices)[:, feature_names("matmul").index("est_eff")]
    peak = t.target.peak_gflops * 1e9
    return t.workload.flops() / (eff * peak) * np.exp(rng.normal(0.0, 0.05, len(eff)))


def ok(seconds: float) -> MeasureResult:
    return MeasureResult(MeasureStatus.OK, (seconds, seconds * 1.01, seconds * 0.99))


class Corpus:
    """Two logs (one per target) of both neighbours, with what a correct training must make of them."""

    def __init__(self, where: Path, per_group: int = 120) -> None:
        rng = np.random.default_rng(7)
        self.logs: list[Path] = []
        self.records: list[Record] = []
        self.expected: dict[tuple[str, str], tuple[int, int]] = {}  # (workload, target) -> (records, configs)
        self.failed: dict[tuple[str, str], set[int]] = {}  # configs that only ever failed
        self.repeated: list[Record] = []  # a config measured OK, then failed in a later run
        for target in TARGETS:
            records: list[Record] = []
            for workload in NEIGHBOURS:
                t = template(workload, target)
                key = (t.workload.key, target)
                indices = rng.choice(t.space.size, per_group, replace=False).tolist()
                seconds = estimated_seconds(t, indices, rng)
                bad = set(indices[: per_group // 10])  # 10% failed: half wrong answers, half compile errors
                for n, (i, s) in enumerate(zip(indices, seconds.tolist(), strict=True)):
                    status = (
                        (MeasureStatus.WRONG_ANSWER if n % 2 else MeasureStatus.COMPILE_ERROR)
                        if i in bad
                        else MeasureStatus.OK
                    )
                    result = ok(s) if status is MeasureStatus.OK else MeasureResult(status, error="synthetic")
                    records.append(make_record(t.workload.key, target, "local", t.space.config(i), result))
                records.append(
                    make_record(
                        t.workload.key,
                        target,
                        "local",
                        t.space.config(indices[-1]),
                        MeasureResult(MeasureStatus.RUNTIME_ERROR, error="SIGSEGV"),
                    )
                )
                self.repeated += [records[-2], records[-1]]
                self.failed[key] = bad
                self.expected[key] = (per_group + 1, per_group)
                # Neither of these may reach the model: a board error says nothing about the config, and a
                # stale record's index now means other knobs than the ones it measured.
                records.append(
                    make_record(
                        t.workload.key,
                        target,
                        "local",
                        t.space.config(indices[1]),
                        MeasureResult(MeasureStatus.BOARD_ERROR, error="agent died"),
                    )
                )
                stale = Config(indices[2], t.space.config((indices[2] + 1) % t.space.size).values)
                records.append(make_record(t.workload.key, target, "local", stale, ok(1e-5)))
            path = where / f"{target}.jsonl"
            path.write_text("".join(record_to_json(r) + "\n" for r in records))
            self.logs.append(path)
            self.records.extend(records)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Corpus:
    return Corpus(tmp_path_factory.mktemp("corpus"))


@pytest.fixture(scope="module")
def model_file(corpus: Corpus, xtune_cli: CliRunner) -> ModelFile:
    """A model written by `xtune model train`, and the command's --json report."""
    path = corpus.logs[0].parent / "model.json"
    out = xtune_cli("model", "train", *map(str, corpus.logs), "-o", str(path), "--json")
    assert out.returncode == 0, out.stderr
    # The stale records are warned about by the log reader: one "xtune: warning:" line per log, naming it.
    stale = [line for line in out.stderr.splitlines() if "no longer match" in line]
    assert len(stale) == len(corpus.logs) and all(line.startswith("xtune: warning: ") for line in stale)
    assert all(any(str(log) in line for line in stale) for log in corpus.logs)
    return path, json.loads(out.stdout)


@pytest.fixture(scope="module")
def old_model(model_file: ModelFile) -> Path:
    """The trained model, but claiming features of another version than this xtune computes."""
    data = json.loads(model_file[0].read_text())
    data["manifest"]["features_version"] = FEATURES_VERSION - 1
    path = model_file[0].with_name("old.json")
    path.write_text(json.dumps(data))
    return path


# ---- training and the model file -----------------------------------------------------------------------


def test_model_train_writes_the_manifest_a_user_checks(corpus: Corpus, model_file: ModelFile) -> None:
    path, report = model_file
    data = json.loads(path.read_text())
    assert list(data) == ["manifest", "boosters"] and list(data["boosters"]) == ["matmul"]
    assert base64.b64decode(data["boosters"]["matmul"], validate=True)  # the booster, base64
    m = read_model(path).manifest
    assert report["manifest"] == m.as_dict() and report["model"] == str(path)
    assert m.features_version == FEATURES_VERSION and m.ops == ("matmul",)
    assert dict(m.feature_names)["matmul"] == feature_names("matmul")
    assert m.targets == TARGETS and m.xtune_version == xtune.__version__
    assert m.sources == tuple(p.name for p in corpus.logs)  # base names: paths are private to a machine
    assert {(g.workload, g.target): (g.records, g.configs) for g in m.groups} == corpus.expected
    assert {g.cost_unit for g in m.groups} == {CostUnit.SECONDS}
    assert m.records_used == sum(r for r, _ in corpus.expected.values())
    assert dict(m.skipped) == {"board_error": 4, "stale_config": 4}  # one of each per (workload, target)
    assert m.records_used + m.records_skipped == len(corpus.records)


@pytest.mark.parametrize("objective", ["reg", "rank"])
def test_a_saved_model_predicts_what_the_trained_one_did(
    corpus: Corpus, tmp_path: Path, objective: Objective
) -> None:
    with pytest.warns(TransferWarning, match="no longer matches"):
        trained = train(corpus.records, TrainOptions(objective=objective), [str(p) for p in corpus.logs])
    trained.save(tmp_path / "m.json")
    loaded = read_model(tmp_path / "m.json")
    assert loaded.manifest == trained.manifest and loaded.manifest.objective == objective
    t = template(TUNED, "x86-avx2")  # a workload the model never saw
    rows = featurize(t, np.random.default_rng(0).integers(t.space.size, size=300))
    before, after = trained.cost_model("matmul").predict(rows), loaded.cost_model("matmul").predict(rows)
    np.testing.assert_allclose(after, before, rtol=1e-6)
    # And it transfers: on the unseen workload it ranks configs like the estimate the logs were made from.
    assert spearman(after, rows[:, feature_names("matmul").index("est_eff")]) > 0.7


def test_failures_are_kept_as_the_worst_and_the_model_learns_the_order(
    corpus: Corpus, model_file: ModelFile
) -> None:
    data, skipped = collect(corpus.records)
    assert skipped == {"board_error": 4, "stale_config": 4}
    d = data["matmul"]
    labels = grouped_throughput_target(d.costs, d.groups)
    assert len(np.unique(d.groups)) == len(corpus.expected) == len(d.counts)
    model = read_model(model_file[0]).cost_model("matmul")
    for g, count in zip(np.unique(d.groups), d.counts, strict=True):
        key = (count.workload, count.target)
        rows = d.groups == g
        scores = model.predict(d.features[rows])
        # Each group's configs, failures included, are training rows; failed ones have label 0.
        assert rows.sum() == count.configs == corpus.expected[key][1]
        assert labels[rows].max() == pytest.approx(1.0) and labels[rows].min() == 0.0
        failed_rows = np.isinf(d.costs[rows])
        assert failed_rows.sum() == len(corpus.failed[key])
        assert (labels[rows][failed_rows] == 0).all() and (labels[rows][~failed_rows] > 0).all()
        # What the model learned: failures score below the fast configs, and speed ranks like the labels.
        fast = labels[rows] >= np.quantile(labels[rows][~failed_rows], 0.75)
        assert scores[failed_rows].mean() < scores[fast].mean()
        assert spearman(scores[~failed_rows], labels[rows][~failed_rows]) > 0.7


def test_a_config_that_failed_in_one_run_and_not_another_counts_as_measured(corpus: Corpus) -> None:
    ok_then_failed = corpus.repeated[:2]
    assert ok_then_failed[0].result.ok and not ok_then_failed[1].result.ok
    assert ok_then_failed[0].index == ok_then_failed[1].index
    for records in (ok_then_failed, ok_then_failed[::-1]):
        (d,) = collect(records)[0].values()
        assert d.costs.tolist() == [ok_then_failed[0].cost]  # one row, the OK cost
        assert d.counts[0].records == 2 and d.counts[0].configs == 1


def test_unknown_targets_and_an_empty_log_are_not_trained_on(corpus: Corpus, tmp_path: Path) -> None:
    unknown = [replace(r, target="x86-avx9") for r in corpus.records[:5]]
    _, skipped = collect(unknown + corpus.records)
    assert skipped["unknown_workload_or_target"] == 5
    with pytest.warns(TransferWarning), pytest.raises(InputError, match="no usable records"):
        train(unknown)
    (tmp_path / "empty.jsonl").write_text("")
    with pytest.raises(InputError, match="no log records"):
        train_from_logs([tmp_path / "empty.jsonl"])


def test_each_machine_is_a_group_normalized_by_its_own_best() -> None:
    """A shared corpus holds several machines' logs of one workload and target; a slow machine's best is
    its 1.0, and its costs never mix with a fast one's."""
    t = template(NEIGHBOURS[0], "x86-avx2")

    def on(cpu: str, index: int, seconds: float) -> Record:
        return make_record(
            t.workload.key,
            "x86-avx2",
            "local",
            t.space.config(index),
            ok(seconds),
            fingerprint=(("cpu", cpu),),
        )

    records = [on("fast", 1, 1.0), on("fast", 2, 2.0), on("slow", 1, 4.0), on("slow", 3, 2.0)]
    d = collect(records)[0]["matmul"]
    assert sorted((c.cpu, c.configs) for c in d.counts) == [("fast", 2), ("slow", 2)]
    labels = grouped_throughput_target(d.costs, d.groups)
    assert sorted(labels.tolist()) == [0.5, 0.5, 1.0, 1.0]  # merged, config 3 would be 0.5 and 1's 4.0 lost


def pack_b_penalty(t: ScheduleTemplate, indices: Sequence[int]) -> np.ndarray:
    """A machine on which configs that leave B unpacked run 3x slower than the estimate says."""
    return np.array([3.0 if dict(t.space.config(i).values)["pack_b"] == 0 else 1.0 for i in indices])


def test_a_model_boosted_from_the_estimate_learns_where_the_estimate_is_wrong() -> None:
    rng = np.random.default_rng(3)
    records: list[Record] = []
    for workload in NEIGHBOURS:
        t = template(workload, "x86-avx2")
        indices = rng.choice(t.space.size, 300, replace=False).tolist()
        seconds = estimated_seconds(t, indices, rng) * pack_b_penalty(t, indices)
        records += [
            make_record(t.workload.key, "x86-avx2", "local", t.space.config(i), ok(s))
            for i, s in zip(indices, seconds.tolist(), strict=True)
        ]
    trained = train(records)
    assert trained.manifest.base_columns == (("matmul", "est_eff"),)
    t = template(TUNED, "x86-avx2")  # unseen
    indices = rng.choice(t.space.size, 400, replace=False).tolist()
    rows = featurize(t, indices)
    estimate = rows[:, feature_names("matmul").index("est_eff")]
    truth = estimate / pack_b_penalty(t, indices)
    model = trained.cost_model("matmul")
    # The model is the estimate plus the booster's correction ...
    booster_alone = XGBoostCostModel.from_bytes(dict(trained.boosters)["matmul"])
    np.testing.assert_allclose(model.predict(rows) - booster_alone.predict(rows), estimate, atol=1e-5)
    # ... and the correction is what the logs taught: the machine's order, not the estimate's.
    assert spearman(model.predict(rows), truth) > spearman(estimate, truth) + 0.1


# ---- refusals: one line, exit 2 --------------------------------------------------------------------------


def test_a_model_of_another_features_version_is_refused(old_model: Path, tmp_path: Path) -> None:
    with pytest.raises(InputError, match=f"features version {FEATURES_VERSION - 1}.*retrain"):
        read_model(old_model)
    assert read_model(old_model, check_features=False).manifest.features_version == FEATURES_VERSION - 1
    data = json.loads(old_model.read_text())
    data["manifest"]["format"] = 2
    del data["manifest"]["targets"]  # a future format need not parse as this one
    (tmp_path / "future.json").write_text(json.dumps(data))
    with pytest.raises(InputError, match="model format 2"):
        read_model(tmp_path / "future.json")


def test_model_info_shows_an_old_model_and_says_to_retrain(old_model: Path, xtune_cli: CliRunner) -> None:
    out = xtune_cli("model", "info", str(old_model))
    assert out.returncode == 0, out.stderr
    assert "retrain" in out.stdout and NEIGHBOURS[0] in out.stdout and "x86-sse42" in out.stdout
    info = json.loads(xtune_cli("model", "info", str(old_model), "--json").stdout)
    assert info["usable"] is False and "retrain" in info["reason"]
    assert info["manifest"]["features_version"] == FEATURES_VERSION - 1


def test_model_info_of_a_good_model_says_usable(model_file: ModelFile, xtune_cli: CliRunner) -> None:
    info = json.loads(xtune_cli("model", "info", str(model_file[0]), "--json").stdout)
    assert info["usable"] is True and info["reason"] is None
    assert info["manifest"]["targets"] == list(TARGETS)


@pytest.mark.host_runs("x86-avx2")  # the local board refuses a target it cannot run first
@pytest.mark.parametrize("case", ["old", "garbage", "missing", "model_and_log", "damaged", "other_op"])
def test_tune_refuses_a_bad_transfer_source_in_one_line(
    case: str, old_model: Path, corpus: Corpus, tmp_path: Path, xtune_cli: CliRunner
) -> None:
    bad = tmp_path / "bad.json"
    if case == "garbage":
        bad.write_bytes(bytes(np.random.default_rng(0).integers(0, 256, 300, dtype=np.uint8)))
    elif case == "damaged":  # a model's head, a truncated body
        bad.write_text(old_model.read_text()[:200])
    elif case == "other_op":
        bad = tmp_path / "conv.json"
        data = json.loads(old_model.read_text())
        data["manifest"]["features_version"] = FEATURES_VERSION
        data["boosters"] = {"conv2d": data["boosters"]["matmul"]}
        data["manifest"]["feature_names"] = {"conv2d": list(feature_names("conv2d"))}
        bad.write_text(json.dumps(data))
    sources = {
        "old": [old_model],
        "garbage": [bad],
        "missing": [tmp_path / "nothere.json"],
        "model_and_log": [old_model, corpus.logs[0]],
        "damaged": [bad],
        "other_op": [bad],
    }[case]
    words = {
        "old": ("features version", "retrain"),
        "garbage": ("bad.json", "tuning log"),
        "missing": ("nothere.json",),
        "model_and_log": ("not both",),
        "damaged": ("damaged",),
        "other_op": ("no booster for operator 'matmul'",),
    }[case]
    log = tmp_path / "log.jsonl"
    out = xtune_cli(
        "tune",
        "--workload",
        TUNED,
        "--target",
        "x86-avx2",
        "--trials",
        "4",
        "--log",
        str(log),
        "--transfer-from",
        *map(str, sources),
    )
    assert_one_line_error(out, *words)
    assert not log.exists()  # refused before anything was measured


def test_a_log_is_not_a_model_nor_a_model_a_log(
    corpus: Corpus, model_file: ModelFile, tmp_path: Path, xtune_cli: CliRunner
) -> None:
    assert_one_line_error(xtune_cli("model", "info", str(corpus.logs[0])), "not an xtune model file")
    assert_one_line_error(xtune_cli("model", "info", str(tmp_path / "nothere.json")), "no model file")
    with pytest.raises(InputError, match="is a model file, not a tuning log"):
        train_from_logs([model_file[0]])


@pytest.mark.host_runs("x86-avx2")
def test_transfer_needs_the_xgb_tuner(model_file: ModelFile, tmp_path: Path, xtune_cli: CliRunner) -> None:
    out = xtune_cli(
        "tune",
        "--workload",
        TUNED,
        "--target",
        "x86-avx2",
        "--trials",
        "4",
        "--tuner",
        "ga",
        "--log",
        str(tmp_path / "log.jsonl"),
        "--transfer-from",
        str(model_file[0]),
    )
    assert_one_line_error(out, "xgb")


# ---- sources: logs, model files, the built-in models -------------------------------------------------------


def test_logs_as_a_transfer_source_are_trained_on_the_fly(corpus: Corpus) -> None:
    with pytest.warns(LogWarning, match="no longer match"):  # the stale records
        source = load_source(map(str, corpus.logs), get_target("x86-avx2"), "matmul")
    assert source.kind == "logs" and source.paths == tuple(map(str, corpus.logs))
    assert source.as_dict()["manifest"]["records"] == sum(r for r, _ in corpus.expected.values())
    with pytest.raises(InputError, match="builtin takes no other"):
        load_source(["builtin", str(corpus.logs[0])], get_target("x86-avx2"), "matmul")


def test_a_model_of_other_hardware_is_used_with_a_warning(corpus: Corpus) -> None:
    sse42_log = str(corpus.logs[TARGETS.index("x86-sse42")])
    with (
        pytest.warns(TransferWarning, match="saw no x86-avx2 logs \\(only x86-sse42\\)"),
        pytest.warns(LogWarning, match="no longer match"),
    ):  # the corpus's stale records, left out by the log reader
        source = load_source([sse42_log], get_target("x86-avx2"), "matmul")
    assert source.model.manifest.targets == ("x86-sse42",)


def test_builtin_picks_the_target_then_its_architecture(model_file: ModelFile, tmp_path: Path) -> None:
    model = read_model(model_file[0])

    def ship(name: str, targets: tuple[str, ...], version: int = FEATURES_VERSION) -> Path:
        m = replace(model.manifest, targets=targets, features_version=version)
        PretrainedModel(m, model.boosters).save(tmp_path / name)
        return tmp_path / name

    with pytest.raises(InputError, match="no built-in matmul model"):
        builtin_model_path(get_target("x86-avx2"), "matmul", directory=tmp_path)  # nothing shipped
    sse = ship("a-sse.json", ("x86-sse42",))
    ship("b-old.json", ("x86-avx2",), version=FEATURES_VERSION - 1)
    (tmp_path / "c-junk.json").write_text("not a model")  # ignored, not an error
    # Only a model of the same architecture: it is the one (its features are relative to the target).
    assert builtin_model_path(get_target("x86-avx512"), "matmul", directory=tmp_path) == sse
    # A model of this xtune's features version ranks above one listing the target that would be refused.
    assert builtin_model_path(get_target("x86-avx2"), "matmul", directory=tmp_path) == sse
    avx2 = ship("d-avx2.json", ("x86-avx2", "arm-a72-neon"))
    assert builtin_model_path(get_target("x86-avx2"), "matmul", directory=tmp_path) == avx2
    assert builtin_model_path(get_target("x86-sse42"), "matmul", directory=tmp_path) == sse
    assert builtin_model_path(get_target("arm-a53-neon"), "matmul", directory=tmp_path) == avx2
    # Among models for the target, the one trained on this board's cpu (its manifest's groups say which).
    epyc = replace(
        model.manifest,
        targets=("x86-avx2",),
        groups=tuple(replace(g, cpu="AMD EPYC") for g in model.manifest.groups),
    )
    epyc_path = tmp_path / "e-epyc.json"
    PretrainedModel(epyc, model.boosters).save(epyc_path)
    on_epyc = builtin_model_path(get_target("x86-avx2"), "matmul", tmp_path, cpu="AMD EPYC")
    assert on_epyc == tmp_path / "e-epyc.json"
    assert builtin_model_path(get_target("x86-avx2"), "matmul", tmp_path, cpu="Intel Xeon") == avx2
    # Another generation of the same name (older logs name the cpu alone) ranks above an unrelated cpu.
    zen5 = "AMD EPYC (family 26, model 2)"
    assert builtin_model_path(get_target("x86-avx2"), "matmul", tmp_path, cpu=zen5) == epyc_path
    with pytest.raises(InputError, match="riscv64-gc"):
        builtin_model_path(get_target("riscv64-gc"), "matmul", directory=tmp_path)
    with pytest.raises(InputError, match="no built-in conv2d model"):
        builtin_model_path(get_target("x86-avx2"), "conv2d", directory=tmp_path)


# ---- what a pretrained model buys: fewer trials (synthetic space, fake measurer) ---------------------------


class TrueThroughput:
    """A pretrained model that is exactly right: the synthetic space's throughput relative to its optimum
    (0 where a config fails), read back from the knob features."""

    def __init__(self) -> None:
        self.arrays = SpaceArrays(SPACE)
        # knob_featurizer's columns: an int option's value, else the option's number (both ascending)
        self.tables = [
            np.array([o if isinstance(o, int) else d for d, o in enumerate(k.options)], float)
            for k in SPACE.knobs
        ]
        good = COSTS > 0
        self.throughput = np.where(good, OPTIMUM / np.where(good, COSTS, 1.0), 0.0)

    def fit(self, features: np.ndarray, costs: np.ndarray) -> None:
        """Pretrained: nothing to learn."""

    def predict(self, features: np.ndarray) -> np.ndarray:
        f = np.asarray(features)
        digits = np.stack([np.searchsorted(t, f[:, j]) for j, t in enumerate(self.tables)], axis=1)
        return self.throughput[self.arrays.indices(digits)]


def trials_to_reach(
    goal: float, seed: int, pretrained: XGBoostCostModel | TrueThroughput | None, cap: int = 640
) -> int:
    """Trials of an xgb tuner until a config of cost <= `goal` was measured (`cap` if never)."""
    tuner = make_tuner("xgb", SPACE, seed, knob_featurizer(SPACE), pretrained=pretrained)
    assert isinstance(tuner, ModelTuner) and tuner.pretrained is pretrained
    tuner.n_chains, tuner.n_steps = 128, 40  # cheaper annealing, as in test_tuner

    def stop(progress: TuneProgress) -> None:
        if progress.best_cost <= goal:
            raise KeyboardInterrupt  # the loop's own way of stopping early

    summary = tune(tuner, fake_measurer(COSTS), cap, 32, callbacks=[stop])
    return next((t for t, c in enumerate(summary.curve, 1) if c <= goal), cap)


def test_a_right_pretrained_model_finds_the_optimum_in_its_first_batch() -> None:
    oracle = TrueThroughput()
    rows = knob_featurizer(SPACE)(range(0, SPACE.size, 7))
    assert np.array_equal(oracle.predict(rows), oracle.throughput[::7])  # it is the truth
    goal = OPTIMUM * 1.01
    cold = [trials_to_reach(goal, seed, None) for seed in range(3)]
    warm = [trials_to_reach(goal, seed, oracle) for seed in range(3)]
    assert statistics.median(warm) <= 32, warm  # the first batch is ranked by the pretrained model
    assert statistics.median(warm) < statistics.median(cold), (warm, cold)


def test_a_model_trained_on_another_board_saves_trials() -> None:
    """Pretrained on 1,500 random configs measured on a similar board (each config 10% off, at random), as
    `xtune model train` fits (same options, regression on throughput relative to the best)."""
    rng = np.random.default_rng(0)
    other_board = np.where(COSTS > 0, COSTS, np.inf) * np.exp(rng.normal(0.0, 0.1, SPACE.size))
    seen = rng.choice(SPACE.size, 1500, replace=False)
    o = TrainOptions()
    pretrained = XGBoostCostModel(
        seed=o.seed,
        objective=o.objective,
        n_trees=o.n_trees,
        max_depth=o.max_depth,
        learning_rate=o.learning_rate,
        max_rows=len(seen),
    )
    pretrained.fit(knob_featurizer(SPACE)(seen.tolist()), other_board[seen], groups=np.zeros(len(seen)))
    goal = OPTIMUM * 1.05  # within 5% of the optimum (172 of 53,760 configs)
    cold = [trials_to_reach(goal, seed, None) for seed in range(3)]
    warm = [trials_to_reach(goal, seed, pretrained) for seed in range(3)]
    assert statistics.median(warm) < statistics.median(cold), (warm, cold)


class Inverted(TrueThroughput):
    """A pretrained model that is exactly wrong: it ranks the slowest configs first."""

    def predict(self, features: np.ndarray) -> np.ndarray:
        return -super().predict(features)


def test_a_hedged_first_batch_alternates_the_hedge_and_the_model_the_hedge_first() -> None:
    """A model of other hardware shares the first batch with the estimate (here: the truth), which leads,
    so that the model's being wrong costs every other trial, never the first, nor the whole batch."""
    oracle = TrueThroughput()
    scores: dict[str, np.ndarray] = {}
    for name, hedge in (("alone", None), ("hedged", oracle)):
        tuner = make_tuner("xgb", SPACE, 0, knob_featurizer(SPACE), pretrained=Inverted(), hedge=hedge)
        assert isinstance(tuner, ModelTuner)
        tuner.n_chains, tuner.n_steps, tuner.epsilon = 128, 40, 0.0
        batch = tuner.next_batch(32)
        scores[name] = oracle.throughput[batch]  # 1.0 = the optimum
    assert scores["alone"].max() < 0.5  # the wrong model alone picks slow configs only
    hedged = scores["hedged"]
    assert hedged[0] >= 0.95 and hedged[0::2].min() > hedged[1::2].max()  # the hedge's picks lead each pair


@pytest.mark.parametrize("with_hedge", [False, True])
def test_the_first_batch_holds_the_seed_and_the_estimates_pick_whatever_the_prior(with_hedge: bool) -> None:
    """A model that ranks the best configs last still leaves the seed config (the template's default) and the
    estimate's top pick in the first batch, once; the model's own picks fill the rest."""
    oracle, default = TrueThroughput(), 12345
    hedge = TrueThroughput() if with_hedge else None
    tuner = make_tuner(
        "xgb",
        SPACE,
        0,
        knob_featurizer(SPACE),
        pretrained=Inverted(),
        hedge=hedge,
        seeds=[default],
        estimate=oracle,
    )
    assert isinstance(tuner, ModelTuner)
    tuner.n_chains, tuner.n_steps, tuner.epsilon = 128, 40, 0.0
    first = tuner.next_batch(8)
    assert first[0] == default and len(set(first)) == 8
    assert oracle.throughput[first[1]] >= 0.95  # the estimate's pick, ahead of the inverted model's
    tuner.update(first, fake_measurer(COSTS)(first))
    assert default not in tuner.next_batch(8)


@pytest.mark.parametrize("wrong", ["pretrained", "hedge"])
def test_after_the_first_batch_the_prior_whose_picks_measured_faster_is_the_base(wrong: str) -> None:
    """Of the foreign model and the estimate, the one whose picks in the hedged first batch measured slower
    stops being the local model's base; the one that picked fast configs stays."""
    right, inverted = TrueThroughput(), Inverted()
    pretrained, hedge = (inverted, right) if wrong == "pretrained" else (right, inverted)
    tuner = make_tuner("xgb", SPACE, 0, knob_featurizer(SPACE), pretrained=pretrained, hedge=hedge)
    assert isinstance(tuner, ModelTuner) and isinstance(tuner.model, XGBoostCostModel)
    tuner.n_chains, tuner.n_steps = 128, 40
    measure = fake_measurer(COSTS)
    batch = tuner.next_batch(32)
    tuner.update(batch, measure(batch))
    tuner.next_batch(8)  # refits the local model on the first batch
    assert tuner.model.base is right


# ---- end to end on the local board ------------------------------------------------------------------------


@pytest.mark.host_runs("x86-avx2")
def test_tune_with_a_trained_model_on_the_local_board(
    model_file: ModelFile, tmp_path: Path, xtune_cli: CliRunner
) -> None:
    log = tmp_path / "log.jsonl"
    out = xtune_cli(
        "tune",
        "--workload",
        TUNED,
        "--target",
        "x86-avx2",
        "--trials",
        "8",
        "--batch-size",
        "4",
        "--repeat",
        "2",
        "--min-repeat-ms",
        "2",
        "--transfer-from",
        str(model_file[0]),
        "--json",
        "--log",
        str(log),
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    transfer = report["transfer"]
    assert transfer["kind"] == "model" and transfer["paths"] == [str(model_file[0])]
    assert transfer["manifest"]["features_version"] == FEATURES_VERSION
    assert "x86-avx2" in transfer["manifest"]["targets"]
    assert f"transfer from model {model_file[0]}" in out.stderr
    assert report["trials"] == 8 and report["target"] == "x86-avx2"
    records = read_logs([log])
    assert len(records) == 8 + report["confirm_timings"] and len({r.index for r in records}) == 8
    assert {r.workload for r in records} == {parse_workload(TUNED).key}


@pytest.mark.parametrize("workload", [TUNED, "conv2d:n=1,c=8,h=10,w=10,k=16,r=3,s=3,stride=1,pad=1"])
def test_the_shipped_model_is_usable_and_found_for_every_x86_target(workload: str) -> None:
    """`--transfer-from builtin` on any x86 target: the model in xtune/data/models matches these features
    (a 3x3 stride-1 conv2d's, direct and Winograd in one space, through its direct part's booster)."""
    family = parse_workload(workload).op
    for name in ("x86-avx2", "x86-sse42", "x86-avx512"):
        tuned = template(workload, name)
        op = features_op(tuned)
        path = builtin_model_path(get_target(name), op)
        model = read_model(path)  # refuses a model of another features version
        assert {"x86-avx2", "x86-sse42"} <= set(model.manifest.targets) and family in model.manifest.ops
        assert sum(g.records for g in model.manifest.groups if g.workload.startswith(f"{family}:")) > 1000
        x = featurize(tuned, np.r_[0:32, tuned.space.size - 32 : tuned.space.size])
        assert np.isfinite(model.cost_model(op).predict(x)).all()


@pytest.mark.host_runs("x86-sse42")
def test_tune_with_the_builtin_model(tmp_path: Path, xtune_cli: CliRunner) -> None:
    out = xtune_cli(
        "tune",
        "--workload",
        TUNED,
        "--target",
        "x86-sse42",
        "--trials",
        "4",
        "--batch-size",
        "4",
        "--repeat",
        "2",
        "--min-repeat-ms",
        "2",
        "--transfer-from",
        "builtin",
        "--json",
        "--log",
        str(tmp_path / "log.jsonl"),
    )
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["transfer"]["kind"] == "builtin" and report["trials"] == 4


def test_training_groups_failures_by_their_boards_unit_and_skips_correctness_only_boards() -> None:
    qemu = [
        old_line(1, "compile_error", [], "s", QEMU_FP),
        old_line(2, "ok", [5000.0], "insn", QEMU_FP),
        old_line(3, "ok", [4000.0], "insn", QEMU_FP),
    ]
    wrapper = [old_line(5, "ok", [2.7e-5], "s", WRAPPER_FP), old_line(6, "ok", [9e-4], "s", WRAPPER_FP)]
    data, skipped = collect([record_from_json(line) for line in qemu + wrapper])
    (count,) = data["matmul"].counts
    assert (count.cost_unit, count.configs, count.records) == (CostUnit.INSTRUCTIONS, 3, 3)
    assert skipped["correctness_only"] == 2  # emulated wall time is nothing to learn from
