"""Networks: ONNX import (graph), the built-in model zoo (zoo), fusion and task extraction (tasks)."""
