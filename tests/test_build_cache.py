"""The one cache of compiled C helpers (agents, the QEMU insn-count plugin): keyed by source and command,
written atomically, reused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from xtune.boards import agent_build, board
from xtune.boards.agent_build import (
    CFLAGS,
    agent_source,
    build_agent,
    build_key,
    cache_root,
    compile_cached,
    compiler_command,
)
from xtune.errors import BoardError
from xtune.target import host_cpu

HELLO = b'#include <stdio.h>\nint main(void) { puts("hello"); return 0; }\n'
CC = shutil.which("gcc") or shutil.which("cc")
needs_cc = pytest.mark.skipif(CC is None, reason="needs a host C compiler")


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))


def _build(source: bytes = HELLO, flags: tuple[str, ...] = ("-O2",)) -> Path:
    assert CC is not None
    return compile_cached(source, [CC, *flags], name="hello", output="hello", what="the test helper")


@needs_cc
def test_a_helper_is_built_once_per_source_and_command(monkeypatch: pytest.MonkeyPatch) -> None:
    assert CC is not None
    path = _build()
    assert path == cache_root() / "agents" / f"hello-{build_key(HELLO, [CC, '-O2'])}" / "hello"
    assert subprocess.run([str(path)], capture_output=True, check=True).stdout == b"hello\n"
    assert os.listdir(path.parent) == ["hello"]  # nothing half-written left beside it

    def no_compiler(*args: object, **kwargs: object) -> None:
        raise AssertionError("rebuilt a cached helper")

    monkeypatch.setattr(agent_build.subprocess, "run", no_compiler)
    assert _build() == path  # reused
    with pytest.raises(AssertionError):  # another source, or other flags: another build
        _build(HELLO.replace(b"hello", b"hi"))
    with pytest.raises(AssertionError):
        _build(flags=("-O0",))


def test_the_compiler_never_writes_the_cached_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The compiler writes a private file in the same directory, renamed over the cached path when done;
    a failed build leaves nothing (a fake compiler checks what it is asked to write, then fails or not)."""
    fake = tmp_path / "fakecc.py"
    fake.write_text(
        textwrap.dedent("""
        import os, sys
        out = sys.argv[sys.argv.index("-o") + 1]
        final = os.environ["FINAL"]
        with open(out, "wb") as f:
            f.write(b"half")
            ok = out != final and os.path.dirname(out) == os.path.dirname(final) and not os.path.exists(final)
            f.write(b" and the rest" if ok else b" WRONG")
        sys.exit(int(sys.argv[1]))
    """)
    )
    for status in ("1", "0"):
        command = [sys.executable, str(fake), status]
        final = cache_root() / "agents" / f"fake-{build_key(HELLO, command)}" / "fake"
        monkeypatch.setenv("FINAL", str(final))
        if status == "1":
            with pytest.raises(BoardError, match="building the fake helper failed"):
                compile_cached(HELLO, command, name="fake", output="fake", what="the fake helper")
            assert os.listdir(final.parent) == []
        else:
            path = compile_cached(HELLO, command, name="fake", output="fake", what="the fake helper")
            assert path == final and path.read_bytes() == b"half and the rest"
            assert os.listdir(final.parent) == ["fake"] and os.access(path, os.X_OK)


@needs_cc
def test_concurrent_builders_all_get_the_whole_helper() -> None:
    paths: list[Path] = []
    threads = [threading.Thread(target=lambda: paths.append(_build())) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(paths)) == 1 and os.listdir(paths[0].parent) == ["hello"]
    assert subprocess.run([str(paths[0])], capture_output=True, check=True).stdout == b"hello\n"


def test_agents_and_the_insn_plugin_go_through_the_one_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    arch = host_cpu().arch
    agent = build_agent(arch)
    assert agent.parent.name == f"{arch}-{build_key(agent_source(), [*compiler_command(arch), *CFLAGS])}"
    if CC is not None:
        plugin = board.build_insn_plugin()
        source = (Path(agent_build.__file__).parent.parent / "agent_src" / "insncount.c").read_bytes()
        assert (
            plugin.parent
            == cache_root() / "agents" / f"insncount-{build_key(source, board.insn_plugin_command())}"
        )

    def elsewhere(*args: object, **kwargs: object) -> Path:
        raise RuntimeError("the one cache")

    monkeypatch.setattr(agent_build, "compile_cached", elsewhere)
    with pytest.raises(RuntimeError, match="the one cache"):
        build_agent(arch)
    with pytest.raises(RuntimeError, match="the one cache"):
        board.build_insn_plugin()
