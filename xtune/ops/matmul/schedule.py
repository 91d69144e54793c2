"""A matmul config resolved against its shape (`MatmulSchedule`) and where the product's operands live
(`Operands`) in; out, the panel rules the nest (nest.py, panels.py) and the features (features.py) share:
which block loop packs an operand's panel, and whether a config copies it at every call."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from typing import Literal

from xtune.ops.tiles import Num
from xtune.schedule.loopnest import Buffer

# The block loops that fix each packed panel: B's strips by (n, k), A's panels by (m, k).
PANEL_AXES = {"B": ("n", "k"), "A": ("m", "k")}


def packed_per_call(pack: Num, prepacked: str, operand: str) -> Num:
    """Whether (1/0) a config copies `operand` into panels at every call: it reads the operand in panels
    (its pack knob) that the caller did not pass already packed (`prepacked` names that operand)."""
    return pack * (prepacked != operand)


@cache
def packed_at(order: str, operand: str) -> str:
    """The block loop whose body packs `operand`'s panel: the inner of the two that fix it, as soon as both
    are open (BLIS: B per (jc, pc), A per (ic, pc))."""
    a, b = PANEL_AXES[operand]
    return a if order.index(a) > order.index(b) else b


@cache
def repacked_per_block(order: str, operand: str) -> bool:
    """Whether `operand`'s panel is packed again for every block of the third loop (outside the packer)."""
    (third,) = set("mnk") - set(PANEL_AXES[operand])
    return order.index(third) < order.index(packed_at(order, operand))


@dataclass(frozen=True)
class MatmulSchedule:
    """A config resolved against the shape: effective block sizes and switches."""

    mr: int
    nv: int
    lanes: int
    mc: int
    nc: int
    kc: int
    order: str
    inner: str  # "nm": column strips outside row panels (B strip stays in L1), or "mn"
    pack_a: bool  # A is read in panels ...
    pack_b: bool  # ... B in strips
    unroll_k: int
    prepacked: str  # the operand passed already in panels (when its pack knob is on), or ""
    prefetch_bytes: int = 0  # the target's weight_prefetch_bytes (`MatmulEmitter.prefetch_strip`)
    lane_fma: bool = False  # the target's: A read in place is loaded a vector of k steps at a time
    integer_clamp: bool = False  # the target's: ReLU/ReLU6 on the accumulators' bits (`Epilogue.bits`)
    peel_k: bool = False  # the target's `peel_reduction`: the last k group runs beside the tile's stores
    bias_copy: bool = False  # the target's `load_initial`: each tile row loads its bias from its own copy

    @property
    def nr(self) -> int:
        return self.nv * self.lanes

    @property
    def copy_a(self) -> bool:
        """A copied into panels at every call."""
        return bool(packed_per_call(self.pack_a, self.prepacked, "A"))

    @property
    def copy_b(self) -> bool:
        return bool(packed_per_call(self.pack_b, self.prepacked, "B"))

    @property
    def passed_packed(self) -> str:
        """The operand the kernel reads from panels the caller passed (`prepack`): the prepacked one, if
        its pack knob is on (else the kernel reads it as it is), or ""."""
        reads_panels = self.pack_a if self.prepacked == "A" else self.pack_b
        return self.prepacked if reads_panels else ""


@dataclass(frozen=True, kw_only=True)
class Operands:
    """Where the product's operands live, for a template that lowers through this one (a pointwise
    conv2d): buffer names, the kernel's parameters in order (None: A, B, bias, C), bias per row of C
    instead of per column, `batch` products one after another that share A (B and C advance by one
    whole matrix per product), and which operand holds weights passed prepacked ("" for none).

    `groups` (a grouped pointwise conv2d): per batch product, that many independent products of the
    workload's shape, each over its own slice of every operand and its own bias. Without `interleaved`
    each group's A, B and C are whole matrices one after another (NCHW: a group's weights rows, input and
    output planes are contiguous); `interleaved` (NHWC) puts the groups side by side in every row: a row
    of A holds every group's k columns, of B and C every group's n. A prepacked operand holds each
    group's panels one after another."""

    a: str = "A"
    b: str = "B"
    c: str = "C"
    params: tuple[Buffer, ...] | None = None
    bias_rows: bool = False
    batch: int = 1
    prepacked: Literal["", "A", "B"] = ""
    groups: int = 1
    interleaved: bool = False
