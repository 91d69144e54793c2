"""Static cost of a kernel's loops: a workload key, a target and knob settings in; the config's assembly
(llvmlite, as the boards build it) and, for each innermost loop, its instructions, the cycles llvm-mca
puts on one iteration in steady state, and its commonest opcodes out. Deterministic, no timing: the
per-loop figures docs/benchmarks.md turns into cycles per output (the int8 depthwise routes against the
float32 depthwise) come from here. The straight-line code after a loop up to the next label (a register
tile's epilogue: requantization and stores) is costed the same way, as one more "after" row.

Usage: python benchmarks/mca_loops.py KEY [--target x86-avx512-vnni] [--mcpu sapphirerapids]
       [--set knob=value ...] [--asm FILE]
--mcpu defaults to the target's own scheduling model (`mca_cpu`); --asm also writes the assembly.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

from xtune.boards.cycles import find_llvm_tools
from xtune.codegen.compile import optimize, parse_verified, target_machine
from xtune.codegen.lower import lower
from xtune.errors import XtuneError
from xtune.ops.registry import parse_workload, template_for
from xtune.schedule.space import Config, KnobValue
from xtune.target import get_target

LABEL = re.compile(r"^(\.LBB\d+_\d+):")
BRANCH = re.compile(r"^\s+(?:j\w+|b\.\w+|cbn?z\s+\w+,|tbn?z\s+\w+,\s*#\d+,)\s+(\.LBB\d+_\d+)\s*$")


def configured(template: object, settings: list[str]) -> Config:
    """The template's default config with each knob=value of `settings` put in."""
    space = template.space  # type: ignore[attr-defined]
    config = template.default_config()  # type: ignore[attr-defined]
    values: dict[str, KnobValue] = {k.name: config[k.name] for k in space.knobs}
    for setting in settings:
        name, _, text = setting.partition("=")
        knob = next((k for k in space.knobs if k.name == name), None)
        option = next((o for o in knob.options if str(o) == text), None) if knob else None
        if option is None:
            raise XtuneError(f"no knob {name} with option {text!r}")
        values[name] = option
    return space.config(space.index_of(values))


def instructions(lines: list[str]) -> list[str]:
    return [x for x in lines if x.startswith("\t") and not x.startswith("\t.")]


def innermost_loops(asm: str) -> list[tuple[str, list[str]]]:
    """(label, instructions) of each loop whose body holds no other label (a backward branch to a label),
    then ("after label", instructions) of the code after it up to the next label or branch."""
    lines = asm.split("\n")
    labels = {m.group(1): i for i, line in enumerate(lines) if (m := LABEL.match(line))}
    loops = []
    for i, line in enumerate(lines):
        m = BRANCH.match(line)
        start = labels.get(m.group(1), i + 1) if m else i + 1
        if start > i or any(LABEL.match(x) for x in lines[start + 1 : i]):
            continue
        label = lines[start].rstrip(":")
        loops.append((label, instructions(lines[start + 1 : i + 1])))
        end = next(
            (j for j in range(i + 1, len(lines)) if LABEL.match(lines[j]) or BRANCH.match(lines[j])), i
        )
        after = instructions(lines[i + 1 : end])
        if len(after) > 8:
            loops.append((f"after {label}", after))
    return loops


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("key")
    parser.add_argument("--target", default="x86-avx512-vnni")
    parser.add_argument("--mcpu", default=None)
    parser.add_argument("--set", action="append", default=[], dest="settings")
    parser.add_argument("--asm", type=Path, default=None)
    args = parser.parse_args()
    tools = find_llvm_tools()
    if tools is None:
        print("needs llvm-mca-NN (Debian's llvm packages, scripts/setup.sh)", file=sys.stderr)
        return 2
    try:
        target = get_target(args.target)
        template = template_for(parse_workload(args.key), target)
        config = configured(template, args.settings)
    except XtuneError as err:
        print(err, file=sys.stderr)
        return 2
    tm = target_machine(target)
    module = parse_verified(lower([template.kernel(config, "kernel")]), target)
    optimize(module, tm)
    asm = tm.emit_assembly(module)
    if args.asm is not None:
        args.asm.write_text(asm)
    mcpu = args.mcpu or target.mca_cpu
    print(f"{args.key} on {target.name} (llvm-mca-{tools.version} -mcpu={mcpu}): {dict(config.values)}")
    iterations = 200
    for label, body in innermost_loops(asm):
        run = subprocess.run(
            [tools.mca, f"-mtriple={target.triple}", f"-mcpu={mcpu}", f"-iterations={iterations}"],
            input="\n".join(body),
            capture_output=True,
            text=True,
            check=True,
        )
        found = re.search(r"Total Cycles:\s+(\d+)", run.stdout)
        cycles = int(found.group(1)) / iterations if found else float("nan")
        top = Counter(x.split()[0] for x in body).most_common(6)
        print(f"  {label}: {len(body)} instructions, {cycles:.1f} cycles/iteration  {top}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
