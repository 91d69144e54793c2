"""Model front ends: a model file in (ONNX, or TFLite through tflite.py), the ONNX model every later pass
reads out."""
