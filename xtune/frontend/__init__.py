"""The ONNX front end: a model file in, a checked and normalized graph out (load, validate, normalize)."""
