"""Model formats by content: a file's first bytes (or its path) in, whether it is a TFLite flatbuffer out.
Light on purpose (no flatbuffer code): every model load asks it, and ONNX models need nothing more."""

from __future__ import annotations

import os

IDENTIFIER = b"TFL3"  # TFLite schema.fbs's file_identifier, at bytes 4..8 of every TFLite file


def is_tflite(head: bytes) -> bool:
    """Whether a file starting with `head` (8 bytes are enough) is a TFLite flatbuffer."""
    return head[4:8] == IDENTIFIER


def is_tflite_file(path: str | os.PathLike[str]) -> bool:
    """Whether the file at `path` is a TFLite flatbuffer (by its identifier, not its name)."""
    try:
        with open(path, "rb") as f:
            return is_tflite(f.read(8))
    except OSError:
        return False
