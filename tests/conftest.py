"""Fixtures and markers several test files share: the command line as a user runs it, the compile pool,
the QEMU boards, and skipping tests whose kernels this host's CPU cannot execute."""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from xtune.boards.board import get_board
from xtune.target import get_target, host_cannot_run
from xtune.tuning.measure import CompilePool

CliRunner = Callable[..., subprocess.CompletedProcess[str]]

QEMU_BOARDS = ("qemu-aarch64", "qemu-riscv64", "qemu-riscv64-v")
CLI_TIMEOUT = 600.0  # a guard against a hung run, not a time limit: a loaded CI machine can be slow


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "host_runs(target): runs TARGET's code natively (e.g. x86-avx2, x86-avx512); skipped on a host whose "
        "CPU cannot execute it",
    )


def pytest_runtest_setup(item: pytest.Item) -> None:
    for mark in item.iter_markers("host_runs"):
        why = host_cannot_run(get_target(mark.args[0]))
        if why is not None:
            pytest.skip(why)


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    """`xtune ARGS...` in a fresh interpreter, as a user runs it: exit status, stdout and stderr as text."""
    return subprocess.run(
        [sys.executable, "-m", "xtune.cli", *args], capture_output=True, text=True, timeout=CLI_TIMEOUT
    )


@pytest.fixture(scope="session")
def xtune_cli() -> CliRunner:
    """Runs `xtune ARGS...` in a subprocess; see `run_cli`."""
    return run_cli


@pytest.fixture(scope="session")
def compile_pool() -> Iterator[CompilePool]:
    """One spawn pool for the session: starting one costs about half a second."""
    pool = CompilePool()
    yield pool
    pool.close()


@pytest.fixture(params=[pytest.param(name, id=name, marks=pytest.mark.board) for name in QEMU_BOARDS])
def qemu_board(request: pytest.FixtureRequest) -> str:
    """Each qemu-user board by name; skipped where its qemu binary is not installed."""
    name: str = request.param
    binary = get_board(name).target.qemu_binary
    if shutil.which(binary) is None:
        pytest.skip(f"needs {binary} (qemu-user)")
    return name
