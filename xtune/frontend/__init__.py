"""Network front ends: a model file in (ONNX, or TFLite converted to ONNX by tflite.py), the graph IR, its
fused kernel calls and tuning tasks out."""
