"""Operator families: one folder per tunable operator (matmul/, conv2d/, depthwise/) and one module per
generated one (elementwise, pool2d, softmax, concat, reshape, transpose), the rules they share, and the
registry that finds them by name (registry.py)."""
