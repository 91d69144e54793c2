"""Matmul features: finite, relative to the target, and an analytic estimate that orders the obvious cases."""

from __future__ import annotations

import numpy as np
import pytest

from xtune.target import get_target, load_targets
from xtune.templates import template_for
from xtune.tuning.features import MATMUL_FEATURES, estimate_prior, feature_names, featurize
from xtune.workload import parse_workload

EST = MATMUL_FEATURES.index("est_eff")
VECTOR_TARGETS = ("x86-avx2", "x86-sse42", "x86-avx512", "arm-a72-neon", "riscv64-gcv")
SHAPES = ("matmul:m=512,n=512,k=512", "matmul:m=127,n=255,k=63", "matmul:m=1,n=1,k=1")


@pytest.mark.parametrize("target_name", sorted(load_targets()))
@pytest.mark.parametrize("workload", SHAPES)
def test_features_are_finite_and_the_estimate_is_a_fraction_of_peak(workload: str, target_name: str) -> None:
    template = template_for(parse_workload(workload), get_target(target_name))
    rng = np.random.default_rng(0)
    indices = rng.integers(template.space.size, size=200)
    x = featurize(template, indices)
    assert x.shape == (200, len(feature_names("matmul"))) and np.isfinite(x).all()
    assert ((x[:, EST] > 0) & (x[:, EST] <= 1.0)).all()


@pytest.mark.parametrize("target_name", VECTOR_TARGETS)
def test_the_estimate_prefers_the_default_over_a_degenerate_schedule(target_name: str) -> None:
    """A 1x1 register tile, nothing packed, k in blocks of 8 and no unrolling is slow on any vector CPU:
    one FMA per two loads and a call per 8 k steps."""
    template = template_for(parse_workload("matmul:m=256,n=256,k=256"), get_target(target_name))
    default = template.default_config()
    degenerate = template.space.index_of({**dict(default.values), "tile": "1x1", "kc": 8, "pack_a": 0,
                                          "pack_b": 0, "unroll_k": 1})  # fmt: skip
    est = featurize(template, [default.index, degenerate])[:, EST]
    assert est[0] > 2 * est[1]


def test_the_estimate_sees_register_tiles_that_hide_fma_latency() -> None:
    """Fewer accumulators than FMA latency x FMA ports leave the FMA units idle (Zen 3 / Intel
    optimization manuals: 4-cycle FMA latency, 2 ports), so 1x2 must score below 4x3 on AVX2."""
    template = template_for(parse_workload("matmul:m=240,n=240,k=256"), get_target("x86-avx2"))
    base = dict(template.default_config().values)
    small, large = (template.space.index_of({**base, "tile": t}) for t in ("1x2", "4x3"))
    est = featurize(template, [small, large])[:, EST]
    assert est[1] > 1.5 * est[0]


def test_the_prior_scores_by_the_estimate_column() -> None:
    template = template_for(parse_workload("matmul:m=64,n=64,k=64"), get_target("x86-avx2"))
    x = featurize(template, np.arange(50))
    prior = estimate_prior("matmul")
    assert prior is not None
    np.testing.assert_array_equal(prior.predict(x), x[:, EST])
    assert estimate_prior("conv2d") is None  # no estimate column: a cold tuner starts from random configs
