"""Benchmark: packing, compiling, patching and flat-linking an object with a large weights section.

Usage: python benchmarks/bench_weights.py [--mb 50] [--target x86-avx2] [--repeat 3]; prints the best time of
each phase. The budget for a whole ResNet-18 build (47 MB of weights) is 10 s (docs/firmware.md)."""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np

from xtune.codegen.compile import compile_object
from xtune.codegen.link import link_flat
from xtune.codegen.rodata import pack_weights, patch_weights, weights_base, weights_global
from xtune.target import get_target

PHASES = ("pack", "compile", "patch", "link")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=50)
    parser.add_argument("--target", default="x86-avx2")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    target = get_target(args.target)
    rng = np.random.default_rng(0)
    arrays = [(f"w{i}", rng.standard_normal((args.mb << 18) // 25 + i, dtype=np.float32)) for i in range(25)]
    best: dict[str, float] = {}
    for _ in range(args.repeat):
        times = [time.perf_counter()]
        layout, blob = pack_weights(arrays)
        times.append(time.perf_counter())
        entry = f"define void @run(ptr %out) #0 {{\n  {weights_base('%w')}\n  %v = load float, ptr %w\n"
        entry += "  store float %v, ptr %out\n  ret void\n}\n"
        ir = f'{weights_global(layout.nbytes)}\n{entry}attributes #0 = {{ nounwind "no-builtins" }}\n'
        obj = compile_object(ir, target, ("run",))
        times.append(time.perf_counter())
        obj = patch_weights(obj, blob)
        times.append(time.perf_counter())
        link_flat(obj)
        times.append(time.perf_counter())
        for phase, (t0, t1) in zip(PHASES, itertools.pairwise(times), strict=True):
            best[phase] = min(best.get(phase, float("inf")), t1 - t0)
    total = sum(best.values())
    phases = ", ".join(f"{k} {v:.3f} s" for k, v in best.items())
    print(f"{args.target}, {layout.nbytes / 1e6:.1f} MB: {phases}; total {total:.3f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
