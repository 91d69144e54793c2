"""Benchmark: instructions per inference of the ARM peers (ONNX Runtime for the ONNX networks, LiteRT with
XNNPACK for the MLPerf Tiny float models) and of xtune's build of the same network, per emulated core, all
counted by xtune's TCG plugin under qemu-aarch64 (docs/arm-peers.md). Prints a markdown table.

Usage: python3 benchmarks/bench_arm_peers.py [--only NAME ...] [--cores CORE ...] [--tiny DIR] [--log LOG ...]

ResNet-18 and MobileNetV2 are written as benchmarks/make_networks.py writes them (random weights);
the MLPerf Tiny float models are read from --tiny DIR (docs/benchmarks.md says where to get them). Needs
the arm64 Python of scripts/arm_peers.sh. Every peer's outputs are checked against the same runtime on
this host; xtune's against ONNX Runtime (xtune bench --model). Where xtune cannot load a model, or has no
target for a core, the row says so.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import onnx
from arm_peers import CORES, check_peer, run_peer

from xtune.boards.board import QemuBoard
from xtune.errors import XtuneError
from xtune.firmware.bench import bench_model
from xtune.target import Target, load_targets

# tests/networks.py builds the networks (as benchmarks/make_networks.py does); the repository root holds
# the `tests` package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.networks import NETWORKS

ONNX_NETWORKS = ("resnet18", "mobilenet_v2")
# MLPerf Tiny's float reference models (mlcommons/tiny, benchmark/training/*/trained_models/).
TINY_FLOAT = ("ad01_fp32", "kws_ref_model_float32", "pretrainedResnet", "vww_96_float")


@dataclass(frozen=True, kw_only=True)
class Row:
    network: str
    core: str
    peer: str  # runtime and version, or why it did not run
    peer_insns: float | None
    target: str  # xtune's target for the core, or "-"
    xtune_insns: float | None
    note: str  # why xtune's figure is missing, or ""


def xtune_target(core: str) -> Target | None:
    """xtune's aarch64 target whose QEMU CPU is `core`, if there is one."""
    found = [t for t in load_targets().values() if t.arch == "aarch64" and t.qemu_cpu == core]
    return found[0] if found else None


def xtune_instructions(model: Path, target: Target, logs: list[Path]) -> tuple[float | None, str]:
    """xtune's instructions per inference for `model` built for `target` (its own qemu -cpu), or why none."""
    try:
        report = bench_model(model, QemuBoard("qemu-aarch64", target), logs)
    except XtuneError as e:
        return None, f"xtune cannot run it: {e}"
    if not report.correct:
        return None, f"xtune's output is wrong: {report.error}"
    return report.instructions, ""


def measure(model: Path, cores: list[str], logs: list[Path]) -> list[Row]:
    name = model.stem
    rows = []
    for core in cores:
        start = time.perf_counter()
        try:
            run = run_peer(model, core)
            why = check_peer(run, model)
            peer = f"{run.runtime.value} {run.version}" + (f" (WRONG: {why})" if why else "")
            peer_insns = None if why else run.instructions
        except XtuneError as e:
            peer, peer_insns = f"failed: {e}", None
        target = xtune_target(core)
        if target is None:
            insns, note = None, f"xtune has no target for {core}"
        else:
            insns, note = xtune_instructions(model, target, logs)
        rows.append(
            Row(
                network=name,
                core=core,
                peer=peer,
                peer_insns=peer_insns,
                target=target.name if target else "-",
                xtune_insns=insns,
                note=note,
            )
        )
        print(
            f"{name} on {core}: {peer}, {_millions(peer_insns)} M; xtune {_millions(insns)} M "
            f"{note} ({time.perf_counter() - start:.0f} s)",
            file=sys.stderr,
        )
    return rows


def _millions(n: float | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f}"


def table(rows: list[Row]) -> str:
    lines = [
        "| network | core | peer | peer M insn/inf | xtune target | xtune M insn/inf | xtune / peer | note |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        ratio = f"{r.xtune_insns / r.peer_insns:.2f}" if r.xtune_insns and r.peer_insns else "-"
        peer, note = r.peer.replace("|", "/"), r.note.replace("|", "/")  # a message must not split a cell
        lines.append(
            f"| {r.network} | {r.core} | {peer} | {_millions(r.peer_insns)} | {r.target} | "
            f"{_millions(r.xtune_insns)} | {ratio} | {note} |"
        )
    return "\n".join(lines)


def models(only: list[str] | None, tiny: Path | None, folder: Path) -> list[Path]:
    """The ONNX networks written into `folder`, then the Tiny float models found in `tiny`."""
    wanted = set(only) if only else None
    found = []
    for name in ONNX_NETWORKS:
        if wanted is None or name in wanted:
            path = folder / f"{name}.onnx"
            onnx.save_model(NETWORKS[name](), path)
            found.append(path)
    for name in TINY_FLOAT:
        if (wanted is None or name in wanted) and tiny is not None:
            path = tiny / f"{name}.tflite"
            if path.is_file():
                found.append(path)
            else:
                print(f"{path}: not found (docs/benchmarks.md says where to get it)", file=sys.stderr)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        action="append",
        choices=[*ONNX_NETWORKS, *TINY_FLOAT],
        help="measure only this network (repeatable)",
    )
    parser.add_argument(
        "--cores", nargs="+", choices=list(CORES), default=list(CORES), help="emulated cores (default: all)"
    )
    parser.add_argument("--tiny", type=Path, help="folder holding the MLPerf Tiny .tflite files")
    parser.add_argument("--log", type=Path, action="append", default=[], help="xtune tuning log(s)")
    args = parser.parse_args()
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="xtune-bench-arm-") as folder:
        rows = [
            row
            for model in models(args.only, args.tiny, Path(folder))
            for row in measure(model, args.cores, args.log)
        ]
    print(table(rows))
    print(f"\n{len(rows)} rows in {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
