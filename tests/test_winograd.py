"""Winograd conv2d (algo=winograd; F(4x4)'s own checks: test_winograd_f4.py): the workload key in,
kernels checked against the plain numpy reference on the local board and under QEMU out (U computed by
the kernel from the plain weights, or prepacked on the host), plus features and a short tuning run."""

from __future__ import annotations

import random
import subprocess
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
import pytest

from tests.board_run import run_entry
from tests.nest_interp import run_kernel
from tests.test_conv import check
from xtune.boards.board import get_board
from xtune.codegen.compile import compile_object, parse_verified
from xtune.codegen.link import link_flat
from xtune.codegen.lower import lower
from xtune.errors import InputError
from xtune.firmware.kernels import MAX_STACK_BYTES
from xtune.ops.conv2d import winograd_eligible
from xtune.ops.conv2d.winograd import WinogradTemplate
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.workload import RTOL, compare_output, random_inputs
from xtune.target import get_target
from xtune.tuning.database import TuningLog
from xtune.tuning.features import estimate_prior, feature_names, features_op, featurize
from xtune.tuning.tuner import make_tuner

# Odd output sizes (7x7, 13x13, 11x9: half tiles), pad 0, 1 and 2, channels no multiple of any vector width,
# several channel blocks, the whole epilogue (bias, residual, relu, relu6), a batch of 2; NHWC and NCHW.
SHAPES = (
    "conv2d:n=1,c=5,h=7,w=7,k=6,r=3,s=3,pad=1,layout=nhwc,algo=winograd,bias=1,relu=1",
    "conv2d:n=1,c=20,h=13,w=13,k=9,r=3,s=3,pad=1,layout=nhwc,algo=winograd,bias=1,residual=1",
    "conv2d:n=2,c=11,h=10,w=8,k=19,r=3,s=3,pad=0,layout=nhwc,algo=winograd,residual=1,relu6=1",
    "conv2d:n=1,c=17,h=13,w=11,k=40,r=3,s=3,pad=0,layout=nhwc,algo=winograd",
    "conv2d:n=1,c=33,h=9,w=6,k=35,r=3,s=3,pad=2,layout=nhwc,algo=winograd,bias=1",
    "conv2d:n=2,c=11,h=10,w=8,k=19,r=3,s=3,pad=0,algo=winograd,residual=1,relu6=1",
    "conv2d:n=1,c=20,h=7,w=9,k=9,r=3,s=3,pad=1,algo=winograd,bias=1,residual=1,relu=1",
)


def configs(template: WinogradTemplate, extra: int) -> list[int]:
    """The default config and `extra` random ones (fixed seed per workload)."""
    rng = random.Random(template.workload.key)
    return [template.default_config().index] + [rng.randrange(template.space.size) for _ in range(extra)]


# --- the workload ------------------------------------------------------------------------------------


def test_algo_is_an_optional_word_with_the_direct_reference() -> None:
    auto = parse_workload("conv2d:n=1,c=3,h=6,w=6,k=4,r=3,s=3,pad=1,layout=nhwc,algo=auto")
    assert auto.key == "conv2d:n=1,c=3,h=6,w=6,k=4,r=3,s=3,stride=1,pad=1,layout=nhwc"
    direct = parse_workload(auto.key + ",algo=direct")
    assert direct.key == auto.key + ",algo=direct"  # forced: not the default where Winograd applies
    wino = parse_workload(auto.key + ",algo=winograd,relu=1")
    assert wino.key == auto.key + ",algo=winograd,relu=1" and parse_workload(wino.key) == wino
    assert wino.flops() == direct.flops() and wino.tensors() == parse_workload(auto.key + ",relu=1").tensors()
    inputs = random_inputs(wino)
    np.testing.assert_array_equal(
        wino.reference(inputs), parse_workload(auto.key + ",relu=1").reference(inputs)
    )
    assert isinstance(template_for(wino, get_target("x86-avx2")), WinogradTemplate)


@pytest.mark.parametrize(
    ("items", "message"),
    [
        ("r=5,s=5,algo=winograd", "algo=winograd needs r=3, s=3, stride=1, dilation=1, got r=5, s=5"),
        ("r=3,s=1,algo=winograd", "got r=3, s=1"),
        ("r=1,s=1,algo=winograd", "got r=1, s=1"),
        ("r=3,s=3,stride=2,algo=winograd", "got r=3, s=3, stride=2, dilation=1"),
        ("r=3,s=3,dilation=2,algo=winograd", "got r=3, s=3, stride=1, dilation=2"),
        ("r=3,s=3,algo=fft", "'algo' must be one of auto, direct, winograd"),
    ],
)
def test_ineligible_convolutions_are_refused(items: str, message: str) -> None:
    with pytest.raises(InputError, match=message):
        parse_workload(f"conv2d:n=1,c=3,h=9,w=9,k=4,pad=1,layout=nhwc,{items}")


@pytest.mark.parametrize("items", ["r=3,s=3", "r=1,s=3", "r=5,s=5", "r=3,s=3,stride=2", "r=3,s=3,dilation=2"])
def test_eligibility_is_one_rule_for_parsing_and_task_extraction(items: str) -> None:
    """winograd_eligible (what task extraction would ask of a direct conv2d) says yes exactly when the
    workload with algo=winograd parses."""
    direct = parse_workload(f"conv2d:n=1,c=3,h=9,w=9,k=4,pad=1,{items}")
    try:
        parse_workload(direct.key + ",algo=winograd")
        parsed = True
    except InputError:
        parsed = False
    assert winograd_eligible(direct) is parsed


def test_the_cli_refuses_an_ineligible_winograd_in_one_line() -> None:
    key = "conv2d:n=1,c=3,h=9,w=9,k=4,r=3,s=3,stride=2,pad=1,layout=nhwc,algo=winograd"
    run = subprocess.run(
        [sys.executable, "-m", "xtune.cli", "bench", "--workload", key],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 2 and run.stdout == ""
    assert run.stderr.count("\n") == 1 and "algo=winograd needs r=3, s=3, stride=1, dilation=1" in run.stderr


# --- the nest, in the interpreter (no LLVM) ----------------------------------------------------------


@pytest.mark.parametrize("key", [*SHAPES[:3], *SHAPES[5:]])
def test_plain_and_prepacked_weights_give_the_reference_in_the_interpreter(key: str) -> None:
    """Random configs of both kernels (U computed per output-channel block, or `prepack`'s U read as it is)
    on the vector width of SSE: block tails, channel blocks, half tiles and both orders."""
    check_in_interpreter(key, lambda template: configs(template, 3))


def check_in_interpreter(key: str, pick: Callable[[WinogradTemplate], list[int]]) -> None:
    """The configs `pick` gives, of plain and prepacked weights, against the reference in the interpreter."""
    wl = parse_workload(key)
    inputs = random_inputs(wl)
    expected = wl.reference(inputs)
    for packed in (key, key + ",prepacked=1"):
        template = template_for(parse_workload(packed), get_target("x86-sse42"))
        assert isinstance(template, WinogradTemplate)
        for index in pick(template):
            config = template.space.config(index)
            out = np.full(expected.shape, np.nan, dtype=np.float32)
            run_kernel(template.kernel(config, "k"), [*template.kernel_inputs(config, inputs), out])
            assert compare_output(out, expected, RTOL) == "", (config, packed)


# --- boards --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", SHAPES)
def test_kernels_correct_on_host(key: str) -> None:
    template = template_for(parse_workload(key), get_board("local").target)
    assert isinstance(template, WinogradTemplate)
    check("local", key, configs(template, 3))


@pytest.mark.parametrize("key", [*SHAPES[1:4], SHAPES[6]])
def test_kernels_correct_under_qemu(qemu_board: str, key: str) -> None:
    template = template_for(parse_workload(key), get_board(qemu_board).target)
    assert isinstance(template, WinogradTemplate)
    check(qemu_board, key, configs(template, 1))


@pytest.mark.parametrize("board", ["local", "qemu-aarch64"])
@pytest.mark.parametrize("shape", [SHAPES[1], SHAPES[6]])
def test_prepacked_weights_on_a_board(board: str, shape: str) -> None:
    """prepacked=1 (a network's constant weights): the Measurer uploads `kernel_inputs`' U per config and
    checks against the plain reference; the kernel transforms no weights and has no U buffer of its own."""
    key = shape + ",prepacked=1"
    template = template_for(parse_workload(key), get_board(board).target)
    assert isinstance(template, WinogradTemplate)
    indices = configs(template, 2)
    for index in indices:
        config = template.space.config(index)
        assert "Ub" not in {b.name for b in template.kernel(config, "k").buffers}
        weights = template.kernel_inputs(config, random_inputs(template.workload))[1]
        s, sh = template.schedule(config), template.shape
        assert weights.size == (s.m + 2) ** 2 * sh.c * -(-sh.k // s.nr) * s.nr  # U[e][strip][c][nr]
    check(board, key, indices)


def test_a_wrong_u_is_a_wrong_answer() -> None:
    """The prepacked kernel really reads U: the plain weights in its place fail the check."""
    key = SHAPES[0] + ",prepacked=1"
    wl = parse_workload(key)
    target = get_board("local").target
    template = template_for(wl, target)
    config = template.default_config()
    inputs = random_inputs(wl)
    expected = wl.reference(inputs)
    image = link_flat(compile_object(lower([template.kernel(config, "k")]), target, ("k",)))
    u = template.kernel_inputs(config, inputs)[1]
    for weights, right in ((u, True), (np.resize(inputs[1].ravel(), u.size), False)):
        args = [inputs[0], weights, *inputs[2:], np.full(expected.shape, np.nan, np.float32)]
        out = run_entry("local", image, "k", args)[-1]
        assert (compare_output(out, expected, RTOL) == "") is right


# --- features and tuning -------------------------------------------------------------------------------


@pytest.mark.parametrize("target", ["x86-avx512", "x86-avx2", "arm-a72-neon", "riscv64-gcv"])
def test_features_and_defaults_for_every_target(target: str) -> None:
    key = "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1,layout=nhwc,algo=winograd"
    template = template_for(parse_workload(key), get_target(target))
    assert features_op(template) == "winograd"
    indices = configs(template, 40)  # type: ignore[arg-type]
    features = featurize(template, indices)
    assert features.shape == (len(indices), len(feature_names("winograd"))) and np.isfinite(features).all()
    assert len({tuple(row) for row in features}) > 1  # the knobs show in the features
    parse_verified(lower([template.kernel(template.default_config(), "k")]), template.target)


def test_a_short_xgb_tuning_run_finds_a_correct_best(tmp_path: Path) -> None:
    key = "conv2d:n=1,c=12,h=13,w=13,k=24,r=3,s=3,stride=1,pad=1,layout=nhwc,algo=winograd,bias=1,relu=1"
    log = str(tmp_path / "tune.jsonl")
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "xtune.cli",
            "tune",
            "--workload",
            key,
            "--trials",
            "12",
            "--tuner",
            "xgb",
            "--batch-size",
            "6",
            "--confirm",
            "0",
            "--log",
            log,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr
    records = TuningLog(log).read()
    assert len(records) == 12 and all(r.result.ok for r in records)
    best = min(records, key=lambda r: r.result.cost)
    check("local", key, [best.index])


@pytest.mark.parametrize("packed", ["", ",prepacked=1"])
def test_a_per_call_u_keeps_whole_blocks_within_the_stack_limit(packed: str) -> None:
    """512 channels at 7x7 (ResNet-18's layer4): one output-channel block's U (2 MiB) beside the padded
    image, V and M still leaves blocks of all 16 tiles (not one tile per block, 10x slower; prepacked too:
    F(4x4) has only 4 tiles there, too few for its default), and the kernel's local buffers stay within
    what `xtune build` allows."""
    key = f"conv2d:n=1,c=512,h=7,w=7,k=512,r=3,s=3,stride=1,pad=1,layout=nhwc,algo=winograd{packed}"
    template = template_for(parse_workload(key), get_target("x86-avx512"))
    assert isinstance(template, WinogradTemplate)
    config = template.default_config()
    s = template.schedule(config)
    assert (s.m, s.ty * s.tx) == (2, 16)
    assert template.kernel(config, "k").stack_bytes <= MAX_STACK_BYTES


@pytest.mark.parametrize("key", SHAPES)
def test_the_estimates_pick_gives_the_reference_in_the_interpreter(key: str) -> None:
    """A cold xgb search's first batch holds the analytic estimate's top pick (no pretrained model has
    winograd): it is a config of the space, and a correct kernel (odd sizes, channels no multiple of the
    vector width, plain and prepacked weights)."""
    wl = parse_workload(key)
    inputs = random_inputs(wl)
    expected = wl.reference(inputs)
    for packed in (key, key + ",prepacked=1"):
        template = template_for(parse_workload(packed), get_target("x86-sse42"))
        prior = estimate_prior(features_op(template))
        assert prior is not None
        tuner = make_tuner(
            "xgb",
            template.space,
            0,
            partial(featurize, template),
            seeds=[template.default_config().index],
            estimate=prior,
        )
        _, pick = tuner.next_batch(2)
        config = template.space.config(pick)
        out = np.full(expected.shape, np.nan, dtype=np.float32)
        run_kernel(template.kernel(config, "k"), [*template.kernel_inputs(config, inputs), out])
        assert compare_output(out, expected, RTOL) == "", (config, packed)


def test_the_default_takes_f4x4_on_images_with_enough_of_its_tiles() -> None:
    """Prepacked, F(4x4) where the image has at least MIN_TILES_F4 of its tiles (ResNet's 56x56 and 28x28
    3x3 layers), F(2x2) below (14x14, 7x7: its 2.25x larger U read for too few tiles); per call, F(2x2)."""
    for side, m in ((56, 4), (28, 4), (14, 2), (7, 2)):
        key = f"conv2d:n=1,c=64,h={side},w={side},k=64,r=3,s=3,stride=1,pad=1,layout=nhwc,algo=winograd"
        for packed, expected in ((",prepacked=1", m), ("", 2)):
            template = template_for(parse_workload(key + packed), get_target("x86-avx512"))
            assert isinstance(template, WinogradTemplate)
            assert template.schedule(template.default_config()).m == expected, (side, packed)
