"""Replay the task scheduler's policy on recorded tuning curves: gradient against round-robin in seconds.

Usage: python benchmarks/sim_scheduler.py record --seed S [--batches 8] --log rr_S.jsonl
       python benchmarks/sim_scheduler.py replay rr_0.jsonl [rr_1.jsonl ...] [--runs 200] [--trials 1500]

`record` tunes every task of the model round-robin, `--batches` batches of 16 each after the first round
(the seed configs), and keeps the log: each task's best latency after k of its trials, for every k up to
that. A task's search depends on its own measurements alone (one tuner per task), so how many trials a
task is given decides where it is on its recorded curve, whatever the other tasks did: `replay` runs the
policy of xtune/tuning/allocation.py (the very function the scheduler calls) on those curves with no
measuring at all. Each replayed run draws, per task, one of the recorded logs' curves (so give it logs
recorded under the same conditions: a loaded host inflates a whole log's timings) and times every
config again with a few percent of noise (`--noise`), and draws its ε-greedy picks from its own seed;
it reports, over `--runs` runs, the trials the gradient needed to reach round-robin's final estimate.
Past the end of its recorded curve a task's latency stays flat (a task given more trials than recorded
is counted, and reported). `--oracle` adds the greedy allocation that knows every curve in advance (each
batch to the largest actual drop of the next batch), and the fewest trials in which any allocation of
whole batches knowing every curve could reach round-robin's final: the bound on what any policy can do
on these curves.
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

# tests/networks.py builds the test networks; the repository root holds the `tests` package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests import networks
from xtune.tuning.allocation import (
    RoundRobin,
    SchedulerOptions,
    Strategy,
    TaskLike,
    batch_size,
    choose_gradient,
    end_to_end,
    leaves_group,
)
from xtune.tuning.database import read_logs

# Trials per batch after the first round, recorded and replayed: `xtune tune`'s (TuneOptions.batch_size).
BATCH = 16


@dataclass(frozen=True, kw_only=True)
class Curve:
    """One task's recorded search: the cost of each config in the order measured (+inf: not correct)."""

    seeds: int  # the first round's trials: the task's seed configs
    costs: tuple[float, ...]
    exhausted: bool  # the search ended before the recording did (its space ran out)

    def best(self, k: int) -> float:
        return min(self.costs[:k], default=math.inf)


def curves_of(log: Path, keys: Sequence[str]) -> list[Curve]:
    """Each task's curve in a `record` log (round-robin: the first round's seeds task by task, then
    batches in turn; the log may be cut short). The first round ends at the first record of a task seen
    before that is not of the task before it."""
    records = read_logs([log])
    costs: dict[str, list[float]] = {k: [] for k in keys}
    seeds: dict[str, int] = {}
    previous = ""
    for r in records:
        if not seeds and r.workload in costs and costs[r.workload] and r.workload != previous:
            seeds = {k: len(v) for k, v in costs.items()}
        costs.setdefault(r.workload, []).append(r.cost)
        previous = r.workload
    # Round-robin gives batches in task order: a task with fewer trials than one after it ran out of
    # configs (a log cut short leaves the later tasks one batch behind, not the earlier ones).
    lengths = [len(costs[k]) - seeds[k] for k in keys]
    return [
        Curve(seeds=seeds[k], costs=tuple(costs[k]), exhausted=lengths[i] < max(lengths[i:]))
        for i, k in enumerate(keys)
    ]


@dataclass(eq=False)
class Replayed:
    """A task's state in a replay (allocation.TaskState)."""

    task: TaskLike
    curve: Curve
    trials: int = 0
    history: list[float] = field(default_factory=list)
    batches: int = 0
    grouped: bool = True
    running: bool = True

    @property
    def latency(self) -> float:
        return self.curve.best(self.trials)

    def step(self, n: int) -> None:
        self.trials += n
        self.batches += 1
        self.history.append(self.latency)
        if self.curve.exhausted and self.trials >= len(self.curve.costs):
            self.running = False


Chooser = Callable[[list[Replayed], int], int | None]


def replay(
    tasks: Sequence[TaskLike], curves: Sequence[Curve], budget: int, choose: Chooser, regroup: float | None
) -> tuple[list[tuple[int, float]], list[int]]:
    """One run: the first round (every task's seeds), then batches of min(16, budget // tasks) to the
    task `choose` names, `regroup` the beta of Ansor's group check (None: none). Returns the curve
    (trials spent, estimate) and every task's trials."""
    states = [Replayed(task=t, curve=c) for t, c in zip(tasks, curves, strict=True)]
    for s in states:
        s.trials = s.curve.seeds
        s.history.append(s.latency)
    spent, size = sum(s.trials for s in states), batch_size(BATCH, budget, len(states))
    counts = [t.count for t in tasks]
    curve = [(spent, end_to_end(counts, [s.latency for s in states]))]
    while spent < budget:
        i = choose(states, spent)
        if i is None:
            break
        n = min(size, budget - spent)
        states[i].step(n)
        spent += n
        if regroup is not None and leaves_group(states[i], states, regroup):
            states[i].grouped = False
        curve.append((spent, end_to_end(counts, [s.latency for s in states])))
    return curve, [s.trials for s in states]


def gradient(options: SchedulerOptions, seed: int) -> Chooser:
    rng = random.Random(seed)
    return lambda states, _spent: choose_gradient(states, options, rng)


def round_robin() -> Chooser:
    turn = RoundRobin()
    return lambda states, _spent: turn.choose(states)


def oracle(states: list[Replayed], _spent: int) -> int | None:
    """The batch to the task whose next 16 trials lower the estimate the most (known curves)."""
    drops = [
        s.task.count * (s.latency - s.curve.best(s.trials + BATCH)) if s.running else -1.0 for s in states
    ]
    best = max(range(len(states)), key=lambda i: (drops[i], -states[i].batches))
    return best if drops[best] >= 0 else None


def fewest_trials(tasks: Sequence[TaskLike], curves: Sequence[Curve], budget: int, goal: float) -> int | None:
    """The fewest trials in which any allocation of whole batches (knowing every curve in advance)
    brings the estimate to `goal`: a dynamic programme over tasks and batches, the first round included."""
    first, size = sum(c.seeds for c in curves), batch_size(BATCH, budget, len(tasks))
    batches = (budget - first) // size
    best = [0.0] + [math.inf] * batches  # the lowest estimate of the tasks so far, for b batches among them
    for task, curve in zip(tasks, curves, strict=True):
        costs = [task.count * curve.best(curve.seeds + size * k) for k in range(batches + 1)]
        best = [min(best[b - k] + costs[k] for k in range(b + 1)) for b in range(batches + 1)]
    return next((first + size * b for b in range(batches + 1) if best[b] <= goal), None)


def noisy(curve: Curve, rng: random.Random, sigma: float) -> Curve:
    return replace(curve, costs=tuple(c * math.exp(rng.gauss(0, sigma)) for c in curve.costs))


def reached(curve: list[tuple[int, float]], goal: float) -> int | None:
    return next((n for n, e in curve if e <= goal), None)


def quartiles(xs: Sequence[float]) -> tuple[float, float, float]:
    s = sorted(xs)
    q1, med, q3 = (s[int(p * (len(s) - 1))] for p in (0.25, 0.5, 0.75))
    return q1, med, q3


def main_replay(args: argparse.Namespace) -> None:
    from xtune.boards.board import get_board
    from xtune.frontend.tasks import extract_tasks

    tasks = extract_tasks(networks.NETWORKS[args.model](), get_board("local").target).tasks
    keys = [t.workload.key for t in tasks]
    recorded = [curves_of(p, keys) for p in args.logs]
    policies: dict[str, Callable[[int], Chooser]] = {
        "gradient (ε = 0)": lambda seed: gradient(SchedulerOptions(epsilon=0.0), seed),
        f"gradient (ε = {SchedulerOptions().epsilon})": lambda seed: gradient(SchedulerOptions(), seed),
    }
    if args.oracle:
        policies["greedy oracle"] = lambda _seed: oracle
    shares: dict[str, list[float]] = {name: [] for name in policies}
    finals: dict[str, list[float]] = {name: [] for name in policies}
    beyond: dict[str, int] = {name: 0 for name in policies}
    bound: list[float] = []
    for run in range(args.runs):
        rng = random.Random(run)
        curves = [noisy(rng.choice(per_task), rng, args.noise) for per_task in zip(*recorded, strict=True)]
        even, _ = replay(tasks, curves, args.trials, round_robin(), None)
        goal = even[-1][1]
        if args.oracle:
            fewest = fewest_trials(tasks, curves, args.trials, goal)
            bound.append(100 * fewest / args.trials if fewest is not None else math.inf)
        for name, make in policies.items():
            curve, trials = replay(tasks, curves, args.trials, make(run), SchedulerOptions().beta)
            n = reached(curve, goal)
            shares[name].append(100 * n / args.trials if n is not None else math.inf)
            finals[name].append(curve[-1][1] / goal)
            beyond[name] += sum(t > len(c.costs) for t, c in zip(trials, curves, strict=True))
    print(
        f"{args.model}: {len(tasks)} tasks, {args.trials} trials, {args.runs} replayed runs on "
        f"{len(args.logs)} recorded log(s), noise {args.noise:.0%}\n"
    )
    print(
        "| policy | trials to round-robin's final: median | quartiles | runs ≤ 50 % | never | final / "
        "round-robin's final (median) | tasks past their recording |\n|---|---|---|---|---|---|---|"
    )
    for name in policies:
        s = shares[name]
        q1, med, q3 = quartiles(s)
        ok = sum(x <= 50 for x in s) / len(s)
        never = sum(math.isinf(x) for x in s)
        print(
            f"| {name} | {med:.0f} % | {q1:.0f}–{q3:.0f} % | {ok:.0%} | {never} | "
            f"{statistics.median(finals[name]):.3f} | {beyond[name] / args.runs:.1f} |"
        )
    if bound:
        q1, med, q3 = quartiles(bound)
        print(
            f"\nthe best allocation knowing every curve (whole batches) needs {med:.0f} % of the budget "
            f"(median; quartiles {q1:.0f}–{q3:.0f} %)"
        )


def main_record(args: argparse.Namespace) -> None:
    from xtune.boards.board import get_board
    from xtune.frontend.tasks import extract_tasks
    from xtune.tuning.database import TuningLog
    from xtune.tuning.options import TuneOptions
    from xtune.tuning.task_scheduler import TaskScheduler, tune_tasks

    board = get_board("local")
    tasks = extract_tasks(networks.NETWORKS[args.model](), board.target).tasks
    options = TuneOptions(trials=1, batch_size=BATCH, confirm=0, seed=args.seed)
    probe = TaskScheduler(tasks, [board], options)
    try:
        first = probe.first_round_trials()
    finally:
        probe.close()
    budget = first + len(tasks) * args.batches * BATCH
    even = SchedulerOptions(strategy=Strategy.ROUND_ROBIN)
    result = tune_tasks(
        tasks, [board], replace(options, trials=budget), TuningLog(args.log), model=args.model, scheduler=even
    )
    print(f"{result.trials} trials in {result.seconds:.0f} s; per task {[t.trials for t in result.tasks]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="tune every task round-robin and keep the log")
    rec.add_argument("--model", default="mobilenet_v2", choices=sorted(networks.NETWORKS))
    rec.add_argument("--seed", type=int, default=0)
    rec.add_argument("--batches", type=int, default=8, help="batches of 16 per task after the first round")
    rec.add_argument("--log", type=Path, required=True)
    rep = sub.add_parser("replay", help="replay the policies on recorded logs")
    rep.add_argument("logs", type=Path, nargs="+")
    rep.add_argument("--model", default="mobilenet_v2", choices=sorted(networks.NETWORKS))
    rep.add_argument("--trials", type=int, default=1500)
    rep.add_argument("--runs", type=int, default=200)
    rep.add_argument("--noise", type=float, default=0.03, help="sigma of the log-normal timing noise")
    rep.add_argument("--oracle", action="store_true")
    args = parser.parse_args()
    (main_record if args.command == "record" else main_replay)(args)


if __name__ == "__main__":
    main()
