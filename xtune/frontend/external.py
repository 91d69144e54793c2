"""External data: a model loaded without its external tensors and the path of its file in, the model with
every tensor's data read from the files beside it out, or one InputError for a location that leaves the
model's folder (ONNX IR spec, "External Tensor Data": locations are relative to the model's directory)."""

from __future__ import annotations

from pathlib import Path

import onnx
from onnx import external_data_helper

from xtune.errors import InputError


def load_external_data(model: onnx.ModelProto, path: Path) -> onnx.ModelProto:
    """`model` (loaded from `path` with load_external_data=False) with its external tensors loaded."""
    attributes = (a.t for n in model.graph.node for a in n.attribute if a.HasField("t"))
    tensors = [
        t for t in (*model.graph.initializer, *attributes) if external_data_helper.uses_external_data(t)
    ]
    if not tensors:
        return model
    folder = path.parent.resolve()
    for tensor in tensors:
        location = next((e.value for e in tensor.external_data if e.key == "location"), "")
        target = (folder / location).resolve()  # symbolic links followed: a link out of the folder is out
        if not location or Path(location).is_absolute() or not target.is_relative_to(folder):
            raise InputError(
                f"{path}: tensor '{tensor.name}' keeps its data at '{location}', outside the "
                "model's folder; xtune reads external data only beside the model"
            )
        if not target.is_file():
            raise InputError(
                f"{path}: tensor '{tensor.name}' keeps its data in '{location}', which is missing"
            )
    try:
        external_data_helper.load_external_data_for_model(model, str(folder))
    except Exception as err:  # a short file, an offset past its end: onnx raises ValueError or OSError
        raise InputError(f"{path}: cannot read its external data ({type(err).__name__}: {err})") from None
    return model
