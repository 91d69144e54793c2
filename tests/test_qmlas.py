"""ONNX Runtime's own arithmetic for an ONNX model's QLinearAdd and QLinearGlobalAveragePool (and the QDQ
Add / GlobalAveragePool ONNX Runtime fuses into them), xtune/ops/qmlas.py, and for a BatchNormalization
between 8-bit tensors (xtune/ops/affine.py): the exact float32 FMA of the reference, the references
against ONNX Runtime's nodes over every pair of 8-bit inputs, and models written here — built for the host,
run, equal to ONNX Runtime bit for bit, rounding ties and saturation included, where the float form
(dequantize, compute, quantize) is not."""

from __future__ import annotations

from fractions import Fraction
from pathlib import Path
from typing import Literal

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from tests.networks import quantize_qdq
from xtune.boards.board import get_board
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import run_network
from xtune.ops.elementwise import Elementwise, ElementwiseOp
from xtune.ops.layout import Layout
from xtune.ops.pool2d import GlobalAveragePool
from xtune.ops.qmlas import QAdd, QGlobalAveragePool, fma32
from xtune.ops.qpointwise import Quantized
from xtune.ops.quantize import RANGES, QParams
from xtune.ops.workload import Workload
from xtune.tuning.peers import ort_network, ort_session

pytest.importorskip("onnxruntime.quantization")
HOST = "x86-avx2"  # every x86 host of the project runs AVX2 code, as ONNX Runtime's QLinearAdd does
OPSETS = [helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)]
QType = Literal["int8", "uint8"]
ONNX_TYPES = {"int8": TensorProto.INT8, "uint8": TensorProto.UINT8}
# Scales and zero points (a, b, c) where MLAS's fixed part zC - (rA·zA + rB·zB), contracted into one FMA
# as ONNX Runtime's x86-64 build computes it, and the uncontracted one round some sums differently.
ADDS: dict[QType, tuple[tuple[float, int], ...]] = {
    "int8": ((0.0996, -49), (0.0281, -110), (0.0294, 101)),
    "uint8": ((0.0557, 100), (0.02, 248), (0.0312, 107)),
}


def _exact_float32(value: Fraction) -> np.float32:
    """`value` rounded once to float32, half to even, by exact comparison with its neighbours."""
    guess = np.float32(float(value))
    candidates = [np.nextafter(guess, np.float32(d)) for d in (-np.inf, np.inf)] + [guess]
    best = min(candidates, key=lambda c: (abs(Fraction(float(c)) - value), int(c.view(np.uint32)) & 1))
    return np.float32(best)


def test_fma32_rounds_once_where_float64_rounds_twice() -> None:
    """1 + 2^-23 plus just under half its ulp: float64 rounds the sum to the halfway point, and float32
    then to even (1 + 2^-22); rounded once it stays. Random operands agree with exact arithmetic."""
    a, b, c = np.float32(2.0**-24 * (1 + 2.0**-20)), np.float32(1 - 2.0**-20), np.float32(1 + 2.0**-23)
    naive = np.float32(np.float64(a) * np.float64(b) + np.float64(c))
    assert naive == np.float32(1 + 2.0**-22) and fma32(a, b, c) == c
    rng = np.random.default_rng(3)
    xs = rng.integers(-255, 256, 400).astype(np.float32)
    ys = rng.uniform(0.01, 2, 400).astype(np.float32)
    zs = (rng.normal(0, 100, 400) * np.exp2(rng.integers(-30, 5, 400))).astype(np.float32)
    got = fma32(xs, ys, zs)
    exact = [
        _exact_float32(Fraction(float(x)) * Fraction(float(y)) + Fraction(float(z)))
        for x, y, z in zip(xs, ys, zs, strict=True)
    ]
    assert np.array_equal(got, np.array(exact, np.float32))


def _params(qtype: QType, which: tuple[tuple[float, int], ...]) -> list[QParams]:
    return [QParams(scale=float(np.float32(s)), zero=z, qtype=qtype) for s, z in which]


def _ort_node(
    op: str, inputs: dict[str, np.ndarray], params: list[QParams], out_shape: tuple[int, ...]
) -> np.ndarray:
    """ONNX Runtime's com.microsoft `op` alone on `inputs` (each followed by its scale and zero point in
    the node's inputs), quantized as `params` (the inputs', then the output's)."""
    kind = ONNX_TYPES[params[0].qtype]
    names: list[str] = []
    inits = []
    for i, q in enumerate(params):
        inits += [
            helper.make_tensor(f"s{i}", TensorProto.FLOAT, [], [q.scale]),
            helper.make_tensor(f"z{i}", kind, [], [q.zero]),
        ]
        names += [*([list(inputs)[i]] if i < len(inputs) else []), f"s{i}", f"z{i}"]
    node = helper.make_node(op, names, ["y"], domain="com.microsoft")
    graph = helper.make_graph(
        [node],
        op,
        [helper.make_tensor_value_info(n, kind, x.shape) for n, x in inputs.items()],
        [helper.make_tensor_value_info("y", kind, out_shape)],
        inits,
    )
    session = ort_session(helper.make_model(graph, opset_imports=OPSETS).SerializeToString())
    return np.asarray(session.run(None, inputs)[0])


@pytest.mark.parametrize("qtype", ["int8", "uint8"])
def test_qadd_reference_is_onnx_runtimes_qlinearadd_on_every_pair(qtype: QType) -> None:
    """All 65536 pairs of 8-bit inputs (the sums saturating at both ends, and ties): the reference is
    ONNX Runtime's node exactly; the float form is not."""
    qa, qb, qc = _params(qtype, ADDS[qtype])
    lo, hi = RANGES[qtype]
    levels = np.arange(lo, hi + 1)
    a, b = np.repeat(levels, 256).astype(qtype), np.tile(levels, 256).astype(qtype)
    ort = _ort_node("QLinearAdd", {"a": a, "b": b}, [qa, qb, qc], a.shape)
    op = QAdd(shape=a.shape, reads=(qa, qb), writes=qc)
    assert np.array_equal(op.reference(a, b), ort)
    assert {lo, hi} <= set(ort.tolist())
    float_form = Quantized(inner=Elementwise(op=ElementwiseOp.ADD, shape=a.shape), reads=(qa, qb), writes=qc)
    assert not np.array_equal(float_form.reference(a, b), ort)


def _pool_input(qtype: QType, rng: np.random.Generator) -> np.ndarray:
    """(1, 512, 2, 2) 8-bit pixels: random channels (means of four: ties), and channels all at one end
    (saturating)."""
    lo, hi = RANGES[qtype]
    x = rng.integers(lo, hi + 1, (1, 512, 2, 2))
    x[0, :8] = lo
    x[0, 8:16] = hi
    return x.astype(qtype)


@pytest.mark.parametrize("qtype", ["int8", "uint8"])
def test_qglobalaveragepool_reference_is_onnx_runtimes(qtype: QType) -> None:
    rng = np.random.default_rng(7)
    zeros = (3, -5) if qtype == "int8" else (131, 120)
    qx, qy = _params(qtype, ((0.05, zeros[0]), (0.03, zeros[1])))
    x = _pool_input(qtype, rng)
    ort = _ort_node("QLinearGlobalAveragePool", {"x": x}, [qx, qy], (1, 512, 1, 1))
    op = QGlobalAveragePool(n=1, c=512, h=2, w=2, reads=qx, writes=qy, layout=Layout.NCHW)
    assert np.array_equal(op.reference(x), ort)
    nhwc = QGlobalAveragePool(n=1, c=512, h=2, w=2, reads=qx, writes=qy)
    assert np.array_equal(nhwc.reference(np.ascontiguousarray(x.transpose(0, 2, 3, 1))), ort)
    lo, hi = RANGES[qtype]
    assert {lo, hi} <= set(ort.reshape(-1).tolist())
    pool = GlobalAveragePool(n=1, c=512, h=2, w=2)
    assert not np.array_equal(Quantized(inner=pool, reads=(qx,), writes=qy).reference(x), ort)


# --- models written here, built for the host -------------------------------------------------------------


def _q(name: str, q: QParams, inits: dict[str, np.ndarray]) -> list[str]:
    inits[f"{name}.s"] = np.array(q.scale, np.float32)
    inits[f"{name}.z"] = np.array(q.zero, q.qtype)
    return [f"{name}.s", f"{name}.z"]


def _qdq_add(
    path: Path, qtype: QType, adds: tuple[tuple[float, int], ...] | None = None
) -> tuple[Path, np.ndarray]:
    """x[1,1,256,256] -> Q(a) -> DQ, and x transposed, times sb/sa -> Q(b) -> DQ; their Add -> Q(c): the
    network's 8-bit output, quantized as `adds` (ADDS[qtype] by default). Row i of x is every level of a
    (x[i, j] = sa·(lo + j - za)), so the Add sees every level of a against the ~256 levels of b."""
    qa, qb, qc = _params(qtype, adds or ADDS[qtype])
    inits: dict[str, np.ndarray] = {"k": np.array(qb.scale / qa.scale, np.float32)}
    nodes = [
        helper.make_node("QuantizeLinear", ["x", *_q("a", qa, inits)], ["aq"]),
        helper.make_node("DequantizeLinear", ["aq", "a.s", "a.z"], ["ad"]),
        helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 1, 3, 2]),
        helper.make_node("Mul", ["xt", "k"], ["xk"]),
        helper.make_node("QuantizeLinear", ["xk", *_q("b", qb, inits)], ["bq"]),
        helper.make_node("DequantizeLinear", ["bq", "b.s", "b.z"], ["bd"]),
        helper.make_node("Add", ["ad", "bd"], ["s"]),
        helper.make_node("QuantizeLinear", ["s", *_q("c", qc, inits)], ["y"]),
    ]
    shape = [1, 1, 256, 256]
    graph = helper.make_graph(
        nodes,
        "qdq_add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
        [helper.make_tensor_value_info("y", ONNX_TYPES[qtype], shape)],
        [numpy_helper.from_array(v, k) for k, v in inits.items()],
    )
    onnx.save(helper.make_model(graph, opset_imports=OPSETS[:1]), path)
    lo = RANGES[qtype][0]
    row = (np.arange(256, dtype=np.float32) + np.float32(lo - qa.zero)) * np.float32(qa.scale)
    return path, np.broadcast_to(row, shape).astype(np.float32)


def _kinds(path: Path) -> list[str]:
    calls = build_model(path, HOST).program.calls
    return [c.kernel.op if isinstance(c.kernel, Workload) else c.kernel.label for c in calls]


@pytest.mark.parametrize("qtype", ["int8", "uint8"])
def test_a_qdq_add_built_for_the_host_is_onnx_runtimes(tmp_path: Path, qtype: QType) -> None:
    """ONNX Runtime's x86-64 build fuses the uint8 DequantizeLinear -> Add -> QuantizeLinear into its
    QLinearAdd (MLAS's formula), the int8 one not (the float form): one 8-bit kernel either way, with the
    arithmetic ONNX Runtime has."""
    path, x = _qdq_add(tmp_path / f"add_{qtype}.onnx", qtype)
    artifact = build_model(path, HOST)
    adds = [
        k for c in artifact.program.calls if not isinstance(k := c.kernel, Workload) and k.label == "qadd"
    ]
    assert len(adds) == 1 and isinstance(adds[0], QAdd if qtype == "uint8" else Quantized), adds
    got, _ = run_network(get_board("local"), artifact, x)
    ort = ort_network(path.read_bytes(), x)[0]
    assert np.array_equal(got, ort)
    lo, hi = RANGES[qtype]
    assert {lo, hi} <= set(ort.reshape(-1).tolist())


def _residual(path: Path, qtype: QType) -> Path:
    """x[1,4,6,6] -> Conv -> BatchNormalization -> Relu = r; two residual blocks (Conv -> BatchNormalization
    -> Add(r) -> Relu); GlobalAveragePool -> Flatten -> Gemm: quantize_static (QDQ, per channel) with
    `qtype` activations, the BatchNormalizations left between 8-bit tensors (ONNX Runtime runs them in
    float, as an un-preprocessed quantize_static ResNet has them)."""
    rng = np.random.default_rng(21)
    inits = {
        "w0": rng.normal(0, 0.4, (8, 4, 3, 3)),
        "wf": rng.normal(0, 0.3, (10, 8)),
        "bf": rng.normal(0, 0.1, 10),
    }
    nodes = [
        helper.make_node("Conv", ["x", "w0"], ["c0"], pads=[1, 1, 1, 1]),
        helper.make_node("BatchNormalization", ["c0", "g0", "b0", "m0", "v0"], ["n0"]),
        helper.make_node("Relu", ["n0"], ["r0"]),
    ]
    for i in range(3):
        inits |= {
            f"g{i}": rng.uniform(0.5, 1.5, 8),
            f"b{i}": rng.normal(0, 0.2, 8),
            f"m{i}": rng.normal(0, 0.2, 8),
            f"v{i}": rng.uniform(0.3, 2, 8),
        }
    for i in (1, 2):
        inits[f"w{i}"] = rng.normal(0, 0.3, (8, 8, 3, 3))
        nodes += [
            helper.make_node("Conv", [f"r{i - 1}", f"w{i}"], [f"c{i}"], pads=[1, 1, 1, 1]),
            helper.make_node("BatchNormalization", [f"c{i}", f"g{i}", f"b{i}", f"m{i}", f"v{i}"], [f"n{i}"]),
            helper.make_node("Add", [f"n{i}", f"r{i - 1}"], [f"s{i}"]),
            helper.make_node("Relu", [f"s{i}"], [f"r{i}"]),
        ]
    nodes += [
        helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
        helper.make_node("Flatten", ["p"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], transB=1),
    ]
    graph = helper.make_graph(
        nodes,
        "residual",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 6, 6])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()],
    )
    source = path.with_name(f"{path.stem}_float.onnx")
    onnx.save(helper.make_model(graph, opset_imports=OPSETS[:1]), source)
    batches = list(np.random.default_rng(22).uniform(-1, 1, (4, 1, 4, 6, 6)).astype(np.float32))
    return quantize_qdq(source, path, batches, uint8=qtype == "uint8")


@pytest.mark.parametrize("qtype", ["int8", "uint8"])
def test_a_quantize_static_residual_net_is_onnx_runtimes_on_the_host(tmp_path: Path, qtype: QType) -> None:
    """The residual Adds, the BatchNormalizations and the pooling as ONNX Runtime computes them: the logits
    equal, for inputs in the calibrated range and far beyond it (every activation saturating)."""
    path = _residual(tmp_path / f"residual_{qtype}.onnx", qtype)
    kinds = _kinds(path)
    assert kinds.count("qadd") == 2 and "qglobalaveragepool" in kinds and "qscale_shift" in kinds, kinds
    artifact = build_model(path, HOST)
    rng = np.random.default_rng(23)
    for spread in (1.0, 8.0):
        x = rng.uniform(-spread, spread, (1, 4, 6, 6)).astype(np.float32)
        got, _ = run_network(get_board("local"), artifact, x)
        assert np.array_equal(got, ort_network(path.read_bytes(), x)[0]), spread
