"""The ARM peers' cycle estimate: the plugin's per-block records of two forked children and the guest's
memory map in; llvm-mca's cycles for the work the second child did beyond the first out.

xtune's cycle model (xtune/boards/cycles.py, docs/emulated-costs.md) costs each
translation block that ran by its bytes, under a target's scheduling model. For a kernel those bytes are
the image xtune loaded; a peer's blocks lie in the runtimes' shared libraries, the interpreter and libc,
so they are read from the files the guest's /proc/self/maps names at the mapped offsets (qemu-user shows
the guest's mappings with their host files). The children share the parent's block records at the fork,
so a block's executions and repeats in one child minus the other's are those of the extra inferences.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

from xtune.boards.cycles import BlockRun, CycleModel, cycle_model, parse_block_line, total_cycles
from xtune.errors import XtuneError
from xtune.target import Target


@dataclass(frozen=True, kw_only=True)
class Mapping:
    """One executable mapping of the guest: [start, end) holds `path` from byte `offset` on."""

    start: int
    end: int
    offset: int
    path: str


def executable_mappings(maps: str) -> list[Mapping]:
    """The file-backed executable lines of /proc/PID/maps (proc(5): address perms offset dev inode path)."""
    found = []
    for line in maps.splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and "x" in fields[1] and fields[5].startswith("/"):
            start, end = (int(a, 16) for a in fields[0].split("-"))
            found.append(Mapping(start=start, end=end, offset=int(fields[2], 16), path=fields[5]))
    return found


def records(lines: Iterable[bytes]) -> tuple[dict[int, int], dict[int, list[BlockRun]]]:
    """The plugin's output file: each process's instruction count and its blocks, by pid."""
    counts: dict[int, int] = {}
    blocks: dict[int, list[BlockRun]] = defaultdict(list)
    for line in lines:
        words = line.split()
        if len(words) == 2 and words[1] == b"lost":
            raise XtuneError("the QEMU plugin ran out of memory recording the blocks")
        if len(words) == 2:
            counts[int(words[0])] = int(words[1])
        elif len(words) == 7 and words[1] == b"b":
            blocks[int(words[0])].append(parse_block_line(words))
    return counts, blocks


def extra_runs(fewer: Sequence[BlockRun], more: Sequence[BlockRun]) -> list[BlockRun]:
    """Each block's executions and repeats in `more` minus those in `fewer` (a block is its address and
    instruction count, as the plugin keys it); blocks whose figures did not change are left out."""
    before = {(r.vaddr, r.insns): r for r in fewer}
    after = {(r.vaddr, r.insns): r for r in more}
    extra = []
    for key in sorted(before.keys() | after.keys()):
        a, b = before.get(key), after.get(key)
        run = b if b is not None else before[key]
        execs = (b.execs if b else 0) - (a.execs if a else 0)
        repeats = (b.repeats if b else 0) - (a.repeats if a else 0)
        if execs or repeats:
            extra.append(replace(run, execs=execs, repeats=repeats))
    return extra


# A peer's new blocks are the runtime's whole executed code, thousands of them costed in one llvm-mca
# process: seconds of CPU, minutes of wall time on a loaded machine (a board's 120 s guard was seen to
# expire for ShuffleNet at a load average of 20). A guard, not a limit.
PEER_MCA_TIMEOUT_S = 3600.0


@cache
def peer_model(target: Target) -> CycleModel:
    """`target`'s model (checked, as a board's), costing as nothing what it has no scheduling data for:
    the runtimes' LSE atomics on the A76 (their lock and allocation paths), which LLVM's model lacks."""
    tools = cycle_model(target).tools
    return CycleModel(target, tools, skip_unscheduled=True, timeout_s=PEER_MCA_TIMEOUT_S)


def cycles(runs: Sequence[BlockRun], maps: str, target: Target) -> float:
    """llvm-mca's cycles for `runs` under `target`'s scheduling model, their bytes read from the mapped
    files. XtuneError (InputError when the model cannot be had) if a block lies in no mapped file."""
    model = peer_model(target)
    by_mapping: dict[Mapping, list[BlockRun]] = defaultdict(list)
    mappings = executable_mappings(maps)
    for run in runs:
        where = [m for m in mappings if m.start <= run.vaddr and run.vaddr + run.size <= m.end]
        if not where:
            raise XtuneError(f"a block at {run.vaddr:#x} ran outside every mapped file: no bytes to cost")
        by_mapping[where[0]].append(run)
    total = 0.0
    for mapping, inside in by_mapping.items():
        with open(mapping.path, "rb") as f:
            f.seek(mapping.offset)
            image = f.read(mapping.end - mapping.start)
        total += total_cycles(inside, model.costs(image, mapping.start, inside))
    return total


def cycles_between(counts_file: Path, fewer: int, more: int, maps: str, target: Target) -> float:
    """The cycles process `more` spent beyond process `fewer` (two children forked from one parent)."""
    _, blocks = records(counts_file.read_bytes().splitlines())
    return cycles(extra_runs(blocks[fewer], blocks[more]), maps, target)
