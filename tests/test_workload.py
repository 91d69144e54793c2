"""Workload parsing, references and flop counts (pure, no toolchain)."""

import numpy as np
import pytest

from xtune.errors import InputError
from xtune.ops.registry import parse_workload
from xtune.ops.workload import MAX_TENSOR_ELEMENTS, MAX_VALUE, random_inputs


def test_matmul_parses_to_canonical_key_and_shapes() -> None:
    wl = parse_workload("matmul:k=63,m=127,n=255")
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
        # The grammar is strict (README.md, "Workloads"): ASCII decimal integers, each key once, no
        # empty items and no spaces; Python's int() would take every one of these.
        ("matmul:m=16,n=16,k=16,m=8", "'m' is given twice"),
        ("matmul:m=\u0661\u0666,n=4,k=4", "'m' must be an integer"),
        ("matmul:m=\uff11\uff16,n=4,k=4", "'m' must be an integer"),
        ("matmul:m=1_6,n=4,k=4", "'m' must be an integer"),
        ("matmul:m=+8,n=4,k=4", "'m' must be an integer"),
        ("matmul:m= 8,n=4,k=4", "'m' must be an integer"),
        ("matmul:m =8,n=4,k=4", "unknown key 'm '"),
        ("matmul:m=8,,n=4,k=4", "empty item"),
        ("matmul:m=8,n=4,k=4,", "empty item"),
        ("matmul:", "no key=value items"),
        (" matmul:m=8,n=4,k=4", "unknown operator ' matmul'"),
        ("conv2d:n=1,c=3,h=8,w=8,k=3,r=3,s=3,layout=NHWC", "'layout' must be one of nchw, nhwc"),
    ],
)
def test_bad_workloads_name_the_problem(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_workload(text)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        # The reports' cases: a size past 2^63 or 2^64 built an infinite loop and a header claiming
        # 590295810358705653440 stack bytes; 100000^3 died allocating 74.5 GiB.
        ("conv2d:n=17,c=3,h=16,w=9223372036854775808,k=3,r=5,s=3", "'w' is 9223372036854775808, more than"),
        ("conv2d:n=17,c=3,h=16,w=9,k=18446744073709551616,r=5,s=3", "'k' is 18446744073709551616, more than"),
        ("matmul:m=2147483648,n=1,k=1", "more than the largest value xtune takes \\(2147483647\\)"),
        ("matmul:m=" + "9" * 5000 + ",n=1,k=1", "more than the largest value"),
        ("matmul:m=100000,n=100000,k=100000", "tensor 'A' \\(100000x100000\\) has 10000000000 elements"),
        # each size is in range, but the product is not (np.prod would wrap around at 2^63)
        (
            "conv2d:n=1,c=3,h=16,w=16,k=3,r=3,s=3,pad=2147483647",
            f"tensor 'output' .* has {3 * (14 + 2 * MAX_VALUE) ** 2} ",
        ),
        ("depthwise:n=65536,c=65536,h=1,w=1,r=1,s=1", "tensor 'input'"),
    ],
)
def test_sizes_past_the_bounds_are_refused(text: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_workload(text)


def test_the_largest_allowed_tensor_parses_and_one_more_element_does_not() -> None:
    assert parse_workload(f"matmul:m={MAX_TENSOR_ELEMENTS},n=1,k=1").tensors()[0].size == MAX_TENSOR_ELEMENTS
    with pytest.raises(InputError, match="tensor 'A'"):
        parse_workload(f"matmul:m={MAX_TENSOR_ELEMENTS + 1},n=1,k=1")


def test_leading_zeros_name_the_same_workload() -> None:
    assert parse_workload("matmul:m=08,n=8,k=8").key == "matmul:m=8,n=8,k=8"
