"""The ARM peers' harness (xtune/tuning/arm_peers.py, benchmarks/arm_peers.py, arm_cycles.py): the emulated
core's /proc/cpuinfo reads like a real one, the children's block records subtract, and ONNX Runtime's
aarch64 build under qemu-aarch64 computes what ONNX Runtime computes on this host, with an instruction
count per inference that repeats and grows with the work, and a cycle estimate beside it."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from arm_cycles import executable_mappings, extra_runs, peer_model, records
from arm_peers import check_peer, per_inference, run_peer

from tests.conftest import NO_ARM_PEERS
from xtune.boards.cycles import MCA_TIMEOUT_S, BlockRun, find_llvm_tools
from xtune.errors import InputError, XtuneError
from xtune.ops.registry import parse_workload
from xtune.target import get_target
from xtune.tuning.arm_peers import CORES, arm64_root, cpuinfo_text, peers_built, runtime_for
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


def test_fewer_than_one_pair_of_children_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="pairs must be at least 1"):
        run_peer(tmp_path / "model.onnx", pairs=0)


def test_a_missing_root_says_how_to_build_it(tmp_path: Path) -> None:
    with pytest.raises(XtuneError, match=r"scripts/arm_peers\.sh"):
        arm64_root(tmp_path)


MAPS = """400000-916000 r-xp 00000000 fe:00 5326061    /root/usr/bin/python3.11
930000-a5f000 rw-p 00520000 fe:00 5326061    /root/usr/bin/python3.11
a5f000-a80000 rw-p 00000000 00:00 0          [heap]
55009a0000-5500b2c000 r-xp 00000000 fe:00 5325077   /root/lib/aarch64-linux-gnu/libc.so.6
5501000000-5501010000 r-xp 00000000 00:00 0
"""


def test_only_file_backed_code_is_mapped_for_costing() -> None:
    found = executable_mappings(MAPS)
    assert [(m.start, m.end, m.offset, m.path) for m in found] == [
        (0x400000, 0x916000, 0, "/root/usr/bin/python3.11"),
        (0x55009A0000, 0x5500B2C000, 0, "/root/lib/aarch64-linux-gnu/libc.so.6"),
    ]


def _block(vaddr: int, insns: int, execs: int, repeats: int = 0) -> BlockRun:
    return BlockRun(vaddr=vaddr, size=4 * insns, insns=insns, execs=execs, repeats=repeats)


def test_the_second_childs_extra_block_runs() -> None:
    """A block is its address and length; unchanged blocks drop out, a block new to one child counts whole."""
    fewer = [_block(0x1000, 4, 10, 2), _block(0x2000, 3, 5), _block(0x3000, 2, 7)]
    more = [_block(0x1000, 4, 30, 12), _block(0x2000, 3, 5), _block(0x1000, 2, 4), _block(0x3000, 2, 6)]
    assert extra_runs(fewer, more) == [_block(0x1000, 2, 4), _block(0x1000, 4, 20, 10), _block(0x3000, 2, -1)]


def test_plugin_records_by_process() -> None:
    counts, blocks = records([b"7 b 1000 16 4 3 1", b"7 120", b"8 b 2000 8 2 1 0", b"8 60", b"9 0"])
    assert counts == {7: 120, 8: 60, 9: 0}
    assert blocks[7] == [_block(0x1000, 4, 3, 1)] and blocks[8] == [_block(0x2000, 2, 1)] and 9 not in blocks
    with pytest.raises(XtuneError, match="out of memory"):
        records([b"7 lost"])


@pytest.mark.skipif(find_llvm_tools() is None, reason="needs llvm-mca-NN (scripts/setup.sh)")
def test_the_instructions_counted_stand_when_the_cycles_cannot_be_had(tmp_path: Path) -> None:
    """Two children of one pair, their blocks at an address no file maps: no bytes to cost, so no cycles
    and the reason; the instruction count per inference (the difference over 2) is kept."""
    counts, maps = tmp_path / "counts.txt", tmp_path / "maps.txt"
    counts.write_bytes(b"7 b 1000 16 4 3 0\n7 100\n8 b 1000 16 4 9 0\n8 300\n")
    maps.write_text(MAPS)
    a72 = get_target("arm-a72-neon")
    instructions, cycles, why = per_inference(counts, [7, 8], maps, a72)
    assert (instructions, cycles) == (100, None) and "ran outside every mapped file" in why
    assert per_inference(counts, [7, 8], maps, None) == (100, None, "")
    # A runtime's blocks, thousands, are costed in one llvm-mca process: a longer guard than a kernel's.
    assert peer_model(a72).timeout_s > MCA_TIMEOUT_S and peer_model(a72).skip_unscheduled


def _write(workload: str, path: Path) -> Path:
    onnx.save_model(onnx_model(parse_workload(workload)), path)
    return path


@pytest.mark.board
@pytest.mark.slow
def test_onnxruntime_aarch64_under_qemu_matches_x86_and_counts(tmp_path: Path) -> None:
    """Three emulated runs of two small convolutions (about 40 s; the larger with one pair of children):
    outputs equal to x86 ONNX Runtime's, the count per inference the same run to run (to 0.5 %), with the
    block-recording plugin too, and four times the multiply-adds costing more than twice the instructions,
    never fewer than one NEON FMA per four of them; llvm-mca's Cortex-A72 model, which issues at most 3
    instructions a cycle, gives at least a cycle per 3 instructions."""
    if not peers_built():
        pytest.skip(NO_ARM_PEERS)
    small, large = _write(SMALL, tmp_path / "small.onnx"), _write(LARGE, tmp_path / "large.onnx")
    first = run_peer(small, "cortex-a72")
    assert first.runtime.value == "onnxruntime" and first.version
    assert check_peer(first, small) == ""
    # Two processes' heaps differ a little at the fork, and libc's allocator with them (docs/arm-peers.md).
    again = run_peer(small, "cortex-a72", cycles=get_target("arm-a72-neon"))
    assert again.instructions == pytest.approx(first.instructions, rel=0.005) and first.cycles is None
    assert again.cycles is not None and again.cycles >= again.instructions / 3
    macs = 28 * 28 * 32 * 16 * 9
    assert first.instructions >= macs / 4
    bigger = run_peer(large, "cortex-a72", pairs=1)  # one pair: 5 inferences instead of 13
    assert check_peer(bigger, large) == ""
    assert bigger.instructions > 2 * first.instructions
