"""Where a whole network's cycles go, as the network runs them: an ONNX model in; its build for a target
run once on a QEMU cycles board (as `bench_arm_peers.py --cycles` runs it), and the cycle estimate of the
call split by the object's function each executed block lies in (net.kN: the network's kernels in the
order `xtune build` emits them; net_run: the glue) out, costliest first.

Usage: python3 benchmarks/net_kernels.py MODEL [--board qemu-aarch64-cycles] [--log LOG ...]

Unlike benchmarks/arm_layers.py, which measures each task alone, this prices the kernels where they lie
in the network's image: QEMU ends a translation block at a 4 KiB page boundary, and the cycle model prices
each block alone (docs/emulated-costs.md), so a kernel whose hot loop moves across a page boundary
changes its estimate though its code did not (docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import bisect
import subprocess
import tempfile
from collections import defaultdict
from pathlib import Path

from xtune.boards.agent import RunRequest
from xtune.boards.board import CycleCountingSession, get_board
from xtune.boards.cycles import run_cost
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import check_finished, load_network, network_input

NM = {"aarch64": "aarch64-linux-gnu-nm", "riscv64": "riscv64-linux-gnu-nm", "x86_64": "nm"}


def functions(obj: bytes, arch: str) -> list[tuple[int, str]]:
    """(offset, name) of the object's text symbols, by offset (its one .text is the image's start)."""
    with tempfile.NamedTemporaryFile(suffix=".o") as f:
        f.write(obj)
        f.flush()
        out = subprocess.run([NM[arch], "-n", f.name], capture_output=True, text=True, check=True).stdout
    rows = [line.split() for line in out.splitlines()]
    return sorted((int(r[0], 16), r[2]) for r in rows if len(r) == 3 and r[1] in "tT")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--board", default="qemu-aarch64-cycles")
    parser.add_argument("--log", type=Path, action="append", default=[], help="tuning log(s)")
    args = parser.parse_args()
    board = get_board(args.board)
    artifact = build_model(args.model, board.target, args.log)
    syms = functions(artifact.object, board.target.arch)
    starts = [offset for offset, _ in syms]
    spent: dict[str, float] = defaultdict(float)
    with board.open() as session:
        if not isinstance(session, CycleCountingSession):
            raise SystemExit(f"{args.board} is no cycles board")
        entry = load_network(session, artifact, network_input(artifact)).entry(artifact.entry)
        check_finished(session.run(RunRequest.check(entry, (0, 1, 2), timeout_ms=600_000)), board)
        for block, priced in zip(session.last_blocks, session.last_block_cycles, strict=True):
            at = bisect.bisect_right(starts, block.vaddr - session.image_base) - 1
            spent[syms[at][1] if at >= 0 else "?"] += run_cost(block, priced)
        print(f"total: {session.last_cycles or 0.0:.0f} cycles, {session.last_insn_count} instructions")
    for name, cycles in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"{name:12s} {cycles / 1e6:9.4f} M")


if __name__ == "__main__":
    main()
