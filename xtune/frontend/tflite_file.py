"""Reading a TFLite flatbuffer: the file's bytes in, its main subgraph out as plain frozen data (`TflModel`:
tensors with shapes, types, constant data and quantization; operators with their builtin name and options).

The flatbuffer is read with the generated Python of TFLite's schema (the `tflite` package: the schema file
tensorflow/compiler/mlir/lite/schema/schema.fbs compiled by flatc), never by a hand-written parser. Every
read happens here, inside one guard: a flatbuffer reader on a truncated or corrupted file fails with
whatever the bytes lead it to (struct.error, IndexError, ValueError, ...), and all of them become one
InputError naming the file. Later stages see only checked data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import flatbuffers
import numpy as np
import tflite
from tflite.BuiltinOperator import BuiltinOperator
from tflite.BuiltinOptions import BuiltinOptions
from tflite.TensorType import TensorType

from xtune.errors import InputError
from xtune.frontend.formats import is_tflite

OptionValue = int | float | bool

# TFLite's tensor types that xtune imports, as numpy dtypes (schema.fbs, `enum TensorType`).
DTYPES: Mapping[int, np.dtype] = {
    TensorType.FLOAT32: np.dtype(np.float32),
    TensorType.FLOAT16: np.dtype(np.float16),
    TensorType.INT32: np.dtype(np.int32),
    TensorType.UINT8: np.dtype(np.uint8),
    TensorType.INT64: np.dtype(np.int64),
    TensorType.INT16: np.dtype(np.int16),
    TensorType.INT8: np.dtype(np.int8),
    TensorType.BOOL: np.dtype(np.bool_),
}
_TYPE_NAMES = {v: k for k, v in vars(TensorType).items() if not k.startswith("_")}
_OP_NAMES = {v: k for k, v in vars(BuiltinOperator).items() if not k.startswith("_")}

# The options table of each builtin xtune maps, and the fields it reads (schema.fbs, `table *Options`).
_ELEMENTWISE = ("FusedActivationFunction",)
OPTIONS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "CONV_2D": (
        "Conv2DOptions",
        ("Padding", "StrideW", "StrideH", "FusedActivationFunction", "DilationWFactor", "DilationHFactor"),
    ),
    "DEPTHWISE_CONV_2D": (
        "DepthwiseConv2DOptions",
        (
            "Padding",
            "StrideW",
            "StrideH",
            "DepthMultiplier",
            "FusedActivationFunction",
            "DilationWFactor",
            "DilationHFactor",
        ),
    ),
    "AVERAGE_POOL_2D": (
        "Pool2DOptions",
        ("Padding", "StrideW", "StrideH", "FilterWidth", "FilterHeight", "FusedActivationFunction"),
    ),
    "MAX_POOL_2D": (
        "Pool2DOptions",
        ("Padding", "StrideW", "StrideH", "FilterWidth", "FilterHeight", "FusedActivationFunction"),
    ),
    "FULLY_CONNECTED": ("FullyConnectedOptions", ("FusedActivationFunction", "WeightsFormat", "KeepNumDims")),
    "SOFTMAX": ("SoftmaxOptions", ("Beta",)),
    "ADD": ("AddOptions", _ELEMENTWISE),
    "SUB": ("SubOptions", _ELEMENTWISE),
    "MUL": ("MulOptions", _ELEMENTWISE),
    "DIV": ("DivOptions", _ELEMENTWISE),
    "CONCATENATION": ("ConcatenationOptions", ("Axis", "FusedActivationFunction")),
    "MEAN": ("ReducerOptions", ("KeepDims",)),
    "LEAKY_RELU": ("LeakyReluOptions", ("Alpha",)),
}


@dataclass(frozen=True, kw_only=True)
class Quantization:
    """real = scale * (q - zero_point), per tensor (one scale) or per slice along `axis`."""

    scale: np.ndarray  # float32, one per tensor or per slice
    zero_point: np.ndarray  # int64, as many as scale
    axis: int


@dataclass(frozen=True, kw_only=True)
class TflTensor:
    index: int
    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    data: np.ndarray | None = field(compare=False)  # a constant's value, in `shape`
    quant: Quantization | None = field(compare=False)

    @property
    def label(self) -> str:
        """How messages name the tensor (`short`)."""
        return short(self.name)


@dataclass(frozen=True, kw_only=True)
class TflOp:
    index: int
    op: str  # the builtin's name as the schema spells it ("CONV_2D"), or "CUSTOM:<code>"
    inputs: tuple[int, ...]  # tensor indices; -1 for an omitted optional input
    outputs: tuple[int, ...]
    options: Mapping[str, OptionValue] = field(compare=False)  # OPTIONS' fields, schema defaults if absent


@dataclass(frozen=True, kw_only=True)
class TflModel:
    name: str  # the file it came from
    tensors: tuple[TflTensor, ...]
    ops: tuple[TflOp, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]


def read_tflite(data: bytes, where: str) -> TflModel:
    """The main subgraph of a TFLite file's bytes, or one InputError naming `where`."""
    if len(data) < 8 or not is_tflite(data):
        raise InputError(f"{where}: not a TFLite file (no 'TFL3' identifier at bytes 4..8)")
    try:
        return _read(data, where)
    except InputError:
        raise
    except Exception as err:  # the flatbuffer reader on bytes that are not a valid model
        raise InputError(f"{where}: malformed TFLite file ({type(err).__name__}: {err})") from None


def _read(data: bytes, where: str) -> TflModel:
    model = tflite.Model.GetRootAs(data, 0)
    if model.SubgraphsLength() < 1:
        raise InputError(f"{where}: the TFLite file has no subgraph")
    codes = [_op_name(model.OperatorCodes(i)) for i in range(_count(model.OperatorCodesLength(), data))]
    buffers = [model.Buffers(i) for i in range(_count(model.BuffersLength(), data))]
    graph = model.Subgraphs(0)
    tensors = tuple(
        _tensor(graph.Tensors(i), i, buffers, data, where) for i in range(_count(graph.TensorsLength(), data))
    )
    ops = []
    for i in range(_count(graph.OperatorsLength(), data)):
        proto = graph.Operators(i)
        code = proto.OpcodeIndex()
        if not 0 <= code < len(codes):
            raise InputError(f"{where}: operator {i} has opcode index {code} of {len(codes)}")
        ops.append(
            TflOp(
                index=i,
                op=codes[code],
                inputs=_ints(proto.InputsAsNumpy()),
                outputs=_ints(proto.OutputsAsNumpy()),
                options=_options(proto, codes[code], where),
            )
        )
    result = TflModel(
        name=where,
        tensors=tensors,
        ops=tuple(ops),
        inputs=_ints(graph.InputsAsNumpy()),
        outputs=_ints(graph.OutputsAsNumpy()),
    )
    _check_indices(result)
    return result


def _count(n: int, data: bytes) -> int:
    """A vector's length, bounded by the file: each element takes at least one byte of it."""
    if not 0 <= n <= len(data):
        raise ValueError(f"a vector of {n} elements in a file of {len(data)} bytes")
    return n


def _ints(vector: object) -> tuple[int, ...]:
    """A vector of indices (the generated reader returns 0 for an absent vector)."""
    return () if isinstance(vector, int) else tuple(int(v) for v in np.asarray(vector))


def _op_name(code: tflite.OperatorCode) -> str:
    # schema.fbs: builtin_code is the real code since schema 3a; old files hold it only in the int8
    # deprecated_builtin_code, which saturates at 127 (PLACEHOLDER_FOR_GREATER_OP_CODES): the larger wins.
    builtin = max(int(code.BuiltinCode()), int(code.DeprecatedBuiltinCode()))
    if builtin == BuiltinOperator.CUSTOM:
        custom = code.CustomCode()
        return f"CUSTOM:{short(_text(custom)) or '?'}"
    return _OP_NAMES.get(builtin, f"BUILTIN_{builtin}")


def _text(raw: bytes | None) -> str:
    """A name stored in the file, printable (a corrupted file can hold any bytes there)."""
    return "".join(c if c.isprintable() else "?" for c in (raw or b"").decode(errors="replace"))


def short(name: str) -> str:
    """How a message quotes a tensor name: TFLite's converter names a tensor by every op fused into
    it, joined by ';', and the first says which it is."""
    first = name.split(";")[0]
    return first if len(first) <= 80 else first[:77] + "..."


def _tensor(proto: tflite.Tensor, index: int, buffers: list, data: bytes, where: str) -> TflTensor:
    name = _text(proto.Name()) or f"tensor_{index}"
    label = f"{where}: tensor {index} '{short(name)}'"
    kind = int(proto.Type())
    if kind not in DTYPES:
        raise InputError(f"{label} is of type {_TYPE_NAMES.get(kind, kind)}, which xtune does not import")
    if proto.Sparsity() is not None:
        raise InputError(f"{label} is sparse, which xtune does not import")
    if proto.IsVariable():
        raise InputError(f"{label} is a variable (state across calls), which xtune does not import")
    shape = _ints(proto.ShapeAsNumpy())
    if any(d < 0 for d in shape):
        raise InputError(f"{label} has a dynamic shape {shape}; xtune needs static shapes")
    dtype = DTYPES[kind]
    return TflTensor(
        index=index,
        name=name,
        shape=shape,
        dtype=dtype,
        data=_constant(proto.Buffer(), buffers, data, shape, dtype, label),
        quant=_quantization(proto.Quantization(), shape, label),
    )


def _constant(
    index: int, buffers: list, data: bytes, shape: tuple[int, ...], dtype: np.dtype, label: str
) -> np.ndarray | None:
    if index == 0:  # buffer 0 is the schema's empty sentinel: not a constant
        return None
    if not 0 <= index < len(buffers):
        raise InputError(f"{label} refers to buffer {index} of {len(buffers)}")
    buffer = buffers[index]
    if buffer.Offset() > 1:  # schema.fbs: data past the flatbuffer's end (models over 2 GB)
        raw = data[buffer.Offset() : buffer.Offset() + buffer.Size()]
    else:
        array = buffer.DataAsNumpy()
        if isinstance(array, int):  # no data: an activation
            return None
        raw = array.tobytes()
    want = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if len(raw) != want:
        raise InputError(f"{label} holds {len(raw)} bytes of data, its shape {shape} needs {want}")
    return np.frombuffer(raw, dtype.newbyteorder("<")).astype(dtype).reshape(shape)


def _quantization(
    proto: tflite.QuantizationParameters | None, shape: tuple[int, ...], label: str
) -> Quantization | None:
    if proto is None or proto.ScaleLength() == 0:
        return None  # float, or only min/max (a fake-quant annotation TFLite's kernels ignore)
    scale = np.asarray(proto.ScaleAsNumpy(), np.float32)
    zero = proto.ZeroPointAsNumpy()
    zero_point = np.zeros(scale.size, np.int64) if isinstance(zero, int) else np.asarray(zero, np.int64)
    axis = int(proto.QuantizedDimension())
    if zero_point.size != scale.size:
        raise InputError(f"{label} has {scale.size} quantization scales and {zero_point.size} zero points")
    if scale.size > 1 and not (0 <= axis < len(shape) and shape[axis] == scale.size):
        raise InputError(f"{label} has {scale.size} scales along axis {axis} of shape {shape}")
    if not np.all(np.isfinite(scale)) or np.any(scale <= 0):
        raise InputError(f"{label} has a quantization scale that is not a positive number")
    return Quantization(scale=scale, zero_point=zero_point, axis=axis if scale.size > 1 else 0)


def _options(proto: tflite.Operator, op: str, where: str) -> dict[str, OptionValue]:
    if op not in OPTIONS:
        return {}
    cls_name, fields = OPTIONS[op]
    cls = getattr(tflite, cls_name)
    table = proto.BuiltinOptions()
    if table is None:
        options = _defaults(cls_name)
    else:
        if proto.BuiltinOptionsType() != getattr(BuiltinOptions, cls_name):
            raise InputError(f"{where}: a {op} operator carries options of another operator")
        options = cls()
        options.Init(table.Bytes, table.Pos)
    return {f: getattr(options, f)() for f in fields}


def _defaults(cls_name: str) -> object:
    """An options table with no field set: its getters return the schema's defaults."""
    module = getattr(tflite, cls_name)
    builder = flatbuffers.Builder(16)
    getattr(tflite, f"{cls_name}Start")(builder)
    builder.Finish(getattr(tflite, f"{cls_name}End")(builder))
    return module.GetRootAs(builder.Output(), 0)


def _check_indices(model: TflModel) -> None:
    n = len(model.tensors)
    for what, indices in (("input", model.inputs), ("output", model.outputs)):
        if not indices or any(not 0 <= i < n for i in indices):
            raise InputError(f"{model.name}: the subgraph's {what}s {indices} are not tensors of its {n}")
    for op in model.ops:
        if any(not -1 <= i < n for i in op.inputs) or any(not 0 <= i < n for i in op.outputs):
            raise InputError(
                f"{model.name}: operator {op.index} ({op.op}) names a tensor that does not exist"
            )
