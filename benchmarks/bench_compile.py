"""Compile + link time of one matmul candidate: template -> nest -> LLVM IR -> O3 object -> flat image.

Usage: python benchmarks/bench_compile.py [--workload W] [--configs N] [--targets T,...]
Sequential, in this process (what one compile worker does per candidate); median over N random
configs plus the default, after one warm-up compile. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from xtune.codegen.compile import compile_object
from xtune.codegen.link import link_flat
from xtune.codegen.lower import lower
from xtune.ops.registry import parse_workload
from xtune.target import get_target, load_targets
from xtune.templates import template_for


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--workload", default="matmul:m=512,n=512,k=512")
    parser.add_argument("--configs", type=int, default=40)
    parser.add_argument("--targets", default=",".join(load_targets()))
    args = parser.parse_args()
    wl = parse_workload(args.workload)
    print(f"{args.workload}, {args.configs} random configs + default, median (p90) in ms, O3\n")
    print("| target | lower (Python) | compile (LLVM O3) | link | **total** | total CPU |")
    print("|---|---|---|---|---|---|")
    for name in args.targets.split(","):
        target = get_target(name)
        template = template_for(wl, target)
        rng = random.Random(0)
        configs = [template.default_config()]
        configs += [template.space.config(rng.randrange(template.space.size)) for _ in range(args.configs)]
        compile_object(lower([template.kernel(configs[0], "xt_kernel")]), target, ("xt_kernel",))  # warm-up
        rows: list[tuple[float, float, float, float, float]] = []
        for config in configs:
            cpu0, t0 = time.process_time(), time.perf_counter()
            text = lower([template.kernel(config, "xt_kernel")])
            t1 = time.perf_counter()
            obj = compile_object(text, target, ("xt_kernel",))
            t2 = time.perf_counter()
            link_flat(obj)
            t3 = time.perf_counter()
            rows.append((t1 - t0, t2 - t1, t3 - t2, t3 - t0, time.process_time() - cpu0))
        cols = list(zip(*rows, strict=True))

        def fmt(xs: tuple[float, ...]) -> str:
            xs_ms = sorted(x * 1e3 for x in xs)
            return f"{statistics.median(xs_ms):.1f} ({xs_ms[int(0.9 * (len(xs_ms) - 1))]:.0f})"

        lower_, compile_, link_, total, cpu = (fmt(c) for c in cols)
        print(f"| {name} | {lower_} | {compile_} | {link_} | **{total}** | {cpu} |")


if __name__ == "__main__":
    main()
