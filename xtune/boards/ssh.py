"""SSH boards: boards.toml + ~/.ssh/config in, verified connections, agent sessions and deploys out."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import shlex
import socket
import threading
import time
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import paramiko

from xtune.boards.agent import AgentSession
from xtune.boards.agent_build import agent_version, build_agent
from xtune.boards.cost import CostUnit
from xtune.errors import BoardError, InputError
from xtune.target import Target, cpu_identity

AGENT_NAME = "xtune-agent"
FINGERPRINT_NAME = "xtune-agent.json"
CONNECT_TIMEOUT = 10.0  # seconds for TCP connect, SSH banner and authentication each
HELLO_TIMEOUT = 30.0  # also the margin on every request's own deadline (qemu behind ssh is slow)
RECONNECT_DELAYS = (0.5, 1.0, 2.0)  # seconds slept before each retry of a dropped connection

# paramiko's transport thread logs a dropped socket ("Socket exception: Connection reset") through
# logging's last-resort stderr handler; xtune reports the same event once, as a BoardError.
logging.getLogger("paramiko").addHandler(logging.NullHandler())


@dataclass(frozen=True)
class SshBoardConfig:
    """One `[boards.NAME]` table of boards.toml; unset fields come from ~/.ssh/config, then defaults."""

    name: str
    host: str
    target: str
    port: int | None = None
    user: str | None = None
    key: str | None = None  # private key file; none: IdentityFile from ~/.ssh/config
    workdir: str = ".xtune"  # relative paths start in the login directory (SFTP and exec alike)
    wrapper: str = ""  # e.g. "qemu-aarch64 -cpu cortex-a72": an emulated board behind SSH
    known_hosts: str = "~/.ssh/known_hosts"
    ssh_config: str = "~/.ssh/config"
    use_agent: bool = False  # also try ssh-agent and ~/.ssh/id_* keys (paramiko allow_agent/look_for_keys)

    @property
    def agent_path(self) -> str:
        return posixpath.join(self.workdir, AGENT_NAME)


def find_boards_file(explicit: Path | None = None) -> Path | None:
    """`--boards FILE` if given, else ./boards.toml, else ~/.config/xtune/boards.toml, else None."""
    if explicit is not None:
        if not explicit.is_file():
            raise InputError(f"boards file {explicit} does not exist")
        return explicit
    for candidate in (Path("boards.toml"), Path.home() / ".config" / "xtune" / "boards.toml"):
        if candidate.is_file():
            return candidate
    return None


def load_boards(explicit: Path | None = None) -> dict[str, SshBoardConfig]:
    """The SSH boards declared in the boards file (empty without one)."""
    path = find_boards_file(explicit)
    if path is None:
        return {}
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise InputError(f"{path}: cannot read boards: {err}") from None
    known = {f.name for f in fields(SshBoardConfig)} - {"name"}
    boards: dict[str, SshBoardConfig] = {}
    for name, table in dict(raw.get("boards", {})).items():
        if not isinstance(table, dict):
            raise InputError(f"{path}: 'boards.{name}' must be a table")
        unknown = sorted(set(table) - known)
        if unknown:
            raise InputError(f"{path}: board '{name}': unknown keys {', '.join(unknown)}")
        try:
            config = SshBoardConfig(name=name, **table)
        except TypeError as err:
            raise InputError(f"{path}: board '{name}': {err}") from None
        workdir = config.workdir[2:] if config.workdir.startswith("~/") else config.workdir  # SFTP has no ~
        boards[name] = SshBoardConfig(**{**vars(config), "workdir": workdir or "."})
    return boards


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to connect, after merging ~/.ssh/config (boards.toml values win, like `ssh -o`)."""

    hostname: str
    port: int
    user: str | None
    keys: tuple[str, ...]

    @property
    def known_hosts_name(self) -> str:
        # OpenSSH writes non-default ports as "[host]:port" in known_hosts; paramiko looks them up alike.
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def resolve(config: SshBoardConfig) -> Endpoint:
    ssh_config = Path(config.ssh_config).expanduser()
    found: dict[str, object] = {}
    if ssh_config.is_file():
        with contextlib.suppress(OSError, paramiko.SSHException):
            found = dict(paramiko.SSHConfig.from_path(str(ssh_config)).lookup(config.host))
    identity = found.get("identityfile")
    keys = [config.key] if config.key else list(identity) if isinstance(identity, list) else []
    return Endpoint(
        hostname=str(found.get("hostname", config.host)),
        port=config.port or int(str(found.get("port", 22))),
        user=config.user or (str(found["user"]) if "user" in found else None),
        keys=tuple(str(Path(k).expanduser()) for k in keys),
    )


def _fp(key: paramiko.PKey) -> str:
    return key.fingerprint  # "SHA256:..." as OpenSSH prints it


class _UnknownHostKey(paramiko.SSHException):
    def __init__(self, name: str, key: paramiko.PKey) -> None:
        super().__init__(name)
        self.key = key


class _Refuse(paramiko.MissingHostKeyPolicy):
    """paramiko's RejectPolicy, but keeping the offered key so the message can name it."""

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        raise _UnknownHostKey(hostname, key)


class _AcceptAndRecord(paramiko.MissingHostKeyPolicy):
    """`--accept-new-host-key`: trust the offered key (only if the host has none yet) and append it."""

    def __init__(self, known_hosts: Path) -> None:
        self.known_hosts = known_hosts

    def missing_host_key(self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey) -> None:
        line = paramiko.hostkeys.HostKeyEntry([hostname], key).to_line() or ""
        self.known_hosts.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        with open(self.known_hosts, "a", encoding="utf-8") as f:  # append: keep the user's comments
            f.write(line)
        client.get_host_keys().add(hostname, key.get_name(), key)


def connect(config: SshBoardConfig, timeout: float = CONNECT_TIMEOUT, accept_new_host_key: bool = False
            ) -> paramiko.SSHClient:  # fmt: skip
    """An authenticated client; host key verified against known_hosts. Errors never carry secrets."""
    end = resolve(config)
    where = f"{end.user + '@' if end.user else ''}{end.hostname}:{end.port}"
    known_hosts = Path(config.known_hosts).expanduser()
    keys: Any = list(end.keys) or None  # paramiko takes a list of files; its type stubs say str
    client = paramiko.SSHClient()
    if known_hosts.is_file():
        client.load_host_keys(str(known_hosts))
    client.set_missing_host_key_policy(_AcceptAndRecord(known_hosts) if accept_new_host_key else _Refuse())
    try:
        client.connect(
            end.hostname, end.port, username=end.user, key_filename=keys,
            timeout=timeout, banner_timeout=timeout, auth_timeout=timeout,
            allow_agent=config.use_agent, look_for_keys=config.use_agent,
        )  # fmt: skip
        sock = client.get_transport().sock if client.get_transport() else None  # type: ignore[union-attr]
        if isinstance(sock, socket.socket):
            # Without it every exec-channel open waits out Nagle + delayed ACK: 44 ms vs 5 ms measured.
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return client
    except _UnknownHostKey as err:
        client.close()
        raise BoardError(
            f"board {config.name}: host key of {end.known_hosts_name} ({err.key.get_name()} {_fp(err.key)}) "
            f"is not in {known_hosts}; if that fingerprint is right, run "
            f"`xtune deploy --board {config.name} --accept-new-host-key`"
        ) from None
    except paramiko.BadHostKeyException as err:
        client.close()
        raise BoardError(
            f"board {config.name}: HOST KEY CHANGED for {end.known_hosts_name}: {known_hosts} has "
            f"{_fp(err.expected_key)}, the server offers {_fp(err.key)}; refusing to connect (someone may be "
            f"intercepting). If the board was reinstalled, remove the old key with "
            f"`ssh-keygen -R '{end.known_hosts_name}' -f {known_hosts}`"
        ) from None
    except paramiko.PasswordRequiredException:
        client.close()
        raise BoardError(f"board {config.name}: key {config.key} is encrypted; add it to ssh-agent "
                         f"and set use_agent = true") from None  # fmt: skip
    except paramiko.AuthenticationException:
        client.close()
        keys = ", ".join(end.keys) or ("ssh-agent and default keys" if config.use_agent else "none")
        raise BoardError(f"board {config.name}: authentication as {where} failed (keys: {keys})") from None
    except (OSError, EOFError, paramiko.SSHException) as err:
        client.close()
        why = str(err) or type(err).__name__
        raise BoardError(f"board {config.name}: cannot connect to {where}: {why}") from None


class SshTransport:
    """agent.Transport over one SSH exec channel (RFC 4254 §6.5) running `exec <agent>`."""

    def __init__(self, channel: paramiko.Channel, describe: str, kill_pid: Callable[[int], None]) -> None:
        self._chan = channel
        self._describe = describe
        self._kill_pid = kill_pid
        self._stderr = bytearray()
        self.pid: int | None = None  # the agent's (or qemu's) pid from the hello line, for kill_pid

    def _fail(self, what: str) -> BoardError:
        status = ""
        if self._chan.exit_status_ready():
            # paramiko reports -1 when the process died by a signal (it ignores "exit-signal").
            status = f" (exit status {self._chan.recv_exit_status()})"
        tail = self.stderr_tail()
        return BoardError(f"{self._describe}: {what}{status}" + (f"; stderr: {tail}" if tail else ""))

    def write(self, data: bytes) -> None:
        self._chan.settimeout(HELLO_TIMEOUT)
        try:
            self._chan.sendall(data)
        except (OSError, EOFError, paramiko.SSHException) as err:
            raise self._fail(f"send failed: {err or type(err).__name__}") from None

    def read(self, n: int, timeout: float) -> bytes:
        deadline = time.monotonic() + timeout
        out = bytearray()
        while len(out) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"no reply within {timeout:.1f} s")
            self._chan.settimeout(left)
            try:
                chunk = self._chan.recv(n - len(out))
            except TimeoutError:
                raise self._fail(f"no reply within {timeout:.1f} s") from None
            except (OSError, EOFError, paramiko.SSHException) as err:
                raise self._fail(f"connection lost: {err or type(err).__name__}") from None
            if not chunk:
                raise self._fail("the agent's channel closed (agent died, or the connection dropped)")
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
        # "signal" request in many setups (MEASURED.md §5): kill by pid over a second channel.
        if self.pid is not None and not self._chan.exit_status_ready():
            self._kill_pid(self.pid)
        self._chan.close()


class SshBoard:
    """A board reached over SSH: one connection, one long-lived agent per exec channel."""

    def __init__(self, config: SshBoardConfig, target: Target,
                 reconnect_delays: Sequence[float] = RECONNECT_DELAYS) -> None:  # fmt: skip
        self.config = config
        self.name = config.name
        self.target = target
        # qemu behind ssh: its wall time is emulated, so the board checks correctness only (docs/boards.md)
        self.cost_unit = CostUnit.NONE if config.wrapper else CostUnit.SECONDS
        self.reconnect_delays = tuple(reconnect_delays)
        self.timeout = HELLO_TIMEOUT  # hello wait, and the margin on each request's own deadline
        self._client: paramiko.SSHClient | None = None
        self._lock = threading.Lock()

    def client(self) -> paramiko.SSHClient:
        """The live connection, re-established with backoff if it dropped (auth/host-key errors: no retry)."""
        with self._lock:
            transport = self._client.get_transport() if self._client else None
            if transport is not None and transport.is_active():
                assert self._client is not None
                return self._client
            if self._client is not None:
                self._client.close()
                self._client = None
            for delay in (0.0, *self.reconnect_delays):
                time.sleep(delay)
                try:
                    self._client = connect(self.config)
                    return self._client
                except BoardError as err:
                    if "cannot connect" not in str(err):
                        raise  # host key or authentication: retrying cannot help
                    last = err
            raise last

    def agent_command(self) -> str:
        # `exec` replaces the login shell, so the hello pid is the agent's (or qemu's) own (MEASURED.md §4).
        return f"exec {self.config.wrapper} {shlex.quote(self.config.agent_path)}".replace("exec  ", "exec ")

    def open(self) -> AgentSession:
        channel = self._exec_channel(self.agent_command())
        pipe = SshTransport(channel, f"board {self.name} agent", self._kill_pid)
        session = AgentSession(pipe, timeout=self.timeout)
        pipe.pid = session.hello.pid
        return session

    def _exec_channel(self, command: str) -> paramiko.Channel:
        """A session channel running `command`; a connection found dead on the way is reopened once."""
        for attempt in (1, 2):
            try:
                transport = self.client().get_transport()
                assert transport is not None
                channel = transport.open_session(timeout=CONNECT_TIMEOUT)
                channel.exec_command(command)
                return channel
            except (OSError, EOFError, paramiko.SSHException) as err:
                self.close()  # the transport died between the liveness check and the open
                if attempt == 2:
                    why = str(err) or type(err).__name__
                    raise BoardError(f"board {self.name}: cannot start the agent: {why}") from None
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
            raise BoardError(f"board {self.name} has no recorded fingerprint ({err}); run "
                             f"`xtune deploy --board {self.name}`") from None  # fmt: skip
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
        raise BoardError(f"running `{cmd}` on the board failed: {exc or type(exc).__name__}") from None
    if status != 0:
        raise BoardError(f"`{cmd}` on the board exited with {status}: {err[-500:]}")
    return out


def fingerprint_cache(name: str) -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "xtune" / "boards" / f"{name}.json"


def _write_cache(name: str, data: dict[str, str]) -> None:
    path = fingerprint_cache(name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")


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
                f"{board.target.name} is {board.target.arch}; check `target` and `wrapper`"
            )
        fingerprint = _remote_fingerprint(client, board)
        remote = posixpath.join(board.config.workdir, FINGERPRINT_NAME)
        with client.open_sftp() as sftp, sftp.open(remote, "w") as f:
            f.write(json.dumps(fingerprint, indent=1) + "\n")
    except (OSError, EOFError, paramiko.SSHException) as err:
        raise BoardError(f"board {board.name}: deploy failed: {err or type(err).__name__}") from None
    finally:
        board.close()
    _write_cache(board.name, fingerprint)
    return {
        "board": board.name, "target": board.target.name, "agent": board.config.agent_path,
        "agent_version": agent_version(), "arch": hello.arch, "pid": hello.pid, "exec": hello.exec_method,
        "fingerprint": fingerprint, "seconds": round(time.perf_counter() - start, 3),
    }  # fmt: skip


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
