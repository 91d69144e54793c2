"""Schedule templates: a (workload, target) in, its config space, default config and loop nests out. The
protocol every family's templates keep; a family picks its own (xtune/ops/registry.py, `template_for`)."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Protocol

import numpy as np

from xtune.errors import InputError
from xtune.ops.workload import Workload
from xtune.schedule.loopnest import Kernel
from xtune.schedule.space import Config, ConfigSpace
from xtune.target import Target

# The most packed-panel stack a built kernel may need: Linux's default RLIMIT_STACK (8 MiB, `ulimit -s`),
# the stack the timing agent runs kernels on, so a config needing more never ran there; a firmware task's
# stack is far smaller (docs/firmware.md, "Stack"). Default configs of in-bounds workloads need < 1 MiB,
# except where a template copies a whole padded image (a 3x4096x4096 conv2d: 64 MiB): such a network is
# refused when its tasks are extracted (xtune/frontend/tasks.py), not tuned into stack overflows.
MAX_STACK_BYTES = 8 << 20

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
