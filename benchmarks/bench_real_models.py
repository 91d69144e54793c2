"""Benchmark: real model graphs through xtune — per model, import + task extraction time, whole-network
build time, whether the built network matches ONNX Runtime, and xtune's latency (template defaults, or a
log's bests) against ONNX Runtime's, one thread each, in the same run; or the one-line refusal.

Usage: python benchmarks/bench_real_models.py [DIR] [--models resnet50,squeezenet] [--repeat 5]
       [--rounds 3] [--layout nhwc] [--log L.jsonl] [--random-weights] [--json OUT]
DIR holds .onnx files; the default is the light copies of the ONNX Model Zoo graphs inside the onnx
package (every weight a ConstantOfShape of 0.02: `--random-weights` gives them seeded random weights, as
tests/test_real_models.py does, so that the match with ONNX Runtime means something). The goals
(docs/benchmarks.md): import + extraction of ResNet-50 or DenseNet-121 under 3 s, a build
under 10 s, every network matching, none slower than ONNX Runtime untuned."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/exported.py: the zoo's light graphs

from tests.exported import LIGHT, randomized
from xtune.boards.board import get_board
from xtune.errors import InputError
from xtune.firmware.build import build_model
from xtune.firmware.network_bench import random_input, run_network
from xtune.frontend.load import load_model
from xtune.frontend.refusal import refusal
from xtune.frontend.tasks import extract_tasks
from xtune.ops.workload import RTOL, compare_output
from xtune.tuning.database import read_logs
from xtune.tuning.peers import ort_network


def bench_one(path: Path, args: argparse.Namespace) -> tuple[dict[str, object], str]:
    """One model's row (timings and the match, or the refusal) and its line of the report."""
    board = get_board("local")
    source: Path | onnx.ModelProto = path
    if args.random_weights:
        source = randomized(onnx.load(str(path)))
    name = path.stem
    start = time.perf_counter()
    try:
        taskset = extract_tasks(source, board.target, args.layout, partial=True)
        if taskset.unsupported:
            raise refusal(taskset.model, taskset.unsupported)
        imported = time.perf_counter() - start
        start = time.perf_counter()
        artifact = build_model(source, board.target, args.log or (), layout=args.layout)
        built = time.perf_counter() - start
        # With a log, the default build (no log) too, timed in the same rounds: the table's two columns.
        default = build_model(source, board.target, (), layout=args.layout) if args.log else None
    except InputError as err:  # the build also refuses what extraction accepts (a kernel's stack)
        return {"model": name, "refused": str(err)}, f"{name:<24} refused: {err}"
    x = random_input(artifact.program.input_shape)
    model = load_model(source).SerializeToString()
    builds = [artifact] if default is None else [artifact, default]
    # Rounds of xtune (the tuned build, then the default one) then ORT, the ratios taken round by round:
    # this host's speed drifts by tens of per cent over seconds, which back-to-back medians would read as
    # a difference between them.
    times: list[list[float]] = [[] for _ in builds]
    ort_times: list[float] = []
    outputs: list[np.ndarray] = []
    for _ in range(args.rounds):
        timed = [run_network(board, build, x, args.repeat) for build in builds]
        ref, ort_repeats = ort_network(model, x, args.repeat)
        ort_times.append(statistics.median(ort_repeats))
        for column, (_, seconds) in zip(times, timed, strict=True):
            column.append(seconds)
        outputs = [got for got, _ in timed]
    mismatch = next((m for m in (compare_output(got, ref, RTOL) for got in outputs) if m), "")
    ratios = [[ort / t for ort, t in zip(ort_times, column, strict=True)] for column in times]
    row: dict[str, object] = {
        "model": name,
        "import_s": imported,
        "tasks": len(taskset.tasks),
        "build_s": built,
        "matches_ort": not mismatch,
        "mismatch": mismatch,
        "ort_s": statistics.median(ort_times),
    }
    parts = []
    columns = (("xtune", "xtune_s", "x_ort"), ("default", "default_s", "default_x_ort"))
    for (label, time_key, ratio_key), column, column_ratios in zip(
        columns[: len(times)], times, ratios, strict=True
    ):
        ratio = statistics.median(column_ratios)
        row |= {time_key: statistics.median(column), ratio_key: ratio, f"{ratio_key}_rounds": column_ratios}
        parts.append(
            f"{label} {1e3 * statistics.median(column):.2f} ms, {ratio:.2f}x ORT "
            f"(rounds {min(column_ratios):.2f}-{max(column_ratios):.2f})"
        )
    line = f"{name:<24} import+tasks {imported:.2f} s, build {built:.2f} s, "
    if mismatch:
        return row, line + f"WRONG: {mismatch}"
    line += f"matches ORT, ORT {1e3 * statistics.median(ort_times):.2f} ms, " + "; ".join(parts)
    return row, line


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", nargs="?", type=Path, default=LIGHT, help="folder of .onnx files")
    parser.add_argument("--models", default="", help="comma-separated file stems to run (default: all)")
    parser.add_argument("--repeat", type=int, default=5, help="timed repeats per round (median)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of xtune, then ORT (ratio: median)")
    parser.add_argument("--layout", default="nhwc", choices=("nhwc", "nchw"))
    parser.add_argument(
        "--log",
        action="append",
        help="tuning log whose bests the build takes (the default build timed beside it)",
    )
    parser.add_argument("--random-weights", action="store_true", help="seeded random weights (light models)")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    if args.log:
        read_logs(args.log)  # a missing log is one line, before any model is read
    wanted = {m for m in args.models.split(",") if m}
    paths = [
        p
        for p in sorted(args.dir.glob("*.onnx"))
        if not wanted or p.stem in wanted or p.stem.removeprefix("light_") in wanted
    ]
    rows = []
    for path in paths:
        row, line = bench_one(path, args)
        rows.append(row)
        print(line, flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
