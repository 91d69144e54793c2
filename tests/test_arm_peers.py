"""The ARM peers' harness (benchmarks/arm_peers.py): the emulated core's /proc/cpuinfo reads like a real
one, and ONNX Runtime's aarch64 build under qemu-aarch64 computes what ONNX Runtime computes on this host,
with an instruction count per inference that repeats and grows with the work."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from arm_peers import CACHE, CORES, arm64_root, check_peer, cpuinfo_text, run_peer, runtime_for

from xtune.errors import InputError, XtuneError
from xtune.ops.registry import parse_workload
from xtune.tuning.peers import onnx_model

# A Raspberry Pi 4's first entry (Cortex-A72, Linux 6.1 arm64), but for BogoMIPS (its timer runs at 54 MHz).
PI4 = """processor\t: 0
BogoMIPS\t: 108.00
Features\t: fp asimd evtstrm crc32 cpuid
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x0
CPU part\t: 0xd08
CPU revision\t: 3
"""
PI4_HWCAP = 1 << 0 | 1 << 1 | 1 << 2 | 1 << 7 | 1 << 11  # fp asimd evtstrm crc32 cpuid

SMALL = "conv2d:n=1,c=16,h=28,w=28,k=32,r=3,s=3,pad=1,bias=1,relu=1"
LARGE = "conv2d:n=1,c=16,h=56,w=56,k=32,r=3,s=3,pad=1,bias=1,relu=1"  # 4x the multiply-adds


def test_cpuinfo_reads_like_a_real_cortex_a72() -> None:
    text = cpuinfo_text(CORES["cortex-a72"], PI4_HWCAP, 0, 2)
    entries = text.split("\n\n")
    assert entries[-1] == "" and len(entries) == 3
    assert [line for line in entries[0].splitlines() if not line.startswith("BogoMIPS")] == [
        line for line in PI4.splitlines() if not line.startswith("BogoMIPS")
    ]
    assert entries[1].startswith("processor\t: 1\n")


def test_cortex_a76_fields() -> None:
    fields = dict(
        line.split(":", 1)
        for line in cpuinfo_text(CORES["cortex-a76"], 1 << 20, 1 << 1, 1).splitlines()
        if line
    )
    assert fields["CPU variant\t"].strip() == "0x4" and fields["CPU part\t"].strip() == "0xd0b"
    assert fields["Features\t"].split() == ["asimddp", "sve2"]  # AT_HWCAP's names first, then AT_HWCAP2's


def test_a_model_the_peers_cannot_run_is_an_input_error() -> None:
    with pytest.raises(InputError, match=r"\.onnx.*\.tflite"):
        runtime_for(Path("model.pb"))


def test_a_missing_root_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(XtuneError, match=r"scripts/arm_peers\.sh"):
        arm64_root(tmp_path)


def _write(workload: str, path: Path) -> Path:
    onnx.save_model(onnx_model(parse_workload(workload)), path)
    return path


@pytest.mark.board
@pytest.mark.slow
def test_onnxruntime_aarch64_under_qemu_matches_x86_and_counts(tmp_path: Path) -> None:
    """Three emulated runs of two small convolutions (about 30 s): outputs equal to x86 ONNX Runtime's,
    the count per inference the same run to run (to 0.5 %), and four times the multiply-adds costing more than
    twice the instructions, never fewer than one NEON FMA per four of them."""
    if not (CACHE / "root" / ".complete").is_file():
        pytest.skip(
            "no arm64 Python with the ARM peers: bash scripts/arm_peers.sh (scripts/setup.sh runs it)"
        )
    small, large = _write(SMALL, tmp_path / "small.onnx"), _write(LARGE, tmp_path / "large.onnx")
    first = run_peer(small, "cortex-a72")
    assert first.runtime.value == "onnxruntime" and first.version
    assert check_peer(first, small) == ""
    # Two processes' heaps differ a little at the fork, and libc's allocator with them (docs/arm-peers.md).
    assert run_peer(small, "cortex-a72").instructions == pytest.approx(first.instructions, rel=0.005)
    macs = 28 * 28 * 32 * 16 * 9
    assert first.instructions >= macs / 4
    bigger = run_peer(large, "cortex-a72")
    assert check_peer(bigger, large) == ""
    assert bigger.instructions > 2 * first.instructions
