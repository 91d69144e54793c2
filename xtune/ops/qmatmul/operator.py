"""The qmatmul operator: its workload keys and their validation, tensors (int8/uint8/int32 element
types), exact reference and random inputs that fit together (xtune/ops/qmatmul/reference.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar, cast

import numpy as np

from xtune.errors import InputError
from xtune.graph import Graph, Node
from xtune.ops.anchor import Anchor
from xtune.ops.epilogue import require_positive
from xtune.ops.featurize import FeatureSet
from xtune.ops.layout import Layout
from xtune.ops.qlinear import requant_key
from xtune.ops.qmatmul import reference as qref
from xtune.ops.qmatmul.features import FEATURES
from xtune.ops.qmatmul.onnx import qmatmul_anchor
from xtune.ops.qmatmul.template import QMatmulTemplate
from xtune.ops.template import ScheduleTemplate
from xtune.ops.workload import DTypeName, Inits, ParamValue, TensorSpec, Workload
from xtune.target import Target

if TYPE_CHECKING:
    import onnx

# The largest k of a quantized matmul: 65536 products of 8-bit values, each at most 255 * 128 in size
# after the zero point, stay within the int32 accumulator (2^16 * 32640 < 2^31).
QMATMUL_MAX_K = 65536
QTYPES: dict[str, DTypeName] = {"u8": "uint8", "s8": "int8"}
# The quantization keys every int8 family takes (qmatmul, qconv2d, qdepthwise): the activation type, the
# requantization (whose reference to equal), scales per tensor or per output channel, and dequant=1 where
# the kernel writes its 8-bit result dequantized to float32 (a DequantizeLinear after it fused: the
# `out_scale` input; docs/int8.md, "Fused boundaries").
QUANT_KEYS = ("a", "requant", "perchannel", "dequant")
QUANT_DEFAULTS: dict[str, ParamValue] = {"a": "s8", "requant": "onnx", "perchannel": 0, "dequant": 0}
QUANT_WORDS: dict[str, tuple[str, ...]] = {"a": ("s8", "u8"), "requant": ("onnx", "tflite", "none")}


def validate_quant(op: str, params: dict[str, ParamValue]) -> None:
    if params["perchannel"] not in (0, 1):
        raise InputError(f"{op}: 'perchannel' must be 0 or 1, got {params['perchannel']}")
    if params["perchannel"] and params["requant"] == "none":
        raise InputError(f"{op}: requant=none has no scales, so no 'perchannel'")
    if params["dequant"] not in (0, 1):
        raise InputError(f"{op}: 'dequant' must be 0 or 1, got {params['dequant']}")
    if params["dequant"] and params["requant"] == "none":
        raise InputError(f"{op}: requant=none writes int32 sums, which 'dequant' does not take")


def quant_tensors(wl: Workload, channels: int) -> tuple[TensorSpec, ...]:
    """The scales of the workload's `requant` (per tensor, or per each of `channels` output channels), the
    dequantized output's scale (dequant=1) and qparams = [za, zy, lo, hi]: the tensors between an int8
    kernel's bias and its output."""
    c = (channels if wl["perchannel"] else 1,)
    scales = {
        "onnx": (TensorSpec("scale", c, constant=True),),
        "tflite": (
            TensorSpec("multiplier", c, dtype="int32", constant=True),
            TensorSpec("shift", c, dtype="int32", constant=True),
        ),
        "none": (),
    }[str(wl.value("requant"))]
    out_scale = (TensorSpec("out_scale", (1,), constant=True),) if wl["dequant"] else ()
    return (*scales, *out_scale, TensorSpec("qparams", (4,), dtype="int32", constant=True))


def output_dtype(wl: Workload) -> DTypeName:
    """The stored output's type: the activation's, float32 with dequant=1, or the int32 sums with
    requant=none."""
    if wl["dequant"]:
        return "float32"
    return "int32" if wl.value("requant") == "none" else QTYPES[str(wl.value("a"))]


def requant_of(wl: Workload) -> qref.Requant:
    return cast(qref.Requant, wl.value("requant"))


class QMatmul:
    """Quantized C[m,n] = requantize(sum_k (A[m,k] - za) * B[k,n] + bias[n]): A uint8 or int8 (`a`), B int8
    weights, int32 bias; C of A's type (or the int32 sums with requant=none, ONNX's MatMulInteger).
    requant=onnx takes a float32 scale (ONNX Runtime's), tflite a quantized multiplier and shift (TFLite's),
    per tensor or per output channel (perchannel=1); qparams = [za, zy, lo, hi] holds the zero points and
    the output clamp (a fused ReLU/ReLU6 narrows it). The weights are always passed prepacked (the
    template's `kernel_inputs`), as every quantized network's constant weights are. Exact reference:
    xtune/ops/qmatmul/reference.py."""

    name: ClassVar[str] = "qmatmul"
    keys: ClassVar[tuple[str, ...]] = ("m", "n", "k", *QUANT_KEYS)
    defaults: ClassVar[dict[str, ParamValue]] = QUANT_DEFAULTS
    optional: ClassVar[frozenset[str]] = frozenset(QUANT_KEYS)
    words: ClassVar[dict[str, tuple[str, ...]]] = QUANT_WORDS

    def validate(self, params: dict[str, ParamValue]) -> None:
        require_positive(self.name, params, ("m", "n", "k"))
        validate_quant(self.name, params)
        if int(params["k"]) > QMATMUL_MAX_K:
            raise InputError(
                f"{self.name}: 'k' is {params['k']}, more than the {QMATMUL_MAX_K} an int32 "
                "accumulator of 8-bit products holds"
            )

    def tensors(self, wl: Workload) -> tuple[TensorSpec, ...]:
        m, n, k = wl["m"], wl["n"], wl["k"]
        return (
            TensorSpec("A", (m, k), dtype=QTYPES[str(wl.value("a"))]),
            TensorSpec("B", (k, n), dtype="int8", constant=True),
            TensorSpec("bias", (n,), dtype="int32", constant=True),
            *quant_tensors(wl, n),
            TensorSpec("C", (m, n), is_output=True, dtype=output_dtype(wl), exact=True),
        )

    def reference(self, wl: Workload, inputs: list[np.ndarray]) -> np.ndarray:
        return qref.qmatmul(inputs, str(wl.value("a")), requant_of(wl))

    def sample(self, wl: Workload, rng: np.random.Generator) -> list[np.ndarray]:
        """Random inputs that make sense together (xtune.ops.workload.random_inputs calls this)."""
        shape, channels = (wl["m"], wl["n"], wl["k"]), wl["n"] if wl["perchannel"] else 1
        return qref.sample_inputs(
            shape, str(wl.value("a")), requant_of(wl), channels, rng, bool(wl["dequant"])
        )

    def flops(self, wl: Workload) -> int:
        return 2 * wl["m"] * wl["n"] * wl["k"]  # integer multiply-adds, counted as two operations

    # The family's other half: its template and features, and the ONNX nodes it runs
    # (xtune/ops/qmatmul/onnx.py); no ONNX model is written of a workload: benchmarks/bench_int8.py runs
    # its peer.
    onnx_ops: ClassVar[tuple[str, ...]] = ("QLinearMatMul", "MatMulInteger")
    layouts: ClassVar[frozenset[Layout]] = frozenset((Layout.NCHW,))
    feature_sets: ClassVar[tuple[FeatureSet, ...]] = (FEATURES,)

    def template(self, wl: Workload, target: Target) -> ScheduleTemplate:
        return QMatmulTemplate(wl, target)

    def features(self, template: ScheduleTemplate) -> tuple[FeatureSet, ScheduleTemplate]:
        return FEATURES, template

    def anchor(self, graph: Graph, node: Node) -> Anchor | None:
        return qmatmul_anchor(graph, node)

    def task_key(self, anchor: Anchor, switches: dict[str, ParamValue], layout: Layout) -> str:
        """The workload of a call: its requantization ONNX Runtime's or TFLite's (MatMulInteger: none), per
        column where the weights' scale is; the epilogue switches of float kernels do not apply (the bias is
        always there, the clamp is in qparams)."""
        quant = anchor.quant or {}
        act = "u8" if quant["A"].dtype == np.uint8 else "s8"  # A's element type, as an empty array
        return anchor.key((("a", act), *requant_key(quant)), {})

    def task_weights(self, wl: Workload, weights: np.ndarray) -> np.ndarray:
        return weights

    def onnx_nodes(self, wl: Workload, x: str, out: str, inits: Inits) -> list[onnx.NodeProto]:
        raise InputError("qmatmul: no ONNX model is written for it (benchmarks/bench_int8.py runs its peer)")
