"""Target descriptors' nominal fp32 peak: the issue rate the cores' optimization guides give (the sources are
cited in each targets/*.toml), and what reads it (features' estimate, % of peak) follows the descriptor."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from xtune.ops.registry import parse_workload
from xtune.target import get_target, load_targets
from xtune.templates import template_for
from xtune.tuning.features import MATMUL_FEATURES, featurize

# Vector (or scalar, without vectors) FMAs each core issues per cycle, per the documents the tomls cite.
FMAS_PER_CYCLE = {
    "arm-a72-neon": 1.0,  # one Q-form FMLA per cycle over F0+F1 (Cortex-A72 Software Optimization Guide)
    "arm-a53-neon": 0.5,  # a Q-form FMLA holds the 64-bit MAC pipe two cycles
    "arm-a76-dotprod": 2.0,  # two Q-form FMLAs per cycle on V0/V1 (Cortex-A76 Software Optimization Guide)
    "x86-avx2": 2.0,
    "x86-avx512": 2.0,
    "x86-avx2-vnni": 2.0,  # x86-avx2's float units
    "x86-avx512-vnni": 2.0,  # x86-avx512's float units
    "x86-sse42": 2.0,  # no FMA: 2 mulps + 2 addps per cycle on Zen 3, i.e. 2 FMAs' worth
    "riscv64-gc": 1.0,
    "riscv64-gcv": 1.0,
}


@pytest.mark.parametrize("name", sorted(load_targets()))
def test_nominal_peak_is_the_documented_fma_rate(name: str) -> None:
    t = get_target(name)
    assert t.fp32_flops_per_cycle == 2 * t.fp32_lanes * FMAS_PER_CYCLE[name]
    assert t.peak_gflops == pytest.approx(t.clock_ghz * t.fp32_flops_per_cycle)


def test_the_estimate_follows_the_descriptor_s_issue_rate() -> None:
    """features.py's analytic estimate reads fp32_flops_per_cycle (its est_* columns, and only those): the
    A72 at the old 16 flop/cycle gave other estimates than at its documented 8."""
    a72 = get_target("arm-a72-neon")
    wl = parse_workload("matmul:m=512,n=512,k=512")
    indices = np.arange(0, template_for(wl, a72).space.size, 997)
    now = featurize(template_for(wl, a72), indices)
    wide = featurize(template_for(wl, dataclasses.replace(a72, fp32_flops_per_cycle=16)), indices)
    est = [MATMUL_FEATURES.index(n) for n in ("est_micro_eff", "est_eff")]
    assert not np.allclose(now[:, est], wide[:, est])
    assert np.array_equal(
        np.delete(now, range(32, now.shape[1]), 1), np.delete(wide, range(32, now.shape[1]), 1)
    )
