"""Workloads: an operator and its key=value text (as in "matmul:m=512,n=512,k=512") in, a frozen
`Workload` with its tensors, numpy reference and flop count out; the grammar, the bounds every workload
keeps, deterministic random inputs and the check of an output against the reference. What each operator
owns is behind the `Operator` protocol (its family, xtune/ops/family.py); xtune/ops/registry.py finds
it by name."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Protocol

import numpy as np

from xtune.errors import InputError

DTypeName = Literal["float32", "int8", "uint8", "int32"]


@dataclass(frozen=True)
class TensorSpec:
    """One argument of a kernel, row-major (C order): float32 unless a quantized operator says otherwise
    (`dtype` is numpy's name of the element type)."""

    name: str
    shape: tuple[int, ...]
    is_output: bool = False
    dtype: DTypeName = "float32"
    axes: str = ""  # what each dimension is, where a header must say it (a weights tensor's layout)
    # An output whose reference is bit-exact (an int8 kernel's, its dequantized float32 one included):
    # a candidate's is checked with rtol 0, equal at every finite position.
    exact: bool = False
    # A network's constant (weights, bias, quantization parameters): read-only data in the firmware, which
    # a layer finds out of cache after the rest of the network ran (MeasureOptions.cold_weights evicts it).
    constant: bool = False

    @property
    def size(self) -> int:
        return math.prod(self.shape)  # exact: np.prod wraps around at 2^63


ParamValue = int | str
Inits = dict[str, np.ndarray]  # constant tensors by name: a model's initializers


class Operator(Protocol):
    """What each op owns: its keys with defaults, validation, tensors, reference and flop count."""

    name: ClassVar[str]
    keys: ClassVar[tuple[str, ...]]  # in canonical order
    defaults: ClassVar[dict[str, ParamValue]]
    optional: ClassVar[frozenset[str]]  # keys left out of the canonical text while at their default
    words: ClassVar[dict[str, tuple[str, ...]]]  # keys whose values are words rather than integers

    def validate(self, params: dict[str, ParamValue]) -> None: ...
    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]: ...
    def reference(self, wl: Workload, inputs: list[np.ndarray]) -> np.ndarray: ...
    def flops(self, wl: Workload) -> int: ...


@dataclass(frozen=True)
class Workload:
    """An operator with all its sizes fixed; `key` is its canonical text and identity.

    `params` holds every key in the operator's canonical order, except optional keys at their
    default value (so "matmul:m=8,n=8,k=8" and "matmul:m=8,n=8,k=8,bias=0" are one workload and
    logs written before a key existed stay valid); lookups fall back to the operator's defaults."""

    op: str
    params: tuple[tuple[str, ParamValue], ...]
    operator: Operator = field(compare=False, repr=False)

    def value(self, name: str) -> ParamValue:
        for key, value in self.params:
            if key == name:
                return value
        return self.operator.defaults[name]

    def __getitem__(self, name: str) -> int:
        value = self.value(name)
        if not isinstance(value, int):
            raise TypeError(f"{self.op}: '{name}' is the word {value!r}, not an integer")
        return value

    @property
    def key(self) -> str:
        return f"{self.op}:" + ",".join(f"{k}={v}" for k, v in self.params)

    @property
    def symbol(self) -> str:
        """A C identifier fragment, e.g. matmul_m512_n512_k512."""
        return "_".join([self.op] + [f"{k}{v}" for k, v in self.params])

    def tensors(self) -> tuple[TensorSpec, ...]:
        return self.operator.tensors(self)

    def flops(self) -> int:
        return self.operator.flops(self)

    def reference(self, inputs: list[np.ndarray]) -> np.ndarray:
        return self.operator.reference(self, inputs)

    def __str__(self) -> str:
        return self.key


# The grammar (README.md, "Workloads"): OP ":" ITEM ("," ITEM)*, ITEM = KEY "=" VALUE, each KEY at most
# once, VALUE an ASCII decimal integer ("-" allowed, "+", "_" and other scripts' digits not) or one of the
# key's words; no spaces and no empty items. Python's int() would take " +1_6 " and "١٦", so it is never the
# grammar. Every integer and every tensor is bounded below so that no index of any kernel can overflow.
MAX_VALUE = 2**31 - 1  # any size, stride, pad or dilation: an i32 even after a target narrows it
# Each tensor at most 2^27 float32 (512 MiB): below the agent protocol's 1 GiB payload limit
# (xtune/agent_src/PROTOCOL.md), what a 1 GiB board can hold, and indexable by any 32- or 64-bit pointer;
# every index a kernel computes is then far inside its i64 arithmetic.
MAX_TENSOR_ELEMENTS = 2**27


def _parse_value(op: Operator, key: str, text: str) -> ParamValue:
    if key in op.words:
        if text not in op.words[key]:
            raise InputError(f"{op.name}: '{key}' must be one of {', '.join(op.words[key])}, got {text!r}")
        return text
    digits = text.removeprefix("-")  # parsed, so that the operator's check says what the key takes
    if not (digits.isascii() and digits.isdigit()):
        raise InputError(f"{op.name}: '{key}' must be an integer (ASCII digits 0-9), got {text!r}")
    if len(digits.lstrip("0")) > len(str(MAX_VALUE)) or int(digits) > MAX_VALUE:  # no int() of 10^6 digits
        bound = (
            f"less than the smallest value xtune takes (-{MAX_VALUE})"
            if text.startswith("-")
            else (f"more than the largest value xtune takes ({MAX_VALUE})")
        )
        raise InputError(f"{op.name}: '{key}' is {text[:24]}{'...' if len(text) > 24 else ''}, {bound}")
    return int(text)


def _items(op: Operator, rest: str, text: str) -> dict[str, ParamValue]:
    """The key=value items of `rest`, each key once, with the operator's defaults for the others."""
    params, seen = dict(op.defaults), set()
    for item in rest.split(",") if rest else []:
        key, eq, value = item.partition("=")
        if not item:
            raise InputError(f"{op.name}: empty item in workload {text!r} (key=value items, comma-separated)")
        if not eq:
            raise InputError(f"{op.name}: expected key=value, got {item!r}")
        if key not in op.keys:
            raise InputError(f"{op.name}: unknown key {key!r} (known: {', '.join(op.keys)})")
        if key in seen:
            raise InputError(f"{op.name}: '{key}' is given twice in workload {text!r}")
        seen.add(key)
        params[key] = _parse_value(op, key, value)
    return params


def _check_tensors(wl: Workload) -> None:
    for t in wl.tensors():
        if t.size > MAX_TENSOR_ELEMENTS:
            dims = "x".join(map(str, t.shape))
            raise InputError(
                f"{wl.op}: tensor '{t.name}' ({dims}) has {t.size} elements, more than the "
                f"{MAX_TENSOR_ELEMENTS} (512 MiB of float32) xtune allows per tensor"
            )


def make_workload(op: Operator, rest: str, text: str) -> Workload:
    """The canonical Workload of operator `op` from `rest`, the key=value items of `text` after "OP:", or
    InputError naming the problem (xtune/ops/registry.py's `parse_workload` finds `op` by name)."""
    if text.partition(":")[1] and not rest:
        raise InputError(f"{op.name}: no key=value items after ':' in workload '{text}'")
    params = _items(op, rest, text)
    op.validate(params)
    # An operator with two spellings of one workload (a convolution's padding) names the canonical one.
    canonical = getattr(op, "canonical", None)
    if canonical is not None:
        params = canonical(params)
    items = (
        (key, params[key])
        for key in op.keys
        if key in params and not (key in op.optional and params[key] == op.defaults[key])
    )
    wl = Workload(op.name, tuple(items), op)
    _check_tensors(wl)
    return wl


def random_inputs(wl: Workload, seed: int = 0) -> list[np.ndarray]:
    """Deterministic inputs: float32 in [-1, 1) (small enough that fp32 sums stay well conditioned), or
    what a quantized operator's own `sample` draws (zero points, scales and tensors that fit together)."""
    rng = np.random.default_rng(seed)
    sample = getattr(wl.operator, "sample", None)
    if sample is not None:
        return list(sample(wl, rng))
    return [rng.uniform(-1, 1, t.shape).astype(np.float32) for t in wl.tensors() if not t.is_output]


# compare_output's default tolerance: max|got - ref| <= RTOL * max(1, max|ref|) (docs/design.md, Measurement)
RTOL = 1e-4


def compare_output(got: np.ndarray, expected: np.ndarray, rtol: float) -> str:
    """'' if `got` matches the reference, else why not. Non-finite values match by position and value
    (an inf of the same sign, a NaN where the reference has NaN: IEEE 754 arithmetic on non-finite weights
    gives them); any other non-finite difference is wrong, and a NaN where the reference is finite always
    is (the output buffer starts as NaN: an element never written). Finite positions: max|got - ref| <=
    rtol * max(1, max|ref|). Integer outputs (quantized operators) must equal the reference exactly:
    their references are bit-exact."""
    if expected.dtype.kind in "iu":
        return _check_exact(got, expected)
    finite = np.isfinite(got) & np.isfinite(expected)
    if not finite.all():
        why = _nonfinite_mismatch(got, expected, finite)
        if why:
            return why
    err = max_abs_error(got, expected)
    scale = max(1.0, float(np.max(np.abs(expected[finite])))) if finite.any() else 1.0
    if err > rtol * scale:
        with np.errstate(invalid="ignore"):  # inf - inf at the non-finite positions left out
            gap = np.where(finite, np.abs(got - expected), -1.0)
        where = np.unravel_index(int(np.argmax(gap)), expected.shape)
        return f"max abs error {err:.3g} > {rtol * scale:.3g} at {tuple(int(i) for i in where)}"
    return ""


def _nonfinite_mismatch(got: np.ndarray, expected: np.ndarray, finite: np.ndarray) -> str:
    unwritten = np.isnan(got) & np.isfinite(expected)
    if unwritten.any():
        bad = int(np.count_nonzero(unwritten))
        return f"{bad} of {got.size} outputs are not finite (NaN where the reference is finite: unwritten)"
    same = (got == expected) | (np.isnan(got) & np.isnan(expected))
    differ = ~finite & ~same
    if not differ.any():
        return ""
    at = np.unravel_index(int(np.argmax(differ)), expected.shape)
    first = f"{tuple(int(i) for i in at)}, {got[at]} where the reference has {expected[at]}"
    return f"{int(np.count_nonzero(differ))} non-finite output(s) differ from the reference: first at {first}"


def max_abs_error(got: np.ndarray, expected: np.ndarray) -> float:
    """max|got - ref| over the positions where both are finite (0 where there are none)."""
    finite = np.isfinite(got) & np.isfinite(expected)
    if finite.all():
        return float(np.max(np.abs(got - expected))) if expected.size else 0.0
    return float(np.max(np.abs(got[finite] - expected[finite]))) if finite.any() else 0.0


def _check_exact(got: np.ndarray, expected: np.ndarray) -> str:
    wrong = got != expected
    if not wrong.any():
        return ""
    diff = np.abs(got.astype(np.int64) - expected.astype(np.int64))
    where = np.unravel_index(int(np.argmax(diff)), expected.shape)
    return (
        f"{int(wrong.sum())} of {got.size} outputs differ from the reference, by up to {int(diff.max())} "
        f"at {tuple(int(i) for i in where)}"
    )
