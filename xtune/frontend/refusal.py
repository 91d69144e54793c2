"""Refusals: the nodes of a model xtune cannot run (each an `UnsupportedNode`) in, one InputError out that
names them all, grouped by op type with counts, and says what would help (`refusal`); the same groups as
data for `xtune tasks --json` (`Unsupported.as_dict`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import onnx

from xtune.errors import HINTS, InputError, UnsupportedNode

SHOWN = 3  # node names a refusal shows per op type; the JSON lists them all


@dataclass(frozen=True, kw_only=True)
class Unsupported:
    """Every node of one op type that xtune cannot run, in graph order, with the distinct reasons."""

    op: str
    nodes: tuple[str, ...]
    why: tuple[str, ...]
    hint: str

    @property
    def count(self) -> int:
        return len(self.nodes)

    def as_dict(self) -> dict[str, object]:
        return {
            "op": self.op,
            "count": self.count,
            "nodes": list(self.nodes),
            "why": list(self.why),
            "hint": self.hint,
        }

    def text(self) -> str:
        """ "Conv ×12 (nodes 'a', 'b', 'c' and 9 more): why; hint"."""
        names = ", ".join(f"'{n}'" for n in self.nodes[:SHOWN])
        more = f" and {self.count - SHOWN} more" if self.count > SHOWN else ""
        why = "; ".join(self.why[:2]) + (
            f" (and {len(self.why) - 2} other reasons)" if len(self.why) > 2 else ""
        )
        hint = f" ({self.hint})" if self.hint else ""
        return f"{self.op} ×{self.count} (node{'s' if self.count > 1 else ''} {names}{more}): {why}{hint}"


def hint(op: str, domain: str, opset: int) -> str:
    """What would help with an op type xtune does not run: another domain is an exporter option; an
    operator ONNX deprecated at the model's opset has a replacement a newer opset exports."""
    if op in HINTS:
        return HINTS[op]
    if domain not in ("", "ai.onnx"):
        return f"an operator of the '{domain}' domain: export with standard ONNX operators only"
    try:
        schema = onnx.defs.get_schema(op, opset)
    except onnx.defs.SchemaError:
        return "not an ONNX operator at this opset"
    return (
        f"deprecated at opset {schema.since_version}: a newer opset exports its replacement"
        if schema.deprecated
        else ""
    )


def by_op(failures: Iterable[UnsupportedNode]) -> tuple[Unsupported, ...]:
    """The failures by op type, in the order each op type first fails."""
    grouped: dict[str, list[UnsupportedNode]] = {}
    for failure in failures:
        grouped.setdefault(failure.op, []).append(failure)
    return tuple(
        Unsupported(
            op=op,
            nodes=tuple(f.name for f in fs),
            why=tuple(dict.fromkeys(f.why for f in fs)),
            hint=next((f.hint for f in fs if f.hint), ""),
        )
        for op, fs in grouped.items()
    )


def refusal(where: str, parts: Sequence[Unsupported]) -> InputError:
    """One line naming every node xtune cannot run; one node alone reads as that node's own refusal."""
    if len(parts) == 1 and parts[0].count == 1:
        (part,) = parts
        hint_text = f" ({part.hint})" if part.hint else ""
        return InputError(f"{where}: node '{part.nodes[0]}' ({part.op}): {part.why[0]}{hint_text}")
    total = sum(p.count for p in parts)
    kinds = f"{len(parts)} op types" if len(parts) > 1 else "1 op type"
    return InputError(
        f"{where}: xtune cannot run {total} nodes ({kinds}): " + "; ".join(p.text() for p in parts)
    )
