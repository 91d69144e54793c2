"""Analytic estimates: first-order cycle models of a template's configs, as the share of the FMA peak a
config would reach (features.py's `est_*` columns; the analytic prior ranks a cold search's first batch
by them, `EstimatePrior`). Crude on purpose: they order configs across shapes and targets, and the trees
learn what they miss. The machine constants and the shared rules (a register tile's cycles, the cache
level a working set lives in) are here; each operator's estimate sits beside its features."""

from __future__ import annotations

import numpy as np

from xtune.target import Target

# Machine constants the estimate assumes for every target (none is in the descriptors; fitted by eye to
# a few matmul shapes on one machine, docs/benchmarks.md, History): FMA latency in cycles, vector loads and
# broadcasts per cycle, cache line bytes, cache associativity, and the bytes per cycle that L2 and what
# lies beyond it stream to one core.
FMA_LATENCY, LOADS_PER_CYCLE, BROADCASTS_PER_CYCLE = 4.0, 2.0, 1.0
STORES_PER_CYCLE = 1.0
# Instructions an out-of-order core keeps in flight: a short call's FMA chains overlap with the next call's.
WINDOW = 128.0
LINE, WAYS, L2_BW, L3_BW = 64.0, 8.0, 32.0, 20.0
# An unpacked B strip jumps a whole row of B per k step: the prefetchers, which follow streams within a
# page, fall behind, so beyond L1 it arrives at a fraction of the streaming bandwidth.
STRIDED_L2_BW, STRIDED_L3_BW = 16.0, 4.0
# The share of the shorter of a kernel's compute and memory streams that runs under the longer: the
# prefetchers and the out-of-order window hide most of it, not all (a depthwise layer whose compute and
# L3 stream take about as long ran at 85 % of FMA peak, docs/benchmarks.md).
HIDDEN = 0.9
# Cycles a loop iteration the template did not unroll adds (increment, compare, branch).
LOOP_CYCLES = 1.0


def tile_cycles(rows: np.ndarray, vecs: np.ndarray, fma_rate: float, kc: np.ndarray) -> np.ndarray:
    """Cycles per k step of a rows x vecs register tile: bound by FMA issue, by one accumulator's FMA
    latency chain (unless a call of kc steps is short enough for the next call's chains to overlap it),
    by the loads (vecs B vectors + rows A values) or by the rows broadcasts of A. 0 for an empty tile."""
    overlap = 1.0 + WINDOW / (kc * (rows * vecs + rows + vecs) + 1.0)
    cycles = np.maximum.reduce(
        [
            rows * vecs / fma_rate,
            FMA_LATENCY / overlap,
            (rows + vecs) / LOADS_PER_CYCLE,
            rows / BROADCASTS_PER_CYCLE,
        ]
    )
    return np.where((rows > 0) & (vecs > 0), cycles, 0.0)


def capacity(cache: float, row_bytes: np.ndarray | float, stride_bytes: float) -> np.ndarray:
    """Bytes of a cache that a block of rows `stride_bytes` apart can use: a power-of-two stride maps
    every row to the same few sets (set index = line address mod sets), the rest of the cache sits idle."""
    sets = cache / (LINE * WAYS)
    stride_lines = stride_bytes / LINE
    if stride_lines != int(stride_lines) or stride_lines == 0:
        return np.full_like(np.asarray(row_bytes, dtype=np.float64), cache)
    reach = sets / np.gcd(int(stride_lines), int(sets))  # distinct starting sets of the rows
    return np.minimum(1.0, reach * np.ceil(np.asarray(row_bytes) / LINE) / sets) * cache


def level(working_set: np.ndarray, l1: np.ndarray | float, l2: np.ndarray | float) -> np.ndarray:
    """0 if the working set fits the usable L1, 1 if L2, else 2."""
    return np.where(working_set <= l1, 0, np.where(working_set <= l2, 1, 2))


def vector_fma_rate(t: Target) -> float:
    """Vector FMAs the target issues per cycle."""
    return max(t.fp32_flops_per_cycle / (2.0 * t.fp32_lanes), 1.0)


def overlapped(*cycles: np.ndarray) -> np.ndarray:
    """Cycles of streams (compute, each cache level's traffic) that run side by side: the longest, plus
    the part of the others it does not hide (HIDDEN)."""
    stacked = np.stack(np.broadcast_arrays(*cycles))
    longest = stacked.max(axis=0)
    return longest + (1.0 - HIDDEN) * (stacked.sum(axis=0) - longest)
