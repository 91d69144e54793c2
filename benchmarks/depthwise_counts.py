"""Instructions (or llvm-mca cycles) per FMA of depthwise configs under qemu-aarch64: workloads (default:
MobileNetV2's depthwise layers) and a target in; per workload, the config's instructions for one call (the
TCG plugin's count, deterministic) or, with --cycles, its cycle estimate (docs/emulated-costs.md), its FMA
bound (flops / 2 / fp32 lanes) and their ratio out, as a markdown table.

Usage: python3 benchmarks/depthwise_counts.py [--target arm-a72-neon] [--layout nhwc|nchw] [--cycles]
                                              [--set KNOB=VALUE ...] [--workload WL ...]

`--set` overrides knobs of each workload's default config (e.g. `--set rows=1` for the one-row tile).
"""

from __future__ import annotations

import argparse

from xtune.boards.board import QemuBoard
from xtune.boards.cost import CostUnit
from xtune.ops.registry import parse_workload, template_for
from xtune.schedule.space import KnobValue
from xtune.target import get_target
from xtune.tuning.measure import MeasureOptions, Measurer

# MobileNetV2 (224x224 input): the depthwise layers' channels, input size and stride.
MOBILENET_V2 = (
    (32, 112, 1),
    (96, 112, 2),
    (144, 56, 1),
    (144, 56, 2),
    (192, 28, 1),
    (192, 28, 2),
    (384, 14, 1),
    (576, 14, 1),
    (576, 14, 2),
    (960, 7, 1),
)


def workloads(layout: str) -> list[str]:
    tail = ",layout=nhwc" if layout == "nhwc" else ""
    return [
        f"depthwise:n=1,c={c},h={h},w={h},r=3,s=3" + (f",stride={st}" if st > 1 else "") + f",pad=1{tail}"
        for c, h, st in MOBILENET_V2
    ]


def parse_value(text: str) -> KnobValue:
    try:
        return int(text)
    except ValueError:
        return text


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="arm-a72-neon")
    ap.add_argument("--layout", choices=("nhwc", "nchw"), default="nhwc")
    ap.add_argument("--set", action="append", default=[], metavar="KNOB=VALUE")
    ap.add_argument("--workload", action="append", default=[])
    ap.add_argument("--cycles", action="store_true", help="llvm-mca cycles instead of instructions")
    args = ap.parse_args()
    target = get_target(args.target)
    overrides = {k: parse_value(v) for k, v in (s.split("=", 1) for s in args.set)}
    unit = CostUnit.CYCLES if args.cycles else CostUnit.INSTRUCTIONS
    print(f"| workload | config | {'cycles' if args.cycles else 'instructions'} | FMA bound | per FMA |")
    print("|---|---|---|---|---|")
    for key in args.workload or workloads(args.layout):
        wl = parse_workload(key)
        space = template_for(wl, target).space
        values = template_for(wl, target).default_config().as_dict()
        values.update(overrides)
        index = space.index_of(values)
        measurer = Measurer(QemuBoard("q", target, unit), wl, MeasureOptions(timeout_ms=300_000))
        (result,) = measurer.measure([index])
        bound = wl.flops() / 2 / target.fp32_lanes
        config = " ".join(f"{k}={v}" for k, v in space.config(index).values)
        cost = f"{result.cost:,.0f}" if result.ok else result.status.value
        ratio = f"{result.cost / bound:.3f}" if result.ok else "-"
        print(f"| `{key}` | {config} | {cost} | {bound:,.0f} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
