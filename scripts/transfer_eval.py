"""How many trials transfer learning saves (issue 7), measured on this machine's local board.

Usage: python scripts/transfer_eval.py [--seeds 3] [--cap 128] [--long 384] [--plot docs/transfer_eval.png]
       python scripts/transfer_eval.py --leave-one-out [--seeds 2] [--cap 32]

Held-out workloads are matmul shapes that are not in the corpus (scripts/make_transfer_corpus.py). For
each one on x86-avx2:
  1. a long cold xgb run (`--long` trials) gives the best-known GFLOP/s;
  2. for each seed, four runs of `--cap` trials, none seeded with the template's default config:
     blind  xgb with no prior knowledge at all: a random first batch, then its own model (AutoTVM's cold
            start; TuneOptions(analytic_prior=False));
     cold   xgb as `xtune tune` runs it without transfer: its first batch is ranked by the analytic cycle
            estimate of features.py, which stays on as the fading base of the local model;
     shapes xgb warm-started from a model trained on this machine's x86-avx2 logs in the corpus (other
            shapes, same target);
     sse42  xgb warm-started from a model trained on this machine's x86-sse42 logs only (other hardware:
            128-bit vectors, no FMA) -- the new board has no log of its own at all; as `xtune tune` does
            for a model that saw no logs of the tuned target, its first batch alternates its picks with
            the analytic estimate's, and afterwards the local model's base is whichever of the two
            picked the fastest config;
     both models are boosted from the analytic estimate (TrainOptions.on_estimate), as `xtune model train`
     trains them;
  3. each run's count is the trials it took to reach 90% of the best-known GFLOP/s.
The table gives the count per seed and the median; the last rows give the median over held-out shapes
and the warm/cold ratios the issue asks for (<= 1/4 across shapes, <= 1/2 across hardware), against
both cold starts. All runs measure for real; nothing is cached between them.

`--leave-one-out` runs the cold, shapes and sse42 modes on each corpus shape in turn instead, with models
trained on the other corpus shapes and the corpus's best of the shape as the best-known.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from xtune.board import Board, get_board
from xtune.costmodel import CostModel
from xtune.database import Record, cpu_of, read_logs
from xtune.transfer import train
from xtune.tuning import TuneOptions, run_tuning
from xtune.workload import Workload, parse_workload

ROOT = Path(__file__).resolve().parent.parent
CORPUS = ROOT / "xtune" / "data" / "corpus"
# The first four were picked by hand (sessions 3-5); the other four are the next draws of the rule that
# drew the corpus's random shapes (scripts/make_transfer_corpus.py), so that the set is not a choice.
# The medians over held-out shapes are the figures; with four shapes one lucky shape moved them.
HELD_OUT = ((384, 384, 384), (128, 1024, 256), (640, 160, 320), (96, 768, 192),
            (320, 1024, 768), (768, 64, 640), (384, 256, 160), (1024, 256, 1024))
TARGET = "x86-avx2"
MODES = ("blind", "cold", "shapes", "sse42")


def trials_to(curve: tuple[float, ...], goal: float) -> int | None:
    return next((i + 1 for i, g in enumerate(curve) if g >= goal), None)


def held_out_keys() -> set[str]:
    return {parse_workload("matmul:m={},n={},k={}".format(*shape)).key for shape in HELD_OUT}


def corpus_records(target: str, cpu: str) -> list[Record]:
    """The corpus records this machine (`cpu`) measured of `target`."""
    records = [r for r in read_logs([CORPUS / f"{target}.jsonl.gz"]) if cpu_of(r) == cpu]
    if not records:
        sys.exit(f"the corpus has no {target} records of this machine ({cpu}): run "
                 "scripts/make_transfer_corpus.py first")  # fmt: skip
    return records


def pretrained_models(cpu: str) -> dict[str, CostModel | None]:
    """The warm runs' models, trained on the corpus records this machine (`cpu`) measured."""

    def trained_on(target: str) -> CostModel:
        records = corpus_records(target, cpu)
        leaked = held_out_keys() & {r.workload for r in records}
        if leaked:
            sys.exit(f"held-out shapes are in the {target} corpus: {', '.join(sorted(leaked))}")
        return train(records).cost_model("matmul")

    return {"blind": None, "cold": None, "shapes": trained_on(TARGET), "sse42": trained_on("x86-sse42")}


def run(workload: Workload, board: Board, mode: str, model: CostModel | None, seed: int,
        cap: int) -> tuple[float, ...]:
    """One run of `mode` (see the module docstring): its best-so-far GFLOP/s after each trial."""
    options = TuneOptions("xgb", cap, 16, None, seed, start_from_default=False,
                          analytic_prior=mode != "blind")
    # As `xtune tune` runs a model that saw no logs of the target: hedged with the estimate.
    report = run_tuning(workload, [board], options, pretrained=model, hedge_with_estimate=mode == "sse42")
    return report.curve_gflops


def median_count(counts: list[int | None], cap: int) -> float:
    """Median with a run that never got there counted as cap + 1 (so the median is a lower bound)."""
    return statistics.median(c if c is not None else cap + 1 for c in counts)


def cell(counts: list[int | None], cap: int) -> str:
    """A table cell: the median, then the count of every seed."""
    per_seed = ", ".join(str(c) if c is not None else f">{cap}" for c in counts)
    return f"{median_count(counts, cap):g} ({per_seed})"


def evaluate(shape: tuple[int, int, int], models: dict[str, CostModel | None], seeds: int, cap: int,
             long: int) -> tuple[float, dict[str, list[int | None]], dict[str, tuple[float, ...]]]:
    workload = parse_workload("matmul:m={},n={},k={}".format(*shape))
    board = get_board("local", target=TARGET)
    long_options = TuneOptions("xgb", long, 16, None, 1000, start_from_default=False)
    reference = run_tuning(workload, [board], long_options)
    best_known = reference.best_gflops or 0.0
    counts: dict[str, list[int | None]] = {mode: [] for mode in MODES}
    first_curves: dict[str, tuple[float, ...]] = {}
    for seed in range(seeds):
        for mode in MODES:
            curve = run(workload, board, mode, models[mode], seed, cap)
            counts[mode].append(trials_to(curve, 0.9 * best_known))
            first_curves.setdefault(mode, curve)
            print(f"  {workload.key} seed {seed} {mode}: {counts[mode][-1]}", file=sys.stderr, flush=True)
    return best_known, counts, first_curves


def leave_one_out(cpu: str, seeds: int, cap: int) -> None:
    """Each corpus shape in turn is held out: the warm models are trained on the other shapes' records and
    the best-known is the corpus's own best of the shape (192 tuned configs). Short runs (`cap` trials) on
    every corpus shape: a cheaper, wider check than the held-out table, to compare training options."""
    records = {target: corpus_records(target, cpu) for target in (TARGET, "x86-sse42")}
    board = get_board("local", target=TARGET)
    modes = ("cold", "shapes", "sse42")
    print(f"\n{TARGET} on {cpu}, each corpus shape left out in turn; trials to 90% of the corpus best; "
          f"{seeds} seeds, at most {cap} trials per run\n")  # fmt: skip
    print("| left-out workload | corpus best GFLOP/s | " + " | ".join(modes) + " |\n|---|---|---|---|---|")
    medians: dict[str, list[float]] = {mode: [] for mode in modes}
    for key in sorted({r.workload for r in records[TARGET]}):
        workload = parse_workload(key)
        ok_costs = [r.cost for r in records[TARGET] if r.workload == key and r.result.ok]
        best = workload.flops() / min(ok_costs) / 1e9
        models = {"cold": None} | {
            mode: train([r for r in records[target] if r.workload != key]).cost_model("matmul")
            for mode, target in (("shapes", TARGET), ("sse42", "x86-sse42"))
        }
        cells = []
        for mode in modes:
            counts = [trials_to(run(workload, board, mode, models[mode], seed, cap), 0.9 * best)
                      for seed in range(seeds)]  # fmt: skip
            medians[mode].append(median_count(counts, cap))
            cells.append(cell(counts, cap))
        print(f"| {key} | {best:.1f} | " + " | ".join(cells) + " |", flush=True)
    print("| **median** | | " + " | ".join(f"**{statistics.median(medians[m]):g}**" for m in modes) + " |")
    print("| mean | | " + " | ".join(f"{statistics.mean(medians[m]):.1f}" for m in modes) + " |")


def plot(path: Path, curves: dict[str, tuple[float, dict[str, tuple[float, ...]]]]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(4, len(curves))
    rows = -(-len(curves) // columns)
    fig, grid = plt.subplots(rows, columns, figsize=(4 * columns, 3.2 * rows), sharey=True, squeeze=False)
    axes = grid.ravel()
    for ax, (key, (best, by_mode)) in zip(axes, curves.items(), strict=False):
        for mode, curve in by_mode.items():
            ax.plot(range(1, len(curve) + 1), [g / best for g in curve], label=mode)
        ax.axhline(0.9, color="grey", linestyle=":", linewidth=1)
        ax.set_title(key.removeprefix("matmul:"), fontsize=9)
        ax.set_xlabel("trial")
        ax.set_xscale("log")
    for ax in grid[:, 0]:
        ax.set_ylabel("best so far / best known")
    axes[0].set_ylim(0, 1.1)
    axes[len(curves) - 1].legend(loc="lower right", fontsize=8)
    for ax in axes[len(curves):]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # The issue asks for 3 seeds; sessions 4-5 ran 5 on four shapes. More held-out shapes narrow the
    # median over shapes more than more seeds per shape do, for the same time (about 40 min here).
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--cap", type=int, default=128, help="trials per cold/warm run")
    parser.add_argument("--long", type=int, default=384, help="trials of the best-known run")
    parser.add_argument("--plot", type=Path, default=None, help="PNG of seed 0's best-so-far curves")
    parser.add_argument("--leave-one-out", action="store_true",
                        help="instead: each corpus shape held out in turn (try --cap 32 --seeds 2)")
    args = parser.parse_args()
    cpu = get_board("local", target=TARGET).fingerprint()["cpu"]
    if args.leave_one_out:
        leave_one_out(cpu, args.seeds, args.cap)
        return
    models = pretrained_models(cpu)
    print(f"\n{TARGET} on {cpu}, trials to 90% of a {args.long}-trial cold run's best; {args.seeds} seeds, "
          f"at most {args.cap} trials per run ('>{args.cap}': never)\n")
    print("| held-out workload | best known GFLOP/s | cold, blind | cold, analytic prior "
          "| warm: other shapes | warm: sse42 logs |")
    print("|---|---|---|---|---|---|")
    medians: dict[str, list[float]] = {mode: [] for mode in MODES}
    curves = {}
    for shape in HELD_OUT:
        best, counts, first = evaluate(shape, models, args.seeds, args.cap, args.long)
        cells = []
        for mode in MODES:
            medians[mode].append(median_count(counts[mode], args.cap))
            cells.append(cell(counts[mode], args.cap))
        key = "matmul:m={},n={},k={}".format(*shape)
        curves[key] = (best, first)
        print(f"| {key} | {best:.1f} | " + " | ".join(cells) + " |", flush=True)
    overall = {mode: statistics.median(v) for mode, v in medians.items()}
    print("| **median over held-out** | | " + " | ".join(f"**{overall[m]:g}**" for m in MODES) + " |")
    for cold in ("blind", "cold"):
        print(f"\nwarm/{cold}: across shapes {overall['shapes'] / overall[cold]:.2f} (goal <= 0.25), "
              f"sse42 -> avx2 {overall['sse42'] / overall[cold]:.2f} (goal <= 0.5)")
    if args.plot:
        plot(args.plot, curves)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
