"""SSH connections: a board's config in, an authenticated paramiko client with a verified host key out,
or a BoardError whose kind says why not (docs/boards.md, "Host keys" and "Faults")."""

from __future__ import annotations

import contextlib
import socket
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import paramiko

from xtune.boards import known_hosts as hostkeys
from xtune.boards.config import SshBoardConfig
from xtune.errors import BoardError, BoardFault


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
        hostkeys.append(self.known_hosts, hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)


def connect(
    config: SshBoardConfig, timeout: float | None = None, accept_new_host_key: bool = False
) -> paramiko.SSHClient:
    """An authenticated client; host key verified against known_hosts. Errors never carry secrets.

    `timeout` (default: the board's connect_timeout) bounds the TCP connect, the SSH banner and key
    exchange, and authentication each: a port that accepts and never answers costs at most 2 of them."""
    timeout = config.connect_timeout if timeout is None else timeout
    end = resolve(config)
    where = f"{end.user + '@' if end.user else ''}{end.hostname}:{end.port}"
    sock = _tcp_connect(config, end, where, timeout)
    known_hosts = Path(config.known_hosts).expanduser()
    keys: Any = list(end.keys) or None  # paramiko takes a list of files; its type stubs say str
    client = paramiko.SSHClient()
    hostkeys.load(known_hosts, client.get_host_keys())
    client.set_missing_host_key_policy(_AcceptAndRecord(known_hosts) if accept_new_host_key else _Refuse())
    start = time.monotonic()
    try:
        client.connect(
            end.hostname,
            end.port,
            username=end.user,
            key_filename=keys,
            sock=sock,
            timeout=timeout,
            banner_timeout=timeout,
            auth_timeout=timeout,
            allow_agent=config.use_agent,
            look_for_keys=config.use_agent,
        )
        return client
    except (OSError, EOFError, paramiko.SSHException) as err:
        client.close()
        sock.close()
        waited = time.monotonic() - start >= timeout or _caused_by(err, TimeoutError)
        raise _handshake_error(config, err, where, end, known_hosts, timeout if waited else None) from None
    except BaseException:
        client.close()
        sock.close()
        raise


def _tcp_connect(config: SshBoardConfig, end: Endpoint, where: str, timeout: float) -> socket.socket:
    """The TCP connection, made here so that refused, unreachable and silent hosts are told apart."""
    fail = f"board {config.name}: cannot connect to {where}"
    try:
        sock = socket.create_connection((end.hostname, end.port), timeout=timeout)
    except TimeoutError:
        raise BoardError(f"{fail}: no TCP connection within {timeout:g} s", BoardFault.TIMEOUT) from None
    except UnicodeError:  # the IDNA codec refuses the host name: no retry can help
        raise BoardError(f"{fail}: not a valid host name", BoardFault.REFUSED, transient=False) from None
    except OSError as err:  # refused, no route, name not resolved (maybe not yet: transient too)
        raise BoardError(f"{fail}: {err.strerror or err}", BoardFault.REFUSED) from None
    # Without it every exec-channel open waits out Nagle + delayed ACK: 44 ms vs 5 ms measured.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _caused_by(err: BaseException, kind: type[BaseException]) -> bool:
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, kind):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _handshake_error(
    config: SshBoardConfig, err: Exception, where: str, end: Endpoint, known_hosts: Path, waited: float | None
) -> BoardError:
    """The typed BoardError for an SSH handshake that failed after the TCP connect."""
    name = config.name
    if isinstance(err, _UnknownHostKey):
        return BoardError(
            f"board {name}: host key of {end.known_hosts_name} ({err.key.get_name()} {_fp(err.key)}) "
            f"is not in {known_hosts}; if that fingerprint is right, run "
            f"`xtune deploy --board {name} --accept-new-host-key`",
            BoardFault.HOST_KEY,
        )
    if isinstance(err, paramiko.BadHostKeyException):
        return BoardError(
            f"board {name}: HOST KEY CHANGED for {end.known_hosts_name}: {known_hosts} has "
            f"{_fp(err.expected_key)}, the server offers {_fp(err.key)}; refusing to connect (someone may be "
            f"intercepting). If the board was reinstalled, remove the old key with "
            f"`ssh-keygen -R '{end.known_hosts_name}' -f {known_hosts}`",
            BoardFault.HOST_KEY,
        )
    if isinstance(err, paramiko.PasswordRequiredException):
        return BoardError(
            f"board {name}: key {config.key} is encrypted; add it to ssh-agent and set use_agent = true",
            BoardFault.AUTHENTICATION,
        )
    if isinstance(err, paramiko.AuthenticationException):
        keys = ", ".join(end.keys) or ("ssh-agent and default keys" if config.use_agent else "none")
        return BoardError(
            f"board {name}: authentication as {where} failed (keys: {keys})", BoardFault.AUTHENTICATION
        )
    if waited is not None:
        return BoardError(
            f"board {name}: {where} accepted the connection but gave no SSH handshake within {waited:g} s",
            BoardFault.TIMEOUT,
        )
    why = str(err) or type(err).__name__
    return BoardError(
        f"board {name}: connection to {where} lost during the SSH handshake: {why}", BoardFault.LOST
    )
