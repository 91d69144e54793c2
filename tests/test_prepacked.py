"""Prepacked weights (prepacked=1): a workload whose kernel reads its weights already in the packed layout
of its config, as a network's constant weights are laid out at build time. Tuned on real boards (local,
qemu-aarch64) on the inputs each config's kernel reads, checked against the plain reference; a wrong
packing is a wrong_answer; fewer instructions than packing per call; tasks of a model carry it."""

from __future__ import annotations

import json
import random
import shutil
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from tests import networks
from tests.board_run import run_entry
from tests.conftest import CliRunner
from xtune.boards.agent import AgentSession
from xtune.boards.board import get_board
from xtune.codegen.compile import compile_object
from xtune.codegen.link import link_flat
from xtune.codegen.lower import lower
from xtune.errors import InputError
from xtune.frontend.tasks import extract_tasks
from xtune.ops.conv2d.direct import REDUCTIONS, Conv2dTemplate
from xtune.ops.conv2d.direct_nest import ConvEmitter
from xtune.ops.matmul.template import MatmulTemplate
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.template import SumTemplate
from xtune.ops.tiles import parse_tile
from xtune.ops.workload import random_inputs
from xtune.schedule.loopnest import Affine
from xtune.schedule.space import Config, KnobValue
from xtune.target import Target, get_target
from xtune.tuning.database import TuningLog, read_logs
from xtune.tuning.features import feature_names, featurize
from xtune.tuning.measure import CompilePool, Measurer, MeasureStatus
from xtune.tuning.options import MeasureOptions, TuneOptions
from xtune.tuning.run import run_tuning

FAST = MeasureOptions(number=1, repeat=1, min_repeat_ms=0.0, warmup=0, timeout_ms=20_000)
needs_qemu = pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="needs qemu-aarch64 (qemu-user)")

CONV = "conv2d:n=1,c=13,h=9,w=11,k=21,r=3,s=3,stride=1,pad=1,bias=1,relu=1,prepacked=1"
POINTWISE = "conv2d:n=2,c=19,h=5,w=6,k=23,r=1,s=1,stride=1,pad=0,bias=1,prepacked=1"  # weights = matmul A
POINTWISE_NHWC = "conv2d:n=1,c=19,h=5,w=6,k=23,r=1,s=1,stride=1,pad=0,layout=nhwc,prepacked=1"  # = B
MATMUL = "matmul:m=9,n=37,k=70,relu=1,prepacked=1"


def plain(key: str) -> str:
    return key.replace(",prepacked=1", "")


def configs(key: str, target: str, extra: int, **knobs: int) -> list[int]:
    """The default config (with `knobs` changed) and `extra` random ones, fixed per workload."""
    template = template_for(parse_workload(key), get_target(target))
    default = template.default_config()
    first = template.space.index_of({**dict(default.values), **knobs}) if knobs else default.index
    rng = random.Random(key)
    return [first] + [rng.randrange(template.space.size) for _ in range(extra)]


def measure(
    board: str, key: str, indices: list[int], pool: CompilePool
) -> list[tuple[MeasureStatus, str, float]]:
    measurer = Measurer(get_board(board), parse_workload(key), FAST, pool)
    try:
        return [(r.status, r.error, r.cost) for r in measurer.measure(indices)]
    finally:
        measurer.close()


# --- the workload key --------------------------------------------------------------------------------------


def test_prepacked_is_an_optional_switch_of_conv2d_and_matmul_that_round_trips() -> None:
    for key in (CONV, POINTWISE_NHWC, MATMUL):
        wl = parse_workload(key)
        assert wl.key == key and wl["prepacked"] == 1 and parse_workload(wl.key) == wl
        assert wl.key.endswith(",prepacked=1") and wl.symbol.endswith("_prepacked1")
        assert parse_workload(plain(key) + ",prepacked=0").key == plain(key)  # the default is left out
        assert parse_workload(plain(key))["prepacked"] == 0
        assert wl.tensors() == parse_workload(plain(key)).tensors()  # the same tensors, the plain layouts
    with pytest.raises(InputError, match="'prepacked' must be 0 or 1"):
        parse_workload("matmul:m=2,n=2,k=2,prepacked=2")
    with pytest.raises(InputError, match="unknown key 'prepacked'"):
        parse_workload("depthwise:n=1,c=3,h=8,w=8,r=3,s=3,prepacked=1")


# --- measured on real boards -------------------------------------------------------------------------------


@pytest.mark.parametrize("key", [CONV, POINTWISE, POINTWISE_NHWC, MATMUL])
def test_prepacked_workloads_measure_correct_on_the_local_board(key: str, compile_pool: CompilePool) -> None:
    # pack_a=1: the nchw pointwise default reads its weights (A) in place; this config reads them in panels.
    knobs = {"pack_a": 1} if key == POINTWISE else {}
    results = measure("local", key, configs(key, get_board("local").target.name, 5, **knobs), compile_pool)
    assert [s for s, _, _ in results] == [MeasureStatus.OK] * len(results), [e for _, e, _ in results]


@needs_qemu
@pytest.mark.board
@pytest.mark.parametrize("key", [CONV, POINTWISE, MATMUL])
def test_prepacked_workloads_measure_correct_under_qemu_and_pack_nothing_per_call(
    key: str, compile_pool: CompilePool
) -> None:
    """Every config right, and the same config executes fewer instructions than with per-call packing."""
    knobs = {"pack_a": 1} if key == POINTWISE else {}
    indices = configs(key, "arm-a72-neon", 3, **knobs)
    packed = measure("qemu-aarch64", key, indices, compile_pool)
    assert [s for s, _, _ in packed] == [MeasureStatus.OK] * len(packed), [e for _, e, _ in packed]
    (status, error, per_call), *_ = measure("qemu-aarch64", plain(key), indices[:1], compile_pool)
    assert status is MeasureStatus.OK, error
    assert packed[0][2] < per_call  # instruction counts: deterministic


def test_a_tuning_run_of_a_prepacked_conv2d_logs_correct_configs_under_its_own_key(tmp_path: Path) -> None:
    log = tmp_path / "log.jsonl"
    options = TuneOptions(tuner="random", trials=8, batch_size=4, measure=FAST, confirm=0)
    report = run_tuning(parse_workload(CONV), [get_board("local")], options, TuningLog(log))
    assert report.trials == 8 and {k: n for k, n in report.counts if n} == {"ok": 8}
    assert {r.workload for r in read_logs([log])} == {CONV}


@pytest.mark.host_runs("x86-avx2")
@pytest.mark.parametrize("key", [CONV, MATMUL])
def test_a_wrong_packing_is_a_wrong_answer(
    key: str, compile_pool: CompilePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Measurer runs each config on the weights as the template lays them out and checks the output
    against the plain reference: a packing that misplaces elements cannot become a best."""
    from xtune.ops.matmul import template as matmul

    real_conv, real_matmul = Conv2dTemplate.prepack, matmul.prepack
    monkeypatch.setattr(Conv2dTemplate, "prepack", lambda self, c, w: np.roll(real_conv(self, c, w), 1))
    monkeypatch.setattr(matmul, "prepack", lambda *args: np.roll(real_matmul(*args), 1))
    wl = parse_workload(key)
    template = template_for(wl, get_target("x86-avx2"))
    assert template.default_config()["pack_b" if "matmul" in key else "tile"]  # it reads panels (B strips)
    measurer = Measurer(get_board("local"), wl, FAST, compile_pool)
    try:
        result = measurer.measure([template.default_config().index])[0]
    finally:
        measurer.close()
    assert result.status is MeasureStatus.WRONG_ANSWER and result.cost == float("inf"), result.error


def test_configs_that_share_a_packed_layout_share_its_upload(
    compile_pool: CompilePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An SSH board is slow to receive megabytes: weights are sent again only when their packed bytes change
    (matmul B strips depend on the register tile's width only)."""
    sent: list[int] = []
    real = AgentSession.set_buffer

    def counted(self: AgentSession, slot: int, data: bytes) -> None:
        sent.append(slot)
        real(self, slot, data)

    monkeypatch.setattr(AgentSession, "set_buffer", counted)
    wl = parse_workload(MATMUL)
    board = get_board("local")
    template = template_for(wl, board.target)
    base = dict(template.default_config().values)
    same_strips = [
        template.space.index_of({**base, "unroll_k": u, "kc": kc}) for u, kc in ((1, 8), (2, 16), (4, 32))
    ]
    width = parse_tile(str(base["tile"]))[1]
    other_tile = next(str(t) for t in template.space.knobs[0].options if parse_tile(str(t))[1] != width)
    unpacked = template.space.index_of({**base, "pack_b": 0})
    measurer = Measurer(board, wl, FAST, compile_pool)
    try:
        results = measurer.measure(
            [*same_strips, template.space.index_of({**base, "tile": other_tile}), unpacked]
        )
    finally:
        measurer.close()
    assert all(r.ok for r in results), [r.error for r in results]
    # A (slot 0) once; B (slot 1) for the first strips, the other tile's strips, and the plain B.
    assert sent.count(0) == 1 and sent.count(1) == 3


def test_conv2d_configs_that_share_a_packed_layout_pack_and_upload_it_once(
    compile_pool: CompilePool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weights of a big layer take milliseconds to lay out: configs whose schedule differs only in
    knobs that do not move a weight (loop order, input layout, unrolling, pixel blocking) pack and send
    them once; another reduction order packs and sends them again."""
    sent: list[int] = []
    packs: list[int] = []
    real_send, real_pack = AgentSession.set_buffer, Conv2dTemplate.prepack

    def counted(self: AgentSession, slot: int, data: bytes) -> None:
        sent.append(slot)
        real_send(self, slot, data)

    def packed(self: Conv2dTemplate, config: Config, weights: np.ndarray) -> np.ndarray:
        packs.append(config.index)
        return real_pack(self, config, weights)

    monkeypatch.setattr(AgentSession, "set_buffer", counted)
    monkeypatch.setattr(Conv2dTemplate, "prepack", packed)
    wl = parse_workload(CONV)
    board = get_board("local")
    template = template_for(wl, board.target)
    assert isinstance(template, SumTemplate)
    base = dict(
        template.of_part(0, template.parts[0][1].default_config()).values
    )  # the direct part's default
    tile_ow = min(int(o) for o in next(k for k in template.space.knobs if k.name == "tile_ow").options)
    same: list[dict[str, KnobValue]] = [
        {"order": "kp"},
        {"pack_layout": "chw", "unroll": 2},
        {"unroll_kw": 0, "tile_ow": tile_ow},
    ]
    other: dict[str, KnobValue] = {"reduction": next(r for r in REDUCTIONS if r != base["reduction"])}
    indices = [template.space.index_of({**base, **knobs}) for knobs in [{}, *same, other]]
    measurer = Measurer(board, wl, FAST, compile_pool)
    try:
        results = measurer.measure(indices)
    finally:
        measurer.close()
    assert all(r.ok for r in results), [r.error for r in results]
    assert packs == [indices[0], indices[-1]]  # the first config of each layout packs
    assert sent.count(0) == 1 and sent.count(2) == 1 and sent.count(1) == 2  # input, bias; weights twice


# --- the packed layout, computed at once ---------------------------------------------------------------


def per_block_conv2d_prepack(template: Conv2dTemplate, config: Config, weights: np.ndarray) -> np.ndarray:
    """The oracle: the per-(channel block, output block) loop `Conv2dTemplate.prepack` replaced."""
    sh, s = template.shape, template.schedule(config)
    layout = (sh.r, sh.s, sh.c, sh.k) if sh.nhwc else (sh.k, sh.c, sh.r, sh.s)
    w = np.asarray(weights, np.float32).reshape(layout)
    w = w.transpose(3, 2, 0, 1) if sh.nhwc else w  # now (k, c, r, s)
    emitter = ConvEmitter(template.workload, s)
    kb, cb = min(s.kb, sh.k), min(s.cb, sh.c)
    out = np.zeros(emitter.packed_size, np.float32)
    idx = emitter.wp_index(Affine.of("st"), Affine.of("c"), Affine.of("i"), Affine.of("j"))
    coeff = dict(idx.terms)
    for c0 in range(0, sh.c, cb):
        ccur = min(cb, sh.c - c0)
        for k0 in range(0, sh.k, kb):
            kcur = min(kb, sh.k - k0)
            kk, c, i, j = np.meshgrid(*(np.arange(e) for e in (kcur, ccur, sh.r, sh.s)), indexing="ij")
            at = emitter.block_base(c0, k0).const + idx.const + kk % s.nr + coeff.get("st", 0) * (kk // s.nr)
            at = at + coeff.get("c", 0) * c + coeff.get("i", 0) * i + coeff.get("j", 0) * j
            out[at] = w[k0 : k0 + kcur, c0 : c0 + ccur]
    return out


DIRECT = CONV.replace(",bias=1", ",algo=direct,bias=1")  # the direct template alone, not the sum
CONV_LAYOUTS = [
    DIRECT,
    DIRECT.replace(",algo=direct", ",layout=nhwc,algo=direct"),
    "conv2d:n=1,c=37,h=13,w=13,k=45,r=3,s=3,stride=2,pad=1,prepacked=1",  # stride 2, channel tails
    "conv2d:n=1,c=37,h=13,w=13,k=45,r=3,s=3,stride=2,pad=1,layout=nhwc,prepacked=1",
    "conv2d:n=2,c=70,h=9,w=9,k=130,r=5,s=3,stride=1,pad=2,layout=nhwc,prepacked=1",  # r != s, block tails
]


@pytest.mark.parametrize("key", CONV_LAYOUTS)
@pytest.mark.parametrize("target", ["x86-avx2", "arm-a72-neon"])
def test_conv2d_prepack_places_every_weight_where_the_per_block_loop_did(key: str, target: str) -> None:
    template = template_for(parse_workload(key), get_target(target))
    assert isinstance(template, Conv2dTemplate)
    weights = random_inputs(template.workload)[1]
    for index in configs(key, target, 24):
        config = template.space.config(index)
        np.testing.assert_array_equal(
            template.prepack(config, weights), per_block_conv2d_prepack(template, config, weights)
        )


def per_element_matmul_prepack(operand: str, matrix: np.ndarray, width: int) -> np.ndarray:
    """The oracle, element by element as `matmul.prepack` documents it: B[kk, j*nr + c] at j*k*nr + kk*nr
    + c; A[i*mr + r, kk] at i*k*mr + kk*mr + r; zero past the last column (row)."""
    m = matrix if operand == "B" else matrix.T  # (k, panel axis)
    k, extent = m.shape
    out = np.zeros(-(-extent // width) * width * k, np.float32)
    for kk in range(k):
        for p in range(extent):
            out[(p // width) * k * width + kk * width + p % width] = m[kk, p]
    return out


@pytest.mark.parametrize(
    ("operand", "rows", "cols", "width"),
    [
        ("B", 7, 37, 8),
        ("B", 70, 16, 16),
        ("B", 5, 3, 24),
        ("A", 9, 70, 4),
        ("A", 23, 19, 6),
        ("A", 2, 3, 8),
    ],
)
def test_matmul_prepack_lays_out_panels_and_strips_as_documented(
    operand: str, rows: int, cols: int, width: int
) -> None:
    from xtune.ops.matmul import template as matmul

    m = np.random.default_rng(rows * cols).standard_normal((rows, cols)).astype(np.float32)
    np.testing.assert_array_equal(
        matmul.prepack(operand, m, rows, cols, width), per_element_matmul_prepack(operand, m, width)
    )


@pytest.mark.parametrize("key", [*CONV_LAYOUTS, POINTWISE, POINTWISE_NHWC, MATMUL])
def test_configs_with_equal_packed_layout_keys_read_equal_bytes(key: str) -> None:
    """`packed_layout` is the Measurer's only evidence that the board holds a config's weights: equal keys
    must mean equal bytes, and the knobs that move no weight must not change the key (else no sharing)."""
    template = template_for(parse_workload(key), get_target("x86-avx2"))
    assert isinstance(template, Conv2dTemplate | MatmulTemplate)
    inputs = random_inputs(template.workload)
    seen: dict[object, list[np.ndarray]] = {}
    indices = configs(key, "x86-avx2", 40)
    matmul_space = "matmul" in key or ",r=1," in key  # a pointwise conv2d is its matmul
    keep: dict[str, KnobValue] = {"inner": "mn"}
    if not matmul_space:
        keep = {"order": "kp", "unroll": 4, "pack_layout": "chw"}
    shared = [template.space.index_of({**dict(template.space.config(i).values), **keep}) for i in indices]
    for index in [*indices, *shared]:
        config = template.space.config(index)
        got, layout = template.kernel_inputs(config, inputs), template.packed_layout(config)
        if layout is None:  # the plain inputs, as they are
            assert all(a is b for a, b in zip(got, inputs, strict=True))
            continue
        for a, b in zip(seen.setdefault(layout, got), got, strict=True):
            np.testing.assert_array_equal(a, b)
    for i, j in zip(indices, shared, strict=True):
        first, second = template.space.config(i), template.space.config(j)
        assert template.packed_layout(first) == template.packed_layout(second)


# --- the cost model's view ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "column"), [(MATMUL, "est_pack_b"), (POINTWISE, "est_pack_a")])
def test_features_count_no_packing_of_prepacked_weights(key: str, column: str) -> None:
    target = get_target("x86-avx2")
    packed, per_call = (template_for(parse_workload(k), target) for k in (key, plain(key)))
    indices = np.arange(0, packed.space.size, max(1, packed.space.size // 500))
    names = feature_names("matmul")
    got, before = featurize(packed, indices), featurize(per_call, indices)
    col, eff = names.index(column), names.index("est_eff")
    assert np.all(got[:, col] == 0) and np.any(before[:, col] > 0)
    assert np.all(got[:, eff] >= before[:, eff]) and np.any(got[:, eff] > before[:, eff])


# --- the network level -------------------------------------------------------------------------------------


def test_tasks_with_constant_weights_are_prepacked_and_depthwise_are_not() -> None:
    tasks = extract_tasks(networks.NETWORKS["mobilenet_v2_small"](), "x86-avx2").tasks
    ops = {t.workload.op: [] for t in tasks}  # type: dict[str, list[int]]
    for t in tasks:
        ops[t.workload.op].append(t.workload["prepacked"] if t.workload.op != "depthwise" else 0)
    assert ops["conv2d"] and set(ops["conv2d"]) == {1}
    assert ops["depthwise"] and all(
        "prepacked" not in t.workload.key for t in tasks if t.workload.op == "depthwise"
    )
    assert set(ops.get("matmul", [1])) == {1}  # the classifier's constant weights too


def test_build_of_a_prepacked_workload_adds_its_pack_function(xtune_cli: CliRunner, tmp_path: Path) -> None:
    outputs = ["-o", f"{tmp_path}/k.o", "--header", f"{tmp_path}/k.h", "--json"]
    out = xtune_cli("build", "--target", "x86-avx2", "--workload", CONV, "--workload", MATMUL, *outputs)
    assert out.returncode == 0, out.stderr
    kernels = json.loads(out.stdout)["kernels"]
    for kernel in kernels:
        template = template_for(parse_workload(kernel["workload"]), get_target("x86-avx2"))
        config = template.space.config(kernel["config"])
        packed = template.kernel_inputs(config, random_inputs(template.workload))[1]
        assert kernel["pack"]["symbol"] == kernel["symbol"] + "_pack"
        assert kernel["pack"]["packed_floats"] == packed.size


@pytest.mark.host_runs("x86-avx2")
def test_a_network_whose_logged_configs_read_weight_panels_matches_onnx_runtime(tmp_path: Path) -> None:
    """Every prepacked task built from a logged config that reads its weights in panels (pointwise conv2d:
    A panels; the classifier: B strips of another width; 3x3: another blocking): the network build lays the
    weights out with the same hook the Measurer used, and the network still matches ONNX Runtime."""
    from tests.test_artifact import _write_log
    from xtune.firmware.build import build_model
    from xtune.firmware.network_bench import random_input, run_network
    from xtune.ops.workload import RTOL, compare_output
    from xtune.tuning.peers import ort_network

    onnx_model = networks.NETWORKS["mobilenet_v2_small"]()
    target = get_target("x86-avx2")
    rows, rng = [], random.Random(7)
    for task in extract_tasks(onnx_model, target).tasks:
        if task.workload.op == "depthwise":
            continue
        template = template_for(task.workload, target)
        values = dict(template.default_config().values)
        options = {k.name: k.options for k in template.space.knobs}
        if "pack_a" in values:  # through the matmul template: read the weights operand in panels
            values = {**values, "pack_a": 1, "pack_b": 1, "tile": rng.choice(["4x2", "3x3", "6x2"])}
        else:
            values = {**values, "tile_oc": rng.choice(options["tile_oc"][:3]), "reduction": "crs"}
        index = template.space.index_of(values)
        rows.append((task.workload.key, index, MeasureStatus.OK, 1e-6))
    log = tmp_path / "log.jsonl"
    _write_log(log, "x86-avx2", rows)
    artifact = build_model(onnx_model, target, logs=[log])
    assert {k.source for k in artifact.kernels if k.what in {r[0] for r in rows}} == {"log"}
    x = random_input(artifact.program.input_shape)
    got, _ = run_network(get_board("local", target="x86-avx2"), artifact, x)
    ref, _ = ort_network(onnx_model.SerializeToString(), x)
    assert compare_output(got, ref, RTOL) == ""


# --- prefetch of prepacked weights -------------------------------------------------------------------------


def test_prepacked_weights_are_prefetched_where_the_target_says_without_changing_a_bit() -> None:
    """x86-avx512 prefetches the weight strips its matmul micro-kernel streams (weight_prefetch_bytes);
    a one-row tile and a target without the setting do not; the output is the same, bit for bit."""
    avx512 = get_target("x86-avx512")
    assert avx512.weight_prefetch_bytes > 0 and get_target("arm-a72-neon").weight_prefetch_bytes == 0

    def ir(key: str, target: Target) -> str:
        template = template_for(parse_workload(key), target)
        return lower([template.kernel(template.default_config(), "xt_kernel")])

    assert "@llvm.prefetch" in ir(MATMUL, avx512) and "@llvm.prefetch" in ir(POINTWISE_NHWC, avx512)
    assert "@llvm.prefetch" not in ir(MATMUL, get_target("x86-avx2"))
    assert "@llvm.prefetch" not in ir("matmul:m=1,n=37,k=70,prepacked=1", avx512)
    if get_board("local").target.name != "x86-avx512":
        pytest.skip("the local board does not run x86-avx512 code")
    wl = parse_workload(MATMUL)
    outputs = []
    for target in (avx512, replace(avx512, weight_prefetch_bytes=0)):
        template = template_for(wl, target)
        config = template.default_config()
        inputs = template.kernel_inputs(config, random_inputs(wl, 1))
        kernel = template.kernel(config, "xt_kernel")
        image = link_flat(compile_object(lower([kernel]), target, ("xt_kernel",)))
        out = np.full(wl["m"] * wl["n"], np.nan, np.float32)
        outputs.append(run_entry("local", image, "xt_kernel", [*inputs, out])[-1])
    assert np.array_equal(outputs[0], outputs[1]) and not np.isnan(outputs[0]).any()
