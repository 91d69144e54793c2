"""The cycle cost of emulated boards: the block arithmetic on made-up llvm-mca output, then the real plugin
and the real llvm-mca under qemu-user, and the one-line refusals when the model cannot be had."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import CliRunner
from xtune.boards import board as board_module
from xtune.boards.board import CycleCountingSession, QemuBoard, get_board
from xtune.boards.cost import CostUnit
from xtune.boards.cycles import (
    BlockCycles,
    BlockRun,
    CycleModel,
    Region,
    block_cycles,
    block_summary,
    find_llvm_tools,
    mca_source,
    parse_block_line,
    region_cycles,
    riscv_vtype_prefixes,
    run_cost,
    split_disassembly,
    total_cycles,
)
from xtune.cli import main
from xtune.errors import BoardError, BoardFault
from xtune.ops.registry import parse_workload, template_for
from xtune.target import get_target, load_targets
from xtune.tuning.measure import Measurer
from xtune.tuning.options import MeasureOptions

HAVE_MCA = find_llvm_tools() is not None

# ---- the arithmetic, on made-up tool output -------------------------------------------------------------


def test_every_run_of_a_block_pays_its_throughput() -> None:
    loop = BlockRun(vaddr=0x1000, size=28, insns=7, execs=100, repeats=90)  # entered 10 times
    once = BlockRun(vaddr=0x2000, size=8, insns=2, execs=10, repeats=0)
    cycles = [BlockCycles(latency=19.0, throughput=4.0), BlockCycles(latency=5.0, throughput=1.5)]
    assert run_cost(loop, cycles[0]) == 100 * 4.0
    assert total_cycles([loop, once], cycles) == 100 * 4.0 + 10 * 1.5
    summary = block_summary([loop, once], cycles)
    assert summary["cycles"] == total_cycles([loop, once], cycles)
    assert summary["entry_latency"] == 10 * 19.0 + 90 * 4.0 + 10 * 5.0
    assert summary["latency_only"] == 100 * 19.0 + 10 * 5.0


def test_latency_and_throughput_come_from_one_and_many_iterations() -> None:
    # What `llvm-mca --json` prints, cut to the fields read: two regions at 1 and at 100 iterations.
    def fake(totals: list[int]) -> str:
        regions = [{"Name": f"b{i}", "SummaryView": {"TotalCycles": t}} for i, t in enumerate(totals)]
        return json.dumps({"CodeRegions": regions})

    single, steady = region_cycles(fake([19, 7]), 2), region_cycles(fake([415, 205]), 2)
    first, second = block_cycles(single, steady, 100)
    assert first == BlockCycles(latency=19.0, throughput=4.0)
    assert second == BlockCycles(latency=7.0, throughput=2.0)
    with pytest.raises(ValueError, match="1 regions for 2 blocks"):
        region_cycles(fake([3]), 2)


def test_disassembly_splits_by_qemus_instruction_counts() -> None:
    # llvm-mc --show-encoding output; x86 re-encodes a jump shorter than the original (a fixup line).
    text = (
        "\tvmovaps\t(%rdi), %ymm0                   # encoding: [0xc5,0xfc,0x28,0x07]\n"
        "\taddq\t$32, %rdi                       # encoding: [0x48,0x83,0xc7,0x20]\n"
        "\tjne\t-10                             # encoding: [0x75,A]\n"
        "                                        #   fixup A - offset: 1, value: -10, kind: FK_PCRel_1\n"
        "\tretq                                    # encoding: [0xc3]\n"
    )
    first, second = split_disassembly(text, [3, 1])
    assert first == ("\tvmovaps\t(%rdi), %ymm0", "\taddq\t$32, %rdi", "\tjne\t-10")
    assert second == ("\tretq",)
    with pytest.raises(ValueError, match="4 instructions decoded where QEMU ran 5"):
        split_disassembly(text, [3, 2])
    arm = "\tmov\tx0, #1                          // =0x1 // encoding: [0x20,0x00,0x80,0xd2]\n"
    assert split_disassembly(arm, [1]) == [("\tmov\tx0, #1",)]


def test_a_riscv_block_runs_with_the_vector_type_set_before_it() -> None:
    blocks = [("\tvsetvli\tt0, zero, e32, m2, ta, ma", "\tvle32.v\tv8, (a0)"), ("\tvfmacc.vf\tv16, fa0, v8",)]
    prefixes = riscv_vtype_prefixes([0x40, 0x80], blocks)
    assert prefixes[1] == ("# LLVM-MCA-RISCV-LMUL M2", "# LLVM-MCA-RISCV-SEW E32")
    assert prefixes[0] == prefixes[1]  # nothing before the first: the kernel's first setting
    assert riscv_vtype_prefixes([0], [("\taddi\ta0, a0, 1",)]) == [()]
    source = mca_source([Region(asm=blocks[1], prefix=prefixes[1])], "#")
    assert source.splitlines() == [
        *prefixes[1],
        "# LLVM-MCA-BEGIN b0",
        "\tvfmacc.vf\tv16, fa0, v8",
        "# LLVM-MCA-END b0",
    ]


def test_the_plugins_block_line_reads_back() -> None:
    words = b"4242 b 5500815094 28 7 57344 49152".split()
    assert parse_block_line(words) == BlockRun(
        vaddr=0x5500815094, size=28, insns=7, execs=57344, repeats=49152
    )


def test_the_newest_versioned_llvm_mca_with_its_llvm_mc_is_found(tmp_path: Path) -> None:
    for name in ("llvm-mca-19", "llvm-mc-19", "llvm-mca-23", "llvm-mca", "llvm-mc"):  # 23 lacks its llvm-mc
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    tools = find_llvm_tools(str(tmp_path))
    assert tools is not None and tools.version == 19 and tools.mca.endswith("llvm-mca-19")
    assert find_llvm_tools(str(tmp_path / "nowhere")) is None


# ---- the real plugin and llvm-mca under qemu-user ---------------------------------------------------------

CYCLE_BOARDS = [
    pytest.param(name, id=name, marks=pytest.mark.board)
    for name in ("qemu-aarch64-cycles", "qemu-riscv64-cycles", "qemu-riscv64-v-cycles")
]


@pytest.mark.skipif(not HAVE_MCA, reason="needs llvm-mca-NN (scripts/setup.sh)")
@pytest.mark.parametrize("name", CYCLE_BOARDS)
def test_cycle_estimates_are_deterministic_checked_and_grow_with_the_loop_trips(name: str) -> None:
    board = get_board(name)
    if shutil.which(board.target.qemu_binary) is None:
        pytest.skip(f"needs {board.target.qemu_binary}")
    assert board.cost_unit is CostUnit.CYCLES
    costs = []
    for k in (64, 128):  # twice the k loop's trips
        measurer = Measurer(board, parse_workload(f"matmul:m=16,n=16,k={k}"), MeasureOptions())
        try:
            index = template_for(measurer.workload, board.target).default_config().index
            results = measurer.measure([index, index])
            session = measurer.session()
            assert isinstance(session, CycleCountingSession) and session.last_blocks
            assert session.last_insn_count == sum(b.insns * b.execs for b in session.last_blocks)
        finally:
            measurer.close()
        # OK means the output matched numpy; the cost is the estimate, the same both times.
        assert all(r.ok and r.cost_unit is CostUnit.CYCLES and len(r.costs) == 1 for r in results)
        assert results[0].costs == results[1].costs
        costs.append(results[0].cost)
    assert 1.8 < costs[1] / costs[0] < 2.1, costs


@pytest.mark.skipif(not HAVE_MCA, reason="needs llvm-mca-NN (scripts/setup.sh)")
def test_every_target_names_a_model_the_installed_llvm_mca_has() -> None:
    for target in load_targets().values():
        assert QemuBoard("q", target, CostUnit.CYCLES).problem() is None, target.name


# ---- the refusals, one line each, before any work --------------------------------------------------------


def tune_args(tmp_path: Path) -> list[str]:
    """`xtune tune` on the A72 cycles board, logging into `tmp_path`."""
    return [
        "tune",
        "--workload",
        "matmul:m=8,n=8,k=8",
        "--board",
        "qemu-aarch64-cycles",
        "--trials",
        "2",
        "--log",
        str(tmp_path / "log.jsonl"),
    ]


def test_no_llvm_mca_on_path_is_one_line_and_exit_2(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    for tool in ("qemu-aarch64", "gcc", "aarch64-linux-gnu-gcc"):  # everything the board needs but llvm
        if (found := shutil.which(tool)) is not None:
            (bare / tool).symlink_to(found)
    env = {**os.environ, "PATH": str(bare), "PYTHONPATH": str(Path(__file__).parents[1])}
    out = subprocess.run(
        [sys.executable, "-m", "xtune.cli", *tune_args(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr
    assert out.stderr.strip().splitlines() == [
        "xtune: error: board qemu-aarch64-cycles: the cycle cost needs llvm-mca-NN and llvm-mc-NN (Debian's "
        "llvm packages) on PATH: bash scripts/setup.sh installs them"
    ]
    assert not (tmp_path / "log.jsonl").exists()


@pytest.mark.skipif(not HAVE_MCA, reason="needs llvm-mca-NN (scripts/setup.sh)")
@pytest.mark.parametrize(
    ("mca_cpu", "said"), [("", "names no scheduling model"), ("cortex-z99", "cannot model -mcpu=cortex-z99")]
)
def test_a_target_without_a_usable_model_is_one_line_and_exit_2(
    mca_cpu: str,
    said: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    a72 = get_target("arm-a72-neon")
    monkeypatch.setattr(board_module, "get_target", lambda name: replace(a72, mca_cpu=mca_cpu))
    code = main(tune_args(tmp_path))
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0].startswith("xtune: error: board qemu-aarch64-cycles: ") and said in err[0]
    assert not (tmp_path / "log.jsonl").exists()


@pytest.mark.skipif(not HAVE_MCA, reason="needs llvm-mca-NN (scripts/setup.sh)")
def test_a_block_llvm_mca_refuses_is_a_board_error_naming_it() -> None:
    # An SVE load (ld1w {z0.s}, p0/z, [x0]) then ret: the Cortex-A72 model has no SVE, so llvm-mca refuses.
    a72 = get_target("arm-a72-neon")
    model = CycleModel(replace(a72, features=a72.features + ",+sve"), find_llvm_tools() or pytest.fail())
    image = bytes([0x00, 0xA0, 0x40, 0xA5, 0xC0, 0x03, 0x5F, 0xD6])
    with pytest.raises(BoardError) as caught:
        model.costs(image, 0x5500000000, [BlockRun(vaddr=0x5500000000, size=8, insns=2, execs=1, repeats=0)])
    assert caught.value.kind is BoardFault.COST_MODEL and not caught.value.transient
    message = str(caught.value)
    assert "-mcpu=cortex-a72 refuses the kernel's code (the block at image offset 0x0)" in message
    assert "unsupported instruction" in message and "\n" not in message


@pytest.mark.skipif(not HAVE_MCA, reason="needs llvm-mca-NN (scripts/setup.sh)")
def test_llvm_mca_past_the_models_time_guard_is_a_cost_model_error() -> None:
    model = CycleModel(get_target("arm-a72-neon"), find_llvm_tools() or pytest.fail(), timeout_s=1e-9)
    with pytest.raises(BoardError, match=r"timed out after 1e-09 seconds") as caught:
        model.probe()
    assert caught.value.kind is BoardFault.COST_MODEL


@pytest.mark.skipif(not HAVE_MCA, reason="needs llvm-mca-NN (scripts/setup.sh)")
def test_a_library_block_decodes_with_every_extension_of_the_core() -> None:
    # casa x0, x1, [x2] then ret: an LSE atomic, which the Cortex-A76 has (Armv8.2-A) though xtune's
    # arm-a76-dotprod features do not name it, and LLVM's A76 model has no scheduling data for. A board
    # refuses it; the model for a library's code (the ARM peers) costs it as nothing, and the ret alone.
    a76 = get_target("arm-a76-dotprod")
    assert "lse" not in a76.features
    tools = find_llvm_tools() or pytest.fail()
    image = bytes([0x41, 0x7C, 0xE0, 0xC8, 0xC0, 0x03, 0x5F, 0xD6])
    runs = [BlockRun(vaddr=0x5500000000, size=8, insns=2, execs=1, repeats=0)]
    with pytest.raises(BoardError, match=r"casa\tx0, x1, \[x2\]"):
        CycleModel(a76, tools).costs(image, runs[0].vaddr, runs)
    (cost,) = CycleModel(a76, tools, skip_unscheduled=True).costs(image, runs[0].vaddr, runs)
    ret = bytes([0xC0, 0x03, 0x5F, 0xD6])
    (alone,) = CycleModel(a76, tools).costs(ret, 0x5500000000, [replace(runs[0], size=4, insns=1)])
    assert cost == alone


@pytest.mark.board
@pytest.mark.skipif(not HAVE_MCA or shutil.which("qemu-aarch64") is None, reason="needs llvm-mca-NN and qemu")
def test_tune_best_and_build_speak_cycles(tmp_path: Path, xtune_cli: CliRunner) -> None:
    log, workload = tmp_path / "log.jsonl", "matmul:m=16,n=16,k=32"
    tuned = xtune_cli(
        "tune",
        "--workload",
        workload,
        "--board",
        "qemu-aarch64-cycles",
        "--trials",
        "3",
        "--tuner",
        "random",
        "--batch-size",
        "3",
        "--log",
        str(log),
        "--json",
    )
    assert tuned.returncode == 0, tuned.stderr
    report = json.loads(tuned.stdout)
    assert (
        report["cost_unit"] == "cycles"
        and report["confirmation"] == "exact"
        and report["best_gflops"] is None
    )
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 3 and {line["result"]["cost_unit"] for line in lines} == {"cycles"}
    assert all("llvm-mca" in dict(line["fingerprint"])["cost"] for line in lines)
    best = xtune_cli("best", "--log", str(log))
    assert best.returncode == 0 and f"{report['best_cost']:.0f} cycles" in best.stdout, best.stdout
    built = xtune_cli(
        "build",
        "--target",
        "arm-a72-neon",
        "--workload",
        workload,
        "--log",
        str(log),
        "-o",
        str(tmp_path / "k.o"),
        "--header",
        str(tmp_path / "k.h"),
        "--json",
    )
    assert built.returncode == 0, built.stderr
    assert json.loads(built.stdout)["kernels"][0]["config"] == report["best_config"]["index"]
