"""SSH and QEMU boards against the real thing: a private OpenSSH sshd on 127.0.0.1 started by a fixture,
the agent deployed over SFTP (native and under qemu-aarch64), host-key policy, fault isolation, a dropped
connection, and the QEMU instruction-count cost."""

from __future__ import annotations

import base64
import contextlib
import json
import math
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from unittest.mock import ANY

import pytest

from xtune.boards.agent import RunRequest
from xtune.boards.board import QemuBoard, get_board
from xtune.boards.cost import CostUnit
from xtune.boards.ssh import HELLO_TIMEOUT, SshBoard, deploy, load_boards
from xtune.cli import main
from xtune.errors import BoardError, BoardFault, InputError
from xtune.ops.registry import parse_workload, template_for
from xtune.target import get_target
from xtune.tuning.database import TuningLog, make_record
from xtune.tuning.measure import (
    Candidate,
    Measurer,
    MeasureResult,
    MeasureStatus,
    build_image,
)
from xtune.tuning.options import MeasureOptions
from xtune.tuning.ranking import measured

from .test_measure import HANG, SEGFAULT, configs, image_of
from .test_scheduler import tiny_model

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
    """A private OpenSSH sshd on 127.0.0.1: own config, host key, authorized key, log (docs/notes.md §4)."""

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
            # (270-360 ms per exec channel with pyenv there, docs/notes.md §4).
            "SetEnv SHLVL=1\nLogLevel VERBOSE\n"
        )
        self.known_hosts = root / "known_hosts"
        pub = (root / "host_ed25519.pub").read_text().split()
        self.known_hosts.write_text(f"[127.0.0.1]:{self.port} {pub[0]} {pub[1]}\n")
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # the privilege-separation dir sshd insists on
        log = self.root / "sshd.log"
        # This sshd's own "Server listening" line, not just an answer on the port: a port that something
        # else still holds would answer too, and the test would then talk to that.
        started = self._listening_lines(log)
        self.proc = subprocess.Popen([SSHD, "-D", "-f", str(self.config), "-E", str(log)])
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"sshd exited: {log.read_text()[-2000:]}")
            if self._listening_lines(log) > started:
                try:
                    socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                    return
                except OSError:
                    pass
            time.sleep(0.05)
        raise RuntimeError("sshd did not start listening")

    def _listening_lines(self, log: Path) -> int:
        text = log.read_text() if log.exists() else ""
        return text.count(f"Server listening on 127.0.0.1 port {self.port}.")

    def kill_all(self) -> None:
        """SIGKILL sshd and every process under it: per-connection sshd children call setsid(), so
        they are found through /proc, not by process group. Nothing it started survives.

        The tree is frozen (SIGSTOP) first, scanning again until no new process turns up: a connection
        that the listener accepted between a scan and its kill would otherwise live on as an orphan and
        serve a client that should have lost its board (a fresh-clone CI run saw a tuning run finish
        all its trials after the kill: docs/notes.md, §4)."""
        if self.proc is None:
            return
        frozen: set[int] = set()
        found = {self.proc.pid}
        while found:
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            frozen |= found
            time.sleep(0.01)  # a fork under way when its parent was stopped shows up in the next scan
            found = set(_descendants(self.proc.pid)) - frozen
        for pid in frozen:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait()
        self.proc = None

    def boards_toml(self, name: str, target: str, wrapper: str = "", **extra: str) -> str:
        fields = {
            "host": "127.0.0.1",
            "port": self.port,
            "user": os.environ.get("USER") or _user(),
            "key": str(self.client_key),
            "target": target,
            "workdir": str(self.root / f"remote-{name}"),
            "known_hosts": str(self.known_hosts),
            "ssh_config": str(self.root / "no-ssh-config"),
            "wrapper": wrapper,
            **extra,
        }
        body = "\n".join(
            f"{k} = {v!r}".replace("'", '"') if isinstance(v, str) else f"{k} = {v}"
            for k, v in fields.items()
        )
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
    config.write_text(
        f"Host lab-pi\n  HostName 127.0.0.1\n  Port {sshd.port}\n  User {_user()}\n"
        f"  IdentityFile {sshd.client_key}\n"
    )
    boards = tmp_path / "boards.toml"
    boards.write_text(
        f'[boards.aliased]\nhost = "lab-pi"\ntarget = "x86-avx2"\n'
        f'workdir = "{tmp_path}/remote"\nknown_hosts = "{sshd.known_hosts}"\n'
        f'ssh_config = "{config}"\n'
    )
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


@pytest.mark.host_runs("x86-avx2")
def test_crashing_and_hanging_candidates_are_statuses_over_ssh(native: SshBoard) -> None:
    wl = parse_workload("matmul:m=8,n=8,k=8")
    target = get_target("x86-avx2")
    default = template_for(wl, target).default_config().index
    good = build_image(Candidate(workload=wl, target=target, index=default))
    measurer = Measurer(native, wl, FAST)
    try:
        crashed, hung, after = (measurer.run(b) for b in (image_of(SEGFAULT), image_of(HANG), good))
    finally:
        measurer.close()
    assert crashed.status is MeasureStatus.RUNTIME_ERROR and "SIGSEGV" in crashed.error
    assert hung.status is MeasureStatus.TIMEOUT
    assert after.status is MeasureStatus.OK and after.cost > 0


@pytest.mark.host_runs("x86-avx2")
def test_an_agent_that_stops_answering_is_killed_by_pid(native: SshBoard) -> None:
    wl = parse_workload("matmul:m=8,n=8,k=8")
    index = template_for(wl, native.target).default_config().index
    built = build_image(Candidate(workload=wl, target=native.target, index=index))
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
    deadline = time.monotonic() + 30  # for a loaded machine; the wait ends as soon as the agent is gone
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


@pytest.mark.host_runs("x86-avx2")
def test_sshd_killed_mid_run_stops_the_measurer_then_a_resumed_run_measures_the_rest(
    sshd: PrivateSshd, native: SshBoard, tmp_path: Path
) -> None:
    wl = parse_workload("matmul:m=16,n=16,k=16")
    space = template_for(wl, native.target).space
    indices = configs(wl.key, "x86-avx2", 3, seed=11)
    log = TuningLog(tmp_path / "log.jsonl")
    fingerprint = tuple(sorted(native.fingerprint().items()))

    def measure_and_log(measurer: Measurer, batch: list[int]) -> list[MeasureStatus]:
        results = measurer.measure(batch)
        log.append(
            [
                make_record(wl.key, "x86-avx2", native.name, space.config(i), r, FAST, fingerprint)
                for i, r in zip(batch, results, strict=True)
            ]
        )
        return [r.status for r in results]

    measurer = Measurer(native, wl, FAST)
    try:
        assert measure_and_log(measurer, indices[:2]) == [MeasureStatus.OK] * 2
        sshd.kill_all()  # sshd and every session under it: the connection drops mid-run
        start = time.monotonic()
        during = measure_and_log(measurer, indices[2:])
        stopped_after = time.monotonic() - start
        assert measurer.measure(indices[:1]) == [MeasureResult(MeasureStatus.BOARD_ERROR, error=ANY)]
    finally:
        measurer.close()
    sshd.start()
    resumed = Measurer(native, wl, FAST)  # a resumed run: what is left is what failed on the board
    try:
        todo = [i for i in indices if i not in measured(log.read(), wl.key, "x86-avx2")]
        assert measure_and_log(resumed, todo) == [MeasureStatus.OK] * len(todo)
    finally:
        resumed.close()
    failure = measurer.failure
    assert failure is not None and failure.kind is BoardFault.REFUSED and not failure.transient
    assert str(failure).startswith("board ssh-native: ") and "gave up after 3 attempts" in str(failure)
    assert stopped_after < 10  # one retry of the candidate, 0.3 s of reconnect backoff: no minutes
    assert during == [MeasureStatus.BOARD_ERROR] * 2
    assert todo == indices[2:]
    assert set(measured(log.read(), wl.key, "x86-avx2")) == set(indices)
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


# ---- the CLI over a real SSH board (`--boards` for tune and bench) ---------------------------------------


def xtune_cli(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """`xtune ARGS` as a user runs it: a fresh interpreter, exit status, stdout and stderr."""
    return subprocess.run(
        [sys.executable, "-m", "xtune.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
        check=False,
    )


TINY = "matmul:m=8,n=8,k=8"
QUICK = ("--tuner", "random", "--batch-size", "2", "--repeat", "1", "--min-repeat-ms", "1", "--confirm", "0")


def test_cli_tune_and_bench_on_an_ssh_board_with_a_boards_file(
    sshd: PrivateSshd, native: SshBoard, tmp_path: Path
) -> None:
    log = tmp_path / "log.jsonl"
    boards = str(boards_file(sshd))
    tuned = xtune_cli(
        "tune",
        "--workload",
        TINY,
        "--board",
        "ssh-native",
        "--boards",
        boards,
        "--trials",
        "4",
        "--log",
        str(log),
        "--json",
        *QUICK,
    )
    assert tuned.returncode == 0, tuned.stderr
    report = json.loads(tuned.stdout)
    assert report["boards"] == ["ssh-native"] and report["counts"]["ok"] == 4 and report["stop"] == "trials"
    assert len(measured(TuningLog(log).read(), parse_workload(TINY).key, "x86-avx2")) == 4
    bench = xtune_cli("bench", "--workload", TINY, "--board", "ssh-native", "--boards", boards, "--json")
    assert bench.returncode == 0, bench.stderr
    assert json.loads(bench.stdout)["correct"] is True


def _one_error_line(out: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in out.stderr, out.stderr
    errors = [line for line in out.stderr.splitlines() if line.startswith("xtune: error:")]
    assert len(errors) == 1, out.stderr
    return errors[0]


@pytest.mark.parametrize("fault", ["wrong client key", "changed host key"])
def test_tune_and_bench_on_a_deployed_board_that_refuses_us_stop_at_once_with_exit_2(
    sshd: PrivateSshd, native: SshBoard, tmp_path: Path, fault: str
) -> None:
    # "ssh-native" is deployed (its fingerprint is cached), so the run starts and meets the fault at
    # its first measurement, as after a key rotation or a reinstall of the board.
    if fault == "wrong client key":
        extra, expect = {"key": str(sshd.root / "other_ed25519")}, "authentication as"
    else:
        _keygen(tmp_path / "impostor")
        pub = (tmp_path / "impostor.pub").read_text().split()
        (tmp_path / "known_hosts").write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
        extra, expect = {"known_hosts": str(tmp_path / "known_hosts")}, "HOST KEY CHANGED"
    boards = tmp_path / "boards.toml"
    boards.write_text(sshd.boards_toml("ssh-native", "x86-avx2", **extra))
    log = tmp_path / "log.jsonl"
    start = time.monotonic()
    tuned = _tune_on_ssh_native(boards, log, "--workload", TINY)
    assert tuned.returncode == 2 and time.monotonic() - start < 60
    line = _one_error_line(tuned)
    assert line.startswith("xtune: error: board ssh-native: ") and expect in line
    assert "board_failed" in tuned.stdout  # the summary says why it stopped
    records = TuningLog(log).read()
    assert 0 < len(records) < 8 and all(r.result.status is MeasureStatus.BOARD_ERROR for r in records)
    bench = xtune_cli("bench", "--workload", TINY, "--board", "ssh-native", "--boards", str(boards))
    assert bench.returncode == 2 and bench.stdout == ""
    assert expect in _one_error_line(bench)


def _tune_on_ssh_native(boards: Path, log: Path, *what: str) -> subprocess.CompletedProcess[str]:
    """`xtune tune` of `what` (--workload or --model) for 8 trials on the boards file's ssh-native."""
    return xtune_cli(
        "tune",
        *what,
        "--board",
        "ssh-native",
        "--boards",
        str(boards),
        "--trials",
        "8",
        "--log",
        str(log),
        *QUICK,
    )


def test_tune_model_on_a_deployed_board_that_refuses_us_stops_with_one_line_and_exit_2(
    sshd: PrivateSshd, native: SshBoard, tmp_path: Path
) -> None:
    # As `tune --workload` above: the model's first task meets the refusal, and the whole run stops.
    boards = tmp_path / "boards.toml"
    boards.write_text(sshd.boards_toml("ssh-native", "x86-avx2", key=str(sshd.root / "other_ed25519")))
    log, model = tmp_path / "log.jsonl", tiny_model(tmp_path / "tiny.onnx")
    tuned = _tune_on_ssh_native(boards, log, "--model", str(model))
    assert tuned.returncode == 2, tuned.stderr
    line = _one_error_line(tuned)
    assert line.startswith("xtune: error: board ssh-native: ") and "authentication as" in line
    assert "board_failed" in tuned.stdout  # the table's header says why it stopped
    records = TuningLog(log).read()
    assert 0 < len(records) < 8 and all(r.result.status is MeasureStatus.BOARD_ERROR for r in records)
    assert {r.workload for r in records} == {records[0].workload}  # no task after the failing one ran


def test_a_resumed_run_measures_every_board_error_config_first(
    sshd: PrivateSshd, native: SshBoard, tmp_path: Path
) -> None:
    wl = parse_workload(TINY)
    space = template_for(wl, native.target).space
    lost = configs(wl.key, "x86-avx2", 5, seed=3)
    fingerprint = tuple(sorted(native.fingerprint().items()))
    log = TuningLog(tmp_path / "log.jsonl")
    log.append(
        [
            make_record(
                wl.key,
                "x86-avx2",
                "ssh-native",
                space.config(i),
                MeasureResult(MeasureStatus.BOARD_ERROR, error="board ssh-native: lost"),
                FAST,
                fingerprint,
            )
            for i in lost
        ]
    )
    tuned = xtune_cli(
        "tune",
        "--workload",
        TINY,
        "--board",
        "ssh-native",
        "--boards",
        str(boards_file(sshd)),
        "--trials",
        str(len(lost)),
        "--log",
        str(log.path),
        *QUICK,
    )
    assert tuned.returncode == 0, tuned.stderr
    again = [r.index for r in log.read()[len(lost) :]]
    default = template_for(wl, native.target).default_config().index
    assert set(again) - {default} == set(lost) - {default} and len(again) == len(lost)
    assert set(measured(log.read(), wl.key, "x86-avx2")) >= set(lost)


# ---- boards.toml as a schema ---------------------------------------------------------------------------

_VALID = {"host": '"127.0.0.1"', "target": '"x86-avx2"'}
# One TOML value of every type, and the edges of the integers.
_WRONG = {
    "string": '"22"',
    "empty string": '""',
    "float": "22.5",
    "nan": "nan",
    "date": "1979-05-27",
    "datetime": "1979-05-27T07:32:00Z",
    "time": "07:32:00",
    "array": '["qemu-aarch64"]',
    "table": "{ a = 1 }",
    "bool": "true",
    "zero": "0",
    "negative": "-1",
    "huge int": str(2**70),
    "port-sized int": "70000",
}
_KEY_TYPES = {
    "host": "str",
    "target": "str",
    "port": "port",
    "user": "str",
    "key": "str",
    "workdir": "str",
    "wrapper": "str",
    "known_hosts": "str",
    "ssh_config": "str",
    "use_agent": "bool",
    "connect_timeout": "seconds",
}


def _accepted(key: str, value: str) -> bool:
    """Whether one of the _WRONG values is in fact valid for `key` (then it is not a case)."""
    kind = _KEY_TYPES[key]
    if kind == "str":
        return key != "target" and value.startswith('"') and (value != '""' or key == "wrapper")
    return (kind, value) in (("bool", "true"), ("seconds", "22.5"))


def _fuzz_cases() -> list[tuple[str, str, str]]:
    return [
        (key, name, value)
        for key in _KEY_TYPES
        for name, value in _WRONG.items()
        if not _accepted(key, value)
    ]


@pytest.mark.parametrize(("key", "what", "value"), _fuzz_cases())
def test_every_wrong_type_in_boards_toml_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], key: str, what: str, value: str
) -> None:
    table = {**_VALID, key: value}
    (tmp_path / "boards.toml").write_text("[boards.pi]\n" + "".join(f"{k} = {v}\n" for k, v in table.items()))
    assert main(["boards", "--boards", str(tmp_path / "boards.toml")]) == 2, what
    out = capsys.readouterr()
    assert out.out == ""
    lines = out.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"xtune: error: {tmp_path / 'boards.toml'}: board 'pi': {key} must be ")


@pytest.mark.parametrize(
    ("text", "expect"),
    [
        ('[boards.pi]\nhost = "h"\ntarget = "x86-avx2"\nport = 70000\n', "board 'pi': port must be"),
        ('[boards.pi]\nhost = "h"\ntarget = "x86-avx2"\nport = "22"\n', "board 'pi': port must be"),
        ('[boards.pi]\nhost = 1\ntarget = "x86-avx2"\n', "board 'pi': host must be"),
        ('[boards.pi]\nhost = "h"\ntarget = "arm-a72-neon"\nwrapper = ["qemu-aarch64"]\n', "wrapper must be"),
        ('[boards.pi]\nhost = "h"\ntarget = "x86-avx2"\nuse_agent = "yes"\n', "use_agent must be true or"),
        ('[boards.pi]\ntarget = "x86-avx2"\n', "board 'pi': missing required key 'host'"),
        ('[boards.pi]\nhost = "h"\n', "board 'pi': missing required key 'target'"),
        ('[boards.pi]\nhost = "h"\ntarget = "z80"\n', "target must be a target name"),
        ('[boards.local]\nhost = "h"\ntarget = "x86-avx2"\n', "board 'local' clashes with a built-in"),
        ('[boards.qemu-pi]\nhost = "h"\ntarget = "x86-avx2"\n', "board 'qemu-pi' clashes with a built-in"),
        ('[boards."../../etc"]\nhost = "h"\ntarget = "x86-avx2"\n', "board name '../../etc' must be"),
        ('[board.pi]\nhost = "h"\ntarget = "x86-avx2"\n', "stray top-level table [board]"),
        ('host = "h"\n[boards.pi]\nhost = "h"\ntarget = "x86-avx2"\n', "stray top-level key 'host'"),
        ("boards = 1\n", "'boards' must be tables"),
        ('[boards]\npi = "h"\n', "board 'pi' must be a table"),
        ('[boards.pi]\nhost = "h\\nx"\ntarget = "x86-avx2"\n', "host must be"),
        ('[boards.pi]\nhost = "' + "a" * 70 + '.lab"\ntarget = "x86-avx2"\n', "host must be"),
    ],
)
def test_boards_toml_mistakes_from_the_issue_name_the_board_and_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, expect: str
) -> None:
    """In-process, as the type fuzz above: the command line's own exit path (a fresh interpreter, its
    status) is the same for every mistake and is run once, in the test below."""
    (tmp_path / "boards.toml").write_text(text)
    assert main(["boards", "--boards", str(tmp_path / "boards.toml")]) == 2
    out = capsys.readouterr()
    assert out.out == "" and "Traceback" not in out.err
    lines = out.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("xtune: error:") and expect in lines[0], out.err


def test_a_boards_toml_mistake_is_one_line_and_exit_2_from_a_fresh_interpreter(tmp_path: Path) -> None:
    (tmp_path / "boards.toml").write_text('[boards.pi]\nhost = "h"\ntarget = "x86-avx2"\nport = 70000\n')
    out = xtune_cli("boards", "--boards", str(tmp_path / "boards.toml"))
    assert out.returncode == 2 and out.stdout == ""
    assert "board 'pi': port must be" in _one_error_line(out) and len(out.stderr.strip().splitlines()) == 1


def test_valid_boards_toml_values_are_kept(tmp_path: Path) -> None:
    (tmp_path / "boards.toml").write_text(
        '[boards.pi]\nhost = "pi.lab"\ntarget = "arm-a72-neon"\nport = 2222\n'
        'use_agent = true\nconnect_timeout = 2\nworkdir = "~/x"\n'
    )
    config = load_boards(tmp_path / "boards.toml")["pi"]
    assert (config.port, config.use_agent, config.connect_timeout, config.workdir) == (2222, True, 2.0, "x")


# ---- known_hosts as OpenSSH handles it -----------------------------------------------------------------


def test_accepting_a_new_host_key_starts_a_new_line_in_known_hosts(sshd: PrivateSshd, tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("# the user's own file, its last line without a newline")
    boards = tmp_path / "boards.toml"
    boards.write_text(sshd.boards_toml("ssh-nl", "x86-avx2", known_hosts=str(known)))
    board = get_board("ssh-nl", boards)
    assert isinstance(board, SshBoard)
    deploy(board, accept_new_host_key=True)
    lines = known.read_text().splitlines()
    assert lines[0] == "# the user's own file, its last line without a newline"
    assert lines[1].startswith(f"[127.0.0.1]:{sshd.port} ssh-ed25519 ") and len(lines) == 2
    assert deploy(board)["arch"] == "x86_64"  # the key is known now: no flag needed


def test_malformed_known_hosts_lines_are_skipped_with_a_warning(sshd: PrivateSshd, tmp_path: Path) -> None:
    good = sshd.known_hosts.read_text().strip()
    key = good.split()[2]
    salt = base64.b64encode(bytes(20)).decode()
    bad = [
        f"|1|abc=|def= ssh-ed25519 {key}",  # hashed, salt and hash too short: paramiko asserted on it
        f"|1|{salt}|!!! ssh-ed25519 {key}",  # hashed, not base64
        f"|2|{salt}|{salt} ssh-ed25519 {key}",  # hashed with an unknown scheme
        "pi.lab ssh-ed25519",  # two fields
        "pi.lab ssh-ed25519 %%%not-base64%%%",
        f"pi.lab ssh-ed25519 {base64.b64encode(b'garbage').decode()}",  # base64 of no key
        f"@cert-authority *.lab ssh-ed25519 {key}",
    ]
    hashed = tmp_path / "hashed"  # the good entry as `ssh-keygen -H` hashes it (HashKnownHosts yes)
    hashed.write_text(good + "\n")
    subprocess.run(["ssh-keygen", "-H", "-f", str(hashed)], check=True, capture_output=True)
    assert hashed.read_text().startswith("|1|")
    known = tmp_path / "known_hosts"
    known.write_text("\n".join(bad) + f"\n# comment\n\n{hashed.read_text()}")
    boards = tmp_path / "boards.toml"
    boards.write_text(sshd.boards_toml("ssh-kh", "x86-avx2", known_hosts=str(known)))
    listed = xtune_cli("boards", "--boards", str(boards))
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    assert "ssh-kh" in listed.stdout and "unreachable" not in listed.stdout
    warned = [line for line in listed.stderr.splitlines() if line.startswith("xtune: warning:")]
    assert [w.split(":")[3] for w in warned] == [str(n) for n in range(1, len(bad) + 1)]
    assert all(f"{known}:" in w and "malformed known_hosts line" in w for w in warned)
    deployed = xtune_cli("deploy", "--board", "ssh-kh", "--boards", str(boards))
    assert deployed.returncode == 0 and "Traceback" not in deployed.stderr, deployed.stderr
    assert len(known.read_text().splitlines()) == len(bad) + 3  # nothing appended, nothing rewritten


def test_an_agent_removed_from_the_board_is_agent_gone_not_a_retry(sshd: PrivateSshd, tmp_path: Path) -> None:
    boards = tmp_path / "boards.toml"
    boards.write_text(sshd.boards_toml("ssh-gone", "x86-avx2", workdir=str(tmp_path / "remote")))
    board = get_board("ssh-gone", boards)
    assert isinstance(board, SshBoard)
    deploy(board)
    (tmp_path / "remote" / "xtune-agent").unlink()  # the board was wiped: the connection still works
    try:
        with pytest.raises(BoardError, match=r"No such file.*xtune deploy --board ssh-gone") as info:
            board.open()
    finally:
        board.close()
    assert info.value.kind is BoardFault.AGENT_GONE and not info.value.transient
