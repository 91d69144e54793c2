"""Workloads: text such as "matmul:m=512,n=512,k=512" in, a frozen `Workload` with its tensors,
numpy reference and flop count out."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Protocol

import numpy as np

from xtune.errors import InputError


@dataclass(frozen=True)
class TensorSpec:
    """One float32 argument of a kernel, row-major (C order)."""

    name: str
    shape: tuple[int, ...]
    is_output: bool = False

    @property
    def size(self) -> int:
        return int(np.prod(self.shape))


@dataclass(frozen=True)
class Workload:
    """An operator with all its sizes fixed; `key` is its canonical text and identity."""

    op: str
    params: tuple[tuple[str, int], ...]

    def __getitem__(self, name: str) -> int:
        for key, value in self.params:
            if key == name:
                return value
        raise KeyError(name)

    @property
    def key(self) -> str:
        return f"{self.op}:" + ",".join(f"{k}={v}" for k, v in self.params)

    @property
    def symbol(self) -> str:
        """A C identifier fragment, e.g. matmul_m512_n512_k512."""
        return "_".join([self.op] + [f"{k}{v}" for k, v in self.params])

    @property
    def operator(self) -> Operator:
        return OPERATORS[self.op]

    def tensors(self) -> tuple[TensorSpec, ...]:
        return self.operator.tensors(self)

    def flops(self) -> int:
        return self.operator.flops(self)

    def reference(self, inputs: list[np.ndarray]) -> np.ndarray:
        return self.operator.reference(self, inputs)

    def __str__(self) -> str:
        return self.key


class Operator(Protocol):
    """What each op owns: its keys with defaults, validation, tensors, reference and flop count."""

    name: str
    keys: tuple[str, ...]  # in canonical order
    defaults: ClassVar[dict[str, int]]

    def validate(self, params: dict[str, int]) -> None: ...
    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]: ...
    def reference(self, wl: Workload, inputs: list[np.ndarray]) -> np.ndarray: ...
    def flops(self, wl: Workload) -> int: ...


class Matmul:
    """C[m,n] = A[m,k] @ B[k,n], float32, row-major; the kernel overwrites C."""

    name = "matmul"
    keys: tuple[str, ...] = ("m", "n", "k")
    defaults: ClassVar[dict[str, int]] = {}

    def validate(self, params: dict[str, int]) -> None:
        _require_positive(self.name, params, self.keys)

    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]:
        m, n, k = wl["m"], wl["n"], wl["k"]
        return (TensorSpec("A", (m, k)), TensorSpec("B", (k, n)), TensorSpec("C", (m, n), is_output=True))

    def reference(self, wl: Workload, inputs: list[np.ndarray]) -> np.ndarray:
        a, b = inputs
        return np.matmul(a, b, dtype=np.float32)

    def flops(self, wl: Workload) -> int:
        return 2 * wl["m"] * wl["n"] * wl["k"]


OPERATORS: dict[str, Operator] = {op.name: op for op in (Matmul(),)}


def _require_positive(op: str, params: dict[str, int], keys: tuple[str, ...]) -> None:
    for key in keys:
        if key not in params:
            raise InputError(f"{op}: missing size '{key}'")
        if params[key] <= 0:
            raise InputError(f"{op}: '{key}' must be a positive integer, got {params[key]}")


def parse_workload(text: str) -> Workload:
    """Parse "OP:key=value,..." into a canonical Workload, or raise InputError naming the problem."""
    op_name, sep, rest = text.strip().partition(":")
    if op_name not in OPERATORS:
        raise InputError(f"unknown operator '{op_name}' in workload '{text}' (known: {', '.join(OPERATORS)})")
    op = OPERATORS[op_name]
    params = dict(op.defaults)
    for item in filter(None, (part.strip() for part in rest.split(","))) if sep else ():
        key, eq, value = item.partition("=")
        key = key.strip()
        if not eq:
            raise InputError(f"{op_name}: expected key=value, got '{item}'")
        if key not in op.keys:
            raise InputError(f"{op_name}: unknown key '{key}' (known: {', '.join(op.keys)})")
        try:
            params[key] = int(value)
        except ValueError:
            raise InputError(f"{op_name}: '{key}' must be an integer, got '{value.strip()}'") from None
    op.validate(params)
    return Workload(op_name, tuple((key, params[key]) for key in op.keys if key in params))


def random_inputs(wl: Workload, seed: int = 0) -> list[np.ndarray]:
    """Deterministic inputs in [-1, 1): small enough that fp32 sums stay well conditioned."""
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1, 1, t.shape).astype(np.float32) for t in wl.tensors() if not t.is_output]
