"""The operators by name: text such as "matmul:m=512,n=512,k=512" in, its operator's canonical
`Workload` out (`parse_workload`); `OPERATORS` lists every operator a workload can name."""

from __future__ import annotations

from xtune.errors import InputError
from xtune.operators import Conv2d, Depthwise, Matmul
from xtune.ops.qmatmul.operator import QMatmul
from xtune.ops.workload import Operator, Workload, make_workload

OPERATORS: dict[str, Operator] = {op.name: op for op in (Matmul(), Conv2d(), Depthwise(), QMatmul())}


def parse_workload(text: str) -> Workload:
    """Parse "OP:key=value,..." into a canonical Workload, or raise InputError naming the problem."""
    op_name, _, rest = text.partition(":")
    if op_name not in OPERATORS:
        raise InputError(f"unknown operator {op_name!r} in workload {text!r} (known: {', '.join(OPERATORS)})")
    return make_workload(OPERATORS[op_name], rest, text)
