"""Network front ends: a model file in (ONNX), the graph IR, its fused kernel calls and tuning tasks out."""
