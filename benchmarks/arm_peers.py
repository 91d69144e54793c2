"""The peers an ARM user would run, under the emulator and counter of xtune's QEMU boards, counted: a model
(.onnx for ONNX Runtime, .tflite for LiteRT with XNNPACK) and an emulated core in; the peer's outputs for
seeded inputs, its instructions per inference, and its outputs checked against the same runtime on this
x86 host out.

The emulated runtimes themselves (the arm64 Python of scripts/arm_peers.sh, the core's /proc/cpuinfo, the
guest driver arm_guest.py) are xtune/tuning/arm_peers.py's, which xtune's network checks use too;
docs/arm-peers.md says why each step exists. Start-up and session creation cancel: arm_guest.py forks the
loaded model into a child that runs 1 inference and one that runs 3, three pairs of them, and the count is
the median of their differences over 2.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from arm_cycles import cycles_between, records

from xtune.boards.board import build_insn_plugin
from xtune.errors import InputError, XtuneError
from xtune.ops.workload import RTOL, compare_output
from xtune.target import Target
from xtune.tuning.arm_peers import (
    CACHE,
    Runtime,
    guest_command,
    guest_dir,
    run_guest,
    runtime_for,
    saved_arrays,
)
from xtune.tuning.peers import ort_session

RUNS = (1, 3)  # inferences of the two counting children; the count is their difference over 2
# Pairs of such children, forked from the same parent: the median of their differences. A child now and
# then does some one-off work (seen once in about fifteen runs of a small ONNX Runtime model: 12 % more,
# in the runtime's library and libc's allocator), which one pair would report as the inference's.
PAIRS = 3


@dataclass(frozen=True, kw_only=True)
class PeerRun:
    """One model on one emulated core: what the peer computed and what it cost."""

    runtime: Runtime
    version: str  # of the runtime's aarch64 wheel
    core: str  # qemu-aarch64 -cpu
    model: str
    inputs: tuple[np.ndarray, ...]  # seeded, in the model's input order
    outputs: tuple[np.ndarray, ...]  # of one inference on the emulated core
    instructions: float  # guest instructions per inference, the whole process counted
    # llvm-mca's estimate per inference under a target's scheduling model (arm_cycles.py); None if not asked
    # or if it failed, `cycles_error` then saying why (the instruction count is kept)
    cycles: float | None
    cycles_error: str = ""
    seconds: float  # wall time of the emulated process, start-up included: no performance signal


def per_inference(
    counts: Path, pids: list[int], maps: Path, cycles: Target | None
) -> tuple[float, float | None, str]:
    """Instructions and (with a target) cycles per inference: the median over the pairs of children of
    the second child's figure minus the first's, over the inferences it ran more; and why there are no
    cycles where costing the blocks failed."""
    by_pid, _ = records(counts.read_bytes().splitlines())
    pairs = list(zip(pids[::2], pids[1::2], strict=True))
    extra = RUNS[1] - RUNS[0]
    instructions = statistics.median(by_pid[more] - by_pid[fewer] for fewer, more in pairs) / extra
    if cycles is None:
        return instructions, None, ""
    text = maps.read_text(encoding="utf-8")
    try:
        estimates = [cycles_between(counts, fewer, more, text, cycles) for fewer, more in pairs]
    except XtuneError as e:  # llvm-mca failed: the instructions counted stand
        return instructions, None, str(e)
    return instructions, statistics.median(estimates) / extra, ""


def run_peer(
    model: Path,
    core: str = "cortex-a72",
    *,
    seed: int = 0,
    cache: Path = CACHE,
    cycles: Target | None = None,
    pairs: int = PAIRS,
) -> PeerRun:
    """Run `model` in its peer on the emulated `core`, counting instructions per inference over `pairs`
    pairs of children, and with `cycles` estimating its cycles under that target's scheduling model (the
    plugin records blocks)."""
    runtime = runtime_for(model)
    if pairs < 1:
        raise InputError(f"pairs must be at least 1, not {pairs}")
    with guest_dir(model, core, cache) as where:
        root, work = where.root, where.work
        counts = work / "counts.txt"
        if "," in str(counts):  # -plugin splits its argument at commas
            raise XtuneError(f"the temporary folder {work} has a comma in its path: set TMPDIR elsewhere")
        plugin = f"{build_insn_plugin()},min=0,out={counts}"  # min=0: the runtimes' libraries lie anywhere
        plugin += ",blocks=1" if cycles is not None else ""
        argv = guest_command(where, core, ("-plugin", plugin))
        argv += [runtime.value, str(model.resolve()), str(work), str(seed), ",".join(map(str, RUNS * pairs))]
        start = time.perf_counter()
        proc = run_guest(argv, root, f"{runtime.value} on {core}", model)
        seconds = time.perf_counter() - start
        reply = json.loads(proc.stdout.splitlines()[-1])
        instructions, estimate, why = per_inference(counts, reply["children"], work / "maps.txt", cycles)
        return PeerRun(
            runtime=runtime,
            version=reply["version"],
            core=core,
            model=model.name,
            inputs=saved_arrays(work / "inputs.npz"),
            outputs=saved_arrays(work / "outputs.npz"),
            instructions=instructions,
            cycles=estimate,
            cycles_error=why,
            seconds=seconds,
        )


def host_outputs(model: Path, inputs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
    """The same runtime's outputs on this x86 host for the same inputs, one thread."""
    if runtime_for(model) is Runtime.ONNXRUNTIME:
        session = ort_session(model.read_bytes())
        feeds = {i.name: x for i, x in zip(session.get_inputs(), inputs, strict=True)}
        return tuple(np.asarray(y) for y in session.run(None, feeds))
    try:
        from ai_edge_litert.interpreter import Interpreter
    except ImportError:
        raise XtuneError(
            "checking a .tflite peer needs LiteRT on this host: pip install ai-edge-litert"
        ) from None
    interpreter = Interpreter(model_path=str(model), num_threads=1)
    interpreter.allocate_tensors()
    for detail, x in zip(interpreter.get_input_details(), inputs, strict=True):
        interpreter.set_tensor(detail["index"], x)
    interpreter.invoke()
    return tuple(interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details())


def check_peer(run: PeerRun, model: Path) -> str:
    """'' if the emulated peer's outputs match the x86 host's (xtune's rule: RTOL of the largest), else
    why."""
    expected = host_outputs(model, run.inputs)
    if len(expected) != len(run.outputs):
        return f"{len(run.outputs)} outputs on {run.core}, {len(expected)} on the host"
    for i, (got, ref) in enumerate(zip(run.outputs, expected, strict=True)):
        why = compare_output(got.astype(np.float64), ref.astype(np.float64), RTOL)
        if why:
            return f"output {i}: {why}"
    return ""
