"""Validate the emulated costs against native time on x86: random configs of matmul, conv2d and depthwise
(layer shapes of MobileNetV2), each timed on this host and run once under qemu-x86_64 with the block
recorder, which gives both its instruction count and its cycle estimate (llvm-mca, -mcpu of this host's
core). Prints Spearman's rank correlation of each cost with native time, per operator over all targets
and within each target, and whether the config each cost picks is within 5 % of the natively fastest.

Usage: python3 benchmarks/validate_cycles.py [--configs 200] [--out validate_cycles.json]
           [--targets x86-avx2,x86-sse42] [--mcpu icelake-server] [--seed 0] [--ops matmul,conv2d,depthwise]

With --recost MCPU nothing is measured: the blocks stored in --out (their code and counts) are costed
again under llvm-mca's model of MCPU, and the summary printed and written to OUT.MCPU.json.

Resumable: every config's figures go to --out as they are taken (rewritten whole, atomically); a second
run with the same arguments measures only what is missing, then prints the summary. Measure on a quiet
machine: the native timings are the reference. qemu 7.2's TCG has no AVX-512 (an x86-avx512 kernel dies
with SIGILL under qemu-x86_64), hence the AVX2 and SSE4.2 targets; the host (an Emerald Rapids Xeon)
runs both natively. LLVM models Emerald Rapids with its Sapphire Rapids model, whose FMA with a folded load
carries its accumulator with a 6-cycle latency (Golden Cove's FMA: 4 cycles); the Ice Lake server model
gives 4 and measured a 12-cycle loop of 3 chained FMAs at 12, the Sapphire Rapids one at 18: the
default is icelake-server (docs/emulated-costs.md).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from xtune.boards.board import CycleCountingSession, LocalBoard, QemuBoard, local_target
from xtune.boards.cost import CostUnit
from xtune.boards.cycles import BlockRun, block_summary, cycle_model
from xtune.ops.registry import parse_workload, template_for
from xtune.tuning.measure import CompilePool, Measurer
from xtune.tuning.options import MeasureOptions

# One layer per operator, from MobileNetV2 1.0 at 224x224 (benchmarks/make_networks.py): the first
# block-2 expansion as a matmul (14x14 pixels, 96 -> 576 channels), the stem convolution, and a 14x14x384
# depthwise in the NHWC layout the network build uses. Picked for an emulated run of seconds, not for
# their results (the 3x3 convolutions of ResNet-18 are ten times the work, and ten times the wait).
SHAPES = {
    "matmul": "matmul:m=196,n=576,k=96",
    "conv2d": "conv2d:n=1,c=3,h=224,w=224,k=32,r=3,s=3,stride=2,pad=1",
    "depthwise": "depthwise:n=1,c=384,h=14,w=14,r=3,s=3,stride=1,pad=1,layout=nhwc",
}
COSTS = ("insns", "cycles", "entry_latency", "latency_only")
NEAR_BEST = 1.05
# Native time is the fastest of 40 single calls (warm: one warm-up call first). A call lasts 0.1-5 ms
# here; other processes can only add to it, and on this shared 2-core machine the median of the usual
# 10 ms repeats moved by up to 10x between two runs under load, while the minimum of single calls
# stayed within 2 %. The median is kept beside it ("median_seconds").
NATIVE = MeasureOptions(number=1, repeat=40, min_repeat_ms=0.0, warmup=1)
# One emulated call of a slow config takes tens of seconds (AVX2 under TCG, a helper call per block): the
# default 10 s deadline would drop exactly the configs a ranking must see as slow.
EMULATED_TIMEOUT_MS = 300_000  # "within 5 % of the natively best"


def ranks(values: np.ndarray) -> np.ndarray:
    """Ranks from 1, ties given their average rank (what Spearman's coefficient needs)."""
    order = np.argsort(values, kind="stable")
    ranked = np.empty(len(values))
    ranked[order] = np.arange(1, len(values) + 1)
    for value in np.unique(values):
        tied = values == value
        ranked[tied] = ranked[tied].mean()
    return ranked


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation: Pearson's on the ranks."""
    if len(x) < 3:
        return float("nan")
    rx, ry = ranks(np.asarray(x)), ranks(np.asarray(y))
    if rx.std() == 0 or ry.std() == 0:
        return float("nan")
    return float(np.corrcoef(rx, ry)[0, 1])


def save(path: Path, data: dict[str, Any]) -> None:
    """Write `data` whole or not at all: an interrupted run keeps the last complete file."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=1)
    os.replace(tmp, path)


def emulated_figures(measurer: Measurer, index: int) -> dict[str, Any]:
    """Run config `index` once under qemu: status, instruction count and the three cycle totals."""
    (result,) = measurer.measure([index])
    if not result.ok:
        return {"emulated_status": result.status.value, "emulated_error": result.error[:200]}
    session = measurer.session()
    assert isinstance(session, CycleCountingSession)
    totals = block_summary(session.last_blocks, session.last_block_cycles)
    # Each block's counts, llvm-mca figures and code, so that other ways of combining them, or another
    # model (--recost), can be tried without emulating again.
    blocks = [
        [b.insns, b.execs, b.repeats, c.latency, c.throughput, b.vaddr, session.block_bytes(b).hex()]
        for b, c in zip(session.last_blocks, session.last_block_cycles, strict=True)
    ]
    return {"emulated_status": "ok", "insns": session.last_insn_count, **totals, "blocks": blocks}


def measure_group(
    args: argparse.Namespace, op: str, target_name: str, data: dict[str, Any], out: Path
) -> None:
    """Measure the sampled configs of one operator on one target that `data` does not hold yet."""
    workload = parse_workload(SHAPES[op])
    target = local_target(target_name)
    space = template_for(workload, target).space
    draw = random.Random(f"{args.seed}:{op}:{target_name}")
    indices = draw.sample(range(space.size), min(args.configs, space.size))
    # A board error is the emulator's or the cost model's, not the config's: measured again on resuming.
    done = {k for k, r in data["configs"].items() if r.get("emulated_status") != "board_error"}
    todo = [i for i in indices if f"{op}|{target_name}|{i}" not in done]
    if not todo:
        return
    pool = CompilePool(1)
    native = Measurer(LocalBoard(target), workload, NATIVE, pool)
    emulated_board = QemuBoard("qemu-x86_64-cycles", replace(target, mca_cpu=args.mcpu), CostUnit.CYCLES)
    emulated = Measurer(emulated_board, workload, MeasureOptions(timeout_ms=EMULATED_TIMEOUT_MS), pool)
    try:
        for n, index in enumerate(todo, 1):
            (timed,) = native.measure([index])
            row: dict[str, Any] = {
                "op": op,
                "target": target_name,
                "index": index,
                "native_status": timed.status.value,
                "seconds": min(timed.costs) if timed.ok else None,
                "median_seconds": timed.cost if timed.ok else None,
            }
            if timed.ok:
                row.update(emulated_figures(emulated, index))
            data["configs"][f"{op}|{target_name}|{index}"] = row
            save(out, data)
            print(f"{op} {target_name}: {len(indices) - len(todo) + n}/{len(indices)}", flush=True)
    finally:
        native.close()
        emulated.close()
        pool.close()


def recost(data: dict[str, Any], mcpu: str) -> None:
    """Cost every stored config's blocks again under llvm-mca's model of `mcpu` (no emulation): the
    cycle totals of each row are replaced, the blocks' counts kept."""
    models = {name: cycle_model(replace(local_target(name), mca_cpu=mcpu)) for name in data["targets"]}
    for row in data["configs"].values():
        if row.get("emulated_status") != "ok" or len(row.get("blocks", [[]])[0]) < 7:
            continue
        runs = [
            BlockRun(vaddr=b[5], size=len(b[6]) // 2, insns=b[0], execs=b[1], repeats=b[2])
            for b in row["blocks"]
        ]
        base = min(r.vaddr for r in runs)
        image = bytearray(max(r.vaddr + r.size for r in runs) - base)
        for run, block in zip(runs, row["blocks"], strict=True):
            image[run.vaddr - base : run.vaddr - base + run.size] = bytes.fromhex(block[6])
        cycles = models[row["target"]].costs(bytes(image), base, runs)
        row.update(block_summary(runs, cycles))
        for block, c in zip(row["blocks"], cycles, strict=True):
            block[3:5] = [c.latency, c.throughput]
    data["mcpu"] = mcpu


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Spearman of each cost with native seconds (the fastest call), and how far each cost's pick is from
    the native best."""
    ok = [r for r in rows if r.get("emulated_status") == "ok" and r.get("seconds")]
    if not ok:
        return {"configs": 0}
    seconds = [r["seconds"] for r in ok]
    best = min(seconds)
    out: dict[str, Any] = {"configs": len(ok)}
    for cost in COSTS:
        values = [float(r[cost]) for r in ok]
        pick = min(range(len(ok)), key=lambda i: (values[i], seconds[i]))
        out[cost] = {"spearman": spearman(values, seconds), "pick_vs_best": seconds[pick] / best}
    return out


def _cell(figures: dict[str, float] | None) -> str:
    return "-" if figures is None else f"rho {figures['spearman']:+.3f} pick {figures['pick_vs_best']:.3f}"


def report(data: dict[str, Any], ops: list[str], targets: list[str]) -> dict[str, Any]:
    """The summary per operator: over all targets (pooled) and within each; printed as a table."""
    rows = list(data["configs"].values())
    summary: dict[str, Any] = {}
    print(f"{'operator':<10} {'targets':<20} {'n':>4}  " + "  ".join(f"{c:>22}" for c in COSTS))
    for op in ops:
        for scope in [",".join(targets), *targets] if len(targets) > 1 else targets:
            group = [r for r in rows if r["op"] == op and r["target"] in scope.split(",")]
            s = summary.setdefault(op, {})[scope] = summarize(group)
            cells = [_cell(s.get(c)) for c in COSTS]
            print(f"{op:<10} {scope:<20} {s['configs']:>4}  " + "  ".join(f"{c:>22}" for c in cells))
    print(
        f"(pick: native time of the config each cost ranks first over the best native time; <= {NEAR_BEST})"
    )
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", type=int, default=200, help="random configs per operator and target")
    parser.add_argument("--out", type=Path, default=Path("validate_cycles.json"))
    parser.add_argument("--targets", default="x86-avx2,x86-sse42")
    parser.add_argument("--mcpu", default="icelake-server", help="llvm-mca's model of this host's core")
    parser.add_argument("--ops", default="matmul,conv2d,depthwise")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--recost", metavar="MCPU", help="no measuring: cost the stored blocks under MCPU")
    args = parser.parse_args()
    ops, targets = args.ops.split(","), args.targets.split(",")
    data: dict[str, Any] = {"configs": {}}
    if args.out.exists():
        data = json.loads(args.out.read_text())
    if args.recost:
        recost(data, args.recost)
    else:
        data.update(
            shapes=SHAPES,
            mcpu=args.mcpu,
            seed=args.seed,
            targets=sorted({*data.get("targets", ()), *targets}),
        )
        for op in ops:
            for target in targets:
                measure_group(args, op, target, data, args.out)
    data["summary"] = report(data, ops, targets)
    # A recosted copy goes beside the measured file, which keeps the model it was measured with.
    save(args.out.with_suffix(f".{args.recost}.json") if args.recost else args.out, data)


if __name__ == "__main__":
    main()
