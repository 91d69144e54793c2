"""The task scheduler's policy (xtune/tuning/allocation.py) on made-up numbers: Ansor's expected gain,
the choice of the next task (greedy, ε-greedy, round-robin) and the similarity groups. Whole runs are
tests/test_scheduler.py."""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field

import pytest

from xtune.frontend.tasks import Task
from xtune.ops.registry import parse_workload
from xtune.tuning.allocation import (
    SchedulerOptions,
    choose_gradient,
    choose_round_robin,
    end_to_end,
    expected_gain,
    gains,
    similarity_key,
)

GRADIENT = SchedulerOptions(epsilon=0.0)  # the largest expected gain, every time


def task(key: str, count: int = 1) -> Task:
    workload = parse_workload(key)
    return Task(
        workload=workload,
        nodes=tuple(f"{workload.op}_{i}" for i in range(count)),
        flops=float(workload.flops()),
    )


@dataclass(eq=False)
class State:
    """A task's progress as the policy reads it (allocation.TaskState)."""

    task: Task
    history: list[float] = field(default_factory=list)
    batches: int = 0
    grouped: bool = True
    running: bool = True

    @property
    def latency(self) -> float:
        return self.history[-1] if self.history else math.inf


# --- the expected gain ----------------------------------------------------------------------------------


def test_gain_after_one_batch_is_the_optimistic_forward_guess() -> None:
    # One batch: no backward window yet; g(t) ~ 1/t says the next batch could take the latency from 1 ms
    # down to 0 (1 - 1/1): a drop of 1 ms, weighted by 1 - alpha, times the node count.
    gain = expected_gain(count=2, history=[1e-3], flops=1e6, peer_throughput=0.0, options=GRADIENT)
    assert gain == pytest.approx(2 * (1 - GRADIENT.alpha) * 1e-3)


def test_gain_scales_with_the_node_count() -> None:
    history = [4e-3, 3e-3, 2.5e-3, 2.2e-3, 2e-3]
    one, five = (
        expected_gain(count=c, history=history, flops=1e6, peer_throughput=0.0, options=GRADIENT)
        for c in (1, 5)
    )
    assert five == pytest.approx(5 * one) and one > 0


def test_backward_term_is_the_mean_drop_over_the_window() -> None:
    options = SchedulerOptions(alpha=1.0, window=3)  # backward term alone
    history = [9.0, 8.0, 4.0, 2.0, 1.0]  # over the last 3 batches: from 8 to 1, 7/3 per batch
    assert expected_gain(count=1, history=history, flops=1.0, peer_throughput=0.0, options=options) == (
        pytest.approx(7 / 3)
    )
    flat = [5.0, 5.0, 5.0, 5.0]
    assert expected_gain(count=1, history=flat, flops=1.0, peer_throughput=0.0, options=options) == 0
    short = [9.0, 8.0, 4.0]  # not more batches than the window: no backward term yet
    assert expected_gain(count=1, history=short, flops=1.0, peer_throughput=0.0, options=options) == 0


def test_a_faster_similar_task_raises_the_forward_guess() -> None:
    options = SchedulerOptions(alpha=0.0, beta=2.0)  # forward term alone
    history = [1e-3] * 10  # 1 GFLOP/s for 1 MFLOP, and 1/t says little after 10 batches: 0.1 ms
    alone = expected_gain(count=1, history=history, flops=1e6, peer_throughput=1e9, options=options)
    assert alone == pytest.approx(1e-4)
    # A similar task runs 10 GFLOP/s: at half that (beta = 2) this one would take 0.2 ms, a drop of 0.8 ms.
    peer = expected_gain(count=1, history=history, flops=1e6, peer_throughput=1e10, options=options)
    assert peer == pytest.approx(8e-4)


def test_similar_tasks_are_one_operator_of_about_the_same_flops() -> None:
    a = task("matmul:m=64,n=64,k=64")
    assert similarity_key(a) == similarity_key(task("matmul:m=64,n=64,k=66"))
    assert similarity_key(a) != similarity_key(task("matmul:m=64,n=64,k=256"))
    assert similarity_key(task("conv2d:n=1,c=16,h=8,w=8,k=32,r=1,s=1,stride=1,pad=0"))[0] == "conv2d"


def test_end_to_end_is_count_times_latency_and_unknown_while_a_task_has_none() -> None:
    assert end_to_end([1, 3], [2.0, 0.5]) == 3.5
    assert end_to_end([1, 3], [2.0, math.inf]) == math.inf


# --- the choice ---------------------------------------------------------------------------------------------

# Three tasks of different operators or flops (no similarity group): the second has the largest weight.
THREE = [
    State(task("matmul:m=16,n=16,k=16"), [2e-3, 1e-3], 1),
    State(task("matmul:m=64,n=64,k=64", 4), [3e-3, 2e-3], 1),
    State(task("conv2d:n=1,c=8,h=10,w=10,k=8,r=3,s=3,stride=1,pad=1"), [1e-3, 1e-3], 1),
]


def test_greedy_picks_the_largest_expected_gain_among_running_tasks() -> None:
    rng = random.Random(0)
    expected = gains(THREE, GRADIENT)
    assert choose_gradient(THREE, GRADIENT, rng) == 1 == max(range(3), key=expected.__getitem__)
    stopped = [THREE[0], State(THREE[1].task, THREE[1].history, 1, running=False), THREE[2]]
    assert gains(stopped, GRADIENT)[1] == 0 and choose_gradient(stopped, GRADIENT, rng) == 0
    assert choose_gradient([State(s.task, s.history, running=False) for s in THREE], GRADIENT, rng) is None


def test_ties_go_to_the_task_with_the_fewest_batches_then_the_first() -> None:
    same = task("matmul:m=16,n=16,k=16")
    tied = [State(same, [1e-3] * 5, 4), State(same, [1e-3] * 5, 2), State(same, [1e-3] * 5, 2)]
    assert choose_gradient(tied, GRADIENT, random.Random(0)) == 1


def test_epsilon_sends_that_share_of_batches_to_a_running_task_drawn_at_random() -> None:
    # Task 1 always has the largest gain; with epsilon = 0.3 a draw among the two running tasks (task 2
    # has stopped) takes 30 % of the picks, half of which land on task 0: 15 % of all picks.
    states = [THREE[0], THREE[1], State(THREE[2].task, THREE[2].history, 1, running=False)]
    rng, n = random.Random(0), 4000
    picks = Counter(choose_gradient(states, SchedulerOptions(epsilon=0.3), rng) for _ in range(n))
    assert picks[2] == 0 and set(picks) == {0, 1}
    assert picks[0] / n == pytest.approx(0.15, abs=0.02)


def test_round_robin_takes_the_next_running_task_and_wraps_around() -> None:
    states = [State(s.task, s.history, 1, running=r) for s, r in zip(THREE, (True, False, True), strict=True)]
    assert [choose_round_robin(states, turn) for turn in range(3)] == [0, 2, 2]
    assert choose_round_robin([State(s.task, running=False) for s in THREE], 1) is None
