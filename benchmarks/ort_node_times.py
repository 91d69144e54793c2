"""Per-node times of ONNX Runtime on one model (one thread, ORT_ENABLE_ALL, its profiler): the median over
`runs` inferences after 5 warm-ups, in execution order, to set beside `xtune bench --model ... --profile`
(each step's time inside xtune's network). ONNX Runtime names the nodes it rewrites (`r12_nchwc`: a
Conv in MLAS's NCHWc layout), so the two lists are matched by position, not by name.

    python3 benchmarks/ort_node_times.py MODEL.onnx [--runs 20]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import statistics

import numpy as np
import onnxruntime as ort


def node_times(path: str, runs: int) -> list[tuple[str, float]]:
    """(node, median microseconds) in execution order."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.enable_profiling = True
    options.profile_file_prefix = "/tmp/ort_node_times"
    session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    spec = session.get_inputs()[0]
    shape = [d if isinstance(d, int) else 1 for d in spec.shape]
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    warm = 5
    for _ in range(warm + runs):
        session.run(None, {spec.name: x})
    profile = session.end_profiling()
    with open(profile) as f:
        events = json.load(f)
    os.remove(profile)
    durations: dict[str, list[float]] = collections.defaultdict(list)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            durations[event["name"].removesuffix("_kernel_time")].append(event["dur"])
    return [(name, statistics.median(times[warm:] or times)) for name, times in durations.items()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("--runs", type=int, default=20)
    args = parser.parse_args()
    times = node_times(args.model, args.runs)
    for name, us in times:
        print(f"{us:9.1f} {name}")
    print(f"total {sum(us for _, us in times) / 1000:.2f} ms")


if __name__ == "__main__":
    main()
