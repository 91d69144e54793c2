"""Fixtures and markers several test files share: the command line as a user runs it, the compile pool,
the QEMU boards, and skipping tests whose kernels this host's CPU cannot execute."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from xtune.boards.board import get_board
from xtune.target import get_target, host_cannot_run
from xtune.tuning.measure import CompilePool

CliRunner = Callable[..., subprocess.CompletedProcess[str]]

QEMU_BOARDS = ("qemu-aarch64", "qemu-riscv64", "qemu-riscv64-v")
CLI_TIMEOUT = 600.0  # a guard against a hung run, not a time limit: a loaded CI machine can be slow
# Why a test of ONNX Runtime's aarch64 build skips (xtune/tuning/arm_peers.py, `peers_built`).
NO_ARM_PEERS = "no arm64 Python with the ARM peers: bash scripts/arm_peers.sh (scripts/setup.sh runs it)"


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


def interrupt_cli(*args: str, log: Path, after_records: int = 8) -> subprocess.CompletedProcess[str]:
    """Run `xtune ARGS` and press Ctrl-C (SIGINT) once `log` holds `after_records` lines (or after 120 s)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "xtune.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell without job control starts background jobs with SIGINT ignored (bash(1), "SIGNALS"), and
        # Python then never installs its Ctrl-C handler: give the tuner the disposition a terminal gives it.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not log.exists() or log.read_text().count("\n") < after_records):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


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
