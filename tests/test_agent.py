"""Agent tests: hand-written LLVM kernels in, agent behaviour on the local board and under qemu-user out."""

from __future__ import annotations

import io
import os
import re
import signal
import statistics
import threading
import time
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
import pytest
from elftools.elf.elffile import ELFFile
from elftools.elf.sections import SymbolTableSection

from xtune.boards.agent import (
    MAX_TIMEOUT_MS,
    PROTOCOL_VERSION,
    AgentSession,
    RunRequest,
    RunStatus,
    SubprocessTransport,
)
from xtune.boards.agent_build import agent_version, build_agent
from xtune.boards.board import EMULATED_DEADLINE_FACTOR, LocalBoard, QemuBoard, get_board
from xtune.errors import BoardError, InputError
from xtune.target import Target

# No constants, globals or calls: the object's .text has no relocations, so .text alone is the image.
KERNELS_IR = """
define void @add(ptr %a, ptr %b, ptr %c) nounwind {
entry:
  br label %loop
loop:
  %i = phi i64 [0, %entry], [%next, %loop]
  %pa = getelementptr float, ptr %a, i64 %i
  %pb = getelementptr float, ptr %b, i64 %i
  %pc = getelementptr float, ptr %c, i64 %i
  %x = load float, ptr %pa
  %y = load float, ptr %pb
  %s = fadd float %x, %y
  store float %s, ptr %pc
  %next = add i64 %i, 1
  %done = icmp eq i64 %next, 64
  br i1 %done, label %exit, label %loop
exit:
  ret void
}

define void @empty() nounwind {
  ret void
}

define void @count(ptr %a) nounwind {
  %v = load volatile i32, ptr %a
  %w = add i32 %v, 1
  store volatile i32 %w, ptr %a
  ret void
}

define void @null_store(ptr %a, ptr %b, ptr %c, ptr %d, ptr %e, ptr %f, ptr %g, ptr %h) nounwind {
  store volatile i32 42, ptr %h
  ret void
}

define void @spin() nounwind {
entry:
  br label %loop
loop:
  call void asm sideeffect "", ""()
  br label %loop
}

declare void @llvm.trap() nounwind

define void @trap() nounwind {
  call void @llvm.trap()
  unreachable
}
"""

# What `llvm.trap` raises: ud2 -> SIGILL, brk -> SIGTRAP, unimp -> SIGILL (docs/notes.md §5).
TRAP_SIGNAL = {"x86_64": signal.SIGILL, "aarch64": signal.SIGTRAP, "riscv64": signal.SIGILL}

BOARDS = [
    pytest.param("local", id="local"),
    pytest.param("qemu-aarch64", id="qemu-aarch64", marks=pytest.mark.board),
    pytest.param("qemu-riscv64", id="qemu-riscv64", marks=pytest.mark.board),
]


@cache
def kernel_image(target: Target) -> tuple[bytes, dict[str, int]]:
    """The .text bytes of KERNELS_IR compiled for `target`, and each function's offset in it."""
    llvm.initialize_all_targets()
    llvm.initialize_all_asmprinters()
    module = llvm.parse_assembly(KERNELS_IR)
    module.verify()
    module.triple = target.triple
    tm = llvm.Target.from_triple(target.triple).create_target_machine(
        target.cpu, target.features, opt=2, reloc="pic", codemodel="small", abiname=target.abi
    )
    elf = ELFFile(io.BytesIO(tm.emit_object(module)))
    assert not any(s.name.startswith(".rela.text") or s.name == ".rel.text" for s in elf.iter_sections())
    text_index = next(i for i, s in enumerate(elf.iter_sections()) if s.name == ".text")
    symtab = elf.get_section_by_name(".symtab")
    text = elf.get_section_by_name(".text")
    assert isinstance(symtab, SymbolTableSection) and text is not None
    offsets = {
        sym.name: sym["st_value"]
        for sym in symtab.iter_symbols()
        if sym["st_info"]["type"] == "STT_FUNC" and sym["st_shndx"] == text_index
    }
    return text.data(), offsets


@pytest.fixture(params=BOARDS)
def board(request: pytest.FixtureRequest) -> LocalBoard | QemuBoard:
    b = get_board(request.param)
    assert isinstance(b, LocalBoard | QemuBoard)
    return b


@pytest.fixture
def session(board: LocalBoard | QemuBoard) -> Iterator[tuple[AgentSession, dict[str, int]]]:
    image, offsets = kernel_image(board.target)
    with board.open() as s:
        base = s.load_image(image)
        assert base % 4096 == 0
        yield s, offsets


def _floats(values: np.ndarray) -> bytes:
    return values.astype("<f4").tobytes()


def test_hello_skips_banner_and_partial_line(board: LocalBoard | QemuBoard) -> None:
    script = 'echo "Welcome to the board"; echo; printf "motd without newline "; exec "$@"'
    transport = SubprocessTransport(["sh", "-c", script, "sh", *board.argv()])
    with AgentSession(transport, timeout=30.0) as s:
        assert s.hello.arch == board.target.arch
        assert s.hello.version == PROTOCOL_VERSION and s.hello.page_size >= 4096
        assert s.hello.exec_method == "mprotect"
        s.set_buffer(0, b"ok")
        assert s.read_buffer(0) == b"ok"
    assert transport.returncode == 0  # stdin EOF ends the agent cleanly


def test_memfd_fallback_runs_kernels(board: LocalBoard | QemuBoard) -> None:
    image, offsets = kernel_image(board.target)
    with AgentSession(SubprocessTransport([*board.argv(), "--exec=memfd"]), timeout=30.0) as s:
        assert s.hello.exec_method == "memfd"
        assert s.load_image(image) % 4096 == 0
        s.set_buffer(3, bytes(4))
        assert s.run(RunRequest(offsets["count"], (3,), number=2, repeat=2)).status is RunStatus.OK
        assert int.from_bytes(s.read_buffer(3), "little") == 4


def test_buffer_round_trip(session: tuple[AgentSession, dict[str, int]]) -> None:
    s, _ = session
    rng = np.random.default_rng(0)
    first, second = rng.bytes(100_000), rng.bytes(37)
    s.set_buffer(5, first)
    s.set_buffer(6, b"")
    assert s.read_buffer(5) == first
    assert s.read_buffer(6) == b""
    s.set_buffer(5, second)  # reallocated at another size
    assert s.read_buffer(5) == second


def test_add_kernel_output(session: tuple[AgentSession, dict[str, int]]) -> None:
    s, offsets = session
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal(64, dtype=np.float32), rng.standard_normal(64, dtype=np.float32)
    s.set_buffer(0, _floats(a))
    s.set_buffer(1, _floats(b))
    s.set_buffer(2, bytes(256))
    reply = s.run(RunRequest.check(offsets["add"], (0, 1, 2)))
    assert reply.status is RunStatus.OK and reply.seconds == () and reply.number == 0
    np.testing.assert_array_equal(np.frombuffer(s.read_buffer(2), "<f4"), a + b)


def test_number_times_repeat_calls(session: tuple[AgentSession, dict[str, int]]) -> None:
    s, offsets = session
    s.set_buffer(3, bytes(4))
    reply = s.run(RunRequest(offsets["count"], (3,), number=5, repeat=3, warmup=2))
    assert reply.status is RunStatus.OK and reply.number == 5 and len(reply.seconds) == 3
    # Seconds per repeat of 5 calls: microseconds. The median, as the next test takes: one preemption of
    # the agent inside a timed repeat costs a time slice of several ms on a loaded machine.
    assert all(t > 0 for t in reply.seconds) and statistics.median(reply.seconds) < 0.01
    assert int.from_bytes(s.read_buffer(3), "little") == 2 + 5 * 3


def test_evicted_args_are_written_back_between_calls(
    board: LocalBoard | QemuBoard, session: tuple[AgentSession, dict[str, int]]
) -> None:
    """A network's weights as its layer finds them: each timed call starts with the evicted args out of
    every cache level (CLFLUSH / DC CIVAC). A dirty line is written back, not dropped: the counter the
    kernel increments survives every eviction, and the evicted 1 MiB buffer keeps its bytes. RISC-V has
    no user-mode cache flush, and its agent says so rather than time warm buffers as cold."""
    s, offsets = session
    s.set_buffer(3, bytes(4))
    big = bytes(range(256)) * 4096
    s.set_buffer(4, big)
    request = RunRequest(offsets["count"], (3, 4), number=1, repeat=3, warmup=1, evict=frozenset({0, 1}))
    if board.target.arch == "riscv64":
        with pytest.raises(BoardError, match="refused RUN: evicting args needs a cache-flush instruction"):
            s.run(request)
        return
    reply = s.run(request)
    assert reply.status is RunStatus.OK and reply.number == 1 and len(reply.seconds) == 3
    assert int.from_bytes(s.read_buffer(3), "little") == 1 + 3
    assert s.read_buffer(4) == big


def test_eviction_needs_one_call_per_repeat() -> None:
    with pytest.raises(ValueError, match="number 1 and min_repeat_ms 0"):
        RunRequest(0, (3,), number=4, repeat=2, evict=frozenset({0}))
    with pytest.raises(ValueError, match="positions in args"):
        RunRequest(0, (3,), number=1, repeat=2, evict=frozenset({1}))


def test_min_repeat_grows_number(session: tuple[AgentSession, dict[str, int]]) -> None:
    s, offsets = session
    reply = s.run(
        RunRequest(offsets["empty"], (), number=1, repeat=3, min_repeat_ms=5.0, flush_cache_bytes=1 << 20)
    )
    assert reply.status is RunStatus.OK and reply.number > 1 and len(reply.seconds) == 3
    # One repeat of `number` calls lasted >= 5 ms during calibration; the timed ones are alike, though a
    # noise spike during calibration on a loaded machine can stop the doubling a step or two early.
    assert statistics.median(reply.number * t for t in reply.seconds) >= 0.001


def test_segfault_is_a_status_and_agent_keeps_serving(session: tuple[AgentSession, dict[str, int]]) -> None:
    s, offsets = session
    reply = s.run(RunRequest(offsets["null_store"], (), number=1, repeat=1))  # 8th arg is NULL
    assert reply.status is RunStatus.SIGNAL and reply.signal == signal.SIGSEGV and reply.seconds == ()
    s.set_buffer(3, bytes(4))
    assert s.run(RunRequest.check(offsets["count"], (3,))).status is RunStatus.OK
    assert int.from_bytes(s.read_buffer(3), "little") == 1


def test_trap_is_a_signal(
    board: LocalBoard | QemuBoard, session: tuple[AgentSession, dict[str, int]]
) -> None:
    s, offsets = session
    reply = s.run(RunRequest.check(offsets["trap"], ()))
    assert reply.status is RunStatus.SIGNAL and reply.signal == TRAP_SIGNAL[board.target.arch]
    assert s.run(RunRequest.check(offsets["empty"], ())).status is RunStatus.OK


def test_endless_loop_times_out_and_agent_keeps_serving(
    board: LocalBoard | QemuBoard, session: tuple[AgentSession, dict[str, int]]
) -> None:
    s, offsets = session
    # A QEMU board stretches the deadline (its calls run many times slower than native ones): 10 ms asked
    # there is 300 ms in the agent, as 300 ms asked is on the host.
    assert s.deadline_factor == (EMULATED_DEADLINE_FACTOR if isinstance(board, QemuBoard) else 1)
    start = time.monotonic()
    timeout_ms = 300 // s.deadline_factor
    reply = s.run(RunRequest(offsets["spin"], (), number=1, repeat=3, warmup=1, timeout_ms=timeout_ms))
    elapsed = time.monotonic() - start
    assert reply.status is RunStatus.TIMEOUT and reply.seconds == ()
    # The agent's own 300 ms, not the host's deadline (that would be a BoardError after 10 s or more);
    # the upper bound leaves a loaded machine room for the fork, the kill and the reply.
    assert 0.3 <= elapsed < 3.0
    assert s.run(RunRequest.check(offsets["empty"], ())).status is RunStatus.OK


def test_agent_killed_mid_run_is_a_board_error(session: tuple[AgentSession, dict[str, int]]) -> None:
    s, offsets = session
    killer = threading.Timer(0.3, os.kill, (s.hello.pid, signal.SIGKILL))
    killer.start()
    start = time.monotonic()
    with pytest.raises(BoardError, match="closed its stdout"):
        s.run(RunRequest(offsets["spin"], (), timeout_ms=60_000))
    assert time.monotonic() - start < 20.0  # the closed pipe, well before the kernel's 60 s deadline
    with pytest.raises(BoardError, match="broken"):
        s.read_buffer(0)


def test_refused_request_keeps_session(session: tuple[AgentSession, dict[str, int]]) -> None:
    s, offsets = session
    with pytest.raises(BoardError, match="refused RUN: an arg names a slot that is not set"):
        s.run(RunRequest.check(offsets["add"], (20, 21, 22)))
    with pytest.raises(BoardError, match="refused READ_BUFFER"):
        s.read_buffer(31)
    assert s.run(RunRequest.check(offsets["empty"], ())).status is RunStatus.OK


def test_protocol_violation_quotes_stderr() -> None:
    fake = (
        "echo XTUNE-AGENT 2 arch=x86_64 pid=1 page=4096 exec=mprotect; echo oops >&2;"
        "head -c 12 >/dev/null; echo garbage-garbage; sleep 5"
    )
    with pytest.raises(BoardError, match=r"protocol violation.*oops"):
        AgentSession(SubprocessTransport(["sh", "-c", fake]), timeout=5.0).read_buffer(0)


def test_a_long_write_to_an_agent_that_keeps_reading_never_times_out() -> None:
    """The write guard is a stall of the reader, not the whole transfer: 8 pipe-loads, one every 0.5 s,
    pass a 2 s guard (a network's weights into an emulated agent take minutes on a loaded machine); a
    reader that never reads is still caught."""
    reader = "for i in 1 2 3 4 5 6 7 8; do head -c 65536 >/dev/null; sleep 0.5; done"
    slow = SubprocessTransport(["sh", "-c", reader], write_timeout=2.0)
    try:
        slow.write(bytes(8 * 65536))
    finally:
        slow.kill()
    stuck = SubprocessTransport(["sh", "-c", "sleep 30"], write_timeout=0.5)
    try:
        with pytest.raises(BoardError, match=r"did not accept input within 0\.5 s"):
            stuck.write(bytes(1 << 20))
    finally:
        stuck.kill()


def test_exit_before_hello_quotes_stderr() -> None:
    with pytest.raises(BoardError, match=r"exit status 3.*cannot exec"):
        AgentSession(SubprocessTransport(["sh", "-c", "echo cannot exec >&2; exit 3"]), timeout=5.0)


def test_wrong_protocol_version_is_refused() -> None:
    with pytest.raises(BoardError, match="protocol 7"):
        AgentSession(SubprocessTransport(["sh", "-c", "echo XTUNE-AGENT 7 arch=x pid=1 page=1 exec=x"]), 5.0)


def test_run_request_validation() -> None:
    with pytest.raises(ValueError):
        RunRequest(0, tuple(range(9)))
    with pytest.raises(ValueError):
        RunRequest(0, (), number=0, repeat=3)
    assert RunRequest(0, (), timeout_ms=1000, repeat=3, warmup=1).host_timeout(2.0) == pytest.approx(8.0)


def test_a_stretched_deadline_stays_a_u32() -> None:
    assert RunRequest(0, (), timeout_ms=1000).stretched(30) == RunRequest(0, (), timeout_ms=30_000)
    assert RunRequest(0, (), timeout_ms=MAX_TIMEOUT_MS // 2).stretched(30).timeout_ms == MAX_TIMEOUT_MS
    RunRequest(0, (), timeout_ms=MAX_TIMEOUT_MS).stretched(2).encode()  # packs: struct would raise past a u32


def test_build_agent_is_cached_per_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    arch = get_board("local").target.arch
    path = build_agent(arch)
    assert path.parent.parent == tmp_path / "xtune" / "agents" and os.access(path, os.X_OK)
    assert re.fullmatch(rf"{arch}-[0-9a-f]{{12}}", path.parent.name)
    assert re.fullmatch("[0-9a-f]{12}", agent_version())
    mtime = path.stat().st_mtime_ns
    assert build_agent(arch) == path and path.stat().st_mtime_ns == mtime  # reused, not rebuilt
    assert [p.name for p in path.parent.iterdir()] == ["xtune-agent"]  # no temp file left behind


def test_unknown_board_lists_known() -> None:
    with pytest.raises(InputError, match="qemu-riscv64-v"):
        get_board("pi5")


def test_fingerprint_names_agent_version() -> None:
    fp = get_board("local").fingerprint()
    assert fp["agent"] == agent_version() and int(fp["cores"]) >= 1 and fp["uname"]
