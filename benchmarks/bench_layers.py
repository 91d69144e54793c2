"""Convolution layers against ONNX Runtime and numpy: each layer tuned with 64 (and optionally
more) xgb trials on the local board, and numpy's im2col + GEMM and ONNX Runtime (one thread each) timed
in the same run; GFLOP/s, ratios, share of the measured FMA peak (benchmarks/fma_peak.py), the gap between
the 64-trial best and the longer run's, and the flops-weighted totals.

Usage: python benchmarks/bench_layers.py [--layers issue|resnet18|mobilenetv2|all] [--trials 64]
       [--long 512] [--rounds 5] [--seed 1] [--only SUBSTRING ...] [--insn-trials 32] [--plain]
Each layer is tuned as the network runs it: the task `xtune tasks` extracts from the layer as a one-node
ONNX model (so one home, the conv2d family's `task_key`, decides it): NHWC, conv2d weights prepacked once
at build time (as ONNX Runtime prepacks a Conv's constant weights), 3x3 stride-1 conv2d as Winograd
F(2x2, 3x3). --plain tunes the layer as written (NCHW, direct, weights packed at every call). The peers
run the layer as written, NCHW: ONNX Runtime's own layout (it converts to its blocked NCHWc inside),
never behind Transposes.
--long N: what the 64-trial run ships (its leaders confirmed, as `xtune tune` ends), what the same run
continued to N trials ships, and the 64 trials' fastest single timing (unconfirmed: the figure a
timing's luck can inflate) are timed again in `--rounds` interleaved rounds (bench.retime_gflops), so the gap
is not one lucky timing; their config indices follow the table. --insn-trials N: also tune
each layer N trials on qemu-aarch64 by instruction count and print the best count against the FMA lower
bound (flops / 2 / lanes: one vector FMA per `lanes` multiply-adds, nothing else).
ORT needs the `bench` extra. The machine should be otherwise idle: every figure is a timing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path

from fma_peak import measured_peak_gflops  # benchmarks/ is the script's directory, first on sys.path

from xtune.boards.board import Board, get_board
from xtune.frontend.tasks import extract_tasks
from xtune.ops.registry import parse_workload
from xtune.ops.workload import Workload
from xtune.target import Target
from xtune.tuning.database import TuningLog
from xtune.tuning.kernel_bench import retime_gflops
from xtune.tuning.options import TuneOptions
from xtune.tuning.peers import onnx_model, ort_gflops
from xtune.tuning.run import local_numpy_gflops, run_tuning


@dataclass(frozen=True, kw_only=True)
class Layer:
    name: str
    workload: str
    count: int = 1  # how many times the network runs this layer (weights the totals)


def conv(c: int, hw: int, k: int, r: int, stride: int, pad: int) -> str:
    return f"conv2d:n=1,c={c},h={hw},w={hw},k={k},r={r},s={r},stride={stride},pad={pad}"


def as_run(workload: str, target: Target, plain: bool) -> Workload:
    """The layer's workload as a network runs it on `target` (its task when the layer is a one-node model),
    or as written with `plain`."""
    written = parse_workload(workload)
    if plain:
        return written
    (task,) = extract_tasks(onnx_model(written), target).tasks
    return task.workload


def dw(c: int, hw: int, stride: int) -> str:
    return f"depthwise:n=1,c={c},h={hw},w={hw},r=3,s=3,stride={stride},pad=1"


# The default table (`--layers issue`): the layers the project's speed goal names (docs/benchmarks.md).
ISSUE = (
    Layer(name="3x3 64->64 56 s1", workload=conv(64, 56, 64, 3, 1, 1)),
    Layer(name="7x7 3->64 224 s2", workload=conv(3, 224, 64, 7, 2, 3)),
    Layer(name="1x1 128->128 56", workload=conv(128, 56, 128, 1, 1, 0)),
    Layer(name="3x3 128->128 28 s1", workload=conv(128, 28, 128, 3, 1, 1)),
    Layer(name="3x3 64->128 56 s2", workload=conv(64, 56, 128, 3, 2, 1)),
    Layer(name="dw 144 56 s1", workload=dw(144, 56, 1)),
    Layer(name="dw 96 112 s2", workload=dw(96, 112, 2)),
)

# torchvision's resnet18 (224x224): conv1, then per stage (BasicBlock x 2) its 3x3 convs and, from stage 2
# on, the first block's stride-2 3x3 and its 1x1 stride-2 downsample. No bias (BatchNorm follows).
RESNET18 = (
    Layer(name="r18 conv1", workload=conv(3, 224, 64, 7, 2, 3)),
    Layer(name="r18 layer1 3x3", workload=conv(64, 56, 64, 3, 1, 1), count=4),
    Layer(name="r18 layer2.0 3x3 s2", workload=conv(64, 56, 128, 3, 2, 1)),
    Layer(name="r18 layer2 3x3", workload=conv(128, 28, 128, 3, 1, 1), count=3),
    Layer(name="r18 layer2.0 down", workload=conv(64, 56, 128, 1, 2, 0)),
    Layer(name="r18 layer3.0 3x3 s2", workload=conv(128, 28, 256, 3, 2, 1)),
    Layer(name="r18 layer3 3x3", workload=conv(256, 14, 256, 3, 1, 1), count=3),
    Layer(name="r18 layer3.0 down", workload=conv(128, 28, 256, 1, 2, 0)),
    Layer(name="r18 layer4.0 3x3 s2", workload=conv(256, 14, 512, 3, 2, 1)),
    Layer(name="r18 layer4 3x3", workload=conv(512, 7, 512, 3, 1, 1), count=3),
    Layer(name="r18 layer4.0 down", workload=conv(256, 14, 512, 1, 2, 0)),
)

# torchvision's mobilenet_v2 (224x224, width 1.0): features[0] 3x3/2 32 channels; InvertedResidual blocks
# (t, c, n, s) = (1,16,1,1) (6,24,2,2) (6,32,3,2) (6,64,4,2) (6,96,3,1) (6,160,3,2) (6,320,1,1), each a 1x1
# expand (t > 1), a 3x3 depthwise (stride s in a stage's first block) and a 1x1 project; then 1x1 320->1280.
MOBILENETV2 = (
    Layer(name="mv2 conv0", workload=conv(3, 224, 32, 3, 2, 1)),
    Layer(name="mv2 b0 dw 32", workload=dw(32, 112, 1)),
    Layer(name="mv2 b0 pw 32->16", workload=conv(32, 112, 16, 1, 1, 0)),
    Layer(name="mv2 b1 pw 16->96", workload=conv(16, 112, 96, 1, 1, 0)),
    Layer(name="mv2 b1 dw 96 s2", workload=dw(96, 112, 2)),
    Layer(name="mv2 b1 pw 96->24", workload=conv(96, 56, 24, 1, 1, 0)),
    Layer(name="mv2 b2,3 pw 24->144", workload=conv(24, 56, 144, 1, 1, 0), count=2),
    Layer(name="mv2 b2 dw 144", workload=dw(144, 56, 1)),
    Layer(name="mv2 b2 pw 144->24", workload=conv(144, 56, 24, 1, 1, 0)),
    Layer(name="mv2 b3 dw 144 s2", workload=dw(144, 56, 2)),
    Layer(name="mv2 b3 pw 144->32", workload=conv(144, 28, 32, 1, 1, 0)),
    Layer(name="mv2 b4-6 pw 32->192", workload=conv(32, 28, 192, 1, 1, 0), count=3),
    Layer(name="mv2 b4,5 dw 192", workload=dw(192, 28, 1), count=2),
    Layer(name="mv2 b4,5 pw 192->32", workload=conv(192, 28, 32, 1, 1, 0), count=2),
    Layer(name="mv2 b6 dw 192 s2", workload=dw(192, 28, 2)),
    Layer(name="mv2 b6 pw 192->64", workload=conv(192, 14, 64, 1, 1, 0)),
    Layer(name="mv2 b7-10 pw 64->384", workload=conv(64, 14, 384, 1, 1, 0), count=4),
    Layer(name="mv2 b7-10 dw 384", workload=dw(384, 14, 1), count=4),
    Layer(name="mv2 b7-9 pw 384->64", workload=conv(384, 14, 64, 1, 1, 0), count=3),
    Layer(name="mv2 b10 pw 384->96", workload=conv(384, 14, 96, 1, 1, 0)),
    Layer(name="mv2 b11,12 pw 96->576", workload=conv(96, 14, 576, 1, 1, 0), count=3),
    Layer(name="mv2 b11,12 dw 576", workload=dw(576, 14, 1), count=2),
    Layer(name="mv2 b11,12 pw 576->96", workload=conv(576, 14, 96, 1, 1, 0), count=2),
    Layer(name="mv2 b13 dw 576 s2", workload=dw(576, 14, 2)),
    Layer(name="mv2 b13 pw 576->160", workload=conv(576, 7, 160, 1, 1, 0)),
    Layer(name="mv2 b14-16 pw 160->960", workload=conv(160, 7, 960, 1, 1, 0), count=3),
    Layer(name="mv2 b14-16 dw 960", workload=dw(960, 7, 1), count=3),
    Layer(name="mv2 b14,15 pw 960->160", workload=conv(960, 7, 160, 1, 1, 0), count=2),
    Layer(name="mv2 b16 pw 960->320", workload=conv(960, 7, 320, 1, 1, 0)),
    Layer(name="mv2 conv last 320->1280", workload=conv(320, 7, 1280, 1, 1, 0)),
)

TABLES = {"issue": ISSUE, "resnet18": RESNET18, "mobilenetv2": MOBILENETV2}


@dataclass(frozen=True, kw_only=True)
class Row:
    layer: Layer
    numpy: float
    ort: float
    at64: float  # GFLOP/s of what the 64-trial run ships (its leaders confirmed), timed again
    long: float  # of what the same run continued to --long trials ships (= at64 without --long)
    picks: str  # the three configs' indices


def tune_layer(
    wl: Workload, board: Board, trials: int, long: int, seed: int, numpy: float, rounds: int
) -> dict[str, tuple[int, float]]:
    """The config index and GFLOP/s of what a `trials`-trial run ships ("short"), of what the same run
    continued to `long` trials ships ("long"), and of the first `trials` trials' fastest single timing
    ("single"), re-timed together in `rounds` interleaved rounds. Empty if a run found nothing.

    Both runs end as `xtune tune` does: their leaders timed again (TuneOptions.confirm), the best the
    lowest median (ranking.best). The long run resumes the short run's log, as a user tuning further
    would: its first `trials` trials are the short run's. The unconfirmed pick is the best of the
    short run's single timings, shown beside the confirmed ones to measure what confirming takes away."""
    with tempfile.TemporaryDirectory() as tmp:
        log = TuningLog(Path(tmp) / "log.jsonl")
        options = TuneOptions(tuner="xgb", trials=trials, batch_size=16, seed=seed)
        short = run_tuning(wl, [board], options, log, None, numpy).best_index
        first = [r for r in log.read()[:trials] if r.result.ok]
        more = replace(options, trials=long - trials)
        best = run_tuning(wl, [board], more, log, None, numpy).best_index if long > trials else short
    if short is None or best is None or not first:
        return {}
    picks = {"short": short, "long": best, "single": min(first, key=lambda r: r.cost).index}
    distinct = list(dict.fromkeys(picks.values()))
    timings = retime_gflops(wl, board, distinct, rounds=rounds)
    medians = {i: statistics.median(t) for i, t in zip(distinct, timings, strict=True)}
    return {name: (i, medians[i]) for name, i in picks.items()}


def insn_row(wl: Workload, trials: int, seed: int) -> tuple[float, float]:
    """Best instruction count per call on qemu-aarch64 after `trials`, and the FMA lower bound."""
    board = get_board("qemu-aarch64")
    report = run_tuning(
        wl, [board], TuneOptions(tuner="xgb", trials=trials, batch_size=16, seed=seed), None, None, None
    )
    return report.best_cost, wl.flops() / 2 / board.target.fp32_lanes


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", choices=[*TABLES, "all"], default="issue")
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--long", type=int, default=0, help="also a run of this many trials (e.g. 512)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", action="append", help="layers whose name contains this")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the re-timing")
    parser.add_argument("--insn-trials", type=int, default=0)
    parser.add_argument("--plain", action="store_true", help="conv2d layers pack their weights per call")
    args = parser.parse_args()
    layers = [la for t in (TABLES if args.layers == "all" else [args.layers]) for la in TABLES[t]]
    layers = [la for la in layers if not args.only or any(s in la.name for s in args.only)]
    board = get_board("local")
    peak = measured_peak_gflops()
    print(
        f"local {board.target.name}; measured FMA peak {peak:.1f} GFLOP/s (one core); xgb seed {args.seed}; "
        f"layers {'as written (--plain)' if args.plain else 'as the network runs them'}\n"
    )
    heading = args.long or "-"
    print(
        f"| layer | count | numpy | ORT | xtune {args.trials} | × ORT | × numpy | % peak | "
        f"{heading} trials | {args.trials}/{heading} | unconfirmed/{heading} |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for layer in layers:
        written, wl = parse_workload(layer.workload), as_run(layer.workload, board.target, args.plain)
        numpy = local_numpy_gflops(written, [board]) or math.nan
        ort = ort_gflops(written) or math.nan
        tuned = tune_layer(wl, board, args.trials, args.long, args.seed, numpy, args.rounds)
        (_, at64), (_, long), (_, single) = (tuned.get(k, (0, 0.0)) for k in ("short", "long", "single"))
        picks = ", ".join(f"{k} #{i}" for k, (i, _) in tuned.items())
        # The peers again right after xtune's re-timing, and their better figure: on a shared host a
        # quiet spell during the tuning run must not flatter xtune's ratios.
        numpy = max(numpy, local_numpy_gflops(written, [board]) or math.nan)
        ort = max(ort, ort_gflops(written) or math.nan)
        peak = max(peak, measured_peak_gflops())  # the best probe so far: a peak is an undisturbed figure
        rows.append(Row(layer=layer, numpy=numpy, ort=ort, at64=at64, long=long, picks=picks))
        gap, single_gap = (f"{x / long:.3f}" if args.long and long else "-" for x in (at64, single))
        long_text = f"{long:.1f}" if args.long else "-"
        print(
            f"| {layer.name} | {layer.count} | {numpy:.1f} | {ort:.1f} | {at64:.1f} | {at64 / ort:.2f} "
            f"| {at64 / numpy:.2f} | {100 * at64 / peak:.0f}% | {long_text} | {gap} | {single_gap} |",
            flush=True,
        )
    print(f"\nmeasured FMA peak, the best of every layer's probe: {peak:.1f} GFLOP/s\n")
    for row in rows:  # what was tuned (the peers ran the layer as written) and the configs picked
        print(f"{row.layer.name}: {as_run(row.layer.workload, board.target, args.plain).key} ({row.picks})")
    print()
    for table in TABLES:
        chosen = [r for r in rows if r.layer in TABLES[table] and r.at64 > 0]
        if not chosen:
            continue
        # Flops-weighted: total time of the network's layers at each one's speed.
        flops = [parse_workload(r.layer.workload).flops() * r.layer.count for r in chosen]  # either form
        total = sum(flops)
        seconds = {
            name: sum(f / getattr(r, name) for f, r in zip(flops, chosen, strict=True))
            for name in ("numpy", "ort", "at64")
        }
        xt = seconds["at64"]
        print(
            f"{table}: flops-weighted xtune/ORT {seconds['ort'] / xt:.2f}, xtune/numpy "
            f"{seconds['numpy'] / xt:.2f}; xtune {total / xt:.1f} GFLOP/s"
        )
    if args.insn_trials:
        print(f"\nqemu-aarch64, {args.insn_trials} trials by instruction count\n")
        print("| layer | instructions | FMA lower bound | ratio |")
        print("|---|---|---|---|")
        for layer in layers:
            wl = as_run(layer.workload, get_board("qemu-aarch64").target, args.plain)
            insns, bound = insn_row(wl, args.insn_trials, args.seed)
            print(f"| {layer.name} | {insns:.4g} | {bound:.4g} | {insns / bound:.2f} |", flush=True)


if __name__ == "__main__":
    main()
