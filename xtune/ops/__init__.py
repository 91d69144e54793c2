"""Operators: workloads, the generated kernels of a network's other operators and the layouts they run in."""
