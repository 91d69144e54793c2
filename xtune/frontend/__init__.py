"""ONNX in: the passes between a model file and the network IR (normalization, what xtune runs, refusals)."""
