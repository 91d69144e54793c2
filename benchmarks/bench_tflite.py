"""Benchmark: a directory of .tflite files (MLPerf Tiny's reference models: docs/benchmarks.md says how to
get them) in; per model whether it imports, whether its ONNX form run by ONNX Runtime matches LiteRT,
whether xtune builds it, and xtune's latency (default configs, or the best of --log) against LiteRT's
(one thread, the same run) on the local board.

Usage: python benchmarks/bench_tflite.py DIR [--log tune.jsonl] [--repeat 5] [--json out.json]

"matches LiteRT" is max |ORT - LiteRT| relative to the output's largest magnitude for a float model, and
for a quantized one the share of outputs within one quantization step, over 8 seeded inputs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from xtune.boards.board import get_board
from xtune.errors import XtuneError
from xtune.firmware.network_bench import bench_model
from xtune.frontend.tflite import load_tflite
from xtune.frontend.tflite_file import read_tflite
from xtune.tuning.peers import litert_network, ort_network

SEEDS = 8


@dataclass(frozen=True, kw_only=True)
class Row:
    model: str
    kind: str  # the input's type: float32, int8, uint8
    ops: int
    imports: str  # "yes", or why not
    match: str  # against LiteRT, through ONNX Runtime
    builds: str  # "yes", or why not
    xtune_ms: float | None
    litert_ms: float | None

    @property
    def ratio(self) -> float | None:
        return self.litert_ms / self.xtune_ms if self.xtune_ms and self.litert_ms else None


def _inputs(path: Path) -> tuple[str, list[np.ndarray]]:
    """The input's type and SEEDS random inputs in it: uniform [-1, 1) floats, or any integer."""
    model = read_tflite(path.read_bytes(), str(path))
    t = model.tensors[model.inputs[0]]
    xs = []
    for seed in range(SEEDS):
        rng = np.random.default_rng(seed)
        if t.dtype == np.float32:
            xs.append(rng.uniform(-1, 1, t.shape).astype(np.float32))
        else:
            info = np.iinfo(t.dtype)
            xs.append(rng.integers(info.min, info.max + 1, t.shape).astype(t.dtype))
    return str(t.dtype), xs


def _match(path: Path, onnx_bytes: bytes, xs: list[np.ndarray]) -> str:
    data = path.read_bytes()
    worst, near, total = 0.0, 0, 0
    for x in xs:
        want, _ = litert_network(data, x)
        got, _ = ort_network(onnx_bytes, x)
        if want.dtype == np.float32:
            worst = max(worst, float(np.max(np.abs(got - want))) / max(1.0, float(np.max(np.abs(want)))))
        else:
            near += int(np.count_nonzero(np.abs(got.astype(np.int64) - want) <= 1))
            total += want.size
    if total:
        return f"{100 * near / total:.2f}% <= 1 step"
    return f"error {worst:.1e}"


def bench(path: Path, logs: list[str], repeat: int) -> Row:
    kind, xs = _inputs(path)
    ops = len(read_tflite(path.read_bytes(), str(path)).ops)
    row = {"model": path.name, "kind": kind, "ops": ops, "xtune_ms": None, "litert_ms": None}
    try:
        model = load_tflite(path)
    except XtuneError as err:
        return Row(**row, imports=str(err).split(": ", 1)[-1], match="-", builds="-")  # type: ignore[arg-type]
    match = _match(path, model.SerializeToString(), xs)
    try:
        report = bench_model(path, get_board("local"), logs, repeat=repeat)
    except XtuneError as err:
        return Row(**row, imports="yes", match=match, builds=str(err).split(": ", 1)[-1])  # type: ignore[arg-type]
    built = "yes" if report.correct else f"WRONG against LiteRT: {report.error}"
    row["xtune_ms"] = report.seconds * 1e3 if report.seconds else None
    row["litert_ms"] = report.ort_seconds * 1e3 if report.ort_seconds else None
    return Row(**row, imports="yes", match=match, builds=built)  # type: ignore[arg-type]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", type=Path, help="where the .tflite files are (searched recursively)")
    parser.add_argument("--log", action="append", default=[], help="tuning log(s) to take the best from")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    paths = sorted(args.directory.rglob("*.tflite"))
    if not paths:
        print(f"{args.directory}: no .tflite files", file=sys.stderr)
        return 2
    rows = [bench(p, args.log, args.repeat) for p in paths]
    head = f"{'model':34} {'input':8} {'ops':>4} {'imports':8} {'ORT vs LiteRT':18} {'builds':7} "
    print(head + f"{'xtune ms':>9} {'LiteRT ms':>9} {'ratio':>6}")
    for r in rows:
        ms = [f"{v:9.3f}" if v is not None else f"{'-':>9}" for v in (r.xtune_ms, r.litert_ms)]
        ratio = f"{r.ratio:5.2f}x" if r.ratio else f"{'-':>6}"
        imports, builds = (v if v in ("yes", "-") else "no" for v in (r.imports, r.builds))
        print(
            f"{r.model:34} {r.kind:8} {r.ops:4} {imports:8} {r.match:18} {builds:7} {ms[0]} {ms[1]} {ratio}"
        )
    for r in rows:
        for what, value in (("import", r.imports), ("build", r.builds)):
            if value not in ("yes", "-"):
                print(f"  {r.model}: {what}: {value}")
    ratios = [r.ratio for r in rows if r.ratio]
    if ratios:
        print(
            f"geometric mean {statistics.geometric_mean(ratios):.2f}x LiteRT over {len(ratios)} built models"
        )
    if args.json:
        args.json.write_text(json.dumps([{**asdict(r), "ratio": r.ratio} for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
