"""Agent client: a byte transport to a running xtune-agent in, typed hello/run replies and buffers out."""

from __future__ import annotations

import contextlib
import os
import selectors
import struct
import subprocess
import threading
import time
from dataclasses import dataclass, replace
from enum import Enum
from types import TracebackType
from typing import Protocol

from xtune.errors import BoardError, BoardFault

PROTOCOL_VERSION = 2
HELLO_PREFIX = b"XTUNE-AGENT "
MAX_ARGS = 8
MAX_SLOTS = 32
MAX_REPEAT = 1024
MAX_TIMEOUT_MS = 0xFFFFFFFF  # timeout_ms is a u32 (board_agent/PROTOCOL.md, RUN)
_MAX_SKIPPED = 64 * 1024  # bytes of banner/rc output tolerated before the hello line
_MAX_PAYLOAD = 1 << 30
_STDERR_KEEP = 16 * 1024

# Frames (PROTOCOL.md): 8-byte header "XQ"/"XR", op/status byte, zero byte, u32 LE payload length.
_HEADER = struct.Struct("<2sBxI")
_OP_LOAD, _OP_SET_BUFFER, _OP_RUN, _OP_READ_BUFFER = 1, 2, 3, 4
_OP_NAMES = {_OP_LOAD: "LOAD", _OP_SET_BUFFER: "SET_BUFFER", _OP_RUN: "RUN", _OP_READ_BUFFER: "READ_BUFFER"}
_ST_OK, _ST_ERROR = 0, 1
# entry, number, repeat, warmup, timeout_ms, min_repeat_us, nargs, flush, args, evict, reserved
_RUN = struct.Struct("<QIIIIIIQ8iII")
_RUN_REPLY = struct.Struct("<IiII")  # run status, signal, number used, count of u64 ns that follow


def stderr_note(tail: str, label: str = "stderr") -> str:
    """ "; stderr: ..." for an error message, its lines joined: a board error is one line on the terminal."""
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return f"; {label}: {' | '.join(lines)}" if lines else ""


class Transport(Protocol):
    """A byte pipe to one agent process; a subprocess here, an SSH exec channel elsewhere."""

    def write(self, data: bytes) -> None: ...

    def read(self, n: int, timeout: float) -> bytes:
        """Exactly n bytes, or BoardError on EOF or when `timeout` seconds pass."""
        ...

    def close(self) -> None:
        """Ends the session politely (EOF on the agent's stdin), killing it if it lingers."""
        ...

    def kill(self) -> None: ...

    def stderr_tail(self) -> str:
        """The last few KiB the agent (or qemu, or the shell) wrote to stderr, for error messages."""
        ...


class SubprocessTransport:
    """Runs the agent as a child process (optionally under qemu-user) and talks over its pipes."""

    def __init__(
        self, argv: list[str], env: dict[str, str] | None = None, write_timeout: float = 60.0
    ) -> None:
        self._argv = argv
        self._write_timeout = write_timeout
        try:
            self._proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                bufsize=0,
            )
        except OSError as err:
            raise BoardError(f"cannot start agent {' '.join(argv)}: {err}", BoardFault.AGENT_GONE) from None
        assert self._proc.stdin and self._proc.stdout and self._proc.stderr
        self._stdin = self._proc.stdin.fileno()
        self._stdout = self._proc.stdout.fileno()
        os.set_blocking(self._stdin, False)
        self._buf = bytearray()
        self._stderr = bytearray()
        self._lock = threading.Lock()
        self._stderr_thread = threading.Thread(
            target=self._drain_stderr, name="xtune-agent-stderr", daemon=True
        )
        self._stderr_thread.start()

    @property
    def pid(self) -> int:
        return self._proc.pid

    @property
    def returncode(self) -> int | None:
        """The agent's exit status once it ended (negative: killed by that signal), else None."""
        return self._proc.poll()

    def _drain_stderr(self) -> None:
        assert self._proc.stderr is not None
        fd = self._proc.stderr.fileno()
        while chunk := os.read(fd, 4096):
            with self._lock:
                self._stderr += chunk
                del self._stderr[:-_STDERR_KEEP]

    def stderr_tail(self) -> str:
        self._stderr_thread.join(0.2)  # the agent just died: let its last words arrive
        with self._lock:
            return self._stderr.decode(errors="replace").strip()[-2000:]

    def exited(self) -> bool:
        return self._proc.poll() is not None

    def _fail(self, what: str, kind: BoardFault) -> BoardError:
        code = self._proc.poll()
        status = f" (exit status {code})" if code is not None else ""
        tail = self.stderr_tail()
        return BoardError(
            f"agent `{' '.join(self._argv)[:120]}`: {what}{status}" + stderr_note(tail),
            kind,
        )

    def write(self, data: bytes) -> None:
        """All of `data`, however long it takes, so long as the agent never stops reading for
        `write_timeout` seconds: a network's weights (hundreds of MB for VGG-19) can take minutes to pass
        through an emulated agent on a loaded machine."""
        view = memoryview(data)
        deadline = time.monotonic() + self._write_timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._stdin, selectors.EVENT_WRITE)
            while view:
                try:
                    view = view[os.write(self._stdin, view) :]
                    deadline = time.monotonic() + self._write_timeout  # it read: the stall clock restarts
                    continue
                except BlockingIOError:
                    pass
                except OSError as err:  # EPIPE: the agent is gone
                    raise self._fail(f"write failed: {err.strerror}", BoardFault.LOST) from None
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    why = f"agent did not accept input within {self._write_timeout:.1f} s"
                    raise self._fail(why, BoardFault.TIMEOUT)

    def read(self, n: int, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            sel.register(self._stdout, selectors.EVENT_READ)
            while len(self._buf) < n:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    raise self._fail(f"no reply within {timeout:.1f} s", BoardFault.TIMEOUT)
                chunk = os.read(self._stdout, max(65536, n - len(self._buf)))
                if not chunk:
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        self._proc.wait(0.5)  # so the message can give its exit status
                    raise self._fail("agent closed its stdout (it died or exited)", BoardFault.LOST)
                self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    def close(self) -> None:
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                self._proc.stdin.close()  # EOF: the agent exits 0
                self._proc.wait(timeout=2.0)
            except (OSError, subprocess.TimeoutExpired):
                self.kill()
        self._reap()

    def kill(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._reap()

    def _reap(self) -> None:
        self._proc.wait()
        self._stderr_thread.join(1.0)
        streams = [self._proc.stdin, self._proc.stdout]
        if not self._stderr_thread.is_alive():  # never close an fd another thread is reading
            streams.append(self._proc.stderr)
        for stream in streams:
            if stream is not None:
                stream.close()


@dataclass(frozen=True)
class AgentHello:
    version: int
    arch: str
    pid: int
    page_size: int
    exec_method: str  # mprotect | memfd | none: how the agent obtains executable memory


class RunStatus(Enum):
    OK = "ok"
    SIGNAL = "signal"  # the kernel died by a signal (segfault, trap, ...)
    TIMEOUT = "timeout"  # one step (a call, or one repeat of `number` calls) exceeded timeout_ms


@dataclass(frozen=True)
class RunRequest:
    """One RUN: warmups, then `repeat` timed repeats of `number` calls; number=repeat=0: one untimed call."""

    entry_offset: int
    args: tuple[int, ...] = ()  # buffer slots passed as the kernel's pointer args in order; the rest are NULL
    number: int = 1  # calls per repeat; doubled by the agent until a repeat lasts min_repeat_ms
    repeat: int = 1
    min_repeat_ms: float = 0.0
    warmup: int = 0
    timeout_ms: int = 10_000  # per step: one warm-up call, or one repeat
    flush_cache_bytes: int = 0  # bytes written and read before each repeat; 0 = no flush
    # Positions in `args` whose buffers are evicted from every cache level before each timed repeat
    # (a network's weights, as its layer finds them); needs number 1 and no min_repeat_ms.
    evict: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if len(self.args) > MAX_ARGS or any(not 0 <= s < MAX_SLOTS for s in self.args):
            raise ValueError(f"args must be at most {MAX_ARGS} slot numbers in 0..{MAX_SLOTS - 1}")
        if (self.number == 0) != (self.repeat == 0) or self.number < 0 or not 0 <= self.repeat <= MAX_REPEAT:
            raise ValueError("number and repeat must both be 0 (check-only) or both >= 1 (repeat <= 1024)")
        if self.timeout_ms < 1 or self.warmup < 0 or self.min_repeat_ms < 0 or self.flush_cache_bytes < 0:
            raise ValueError("timeout_ms must be >= 1; warmup, min_repeat_ms, flush_cache_bytes >= 0")
        if not self.evict <= set(range(len(self.args))):
            raise ValueError("evict must name positions in args")
        if self.evict and (self.number != 1 or self.min_repeat_ms):
            raise ValueError("evicting args needs number 1 and min_repeat_ms 0: each timed call starts cold")

    @classmethod
    def check(cls, entry_offset: int, args: tuple[int, ...], timeout_ms: int = 10_000) -> RunRequest:
        """A check-only run: exactly one call, no timing, for comparing outputs with a reference."""
        return cls(entry_offset, args, number=0, repeat=0, timeout_ms=timeout_ms)

    def stretched(self, factor: int) -> RunRequest:
        """This request with its deadline `factor` times longer (at most the protocol's u32 milliseconds)."""
        return replace(self, timeout_ms=min(self.timeout_ms * factor, MAX_TIMEOUT_MS))

    def host_timeout(self, margin: float) -> float:
        """Seconds the host waits for the reply: every step may take timeout_ms, calibration ~2 more."""
        steps = self.repeat + self.warmup + 2
        return (self.timeout_ms * steps + 2 * self.min_repeat_ms) / 1000 + margin

    def encode(self) -> bytes:
        slots = list(self.args) + [-1] * (MAX_ARGS - len(self.args))
        return _RUN.pack(
            self.entry_offset,
            self.number,
            self.repeat,
            self.warmup,
            self.timeout_ms,
            round(self.min_repeat_ms * 1000),
            len(self.args),
            self.flush_cache_bytes,
            *slots,
            sum(1 << position for position in self.evict),
            0,
        )


@dataclass(frozen=True)
class RunReply:
    status: RunStatus
    signal: int = 0  # the signal number when status is SIGNAL
    number: int = 0  # calls per repeat actually used (after the agent's doubling); 0 for check-only
    seconds: tuple[float, ...] = ()  # seconds PER CALL, one per repeat; empty unless OK and timed


def parse_hello(line: bytes) -> AgentHello:
    """`XTUNE-AGENT 2 arch=x86_64 pid=1234 page=4096 exec=mprotect` -> AgentHello."""
    words = line.decode(errors="replace").split()
    fields = dict(w.split("=", 1) for w in words[2:] if "=" in w)
    try:
        hello = AgentHello(
            int(words[1]), fields["arch"], int(fields["pid"]), int(fields["page"]), fields["exec"]
        )
    except (IndexError, KeyError, ValueError):
        raise BoardError(f"malformed agent hello line {line!r}", BoardFault.AGENT_GONE) from None
    if hello.version != PROTOCOL_VERSION:
        raise BoardError(
            f"agent speaks protocol {hello.version}, this xtune speaks {PROTOCOL_VERSION} (deploy it again)",
            BoardFault.AGENT_GONE,
        )
    return hello


class AgentSession:
    """One long-lived agent: load an image, set buffers, run, read buffers back. Not thread-safe."""

    def __init__(self, transport: Transport, timeout: float, deadline_factor: int = 1) -> None:
        self._transport = transport
        self._timeout = timeout
        # Every RUN's deadline is stretched by this (an emulated board's calls run many times slower than
        # the native calls a user's deadline is set for: xtune/boards/board.py, EMULATED_DEADLINE_FACTOR).
        self.deadline_factor = deadline_factor
        self._broken = False
        try:
            self.hello = self._await_hello()
        except BoardError:
            self._transport.kill()
            raise

    def _await_hello(self) -> AgentHello:
        # Login shells and rc files may print anything first: scan lines for the hello prefix.
        deadline = time.monotonic() + self._timeout
        line = bytearray()
        skipped = 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._error(f"no hello line within {self._timeout:.1f} s", BoardFault.TIMEOUT)
            byte = self._transport.read(1, left)
            if byte != b"\n":
                line += byte
                if len(line) > _MAX_SKIPPED:
                    raise self._error("no hello line in the first 64 KiB of output", BoardFault.AGENT_GONE)
                continue
            start = line.find(HELLO_PREFIX)
            if start >= 0:
                return parse_hello(bytes(line[start:]))
            skipped += len(line) + 1
            if skipped > _MAX_SKIPPED:
                raise self._error("no hello line in the first 64 KiB of output", BoardFault.AGENT_GONE)
            line.clear()

    def _error(self, what: str, kind: BoardFault = BoardFault.AGENT) -> BoardError:
        tail = self._transport.stderr_tail()
        return BoardError(what + stderr_note(tail, "agent stderr"), kind)

    def _request(self, op: int, payload: bytes, timeout: float) -> bytes:
        if self._broken:
            raise BoardError("agent session is closed or broken; open a new one", BoardFault.LOST)
        try:
            self._transport.write(_HEADER.pack(b"XQ", op, len(payload)) + payload)
            magic, status, length = _HEADER.unpack(self._transport.read(_HEADER.size, timeout))
            if magic != b"XR" or status not in (_ST_OK, _ST_ERROR) or length > _MAX_PAYLOAD:
                raise self._error(f"protocol violation: bad reply header to {_OP_NAMES[op]}")
            body = self._transport.read(length, timeout) if length else b""
        except BoardError:
            # The stream is out of step or the agent is gone: nothing after this can be trusted.
            self._broken = True
            self._transport.kill()
            raise
        if status == _ST_ERROR:
            raise BoardError(
                f"agent refused {_OP_NAMES[op]}: {body.decode(errors='replace')}", BoardFault.AGENT
            )
        return body

    def load_image(self, image: bytes) -> int:
        """Maps `image` executable at a page-aligned address; returns that address."""
        body = self._request(_OP_LOAD, image, self._timeout)
        return int(struct.unpack("<Q", self._expect(body, 8, "LOAD"))[0])

    def set_buffer(self, slot: int, data: bytes) -> None:
        """Creates or replaces buffer `slot` (0..31) with `data`, shared with the run child."""
        self._request(_OP_SET_BUFFER, struct.pack("<II", slot, 0) + data, self._timeout)

    def read_buffer(self, slot: int) -> bytes:
        return self._request(_OP_READ_BUFFER, struct.pack("<I", slot), self._timeout)

    def run(self, req: RunRequest) -> RunReply:
        req = req.stretched(self.deadline_factor)
        body = self._request(_OP_RUN, req.encode(), req.host_timeout(self._timeout))
        status, sig, number, count = struct.unpack_from("<IiII", self._expect(body, None, "RUN"))
        self._expect(body, _RUN_REPLY.size + 8 * count, "RUN")
        if status not in (0, 1, 2):
            raise self._error(f"protocol violation: unknown run status {status}")
        ns = struct.unpack_from(f"<{count}Q", body, _RUN_REPLY.size)
        run_status = (RunStatus.OK, RunStatus.SIGNAL, RunStatus.TIMEOUT)[status]
        seconds = tuple(t / number / 1e9 for t in ns) if number else ()
        return RunReply(run_status, sig, number, seconds)

    def _expect(self, body: bytes, size: int | None, op: str) -> bytes:
        if (size is None and len(body) < _RUN_REPLY.size) or (size is not None and len(body) != size):
            self._broken = True
            self._transport.kill()
            raise self._error(f"protocol violation: {op} reply of {len(body)} bytes")
        return body

    def close(self) -> None:
        self._broken = True
        self._transport.close()

    def __enter__(self) -> AgentSession:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, err: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
