"""The task scheduler's policy: which task the next batch goes to, from each task's history alone.

No board, log or tuner here: the scheduler (xtune/tuning/task_scheduler.py) keeps the state and measures,
this module decides, and a replay of recorded tuning curves (benchmarks/sim_scheduler.py) runs the very
same decisions without measuring anything.

The idea is Ansor's (L. Zheng et al., "Ansor: Generating High-Performance Tensor Programs for Deep
Learning", OSDI 2020, §6): the objective is the end-to-end latency f = Σ_i w_i g_i, where g_i is task i's
best latency and w_i the number of nodes that run it. Each batch goes to the task whose next batch is
expected to lower f the most: w_i times the expected drop of g_i, blended from how much g_i fell over
its last `window` batches (the backward term) and an optimistic forward guess — g_i falls like 1/t in
the number of batches t, or, when a similar task (same operator, flops within one step of Ansor's
1.618-base log scale) already runs faster per flop, g_i could drop to `beta` times the latency at that
task's throughput (a task that stays far slower than its group after 5 batches more leaves it). With
probability `epsilon` the batch goes to a task drawn at random instead (ε-greedy, docs/design.md "The
task scheduler": the guesses are guesses, and a task they rank low would otherwise never be looked at
again).
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Protocol

from xtune.errors import InputError
from xtune.ops.workload import Workload


class TaskLike(Protocol):
    """What the scheduler reads of a task (xtune.frontend.tasks.Task)."""

    @property
    def workload(self) -> Workload: ...
    @property
    def nodes(self) -> tuple[str, ...]: ...
    @property
    def flops(self) -> float: ...
    @property
    def count(self) -> int: ...


class Strategy(Enum):
    GRADIENT = "gradient"  # Ansor's gradient allocation (module docstring)
    ROUND_ROBIN = "round-robin"  # one batch per task in turn: the budget split evenly


def parse_strategy(strategy: Strategy | str) -> Strategy:
    """`strategy` by name ("gradient", "round-robin"), or InputError naming the known ones."""
    try:
        return Strategy(strategy)
    except ValueError:
        known = ", ".join(s.value for s in Strategy)
        raise InputError(f"unknown strategy '{strategy}' (known: {known})") from None


@dataclass(frozen=True, kw_only=True)
class SchedulerOptions:
    """How batches are allocated; the gradient constants are Ansor's defaults (§6.2, and TVM's
    auto_scheduler.TaskScheduler)."""

    strategy: Strategy = Strategy.GRADIENT
    alpha: float = 0.2  # weight of the backward (observed) term against the forward guess
    beta: float = 2.0  # slack on the throughput of similar tasks
    window: int = 3  # batches the backward term looks back over
    epsilon: float = 0.05  # chance that a batch goes to a running task drawn at random (ε-greedy)


class TaskState(Protocol):
    """What the policy reads of one task's progress (the scheduler's _Task, or a replayed task)."""

    @property
    def task(self) -> TaskLike: ...
    @property
    def history(self) -> Sequence[float]: ...  # best latency after each of its batches, first round first
    @property
    def batches(self) -> int: ...  # given to it in this run
    @property
    def grouped(self) -> bool: ...  # still in its similarity group (leaves_group)
    @property
    def running(self) -> bool: ...  # not stopped: it may be given a batch
    @property
    def latency(self) -> float: ...  # its best latency now, +inf while it has none


def expected_gain(
    *, count: int, history: Sequence[float], flops: float, peer_throughput: float, options: SchedulerOptions
) -> float:
    """The end-to-end latency a task's next batch is expected to save: count × expected drop of its best
    latency (Ansor §6.2, the negated gradient ∂f/∂t_i). `history` is its best latency after each of its
    batches so far (at least one, finite); `peer_throughput` the best flops per second among its similar
    tasks, itself included."""
    rounds, latency = len(history), history[-1]
    backward = 0.0
    if rounds > options.window:
        backward = (history[-1 - options.window] - latency) / options.window
    forward = latency / rounds  # g(t) ~ 1/t: the next batch would take g down to g (1 - 1/t)
    if peer_throughput > 0:
        forward = max(forward, latency - options.beta * flops / peer_throughput)
    return count * (options.alpha * backward + (1 - options.alpha) * forward)


def similarity_key(task: TaskLike) -> tuple[str, int]:
    """Tasks of one operator whose flops are within one step of a 1.618-base log scale are similar: one
    can expect to run about as fast per flop as another (Ansor's similarity tag)."""
    return task.workload.op, int(math.log(task.flops + 1, 1.618))


def end_to_end(counts: Sequence[int], latencies: Sequence[float]) -> float:
    """The model's estimated end-to-end latency: Σ node count × best latency (+inf while a task has none)."""
    return sum(c * g for c, g in zip(counts, latencies, strict=True))


def gains(states: Sequence[TaskState], options: SchedulerOptions) -> list[float]:
    """Every task's expected gain (0 for a stopped one), its similarity group's throughput counted."""
    peers: dict[tuple[str, int], float] = {}  # a similarity group's best throughput
    for s in states:
        if s.grouped and math.isfinite(s.latency):
            key = similarity_key(s.task)
            peers[key] = max(peers.get(key, 0.0), s.task.flops / s.latency)
    return [
        expected_gain(
            count=s.task.count,
            history=s.history,
            flops=s.task.flops,
            peer_throughput=peers.get(similarity_key(s.task), 0.0) if s.grouped else 0.0,
            options=options,
        )
        if s.running
        else 0.0
        for s in states
    ]


def choose_gradient(states: Sequence[TaskState], options: SchedulerOptions, rng: random.Random) -> int | None:
    """The index of the task the next batch goes to (None when every task has stopped): the largest
    expected gain, or with probability `options.epsilon` a running task drawn at random."""
    alive = [i for i, s in enumerate(states) if s.running]
    if not alive:
        return None
    # One draw per decision whatever epsilon is, so that a run stays a function of its seed.
    if rng.random() < options.epsilon:
        return rng.choice(alive)
    expected = gains(states, options)
    # Ties (e.g. every gain 0) go to the task with the fewest batches, then the first: Ansor draws one
    # at random, which spreads batches evenly too.
    return max(alive, key=lambda i: (expected[i], -states[i].batches, -i))


def batch_size(limit: int, budget: int, tasks: int) -> int:
    """The one size of every batch after the first round, as Ansor's rounds have one (TVM: min(64, trials
    // tasks)): at most `limit`, and small enough that a small budget still leaves batches to allocate."""
    return max(1, min(limit, budget // tasks))


def choose_round_robin(states: Sequence[TaskState], turn: int) -> int | None:
    """The first running task from index `turn` on, wrapping around (None when every task has stopped)."""
    n = len(states)
    return next(((turn + k) % n for k in range(n) if states[(turn + k) % n].running), None)


@dataclass
class RoundRobin:
    """Round-robin's turn across a run: each batch to the next running task after the last one chosen."""

    turn: int = 0

    def choose(self, states: Sequence[TaskState]) -> int | None:
        chosen = choose_round_robin(states, self.turn)
        self.turn = 0 if chosen is None else (chosen + 1) % len(states)
        return chosen


def leaves_group(state: TaskState, states: Sequence[TaskState], beta: float) -> bool:
    """Ansor's check after each batch: a task given more than 5 batches beyond every other task of its
    similarity group that still runs at less than 1/beta of the group's best throughput is not like
    them after all; it leaves the group, whose throughput no longer raises its forward guess (else that
    guess would claim batch after batch for it)."""
    if not state.grouped or not math.isfinite(state.latency):
        return False
    key = similarity_key(state.task)
    group = [s for s in states if s.grouped and similarity_key(s.task) == key]
    others = [s for s in group if s is not state]
    if not others:
        return False
    best = max(s.task.flops / s.latency for s in group)
    mine = state.task.flops / state.latency
    return mine < best / beta and state.batches > 5 + max(s.batches for s in others)
