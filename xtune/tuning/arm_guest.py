"""Runs inside the emulated arm64 Python (numpy and one runtime, no xtune): a model, a seed and run counts in;
on stdout one JSON line (the runtime's version, the input names, the pids of the counting children in the
order of the run counts), in the work directory the seeded inputs and the outputs of one inference.
`hwcaps` instead prints the emulated core's AT_HWCAP words; `outputs` runs one inference on the inputs
saved in the work directory (inputs.npz, in the model's input order) and saves its outputs there, nothing
counted. benchmarks/arm_peers.py starts it under qemu-aarch64 (docs/arm-peers.md).

After one warm-up inference, which also gives the outputs, the loaded model is forked once per run count
and each child runs that many inferences and exits: qemu-user runs a guest fork() as a host fork(), so the
instruction-count plugin's exit line for a child is its parent's count at the fork plus the child's own
work, and the difference of two children is exactly the inferences they ran apart (start-up, loading and
the first inference's one-off work cancel).

Usage: python3.11 arm_guest.py hwcaps
       python3.11 arm_guest.py RUNTIME MODEL WORKDIR SEED RUNS,RUNS,...
       python3.11 arm_guest.py outputs RUNTIME MODEL WORKDIR
"""

from __future__ import annotations

import json
import os
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

Feeds = dict[str, np.ndarray]
Loaded = tuple[str, list[tuple[str, tuple[int, ...], Any]], Callable[[Feeds], list[np.ndarray]]]

# The auxiliary vector's keys for the hardware capability words (Linux include/uapi/linux/auxvec.h).
AT_HWCAP, AT_HWCAP2 = 16, 26


def hwcaps() -> dict[str, int]:
    """AT_HWCAP and AT_HWCAP2 as qemu-user gives them to this process (it emulates /proc/self/auxv)."""
    with open("/proc/self/auxv", "rb") as f:
        pairs = dict(struct.iter_unpack("<QQ", f.read()))
    return {"hwcap": pairs.get(AT_HWCAP, 0), "hwcap2": pairs.get(AT_HWCAP2, 0)}


def load_onnxruntime(model: str) -> Loaded:
    """ONNX Runtime's CPU provider, one thread, sequential: the settings of xtune's x86 ONNX Runtime peer."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    session = ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    dtypes = {
        "tensor(float)": np.float32,
        "tensor(int8)": np.int8,
        "tensor(uint8)": np.uint8,
        "tensor(int64)": np.int64,
        "tensor(int32)": np.int32,
    }
    inputs = [
        (i.name, tuple(d if isinstance(d, int) else 1 for d in i.shape), dtypes[i.type])
        for i in session.get_inputs()
    ]

    def run(feeds: Feeds) -> list[np.ndarray]:
        return list(session.run(None, feeds))

    return ort.__version__, inputs, run


def load_litert(model: str) -> Loaded:
    """LiteRT's interpreter, one thread, with the XNNPACK delegate it applies by default to float models."""
    from importlib.metadata import version

    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=model, num_threads=1)
    interpreter.allocate_tensors()
    details = interpreter.get_input_details()
    inputs = [(d["name"], tuple(int(n) for n in d["shape"]), d["dtype"]) for d in details]
    outputs = [d["index"] for d in interpreter.get_output_details()]
    fed: list[int] = []

    def run(feeds: Feeds) -> list[np.ndarray]:
        # The inputs stay in the interpreter's tensors: set them once, then an inference is invoke().
        if not fed:
            for d in details:
                interpreter.set_tensor(d["index"], feeds[d["name"]])
            fed.append(1)
        interpreter.invoke()
        return [interpreter.get_tensor(i) for i in outputs]

    return version("ai-edge-litert"), inputs, run


LOADERS: dict[str, Callable[[str], Loaded]] = {"onnxruntime": load_onnxruntime, "litert": load_litert}


def seeded(rng: np.random.Generator, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Uniform in [-1, 1) for floats (the range of xtune's network checks), the int8 range for integers."""
    kind = np.dtype(dtype)
    if kind.kind == "f":
        return rng.uniform(-1, 1, shape).astype(kind)
    info = np.iinfo(kind)
    return rng.integers(max(info.min, -128), min(info.max, 127), shape, endpoint=True).astype(kind)


def count_children(run: Callable[[Feeds], list[np.ndarray]], feeds: Feeds, counts: list[int]) -> list[int]:
    """Fork once per entry of `counts`; the child runs that many inferences and exits. Their pids."""
    pids = []
    for n in counts:
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for _ in range(n):
                    run(feeds)
            except BaseException as e:  # the parent reports the status; the message says why
                print(f"arm_guest: inference failed in the counting child: {e}", file=sys.stderr)
                code = 1
            os._exit(code)  # no interpreter shutdown: the same exit path in every child
        _, status = os.waitpid(pid, 0)
        if status != 0:
            raise SystemExit(f"arm_guest: the child running {n} inferences ended with status {status:#x}")
        pids.append(pid)
    return pids


def main(argv: list[str]) -> None:
    if argv[1:] == ["hwcaps"]:
        print(json.dumps(hwcaps()))
        return
    if argv[1] == "outputs":
        runtime, model, workdir = argv[2:]
        _, inputs, run = LOADERS[runtime](model)
        with np.load(Path(workdir, "inputs.npz")) as saved:
            feeds = {name: saved[f"arr_{i}"] for i, (name, _, _) in enumerate(inputs)}
        np.savez(Path(workdir, "outputs.npz"), *run(feeds))
        return
    runtime, model, workdir, seed, runs = argv[1:]
    version, inputs, run = LOADERS[runtime](model)
    rng = np.random.default_rng(int(seed))
    feeds = {name: seeded(rng, shape, dtype) for name, shape, dtype in inputs}
    outputs = run(feeds)
    np.savez(Path(workdir, "inputs.npz"), *feeds.values())
    np.savez(Path(workdir, "outputs.npz"), *outputs)
    # Where each library's code lies, for costing the children's blocks by their bytes (arm_cycles.py).
    Path(workdir, "maps.txt").write_text(Path("/proc/self/maps").read_text())
    counts = [int(n) for n in runs.split(",")]
    pids = count_children(run, feeds, counts)
    print(json.dumps({"version": version, "inputs": list(feeds), "children": pids}))


if __name__ == "__main__":
    main(sys.argv)
