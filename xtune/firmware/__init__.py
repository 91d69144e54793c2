"""Firmware: tuned kernels and whole networks in, relocatable objects and their C headers out."""
