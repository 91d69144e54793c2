"""SSH and QEMU boards against the real thing: a private OpenSSH sshd on 127.0.0.1 started by a fixture,
the agent deployed over SFTP (native and under qemu-aarch64), host-key policy, fault isolation, a dropped
connection, and the QEMU instruction-count cost."""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from xtune.boards.agent import RunRequest
from xtune.boards.board import QemuBoard, get_board
from xtune.boards.cost import CostUnit
from xtune.boards.ssh import HELLO_TIMEOUT, SshBoard, deploy, load_boards
from xtune.cli import main
from xtune.errors import BoardError, InputError
from xtune.target import get_target
from xtune.templates import template_for
from xtune.tuning.database import TuningLog, make_record
from xtune.tuning.measure import MeasureOptions, Measurer, MeasureStatus, build_image
from xtune.workload import parse_workload

from .test_measure import HANG, SEGFAULT, configs, image_of

SSHD = "/usr/sbin/sshd"
pytestmark = [
    pytest.mark.board,
    pytest.mark.skipif(not (os.path.exists(SSHD) and shutil.which("ssh-keygen")), reason="needs sshd"),
]
FAST = MeasureOptions(number=1, repeat=2, min_repeat_ms=1.0, warmup=0, timeout_ms=1000)


def _keygen(path: Path) -> None:
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(path)], check=True)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateSshd:
    """An OpenSSH sshd of our own on 127.0.0.1: own config, host key, authorized key, log (MEASURED.md §4)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.host_key, self.client_key = root / "host_ed25519", root / "client_ed25519"
        for key in (self.host_key, self.client_key):
            if not key.exists():
                _keygen(key)
        (root / "authorized_keys").write_text((root / "client_ed25519.pub").read_text())
        self.port = _free_port()
        self.config = root / "sshd_config"
        self.config.write_text(
            f"Port {self.port}\nListenAddress 127.0.0.1\nHostKey {self.host_key}\nPidFile {root}/sshd.pid\n"
            f"AuthorizedKeysFile {root}/authorized_keys\nUsePAM no\nPasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\nStrictModes no\nSubsystem sftp internal-sftp\n"
            # sshd runs commands as `$SHELL -c`; SHLVL=1 keeps Debian's bash from sourcing ~/.bashrc
            # (270-360 ms per exec channel with pyenv there, MEASURED.md §4).
            "SetEnv SHLVL=1\nLogLevel VERBOSE\n"
        )
        self.known_hosts = root / "known_hosts"
        pub = (root / "host_ed25519.pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # the privilege-separation dir sshd insists on
        self.proc = subprocess.Popen([SSHD, "-D", "-f", str(self.config), "-E", str(self.root / "sshd.log")])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {(self.root / 'sshd.log').read_text()[-2000:]}")
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise RuntimeError("sshd did not start listening")

    def kill_all(self) -> None:
        """SIGKILL sshd and every process under it: per-connection sshd children call setsid(), so
        they are found through /proc, not by process group. Nothing it started survives."""
        if self.proc is None:
            return
        for pid in [*_descendants(self.proc.pid), self.proc.pid]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def boards_toml(self, name: str, target: str, wrapper: str = "", **extra: str) -> str:
        fields = {
            "host": "127.0.0.1", "port": self.port, "user": os.environ.get("USER") or _user(),
            "key": str(self.client_key), "target": target, "workdir": str(self.root / f"remote-{name}"),
            "known_hosts": str(self.known_hosts), "ssh_config": str(self.root / "no-ssh-config"),
            "wrapper": wrapper, **extra,
        }  # fmt: skip
        body = "\n".join(f"{k} = {v!r}".replace("'", '"') if isinstance(v, str) else f"{k} = {v}"
                         for k, v in fields.items())  # fmt: skip
        return f"[boards.{name}]\n{body}\n\n"


def _user() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def _descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateSshd]:
    root = tmp_path_factory.mktemp("sshd")
    server = PrivateSshd(root)
    other = root / "other_ed25519"
    _keygen(other)
    boards = root / "boards.toml"
    boards.write_text(
        server.boards_toml("ssh-native", "x86-avx2")
        + server.boards_toml("ssh-a72", "arm-a72-neon", wrapper="qemu-aarch64 -cpu cortex-a72")
        + server.boards_toml("ssh-wrongkey", "x86-avx2", key=str(other))
        + server.boards_toml("ssh-unknown", "x86-avx2", known_hosts=str(root / "empty_known_hosts"))
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("XDG_CACHE_HOME", str(root / "cache"))  # fingerprints and agents, not in ~/.cache
        server.start()
        try:
            yield server
        finally:
            server.kill_all()


def boards_file(server: PrivateSshd) -> Path:
    return server.root / "boards.toml"


def ssh_board(server: PrivateSshd, name: str) -> SshBoard:
    board = get_board(name, boards_file(server))
    assert isinstance(board, SshBoard)
    board.reconnect_delays = (0.1, 0.2)  # tests need not wait out the production backoff
    return board


@pytest.fixture(scope="session")
def native(sshd: PrivateSshd) -> SshBoard:
    board = ssh_board(sshd, "ssh-native")
    deploy(board)
    return board


def test_deploy_uploads_the_agent_and_records_the_fingerprint(sshd: PrivateSshd, native: SshBoard) -> None:
    result = deploy(native)
    assert result["arch"] == "x86_64" and result["target"] == "x86-avx2"
    fp = native.fingerprint()
    assert fp["board"] == "ssh-native" and int(fp["cores"]) >= 1 and fp["cpu"] and "Linux" in fp["uname"]
    assert (sshd.root / "remote-ssh-native" / "xtune-agent").stat().st_mode & 0o755 == 0o755
    assert (sshd.root / "remote-ssh-native" / "xtune-agent.json").is_file()
    with native.open() as session:
        assert session.hello.arch == "x86_64" and session.hello.pid > 0
    assert native.cost_unit is CostUnit.SECONDS


def test_ssh_config_supplies_hostname_port_user_and_key(sshd: PrivateSshd, tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host lab-pi\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {_user()}\n"
                      f"  IdentityFile {sshd.client_key}\n")  # fmt: skip
    boards = tmp_path / "boards.toml"
    boards.write_text(f'[boards.aliased]\nhost = "lab-pi"\ntarget = "x86-avx2"\n'
                      f'workdir = "{tmp_path}/remote"\nknown_hosts = "{sshd.known_hosts}"\n'
                      f'ssh_config = "{config}"\n')  # fmt: skip
    board = get_board("aliased", boards)
    assert isinstance(board, SshBoard)
    assert deploy(board)["arch"] == "x86_64"


def test_bad_boards_file_is_an_input_error(tmp_path: Path) -> None:
    boards = tmp_path / "boards.toml"
    boards.write_text('[boards.x]\nhost = "h"\ntarget = "x86-avx2"\npassword = "hunter2"\n')
    with pytest.raises(InputError, match="unknown keys password") as info:
        load_boards(boards)
    assert "hunter2" not in str(info.value)


def test_qemu_behind_ssh_measures_matmul_correctly(sshd: PrivateSshd) -> None:
    board = ssh_board(sshd, "ssh-a72")
    assert deploy(board)["arch"] == "aarch64"
    assert board.cost_unit is CostUnit.NONE  # qemu behind ssh: correctness only
    shape = "matmul:m=19,n=37,k=23"
    measurer = Measurer(board, parse_workload(shape), FAST)
    try:
        results = measurer.measure(configs(shape, board.target.name, 2, seed=5))
    finally:
        measurer.close()
        board.close()
    assert [r.status for r in results] == [MeasureStatus.OK] * 3, [r.error for r in results]


def test_unknown_host_key_is_refused_until_accepted_explicitly(sshd: PrivateSshd) -> None:
    board = ssh_board(sshd, "ssh-unknown")
    with pytest.raises(BoardError, match="--accept-new-host-key") as info:
        board.open()
    assert "SHA256:" in str(info.value) and "ssh-unknown" in str(info.value)
    assert deploy(board, accept_new_host_key=True)["arch"] == "x86_64"
    assert f"[127.0.0.1]:{sshd.port} ssh-ed25519 " in (sshd.root / "empty_known_hosts").read_text()
    with board.open() as session:  # now known: no flag needed
        assert session.hello.arch == "x86_64"
    board.close()


def test_changed_host_key_is_refused_naming_both_fingerprints(sshd: PrivateSshd, tmp_path: Path) -> None:
    _keygen(tmp_path / "impostor")
    pub = (tmp_path / "impostor.pub").read_text().split()
    wrong = tmp_path / "known_hosts"
    wrong.write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
    boards = tmp_path / "boards.toml"
    boards.write_text(sshd.boards_toml("ssh-changed", "x86-avx2", known_hosts=str(wrong)))
    board = get_board("ssh-changed", boards)
    assert isinstance(board, SshBoard)
    with pytest.raises(BoardError, match="HOST KEY CHANGED") as info:
        deploy(board, accept_new_host_key=True)  # the flag accepts NEW keys, never changed ones
    assert str(info.value).count("SHA256:") == 2


def test_wrong_client_key_is_a_clear_one_line_error(
    sshd: PrivateSshd, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(BoardError, match=r"authentication as .*@127\.0\.0\.1:\d+ failed"):
        ssh_board(sshd, "ssh-wrongkey").open()
    assert main(["deploy", "--board", "ssh-wrongkey", "--boards", str(boards_file(sshd))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("xtune: error: board ssh-wrongkey: authentication") and "Traceback" not in err


def test_crashing_and_hanging_candidates_are_statuses_over_ssh(native: SshBoard) -> None:
    wl = parse_workload("matmul:m=8,n=8,k=8")
    good = build_image(wl.key, "x86-avx2", template_for(wl, get_target("x86-avx2")).default_config().index)
    measurer = Measurer(native, wl, FAST)
    try:
        crashed, hung, after = (measurer.run(b) for b in (image_of(SEGFAULT), image_of(HANG), good))
    finally:
        measurer.close()
    assert crashed.status is MeasureStatus.RUNTIME_ERROR and "SIGSEGV" in crashed.error
    assert hung.status is MeasureStatus.TIMEOUT
    assert after.status is MeasureStatus.OK and after.cost > 0


def test_an_agent_that_stops_answering_is_killed_by_pid(native: SshBoard) -> None:
    wl = parse_workload("matmul:m=8,n=8,k=8")
    built = build_image(wl.key, "x86-avx2", template_for(wl, native.target).default_config().index)
    native.timeout = 1.0  # the host-side margin over the agent's own deadlines
    try:
        session = native.open()
        pid = session.hello.pid  # sshd is local here, so the "remote" pid is ours to inspect
        session.load_image(built.image)
        for slot, tensor in enumerate(wl.tensors()):
            session.set_buffer(slot, bytes(4 * math.prod(tensor.shape)))
        os.kill(pid, signal.SIGSTOP)  # frozen: alive but silent, as a wedged board process would be
        with pytest.raises(BoardError, match="no reply within"):
            session.run(RunRequest.check(built.entry_offset, (0, 1, 2), timeout_ms=200))
    finally:
        native.timeout = HELLO_TIMEOUT
    deadline = time.monotonic() + 5
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(pid), "the agent should have been killed over a second channel"
    with native.open() as fresh:  # and the board goes on
        assert fresh.hello.pid != pid


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_sshd_killed_mid_run_gives_board_errors_then_the_run_resumes(
    sshd: PrivateSshd, native: SshBoard, tmp_path: Path
) -> None:
    wl = parse_workload("matmul:m=16,n=16,k=16")
    space = template_for(wl, native.target).space
    indices = configs(wl.key, "x86-avx2", 3, seed=11)
    log = TuningLog(tmp_path / "log.jsonl")
    fingerprint = tuple(sorted(native.fingerprint().items()))

    def measure_and_log(batch: list[int]) -> list[MeasureStatus]:
        results = measurer.measure(batch)
        log.append([make_record(wl.key, "x86-avx2", native.name, space.config(i), r, FAST, fingerprint)
                    for i, r in zip(batch, results, strict=True)])  # fmt: skip
        return [r.status for r in results]

    measurer = Measurer(native, wl, FAST)
    try:
        assert measure_and_log(indices[:2]) == [MeasureStatus.OK] * 2
        sshd.kill_all()  # sshd and every session under it: the connection drops mid-run
        during = measurer.measure(indices[2:])
        log.append([make_record(wl.key, "x86-avx2", native.name, space.config(i), r, FAST, fingerprint)
                    for i, r in zip(indices[2:], during, strict=True)])  # fmt: skip
        sshd.start()
        done = log.measured(wl.key, "x86-avx2")  # resume: what is left is what failed on the board
        todo = [i for i in indices if i not in done]
        assert measure_and_log(todo) == [MeasureStatus.OK] * len(todo)
    finally:
        measurer.close()
        if sshd.proc is None:
            sshd.start()
    assert [r.status for r in during] == [MeasureStatus.BOARD_ERROR] * 2
    assert "cannot connect" in during[0].error and "127.0.0.1" in during[0].error
    assert todo == indices[2:]
    assert set(log.measured(wl.key, "x86-avx2")) == set(indices)
    assert all(dict(r.fingerprint)["agent"] for r in log.read())


def test_cli_boards_lists_ssh_boards_with_reachability(
    sshd: PrivateSshd, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["boards", "--boards", str(boards_file(sshd))]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "reachable" in lines["ssh-native"] and "unreachable" not in lines["ssh-native"]
    assert "correctness only" in lines["ssh-a72"]
    assert "unreachable: authentication" in lines["ssh-wrongkey"]
    assert set(load_boards(boards_file(sshd))) <= set(lines)


def test_cli_deploy_unknown_board_is_one_line(sshd: PrivateSshd, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["deploy", "--board", "nope", "--boards", str(boards_file(sshd))]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("xtune: error: unknown board 'nope'")
    assert "ssh-native" in err[0]


@pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="needs qemu-user")
def test_qemu_instruction_counts_are_deterministic_and_grow_with_work() -> None:
    board = get_board("qemu-aarch64")
    assert isinstance(board, QemuBoard) and board.cost_unit is CostUnit.INSTRUCTIONS
    costs = {}
    for shape in ("matmul:m=8,n=16,k=16", "matmul:m=16,n=16,k=16"):
        measurer = Measurer(board, parse_workload(shape), FAST)
        try:
            index = template_for(measurer.workload, board.target).default_config().index
            costs[shape] = measurer.measure([index, index])
        finally:
            measurer.close()
    small, big = costs.values()
    assert all(r.ok and r.cost_unit is CostUnit.INSTRUCTIONS and len(r.costs) == 1 for r in small + big)
    assert small[0].costs == small[1].costs and big[0].costs == big[1].costs  # exactly reproducible
    assert big[0].cost > 1.5 * small[0].cost > 0
