"""A conv2d config's loop nest in, its dynamic operation counts by phase out (deterministic, no timing).

Walks the nest the template builds (every statement times the trip counts of the loops around it) and
sorts what it executes by the buffer it writes: the packed input (Ip), the packed weights (Wp), the
FMA tile (registers), the output (Ot/output). For each phase: vector FMAs, vector and scalar loads,
broadcasts, stores, shuffles; and a port-bound cycle floor for one AVX-512 core of two FMA units, two
loads, one store and one 512-bit shuffle a cycle (Intel Optimization Reference Manual, Golden Cove:
ports 0/5 FMA, 2-3 load ports, one 512-bit store a cycle, 512-bit shuffles on port 5 only). With --mca,
llvm-mca's cycles per iteration of the object's innermost loops richest in FMAs (-mcpu=sapphirerapids
unless --cpu).

Usage: python benchmarks/conv_counts.py [--target x86-avx512] [--config N] [--mca] [--cpu CPU] WORKLOAD ...
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import tempfile
from collections import Counter
from pathlib import Path

from xtune.codegen.compile import compile_object
from xtune.codegen.lower import lower
from xtune.ops.registry import parse_workload, template_for
from xtune.schedule.loopnest import Assign, Broadcast, Kernel, Load, MulAdd, Shuffle, Store, walk
from xtune.target import get_target

FMA_PORTS, LOAD_PORTS, STORE_PORTS, SHUFFLE_PORTS = 2.0, 2.0, 1.0, 1.0


def loads(value: object) -> list[Load]:
    """Every Load a value reads (through broadcasts, FMAs, shuffles' operand tuples)."""
    if isinstance(value, Load):
        return [value]
    if isinstance(value, tuple | list):
        return [found for part in value for found in loads(part)]
    fields = getattr(value, "__dataclass_fields__", {})
    return [found for name in fields for found in loads(getattr(value, name))]


def phase(stmt: Store) -> str:
    """Which part of the kernel a store belongs to, by the buffer it writes."""
    return {"Ip": "pack input", "Wp": "pack weights", "packed": "pack weights"}.get(stmt.buffer, "output")


def counts(kernel: Kernel) -> dict[str, Counter[str]]:
    """Per phase: executed FMAs, loads (vector/scalar), broadcasts, shuffles and stores (vector/scalar).
    Register work is the FMA tile's, except a transpose's shuffles and loads: those are the phase of the
    store that follows them (a transposed copy or output tile writes its registers right away)."""
    table: dict[str, Counter[str]] = {}
    pending: Counter[str] = Counter()
    for stmt, loops in walk(kernel.body):
        if not isinstance(stmt, Assign | Store):
            continue
        times = math.prod(loop.extent for loop in loops)
        value = stmt.value
        row: Counter[str] = Counter()
        if isinstance(value, MulAdd):
            row["fma"] += times
        if isinstance(value, Broadcast):
            row["broadcast"] += times
        if isinstance(value, Shuffle):
            row["shuffle"] += times
        for load in loads(value):
            row["vload" if load.lanes > 1 else "sload"] += times
        if isinstance(stmt, Store):
            row["vstore" if stmt.lanes > 1 else "sstore"] += times
            table.setdefault(phase(stmt), Counter()).update(row + pending)
            pending = Counter()
        elif isinstance(value, Shuffle) or pending:
            pending.update(row)
        else:
            table.setdefault("fma tile", Counter()).update(row)
    return table


def floor_cycles(row: Counter[str]) -> float:
    """The port-bound cycles of a phase: whichever of FMAs, loads, stores and shuffles is the bottleneck
    (shuffles as the nest has them: LLVM folds those of zero rows, so this over-counts a transpose)."""
    return max(
        row["fma"] / FMA_PORTS,
        (row["vload"] + row["sload"]) / LOAD_PORTS,
        (row["vstore"] + row["sstore"]) / STORE_PORTS,
        row["shuffle"] / SHUFFLE_PORTS,
    )


def innermost_loops(text: str) -> list[list[str]]:
    """The bodies (instruction texts) of the innermost loops of an objdump listing: the spans from a
    backward branch's target to the branch that hold no other backward branch."""
    insns: list[tuple[int, str]] = []
    for line in text.splitlines():
        match = re.match(r"^\s*([0-9a-f]+):\s+(\S.*)$", line)
        if match:
            insns.append((int(match.group(1), 16), match.group(2).split("#")[0].strip()))
    spans = []
    for at, insn in insns:
        jump = re.match(r"^j\w+\s+0x([0-9a-f]+)", insn)
        if jump and int(jump.group(1), 16) <= at:
            spans.append((int(jump.group(1), 16), at))
    inner = [s for s in spans if not any(o != s and s[0] <= o[0] and o[1] <= s[1] for o in spans)]
    return [[insn for at, insn in insns if lo <= at < hi] for lo, hi in inner]


def mca_cycles(body: list[str], cpu: str) -> float:
    """llvm-mca's steady-state cycles per iteration of a loop body (the marginal cost of 100 over 1); its
    branches left out (llvm-mca cannot read objdump's label operands; each is one port-6 uop)."""

    def total(iterations: int) -> float:
        out = subprocess.run(
            ["llvm-mca-22", f"-mcpu={cpu}", f"-iterations={iterations}"],
            input="\n".join(i for i in body if not i.startswith("j")) + "\n",
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return float(re.search(r"Total Cycles:\s+(\d+)", out).group(1))  # type: ignore[union-attr]

    return (total(101) - total(1)) / 100


def mca_loops(kernel: Kernel, target_name: str, cpu: str, top: int) -> list[tuple[int, float, int]]:
    """(instructions, llvm-mca cycles per iteration, FMAs) of the `top` innermost loops richest in FMAs."""
    target = get_target(target_name)
    obj = compile_object(lower([kernel]), target, (kernel.name,))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "k.o")
        path.write_bytes(obj.data)
        dump = subprocess.run(
            ["llvm-objdump-22", "-d", "--no-show-raw-insn", str(path)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    bodies = sorted(innermost_loops(dump), key=lambda b: -sum(i.startswith("vfmadd") for i in b))[:top]
    return [(len(b), mca_cycles(b, cpu), sum(i.startswith("vfmadd") for i in b)) for b in bodies]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("workloads", nargs="+")
    parser.add_argument("--target", default="x86-avx512")
    parser.add_argument("--config", type=int, help="config index (default: the template's default)")
    parser.add_argument("--mca", action="store_true", help="llvm-mca the hot innermost loops")
    parser.add_argument("--cpu", default="sapphirerapids", help="llvm-mca's -mcpu")
    args = parser.parse_args()
    target = get_target(args.target)
    for text in args.workloads:
        wl = parse_workload(text)
        tpl = template_for(wl, target)
        config = tpl.space.config(args.config) if args.config is not None else tpl.default_config()
        kernel = tpl.kernel(config, "xt_kernel")
        table = counts(kernel)
        fmas = sum(row["fma"] for row in table.values())
        total = sum(floor_cycles(row) for row in table.values())
        print(f"{text}  config {tpl.space.index_of(dict(config.values))}")
        print(f"  {dict(config.values)}")
        for name, row in sorted(table.items()):
            print(f"  {name:13s} {floor_cycles(row):>12,.0f} cycles floor  {dict(row)}")
        print(f"  total floor {total:,.0f} cycles, {total / fmas:.3f} per vector FMA (ideal {1 / FMA_PORTS})")
        if args.mca:
            for n, cycles, f in mca_loops(kernel, args.target, args.cpu, 2):
                per = f"{cycles / f:.3f} cycles per FMA" if f else "no FMA"
                print(f"  llvm-mca loop: {n} instructions, {f} FMAs, {cycles:.2f} cycles/iteration, {per}")


if __name__ == "__main__":
    main()
