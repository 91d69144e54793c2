"""Networks: ONNX import (graph), what each Conv/Gemm/MatMul computes (anchors), fusion and task
extraction (tasks), and ResNet/MobileNetV2 built here (zoo). Nothing below this package imports it."""
