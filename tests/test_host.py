"""The host: one reading of its architecture and CPU flags answers every question about it — which agent
to build natively, which target it is, which targets the local board may run."""

from __future__ import annotations

import platform
import shutil

import pytest

from xtune import target as target_module
from xtune.boards.agent_build import compiler_command
from xtune.boards.board import get_board, local_target
from xtune.errors import InputError
from xtune.target import get_target, host_cannot_run, host_cpu, host_target

PI4 = "processor\t: 0\nFeatures\t: fp asimd evtstrm crc32 cpuid\nCPU implementer\t: 0x41\nCPU part\t: 0xd08\n"
ZEN3_NO_AVX512 = "processor\t: 0\nflags\t\t: fpu sse sse2 sse4_1 sse4_2 popcnt avx avx2 fma f16c bmi1 bmi2\n"
AVX2_FLAGS = "fpu sse sse2 sse4_1 sse4_2 popcnt avx avx2 fma f16c bmi1 bmi2"
AVX512_FLAGS = f"{AVX2_FLAGS} avx512f avx512vl avx512bw avx512dq avx512cd"
K1 = "processor\t: 0\nisa\t\t: rv64imafdcv_zicsr_zifencei\n"


def _pretend(monkeypatch: pytest.MonkeyPatch, machine: str, cpuinfo: str) -> None:
    monkeypatch.setattr(platform, "machine", lambda: machine)
    monkeypatch.setattr(target_module, "_host_cpuinfo", lambda: cpuinfo)


def test_an_arm64_host_is_aarch64_everywhere(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend(monkeypatch, "arm64", PI4)  # macOS spells it arm64
    host = host_cpu()
    assert (host.machine, host.arch) == ("arm64", "aarch64") and "asimd" in host.flags
    assert host_target().name == "arm-a72-neon"
    assert host_cannot_run(get_target("arm-a53-neon")) is None  # +neon,+fp-armv8,+crc: asimd, fp, crc32
    assert "arm64" in str(host_cannot_run(get_target("x86-avx2")))
    assert local_target("arm-a53-neon").name == "arm-a53-neon"
    with pytest.raises(InputError, match="cannot run x86-sse42"):
        get_board("local", target="x86-sse42")
    # The agent for the host's own arch is built with the native compiler, any other with a cross one.
    native = shutil.which("gcc") or shutil.which("cc")
    if native is not None:
        assert compiler_command("aarch64") == [native]
    if cross := shutil.which("x86_64-linux-gnu-gcc"):
        assert compiler_command("x86_64") == [cross]


def test_an_x86_host_runs_the_targets_its_flags_cover(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend(monkeypatch, "x86_64", ZEN3_NO_AVX512)
    assert host_target().name == "x86-avx2"
    assert host_cannot_run(get_target("x86-sse42")) is None
    why = str(host_cannot_run(get_target("x86-avx512")))
    assert "avx512f" in why and "avx2" not in why.replace("avx512", "")
    assert "aarch64" in str(host_cannot_run(get_target("arm-a72-neon")))
    with pytest.raises(InputError, match="lacks avx512f"):
        local_target("x86-avx512")


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        (f"{AVX512_FLAGS} avx512_vnni", "x86-avx512-vnni"),  # Ice Lake-SP and later, Zen 4 and 5
        (AVX512_FLAGS, "x86-avx512"),  # Skylake-SP
        (f"{AVX2_FLAGS} avx_vnni", "x86-avx2-vnni"),  # Alder Lake
        (AVX2_FLAGS, "x86-avx2"),
    ],
)
def test_an_x86_host_with_vnni_gets_the_vnni_target(
    monkeypatch: pytest.MonkeyPatch, flags: str, expected: str
) -> None:
    _pretend(monkeypatch, "x86_64", f"processor\t: 0\nflags\t\t: {flags}\n")
    assert host_target().name == expected


def test_a_riscv_host_reads_its_isa_letters(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend(monkeypatch, "riscv64", K1)
    assert host_cpu().flags >= {"i", "m", "a", "f", "d", "c", "v"}
    assert host_target().name == "riscv64-gcv"
    # +zvl256b is no ISA letter, but the host's own target always qualifies; the scalar one does too.
    assert (
        host_cannot_run(get_target("riscv64-gcv")) is None
        and host_cannot_run(get_target("riscv64-gc")) is None
    )
    _pretend(monkeypatch, "riscv64", K1.replace("fdcv", "fdc"))
    assert host_target().name == "riscv64-gc"
    assert (
        host_cannot_run(get_target("riscv64-gcv"))
        == "this host's CPU lacks v, zvl256b, which target riscv64-gcv needs"
    )


def test_an_unknown_architecture_is_refused_with_its_name(monkeypatch: pytest.MonkeyPatch) -> None:
    _pretend(monkeypatch, "ppc64le", "")
    with pytest.raises(InputError, match="ppc64le"):
        host_target()
    assert "ppc64le" in str(host_cannot_run(get_target("x86-avx2")))
