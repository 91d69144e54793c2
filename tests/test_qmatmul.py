"""Quantized matmul (qmatmul): the integer reference against a direct computation, ONNX Runtime's
QLinearMatMul/MatMulInteger and gemmlowp's fixed-point rules; the kernels on the local board (VNNI,
vpmaddwd), qemu-aarch64 (A72 without dotprod, A76 with sdot) and qemu-riscv64 equal it exactly; each
target's object holds the dot instruction its lowering promises."""

from __future__ import annotations

import random
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import CliRunner
from tests.nest_interp import run_kernel
from xtune.boards.board import get_board
from xtune.codegen.compile import compile_object
from xtune.codegen.lower import lower
from xtune.errors import InputError
from xtune.firmware import kernels as artifact
from xtune.ops.qmatmul import reference as ref
from xtune.ops.qmatmul.template import QMatmulTemplate, pack_weights
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.workload import random_inputs
from xtune.target import get_target, host_cannot_run
from xtune.tuning.features import featurize
from xtune.tuning.measure import CompilePool, Measurer, MeasureStatus
from xtune.tuning.options import MeasureOptions

FAST = MeasureOptions(number=1, repeat=1, min_repeat_ms=0.0, warmup=0, timeout_ms=20_000)
# Odd sizes: row, column and k tails (k % 4 != 0), per-tensor and per-channel, both activation types.
WORKLOADS = (
    "qmatmul:m=5,n=20,k=13",
    "qmatmul:m=7,n=37,k=70,a=u8,requant=tflite,perchannel=1",
    "qmatmul:m=3,n=9,k=33,requant=none",
    "qmatmul:m=4,n=33,k=64,a=u8,perchannel=1",
    "qmatmul:m=6,n=17,k=23,requant=tflite",
)


# --- the reference -------------------------------------------------------------------------------------


def srdhm_scalar(a: int, b: int) -> int:
    """gemmlowp fixedpoint.h, SaturatingRoundingDoublingHighMul, line by line in Python ints."""
    overflow = a == b == -(1 << 31)
    ab = a * b
    nudge = (1 << 30) if ab >= 0 else 1 - (1 << 30)
    total = ab + nudge
    high = abs(total) // (1 << 31) * (1 if total >= 0 else -1)  # C division truncates
    return (1 << 31) - 1 if overflow else high


def rdbpot_scalar(x: int, exponent: int) -> int:
    mask = (1 << exponent) - 1
    remainder = x & mask
    threshold = (mask >> 1) + (1 if x < 0 else 0)
    return (x >> exponent) + (1 if remainder > threshold else 0)


def direct(inputs: list[np.ndarray], a_type: str, requant: str) -> np.ndarray:
    """The operator element by element in Python ints (float32 steps through numpy scalars)."""
    a, b, bias, *scales, qparams = inputs
    za, zy, lo, hi = (int(v) for v in qparams)
    m, k = a.shape
    n = b.shape[1]
    out = np.zeros((m, n), np.int64)
    for i in range(m):
        for j in range(n):
            acc = sum((int(a[i, t]) - za) * int(b[t, j]) for t in range(k)) + int(bias[j])
            c = j if scales and scales[0].size > 1 else 0
            if requant == "none":
                out[i, j] = acc
            elif requant == "onnx":
                f = np.float32(acc) * np.float32(scales[0][c])
                f = min(max(f, np.float32(lo - zy)), np.float32(hi - zy))
                out[i, j] = int(np.rint(f)) + zy
            else:
                shift = int(scales[1][c])
                x = srdhm_scalar(acc << max(shift, 0), int(scales[0][c]))
                out[i, j] = min(max(rdbpot_scalar(x, max(-shift, 0)) + zy, lo), hi)
    return out


@pytest.mark.parametrize("key", WORKLOADS)
def test_the_reference_equals_a_direct_integer_computation(key: str) -> None:
    wl = parse_workload(key)
    inputs = random_inputs(wl, seed=3)
    got = wl.reference(inputs)
    expected = direct(inputs, str(wl.value("a")), str(wl.value("requant")))
    assert got.dtype == {"u8": np.uint8, "s8": np.int8}[str(wl.value("a"))] or wl.value("requant") == "none"
    assert np.array_equal(got.astype(np.int64), expected)
    if wl.value("requant") != "none":
        lo, hi = ref.RANGES[str(wl.value("a"))]
        assert (got == lo).any() or (got == hi).any(), "the sampled scales should saturate some outputs"


def test_gemmlowp_fixed_point_rules() -> None:
    """Values worked by hand from gemmlowp's definitions: ties round away from zero, the one overflow."""
    i32 = np.int32
    assert ref.saturating_rounding_doubling_high_mul(
        np.array([-(1 << 31)], i32), np.array([-(1 << 31)], i32)
    )[0] == ((1 << 31) - 1)
    assert (
        ref.saturating_rounding_doubling_high_mul(np.array([1 << 30], i32), np.array([1 << 30], i32))[0]
        == 1 << 29
    )
    assert list(ref.rounding_divide_by_pot(np.array([5, -5, 4, -4, 7, -7], i32), np.array(1))) == [
        3,
        -3,
        2,
        -2,
        4,
        -4,
    ]
    assert ref.quantize_multiplier(0.5) == (1 << 30, 0)
    assert ref.quantize_multiplier(0.25) == (1 << 30, -1)
    q, shift = ref.quantize_multiplier(0.0123)
    assert (1 << 30) <= q < (1 << 31) and abs(q * 2.0 ** (shift - 31) - 0.0123) < 1e-9
    assert ref.activation_range("s8", -5, 0.05, "relu6") == (-5, -5 + 120)
    assert ref.activation_range("u8", 3, 0.1, "relu") == (3, 255)
    rng = np.random.default_rng(0)
    xs = rng.integers(-(1 << 31), 1 << 31, 2000).astype(np.int32)
    ms = rng.integers(1 << 30, 1 << 31, 2000).astype(np.int32)
    shifts = rng.integers(-12, 3, 2000)
    got = ref.multiply_by_quantized_multiplier(xs, ms, shifts)
    for x, mult, s, g in zip(xs, ms, shifts, got, strict=True):
        shifted = ((int(x) << max(int(s), 0)) + (1 << 31)) % (1 << 32) - (1 << 31)
        assert g == rdbpot_scalar(srdhm_scalar(shifted, int(mult)), max(-int(s), 0))


def test_workload_keys_and_their_refusals() -> None:
    wl = parse_workload("qmatmul:m=2,n=3,k=4,a=u8,requant=tflite,perchannel=1")
    assert [(t.name, t.dtype) for t in wl.tensors()] == [
        ("A", "uint8"),
        ("B", "int8"),
        ("bias", "int32"),
        ("multiplier", "int32"),
        ("shift", "int32"),
        ("qparams", "int32"),
        ("C", "uint8"),
    ]
    assert parse_workload("qmatmul:m=2,n=3,k=4,a=s8,requant=onnx").key == "qmatmul:m=2,n=3,k=4"
    for bad, why in (
        ("qmatmul:m=2,n=3,k=4,a=u16", "'a' must be one of"),
        ("qmatmul:m=2,n=3,k=4,requant=none,perchannel=1", "no 'perchannel'"),
        ("qmatmul:m=2,n=3,k=70000", "int32 accumulator"),
    ):
        with pytest.raises(InputError, match=why):
            parse_workload(bad)


# --- against ONNX Runtime ---------------------------------------------------------------------------------


def ort_run(model: object, feeds: dict[str, np.ndarray]) -> np.ndarray:
    ort = pytest.importorskip("onnxruntime")
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])  # type: ignore[attr-defined]
    return np.asarray(session.run(None, feeds)[0])


@pytest.mark.parametrize("a_type", ["u8", "s8"])
@pytest.mark.parametrize("per_channel", [False, True])
def test_onnx_requant_equals_onnxruntime_qlinearmatmul(a_type: str, per_channel: bool) -> None:
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(7)
    m, n, k = 9, 40, 77
    wl = parse_workload(f"qmatmul:m={m},n={n},k={k},a={a_type},perchannel={int(per_channel)}")
    a, b, _bias, _scale, qparams = random_inputs(wl, seed=5)
    za, zy = int(qparams[0]), int(qparams[1])
    a_scale, y_scale = np.float32(0.02), np.float32(0.37)
    b_scale = rng.uniform(0.002, 0.01, n if per_channel else 1).astype(np.float32)
    np_type = ref.NUMPY_TYPES[a_type]
    b_scale_init = b_scale if per_channel else b_scale.reshape(())
    constants: dict[str, np.ndarray] = {
        "a_scale": np.array(a_scale),
        "a_zp": np.array(za, np_type),
        "B": b,
        "b_scale": b_scale_init,
        "b_zp": np.zeros(b_scale_init.shape, np.int8),
        "y_scale": np.array(y_scale),
        "y_zp": np.array(zy, np_type),
    }
    inits = [numpy_helper.from_array(value, name) for name, value in constants.items()]
    elem = TensorProto.UINT8 if a_type == "u8" else TensorProto.INT8
    node = helper.make_node(
        "QLinearMatMul", ["A", "a_scale", "a_zp", "B", "b_scale", "b_zp", "y_scale", "y_zp"], ["Y"]
    )
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("A", elem, [m, k])],
        [helper.make_tensor_value_info("Y", elem, [m, n])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    onnx.checker.check_model(model)
    got = ort_run(model, {"A": a})
    # ONNX Runtime's output scale, in float32 as it computes it (a_scale * b_scale / y_scale).
    scale = (a_scale * b_scale / y_scale).astype(np.float32)
    lo, hi = ref.RANGES[a_type]
    ours = wl.reference([a, b, np.zeros(n, np.int32), scale, np.array([za, zy, lo, hi], np.int32)])
    assert np.array_equal(ours, got), f"{int((ours != got).sum())} of {got.size} differ"


def test_none_equals_onnxruntime_matmulinteger() -> None:
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    wl = parse_workload("qmatmul:m=6,n=21,k=50,a=u8,requant=none")
    a, b, _bias, qparams = random_inputs(wl, seed=2)
    inits = [numpy_helper.from_array(b, "B"), numpy_helper.from_array(np.array(qparams[0], np.uint8), "a_zp")]
    node = helper.make_node("MatMulInteger", ["A", "B", "a_zp"], ["Y"])
    graph = helper.make_graph(
        [node],
        "q",
        [helper.make_tensor_value_info("A", TensorProto.UINT8, [6, 50])],
        [helper.make_tensor_value_info("Y", TensorProto.INT32, [6, 21])],
        inits,
    )
    got = ort_run(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)]), {"A": a})
    assert np.array_equal(wl.reference([a, b, np.zeros(21, np.int32), qparams]), got)


@pytest.mark.parametrize(
    "target", ["x86-avx512-vnni", "x86-avx512", "arm-a76-dotprod", "arm-a72-neon", "riscv64-gcv"]
)
@pytest.mark.parametrize("key", [WORKLOADS[0], WORKLOADS[1], WORKLOADS[2]])
def test_the_nest_of_every_route_equals_the_reference_in_the_interpreter(key: str, target: str) -> None:
    """The template's nests, run by tests/nest_interp.py (no LLVM): the layout, the flip, the k tail, the
    pair sums and the epilogue, per dot route; random configs too."""
    wl = parse_workload(key)
    template = template_for(wl, get_target(target))
    inputs = random_inputs(wl, seed=1)
    expected = wl.reference(inputs)
    rng = random.Random(key + target)
    configs = [template.default_config(), template.space.config(rng.randrange(template.space.size))]
    for config in configs:
        out = np.zeros(expected.shape, expected.dtype)
        run_kernel(template.kernel(config, "k"), [*template.kernel_inputs(config, inputs), out])
        assert np.array_equal(out, expected), (target, config.values)


@pytest.mark.parametrize("target", ["x86-avx512-vnni", "arm-a72-neon"])
def test_the_pack_kernel_writes_the_layout_kernel_inputs_gives(target: str) -> None:
    wl = parse_workload(WORKLOADS[1])
    template = template_for(wl, get_target(target))
    inputs = random_inputs(wl, seed=4)
    for config in [template.default_config(), template.space.config(template.space.size // 3)]:
        expected = template.kernel_inputs(config, inputs)[1]
        packed = np.full(expected.shape, 0x5A, np.int8)
        run_kernel(template.pack_kernel(config, "pack"), [inputs[1], packed])
        assert np.array_equal(packed, expected)


# --- the kernels ---------------------------------------------------------------------------------------


def measure_some(board: str, key: str, pool: CompilePool, target: str | None = None, extra: int = 3) -> None:
    """The default config and `extra` random ones: every one must equal the reference exactly."""
    measurer = Measurer(get_board(board, target=target), parse_workload(key), FAST, pool)
    space = measurer.template.space
    rng = random.Random(key)
    indices = [measurer.template.default_config().index] + [rng.randrange(space.size) for _ in range(extra)]
    try:
        results = measurer.measure(indices)
    finally:
        measurer.close()
    for index, result in zip(indices, results, strict=True):
        assert result.status is MeasureStatus.OK, (board, key, space.config(index).values, result.error)


LOCAL_TARGETS = ("x86-avx512-vnni", "x86-avx2-vnni", "x86-avx512", "x86-sse42")


@pytest.mark.parametrize("target", LOCAL_TARGETS)
@pytest.mark.parametrize("key", WORKLOADS)
def test_kernels_are_exact_on_the_local_board(key: str, target: str, compile_pool: CompilePool) -> None:
    why = host_cannot_run(get_target(target))
    if why is not None:
        pytest.skip(why)
    measure_some("local", key, compile_pool, target)


@pytest.mark.board
@pytest.mark.parametrize("board", ["qemu-aarch64", "qemu-aarch64-dotprod", "qemu-riscv64-v", "qemu-riscv64"])
@pytest.mark.parametrize("key", WORKLOADS[:3])
def test_kernels_are_exact_under_qemu(board: str, key: str, compile_pool: CompilePool) -> None:
    if shutil.which(get_board(board).target.qemu_binary) is None:
        pytest.skip("needs qemu-user")
    measure_some(board, key, compile_pool, extra=2)


def test_a_wrong_packing_is_a_wrong_answer(
    compile_pool: CompilePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The check is exact and the packed layout matters: strips with their columns reversed fail."""
    wl = parse_workload(WORKLOADS[0])
    monkeypatch.setattr(
        QMatmulTemplate,
        "kernel_inputs",
        lambda self, config, inputs: [
            *inputs[:1],
            pack_weights(inputs[1][:, ::-1], self.schedule(config).nr),
            *inputs[2:],
        ],
    )
    measurer = Measurer(get_board("local"), wl, FAST, compile_pool)
    try:
        (result,) = measurer.measure([measurer.template.default_config().index])
    finally:
        measurer.close()
    assert result.status is MeasureStatus.WRONG_ANSWER and "differ from the reference" in result.error


def test_the_header_says_each_tensors_c_type_and_build_refuses_a_lone_qmatmul(xtune_cli: CliRunner) -> None:
    tensors = parse_workload("qmatmul:m=2,n=3,k=4,a=u8,requant=tflite").tensors()
    assert artifact._params(tensors) == (
        "const uint8_t *A, const int8_t *B, const int32_t *bias, const int32_t *multiplier, "
        "const int32_t *shift, const int32_t *qparams, uint8_t *C"
    )
    out = xtune_cli(
        "build",
        "--workload",
        "qmatmul:m=2,n=3,k=4",
        "--target",
        "x86-avx512-vnni",
        "-o",
        "k.o",
        "--header",
        "k.h",
    )
    assert out.returncode == 2 and "built into a network" in out.stderr and "Traceback" not in out.stderr


def test_features_describe_every_config() -> None:
    template = template_for(parse_workload(WORKLOADS[1]), get_target("x86-avx512-vnni"))
    rows = featurize(template, range(0, template.space.size, 7))
    assert rows.shape[0] == len(range(0, template.space.size, 7)) and np.isfinite(rows).all()


# --- the instructions ----------------------------------------------------------------------------------

OBJDUMP = {
    "x86_64": "objdump",
    "aarch64": "aarch64-linux-gnu-objdump",
    "riscv64": "riscv64-linux-gnu-objdump",
}
# What each target's dot lowering must assemble to (intlower.py), and what it must not contain.
INSTRUCTIONS = {
    "x86-avx512-vnni": (r"vpdpbusd\s+%zmm", r"vpmaddwd"),
    "x86-avx2-vnni": (r"\{vex\}\s*vpdpbusd\s+%ymm|vpdpbusd\s+%ymm", r"zmm"),
    "x86-avx512": (r"vpmaddwd\s+%zmm", r"vpdpbusd|vpmaddubsw"),
    "arm-a76-dotprod": (r"\bsdot\s+v\d+\.4s", r"\bmla\s+v"),
    "arm-a72-neon": (r"\bsadalp\s+v\d+\.4s, v\d+\.8h", r"\bsdot\b"),
    "arm-a53-neon": (r"\bsmull\s+v\d+\.8h", r"\bsdot\b"),
    "riscv64-gcv": (r"\bvmacc\.v|\bvmadd\.v", r"\bvfmacc"),
}


def disassemble(key: str, target: str, tmp_path: Path) -> str:
    """The default kernel of workload `key` on `target`, compiled and disassembled by the target's
    objdump (skipped where that binutils is not installed)."""
    t = get_target(target)
    tool = shutil.which(OBJDUMP[t.arch])
    if tool is None:
        pytest.skip(f"needs {OBJDUMP[t.arch]}")
    template = template_for(parse_workload(key), t)
    obj = compile_object(lower([template.kernel(template.default_config(), "xt_kernel")]), t, ("xt_kernel",))
    path = tmp_path / "kernel.o"
    path.write_bytes(obj.data)
    return subprocess.run([tool, "-d", str(path)], capture_output=True, text=True, check=True).stdout


@pytest.mark.parametrize("target", list(INSTRUCTIONS))
def test_each_target_assembles_its_dot_instruction(target: str, tmp_path: Path) -> None:
    import re

    text = disassemble("qmatmul:m=8,n=64,k=64,a=u8", target, tmp_path)
    must, must_not = INSTRUCTIONS[target]
    assert re.search(must, text), f"{target}: no {must} in the object"
    assert not re.search(must_not, text, re.MULTILINE), f"{target}: {must_not} in the object"
