"""Cycle estimates: a kernel image and how often each of its translation blocks ran in, cycles out.

Each executed block's bytes are disassembled (llvm-mc) and simulated by llvm-mca under the target's
scheduling model (`Target.mca_cpu`); every execution of a block costs its steady-state throughput
(docs/emulated-costs.md, "The cycle model", says why not its latency when entered from elsewhere)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from xtune.errors import BoardError, BoardFault, InputError
from xtune.target import Target

# Iterations of the steady-state simulation. The throughput is the marginal cost of one more iteration,
# (cycles(K) - cycles(1)) / (K - 1), so a pipeline's fill and drain do not leak into it; 100 iterations
# make any remaining start-up transient of a loop body's dependency chains negligible.
MCA_ITERATIONS = 100
_TOOL = re.compile(r"llvm-mca-(\d+)$")
MCA_TIMEOUT_S = 120.0  # a board's blocks: one kernel's, a few hundred at most
GUEST_PAGE = 4096  # qemu-user's target page on x86-64, AArch64 and RISC-V (TARGET_PAGE_BITS 12)
MAX_INSN_BYTES = 15  # the longest x86 instruction (Intel SDM vol. 2, 2.3.11); AArch64's and RISC-V's are 4
_PROBE = {"aarch64": "add x0, x0, #1", "x86_64": "addq $1, %rax"}  # one instruction; RISC-V's is the default


@dataclass(frozen=True, kw_only=True)
class LlvmTools:
    """One LLVM release's llvm-mca and llvm-mc (scheduling models change between releases)."""

    mca: str
    mc: str
    version: int


def find_llvm_tools(path: str | None = None) -> LlvmTools | None:
    """The newest `llvm-mca-NN` on PATH that has its `llvm-mc-NN` beside it; None if there is none.

    Debian installs each release under versioned names (llvm-22 ships /usr/bin/llvm-mca-22); the
    unversioned llvm-mca is whichever release `update-alternatives` chose, so it is never used."""
    found: dict[int, LlvmTools] = {}
    for folder in (path if path is not None else os.environ.get("PATH", "")).split(os.pathsep):
        try:
            names = os.listdir(folder or ".")
        except OSError:
            continue
        for name in names:
            match = _TOOL.match(name)
            mc = Path(folder, f"llvm-mc-{match.group(1)}") if match else None
            if match and mc is not None and os.access(mc, os.X_OK) and os.access(Path(folder, name), os.X_OK):
                version = int(match.group(1))
                found.setdefault(version, LlvmTools(mca=str(Path(folder, name)), mc=str(mc), version=version))
    return found[max(found)] if found else None


@dataclass(frozen=True, kw_only=True)
class BlockRun:
    """One translation block of a run, as the plugin recorded it."""

    vaddr: int  # guest address of its first instruction
    size: int  # bytes
    insns: int
    execs: int  # times it ran
    repeats: int  # of those, runs right after a run of itself (a one-block loop body going round)


@dataclass(frozen=True, kw_only=True)
class BlockCycles:
    """What llvm-mca says one block costs."""

    latency: float  # cycles of one run alone, from the first dispatch to the last retirement
    throughput: float  # cycles each further back-to-back run adds (steady state)


def run_cost(block: BlockRun, cycles: BlockCycles) -> float:
    """The cycles of all of `block`'s runs: each pays the block's throughput, as an out-of-order core
    overlaps a block with the ones around it. Charging the latency on each entry from another block (so
    only a loop body's repeats run at throughput) ranked configs worse on every operator of the x86
    validation: it overcharges short loops, whose drain the core hides behind the next tile."""
    return block.execs * cycles.throughput


@dataclass(frozen=True, kw_only=True)
class Region:
    """One block's instructions as llvm-mca reads them."""

    asm: tuple[str, ...]  # instruction lines, comments stripped
    prefix: tuple[str, ...] = ()  # lines before the region (RISC-V vector type instruments)


_ENCODING = re.compile(r"\s*(?://|#|;)\s*encoding:\s*\[([^\]]*)\]")
_VSET = re.compile(r"^\s*vseti?vli\s+[^,]+,\s*[^,]+,\s*(e\d+),\s*(mf?\d+)")


def split_disassembly(text: str, counts: Sequence[int]) -> list[tuple[str, ...]]:
    """llvm-mc --show-encoding output in, the instruction lines of each block (by instruction counts) out.

    Every block holds whole instructions, so disassembling the blocks' bytes one after the other decodes
    each at its own boundaries. The counts come from QEMU; the encodings llvm-mc shows are re-assembled
    (x86 relaxes jumps), so their lengths prove nothing. Raises ValueError when the number of decoded
    instructions differs (an encoding llvm-mc could not decode)."""
    insns = [
        line[: m.start()].split("//")[0].rstrip()
        for line in text.splitlines()
        if (m := _ENCODING.search(line))
    ]
    if len(insns) != sum(counts):
        raise ValueError(f"{len(insns)} instructions decoded where QEMU ran {sum(counts)}")
    blocks, used = [], 0
    for count in counts:
        blocks.append(tuple(insns[used : used + count]))
        used += count
    return blocks


def riscv_vtype_prefixes(starts: Sequence[int], blocks: Sequence[tuple[str, ...]]) -> list[tuple[str, ...]]:
    """For each block, llvm-mca's RISC-V instruments for the vector type in force when it is entered.

    llvm-mca derives SEW and LMUL from a vsetvli inside the region and otherwise assumes the costliest
    (LMUL=8); a loop body has its vsetvli in the block before it. The type on entry is taken statically:
    the last vsetvli at a lower address among the executed blocks, else the first one of the kernel."""
    settings = sorted(
        (start, _VSET.match(line))
        for start, asm in zip(starts, blocks, strict=True)
        for line in asm
        if _VSET.match(line)
    )
    found = [(start, m.group(1).upper(), m.group(2).upper()) for start, m in settings if m is not None]
    prefixes: list[tuple[str, ...]] = []
    for start in starts:
        before = [f for f in found if f[0] < start] or found[:1]
        if not before:
            prefixes.append(())
            continue
        _, sew, lmul = before[-1]
        prefixes.append((f"# LLVM-MCA-RISCV-LMUL {lmul}", f"# LLVM-MCA-RISCV-SEW {sew}"))
    return prefixes


def mca_source(regions: Sequence[Region], comment: str) -> str:
    """One llvm-mca input with a named code region per block (LLVM-MCA-BEGIN/END markers)."""
    lines: list[str] = []
    for i, region in enumerate(regions):
        begin, end = f"{comment} LLVM-MCA-BEGIN b{i}", f"{comment} LLVM-MCA-END b{i}"
        lines += [*region.prefix, begin, *region.asm, end]
    return "\n".join(lines) + "\n"


def region_cycles(output: str, regions: int) -> list[float]:
    """llvm-mca --json output in, each region's total cycles out (in region order)."""
    found = json.loads(output).get("CodeRegions", [])
    if len(found) != regions:
        raise ValueError(f"llvm-mca reported {len(found)} regions for {regions} blocks")
    return [float(r["SummaryView"]["TotalCycles"]) for r in found]


def block_cycles(single: Sequence[float], steady: Sequence[float], iterations: int) -> list[BlockCycles]:
    """Latency and marginal throughput of each block from its cycles at 1 and at `iterations` runs."""
    return [
        BlockCycles(latency=one, throughput=(many - one) / (iterations - 1))
        for one, many in zip(single, steady, strict=True)
    ]


class CycleModel:
    """llvm-mca under one target's scheduling model, with each block's cycles cached by its bytes."""

    def __init__(
        self,
        target: Target,
        tools: LlvmTools,
        *,
        skip_unscheduled: bool = False,
        timeout_s: float = MCA_TIMEOUT_S,
    ) -> None:
        """`skip_unscheduled`: instructions the scheduling model has no data for cost nothing instead of
        refusing the block. Never for a board (a kernel's cost must be whole); for code that is not
        xtune's, such as a runtime's LSE atomics in its lock paths, which LLVM's A76 model lacks.
        `timeout_s`: the wall-time guard of one llvm-mca or llvm-mc process, which costs every new block
        of a call at once."""
        self.target, self.tools = target, tools
        self.skip_unscheduled = skip_unscheduled
        self.timeout_s = timeout_s
        self.comment = "//" if target.arch == "aarch64" else "#"
        self._cache: dict[tuple[bytes, tuple[str, ...]], BlockCycles] = {}
        self._asm: dict[bytes, tuple[str, ...]] = {}  # a block's bytes -> its instruction lines

    def describe(self) -> str:
        """How the cycles are made, for a board's fingerprint."""
        return f"llvm-mca {self.tools.version} -mcpu={self.target.mca_cpu}"

    def _mca_args(self) -> list[str]:
        triple, cpu = self.target.triple, self.target.mca_cpu
        argv = [self.tools.mca, f"-mtriple={triple}", f"-mcpu={cpu}", f"-mattr={self.target.features}"]
        return [*argv, "-skip-unsupported-instructions=lack-sched"] if self.skip_unscheduled else argv

    def _tool(self, argv: list[str], text: str) -> subprocess.CompletedProcess[str]:
        try:
            return subprocess.run(
                argv, input=text, capture_output=True, text=True, timeout=self.timeout_s, check=False
            )
        except (OSError, subprocess.TimeoutExpired) as err:
            raise BoardError(f"{Path(argv[0]).name} failed: {err}", BoardFault.COST_MODEL) from None

    def probe(self) -> str | None:
        """Why this model cannot cost code (the CPU unknown to llvm-mca, or without a scheduling model),
        or None. llvm-mca only warns about an unknown CPU and goes on with the generic one."""
        out = self._tool([*self._mca_args(), "-iterations=1"], self._probe_insn() + "\n")
        said = " ".join((out.stderr or "").split())
        if out.returncode != 0 or "not a recognized processor" in said or "error" in said:
            return f"llvm-mca {self.tools.version} cannot model -mcpu={self.target.mca_cpu}: {said[:200]}"
        return None

    def _probe_insn(self) -> str:
        return _PROBE.get(self.target.arch, "addi a0, a0, 1")

    def costs(self, image: bytes, base: int, runs: Sequence[BlockRun]) -> list[BlockCycles]:
        """Each block's cycles (in `runs` order); llvm-mca runs only for blocks not seen before."""
        starts = [r.vaddr - base for r in runs]
        for run, start in zip(runs, starts, strict=True):
            if start < 0 or start + run.size > len(image):
                raise BoardError(
                    f"a translation block at {run.vaddr:#x} lies outside the kernel image "
                    f"({base:#x}, {len(image)} bytes)",
                    BoardFault.COST_MODEL,
                )
        codes = [image[s : s + r.size] for s, r in zip(starts, runs, strict=True)]
        asm = self._disassemble(codes, runs)
        prefixes = (
            riscv_vtype_prefixes(starts, asm)
            if self.target.arch == "riscv64" and self.target.vector_bits
            else [()] * len(runs)
        )
        keys = [(code, prefix) for code, prefix in zip(codes, prefixes, strict=True)]
        new = {
            key: Region(asm=lines, prefix=key[1])
            for key, lines in zip(keys, asm, strict=True)
            if key not in self._cache
        }
        if new:
            where = [starts[keys.index(key)] for key in new]
            self._cache.update(zip(new, self._simulate(list(new.values()), where), strict=True))
        return [self._cache[key] for key in keys]

    def _disassemble(self, codes: Sequence[bytes], runs: Sequence[BlockRun]) -> list[tuple[str, ...]]:
        """Each block's instruction lines; llvm-mc runs for bytes not seen before, in one process for the
        blocks that end well inside a page. A block that ends within an instruction's length of a page
        end may end in part of an instruction: QEMU ends a block before an instruction that crosses into
        the next page, and yet lists it with the bytes it had read (seen with x86's variable-length
        instructions under qemu 7.2). Disassembled alone, its bytes decode to the instructions that ran."""
        todo = list(dict.fromkeys(c for c in codes if c not in self._asm))
        run_of = {code: run for code, run in zip(codes, runs, strict=True)}
        inside = [c for c in todo if -(run_of[c].vaddr + run_of[c].size) % GUEST_PAGE >= MAX_INSN_BYTES]
        if inside:
            self._asm.update(
                zip(inside, self._decode(inside, [run_of[c].insns for c in inside]), strict=True)
            )
        for code in todo:
            if code not in self._asm:
                self._asm[code] = self._decode_page_end(code, run_of[code].insns)
        return [self._asm[code] for code in codes]

    def _decode(self, codes: Sequence[bytes], counts: Sequence[int]) -> list[tuple[str, ...]]:
        text = "\n".join(" ".join(f"0x{b:02x}" for b in code) for code in codes) + "\n"
        # The core's own extensions too (-mcpu), not only the ones xtune compiles for: code that is not
        # xtune's (a library under the same plugin) may use what the core has, e.g. the A76's LSE atomics.
        argv = [self.tools.mc, "--disassemble", "--show-encoding", f"-triple={self.target.triple}"]
        out = self._tool([*argv, f"-mcpu={self.target.mca_cpu}", f"-mattr={self.target.features}"], text)
        try:
            return split_disassembly(out.stdout, counts)
        except ValueError as err:
            said = " ".join(out.stderr.split())[:200]
            raise BoardError(
                f"llvm-mc {self.tools.version} cannot disassemble the kernel's blocks ({err}): {said}",
                BoardFault.COST_MODEL,
            ) from None

    def _decode_page_end(self, code: bytes, insns: int) -> tuple[str, ...]:
        try:
            (lines,) = self._decode([code], [insns])
        except BoardError:
            (lines,) = self._decode([code], [insns - 1])  # the last one was the start of the next block's
        return lines

    def _simulate(self, regions: Sequence[Region], starts: Sequence[int]) -> list[BlockCycles]:
        source = mca_source(regions, self.comment)
        totals = []
        for iterations in (1, MCA_ITERATIONS):
            out = self._tool([*self._mca_args(), f"-iterations={iterations}", "--json"], source)
            try:
                if out.returncode != 0:
                    raise ValueError("failed")
                totals.append(region_cycles(out.stdout, len(regions)))
            except (ValueError, KeyError, TypeError):
                raise BoardError(self._refusal(out.stderr, regions, starts), BoardFault.COST_MODEL) from None
        return block_cycles(totals[0], totals[1], MCA_ITERATIONS)

    def _refusal(self, stderr: str, regions: Sequence[Region], starts: Sequence[int]) -> str:
        """One line: which block llvm-mca refused and what it said."""
        lines = [line.strip() for line in stderr.splitlines() if line.strip()]
        said = " | ".join(lines[:3])[:300]
        blamed = [start for region, start in zip(regions, starts, strict=True) if _named(region, stderr)]
        where = f" (the block at image offset {blamed[0]:#x})" if blamed else ""
        tool = f"llvm-mca {self.tools.version} -mcpu={self.target.mca_cpu}"
        return f"{tool} refuses the kernel's code{where}: {said}"


def _named(region: Region, stderr: str) -> bool:
    """Whether llvm-mca's complaint quotes one of the region's instructions."""
    return any(line.strip() and line.strip() in stderr for line in region.asm)


def total_cycles(runs: Iterable[BlockRun], cycles: Iterable[BlockCycles]) -> float:
    """The run's cycle estimate: the sum of every block's `run_cost`, correctly rounded (math.fsum), so
    that the same blocks listed in another order give the same figure to the last bit."""
    return math.fsum(run_cost(r, c) for r, c in zip(runs, cycles, strict=True))


@cache
def cycle_model(target: Target, path: str | None = None) -> CycleModel:
    """The model costing `target`'s code, checked; InputError (one line) when it cannot be had: no
    llvm-mca, a target naming no scheduling model, or one the installed llvm-mca does not know."""
    if not target.mca_cpu:
        raise InputError(
            f"target {target.name} names no scheduling model (mca_cpu in its .toml): no cycle cost for it"
        )
    tools = find_llvm_tools(path)
    if tools is None:
        raise InputError(
            "the cycle cost needs llvm-mca-NN and llvm-mc-NN (Debian's llvm packages) on PATH: "
            "bash scripts/setup.sh installs them"
        )
    model = CycleModel(target, tools)
    why = model.probe()
    if why is not None:
        raise InputError(f"target {target.name}: {why}")
    return model


def parse_block_line(words: Sequence[bytes]) -> BlockRun:
    """`pid b VADDR BYTES INSNS EXECS REPEATS` (split) -> BlockRun."""
    vaddr, size, insns, execs, repeats = words[2:7]
    return BlockRun(
        vaddr=int(vaddr, 16), size=int(size), insns=int(insns), execs=int(execs), repeats=int(repeats)
    )


def block_summary(runs: Sequence[BlockRun], cycles: Sequence[BlockCycles]) -> Mapping[str, float]:
    """Totals a validation compares: the model's cycles; latency on each entry from another block and
    throughput on each repeat (`entry_latency`); every run at its latency (`latency_only`)."""
    pairs = list(zip(runs, cycles, strict=True))
    return {
        "cycles": total_cycles(runs, cycles),
        "entry_latency": math.fsum(
            (r.execs - r.repeats) * c.latency + r.repeats * c.throughput for r, c in pairs
        ),
        "latency_only": math.fsum(r.execs * c.latency for r, c in pairs),
    }
