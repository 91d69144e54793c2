"""The task scheduler: whole runs on the local board with small hand-made tasks — the budget,
the first round, resume, the allocation, the end-to-end estimate — and `xtune tune --model` through the
CLI, Ctrl-C included. The policy alone, on made-up numbers, is tests/test_allocation.py."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import xtune
from tests.conftest import interrupt_cli
from xtune.boards.agent import AgentSession
from xtune.boards.board import get_board
from xtune.boards.cost import CostUnit
from xtune.errors import BoardError, BoardFault, InputError
from xtune.frontend.tasks import Task
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.template import seed_configs
from xtune.tuning.allocation import SchedulerOptions, Strategy, expected_gain, similarity_key
from xtune.tuning.database import Record, TuningLog, log_target, read_logs
from xtune.tuning.features import estimate_prior, features_op, featurize
from xtune.tuning.measure import MeasureResult, MeasureStatus
from xtune.tuning.options import MeasureOptions, TuneOptions, TunerName
from xtune.tuning.ranking import best
from xtune.tuning.task_scheduler import (
    ModelProgress,
    ModelStop,
    ModelTuningResult,
    TaskScheduler,
    TaskStop,
    tune_tasks,
)

QUICK = MeasureOptions(repeat=2, min_repeat_ms=2.0, timeout_ms=2000)
GREEDY = SchedulerOptions(epsilon=0.0)  # the largest expected gain, every time


def task(key: str, count: int = 1) -> Task:
    workload = parse_workload(key)
    return Task(
        workload=workload,
        nodes=tuple(f"{workload.op}_{i}" for i in range(count)),
        flops=float(workload.flops()),
    )


# --- whole runs on the local board ------------------------------------------------------------------------

SMALL = [
    task("matmul:m=32,n=32,k=32"),
    task("matmul:m=48,n=32,k=24", 3),
    task("conv2d:n=1,c=8,h=10,w=10,k=8,r=3,s=3,stride=1,pad=1"),
]


def options(trials: int, tuner: TunerName = "random", batch: int = 2) -> TuneOptions:
    return TuneOptions(tuner=tuner, trials=trials, batch_size=batch, measure=QUICK, confirm=0)


def run(tasks: list[Task], log: Path, trials: int, **kw: object) -> ModelTuningResult:
    board = get_board("local")
    return tune_tasks(tasks, [board], options(trials, **kw), TuningLog(log))  # type: ignore[arg-type]


def measured_in(records: list[Record], key: str) -> list[int]:
    return [r.index for r in records if r.workload == key]


@pytest.fixture(scope="module")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, ModelTuningResult]:
    log = tmp_path_factory.mktemp("sched") / "log.jsonl"
    return log, run(SMALL, log, 12, tuner="xgb")


def test_the_budget_is_spent_and_the_first_round_measures_only_every_tasks_seeds(
    first_run: tuple[Path, ModelTuningResult],
) -> None:
    log, result = first_run
    records = read_logs([log])
    assert result.stop is ModelStop.TRIALS and result.trials == 12 == len(records)
    assert sum(t.trials for t in result.tasks) == 12 and all(t.resumed == 0 for t in result.tasks)
    target = get_board("local").target
    # The first round, in task order: each task's default (and, for the 3x3 conv2d whose algorithm is the
    # tuner's, Winograd's default too: `seed_configs`), then, where its operator has an analytic estimate
    # (matmul, the conv2d's sum), the estimate's top pick; nothing else.
    at = 0
    for i, t in enumerate(SMALL):
        template = template_for(t.workload, target)
        prior = estimate_prior(features_op(template))
        seeds = seed_configs(template)
        first = records[at : at + len(seeds) + (prior is not None)]
        assert [r.workload for r in first] == [t.workload.key] * len(first)
        assert [r.index for r in first[: len(seeds)]] == seeds and seeds[0] == template.default_config().index
        assert result.tasks[i].default_cost == first[0].cost
        if prior is not None:  # the pick scores at least as well as the best of 200 random configs
            rng = np.random.default_rng(0)
            drawn = rng.integers(template.space.size, size=200).tolist()
            score = prior.predict(featurize(template, [first[-1].index]))[0]
            assert score >= prior.predict(featurize(template, drawn)).max()
        at += len(first)
    assert at == 7 == result.curve[0][0]  # the curve starts once the first round gave every task a latency
    assert len({(r.workload, r.index) for r in records}) == 12  # no config measured twice


def test_the_estimate_is_count_times_best_latency(first_run: tuple[Path, ModelTuningResult]) -> None:
    log, result = first_run
    records, target = read_logs([log]), get_board("local").target
    shipped = [
        best(records, t.workload.key, log_target(t.workload, target))[0] for t in SMALL
    ]  # what `xtune build` would take
    assert [t.best_cost for t in result.tasks] == [r.cost for r in shipped]
    assert [t.best_index for t in result.tasks] == [r.index for r in shipped]
    assert result.estimate == pytest.approx(
        sum(t.count * r.cost for t, r in zip(SMALL, shipped, strict=True))
    )
    assert result.estimate <= result.default_estimate
    # The curve starts once every task has a latency (after the first round) and ends at the estimate.
    spent = [n for n, _ in result.curve]
    assert spent[0] == 7 and spent == sorted(spent) and spent[-1] == 12
    assert result.curve[-1][1] == pytest.approx(result.estimate)
    assert all(a >= b for (_, a), (_, b) in zip(result.curve, result.curve[1:], strict=False))


def test_a_resumed_run_continues_and_measures_nothing_again(
    first_run: tuple[Path, ModelTuningResult], tmp_path: Path
) -> None:
    log, first = first_run
    copy = tmp_path / "log.jsonl"
    copy.write_text(log.read_text())
    before = read_logs([copy])
    result = run(SMALL, copy, 6, tuner="xgb")
    new = read_logs([copy])[len(before) :]
    assert result.trials == 6 == len(new)
    assert not {(r.workload, r.index) for r in new} & {(r.workload, r.index) for r in before}
    assert [t.resumed for t in result.tasks] == [t.trials for t in first.tasks]
    n, estimate = result.curve[0]
    assert n == 0 and estimate == pytest.approx(first.estimate)  # it starts where the first run ended


def test_the_gradient_favours_the_task_with_the_larger_weight(tmp_path: Path) -> None:
    # Two tasks of about one latency; one runs in 16 nodes: its batches lower the model's latency 16x more.
    tasks = [task("matmul:m=40,n=40,k=40"), task("matmul:m=40,n=40,k=41", 16)]
    gradient = run(tasks, tmp_path / "g.jsonl", 16)
    light, heavy = gradient.tasks
    assert heavy.trials >= 3 * light.trials, (light.trials, heavy.trials)
    # Round-robin: the same first round (the default of each), then the other 16 trials split evenly.
    even = tune_tasks(
        tasks,
        [get_board("local")],
        options(18),
        TuningLog(tmp_path / "r.jsonl"),
        scheduler=SchedulerOptions(strategy=Strategy.ROUND_ROBIN),
    )
    assert [t.trials for t in even.tasks] == [9, 9]


# --- allocation on made-up timings: a fake measure, the logic alone -----------------------------------------


class Curve:
    """A fake measure of one task: the k-th config it measures costs `costs[k]` (the last one ever after);
    +inf is a wrong answer."""

    def __init__(self, *costs: float) -> None:
        self.costs, self.measured = costs, 0

    def __call__(self, batch: list[int]) -> list[MeasureResult]:
        out = []
        for _ in batch:
            cost = self.costs[min(self.measured, len(self.costs) - 1)]
            self.measured += 1
            status = MeasureStatus.OK if math.isfinite(cost) else MeasureStatus.WRONG_ANSWER
            out.append(MeasureResult(status=status, costs=(cost,) if math.isfinite(cost) else ()))
        return out


def faked(
    tasks: list[Task],
    curves: list[Curve],
    trials: int,
    strategy: Strategy = Strategy.GRADIENT,
    *,
    epsilon: float = 0.0,
    seed: int = 0,
) -> tuple[TaskScheduler, list[ModelProgress], ModelStop]:
    """A scheduler whose tasks are measured by `curves` (random tuner: each first round is the default);
    no ε-greedy draws unless asked for."""
    seen: list[ModelProgress] = []
    opts = replace(options(trials, batch=4), seed=seed)
    run = TaskScheduler(
        tasks,
        [get_board("local")],
        opts,
        scheduler=SchedulerOptions(strategy=strategy, epsilon=epsilon),
        on_progress=seen.append,
    )
    try:
        for state, curve in zip(run.tasks, curves, strict=True):
            state.session.loop.measure_batch = curve
        stop = run.run(trials)
    finally:
        run.close()
    return run, seen, stop


# Four tasks of different operators or flops: each its own similarity group.
FOUR = [
    task("matmul:m=16,n=16,k=16"),
    task("matmul:m=64,n=64,k=64", 6),
    task("conv2d:n=1,c=8,h=10,w=10,k=8,r=3,s=3,stride=1,pad=1", 2),
    task("matmul:m=128,n=128,k=128"),
]


def four_curves() -> list[Curve]:
    return [
        Curve(4e-3, 3e-3, 2.5e-3, 2e-3, 1.8e-3, 1.2e-3, 1e-3, 0.9e-3, 0.85e-3),  # light, keeps improving
        Curve(1e-3),  # heavy (6 nodes), but every config runs alike
        Curve(2e-3, 1.9e-3, 1.8e-3, 1.7e-3, 1.6e-3, 1.5e-3),  # 2 nodes, slowly improving
        Curve(3e-3, 1e-3, 0.5e-3),
    ]  # one node, a large early gain


def test_the_gradient_gives_each_batch_to_the_task_of_the_largest_expected_gain() -> None:
    assert len({similarity_key(t) for t in FOUR}) == 4  # no similar task raises a forward guess
    run, seen, stop = faked(FOUR, four_curves(), 4 + 4 * 24)
    assert stop is ModelStop.TRIALS and run.trials == 100
    assert [p.task for p in seen[:4]] == [0, 1, 2, 3]  # the first round: one batch each, in task order
    # the default alone (the random tuner's only seed config)
    assert all(len(p.batch.batch) == 1 for p in seen[:4])
    histories: list[list[float]] = [[p.latencies[p.task]] for p in seen[:4]]
    for p in seen[4:]:
        gains = [
            expected_gain(
                count=t.count, history=h, flops=t.flops, peer_throughput=t.flops / h[-1], options=GREEDY
            )
            for t, h in zip(FOUR, histories, strict=True)
        ]
        assert gains[p.task] == max(gains), (p.trials, gains)
        histories[p.task].append(p.latencies[p.task])
    # After the first round the heavy task weighs most (6 x 1 ms): the first batch is its.
    assert seen[4].task == 1
    batches = [len(h) - 1 for h in histories]
    assert len(set(batches)) > 1, batches  # not an even split


def test_two_schedulers_stepped_in_turn_make_the_picks_each_makes_alone() -> None:
    # What benchmarks/bench_scheduler.py relies on: `batches` runs one batch per step, and interleaving two
    # schedulers' steps changes nothing in either's choices (ε-greedy draws included).
    trials = 4 + 4 * 12
    alone = {s: [p.task for p in faked(FOUR, four_curves(), trials, s, epsilon=0.3)[1]] for s in Strategy}
    seen: dict[Strategy, list[ModelProgress]] = {s: [] for s in Strategy}
    runs = {
        s: TaskScheduler(
            FOUR,
            [get_board("local")],
            options(trials, batch=4),
            scheduler=SchedulerOptions(strategy=s, epsilon=0.3),
            on_progress=seen[s].append,
        )
        for s in Strategy
    }
    try:
        for run in runs.values():
            for state, curve in zip(run.tasks, four_curves(), strict=True):
                state.session.loop.measure_batch = curve
        steps = {s: run.batches(trials) for s, run in runs.items()}
        spent: dict[Strategy, list[int]] = {s: [] for s in Strategy}
        while steps:
            for s, step in list(steps.items()):
                n = next(step, None)
                if n is None:
                    del steps[s]
                else:
                    spent[s].append(n)
    finally:
        for run in runs.values():
            run.close()
    assert {s: [p.task for p in progress] for s, progress in seen.items()} == alone
    for s in Strategy:  # one yield per batch: 4 first-round seed configs, then 12 batches of 4
        assert spent[s] == [1, 2, 3, 4, *range(8, trials + 1, 4)]


def test_round_robin_shares_the_first_round_then_splits_the_rest_evenly() -> None:
    runs = {s: faked(FOUR, four_curves(), 4 + 4 * 4 * 3, s) for s in Strategy}
    firsts = {s: [(p.task, p.batch.batch) for p in seen[:4]] for s, (_, seen, _) in runs.items()}
    assert firsts[Strategy.GRADIENT] == firsts[Strategy.ROUND_ROBIN]  # the same configs, in the same order
    even, seen, _ = runs[Strategy.ROUND_ROBIN]
    assert [p.task for p in seen[4:]] == [0, 1, 2, 3] * 3
    assert [t.trials for t in even.results()] == [1 + 12] * 4


def test_the_epsilon_greedy_picks_are_a_function_of_the_runs_seed() -> None:
    # epsilon = 0.5: about every other batch goes to a task drawn at random, so the picks differ from the
    # greedy ones, yet a run repeated with its seed makes the very same picks.
    trials = 4 + 4 * 24
    greedy = [p.task for p in faked(FOUR, four_curves(), trials)[1]]
    first, again, other = (
        [p.task for p in faked(FOUR, four_curves(), trials, epsilon=0.5, seed=s)[1]] for s in (1, 1, 2)
    )
    assert first == again and first != greedy and first != other
    assert len(first) == len(greedy) == 4 + 24


def test_a_task_whose_seeds_fail_gets_one_whole_batch_before_it_is_dropped() -> None:
    tasks = FOUR[:3]
    curves = [Curve(math.inf, 2e-3, 1e-3), Curve(math.inf), Curve(1e-3)]
    run, _, stop = faked(tasks, curves, 3 + 4 * 6)
    first, dropped, _ = run.results()
    assert first.stop is TaskStop.RUNNING and math.isfinite(first.best_cost)  # its batch found a config
    assert dropped.stop is TaskStop.NO_CORRECT_CONFIG and dropped.trials == 1 + 4
    assert stop is ModelStop.TRIALS and run.trials == 27


def test_a_task_far_slower_than_its_similar_tasks_leaves_their_group() -> None:
    # One group (same operator, about the same flops); the slow one runs at 1/10 the throughput of the
    # fast one, which says it could drop to 2/10 (beta = 2): that forward guess (8 ms) outweighs the fast
    # task's (5 nodes x 1 ms) batch after batch, without gain, until the slow one has had more than 5
    # batches beyond the other (Ansor). Then it leaves the group and its guess is 1/t: the fast one's turn.
    slow, fast = task("matmul:m=64,n=64,k=64"), task("matmul:m=64,n=64,k=65", 5)
    assert similarity_key(slow) == similarity_key(fast)
    run, seen, _ = faked([slow, fast], [Curve(10e-3), Curve(1e-3)], 2 + 4 * 8)
    assert [p.task for p in seen[2:9]] == [0] * 6 + [1]
    assert run.tasks[0].grouped is False and run.tasks[1].grouped is True


def test_tasks_stop_early_and_the_run_ends_when_every_task_has(tmp_path: Path) -> None:
    # early_stopping=1: a task stops at its first batch that does not lower its best latency. A random
    # search improves on batch k with a chance of about 1/k, so 60 trials are never needed.
    opts = TuneOptions(tuner="random", trials=60, batch_size=2, early_stopping=1, measure=QUICK, confirm=0)
    result = tune_tasks(SMALL[:2], [get_board("local")], opts, TuningLog(tmp_path / "log.jsonl"))
    assert result.stop is ModelStop.TASKS_DONE and result.trials < 60
    assert all(t.stop is TaskStop.EARLY_STOPPING for t in result.tasks)
    assert result.trials == len(read_logs([tmp_path / "log.jsonl"]))


def test_fewer_trials_than_new_tasks_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="fewer than the 3 tasks"):
        run(SMALL, tmp_path / "log.jsonl", 2)


class RefusingBoard:
    """The local board, until its `good` sessions are used up: then every open() is refused for good, as
    when a board's key is rotated mid-run (a unit-test fake: tests/test_faults.py has the real faults)."""

    cost_unit = CostUnit.SECONDS

    def __init__(self, good: int) -> None:
        self.real = get_board("local")
        self.name, self.target, self.good = "flaky", self.real.target, good

    def open(self) -> AgentSession:
        if self.good <= 0:
            raise BoardError("authentication as pi@lab:22 failed", BoardFault.AUTHENTICATION)
        self.good -= 1
        return self.real.open()

    def fingerprint(self) -> dict[str, str]:
        return self.real.fingerprint()


def test_a_board_that_fails_for_good_stops_the_model_run_and_a_resumed_run_measures_its_losses(
    tmp_path: Path,
) -> None:
    # One session per task, one task's open at a time: the second task's batch meets the refusal.
    log = tmp_path / "log.jsonl"
    result = tune_tasks(SMALL, [RefusingBoard(good=1)], options(12), TuningLog(log))
    records = read_logs([log])
    assert result.stop is ModelStop.BOARD_FAILED and result.error.startswith("board flaky: authentication")
    # The first round of the random tuner is each task's default alone.
    assert [t.trials for t in result.tasks] == [1, 1, 0] and result.trials == 2 == len(records)
    lost = measured_in(records, SMALL[1].workload.key)
    assert [r.result.status for r in records] == [MeasureStatus.OK, MeasureStatus.BOARD_ERROR]
    assert result.as_dict()["stop"] == "board_failed" and result.confirm_timings == 0
    # Resumed on a board that works: the config lost to the board error is the task's first measured.
    again = run(SMALL, log, 4)
    assert again.stop is ModelStop.TRIALS
    assert measured_in(read_logs([log])[2:], SMALL[1].workload.key)[: len(lost)] == lost


# --- the command line and the library entry ---------------------------------------------------------------


def tiny_model(path: Path) -> Path:
    """X[8,32] -> MatMul -> Relu -> MatMul (same shapes: the same task) -> Relu -> MatMul[32,16]."""
    onnx = pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = {
        "w1": rng.standard_normal((32, 32)),
        "w2": rng.standard_normal((32, 32)),
        "w3": rng.standard_normal((32, 16)),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["a"], name="mm1"),
        helper.make_node("Relu", ["a"], ["ar"], name="r1"),
        helper.make_node("MatMul", ["ar", "w2"], ["b"], name="mm2"),
        helper.make_node("Relu", ["b"], ["br"], name="r2"),
        helper.make_node("MatMul", ["br", "w3"], ["y"], name="mm3"),
    ]
    graph = helper.make_graph(
        nodes,
        "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, 16])],
        [numpy_helper.from_array(v.astype(np.float32), k) for k, v in inits.items()],
    )
    onnx.save_model(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def xtune_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "xtune.cli", *args], capture_output=True, text=True, timeout=600
    )


QUICK_FLAGS = ("--repeat", "2", "--min-repeat-ms", "2", "--batch-size", "2", "--confirm", "0")


def test_cli_tune_model_json_matches_the_library(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "tiny.onnx")
    log = tmp_path / "log.jsonl"
    out = xtune_cli("tune", "--model", str(model), "--trials", "6", "--log", str(log), "--json", *QUICK_FLAGS)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    assert report["trials"] == 6 == len(read_logs([log])) and report["strategy"] == "gradient"
    assert [t["count"] for t in report["tasks"]] == [2, 1]
    assert report["estimate"] == pytest.approx(sum(t["count"] * t["best_cost"] for t in report["tasks"]))
    assert "model" in out.stderr and "task 1/2" in out.stderr  # progress per task and for the model
    # The library entry resumes the same log and returns what the command prints.
    result = xtune.tune_model(model, trials=4, log=log, options=options(4), strategy="round-robin")
    assert isinstance(result, ModelTuningResult) and result.trials == 4 and len(read_logs([log])) == 10
    assert [t.resumed for t in result.tasks] == [t["trials"] for t in report["tasks"]]


def test_cli_model_and_workload_exclude_each_other(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "tiny.onnx")
    out = xtune_cli("tune", "--model", str(model), "--workload", "matmul:m=8,n=8,k=8")
    assert out.returncode == 2 and "not allowed with" in out.stderr
    out = xtune_cli("tune", "--model", str(model), "--trials", "1", "--log", str(tmp_path / "l.jsonl"))
    assert out.returncode == 2 and "fewer than the 2 tasks" in out.stderr and "Traceback" not in out.stderr


def test_ctrl_c_keeps_the_log_of_a_model_run(tmp_path: Path) -> None:
    model = tiny_model(tmp_path / "tiny.onnx")
    log = tmp_path / "log.jsonl"
    out = interrupt_cli(
        "tune", "--model", str(model), "--trials", "400", "--log", str(log), *QUICK_FLAGS, log=log
    )
    stdout, stderr = out.stdout, out.stderr
    assert out.returncode == 130, stderr
    assert "Traceback" not in stderr and "estimated end-to-end latency" in stdout
    records = read_logs([log])  # every line parses: nothing torn
    assert 8 <= len(records) < 400
