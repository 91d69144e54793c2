"""TFLite files written with the `tflite` schema package's flatbuffer builder: tensors and operators (plain
data, `Tensor`, `Op`) in, the .tflite bytes out, with the options tables xtune reads (the same field
list, `xtune.frontend.tflite_file.OPTIONS`) and custom opcodes ("CUSTOM:<code>")."""

from __future__ import annotations

from dataclasses import dataclass

import flatbuffers
import numpy as np
import tflite
from tflite.BuiltinOperator import BuiltinOperator
from tflite.BuiltinOptions import BuiltinOptions
from tflite.TensorType import TensorType

from xtune.frontend.tflite_file import OPTIONS

_TYPES = {
    "float32": TensorType.FLOAT32,
    "int8": TensorType.INT8,
    "int32": TensorType.INT32,
    "uint8": TensorType.UINT8,
    "float16": TensorType.FLOAT16,
}


@dataclass
class Tensor:
    """A tensor as the file stores it: its type by numpy name, its data if constant, its quantization
    (scale and zero point per tensor, or per slice along `axis`) if quantized."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    data: np.ndarray | None = None
    scale: np.ndarray | None = None
    zero_point: np.ndarray | None = None
    axis: int = 0


@dataclass
class Op:
    """An operator: the builtin's name (or "CUSTOM:<code>"), tensor indices, its options' fields."""

    op: str
    inputs: list[int]
    outputs: list[int]
    options: dict[str, float | int | bool]


def serialize(tensors: list[Tensor], ops: list[Op], inputs: list[int], outputs: list[int]) -> bytes:
    b = flatbuffers.Builder(1024)
    codes = sorted({op.op for op in ops})
    code_offsets = []
    for name in codes:
        custom = b.CreateString(name.split(":", 1)[1]) if name.startswith("CUSTOM:") else None
        value = getattr(BuiltinOperator, "CUSTOM" if custom is not None else name)
        tflite.OperatorCodeStart(b)
        if custom is not None:
            tflite.OperatorCodeAddCustomCode(b, custom)
        tflite.OperatorCodeAddDeprecatedBuiltinCode(b, min(value, 127))
        tflite.OperatorCodeAddBuiltinCode(b, value)
        tflite.OperatorCodeAddVersion(b, 1)
        code_offsets.append(tflite.OperatorCodeEnd(b))
    buffers = [_buffer(b, None)] + [_buffer(b, t.data) for t in tensors if t.data is not None]
    tensor_offsets, k = [], 1
    for t in tensors:
        tensor_offsets.append(_tensor(b, t, k if t.data is not None else 0))
        k += t.data is not None
    op_offsets = [_operator(b, op, codes.index(op.op)) for op in ops]
    graph_tensors = _vector(b, tensor_offsets)
    graph_ops = _vector(b, op_offsets)
    graph_in = b.CreateNumpyVector(np.asarray(inputs, np.int32))
    graph_out = b.CreateNumpyVector(np.asarray(outputs, np.int32))
    tflite.SubGraphStart(b)
    tflite.SubGraphAddTensors(b, graph_tensors)
    tflite.SubGraphAddInputs(b, graph_in)
    tflite.SubGraphAddOutputs(b, graph_out)
    tflite.SubGraphAddOperators(b, graph_ops)
    subgraph = tflite.SubGraphEnd(b)
    code_vec, sub_vec, buf_vec = _vector(b, code_offsets), _vector(b, [subgraph]), _vector(b, buffers)
    description = b.CreateString("xtune test")
    tflite.ModelStart(b)
    tflite.ModelAddVersion(b, 3)
    tflite.ModelAddOperatorCodes(b, code_vec)
    tflite.ModelAddSubgraphs(b, sub_vec)
    tflite.ModelAddDescription(b, description)
    tflite.ModelAddBuffers(b, buf_vec)
    b.Finish(tflite.ModelEnd(b), file_identifier=b"TFL3")
    return bytes(b.Output())


def _vector(b: flatbuffers.Builder, offsets: list[int]) -> int:
    b.StartVector(4, len(offsets), 4)
    for offset in reversed(offsets):
        b.PrependUOffsetTRelative(offset)
    return int(b.EndVector())


def _buffer(b: flatbuffers.Builder, data: np.ndarray | None) -> int:
    vec = (
        b.CreateNumpyVector(np.frombuffer(np.ascontiguousarray(data).tobytes(), np.uint8))
        if data is not None
        else None
    )
    tflite.BufferStart(b)
    if vec is not None:
        tflite.BufferAddData(b, vec)
    return int(tflite.BufferEnd(b))


def _tensor(b: flatbuffers.Builder, t: Tensor, buffer: int) -> int:
    quant = None
    if t.scale is not None and t.zero_point is not None:
        scale = b.CreateNumpyVector(t.scale.astype(np.float32))
        zero = b.CreateNumpyVector(t.zero_point.astype(np.int64))
        tflite.QuantizationParametersStart(b)
        tflite.QuantizationParametersAddScale(b, scale)
        tflite.QuantizationParametersAddZeroPoint(b, zero)
        tflite.QuantizationParametersAddQuantizedDimension(b, t.axis)
        quant = tflite.QuantizationParametersEnd(b)
    shape = b.CreateNumpyVector(np.asarray(t.shape, np.int32))
    name = b.CreateString(t.name)
    tflite.TensorStart(b)
    tflite.TensorAddShape(b, shape)
    tflite.TensorAddType(b, _TYPES[t.dtype])
    tflite.TensorAddBuffer(b, buffer)
    tflite.TensorAddName(b, name)
    if quant is not None:
        tflite.TensorAddQuantization(b, quant)
    return int(tflite.TensorEnd(b))


def _operator(b: flatbuffers.Builder, op: Op, code: int) -> int:
    options = None
    if op.op in OPTIONS:
        cls, _ = OPTIONS[op.op]
        getattr(tflite, f"{cls}Start")(b)
        for key, value in op.options.items():
            getattr(tflite, f"{cls}Add{key}")(b, value)
        options = getattr(tflite, f"{cls}End")(b)
    ins = b.CreateNumpyVector(np.asarray(op.inputs, np.int32))
    outs = b.CreateNumpyVector(np.asarray(op.outputs, np.int32))
    tflite.OperatorStart(b)
    tflite.OperatorAddOpcodeIndex(b, code)
    tflite.OperatorAddInputs(b, ins)
    tflite.OperatorAddOutputs(b, outs)
    if options is not None:
        tflite.OperatorAddBuiltinOptionsType(b, getattr(BuiltinOptions, OPTIONS[op.op][0]))
        tflite.OperatorAddBuiltinOptions(b, options)
    return int(tflite.OperatorEnd(b))
