"""Static memory planning: the lifetimes of a network's intermediate tensors in an execution order in, one
offset per tensor in the caller's workspace out (`MemoryPlan`), buffers reused where lifetimes do not overlap.

The offsets come from "greedy by size" (Pisarchyk & Lee, "Efficient Memory Management for Deep Neural Net
Inference", arXiv:2001.03288, 2020, §4.3 "Greedy by Size for Offset Calculation", the planner of TensorFlow
Lite's GPU delegate): buffers from the largest down, each at the lowest-waste gap between the buffers
already placed whose lifetimes overlap its own, or above all of them. The paper reports it within a few
percent of the lower bound on the networks we target (MobileNet, ResNet-like); `MemoryPlan.lower_bound`
makes the gap visible for every plan.

Two kinds of sharing are decided before placement, by the caller who knows the operators:
- an *alias* (`alias_of`): Flatten/Reshape of an NCHW tensor is the same bytes, so the view and its source
  are one buffer, alive from the first's production to the last read of either;
- *in place* (`in_place_of`): an elementwise op (Add, ReLU, Clip) may write its output over an input whose
  last read is that very step, because each element is read before the same element is written. When the
  input lives on past the step (or is not an intermediate), the output gets its own buffer.
Network inputs and outputs are the caller's own pointers and are not planned; tensors that alias them are
not intermediates either and must not be passed here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum

from xtune.errors import InputError

ALIGN = 64  # a cache line, and enough for any vector load or store a kernel emits


@dataclass(frozen=True, kw_only=True)
class TensorLife:
    """One intermediate tensor: its size, the step that writes it and the last step that reads it."""

    name: str
    nbytes: int
    produced: int  # index of the step in the execution order that writes it
    last_read: int  # index of the last step that reads it (== produced if nothing reads it)
    alias_of: str | None = None  # a view of that tensor: the same bytes, no copy
    in_place_of: str | None = None  # may overwrite that input if the input's last read is `produced`


class Sharing(Enum):
    """What a step's output may share with its inputs (the rule in this module's docstring)."""

    NONE = "none"  # a buffer of its own (convolutions, pooling, softmax, concat, ...)
    IN_PLACE = "in_place"  # elementwise: may overwrite an input of the same size that dies at this step
    ALIAS = "alias"  # Flatten/Reshape: the output is inputs[0]'s bytes


@dataclass(frozen=True, kw_only=True)
class Step:
    """One operator in the execution order: the tensors it reads and the one it writes."""

    inputs: tuple[str, ...]
    output: str
    sharing: Sharing = Sharing.NONE


@dataclass(frozen=True, kw_only=True)
class MemoryPlan:
    """Byte offsets in the workspace, its size, and the figures that say how good the plan is."""

    offsets: tuple[tuple[str, int], ...]  # every tensor's offset (aliases and in-place outputs share)
    workspace_bytes: int  # the size the caller must provide, a multiple of ALIGN
    lower_bound: int  # max over steps of the bytes of buffers alive at that step (no plan does better)
    intermediate_bytes: int  # sum of all buffers' sizes: the workspace without any reuse

    def offset(self, name: str) -> int:
        for tensor, offset in self.offsets:
            if tensor == name:
                return offset
        raise KeyError(name)

    @property
    def overhead(self) -> float:
        """workspace / lower bound - 1: 0.0 is an optimal plan for this execution order."""
        return self.workspace_bytes / self.lower_bound - 1 if self.lower_bound else 0.0


@dataclass(frozen=True)
class _Buffer:
    """One storage block: a group of tensors sharing bytes, alive from `first` to `last` inclusive."""

    root: str
    nbytes: int
    first: int
    last: int

    def overlaps(self, other: _Buffer) -> bool:
        return self.first <= other.last and other.first <= self.last


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _validate(tensors: list[TensorLife]) -> dict[str, TensorLife]:
    by_name: dict[str, TensorLife] = {}
    for t in tensors:
        if t.name in by_name:
            raise InputError(f"memory plan: tensor '{t.name}' appears twice")
        if t.nbytes <= 0 or t.produced < 0 or t.last_read < t.produced:
            raise InputError(
                f"memory plan: tensor '{t.name}' needs nbytes > 0 and 0 <= produced <= last_read "
                f"(got {t.nbytes}, {t.produced}, {t.last_read})"
            )
        if t.alias_of is not None and t.in_place_of is not None:
            raise InputError(f"memory plan: tensor '{t.name}' cannot be both an alias and in place")
        by_name[t.name] = t
    for t in tensors:
        source = t.alias_of or t.in_place_of
        if source is None:
            continue
        if source not in by_name:
            raise InputError(f"memory plan: '{t.name}' shares '{source}', which is not an intermediate")
        if by_name[source].produced >= t.produced and t.alias_of is None:
            raise InputError(f"memory plan: '{t.name}' runs in place of '{source}', produced no earlier")
        if t.alias_of is not None and t.nbytes != by_name[source].nbytes:
            raise InputError(
                f"memory plan: alias '{t.name}' has {t.nbytes} bytes, '{source}' has {by_name[source].nbytes}"
            )
    return by_name


Groups = tuple[dict[str, str], list[_Buffer]]


def _groups(tensors: list[TensorLife], by_name: dict[str, TensorLife]) -> Groups:
    """Union tensors that share storage; tensor -> root name, and one _Buffer per root."""
    parent = {t.name: t.name for t in tensors}

    def find(name: str) -> str:
        while parent[name] != name:
            parent[name] = parent[parent[name]]
            name = parent[name]
        return name

    # Aliases first: an in-place decision must see the whole lifetime of the storage it would reuse.
    for t in tensors:
        if t.alias_of is not None:
            parent[find(t.name)] = find(t.alias_of)
    last: dict[str, int] = {}
    for t in tensors:
        root = find(t.name)
        last[root] = max(last.get(root, -1), t.last_read)
    for t in sorted(tensors, key=lambda t: t.produced):
        if t.in_place_of is None:
            continue
        src, own = find(t.in_place_of), find(t.name)
        # Safe only when every view of the input's storage is read for the last time at this step.
        if src != own and last[src] == t.produced and by_name[t.in_place_of].nbytes >= t.nbytes:
            parent[own] = src
            last[src] = max(last[src], last[own])
    members: dict[str, list[TensorLife]] = {}
    for t in tensors:
        members.setdefault(find(t.name), []).append(t)
    buffers = [
        _Buffer(
            root,
            max(m.nbytes for m in group),
            min(m.produced for m in group),
            max(m.last_read for m in group),
        )
        for root, group in members.items()
    ]
    return {t.name: find(t.name) for t in tensors}, buffers


def _lower_bound(buffers: list[_Buffer]) -> int:
    """The largest total of buffers alive at one step: a sweep over production and release events."""
    events: dict[int, int] = {}
    for b in buffers:
        events[b.first] = events.get(b.first, 0) + b.nbytes
        events[b.last + 1] = events.get(b.last + 1, 0) - b.nbytes
    alive = best = 0
    for step in sorted(events):
        alive += events[step]
        best = max(best, alive)
    return best


def _greedy(buffers: list[_Buffer], ceiling: int | None) -> dict[str, int]:
    """Pisarchyk & Lee §4.3 for `buffers` in the order given (theirs: largest first): each at the
    smallest gap that fits among the placed buffers whose lifetimes overlap its own, else above them all.

    With a `ceiling`, the space between the highest overlapping buffer and the ceiling is a gap too, and a
    buffer put there sits flush against the ceiling: neighbours in a chain then alternate between the
    bottom and the top of the workspace, which meets the lower bound where bottom-only placement leaves
    holes (a buffer wider than a gap goes above everything, as without a ceiling)."""
    placed: list[tuple[int, _Buffer]] = []  # (offset, buffer), kept sorted by offset
    offsets: dict[str, int] = {}
    for buf in buffers:
        size = _aligned(buf.nbytes)
        best: int | None = None
        best_gap = 0
        top = 0  # end of the highest overlapping buffer seen so far, in offset order
        for offset, other in placed:
            if not buf.overlaps(other):
                continue
            gap = offset - top
            if gap >= size and (best is None or gap < best_gap):
                best, best_gap = top, gap
            top = max(top, offset + _aligned(other.nbytes))
        if ceiling is not None and ceiling - top >= size and (best is None or ceiling - top < best_gap):
            best = ceiling - size
        chosen = top if best is None else best
        offsets[buf.root] = chosen
        placed.append((chosen, buf))
        placed.sort(key=lambda p: p[0])
    return offsets


def lifetimes(steps: Sequence[Step], nbytes: Mapping[str, int], external: frozenset[str]) -> list[TensorLife]:
    """The TensorLife of every intermediate of `steps` (in execution order), given every tensor's size and
    the `external` tensors (network inputs, outputs, weights) that live outside the workspace. An in-place
    step overwrites its first input that is an intermediate of its size read for the last time there."""
    last: dict[str, int] = {}
    for i, step in enumerate(steps):
        for name in step.inputs:
            last[name] = i
    lives = []
    for i, step in enumerate(steps):
        out, first = step.output, step.inputs[0] if step.inputs else ""
        if step.sharing is Sharing.ALIAS and (out in external) != (first in external):
            raise InputError(f"memory plan: view '{out}' of '{first}': one is external, the other is not")
        if out in external:
            continue
        alias = first if step.sharing is Sharing.ALIAS else None
        in_place = None
        if step.sharing is Sharing.IN_PLACE:
            dying = [
                x for x in step.inputs if x not in external and last[x] == i and nbytes[x] == nbytes[out]
            ]
            in_place = dying[0] if dying else None
        life = TensorLife(
            name=out,
            nbytes=nbytes[out],
            produced=i,
            last_read=last.get(out, i),
            alias_of=alias,
            in_place_of=in_place,
        )
        lives.append(life)
    return lives


def plan_memory(tensors: list[TensorLife] | tuple[TensorLife, ...]) -> MemoryPlan:
    """Offsets (multiples of ALIGN) for every tensor such that no two whose storage is alive at the same
    step overlap; InputError on inconsistent lifetimes."""
    tensors = list(tensors)
    by_name = _validate(tensors)
    root_of, buffers = _groups(tensors, by_name)
    sizes = {b.root: _aligned(b.nbytes) for b in buffers}
    bound = _lower_bound(buffers)
    # The smaller of two plans: the paper's (largest first, no ceiling), and the buffers in execution order
    # against the aligned bound as ceiling (optimal on chains, where largest-first leaves holes of up to a
    # third of the workspace when sizes go up and down).
    by_size = sorted(buffers, key=lambda b: (-b.nbytes, b.first, b.root))
    in_order = sorted(buffers, key=lambda b: (b.first, -b.nbytes, b.root))
    plans = [_greedy(by_size, None), _greedy(in_order, _aligned(bound))]
    workspaces = [max((plan[r] + sizes[r] for r in plan), default=0) for plan in plans]
    workspace = min(workspaces)
    offsets = plans[workspaces.index(workspace)]
    return MemoryPlan(
        offsets=tuple((t.name, offsets[root_of[t.name]]) for t in tensors),
        workspace_bytes=workspace,
        lower_bound=bound,
        intermediate_bytes=sum(t.nbytes for t in tensors if t.alias_of is None),
    )
