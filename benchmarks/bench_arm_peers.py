"""Benchmark: instructions (and with --cycles llvm-mca's cycle estimate) per inference of the ARM peers
(ONNX Runtime for the ONNX networks, LiteRT with XNNPACK for the MLPerf Tiny float models) and of xtune's
build of the same network, per emulated core, all counted by xtune's TCG plugin under qemu-aarch64
(docs/arm-peers.md). Prints a markdown table.

Usage: python3 benchmarks/bench_arm_peers.py [--only NAME ...] [--cores CORE ...] [--tiny DIR] [--real]
                                             [--log LOG ...] [--cycles] [--pairs N]
                                             [--no-peers]

ResNet-18 and MobileNetV2 are written as benchmarks/make_networks.py writes them (random weights);
the MLPerf Tiny float models are read from --tiny DIR (docs/benchmarks.md says where to get them); the
real-models set (the ONNX Model Zoo's light graphs in the onnx package, with seeded random weights and
their logits as output, as tests/test_real_models.py runs them) with --real or --only NAME. Needs
the arm64 Python of scripts/arm_peers.sh. Every peer's outputs are checked against the same runtime on
this host; xtune's against ONNX Runtime (xtune bench --model). Where xtune cannot load a model, or has no
target for a core, the row says so.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import onnx
from arm_cycles import PEER_MCA_TIMEOUT_S
from arm_peers import PAIRS, check_peer, run_peer

from xtune.boards.board import QemuBoard
from xtune.boards.cost import CostUnit
from xtune.boards.cycles import cycle_model
from xtune.errors import XtuneError
from xtune.firmware.network_bench import bench_model
from xtune.target import Target, load_targets
from xtune.tuning.arm_peers import CORES

# tests/networks.py builds the networks (as benchmarks/make_networks.py does); the repository root holds
# the `tests` package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.exported import light_models, zoo_logits
from tests.networks import NETWORKS

ONNX_NETWORKS = ("resnet18", "mobilenet_v2")
# MLPerf Tiny's float reference models (mlcommons/tiny, benchmark/training/*/trained_models/).
TINY_FLOAT = ("ad01_fp32", "kws_ref_model_float32", "pretrainedResnet", "vww_96_float")
REAL_MODELS = tuple(light_models())


@dataclass(frozen=True, kw_only=True)
class Row:
    network: str
    core: str
    peer: str  # runtime and version, or why it did not run
    peer_insns: float | None
    target: str  # xtune's target for the core, or "-"
    xtune_insns: float | None
    note: str  # why xtune's figure is missing, or ""
    peer_cycles: float | None = None  # with --cycles, under the target's llvm-mca model
    xtune_cycles: float | None = None


@dataclass(frozen=True, kw_only=True)
class Counting:
    """What a row counts: xtune's builds from these logs, llvm-mca's cycles beside the instructions, the
    peer over `pairs` pairs of counting children, or no peer at all (xtune's figures alone)."""

    logs: tuple[Path, ...] = ()
    cycles: bool = False
    pairs: int = PAIRS
    peers: bool = True


def xtune_target(core: str) -> Target | None:
    """xtune's aarch64 target whose QEMU CPU is `core`, if there is one."""
    found = [t for t in load_targets().values() if t.arch == "aarch64" and t.qemu_cpu == core]
    return found[0] if found else None


def xtune_cost(model: Path, target: Target, logs: Sequence[Path], unit: CostUnit) -> tuple[float | None, str]:
    """xtune's instructions or cycles per inference for `model` built for `target` (on its own qemu -cpu),
    or why there are none."""
    name = "qemu-aarch64-cycles" if unit is CostUnit.CYCLES else "qemu-aarch64"
    if unit is CostUnit.CYCLES:
        # A whole network's blocks, like a runtime's, go to llvm-mca at once: the peers' guard, not a
        # kernel's (the board's model is this process's, cached by target).
        cycle_model(target).timeout_s = PEER_MCA_TIMEOUT_S
    try:
        report = bench_model(model, QemuBoard(name, target, unit), logs)
    except XtuneError as e:
        return None, f"xtune cannot run it: {e}"
    if not report.correct:
        return None, f"xtune's output is wrong: {report.error}"
    return report.cycles if unit is CostUnit.CYCLES else report.instructions, ""


def peer_figures(
    model: Path, core: str, target: Target | None, counting: Counting
) -> tuple[str, float | None, float | None]:
    """The peer's part of a row: its name (or why it failed or did not run), its instructions and cycles
    per inference (None where its outputs differ from the x86 host's)."""
    if not counting.peers:
        return "not run (--no-peers)", None, None
    try:
        run = run_peer(model, core, cycles=target if counting.cycles else None, pairs=counting.pairs)
    except XtuneError as e:
        return f"failed: {e}", None, None
    why = check_peer(run, model)
    if why:
        return f"{run.runtime.value} {run.version} (WRONG: {why})", None, None
    name = f"{run.runtime.value} {run.version}"
    if run.cycles_error:
        name += f" (no cycles: {run.cycles_error})"
    return name, run.instructions, run.cycles


def measure(model: Path, cores: list[str], counting: Counting) -> list[Row]:
    rows = []
    for core in cores:
        start = time.perf_counter()
        target = xtune_target(core)
        peer, peer_insns, peer_cycles = peer_figures(model, core, target, counting)
        insns, xcycles, note = None, None, f"xtune has no target for {core}"
        if target is not None:
            insns, note = xtune_cost(model, target, counting.logs, CostUnit.INSTRUCTIONS)
            if counting.cycles and insns is not None:
                xcycles, note = xtune_cost(model, target, counting.logs, CostUnit.CYCLES)
        row = Row(
            network=model.stem,
            core=core,
            peer=peer,
            peer_insns=peer_insns,
            peer_cycles=peer_cycles,
            target=target.name if target else "-",
            xtune_insns=insns,
            xtune_cycles=xcycles,
            note=note,
        )
        rows.append(row)
        took = time.perf_counter() - start
        print(f"{row.network} on {core} ({took:.0f} s): {table([row]).splitlines()[-1]}", file=sys.stderr)
    return rows


def _millions(n: float | None) -> str:
    """Millions with two decimals; below one million with four, so a Tiny model's figure keeps its digits."""
    if n is None:
        return "-"
    return f"{n / 1e6:.2f}" if n >= 1e6 else f"{n / 1e6:.4f}"


def _ratio(ours: float | None, theirs: float | None) -> str:
    return f"{ours / theirs:.2f}" if ours and theirs else "-"


def table(rows: list[Row]) -> str:
    """A markdown table; the cycle columns only when some row has a cycle figure."""
    cycles = any(r.peer_cycles or r.xtune_cycles for r in rows)
    head = ["network", "core", "peer", "peer M insn/inf", "xtune target", "xtune M insn/inf", "xtune / peer"]
    head += ["peer M cycles/inf", "xtune M cycles/inf", "xtune / peer (cycles)"] if cycles else []
    lines = ["| " + " | ".join([*head, "note"]) + " |", "|" + "---|" * (len(head) + 1)]
    for r in rows:
        cells = [r.network, r.core, r.peer, _millions(r.peer_insns), r.target, _millions(r.xtune_insns)]
        cells.append(_ratio(r.xtune_insns, r.peer_insns))
        if cycles:
            cells += [
                _millions(r.peer_cycles),
                _millions(r.xtune_cycles),
                _ratio(r.xtune_cycles, r.peer_cycles),
            ]
        cells.append(r.note)
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")  # a message splits no cell
    return "\n".join(lines)


def models(only: list[str] | None, tiny: Path | None, real: bool, folder: Path) -> list[Path]:
    """The ONNX networks written into `folder`, then the Tiny float models found in `tiny`, then the
    real-models set (all of it with `real`, else those named in `only`) written into `folder`."""
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
    for name in REAL_MODELS:
        if real or (wanted is not None and name in wanted):
            path = folder / f"{name}.onnx"
            onnx.save_model(zoo_logits(name), path)
            found.append(path)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--only",
        action="append",
        choices=[*ONNX_NETWORKS, *TINY_FLOAT, *REAL_MODELS],
        help="measure only this network (repeatable)",
    )
    parser.add_argument(
        "--cores", nargs="+", choices=list(CORES), default=list(CORES), help="emulated cores (default: all)"
    )
    parser.add_argument("--tiny", type=Path, help="folder holding the MLPerf Tiny .tflite files")
    parser.add_argument("--real", action="store_true", help="also the real-models set (hours per core)")
    parser.add_argument("--log", type=Path, action="append", default=[], help="xtune tuning log(s)")
    parser.add_argument("--cycles", action="store_true", help="also llvm-mca's cycle estimates (slower)")
    parser.add_argument(
        "--pairs",
        type=int,
        default=PAIRS,
        help=f"pairs of counting children per peer run, the median of their figures (default {PAIRS}; "
        "1 runs a peer's inference 5 times instead of 13, for the biggest graphs)",
    )
    parser.add_argument(
        "--no-peers", action="store_true", help="xtune's figures alone (the real-models table's column)"
    )
    args = parser.parse_args()
    if args.tiny is None and set(args.only or ()) & set(TINY_FLOAT):
        parser.error("the MLPerf Tiny models are read from a folder: pass --tiny DIR")
    if args.pairs < 1:
        parser.error(f"--pairs must be at least 1, not {args.pairs}")
    counting = Counting(logs=tuple(args.log), cycles=args.cycles, pairs=args.pairs, peers=not args.no_peers)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="xtune-bench-arm-") as folder:
        rows = [
            row
            for model in models(args.only, args.tiny, args.real, Path(folder))
            for row in measure(model, args.cores, counting)
        ]
    print(table(rows))
    print(f"\n{len(rows)} rows in {time.perf_counter() - start:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
