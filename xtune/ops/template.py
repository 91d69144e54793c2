"""Schedule templates: a (workload, target) in, its config space, default config and loop nests out. The
protocol every family's templates keep; a family picks its own (xtune/ops/registry.py, `template_for`),
or several of them as one space (`SumTemplate`: a convolution's algorithms, the tuner's to choose)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

import numpy as np

from xtune.errors import InputError
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import Kernel
from xtune.schedule.space import Config, ConfigSpace, SumSpace, sum_space
from xtune.target import Target

# The most packed-panel stack a built kernel may need: Linux's default RLIMIT_STACK (8 MiB, `ulimit -s`),
# the stack the timing agent runs kernels on, so a config needing more never ran there; a firmware task's
# stack is far smaller (docs/firmware.md, "Stack"). Default configs of in-bounds workloads need < 1 MiB,
# except where a template copies a whole padded image (a 3x4096x4096 conv2d: 64 MiB): such a network is
# refused when its tasks are extracted (xtune/frontend/tasks.py), not tuned into stack overflows.
MAX_STACK_BYTES = 8 << 20


class ScheduleTemplate(Protocol):
    workload: Workload
    target: Target
    space: ConfigSpace

    def default_config(self) -> Config:
        """A heuristic choice from the target descriptor, used when no log entry exists."""
        ...

    def kernel(self, config: Config, name: str) -> Kernel:
        """The loop nest of one config, as an entry point called `name`."""
        ...

    def kernel_inputs(self, config: Config, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """The workload's inputs (its tensors' layouts, what `Workload.reference` takes) as the kernel of
        `config` reads them: the same arrays, except weights a prepacked=1 workload passes in the packed
        layout of the config. The one home of how a kernel reads its weights: the Measurer and the
        network build (xtune/firmware/build.py) both call it."""
        ...

    def packed_layout(self, config: Config) -> Hashable:
        """What fixes the bytes `kernel_inputs` gives `config`'s kernel (None: the inputs as they are):
        configs with equal keys read equal bytes, so the Measurer packs and uploads once per key."""
        ...

    def pack_kernel(self, config: Config, name: str) -> Kernel:
        """For a prepacked=1 workload, the nest `name(plain, packed)` that writes the weights operand as
        `kernel_inputs` gives it to `config`'s kernel, from the plain operand (the workload's layout):
        emitted from the nest code the kernel reads the packed weights by, so a firmware packs them on
        its board (`xtune build --workload ...,prepacked=1`)."""
        ...


class ReadsWeightsAsGiven:
    """The weight side of a template whose kernel reads its inputs as they are (depthwise: r*s weights per
    channel, too few to pack): `kernel_inputs`, `packed_layout` and `pack_kernel` of ScheduleTemplate."""

    workload: Workload

    def kernel_inputs(self, config: Config, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        return list(inputs)

    def packed_layout(self, config: Config) -> Hashable:
        return None

    def pack_kernel(self, config: Config, name: str) -> Kernel:
        raise InputError(f"{self.workload.key}: depthwise weights are read as they are, never packed")


SUM_TAG = "algo"  # a sum's tag knob, and the workload key that forces one of its parts (algo=winograd)


class SumTemplate:
    """Templates of one workload as one space, the sum of theirs (SumSpace, its tag knob `algo`): each
    config is one part's, built, packed and fed by that part's template. Part 0 keeps its indices (so its
    logs resume as the sum's); the default config (what an untuned build runs) is part `default_part`'s
    default, the family's pick; `seeds` holds every part's default."""

    def __init__(
        self,
        workload: Workload,
        target: Target,
        parts: Sequence[tuple[str, ScheduleTemplate]],
        default_part: int = 0,
    ):
        self.workload = workload
        self.target = target
        self.parts = tuple(parts)
        self.default_part = default_part
        self.sum: SumSpace = sum_space(SUM_TAG, [(name, t.space) for name, t in self.parts])
        self.space: ConfigSpace = self.sum

    def part(self, config: Config) -> tuple[str, ScheduleTemplate, Config]:
        """The algorithm of a config of the sum, its template and the config in that template's space."""
        part, local = (int(v[0]) for v in self.sum.split([config.index]))
        name, template = self.parts[part]
        return name, template, template.space.config(local)

    def of_part(self, part: int, config: Config) -> Config:
        """A config of part number `part`'s template as a config of the sum."""
        return self.space.config(int(self.sum.offsets[part]) + config.index)

    def default_config(self) -> Config:
        return self.of_part(self.default_part, self.parts[self.default_part][1].default_config())

    def seeds(self) -> tuple[Config, ...]:
        """Every part's default: each algorithm measured at least once, whatever a model predicts."""
        return tuple(self.of_part(p, t.default_config()) for p, (_, t) in enumerate(self.parts))

    def kernel(self, config: Config, name: str) -> Kernel:
        _, template, local = self.part(config)
        return template.kernel(local, name)

    def kernel_inputs(self, config: Config, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        _, template, local = self.part(config)
        return template.kernel_inputs(local, inputs)

    def packed_layout(self, config: Config) -> Hashable:
        """The part's key, told apart by the algorithm (two parts lay out weights differently)."""
        algo, template, local = self.part(config)
        layout = template.packed_layout(local)
        return None if layout is None else (algo, layout)

    def pack_kernel(self, config: Config, name: str) -> Kernel:
        _, template, local = self.part(config)
        return template.pack_kernel(local, name)


def seed_configs(template: ScheduleTemplate) -> list[int]:
    """The configs a model tuner measures first whatever its priors: the template's default, and for a
    sum every algorithm's default."""
    default = template.default_config().index
    seeds = template.seeds() if isinstance(template, SumTemplate) else ()
    return list(dict.fromkeys([default, *(c.index for c in seeds)]))
