"""Kernels as a firmware's build script gets them, against ONNX Runtime: every conv2d and depthwise layer of
ResNet-18 and MobileNetV2 (bench_layers.py's tables), each tuned through the kernel API (`run_tuning`, what
`xtune tune --workload` runs) with --trials xgb trials on the local board, in two forms:

- nchw: the layer as written (ONNX's NCHW, OIHW weights packed by the kernel at every call);
- prepacked: the same with prepacked=1, the weights laid out once by the kernel's pack function
  (`xtune build --workload ...,prepacked=1`, docs/firmware.md) and read as they are by every call.
  Depthwise layers have no packed form (their weights are read as they are): both columns are one run.

With --winograd auto (the default), the 3x3 stride-1 layers are tuned without `algo=`: direct and
Winograd in one space, the tuner's choice (docs/design.md, Convolutions); none forces algo=direct on
them, packed (the prepacked form) or both forces algo=winograd. ONNX Runtime (one thread, every graph
optimization, its own prepacked weights) runs each layer as written in the same run, before and after
xtune's re-timing (the better figure counts). Prints each layer's GFLOP/s and ratios, then the
flops-weighted ratio per network (total time of its layers, each weighted by how often it runs).

Usage: python benchmarks/bench_kernel_api.py [--nets resnet18 mobilenetv2] [--trials 64] [--rounds 3]
       [--seed 1] [--only SUBSTRING ...] [--winograd auto|none|packed|both]
The full run tunes 74 layer forms (32 conv2d layers twice, 10 depthwise once): about 2 hours on an idle
x86 host (a form takes 1 to 2 minutes). ORT needs the `bench` extra. The machine should be otherwise
idle: every figure is a timing.
"""

from __future__ import annotations

import argparse
import math
import statistics
import tempfile
from dataclasses import dataclass
from pathlib import Path

from bench_layers import MOBILENETV2, RESNET18, Layer  # benchmarks/ is the script's directory

from xtune.boards.board import Board, get_board
from xtune.ops.conv2d import winograd_eligible
from xtune.ops.registry import parse_workload, template_for
from xtune.ops.template import SUM_TAG
from xtune.ops.workload import Workload
from xtune.tuning.database import TuningLog
from xtune.tuning.kernel_bench import retime_gflops
from xtune.tuning.options import TuneOptions
from xtune.tuning.peers import ort_gflops
from xtune.tuning.run import local_numpy_gflops, run_tuning

NETS = {"resnet18": RESNET18, "mobilenetv2": MOBILENETV2}
FORMS = ("nchw", "prepacked")


@dataclass(frozen=True, kw_only=True)
class Row:
    layer: Layer
    ort: float
    gflops: dict[str, float]  # per form: GFLOP/s of what a --trials run ships, re-timed
    keys: dict[str, str]  # per form: the workload tuned, and the config shipped


def form(layer: Layer, name: str, winograd: str) -> Workload:
    """The layer's workload as the kernel API tunes it in form `name`."""
    written = parse_workload(layer.workload)
    if written.op != "conv2d":
        return written  # depthwise: no prepacked key, no algorithm choice
    extra = ",prepacked=1" if name == "prepacked" else ""
    if winograd in (name.replace("prepacked", "packed"), "both") and winograd_eligible(written):
        extra += ",algo=winograd"
    elif winograd == "none" and winograd_eligible(written):
        extra += ",algo=direct"
    return parse_workload(layer.workload + extra)


def algorithm(wl: Workload, board: Board, index: int | None) -> str:
    """ " (algo=NAME)" of a config of a conv2d whose algorithm was the tuner's to choose, else ""."""
    if index is None:
        return ""
    algo = dict(template_for(wl, board.target).space.config(index).values).get(SUM_TAG)
    return f" ({SUM_TAG}={algo})" if algo else ""


def tuned_gflops(wl: Workload, board: Board, trials: int, seed: int, rounds: int) -> tuple[int | None, float]:
    """The config a `trials`-trial run ships (its leaders confirmed, as `xtune tune` ends) and its GFLOP/s
    re-timed in `rounds` rounds (median); (None, 0.0) if the run found no correct config."""
    with tempfile.TemporaryDirectory() as tmp:
        log = TuningLog(Path(tmp) / "log.jsonl")
        options = TuneOptions(tuner="xgb", trials=trials, batch_size=16, seed=seed)
        numpy = local_numpy_gflops(wl, [board])
        best = run_tuning(wl, [board], options, log, None, numpy).best_index
    if best is None:
        return None, 0.0
    return best, statistics.median(retime_gflops(wl, board, [best], rounds=rounds)[0])


def weighted(rows: list[Row], column: str) -> float:
    """Flops-weighted speed-up over ORT: the layers' total time at ORT's speed over it at `column`'s."""
    chosen = [r for r in rows if r.gflops.get(column, 0.0) > 0]
    flops = [parse_workload(r.layer.workload).flops() * r.layer.count for r in chosen]
    ort = sum(f / r.ort for f, r in zip(flops, chosen, strict=True))
    xt = sum(f / r.gflops[column] for f, r in zip(flops, chosen, strict=True))
    return ort / xt if xt else math.nan


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nets", nargs="+", choices=list(NETS), default=list(NETS))
    parser.add_argument("--trials", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="re-timing rounds of each shipped config")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", action="append", help="layers whose name contains this")
    parser.add_argument("--winograd", choices=("auto", "none", "packed", "both"), default="auto")
    args = parser.parse_args()
    board = get_board("local")
    print(
        f"local {board.target.name}; {args.trials} xgb trials per layer and form, seed {args.seed}; "
        f"Winograd for 3x3 stride-1 layers: {args.winograd}\n"
    )
    print("| layer | count | ORT | nchw | × ORT | prepacked | × ORT |")
    print("|---|---|---|---|---|---|---|")
    rows: dict[str, list[Row]] = {}
    for net in args.nets:
        for layer in NETS[net]:
            if args.only and not any(s in layer.name for s in args.only):
                continue
            written = parse_workload(layer.workload)
            ort = ort_gflops(written) or math.nan
            gflops: dict[str, float] = {}
            keys: dict[str, str] = {}
            for name in FORMS:
                wl = form(layer, name, args.winograd)
                done = next((f for f in FORMS if keys.get(f, "").startswith(wl.key + " ")), None)
                if done:  # depthwise: one workload for both forms
                    gflops[name], keys[name] = gflops[done], keys[done]
                    continue
                index, gflops[name] = tuned_gflops(wl, board, args.trials, args.seed, args.rounds)
                keys[name] = f"{wl.key} #{index}{algorithm(wl, board, index)}"
            ort = max(ort, ort_gflops(written) or math.nan)  # a quiet spell must not flatter xtune
            row = Row(layer=layer, ort=ort, gflops=gflops, keys=keys)
            rows.setdefault(net, []).append(row)
            nchw, packed = gflops["nchw"], gflops["prepacked"]
            figures = f"{nchw:.1f} | {nchw / ort:.2f} | {packed:.1f} | {packed / ort:.2f}"
            print(f"| {layer.name} | {layer.count} | {ort:.1f} | {figures} |", flush=True)
    print()
    for chosen in rows.values():
        for row in chosen:
            print(f"{row.layer.name}: " + "; ".join(f"{f} {row.keys[f]}" for f in FORMS))
    print()
    every = [r for chosen in rows.values() for r in chosen]
    for net, chosen in [*rows.items(), ("all", every)]:
        nchw, packed = weighted(chosen, "nchw"), weighted(chosen, "prepacked")
        print(f"{net}: flops-weighted × ORT: nchw {nchw:.2f}, prepacked {packed:.2f}")


if __name__ == "__main__":
    main()
