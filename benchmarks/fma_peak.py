"""The fp32 FMA peak of one core of this machine, measured: a C kernel of independent FMA chains on the
target's widest vectors, timed in-process.

Usage: python benchmarks/fma_peak.py [--seconds 0.5]; prints GFLOP/s, and the target's nominal figure.
The "% of peak" columns of benchmarks/bench_layers.py divide by this (`measured_peak_gflops`), not by the
descriptor's nominal `peak_gflops`: the clock under load and the FMA ports a core really issues are what
a kernel can reach.

Why this kernel reaches the peak: CHAINS accumulators are updated as acc = acc * x + y, each a dependent
chain, but the chains are independent, so with CHAINS >= FMA latency x FMA pipes (Zen 4/5: 4 cycles x 2
pipes; Skylake-X: 4 x 2; Cortex-A72: 7 x 1 for Q-form) the pipes are never idle. x and y are read through
`volatile` so the compiler cannot fold the loop; the chains stay in registers (CHAINS vectors + 2 <= 32).
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import subprocess
import tempfile
from pathlib import Path

from xtune.boards.board import get_board

CHAINS = 16

SOURCE = r"""
#include <stdint.h>
#include <time.h>
typedef float vec __attribute__((vector_size(LANES * 4)));

/* Seconds for `iters` rounds of CHAINS independent vector FMAs; *sink keeps the result alive. */
double fma_chains(int64_t iters, float *sink) {
    volatile float vx = 0.999999f, vy = 1e-7f;
    vec x, y, acc[CHAINS];
    for (int l = 0; l < LANES; l++) { x[l] = vx; y[l] = vy; }
    for (int c = 0; c < CHAINS; c++) for (int l = 0; l < LANES; l++) acc[c][l] = (float)(c + l);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int64_t i = 0; i < iters; i++) {
        #pragma GCC unroll 16
        for (int c = 0; c < CHAINS; c++) acc[c] = acc[c] * x + y;
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    float s = 0;
    for (int c = 0; c < CHAINS; c++) for (int l = 0; l < LANES; l++) s += acc[c][l];
    *sink = s;
    return (t1.tv_sec - t0.tv_sec) + 1e-9 * (t1.tv_nsec - t0.tv_nsec);
}
"""


def _library(lanes: int) -> ctypes.CDLL:
    """The probe built for this host's widest vectors (-march=native: FMA contraction of a*x+y)."""
    flags = [
        "-O2",
        "-march=native",
        "-ffp-contract=fast",
        "-shared",
        "-fPIC",
        f"-DLANES={lanes}",
        f"-DCHAINS={CHAINS}",
    ]
    key = hashlib.sha256((SOURCE + " ".join(flags)).encode()).hexdigest()[:16]
    out = Path(tempfile.gettempdir()) / f"xtune-fma-peak-{key}.so"
    if not out.exists():
        src = out.with_suffix(".c")
        src.write_text(SOURCE)
        subprocess.run(["cc", *flags, str(src), "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.fma_chains.restype = ctypes.c_double
    lib.fma_chains.argtypes = [ctypes.c_int64, ctypes.POINTER(ctypes.c_float)]
    return lib


def measured_peak_gflops(seconds: float = 0.5, repeat: int = 5) -> float:
    """The best of `repeat` timings of about `seconds` each: a peak is what the core can do when nothing
    else runs on it, so the fastest timing is the one least disturbed."""
    lanes = get_board("local").target.fp32_lanes
    lib = _library(lanes)
    sink = ctypes.c_float()
    iters = 1 << 16
    while (t := lib.fma_chains(iters, ctypes.byref(sink))) < seconds / 4:
        iters *= 2
    iters = int(iters * seconds / t)
    best = min(lib.fma_chains(iters, ctypes.byref(sink)) for _ in range(repeat))
    return 2.0 * lanes * CHAINS * iters / best / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=0.5)
    args = parser.parse_args()
    target = get_board("local").target
    peak = measured_peak_gflops(args.seconds)
    print(
        f"{target.name}: measured fp32 FMA peak {peak:.1f} GFLOP/s on one core "
        f"({peak / 2 / target.fp32_lanes:.2f} G vector FMAs/s of {target.fp32_lanes} lanes); "
        f"the descriptor's nominal peak is {target.peak_gflops:.1f}"
    )


if __name__ == "__main__":
    main()
