"""Target descriptors: targets/*.toml in, frozen `Target` values out; also the host: its architecture,
its target and which targets it can run (`host_cpu`)."""

from __future__ import annotations

import platform
import tomllib
from dataclasses import dataclass, fields
from functools import cache
from importlib import resources

from xtune.errors import InputError


@dataclass(frozen=True)
class Target:
    """What codegen, features and boards need to know about one kind of CPU."""

    name: str
    description: str
    arch: str  # x86_64 | aarch64 | riscv64: the ELF machine and the agent's architecture
    triple: str
    cpu: str
    features: str
    vector_bits: int  # 0 for a scalar-only FPU
    vector_registers: int  # registers usable for fp32 accumulators (vector, or scalar FP if no vectors)
    fp32_lanes: int  # fp32 elements per vector register; 1 without vectors
    l1d_bytes: int
    l2_bytes: int
    clock_ghz: float  # nominal, for % of peak only
    fp32_flops_per_cycle: int
    qemu_binary: str
    qemu_cpu: str
    agent_triple: str
    abi: str = ""  # LLVM abiname; "lp64d" for hard-float RISC-V (RISC-V ELF psABI)
    # How far ahead (bytes) a kernel prefetches the prepacked weights it streams; 0: never
    # (ops/matmul/nest.py, `MatmulEmitter.prefetch_strip`, says why; set where it was measured to pay).
    weight_prefetch_bytes: int = 0
    # The core llvm-mca models for the cycle cost of emulated boards (its -mcpu; docs/emulated-costs.md);
    # "" for a target with no scheduling model, which then has no cycle cost.
    mca_cpu: str = ""
    # A target that extends another with integer instructions only (x86-avx512-vnni: VNNI for the int8
    # kernels) runs that one's float code, so its float tasks' tuning records are that target's: one log
    # serves both (xtune/tuning/database.py, `log_target`). "" for a target whose records are its own.
    float_records_of: str = ""
    # An in-order core (LLVM's Cortex-A53 model: in-order, dual issue), where the AArch64 rules that move
    # work between blocks (`peel_reduction`) were measured to cost cycles instead of saving them.
    in_order: bool = False

    @property
    def record_targets(self) -> tuple[str, ...]:
        """The target names this target's tuning records may carry: its own, and its float base's."""
        return (self.name, self.float_records_of) if self.float_records_of else (self.name,)

    @property
    def has_fma(self) -> bool:
        """Whether the FPU fuses multiply and add: every AArch64 and RISC-V F target, x86 with +fma. Without
        it (x86 SSE) a product needs a register of its own before it is added (MULPS overwrites a source)."""
        return self.arch != "x86_64" or "+fma" in self.features.split(",")

    @property
    def lane_fma(self) -> bool:
        """Whether a vector FMA takes its broadcast multiplicand as a lane of a vector register: AArch64's
        FMLA (by element) (Arm ARM, "FMLA (by element)"), which LLVM selects from an FMA whose operand
        splats a lane of a loaded vector. A template then loads `fp32_lanes` consecutive broadcast values
        as one vector instead of one scalar load per value. x86 broadcasts from memory in one load
        (VBROADCASTSS) and RVV multiplies by a scalar register (vfmacc.vf), so neither gains from it."""
        return self.arch == "aarch64" and self.fp32_lanes == 4

    @property
    def integer_clamp(self) -> bool:
        """Whether a fused ReLU/ReLU6 clamps the float lanes' bits with integer max/min (SMAX, SMIN) rather
        than FMAXNM/FMINNM: on AArch64 a 128-bit FP max/min takes both FP pipes of a Cortex-A57/A72 (one
        per cycle, Cortex-A72 Software Optimization Guide, "ASIMD FP max/min"), an integer max/min either
        pipe (two per cycle), and no AArch64 core here does the integer form slower. Elsewhere the float
        form stays (x86 runs both as fast; RVV's vfmax/vmax likewise)."""
        return self.arch == "aarch64"

    @property
    def peel_reduction(self) -> bool:
        """Whether a register tile's reduction loop runs its last unrolled group of steps after the loop
        (`ops/tiles.py`, `unrolled`), so that the tile's clamp and stores share a basic block with FMAs
        instead of following them alone: the cycle board prices a block at its own throughput, and 25
        128-bit stores alone take 50 cycles of the A72's one store pipe (two each), beside 100 FMAs none.
        Out-of-order AArch64 cores only: on the in-order A53 model it cost MobileNetV2 5 % (175.4 ->
        184.3 M cycles, docs/benchmarks.md); the x86 and RISC-V objects stay as they were measured."""
        return self.arch == "aarch64" and not self.in_order

    @property
    def load_initial(self) -> bool:
        """Whether a register tile's accumulators start from loads of their own (a copy of the bias per
        tile row, `ops/matmul/nest.py`) rather than from copies of one register: a 128-bit register copy
        (MOV Vd.16B, an ORR) takes an FP pipe of a Cortex-A72 beside the FMAs (half a cycle each,
        Cortex-A72 Software Optimization Guide, "ASIMD logical"), a load the load pipe, which a lane-FMA
        tile leaves idle most of the time. AArch64 only, as `peel_reduction`."""
        return self.arch == "aarch64"

    @property
    def peak_gflops(self) -> float:
        """Nominal single-core fp32 peak, the denominator of "% of peak"."""
        return self.clock_ghz * self.fp32_flops_per_cycle


def _parse(text: str, origin: str) -> Target:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"{origin}: not valid TOML: {err}") from None
    names = {f.name for f in fields(Target)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise InputError(f"{origin}: unknown keys {', '.join(unknown)}")
    try:
        return Target(**raw)
    except TypeError as err:
        raise InputError(f"{origin}: {err}") from None


@cache
def load_targets() -> dict[str, Target]:
    """All targets shipped inside the package, by name."""
    found: dict[str, Target] = {}
    for entry in sorted(resources.files("xtune").joinpath("targets").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            target = _parse(entry.read_text(), entry.name)
            found[target.name] = target
    return found


def get_target(name: str) -> Target:
    targets = load_targets()
    if name not in targets:
        raise InputError(f"unknown target '{name}' (known: {', '.join(targets)})")
    return targets[name]


# ---- the host: what it is and what it can run (the one home of both) ---------------------------------

# platform.machine() spellings -> the ELF/agent architecture names of Target.arch (macOS and Windows
# say arm64 and AMD64 for aarch64 and x86_64).
_MACHINE_ARCH = {
    "x86_64": "x86_64",
    "AMD64": "x86_64",
    "aarch64": "aarch64",
    "arm64": "aarch64",
    "riscv64": "riscv64",
}
# x86 targets from the widest vectors down, each with VNNI first (the int8 kernels' vpdpbusd; float code and
# float records are the base target's): the host's target is the first whose features its CPU has.
_X86_PREFERENCE = ("x86-avx512-vnni", "x86-avx512", "x86-avx2-vnni", "x86-avx2", "x86-sse42")
# LLVM feature name -> the /proc/cpuinfo flag that says the CPU has it, where the two spellings differ.
_CPUINFO_FLAG = {
    "sse4.1": "sse4_1",
    "sse4.2": "sse4_2",
    "bmi": "bmi1",
    "neon": "asimd",
    "fp-armv8": "fp",
    "crc": "crc32",
    "dotprod": "asimddp",
    "avx512vnni": "avx512_vnni",
    "avxvnni": "avx_vnni",
}


@dataclass(frozen=True, kw_only=True)
class HostCpu:
    """This machine's CPU as xtune sees it: its architecture and feature flags."""

    machine: str  # as platform.machine() spells it
    arch: str  # x86_64 | aarch64 | riscv64 (Target.arch), or `machine` for an architecture xtune lacks
    flags: frozenset[str]  # /proc/cpuinfo "flags" (x86), "Features" (aarch64) or ISA letters (RISC-V)

    def missing_features(self, target: Target) -> list[str]:
        """The LLVM features `target` enables (+avx2, +sse4.2, ...) that this CPU's flags lack."""
        wanted = [f[1:] for f in target.features.split(",") if f.startswith("+")]
        return [f for f in wanted if _CPUINFO_FLAG.get(f, f) not in self.flags]

    def target(self) -> Target:
        """The shipped target that describes this CPU best."""
        if self.arch == "x86_64":
            targets = load_targets()
            for name in _X86_PREFERENCE:
                if name in targets and not self.missing_features(targets[name]):
                    return targets[name]
            raise InputError("this x86-64 host has none of the features of the shipped x86 targets")
        if self.arch == "aarch64":
            return get_target("arm-a72-neon")
        if self.arch == "riscv64":
            return get_target("riscv64-gcv" if "v" in self.flags else "riscv64-gc")
        raise InputError(f"no target is shipped for host architecture '{self.machine}'")

    def cannot_run(self, target: Target) -> str | None:
        """Why this CPU cannot execute `target`'s code natively, or None if it can.

        Every feature the target enables must be in the CPU's flags; the host's own target always
        qualifies. A feature whose flag we cannot check makes the answer "no": running code for an ISA the
        CPU lacks dies with SIGILL mid-tuning, which is worse than refusing up front."""
        if self.arch != target.arch:
            return f"this host is {self.machine}, target {target.name} is {target.arch}"
        try:
            if self.target() == target:
                return None
        except InputError:
            pass
        missing = self.missing_features(target)
        if missing:
            return f"this host's CPU lacks {', '.join(missing)}, which target {target.name} needs"
        return None


def host_cpu() -> HostCpu:
    """This machine's CPU: every question about the host (its agent architecture, its target, which
    targets it can run) is answered from this one reading of platform.machine() and /proc/cpuinfo."""
    machine = platform.machine()
    arch = _MACHINE_ARCH.get(machine, machine)
    return HostCpu(machine=machine, arch=arch, flags=_cpu_flags(_host_cpuinfo()))


def host_target() -> Target:
    """The shipped target that describes this machine's CPU best."""
    return host_cpu().target()


def host_cannot_run(target: Target) -> str | None:
    """Why this host cannot execute `target`'s code natively, or None if it can (HostCpu.cannot_run)."""
    return host_cpu().cannot_run(target)


def _host_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _cpu_flags(cpuinfo: str) -> frozenset[str]:
    """The CPU's feature flags: "flags" (x86), "Features" (aarch64) or the single-letter ISA extensions."""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
        if key.strip() == "isa":  # rv64imafdcv_zicsr_...: one letter per base extension
            return frozenset(value.strip().split("_")[0].removeprefix("rv64"))
    return frozenset()


# The /proc/cpuinfo fields that number a core's microarchitecture: x86 family/model (Intel SDM vol. 2A,
# CPUID leaf 1), Arm MIDR implementer/part (Arm ARM D23.2.122; 0x41/0xd08 is a Cortex-A72), RISC-V
# marchid (privileged spec 3.1.3).
_MICROARCH_FIELDS = (
    ("cpu family", "family"),
    ("model", "model"),
    ("CPU implementer", "implementer"),
    ("CPU part", "part"),
    ("marchid", "marchid"),
)


def cpu_identity(cpuinfo: str) -> str:
    """The CPU a /proc/cpuinfo text describes, for telling machines' timings apart: its name with the
    numbers of its microarchitecture, e.g. "AMD EPYC (family 26, model 2)". The name alone is not enough:
    a hypervisor may show a Zen 3 and a Zen 5 both as "AMD EPYC", and aarch64 kernels give no name."""
    info: dict[str, str] = {}
    for line in cpuinfo.splitlines():  # the first core's block; a big.LITTLE board names its first core
        key, _, value = line.partition(":")
        info.setdefault(key.strip(), value.strip())
    name = next((info[k] for k in ("model name", "uarch", "cpu model", "Model") if info.get(k)), "")
    numbers = ", ".join(f"{label} {info[key]}" for key, label in _MICROARCH_FIELDS if info.get(key))
    if name and numbers:
        return f"{name} ({numbers})"
    return name or numbers or "unknown"


def cpu_name(identity: str) -> str:
    """The name part of a `cpu_identity` ("AMD EPYC (family 26, model 2)" -> "AMD EPYC"); logs written before
    the numbers were added hold the name alone."""
    return identity.split(" (", 1)[0]


def host_cpu_identity() -> str:
    """`cpu_identity` of this machine."""
    text = _host_cpuinfo()
    return cpu_identity(text) if text else platform.processor() or "unknown"
