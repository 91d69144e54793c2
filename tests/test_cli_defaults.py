"""CLI defaults: a flag left out means the option dataclass's default, read from it, never restated; the
host's target where none is named; the version from its one home."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import xtune
from xtune.cli import build_parser, main
from xtune.target import host_target
from xtune.transfer.options import TrainOptions
from xtune.tuning.options import MeasureOptions, TuneOptions

TUNE = ["tune", "--workload", "matmul:m=8,n=8,k=8"]
TRAIN = ["model", "train", "log.jsonl", "-o", "model.json"]
# argparse dest -> (options dataclass, field)
TUNE_FLAGS = {
    **{
        name: (TuneOptions, name)
        for name in ("tuner", "trials", "batch_size", "early_stopping", "seed", "confirm")
    },
    **{name: (MeasureOptions, name) for name in ("repeat", "min_repeat_ms", "timeout_ms")},
}
TRAIN_FLAGS = {
    "objective": (TrainOptions, "objective"),
    "seed": (TrainOptions, "seed"),
    "threads": (TrainOptions, "nthread"),
}


def _default(options: type, name: str) -> object:
    return getattr(options(), name)


def test_flags_left_out_mean_the_library_defaults() -> None:
    tune = build_parser().parse_args(TUNE)
    for dest, (options, name) in TUNE_FLAGS.items():
        assert getattr(tune, dest) == _default(options, name), dest
    train = build_parser().parse_args(TRAIN)
    for dest, (options, name) in TRAIN_FLAGS.items():
        assert getattr(train, dest) == _default(options, name), dest


def test_a_changed_dataclass_default_is_the_cli_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    changed = {
        (TuneOptions, "trials"): 7,
        (TuneOptions, "confirm"): 9,
        (MeasureOptions, "repeat"): 5,
        (MeasureOptions, "min_repeat_ms"): 2.5,
        (TrainOptions, "nthread"): 3,
    }
    for (options, name), value in changed.items():
        field = {f.name: f for f in dataclasses.fields(options)}[name]
        monkeypatch.setattr(field, "default", value)
    tune = build_parser().parse_args(TUNE)
    assert (tune.trials, tune.confirm, tune.repeat, tune.min_repeat_ms) == (7, 9, 5, 2.5)
    assert build_parser().parse_args(TRAIN).threads == 3
    with pytest.raises(SystemExit):
        build_parser().parse_args(["tune", "--help"])
    assert "(default 9; 0 = off)" in " ".join(capsys.readouterr().out.split())


def test_version_prints_the_one_version(capsys: pytest.CaptureFixture[str]) -> None:
    from xtune.version import __version__

    with pytest.raises(SystemExit) as done:
        build_parser().parse_args(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out.strip() == f"xtune {__version__}"
    assert xtune.__version__ == __version__


def test_build_targets_the_host_when_no_target_is_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """As `tune` and `bench` run on the local board, whose target is the host's."""
    obj, hdr = tmp_path / "k.o", tmp_path / "k.h"
    assert (
        main(["build", "--workload", "matmul:m=8,n=8,k=8", "-o", str(obj), "--header", str(hdr), "--json"])
        == 0
    )
    assert json.loads(capsys.readouterr().out)["target"] == host_target().name
