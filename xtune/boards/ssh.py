"""SSH boards: a board config (config.py) in, agent sessions over exec channels of one connection
(connect.py), deploys and fingerprints out."""

from __future__ import annotations

import contextlib
import json
import logging
import posixpath
import shlex
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import paramiko

from xtune.boards.agent import AgentSession, stderr_note
from xtune.boards.agent_build import agent_version, build_agent, cache_root
from xtune.boards.config import AGENT_NAME as AGENT_NAME  # re-exported
from xtune.boards.config import SshBoardConfig
from xtune.boards.config import find_boards_file as find_boards_file  # the boards.toml API, re-exported
from xtune.boards.config import load_boards as load_boards
from xtune.boards.connect import connect
from xtune.boards.cost import CostUnit
from xtune.errors import BoardError, BoardFault
from xtune.files import write_atomic
from xtune.target import Target, cpu_identity

FINGERPRINT_NAME = "xtune-agent.json"
HELLO_TIMEOUT = 30.0  # also the margin on every request's own deadline (qemu behind ssh is slow)
# Seconds slept before each retry of a transient connect failure (refused, lost, timed out): at most
# 1 + 3 attempts, and no retry that would start after RECONNECT_BUDGET seconds: a refused port gives up
# after 3.5 s, a silent one after 2 attempts (docs/boards.md, "Faults", states the worst case).
RECONNECT_DELAYS = (0.5, 1.0, 2.0)
RECONNECT_BUDGET = 10.0

# paramiko's transport thread logs a dropped socket ("Socket exception: Connection reset") through
# logging's last-resort stderr handler; xtune reports the same event once, as a BoardError.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


class SshTransport:
    """agent.Transport over one SSH exec channel (RFC 4254 §6.5) running `exec <agent>`."""

    def __init__(self, channel: paramiko.Channel, describe: str, kill_pid: Callable[[int], None]) -> None:
        self._chan = channel
        self._describe = describe
        self._kill_pid = kill_pid
        self._stderr = bytearray()
        self.pid: int | None = None  # the agent's (or qemu's) pid from the hello line, for kill_pid

    def exited(self, wait: float = 0.0) -> bool:
        """Whether the remote process ended by itself: its exit status arrived, within `wait` seconds
        (sshd sends it just after the channel's EOF; a dropped connection brings none)."""
        return self._chan.status_event.wait(wait) if wait > 0 else self._chan.exit_status_ready()

    def _fail(self, what: str, kind: BoardFault) -> BoardError:
        status = ""
        if self._chan.exit_status_ready():
            # paramiko reports -1 when the process died by a signal (it ignores "exit-signal").
            code = self._chan.recv_exit_status()
            status = f" (exit status {code})"
            if code in (126, 127):  # POSIX shell: command not executable / not found
                kind = BoardFault.AGENT_GONE
        tail = self.stderr_tail()
        return BoardError(f"{self._describe}: {what}{status}" + stderr_note(tail), kind)

    def write(self, data: bytes) -> None:
        self._chan.settimeout(HELLO_TIMEOUT)
        try:
            self._chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._fail(f"send failed: {err or type(err).__name__}", BoardFault.LOST) from None

    def read(self, n: int, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"no reply within {timeout:.1f} s", BoardFault.TIMEOUT)
            self._chan.settimeout(left)
            try:
                chunk = self._chan.recv(n - len(out))
            except TimeoutError:
                raise self._fail(f"no reply within {timeout:.1f} s", BoardFault.TIMEOUT) from None
            except (OSError, EOFError, paramiko.SSHException) as err:
                raise self._fail(f"connection lost: {err or type(err).__name__}", BoardFault.LOST) from None
            if not chunk:
                why = "the agent's channel closed (agent died, or the connection dropped)"
                raise self._fail(why, BoardFault.LOST)
            out += chunk
        return bytes(out)

    def stderr_tail(self) -> str:
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            while self._chan.recv_stderr_ready():
                self._stderr += self._chan.recv_stderr(4096)
        del self._stderr[:-16384]
        return self._stderr.decode(errors="replace").strip()[-2000:]

    def close(self) -> None:
        # EOF on the agent's stdin (RFC 4254 §5.3 channel EOF) makes it exit 0; kill it if it lingers.
        with contextlib.suppress(OSError, EOFError, paramiko.SSHException):
            self._chan.shutdown_write()
            deadline = time.monotonic() + 2.0
            while not (self._chan.exit_status_ready() or self._chan.closed) and time.monotonic() < deadline:
                time.sleep(0.01)
        if not self._chan.exit_status_ready():
            self.kill()
        self._chan.close()

    def kill(self) -> None:
        # Closing the channel does not stop a busy remote process, and sshd ignores the RFC 4254 §6.9
        # "signal" request in many setups (docs/notes.md §5): kill by pid over a second channel.
        if self.pid is not None and not self._chan.exit_status_ready():
            self._kill_pid(self.pid)
        self._chan.close()


class SshBoard:
    """A board reached over SSH: one connection, one long-lived agent per exec channel."""

    def __init__(
        self, config: SshBoardConfig, target: Target, reconnect_delays: Sequence[float] = RECONNECT_DELAYS
    ) -> None:
        self.config = config
        self.name = config.name
        self.target = target
        # qemu behind ssh: its wall time is emulated, so the board checks correctness only (docs/boards.md)
        self.cost_unit = CostUnit.NONE if config.wrapper else CostUnit.SECONDS
        self.reconnect_delays = tuple(reconnect_delays)
        self.reconnect_budget = RECONNECT_BUDGET  # no retry starts later than this many seconds in
        self.timeout = HELLO_TIMEOUT  # hello wait, and the margin on each request's own deadline
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    def client(self) -> paramiko.SSHClient:
        """The live connection, re-established if it dropped: a transient failure is retried after each
        of `reconnect_delays` while `reconnect_budget` lasts, then given up (no longer transient); any other
        failure is raised at once."""
        with self._lock:
            transport = self._client.get_transport() if self._client else None
            if transport is not None and transport.is_active():
                assert self._client is not None
                return self._client
            if self._client is not None:
                self._client.close()
                self._client = None
            start, last, attempts = time.monotonic(), None, 0
            for delay in (0.0, *self.reconnect_delays):
                if attempts and time.monotonic() - start + delay > self.reconnect_budget:
                    break
                time.sleep(delay)
                attempts += 1
                try:
                    self._client = connect(self.config)
                    return self._client
                except BoardError as err:
                    if not err.transient:
                        raise  # host key, authentication: retrying cannot help
                    last = err
            assert last is not None
            raise last.gave_up(f" (gave up after {attempts} attempts in {time.monotonic() - start:.1f} s)")

    def agent_command(self) -> str:
        # `exec` replaces the login shell, so the hello pid is the agent's (or qemu's) own (docs/notes.md §4).
        return f"exec {self.config.wrapper} {shlex.quote(self.config.agent_path)}".replace("exec  ", "exec ")

    def open(self) -> AgentSession:
        channel = self._exec_channel(self.agent_command())
        pipe = SshTransport(channel, f"board {self.name} agent", self._kill_pid)
        try:
            session = AgentSession(pipe, timeout=self.timeout)
        except BoardError as err:
            if not pipe.exited(wait=1.0):
                raise
            # The connection is up but the agent ended before its hello: missing, not executable,
            # wrong arch for the wrapper. Restarting it will not help.
            raise BoardError(
                f"{err}; the agent cannot start on the board (run `xtune deploy --board {self.name}`)",
                BoardFault.AGENT_GONE,
            ) from None
        pipe.pid = session.hello.pid
        return session

    def _exec_channel(self, command: str) -> paramiko.Channel:
        """A session channel running `command`; a connection found dead on the way is reopened once."""
        for attempt in (1, 2):
            try:
                transport = self.client().get_transport()
                assert transport is not None
                channel = transport.open_session(timeout=self.config.connect_timeout)
                channel.exec_command(command)
                return channel
            except (OSError, EOFError, paramiko.SSHException) as err:
                self.close()  # the transport died between the liveness check and the open
                if attempt == 2:
                    why = str(err) or type(err).__name__
                    raise BoardError(
                        f"board {self.name}: cannot start the agent: {why}", BoardFault.LOST
                    ) from None
        raise AssertionError("unreachable")

    def _kill_pid(self, pid: int) -> None:
        # Only over a live connection: a dropped one cannot reach the process, and reconnecting
        # here would add the whole backoff to every failure.
        client = self._client
        transport = client.get_transport() if client else None
        if client is not None and transport is not None and transport.is_active():
            with contextlib.suppress(BoardError):
                run_command(client, f"kill -KILL {pid}", timeout=5.0)

    def fingerprint(self) -> dict[str, str]:
        """What deploy recorded (local cache, else the JSON beside the deployed agent)."""
        cached = fingerprint_cache(self.name)
        if cached.is_file():
            with contextlib.suppress(OSError, ValueError):
                return dict(json.loads(cached.read_text(encoding="utf-8")))
        try:
            with (
                self.client().open_sftp() as sftp,
                sftp.open(posixpath.join(self.config.workdir, FINGERPRINT_NAME)) as f,
            ):
                data: dict[str, str] = json.loads(f.read())
        except (OSError, ValueError, paramiko.SSHException) as err:
            raise BoardError(
                f"board {self.name} has no recorded fingerprint ({err}); "
                f"run `xtune deploy --board {self.name}`",
                BoardFault.AGENT_GONE,
            ) from None
        _write_cache(self.name, data)
        return data

    def adopt(self, client: paramiko.SSHClient) -> None:
        """Use an already open connection (deploy's) instead of connecting again."""
        with self._lock:
            if self._client is not None and self._client is not client:
                self._client.close()
            self._client = client

    def close(self) -> None:
        with self._lock:
            if self._client is not None:
                self._client.close()
                self._client = None


def run_command(client: paramiko.SSHClient, cmd: str, timeout: float = 30.0) -> str:
    """stdout of `cmd` on the board; BoardError with its stderr if it exits non-zero."""
    try:
        _, stdout, stderr = client.exec_command(cmd, timeout=timeout)
        out = stdout.read().decode(errors="replace")
        err = stderr.read().decode(errors="replace").strip()
        status = stdout.channel.recv_exit_status()
    except (OSError, EOFError, paramiko.SSHException) as exc:
        raise BoardError(
            f"running `{cmd}` on the board failed: {exc or type(exc).__name__}", BoardFault.LOST
        ) from None
    if status != 0:
        raise BoardError(f"`{cmd}` on the board exited with {status}: {err[-500:]}", BoardFault.AGENT)
    return out


def fingerprint_cache(name: str) -> Path:
    """Where `deploy` keeps a board's fingerprint, in xtune's one cache folder."""
    return cache_root() / "boards" / f"{name}.json"


def _write_cache(name: str, data: dict[str, str]) -> None:
    path = fingerprint_cache(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(data, indent=1) + "\n", "fingerprint cache")


def probe(board: SshBoard, timeout: float = 3.0) -> str:
    """'' if the board accepts a connection within `timeout`, else why not (for `xtune boards`)."""
    try:
        connect(board.config, timeout=timeout).close()
    except BoardError as err:
        return str(err).removeprefix(f"board {board.name}: ")
    return ""


def deploy(board: SshBoard, accept_new_host_key: bool = False) -> dict[str, object]:
    """Build the agent for the board's arch, upload it (SFTP), check its hello, record the fingerprint."""
    start = time.perf_counter()
    local = build_agent(board.target.arch)
    client = connect(board.config, accept_new_host_key=accept_new_host_key)
    board.adopt(client)
    try:
        _upload(client, local, board.config)
        with board.open() as session:
            hello = session.hello
        if hello.arch != board.target.arch:
            raise BoardError(
                f"board {board.name}: the agent reports arch={hello.arch}, but target "
                f"{board.target.name} is {board.target.arch}; check `target` and `wrapper`",
                BoardFault.AGENT_GONE,
            )
        fingerprint = _remote_fingerprint(client, board)
        remote = posixpath.join(board.config.workdir, FINGERPRINT_NAME)
        with client.open_sftp() as sftp, sftp.open(remote, "w") as f:
            f.write(json.dumps(fingerprint, indent=1) + "\n")
    except (OSError, EOFError, paramiko.SSHException) as err:
        raise BoardError(
            f"board {board.name}: deploy failed: {err or type(err).__name__}", BoardFault.LOST
        ) from None
    finally:
        board.close()
    _write_cache(board.name, fingerprint)
    return {
        "board": board.name,
        "target": board.target.name,
        "agent": board.config.agent_path,
        "agent_version": agent_version(),
        "arch": hello.arch,
        "pid": hello.pid,
        "exec": hello.exec_method,
        "fingerprint": fingerprint,
        "seconds": round(time.perf_counter() - start, 3),
    }


def _upload(client: paramiko.SSHClient, local: Path, config: SshBoardConfig) -> None:
    with client.open_sftp() as sftp:
        path = ""
        for part in config.workdir.split("/"):  # mkdir -p
            path = posixpath.join(path, part) if path else (part or "/")
            if part in ("", "."):
                continue
            try:
                sftp.stat(path)
            except FileNotFoundError:
                sftp.mkdir(path, 0o755)
        partial = config.agent_path + ".partial"
        sftp.put(str(local), partial)
        sftp.chmod(partial, 0o755)
        # Upload beside, then rename over: writing into a running binary fails with ETXTBSY, and
        # posix-rename@openssh.com replaces atomically where plain SFTP rename refuses an existing file.
        sftp.posix_rename(partial, config.agent_path)


def _remote_fingerprint(client: paramiko.SSHClient, board: SshBoard) -> dict[str, str]:
    out = run_command(client, "uname -a; nproc; cat /proc/cpuinfo").splitlines()
    cpu = cpu_identity("\n".join(out[2:]))
    fingerprint = {
        "board": board.name,
        "target": board.target.name,
        "uname": out[0].strip() if out else "unknown",
        "cpu": cpu,
        "cores": out[1].strip() if len(out) > 1 else "0",
        "agent": agent_version(),
    }
    if board.config.wrapper:
        fingerprint["wrapper"] = board.config.wrapper
    return fingerprint
