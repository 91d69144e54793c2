"""Measurement end to end on real boards: every candidate is checked against numpy before it is timed,
and crashing, hanging, wrong and compiler-killing candidates become statuses while the run goes on."""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import time

import pytest

from xtune.boards.board import QemuBoard, get_board
from xtune.boards.cost import CostUnit
from xtune.codegen.compile import compile_object
from xtune.codegen.link import link_flat
from xtune.ops.matmul.template import MatmulTemplate
from xtune.ops.registry import parse_workload, template_for
from xtune.schedule.loopnest import Kernel
from xtune.schedule.space import Config
from xtune.target import get_target
from xtune.tuning.kernel_bench import bench
from xtune.tuning.measure import (
    BuiltImage,
    Candidate,
    CompilePool,
    Measurer,
    MeasureStatus,
    build_image,
)
from xtune.tuning.options import MeasureOptions

FAST = MeasureOptions(number=1, repeat=2, min_repeat_ms=1.0, warmup=0, timeout_ms=2000)
SIG = "(ptr noalias %A, ptr noalias %B, ptr noalias %C)"


def image_of(body: str, target_name: str = "x86-avx2") -> BuiltImage:
    ir = f'define void @xt_kernel{SIG} nounwind "no-builtins" {{\nentry:\n{body}\n}}\n'
    image = link_flat(compile_object(ir, get_target(target_name), ("xt_kernel",)))
    return BuiltImage(MeasureStatus.OK, image.code, image.entry("xt_kernel"))


SEGFAULT = "  store volatile float 1.0, ptr null\n  ret void"
HANG = "  br label %spin\nspin:\n  %x = load volatile float, ptr %C\n  br label %spin"
WRONG = "  store float 1.0, ptr %C\n  ret void"  # writes one element and leaves the rest


def configs(workload: str, target_name: str, count: int, seed: int) -> list[int]:
    template = template_for(parse_workload(workload), get_target(target_name))
    rng = random.Random(seed)
    return [template.default_config().index] + [rng.randrange(template.space.size) for _ in range(count)]


@pytest.mark.parametrize(
    "shape",
    [
        "matmul:m=127,n=255,k=63",
        "matmul:m=1,n=1,k=1",
        "matmul:m=3,n=1000,k=17",
        "matmul:m=64,n=64,k=64",
        "matmul:m=33,n=7,k=300",
    ],
)
def test_local_board_candidates_match_numpy(shape: str, compile_pool: CompilePool) -> None:
    board = get_board("local")
    measurer = Measurer(board, parse_workload(shape), FAST, compile_pool)
    try:
        results = measurer.measure(configs(shape, board.target.name, 4, seed=len(shape)))
    finally:
        measurer.close()
    assert [r.status for r in results] == [MeasureStatus.OK] * len(results), [r.error for r in results]
    assert all(len(r.costs) == 2 and all(c > 0 for c in r.costs) for r in results)


def test_cold_weights_evict_the_constants_before_each_timed_call(compile_pool: CompilePool) -> None:
    """MeasureOptions.cold_weights times a conv2d as a network layer finds it: its weights and bias (the
    workload's constants) evicted before each of `repeat` single calls, its input and output left warm;
    the candidate is still checked first and timed per call."""
    board = get_board("local")
    workload = parse_workload("conv2d:n=1,c=16,h=10,w=10,k=32,r=3,s=3,pad=1,bias=1")
    options = MeasureOptions(repeat=3, min_repeat_ms=5.0, warmup=0, timeout_ms=2000, cold_weights=True)
    measurer = Measurer(board, workload, options, compile_pool)
    try:
        request = measurer._timed_request(0)
        names = [measurer.tensors[i].name for i in sorted(request.evict)]
        assert names == ["weights", "bias"] and request.number == 1 and request.min_repeat_ms == 0
        (result,) = measurer.measure(configs(workload.key, board.target.name, 0, seed=0))
    finally:
        measurer.close()
    assert result.status is MeasureStatus.OK, result.error
    assert len(result.costs) == 3 and all(c > 0 for c in result.costs)


def test_emulated_boards_candidates_match_numpy(qemu_board: str, compile_pool: CompilePool) -> None:
    board = get_board(qemu_board)
    shape = "matmul:m=19,n=37,k=23"
    measurer = Measurer(board, parse_workload(shape), FAST, compile_pool)
    try:
        results = measurer.measure(configs(shape, board.target.name, 3, seed=3))
    finally:
        measurer.close()
    assert [r.status for r in results] == [MeasureStatus.OK] * len(results), [r.error for r in results]


@pytest.mark.skipif(shutil.which("qemu-riscv64") is None, reason="needs qemu-user")
@pytest.mark.parametrize("shape", ["matmul:m=13,n=70,k=29,bias=1,relu=1", "matmul:m=9,n=40,k=17,prepacked=1"])
def test_rvv_register_groups_match_numpy(shape: str, compile_pool: CompilePool) -> None:
    """RVV's matmul vectors span lmul registers: lmul 1, 2 and 4 at tiles whose groups fit and one whose
    groups do not (it runs at the lmul that fits), partial groups at the last columns, B prepacked."""
    board = get_board("qemu-riscv64-v")
    template = template_for(parse_workload(shape), board.target)
    default = template.default_config()
    assert default["lmul"] == 4
    indices = [
        template.space.index_of({**default.as_dict(), "tile": tile, "lmul": lmul, "kc": 16})
        for tile in ("2x2", "5x1", "6x3")
        for lmul in (1, 2, 4)
    ]
    measurer = Measurer(board, parse_workload(shape), FAST, compile_pool)
    try:
        results = measurer.measure([default.index, *indices])
    finally:
        measurer.close()
    assert [r.status for r in results] == [MeasureStatus.OK] * len(results), [r.error for r in results]


@pytest.mark.host_runs("x86-avx2")
def test_faulty_candidates_become_statuses_and_the_run_goes_on() -> None:
    wl = parse_workload("matmul:m=8,n=8,k=8")
    measurer = Measurer(get_board("local"), wl, FAST)
    target = get_target("x86-avx2")
    default = template_for(wl, target).default_config().index
    good = build_image(Candidate(workload=wl, target=target, index=default))
    try:
        crashed = measurer.run(image_of(SEGFAULT))
        hung = measurer.run(image_of(HANG))
        wrong = measurer.run(image_of(WRONG))
        after = measurer.run(good)
    finally:
        measurer.close()
    assert crashed.status is MeasureStatus.RUNTIME_ERROR and "SIGSEGV" in crashed.error
    assert hung.status is MeasureStatus.TIMEOUT
    assert wrong.status is MeasureStatus.WRONG_ANSWER and "not finite" in wrong.error
    assert after.status is MeasureStatus.OK and after.cost > 0
    assert crashed.cost == hung.cost == wrong.cost == float("inf")  # never a best


@pytest.mark.board
@pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="needs qemu-user")
def test_every_result_carries_its_boards_unit_failures_included() -> None:
    wl = parse_workload("matmul:m=4,n=4,k=4")
    measurer = Measurer(get_board("qemu-aarch64"), wl, FAST)
    target = get_target("arm-a72-neon")
    good = build_image(
        Candidate(workload=wl, target=target, index=template_for(wl, target).default_config().index)
    )
    try:
        results = [
            measurer.run(BuiltImage(MeasureStatus.COMPILE_ERROR, error="no such instruction")),
            measurer.run(image_of(SEGFAULT, "arm-a72-neon")),
            measurer.run(good),
        ]
    finally:
        measurer.close()
    assert [r.status for r in results] == [
        MeasureStatus.COMPILE_ERROR,
        MeasureStatus.RUNTIME_ERROR,
        MeasureStatus.OK,
    ]
    # A failure is stamped like an OK result: no reader guesses "s" for a count that never happened.
    assert [r.cost_unit for r in results] == [CostUnit.INSTRUCTIONS] * 3


@pytest.mark.board
@pytest.mark.skipif(shutil.which("qemu-aarch64") is None, reason="needs qemu-user")
def test_a_correctness_only_board_checks_and_bench_says_so() -> None:
    wl = parse_workload("matmul:m=6,n=10,k=7")
    target = get_target("arm-a72-neon")
    emulated = QemuBoard("qemu-aarch64", target, CostUnit.NONE)
    measurer = Measurer(emulated, wl, FAST)
    wrong = image_of(WRONG, "arm-a72-neon")
    try:
        checked = measurer.measure([template_for(wl, target).default_config().index])[0]
        caught = measurer.run(wrong)
    finally:
        measurer.close()
    assert checked.ok and checked.costs == () and checked.cost == float("inf")  # correct, and no figure
    assert checked.cost_unit is CostUnit.NONE and caught.status is MeasureStatus.WRONG_ANSWER
    report = bench(wl, emulated).as_dict()
    assert report["correct"] and report["cost_unit"] == "none" and report["error"] == ""
    assert report["seconds"] is None and report["instructions"] is None and report["gflops"] is None
    # An instruction-counting board: the count is a count, not seconds, and no error is made up.
    counted = bench(wl, get_board("qemu-aarch64")).as_dict()
    assert counted["correct"] and counted["cost_unit"] == "insn" and counted["error"] == ""
    assert counted["seconds"] is None and counted["gflops"] is None
    assert isinstance(counted["instructions"], float) and counted["instructions"] > 0


def abort_on_odd(candidate: Candidate) -> BuiltImage:
    """A build job whose odd candidates kill the worker, as an LLVM abort() would."""
    if candidate.index % 2:
        os.abort()
    return build_image(candidate)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has exited, unreaped
    except FileNotFoundError:
        return False


def test_compile_workers_do_not_outlive_a_killed_tuner() -> None:
    script = (
        "import os, signal\n"
        "from xtune.tuning.measure import CompilePool\n"
        "from xtune.target import get_target\n"
        "from xtune.ops.registry import parse_workload\n"
        "pool = CompilePool(workers=2)\n"
        "list(pool.build_all(parse_workload('matmul:m=8,n=8,k=8'), get_target('x86-avx2'), [0, 1]))\n"
        "print(*pool._pool._processes, flush=True)\n"
        "os.kill(os.getpid(), signal.SIGKILL)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    workers = [int(pid) for pid in out.stdout.split()]
    assert out.returncode == -signal.SIGKILL and workers, out.stderr
    deadline = time.monotonic() + 30  # workers poll for their parent every 0.5 s; slack for a loaded machine
    while any(map(_alive, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(_alive, workers))


def test_a_compiler_crash_is_a_status_not_the_end_of_the_run() -> None:
    wl = parse_workload("matmul:m=8,n=8,k=8")
    target = get_target("x86-avx2")
    pool = CompilePool(workers=1, job=abort_on_odd)
    try:
        built = list(pool.build_all(wl, target, [2, 3, 4, 6]))
    finally:
        pool.close()
    assert [b.status for b in built] == [MeasureStatus.OK, MeasureStatus.COMPILE_ERROR] + [
        MeasureStatus.OK
    ] * 2
    assert "compiler process died" in built[1].error


RAISES, ASSERTS, HANGS = 3, 5, 7  # configs of matmul:m=8,n=8,k=8 whose builds fail in BrokenMatmul


class BrokenMatmul(MatmulTemplate):
    """The matmul template with a bug in two configs and a build that never ends in a third."""

    def kernel(self, config: Config, name: str) -> Kernel:
        if config.index == RAISES:
            raise ValueError(f"tile {config.index} does not divide\nthe loop")
        assert config.index != ASSERTS
        if config.index == HANGS:
            time.sleep(600)  # the pool kills the worker long before
        return super().kernel(config, name)


def build_broken(candidate: Candidate) -> BuiltImage:
    """The real build of a candidate, from BrokenMatmul (imported by the spawned worker from this module)."""
    return build_image(candidate, BrokenMatmul(candidate.workload, candidate.target))


def test_a_failing_or_hanging_build_is_a_status_and_the_others_are_measured() -> None:
    wl = parse_workload("matmul:m=8,n=8,k=8")
    pool = CompilePool(workers=1, job=build_broken, build_timeout_s=10)
    measurer = Measurer(get_board("local"), wl, FAST, pool)
    indices = [2, RAISES, ASSERTS, 4, HANGS, 6, 8]
    start = time.monotonic()
    try:
        results = dict(zip(indices, measurer.measure(indices), strict=True))
    finally:
        measurer.close()
        pool.close()
    assert time.monotonic() - start < 120  # the hung worker was killed: no waiting out its sleep
    failed = {RAISES, ASSERTS, HANGS}
    assert all(results[i].status is MeasureStatus.COMPILE_ERROR for i in failed)
    assert results[RAISES].error == "ValueError: tile 3 does not divide the loop"
    assert results[ASSERTS].error == "AssertionError"
    assert "10 s build timeout" in results[HANGS].error
    for i in set(indices) - failed:  # before, between and after them (in flight when the pool restarted)
        assert results[i].status is MeasureStatus.OK and results[i].cost > 0, (i, results[i])


def test_closing_a_pool_interrupted_before_its_manager_thread_started_raises_nothing() -> None:
    """Ctrl-C can land inside `submit` between the executor making its manager thread and starting it;
    the run's clean-up (`close`) must then stop without a traceback ("cannot join thread before it is
    started")."""
    import threading
    from concurrent.futures import ProcessPoolExecutor

    pool = CompilePool(workers=1)
    interrupted = ProcessPoolExecutor(1)
    interrupted._executor_manager_thread = threading.Thread(target=lambda: None)  # type: ignore[assignment]
    pool._pool = interrupted
    pool.close()
    assert pool._pool is None
