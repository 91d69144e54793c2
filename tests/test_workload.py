"""Workload parsing, references and flop counts (pure, no toolchain)."""

import numpy as np
import pytest

from xtune.errors import InputError
from xtune.workload import parse_workload, random_inputs


def test_matmul_parses_to_canonical_key_and_shapes() -> None:
    wl = parse_workload(" matmul:k=63, m=127,n=255 ")
    assert wl.key == "matmul:m=127,n=255,k=63"
    assert wl.symbol == "matmul_m127_n255_k63"
    assert [t.shape for t in wl.tensors()] == [(127, 63), (63, 255), (127, 255)]
    assert [t.is_output for t in wl.tensors()] == [False, False, True]
    assert wl.flops() == 2 * 127 * 255 * 63
    assert parse_workload(wl.key) == wl


def test_matmul_reference_is_float32_product() -> None:
    wl = parse_workload("matmul:m=5,n=3,k=7")
    a, b = random_inputs(wl)
    out = wl.reference([a, b])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("conv:m=1", "unknown operator 'conv'"),
        ("matmul:m=4,n=4", "missing size 'k'"),
        ("matmul:m=0,n=4,k=4", "'m' must be a positive integer"),
        ("matmul:m=-3,n=4,k=4", "'m' must be a positive integer"),
        ("matmul:m=4,n=4,k=4,q=1", "unknown key 'q'"),
        ("matmul:m=4,n=four,k=4", "'n' must be an integer"),
        ("matmul:m=4,n,k=4", "expected key=value"),
    ],
)
def test_bad_workloads_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_workload(text)
