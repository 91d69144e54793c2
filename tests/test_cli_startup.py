"""CLI start-up: `xtune --help`, `--version`, a usage mistake, `targets` and `tasks MODEL` in a fresh
interpreter load none of the heavy libraries (xgboost, scipy, paramiko) that only tuning, training and SSH
boards use; every subcommand's handler, named lazily in the parser, resolves to its function."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import onnx
import pytest

from tests.test_model_faults import conv_relu
from xtune.cli import build_parser
from xtune.cli.common import Command

HEAVY = ("xgboost", "scipy", "paramiko")


def _imported(args: list[str]) -> set[str]:
    """The top-level packages a fresh `python -m xtune.cli ARGS` imported, read from `-X importtime`'s
    report on stderr (one line per module imported: `import time: self | cumulative | name`)."""
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "xtune.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    names = {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and line.count("|") == 2
    }
    assert "xtune" in names, proc.stderr[-2000:]  # the report was read
    return names


@pytest.mark.parametrize(
    "args",
    [["--version"], ["--help"], ["tune", "--workload", "matmul:m=8,n=8,k=8", "--bogus"], ["targets"]],
    ids=["version", "help", "usage-mistake", "targets"],
)
def test_the_parser_loads_no_heavy_library(args: list[str]) -> None:
    assert not _imported(args) & set(HEAVY)


def test_tasks_of_a_model_load_no_heavy_library(tmp_path: Path) -> None:
    path = tmp_path / "m.onnx"
    onnx.save(conv_relu(), path)
    names = _imported(["tasks", str(path)])
    assert "onnx" in names  # the command did run
    assert not names & set(HEAVY)


def _leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], object]:
    """Every runnable subcommand (one without subcommands of its own) → its `handler` default."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        return {path: parser.get_default("handler")}
    return {k: v for name, p in subs[0].choices.items() for k, v in _leaves(p, (*path, name)).items()}


def test_every_subcommand_names_a_handler_that_resolves() -> None:
    leaves = _leaves(build_parser())
    assert ("tune",) in leaves and ("model", "train") in leaves
    for path, command in leaves.items():
        assert isinstance(command, Command), path
        handler = command.resolve()
        assert callable(handler) and handler.__name__ == command.function, path
