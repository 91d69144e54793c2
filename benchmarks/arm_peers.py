"""The peers an ARM user would run, under the emulator and counter of xtune's QEMU boards: a model (.onnx for
ONNX Runtime, .tflite for LiteRT with XNNPACK) and an emulated core in; the peer's outputs for seeded inputs,
its instructions per inference, and its outputs checked against the same runtime on this x86 host out.

The arm64 Python with the runtimes is built by scripts/arm_peers.sh; docs/arm-peers.md says why each step
exists. Start-up and session creation cancel: arm_guest.py forks the loaded model into a child that runs
1 inference and one that runs 3, three pairs of them, and the count is the median of their differences
over 2.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np
from arm_cycles import cycles_between, records

from xtune.boards.board import build_insn_plugin
from xtune.errors import InputError, XtuneError
from xtune.ops.workload import RTOL, compare_output
from xtune.target import Target
from xtune.tuning.peers import ort_session

REPO = Path(__file__).resolve().parent.parent
CACHE = REPO / ".cache" / "arm64-peers"  # what scripts/arm_peers.sh builds
GUEST = Path(__file__).resolve().with_name("arm_guest.py")
SETUP_HINT = "build it with: bash scripts/arm_peers.sh"
RUNS = (1, 3)  # inferences of the two counting children; the count is their difference over 2
# Pairs of such children, forked from the same parent: the median of their differences. A child now and
# then does some one-off work (seen once in about fifteen runs of a small ONNX Runtime model: 12 % more,
# in the runtime's library and libc's allocator), which one pair would report as the inference's.
PAIRS = 3
TIMEOUT_S = 3600.0  # ResNet-18 takes minutes under qemu-user on a loaded machine: a guard, not a limit


class Runtime(Enum):
    ONNXRUNTIME = "onnxruntime"  # MLAS's NEON kernels
    LITERT = "litert"  # TFLite's interpreter with the XNNPACK delegate


SUFFIXES = {".onnx": Runtime.ONNXRUNTIME, ".tflite": Runtime.LITERT}

# MIDR_EL1 of QEMU's CPU models (target/arm/cpu64.c in QEMU 7.2): implementer 0x41 (Arm), variant, part
# number, revision. These are what a real core of that kind reports in /proc/cpuinfo.
CORES: dict[str, int] = {
    "cortex-a53": 0x410FD034,
    "cortex-a72": 0x410FD083,
    "cortex-a76": 0x414FD0B1,
}

# Names of the AT_HWCAP bits, then of AT_HWCAP2's, in the order Linux prints them on the Features line
# (arch/arm64/include/uapi/asm/hwcap.h; arch/arm64/kernel/cpuinfo.c, hwcap_str).
HWCAP_NAMES = (
    "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm jscvt fcma lrcpc dcpop "
    "sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb paca pacg"
)
HWCAP2_NAMES = (
    "dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint svei8mm svef32mm svef64mm svebf16 "
    "i8mm bf16 dgh rng bti mte ecv afp rpres mte3 sme smei16i64 smef64f64 smei8i32 smef16f32 smeb16f32 "
    "smef32f32 smefa64 wfxt ebf16"
)


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


def runtime_for(model: Path) -> Runtime:
    """The peer that runs `model`, by its file name."""
    try:
        return SUFFIXES[model.suffix]
    except KeyError:
        raise InputError(
            f"{model}: the ARM peers run .onnx (ONNX Runtime) or .tflite (LiteRT) files"
        ) from None


def arm64_root(cache: Path = CACHE) -> Path:
    """The arm64 root scripts/arm_peers.sh built; XtuneError saying how to build it if there is none."""
    root = cache / "root"
    if not (root / ".complete").is_file():
        raise XtuneError(f"no arm64 Python with the ARM peers in {root}: {SETUP_HINT}")
    return root


def qemu_aarch64() -> str:
    path = shutil.which("qemu-aarch64")
    if path is None:
        raise XtuneError("the ARM peers need qemu-aarch64: apt-get install qemu-user")
    return path


def cpuinfo_text(midr: int, hwcap: int, hwcap2: int, processors: int) -> str:
    """/proc/cpuinfo as Linux on arm64 prints it (arch/arm64/kernel/cpuinfo.c, c_show) for `processors`
    cores with this MIDR_EL1 and these capabilities. BogoMIPS is twice the generic timer's frequency in
    MHz; QEMU's runs at 62.5 MHz."""
    names = [n for bit, n in enumerate(HWCAP_NAMES.split()) if hwcap >> bit & 1]
    names += [n for bit, n in enumerate(HWCAP2_NAMES.split()) if hwcap2 >> bit & 1]
    block = (
        "BogoMIPS\t: 125.00\n"
        f"Features\t: {' '.join(names)}\n"
        f"CPU implementer\t: {midr >> 24:#04x}\n"
        "CPU architecture: 8\n"
        f"CPU variant\t: {midr >> 20 & 0xF:#x}\n"
        f"CPU part\t: {midr >> 4 & 0xFFF:#05x}\n"
        f"CPU revision\t: {midr & 0xF}\n"
    )
    return "".join(f"processor\t: {i}\n{block}\n" for i in range(processors))


@functools.cache
def emulated_hwcaps(core: str, cache: Path = CACHE) -> tuple[int, int]:
    """AT_HWCAP and AT_HWCAP2 of QEMU's model of `core`, read from the guest's auxiliary vector (what a
    Linux kernel on that core would list as Features)."""
    root = arm64_root(cache)
    argv = [qemu_aarch64(), "-cpu", core, "-L", str(root), *_python(root), "hwcaps"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_env(root), timeout=120, check=False)
    if proc.returncode != 0:
        raise XtuneError(f"the arm64 Python in {root} does not start on {core}: {_last_line(proc.stderr)}")
    caps = json.loads(proc.stdout)
    return int(caps["hwcap"]), int(caps["hwcap2"])


def core_view(where: Path, core: str, cache: Path = CACHE) -> Path:
    """A directory `where` for qemu-aarch64 -L: the arm64 root (linked entry by entry) with an arm64
    /proc/cpuinfo for `core`. qemu-user 7.2 looks every absolute path the guest opens up under -L first,
    so the guest reads this file instead of the host's x86 one, on which ONNX Runtime's and XNNPACK's CPU
    detection (the cpuinfo library) crash; newer QEMU emulates /proc/cpuinfo itself and ignores it."""
    if core not in CORES:
        raise InputError(f"unknown core '{core}': the ARM peers run on {', '.join(CORES)}")
    root = arm64_root(cache)
    hwcap, hwcap2 = emulated_hwcaps(core, cache)
    where.mkdir()
    for entry in root.iterdir():
        if not entry.name.startswith("."):
            (where / entry.name).symlink_to(entry.resolve())
    (where / "proc").mkdir()
    # One entry per host CPU: the library also reads /sys/devices/system/cpu, which qemu-user passes through.
    text = cpuinfo_text(CORES[core], hwcap, hwcap2, os.cpu_count() or 1)
    (where / "proc" / "cpuinfo").write_text(text, encoding="ascii")
    return where


def _python(root: Path) -> list[str]:
    # -P -s -S: neither the script's folder nor any site-packages on sys.path, only PYTHONPATH (_env).
    return [str(root / "usr" / "bin" / "python3.11"), "-P", "-s", "-S", str(GUEST)]


def _env(root: Path) -> dict[str, str]:
    return {
        "PYTHONPATH": str(root / "opt" / "peers"),
        "PYTHONHASHSEED": "0",  # str hashes order sets and dicts' probes: a fixed seed, repeatable counts
        "OPENBLAS_NUM_THREADS": "1",  # numpy's OpenBLAS would start a thread per host CPU at import
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }


@contextmanager
def _guest_dir(model: Path, core: str, cache: Path) -> Iterator[tuple[Path, Path, Path]]:
    """For a run of `model` on the emulated `core`: the arm64 root, a temporary work directory and in it
    the root's view for qemu-aarch64 -L (`core_view`)."""
    if not model.is_file():
        raise InputError(f"{model}: no such model file")
    root = arm64_root(cache)
    with tempfile.TemporaryDirectory(prefix="xtune-arm-peer-") as tmp:
        work = Path(tmp)
        yield root, work, core_view(work / "root", core, cache)


def _guest(argv: list[str], root: Path, what: str, model: Path) -> subprocess.CompletedProcess[str]:
    """The emulated arm_guest.py run `argv`; XtuneError saying why where it fails or hangs."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=_env(root), timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise XtuneError(f"{what}: {model.name} took over {TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        raise XtuneError(f"{what} failed on {model.name} ({proc.returncode}): {_last_line(proc.stderr)}")
    return proc


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def _arrays(path: Path) -> tuple[np.ndarray, ...]:
    with np.load(path) as saved:
        return tuple(saved[f"arr_{i}"] for i in range(len(saved.files)))


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
    with _guest_dir(model, core, cache) as (root, work, view):
        counts = work / "counts.txt"
        if "," in str(counts):  # -plugin splits its argument at commas
            raise XtuneError(f"the temporary folder {work} has a comma in its path: set TMPDIR elsewhere")
        plugin = f"{build_insn_plugin()},min=0,out={counts}"  # min=0: the runtimes' libraries lie anywhere
        plugin += ",blocks=1" if cycles is not None else ""
        argv = [qemu_aarch64(), "-cpu", core, "-L", str(view), "-plugin", plugin, *_python(root)]
        argv += [runtime.value, str(model.resolve()), str(work), str(seed), ",".join(map(str, RUNS * pairs))]
        start = time.perf_counter()
        proc = _guest(argv, root, f"{runtime.value} on {core}", model)
        seconds = time.perf_counter() - start
        reply = json.loads(proc.stdout.splitlines()[-1])
        instructions, estimate, why = per_inference(counts, reply["children"], work / "maps.txt", cycles)
        return PeerRun(
            runtime=runtime,
            version=reply["version"],
            core=core,
            model=model.name,
            inputs=_arrays(work / "inputs.npz"),
            outputs=_arrays(work / "outputs.npz"),
            instructions=instructions,
            cycles=estimate,
            cycles_error=why,
            seconds=seconds,
        )


def peer_outputs(
    model: Path, inputs: tuple[np.ndarray, ...], core: str = "cortex-a72", *, cache: Path = CACHE
) -> tuple[np.ndarray, ...]:
    """The outputs of one inference of `model` in its peer on the emulated `core` for the given inputs
    (in the model's input order), nothing counted: for checking an arithmetic against the ARM build."""
    runtime = runtime_for(model)
    with _guest_dir(model, core, cache) as (root, work, view):
        np.savez(work / "inputs.npz", *inputs)
        argv = [qemu_aarch64(), "-cpu", core, "-L", str(view), *_python(root)]
        argv += ["outputs", runtime.value, str(model.resolve()), str(work)]
        _guest(argv, root, f"{runtime.value} on {core}", model)
        return _arrays(work / "outputs.npz")


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
