"""Network front ends: a model file in (ONNX, or TFLite converted to ONNX by tflite.py), validated and
normalized, the graph IR, its fused kernel calls and tuning tasks out; the table of what xtune runs and the
one refusal that names everything it cannot."""
