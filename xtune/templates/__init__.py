"""Schedule templates: a (workload, target) in, its config space, default config and loop nests out."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from functools import cache
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


@cache
def template_for(workload: Workload, target: Target) -> ScheduleTemplate:
    from xtune.operators import conv_shape
    from xtune.ops.qmatmul.template import QMatmulTemplate
    from xtune.templates.conv2d import Conv2dTemplate
    from xtune.templates.depthwise import DepthwiseTemplate
    from xtune.templates.depthwise_nhwc import DepthwiseNhwcTemplate
    from xtune.templates.matmul import MatmulTemplate

    # Typed as constructors of the protocol, so mypy checks that every template has all of it.
    templates: dict[str, Callable[[Workload, Target], ScheduleTemplate]] = {
        "matmul": MatmulTemplate, "conv2d": Conv2dTemplate, "depthwise": DepthwiseTemplate,
        "qmatmul": QMatmulTemplate,
    }  # fmt: skip
    if workload.op == "depthwise" and conv_shape(workload).nhwc:  # channels, not rows, are its vectors
        templates["depthwise"] = DepthwiseNhwcTemplate
    if workload.op not in templates:
        raise InputError(f"no schedule template for operator '{workload.op}'")
    if workload.op == "conv2d" and workload.value("algo") == "winograd":
        from xtune.templates.winograd import WinogradTemplate

        templates["conv2d"] = WinogradTemplate
    return templates[workload.op](workload, target)


def features_template(template: ScheduleTemplate) -> ScheduleTemplate:
    """The template whose features, analytic estimate and cost models describe `template`'s configs:
    itself, or the matmul a pointwise conv2d lowers through (the same space)."""
    from xtune.templates.conv2d import Conv2dTemplate

    if isinstance(template, Conv2dTemplate) and template.as_matmul is not None:
        return template.as_matmul
    return template
