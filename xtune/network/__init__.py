"""The model level above tuning: ONNX import (graph), what each Conv/Gemm/MatMul computes (anchors), fusion
and task extraction (tasks), the task scheduler, the static memory plan (memory), the remaining operators
(ops), and ResNet/MobileNetV2 built here (zoo). Nothing below this package imports it."""
