"""Network front ends: a model file in (ONNX), validated and normalized, the graph IR, its fused kernel calls
and tuning tasks out; the table of what xtune runs and the one refusal that names everything it cannot."""
