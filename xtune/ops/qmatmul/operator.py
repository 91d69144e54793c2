"""The qmatmul operator: its workload keys and their validation, tensors (int8/uint8/int32 element
types), exact reference and random inputs that fit together (xtune/ops/qmatmul/reference.py)."""

from __future__ import annotations

from typing import ClassVar, cast

import numpy as np

from xtune.errors import InputError
from xtune.operators import require_positive
from xtune.ops.qmatmul import reference as qref
from xtune.ops.workload import DTypeName, ParamValue, TensorSpec, Workload

# The largest k of a quantized matmul: 65536 products of 8-bit values, each at most 255 * 128 in size
# after the zero point, stay within the int32 accumulator (2^16 * 32640 < 2^31).
QMATMUL_MAX_K = 65536
_QTYPES: dict[str, DTypeName] = {"u8": "uint8", "s8": "int8"}


class QMatmul:
    """Quantized C[m,n] = requantize(sum_k (A[m,k] - za) * B[k,n] + bias[n]): A uint8 or int8 (`a`), B int8
    weights, int32 bias; C of A's type (or the int32 sums with requant=none, ONNX's MatMulInteger).
    requant=onnx takes a float32 scale (ONNX Runtime's), tflite a quantized multiplier and shift (TFLite's),
    per tensor or per output channel (perchannel=1); qparams = [za, zy, lo, hi] holds the zero points and
    the output clamp (a fused ReLU/ReLU6 narrows it). The weights are always passed prepacked (the
    template's `kernel_inputs`), as every quantized network's constant weights are. Exact reference:
    xtune/ops/qmatmul/reference.py."""

    name: ClassVar[str] = "qmatmul"
    keys: ClassVar[tuple[str, ...]] = ("m", "n", "k", "a", "requant", "perchannel")
    defaults: ClassVar[dict[str, ParamValue]] = {"a": "s8", "requant": "onnx", "perchannel": 0}
    optional: ClassVar[frozenset[str]] = frozenset(("a", "requant", "perchannel"))
    words: ClassVar[dict[str, tuple[str, ...]]] = {"a": ("s8", "u8"), "requant": ("onnx", "tflite", "none")}

    def validate(self, params: dict[str, ParamValue]) -> None:
        require_positive(self.name, params, ("m", "n", "k"))
        if params["perchannel"] not in (0, 1):
            raise InputError(f"{self.name}: 'perchannel' must be 0 or 1, got {params['perchannel']}")
        if params["perchannel"] and params["requant"] == "none":
            raise InputError(f"{self.name}: requant=none has no scales, so no 'perchannel'")
        if int(params["k"]) > QMATMUL_MAX_K:
            raise InputError(
                f"{self.name}: 'k' is {params['k']}, more than the {QMATMUL_MAX_K} an int32 "
                "accumulator of 8-bit products holds"
            )

    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]:
        m, n, k = wl["m"], wl["n"], wl["k"]
        act, requant = _QTYPES[str(wl.value("a"))], wl.value("requant")
        c = (n if wl["perchannel"] else 1,)
        scales = {
            "onnx": (TensorSpec("scale", c),),
            "tflite": (TensorSpec("multiplier", c, dtype="int32"), TensorSpec("shift", c, dtype="int32")),
            "none": (),
        }[str(requant)]
        return (
            TensorSpec("A", (m, k), dtype=act),
            TensorSpec("B", (k, n), dtype="int8"),
            TensorSpec("bias", (n,), dtype="int32"),
            *scales,
            TensorSpec("qparams", (4,), dtype="int32"),
            TensorSpec("C", (m, n), is_output=True, dtype="int32" if requant == "none" else act),
        )

    def reference(self, wl: Workload, inputs: list[np.ndarray]) -> np.ndarray:
        return qref.qmatmul(inputs, str(wl.value("a")), _requant(wl))

    def sample(self, wl: Workload, rng: np.random.Generator) -> list[np.ndarray]:
        """Random inputs that make sense together (xtune.ops.workload.random_inputs calls this)."""
        shape, channels = (wl["m"], wl["n"], wl["k"]), wl["n"] if wl["perchannel"] else 1
        return qref.sample_inputs(shape, str(wl.value("a")), _requant(wl), channels, rng)

    def flops(self, wl: Workload) -> int:
        return 2 * wl["m"] * wl["n"] * wl["k"]  # integer multiply-adds, counted as two operations


def _requant(wl: Workload) -> qref.Requant:
    return cast(qref.Requant, wl.value("requant"))
