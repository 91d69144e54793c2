"""Quantized matmul: int8/uint8 operands, int32 accumulation, ONNX Runtime's or TFLite's requantization."""
