"""Whole-network firmware: an ONNX model, a target and tuning logs in; one relocatable object that runs the
network and its C header out (`build_model`, `xtune build --model`).

One LLVM module holds every kernel as an internal, never-inlined function: each task's kernel from its
template with the logs' best config (else the template's default, named in a warning, as `xtune build`
chooses for kernels: `xtune.firmware.kernels.choose`), and the generated kernels of the other operators
(their families, NODE_FAMILIES in xtune/ops/registry.py). The external entry `{prefix}_run(input,
output, workspace)` calls them in graph order with pointers into the caller's three buffers and into the
weights, which are read-only data of the object (xtune/codegen/rodata.py: BatchNorm folded at extraction;
the weights of prepacked=1 tasks packed at build time into the panels their kernel reads, the template's
`kernel_inputs`, as tuning measured them; others in the layout the workload takes). The
workspace layout is the static memory plan of xtune/firmware/program.py. Small queries
(`{prefix}_workspace_bytes`, `_input_size`, `_output_size`, `_build_id`) let a firmware check at run time
that the object is the one its header describes; the entry's and the queries' IR and the header are
xtune/firmware/entry.py. docs/firmware.md, "Whole networks", is the user's view.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from xtune.codegen.compile import compile_object
from xtune.codegen.link import check_object
from xtune.codegen.lower import lower
from xtune.codegen.rodata import pack_weights, patch_weights, weights_global
from xtune.errors import InputError
from xtune.firmware.entry import (
    STACK_MARGIN,
    NetArtifact,
    NetKernel,
    check_profile,
    entry_ir,
    entry_points,
    kernel_key,
    queries_ir,
    with_header,
)
from xtune.firmware.kernels import (
    MAX_STACK_BYTES,
    choose,
    fallback_notes,
    kernel_for,
    read_noted,
    valid_prefix,
)
from xtune.firmware.program import Program, program
from xtune.frontend.load import Source
from xtune.ops.layout import DEFAULT, Layout, parse_layout
from xtune.ops.registry import template_for
from xtune.ops.template import ScheduleTemplate
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import Kernel
from xtune.schedule.space import Config
from xtune.target import Target, get_target
from xtune.tuning.database import Record

PathLike = str | os.PathLike[str]


def build_model(
    model: Source,
    target: str | Target,
    logs: Sequence[PathLike] = (),
    prefix: str = "net",
    layout: str | Layout = DEFAULT,
    profile: bool = False,
    refuse_nonfinite: bool = False,
) -> NetArtifact:
    """The whole network of `model` (a path or a ModelProto) for `target`, as one checked object, run in
    `layout` (xtune/ops/layout.py; the entry's input and output are in ONNX's order whatever it is).
    With `profile`, the object also has `{prefix}_profile(input, output, workspace, stamps)`: the same
    calls with the target's counter (PROFILE_COUNTERS) read into stamps[0..calls] before the first step
    and after each (the step i took stamps[i+1] - stamps[i] ticks); `{prefix}_run` is unchanged.

    InputError (one line naming the node or file) for what xtune cannot run or read, a bad prefix, a
    log without a record for `target` but with records for other targets (built for another target),
    and with `refuse_nonfinite` a constant holding NaN or infinity (else that is a warning)."""
    tgt = target if isinstance(target, Target) else get_target(target)
    valid_prefix(prefix)
    if profile:
        check_profile(tgt)
    records, notes = _read_logs(logs, tgt)
    prog = program(model, parse_layout(layout))
    notes += nonfinite_notes(prog, refuse_nonfinite)
    kernels, rows, task_notes, prepack = _kernels(prog, tgt, records, prefix)
    notes += task_notes
    rodata, blob = pack_weights(_packed_weights(prog, prepack))
    stack = max((k.stack_bytes for k in kernels.values()), default=0) + STACK_MARGIN
    entry = entry_ir(prog, kernels, rodata, prefix)
    if profile:
        entry += "\n\n" + entry_ir(prog, kernels, rodata, prefix, profile=True)
    fingerprint = hashlib.sha256(tgt.name.encode() + entry.encode() + hashlib.sha256(blob).digest())
    build_id = int.from_bytes(fingerprint.digest()[:4], "little")
    queries = queries_ir(prog, prefix, build_id)
    extra = ([weights_global(rodata.nbytes)] if rodata.nbytes else []) + [entry, queries]
    module = lower(list(kernels.values()), module_name=f"{prefix}_network", internal=True, extra=extra)
    obj = compile_object(module, tgt, entry_points(prefix, profile))
    if rodata.nbytes:
        obj = patch_weights(obj, blob)
    check_object(obj, tgt)
    artifact = NetArtifact(
        target=tgt,
        model=prog.model,
        prefix=prefix,
        object=obj.data,
        header="",
        kernels=tuple(rows),
        program=prog,
        weights_bytes=len(blob),
        stack_bytes=stack,
        build_id=build_id,
        warnings=tuple(notes),
        profiled=profile,
    )
    return with_header(artifact)


def nonfinite_notes(prog: Program, refuse: bool) -> list[str]:
    """The warning naming the model's constants that hold NaN or infinity (none: []), or with `refuse`
    InputError. Such a network is built as given: its kernels compute with those values as IEEE 754
    says, and `xtune bench --model` compares each non-finite output with ONNX Runtime's by position."""
    if not prog.nonfinite:
        return []
    shown = ", ".join(f"'{name}' ({count} values)" for name, count in prog.nonfinite)
    what = f"{prog.model}: constant(s) holding NaN or infinity: {shown}"
    if refuse:
        raise InputError(f"{what} (refused: --refuse-nonfinite)")
    return [f"{what}; built as given (--refuse-nonfinite refuses such a model)"]


def _read_logs(logs: Sequence[PathLike], target: Target) -> tuple[list[Record] | None, list[str]]:
    """Every log's records (None without logs), refusing a log that holds records only of other targets:
    its configs would silently be left out, and the network built from defaults."""
    if not logs:
        return None, []
    records: list[Record] = []
    notes: list[str] = []
    for log in logs:
        mine, noted = read_noted([log])
        assert mine is not None
        others = sorted({r.target for r in mine if r.target not in target.record_targets})
        if others and not any(r.target in target.record_targets for r in mine):
            raise InputError(f"{log}: a log for {', '.join(others)}, not for {target.name}")
        records += mine
        notes += noted
    return records, notes


# The arrays a kernel reads, from the call's arguments in the workload's layouts (None: not a constant).
Prepack = Callable[[list[np.ndarray | None]], list[np.ndarray | None]]


def _kernels(
    prog: Program, target: Target, records: list[Record] | None, prefix: str
) -> tuple[dict[str, Kernel], list[NetKernel], list[str], dict[str, Prepack]]:
    """One kernel per distinct workload or operator (keyed by what it computes), its table row, the
    warning naming the tasks built from their template's default, and per task kernel the function that
    lays out its constant inputs as it reads them (`kernel_inputs` of its config: prepacked=1 weights)."""
    prepack: dict[str, Prepack] = {}
    kernels: dict[str, Kernel] = {}
    rows: dict[str, NetKernel] = {}
    uses: dict[str, int] = {}
    built: list[tuple[str, str, str]] = []
    for call in prog.calls:
        key = kernel_key(call.kernel)
        uses[key] = uses.get(key, 0) + 1
        if key in kernels:
            continue
        name = f"{prefix}.k{len(kernels)}"
        if isinstance(call.kernel, Workload):
            wl = call.kernel
            template = template_for(wl, target)
            choice = choose(wl, target, template, records)
            kernel = kernel_for(wl, template, choice, name)
            prepack[key] = _reads(template, choice.config)
            built.append((wl.key, choice.source, choice.reason))
            row = NetKernel(
                symbol=name,
                what=wl.key,
                calls=0,
                source=choice.source,
                config_index=choice.config.index,
                reason=choice.reason,
                stack_bytes=kernel.stack_bytes,
            )
        else:
            op = call.kernel.for_target(target)  # its arithmetic on this target (ops/opkit.py)
            kernel = op.kernel_nest(name, target.fp32_lanes)
            row = NetKernel(
                symbol=name,
                what=kernel_key(op),
                calls=0,
                source="generated",
                config_index=None,
                reason="",
                stack_bytes=kernel.stack_bytes,
            )
        if len(kernel.params) != len(call.args):
            raise InputError(
                f"{prog.model}: node '{call.nodes[0]}': the kernel takes {len(kernel.params)} "
                f"pointers, the node has {len(call.args)} tensors"
            )
        if kernel.stack_bytes > MAX_STACK_BYTES:
            raise InputError(
                f"{prog.model}: node '{call.nodes[0]}' needs {kernel.stack_bytes} bytes of stack"
            )
        kernels[key], rows[key] = kernel, row
    table = [replace(r, calls=uses[k]) for k, r in rows.items()]
    if records is None and built:  # one short line rather than every task's key
        return kernels, table, [f"default config used for all {len(built)} tasks (no log given)"], prepack
    return kernels, table, fallback_notes(built), prepack


def _reads(template: ScheduleTemplate, config: Config) -> Prepack:
    """The template's `kernel_inputs` of `config` over a call's arguments, activations left as None (a
    prepacked=1 task's weights are constants: tasks.py marks only those; depthwise's are never packed)."""

    def reads(args: list[np.ndarray | None]) -> list[np.ndarray | None]:
        given = [a if a is not None else np.zeros(0, np.float32) for a in args]
        out = template.kernel_inputs(config, given)
        return [o if a is not None else None for a, o in zip(args, out, strict=True)]

    return reads


def _packed_weights(prog: Program, prepack: dict[str, Prepack]) -> list[tuple[str, np.ndarray]]:
    """The program's constant arrays, as the kernels that take them read them (prepacked weights in the
    packed layout of their kernel's config)."""
    weights = dict(prog.weights)
    for call in prog.calls:
        reads = prepack.get(kernel_key(call.kernel))
        if reads is None:
            continue
        inputs = call.args[:-1]  # the output is the last argument
        arrays = reads([weights.get(t) for t in inputs])
        for tensor, array in zip(inputs, arrays, strict=True):
            if array is not None:
                weights[tensor] = array  # names are per anchor: each packed once
    return list(weights.items())
