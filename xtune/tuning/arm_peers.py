"""ONNX Runtime's and LiteRT's aarch64 builds under qemu-aarch64: a model (.onnx or .tflite), inputs and a
Cortex-A core in; the outputs a user of that core would get from the runtime out (`peer_outputs`, and
`onnx_aarch64` for a network's reference on an ARM board), in the arm64 Python of scripts/arm_peers.sh.

The arm64 root and the emulated core's /proc/cpuinfo are set up here; benchmarks/arm_peers.py counts the
same runs' instructions per inference. docs/arm-peers.md says why each step exists.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

import numpy as np

from xtune.errors import InputError, XtuneError

# What scripts/arm_peers.sh builds, in the checkout xtune runs from.
CACHE = Path(__file__).resolve().parents[2] / ".cache" / "arm64-peers"
GUEST = Path(__file__).resolve().with_name("arm_guest.py")  # what the emulated Python runs
SETUP_HINT = "build it with: bash scripts/arm_peers.sh"
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
class GuestDir:
    """For one emulated run: the arm64 root, a temporary work directory, and in it the root's view for
    qemu-aarch64 -L (`core_view`)."""

    root: Path
    work: Path
    view: Path


def runtime_for(model: Path) -> Runtime:
    """The peer that runs `model`, by its file name."""
    try:
        return SUFFIXES[model.suffix]
    except KeyError:
        raise InputError(
            f"{model}: the ARM peers run .onnx (ONNX Runtime) or .tflite (LiteRT) files"
        ) from None


def peers_built(cache: Path = CACHE) -> bool:
    """Whether scripts/arm_peers.sh has built the arm64 root in `cache`."""
    return (cache / "root" / ".complete").is_file()


def arm64_root(cache: Path = CACHE) -> Path:
    """The arm64 root scripts/arm_peers.sh built; XtuneError saying how to build it if there is none."""
    root = cache / "root"
    if not peers_built(cache):
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
    argv = [qemu_aarch64(), "-cpu", core, "-L", str(root), *guest_python(root), "hwcaps"]
    proc = subprocess.run(argv, capture_output=True, text=True, env=guest_env(root), timeout=120, check=False)
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


def guest_python(root: Path) -> list[str]:
    """The emulated Python running arm_guest.py, before the guest's own arguments."""
    # -P -s -S: neither the script's folder nor any site-packages on sys.path, only PYTHONPATH (guest_env).
    return [str(root / "usr" / "bin" / "python3.11"), "-P", "-s", "-S", str(GUEST)]


def guest_command(where: GuestDir, core: str, qemu_options: tuple[str, ...] = ()) -> list[str]:
    """qemu-aarch64 on `core` (with `qemu_options`, a plugin) running arm_guest.py in `where`'s view."""
    return [qemu_aarch64(), "-cpu", core, "-L", str(where.view), *qemu_options, *guest_python(where.root)]


def guest_env(root: Path) -> dict[str, str]:
    return {
        "PYTHONPATH": str(root / "opt" / "peers"),
        "PYTHONHASHSEED": "0",  # str hashes order sets and dicts' probes: a fixed seed, repeatable counts
        "OPENBLAS_NUM_THREADS": "1",  # numpy's OpenBLAS would start a thread per host CPU at import
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
    }


@contextmanager
def guest_dir(model: Path, core: str, cache: Path = CACHE) -> Iterator[GuestDir]:
    """The directories of one run of `model` on the emulated `core`, removed after."""
    if not model.is_file():
        raise InputError(f"{model}: no such model file")
    root = arm64_root(cache)
    with tempfile.TemporaryDirectory(prefix="xtune-arm-peer-") as tmp:
        work = Path(tmp)
        yield GuestDir(root=root, work=work, view=core_view(work / "root", core, cache))


def run_guest(argv: list[str], root: Path, what: str, model: Path) -> subprocess.CompletedProcess[str]:
    """The emulated arm_guest.py run `argv`; XtuneError saying why where it fails or hangs."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, env=guest_env(root), timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        raise XtuneError(f"{what}: {model.name} took over {TIMEOUT_S:.0f} s") from None
    if proc.returncode != 0:
        raise XtuneError(f"{what} failed on {model.name} ({proc.returncode}): {_last_line(proc.stderr)}")
    return proc


def _last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no message"


def saved_arrays(path: Path) -> tuple[np.ndarray, ...]:
    """The arrays the guest saved in `path` (np.savez), in order."""
    with np.load(path) as saved:
        return tuple(saved[f"arr_{i}"] for i in range(len(saved.files)))


def peer_outputs(
    model: Path, inputs: tuple[np.ndarray, ...], core: str = "cortex-a72", *, cache: Path = CACHE
) -> tuple[np.ndarray, ...]:
    """The outputs of one inference of `model` in its peer on the emulated `core` for the given inputs
    (in the model's input order), nothing counted: what a user of that core gets from the runtime."""
    runtime = runtime_for(model)
    with guest_dir(model, core, cache) as where:
        np.savez(where.work / "inputs.npz", *inputs)
        argv = [*guest_command(where, core), "outputs", runtime.value, str(model.resolve()), str(where.work)]
        run_guest(argv, where.root, f"{runtime.value} on {core}", model)
        return saved_arrays(where.work / "outputs.npz")


def onnx_aarch64(model: bytes, x: np.ndarray, core: str, *, cache: Path = CACHE) -> np.ndarray:
    """ONNX Runtime's aarch64 build's first output, as float32 (as `peers.ort_network` gives the host's),
    of a serialized one-input ONNX network on `x` on the emulated `core`."""
    with tempfile.TemporaryDirectory(prefix="xtune-arm-model-") as tmp:
        path = Path(tmp) / "model.onnx"
        path.write_bytes(model)
        return np.asarray(peer_outputs(path, (x,), core, cache=cache)[0], dtype=np.float32)


def emulation_missing(core: str, cache: Path = CACHE) -> str:
    """Why the aarch64 runtimes cannot run on the emulated `core` here ("" when they can): no arm64 root,
    no qemu-aarch64, or a core QEMU's models here do not include."""
    if core not in CORES:
        return f"no emulated {core}"
    if not peers_built(cache):
        return f"no arm64 Python with them in {cache / 'root'}: {SETUP_HINT}"
    if shutil.which("qemu-aarch64") is None:
        return "no qemu-aarch64: apt-get install qemu-user"
    return ""
