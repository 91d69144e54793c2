"""Time `xtune model train` on a 100,000-record log (the goal: under 60 s here).

Usage: python benchmarks/bench_model_train.py [--records 100000] [--keep DIR]

The log holds random configs of several real matmul, conv2d and depthwise spaces on x86-avx2, but their
costs come from a simple synthetic function of the knobs (a fixed random weight per knob option, plus
noise; about 3% of the records are failures), so nothing is compiled or measured. Only the training time
is measured: the model it produces says nothing about real kernels. The figure is the wall time of the
`xtune model train` process, end to end: start-up, reading and parsing the log, checking every record's
config against its space, featurizing, fitting one booster per operator, and saving the model file.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from xtune.ops.registry import parse_workload, template_for
from xtune.target import get_target
from xtune.tuning.database import make_record, record_to_json
from xtune.tuning.measure import MeasureResult, MeasureStatus

WORKLOADS = (
    "matmul:m=512,n=512,k=512",
    "matmul:m=256,n=1024,k=64",
    "matmul:m=128,n=768,k=768",
    "matmul:m=64,n=64,k=64",
    "conv2d:n=1,c=64,h=56,w=56,k=64,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=128,h=28,w=28,k=128,r=3,s=3,stride=1,pad=1",
    "conv2d:n=1,c=256,h=14,w=14,k=256,r=1,s=1,stride=1,pad=0",
    "depthwise:n=1,c=64,h=56,w=56,r=3,s=3,stride=1,pad=1",
)


def synthetic_lines(workload: str, n: int, rng: np.random.Generator) -> list[str]:
    """`n` log lines of random configs of `workload` on x86-avx2 with synthetic costs."""
    wl, target = parse_workload(workload), get_target("x86-avx2")
    space = template_for(wl, target).space
    indices = rng.integers(space.size, size=n)
    digits = space.digits(indices)
    weights = [rng.normal(0.0, 0.3, len(k.options)) for k in space.knobs]
    log_cost = sum(w[digits[:, col]] for col, w in enumerate(weights)) + rng.normal(0, 0.05, n)
    costs = wl.flops() / 50e9 * np.exp(log_cost)  # around 50 GFLOP/s
    failed = rng.random(n) < 0.03
    lines = []
    for index, cost, bad in zip(indices.tolist(), costs.tolist(), failed.tolist(), strict=True):
        result = (
            MeasureResult(MeasureStatus.WRONG_ANSWER, error="synthetic")
            if bad
            else MeasureResult(MeasureStatus.OK, (cost, cost * 1.01, cost * 0.99))
        )
        lines.append(record_to_json(make_record(wl.key, target.name, "local", space.config(index), result)))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--keep", type=Path, default=None, help="write the log and model here, and keep them")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="xtune-bench-train-") as tmp:
        where = args.keep or Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        log, model = where / "synthetic.jsonl", where / "model.json"
        rng = np.random.default_rng(0)
        n = len(WORKLOADS)
        per = [args.records // n + (i < args.records % n) for i in range(n)]
        lines = [line for wl, n in zip(WORKLOADS, per, strict=True) for line in synthetic_lines(wl, n, rng)]
        log.write_text("\n".join(lines) + "\n")
        cmd = [sys.executable, "-m", "xtune.cli", "model", "train", str(log), "-o", str(model), "--json"]
        start = time.perf_counter()
        out = subprocess.run(cmd, capture_output=True, text=True, check=True)
        seconds = time.perf_counter() - start
        report = json.loads(out.stdout)
        manifest = report["manifest"]
        print(
            f"xtune model train: {len(lines)} records ({log.stat().st_size / 1e6:.1f} MB log), "
            f"{len(WORKLOADS)} workloads, ops {', '.join(manifest['feature_names'])}"
        )
        print(
            f"  {manifest['records_used']} used, {manifest['records_skipped']} skipped; "
            f"model {model.stat().st_size / 1e6:.2f} MB"
        )
        print(f"  wall time end to end: {seconds:.1f} s (inside the command: {report['seconds']:.1f} s)")


if __name__ == "__main__":
    main()
