"""xtune: auto-tuned tensor kernels for embedded targets (x86 AVX2, ARM NEON, RISC-V).

The library's API, the top of the stage order (docs/design.md, "Stages"): every stage sits below this
module, which imports them only inside its functions, so that `import xtune` stays cheap."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from xtune.version import __version__ as __version__

if TYPE_CHECKING:
    import onnx

    from xtune.firmware.entry import NetArtifact
    from xtune.frontend.tasks import TaskSet
    from xtune.frontend.tune import tune_model as tune_model
    from xtune.target import Target


def tasks(
    model: str | os.PathLike[str] | onnx.ModelProto, target: str | Target | None = None, layout: str = "nhwc"
) -> TaskSet:
    """The unique tuning tasks of an ONNX model for `target` (default: the host's), the network run in
    `layout` ("nhwc" or "nchw", xtune/ops/layout.py), as `xtune tasks` prints them. Imported on first
    call, so that `import xtune` stays cheap (no onnx, no numpy)."""
    from xtune.frontend.tasks import extract_tasks

    return extract_tasks(model, target, layout)


def __getattr__(name: str) -> object:
    """`xtune.tune_model`: every task of an ONNX model tuned under one trial budget, as `xtune tune
    --model` does (xtune.frontend.tune.tune_model), imported on first use like `tasks`."""
    if name == "tune_model":
        from xtune.frontend.tune import tune_model

        return tune_model
    raise AttributeError(f"module 'xtune' has no attribute '{name}'")


def build_model(
    model: str | os.PathLike[str] | onnx.ModelProto,
    target: str | Target,
    logs: Sequence[str | os.PathLike[str]] = (),
    prefix: str = "net",
    layout: str = "nhwc",
    profile: bool = False,
    refuse_nonfinite: bool = False,
) -> NetArtifact:
    """One relocatable object running the whole network of `model` on `target` in `layout`, with its C
    header (`xtune build --model`; with `profile`, also `{prefix}_profile`, as `--profile`; with
    `refuse_nonfinite`, a model whose constants hold NaN or inf refused, as `--refuse-nonfinite`); see
    xtune.firmware.build.build_model. Imported on first call, like `tasks`."""
    from xtune.firmware.build import build_model as build

    return build(model, target, logs, prefix, layout, profile, refuse_nonfinite)
