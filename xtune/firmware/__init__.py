"""Firmware: tuned kernels and whole networks built into relocatable objects with C headers, benched and
profiled on a board."""
